"""Decoding settings compared on a trained model: an interleaved A/B in one process.

  python -m benchmarks.decode_ab --workdir runs/multi30k --split test_2016_flickr \
      --variant compact=0 --variant compact=2 [--mode beam] [--runs 3] [--json out.json]

Each --variant overrides config.decode fields (comma-separated name=value) of the
workdir's config. Every run decodes the whole split once per variant, in turn, so
the variants share the machine's state; the first run compiles each variant
(reported apart), the later ones time decoding alone. The outputs of every variant
must equal the first variant's: a setting meant as a pure speed-up that changes a
hypothesis fails here, unless --allow_changes, which counts them instead (in
bfloat16, batches of other shapes round differently and can move near-ties).
"""

import argparse
import ast
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if __name__ == "__main__":  # Before JAX starts; see transformer/runtime.py.
  from transformer import runtime
  runtime.use_fast_malloc()

from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
from transformer import inference, runtime
from transformer import workdir as workdir_lib


def parse_variant(text):
  """'compact=2,tokens_per_batch=1024' -> {'compact': 2, 'tokens_per_batch': 1024}."""
  fields = {}
  for item in filter(None, text.split(",")):
    name, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"variant {text!r}: {item!r} is not name=value")
    try:
      fields[name] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      fields[name] = value
  return fields


def with_decode(config, fields):
  """A copy of `config` with config.decode fields set (new ones allowed)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    for name, value in fields.items():
      config.decode[name] = value
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--split", default=None, help="default config.data.test_split")
  parser.add_argument("--checkpoint", default="latest")
  parser.add_argument("--mode", default="beam", choices=("greedy", "beam"))
  parser.add_argument("--variant", action="append", required=True,
                      help="config.decode overrides, e.g. compact=0 (repeat the flag)")
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--limit", type=int, default=None, help="the first N sentences only")
  parser.add_argument("--json", default=None)
  parser.add_argument("--allow_changes", action="store_true",
                      help="count outputs that differ from the first variant's, not fail")
  args = parser.parse_args()
  # Orbax's read-only notice and INFO lines, as evaluate drops them; no compilation
  # cache, so that every run's compile time is measured.
  runtime.quiet_library_logs()

  config = workdir_lib.load_config(args.workdir)
  split = args.split or config.data.test_split
  tokenizer = workdir_lib.load_tokenizer(args.workdir, config)
  # One chunk: the whole split (or its first --limit examples).
  first = next(data_lib.iter_eval(config.data, tokenizer, split, 10**9, args.limit), None)
  if not first or not first[0]:
    raise SystemExit(f"split {split!r} of {config.data.dataset} has no examples")
  examples = first[0]
  restored = workdir_lib.restore(args.workdir, args.checkpoint)
  variants = {text: with_decode(config, parse_variant(text)) for text in args.variant}
  timings = {text: [] for text in variants}
  changes = {text: 0 for text in variants}
  reference = None
  for _ in range(args.runs):
    for text, variant_config in variants.items():
      got = {}
      ids = inference.decode_ids(restored.model, restored.params, examples, variant_config,
                                 restored.mesh, mode=args.mode, timings=got,
                                 **inference.decode_settings(variant_config))
      ids = [row.tolist() for row in ids]
      if reference is None:
        reference = ids
      elif ids != reference:
        changes[text] = sum(a != b for a, b in zip(ids, reference))
        if not args.allow_changes:
          raise SystemExit(f"variant {text!r} changed {changes[text]} of {len(ids)} outputs")
      timings[text].append(got)
      print(f"{text}: {len(ids) / got['decode_seconds']:.1f} sentences/s "
            f"(compile {got['compile_seconds']:.1f} s)", flush=True)

  n = len(examples)
  rows = []
  for text, runs in timings.items():
    rates = [n / t["decode_seconds"] for t in runs]
    rows.append({"variant": text, "sentences_per_second": rates,
                 "median": statistics.median(rates),
                 "compile_seconds": runs[0]["compile_seconds"],
                 "changed_outputs": changes[text]})
  base = rows[0]["median"]
  print(f"\n{split}, {n} sentences, {args.mode}, {args.runs} runs; "
        + ("outputs identical" if not any(changes.values()) else
           "outputs changed from the first variant's: " + ", ".join(
               f"{t}: {c}" for t, c in changes.items() if c)))
  print("| variant | sentences/s (each run) | median | vs first | compile s (run 1) |")
  print("|---|---|---:|---:|---:|")
  for row in rows:
    each = ", ".join(f"{r:.1f}" for r in row["sentences_per_second"])
    print(f"| {row['variant']} | {each} | {row['median']:.1f} | "
          f"{row['median'] / base:.2f}x | {row['compile_seconds']:.1f} |")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"workdir": args.workdir, "split": split, "mode": args.mode,
                 "sentences": n, "rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()
