"""benchmarks.run's report: MFU against the run's best matmul product, the table
of both sides' figures with ours/peer beside each, and issue 18's targets."""

from benchmarks import allocators

TARGETS = (  # (description, figure key, threshold, peer): ratios ours/peer; MFU ours alone.
    ("training target tokens/s >= 1.25x PyTorch", "train target tokens/s", 1.25, "pytorch"),
    ("training target tokens/s over an epoch's shapes >= 1.25x PyTorch",
     "train target tokens/s (epoch mix)", 1.25, "pytorch"),
    ("base MFU >= 65% of the run's matmul peak", "train MFU (padded) %", 65.0, None),
    ("greedy decoding tokens/s >= 5x PyTorch (no cache)", "greedy tokens/s", 5.0, "pytorch"),
    ("greedy decoding sentences/s >= 2x Marian (KV cache)", "greedy sentences/s", 2.0, "marian"),
    ("beam-4 decoding sentences/s >= 2x Marian (KV cache)", "beam4 sentences/s", 2.0, "marian"),
)
PEERS = (("pytorch", "PyTorch"), ("marian", "Marian"))  # Results key, column name.
DECODE_PEERS = {"torch": "PyTorch (no cache)", "marian": "Marian"}  # Decoding run prefixes.


def set_mfu(results, peaks):
  """Sets both sides' MFU against the best product either framework ran in the
  run (`peaks`: FLOP/s by framework): the hardware's reach as far as measured.
  PyTorch's product beat ours by 1.25x on an H200 and 1.4x on an AMX CPU, and
  MFU against one's own product alone flatters the slower framework."""
  peak, of = max((x, k) for k, v in peaks.items() for x in v)
  results["matmul_peak_used"] = {"gflops": peak / 1e9, "of": of}
  for res in results["sizes"].values():
    for side in (res["ours"], res["pytorch"]):
      if "train GFLOP/s" in side:
        padding = side["train padding (source+target) %"] / 100  # The timed batches'.
        side["train MFU (padded) %"] = 100 * side["train GFLOP/s"] * 1e9 / peak
        side["train MFU (real tokens) %"] = side["train MFU (padded) %"] * (1 - padding)


def ratio(a, b):
  if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
    return a / b
  return None


def print_table(results):
  rows = []  # (figure, ours, then per peer: its value and ours/it).
  for size, res in results["sizes"].items():
    peers = [res.get(key, {}) for key, _ in PEERS]
    keys = list(res["ours"]) + [k for p in peers for k in p if k not in res["ours"]]
    for key in dict.fromkeys(keys):
      value = res["ours"].get(key)
      rows.append((f"{size}: {key}", value,
                   *[x for p in peers for x in (p.get(key), ratio(value, p.get(key)))]))
  peak = results["matmul_peak_gflops"]
  dtype = results["meta"].get("dtype", "float32")
  rows.append((f"{dtype} matmul peak GFLOP/s", peak["ours"], peak["pytorch"],
               ratio(peak["ours"], peak["pytorch"]), None, None))
  fmt = lambda v: ("-" if v is None else f"{v:,.3g}" if isinstance(v, float)
                   else f"{v:,}" if isinstance(v, int) else str(v))
  width = max(len(r[0]) for r in rows)
  meta = results["meta"]
  print(f"CPU: {meta.get('cpu_model') or 'unknown'} "
        f"({' '.join(meta.get('cpu_flags') or []) or 'no flags read'}), {meta['cpu_count']} cores")
  print(f"{'figure':<{width}}  {'ours (JAX)':>14}" +
        "".join(f"  {name:>14}  {'ours/' + name:>12}" for _, name in PEERS))
  for name, a, *peers in rows:
    print(f"{name:<{width}}  {fmt(a):>14}" +
          "".join(f"  {fmt(b):>14}  {fmt(r):>12}" for b, r in zip(peers[::2], peers[1::2])))
  print("decoding: PyTorch = nn.Transformer eager, no KV cache (greedy only); Marian = "
        f"transformers {meta.get('transformers') or '(not run)'} MarianMTModel.generate, "
        "KV cache, random weights; each side runs the batch to its longest row limit, no EOS")
  if results.get("matmul_peak_used"):
    used = results["matmul_peak_used"]
    print(f"MFU (both sides): of {used['gflops']:,.0f} GFLOP/s, the best {dtype} product "
          f"of the run ({dict(PEERS, ours='ours').get(used['of'], used['of'])})")
  for size, res in results["sizes"].items():
    for name, ratios in res.get("decode_ratio_per_run", {}).items():
      peer, mode = name.split()
      print(f"{size}: {mode} ours/{DECODE_PEERS[peer]} in each of {len(ratios)} "
            f"interleaved runs: {', '.join(f'{r:.2f}' for r in ratios)}")
  if "malloc" in results:
    print()
    allocators.print_table(results["malloc"])
  print()
  for line in results["targets"]:
    print(line)
  if meta.get("torch") or meta.get("transformers"):
    print("(ratios from one process shared by both frameworks, which skews them; "
          "python -m benchmarks.alone runs each side in its own)")


def check_targets(results):
  lines = []
  for text, key, threshold, peer in TARGETS:
    for size, res in results["sizes"].items():
      if peer is None:
        if size != "base":
          continue
        value = res["ours"].get(key)
      else:
        value = ratio(res["ours"].get(key), res.get(peer, {}).get(key))
      if value is not None:
        met = "met" if value >= threshold else "MISSED"
        lines.append(f"target [{size}] {text}: {value:.3g} -> {met}")
  return lines
