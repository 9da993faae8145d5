"""Training and decoding speed of our Transformer, side by side with PyTorch eager.

  python -m benchmarks.run --sizes small,base --json bench.json
  python -m benchmarks.run --config configs/default.py      # any config file's model
  python -m benchmarks.run --smoke                          # tiny, seconds (CI)
  python -m benchmarks.run --sizes small,base --pack        # ours on packed rows
  python -m benchmarks.run --sizes base --pack --epoch_mix  # + tokens/s over an epoch's shapes
  python -m benchmarks.run --decode_only --decode_repeats 9 # decoding alone, 9 rounds


Everything runs in one process on the default JAX device, PyTorch eager on the
same kind of device (CUDA where JAX runs on a GPU, else the CPU with
torch.set_num_threads(cores); torch_bench.DEVICE). Both frameworks train on the same
batches (TrainBatches over synthetic sentence-length examples, or Multi30k with
--data_dir) and decode the same sources; with --pack each side trains on its
natural input instead, ours packed rows with segment masks (what our recipes
use), PyTorch's bucketed rows, and real (non-padding) target tokens/s compare them. Figures: compile time, step time
(median), real target tokens/s, source+target tokens/s, analytic FLOPs per
step (common.train_flops) and MFU against a matmul peak (in the run's --dtype) measured in the
same run, padding of the pipeline's batches, compiled shapes and recompiles,
page faults and CPU seconds per step, greedy (both) and beam-4 (ours) decoding
speed. A second decoding peer with a KV cache, Hugging Face transformers'
MarianMTModel of the same sizes with random weights (marian_bench.py), decodes
the same sources greedily and with beam 4 where transformers is installed; the
decoders alternate run by run, and ours/peer of every round is printed beside the
ratio of the medians (single rounds on a shared VM spread by 10-50%). The
two frameworks alternate step by step, so that other processes'
load (the machine may be shared) hits both alike. Sharing one process skews
both sides, though: after each of PyTorch's steps our step spent ~2 s more in
the kernel faulting in its huge pages (benchmarks/README.md, 'Session 39').
benchmarks.alone runs each side in its own process, the ratios to quote. Both run under the
allocator our commands use (transformer/runtime.py: tcmalloc that never
releases memory where installed, else glibc malloc with huge pages; the script
re-executes itself with it, as train.py does). Unless --malloc=skip, our step
of the first size also runs under each allocator in fresh subprocesses
(allocators.py: glibc malloc, its huge pages, tcmalloc as is and never releasing),
interleaved over --malloc_rounds rounds.
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top

from benchmarks import allocators, common, jax_bench, report
from transformer import runtime

STEP_BUDGET_S = 60.0  # PyTorch's training is left out where one step would take longer.
STEP_PROBE_ROWS = 4  # Rows of the step that estimates it (torch_bench.step_seconds).


def peak_size(smoke):
  """n of the peak's [n, n] products: 2048 saturates a CPU, a GPU needs 8192."""
  return 256 if smoke else 8192 if jax.default_backend() == "gpu" else 2048


def measure_peak(peaks, use_torch, n, dtype):
  """Appends a matmul FLOP/s measurement in `dtype` per framework to `peaks`;
  returns whether PyTorch stays in the run (it leaves it, with a message, where
  its product in `dtype` would not finish in reasonable time)."""
  flops, why = common.probed_peak(jax_bench.matmul_peak, n, dtype)
  if flops is None:
    raise SystemExit(f"benchmark: error: ours: {why}; use --dtype float32 on this CPU")
  peaks["ours"].append(flops)
  if use_torch:
    from benchmarks import torch_bench  # pylint: disable=g-import-not-at-top
    flops, why = common.probed_peak(torch_bench.matmul_peak, n, dtype)
    if flops is None:
      print(f"PyTorch skipped: {why} (CPU flags: "
            f"{' '.join(common.cpu_description()['cpu_flags']) or 'unknown'}).", flush=True)
      return False
    peaks["pytorch"].append(flops)
  return use_torch


def torch_trains(size, batch, step_seconds=None):
  """Whether PyTorch's training goes in the run: not where a small probe says one
  step would take over STEP_BUDGET_S (on an AVX2-only CPU its bfloat16 backward
  products, unlike the forward ones the matmul probe times, ran at ~70 s a small
  step), with a message saying so."""
  if step_seconds is None:
    from benchmarks import torch_bench  # pylint: disable=g-import-not-at-top
    step_seconds = torch_bench.step_seconds
  seconds = step_seconds(size, batch, STEP_PROBE_ROWS)
  if seconds <= STEP_BUDGET_S:
    return True
  print(f"PyTorch training skipped at {size.name}: one {size.dtype} step would take "
        f"~{seconds:.0f} s here (scaled from a {STEP_PROBE_ROWS}-row step; CPU flags: "
        f"{' '.join(common.cpu_description()['cpu_flags']) or 'unknown'}); "
        "its decoding stays in.", flush=True)
  return False


def _data_figures(stats, batches):
  return {"data padding (target) %": 100 * stats["padding_target"],
          "data padding (source+target) %": 100 * stats["padding_source_target"],
          "data shapes per epoch": stats["shapes"], "data timed batches": len(batches)}


def bench_size(size, examples, *, peaks, use_torch, use_marian, max_extra_len, pack=False,
               train=True, epoch_mix=False):
  """{'ours': {...}, 'pytorch': {...}, 'marian': {...}} figures of one size. With
  `pack` our side trains on packed rows (what our recipes use) and PyTorch's on
  the bucketed ones, its natural input: real target tokens/s compare the two.
  Without `train`, only decoding runs, on freshly initialised parameters (every
  row runs to its limit, so the weights change no work)."""
  batches = common.timed_batches(size, examples, size.train_steps)
  our_batches = (common.timed_batches(size, examples, size.train_steps, batching="pack")
                 if pack else batches)
  marian = {}
  # One pass over each side's epoch: its padding, and its shapes for --epoch_mix.
  their_stats = common.epoch_stats(size, examples, "bucket") if use_torch or not pack else None
  our_stats = common.epoch_stats(size, examples, "pack") if pack else their_stats
  ours = _data_figures(our_stats, our_batches)
  theirs = _data_figures(their_stats, batches) if use_torch else {}
  torch_train = train and use_torch and torch_trains(size, batches[0])

  # The frameworks alternate step by step (on the same batch unless `pack`), so
  # that a change in the machine's load (it may be shared) hits both alike.
  trainers = [jax_bench.Trainer(size, our_batches)]
  if use_torch:
    from benchmarks import torch_bench  # pylint: disable=g-import-not-at-top
  if torch_train:
    trainers.append(torch_bench.Trainer(size, batches))
  if train:
    _train(trainers, len(batches), peaks, use_torch, size)
    r = trainers[0].figures()
    ours.update(_train_figures(r))
    ours.update({
        "train compile s (first shape)": r["compile_s_first_shape"],
        "train compile s (all shapes)": r["compile_s_all_shapes"],
        "train compiled shapes after warm-up": r["compiled_shapes_after_warmup"],
        "train recompiles after warm-up": r["recompiles_after_warmup"],
    })
  if torch_train:
    theirs.update(_train_figures(trainers[1].figures()))
  mix_times = {}
  if train and epoch_mix:
    sides = {"ours": (ours, our_stats, jax_bench.Trainer)}
    if torch_train:
      sides["pytorch"] = (theirs, their_stats, torch_bench.Trainer)
    mix_times = _epoch_mix(size, sides)

  # Decoding: the same sources, every row run to its limit; runs alternate likewise.
  model, params = trainers[0].model, trainers[0].state.params
  sources, limits = common.decode_batch(size, examples, max_extra_len)
  runs = {}
  for name, (compile_s, run) in jax_bench.decoders(model, params, sources,
                                                   max_extra_len).items():
    ours[f"{name} compile s"], runs[name] = compile_s, run
  if use_torch:
    torch_model = trainers[1].model if torch_train else torch_bench.TorchTransformer(size)
    runs["torch greedy"] = torch_bench.decoder(torch_model, sources, limits, size.dtype)
  if use_marian:
    from benchmarks import marian_bench  # pylint: disable=g-import-not-at-top
    hf = marian_bench.build(size, model.config.max_len)
    for name, run in marian_bench.decoders(hf, sources, limits, size.dtype).items():
      runs[f"marian {name}"] = run
  times = common.interleaved(runs, size.decode_repeats)
  # ours/peer in each round of the interleaving: its spread says how far the
  # median ratio can be trusted on this machine.
  per_run = {name: [theirs_s / ours_s for ours_s, theirs_s in zip(times[name.split()[1]], ts)]
             for name, ts in times.items() if " " in name}
  sides = {"torch": theirs, "marian": marian}
  for name, ts in times.items():
    side, name = (sides[name.split()[0]], name.split()[1]) if " " in name else (ours, name)
    side[f"{name} sentences/s"] = len(sources) / statistics.median(ts)
    side[f"{name} tokens/s"] = int(limits.sum()) / statistics.median(ts)
  ours["decode sentences x steps"] = f"{len(sources)} x {int(limits.max())}"
  for name in ("greedy", "beam4"):
    if f"marian {name}" in runs:  # What generate() really ran: the forced length.
      marian[f"{name} steps run"] = runs[f"marian {name}"].steps
  return {"ours": ours, "pytorch": theirs, "marian": marian,
          "decode_limits": limits.tolist(),
          "step_s_all": {"ours": train and trainers[0].times,
                         "pytorch": torch_train and trainers[1].times},
          "decode_s_all": times,
          "epoch_mix_step_s": mix_times,  # Per side: step times by target shape "BxT".
          "decode_ratio_per_run": per_run,
          "batch_shapes": {"ours": [list(b["targets"].shape) for b in our_batches],
                           "pytorch": [list(b["targets"].shape) for b in batches]}}


def _train(trainers, steps, peaks, use_torch, size):
  for trainer in trainers:
    trainer.warm_up()
  # Then one untimed round of both. The frameworks share one allocator, and the
  # first step after the other's warm-up finds the heap laid out for that one:
  # at base our first step faulted in 1.2 million fresh pages (+7 s on a 10 s
  # step) and none after; a training run alone never pays this.
  if len(trainers) > 1:
    for trainer in trainers:
      trainer.untimed_step(0)
  for i in range(steps):
    for trainer in trainers:
      trainer.step(i)
  measure_peak(peaks, use_torch, peak_size(size.name == "smoke"), size.dtype)


MIX_ROUNDS = 3  # Timed steps per shape in the epoch mix.


def _epoch_mix(size, sides):
  """Sets each side's 'train target tokens/s (epoch mix)': real target tokens/s
  over a whole epoch of its input, from one step time per target shape of that
  epoch (common.epoch_tokens_per_s). The timed batches above are the epoch's
  first few, whose padding need not be the epoch's (benchmarks/README.md,
  session 17). `sides`: {name: (figures, epoch_stats, Trainer class)}. In each of
  MIX_ROUNDS rounds each side in turn runs one untimed step, then times the first
  full batch of each of its shapes: every shape's median of as many steps (with
  one step a shape, a single stall set that shape's time). A side's first step
  after the other's ran up to 1.6x slow (the heap laid out for the other; ours
  alone never pays it), hence the untimed one; within a side the shapes follow
  one another as in a bucketed training run.
  Returns each side's step times by shape ("BxT")."""
  trainers, times = {}, {name: {} for name in sides}
  for name, (_, stats, make) in sides.items():
    trainers[name] = make(size, list(stats["first_of_shape"].values()))
    trainers[name].warm_up()
  for _ in range(MIX_ROUNDS):
    for name, (_, stats, _) in sides.items():
      trainers[name].untimed_step(0)
      for j, shape in enumerate(stats["first_of_shape"]):
        trainers[name].step(j)
        times[name].setdefault(shape, []).append(trainers[name].times[-1])
  for name, (figures, stats, _) in sides.items():
    figures["train target tokens/s (epoch mix)"] = common.epoch_tokens_per_s(
        stats, {shape: statistics.median(ts) for shape, ts in times[name].items()})
    figures["train shapes timed (epoch mix)"] = len(times[name])
  return {name: {"x".join(map(str, shape)): ts for shape, ts in by_shape.items()}
          for name, by_shape in times.items()}


def _train_figures(r):
  return {
      "train step s (median)": r["step_s_median"],
      "train target tokens/s": r["target_tokens_per_s"],
      "train source+target tokens/s": r["tokens_per_s"],
      "train GFLOP per step": r["flops_per_step"] / 1e9,
      "train GFLOP/s": r["flops_per_s"] / 1e9,
      "train padding (source+target) %": 100 * r["padding_source_target"],  # Timed batches.
      "train MFU (padded) %": None,  # Set in main() against the run's best peak, either side's.
      "train MFU (real tokens) %": None,
      "train CPU s per step (median)": r["cpu_s_per_step"],
      "train page faults per step": r["page_faults_per_step"],
      "train loss first->last": f"{r['loss_first']:.3f}->{r['loss_last']:.3f}",
  }


def out_of_memory(error):
  """Whether `error` is PyTorch's or XLA's out-of-memory error."""
  return (type(error).__name__ == "OutOfMemoryError"
          or "RESOURCE_EXHAUSTED" in str(error) or "out of memory" in str(error))


def out_of_memory_message(size, args, with_torch, error):
  """What ran out, and what to change: both frameworks share one device's memory."""
  first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  shared = (" JAX and PyTorch share the device in one process, and on a GPU each keeps the"
            " memory it reached (JAX preallocates 75% unless XLA_PYTHON_CLIENT_PREALLOCATE="
            "false): run with --no_torch --no_marian, or" if with_torch else " Run")
  return (f"benchmarks.run: {size.name}: out of memory at --tokens_per_batch "
          f"{args.tokens_per_batch or size.tokens_per_batch}.{shared} with a smaller "
          f"--tokens_per_batch. ({type(error).__name__}: {first})")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes", default="small,base", help="comma-separated: smoke, small, base")
  p.add_argument("--config", help="benchmark this config file's model instead of --sizes")
  p.add_argument("--smoke", action="store_true", help="tiny sizes and few steps (CI)")
  p.add_argument("--json", help="write the results here")
  p.add_argument("--data_dir", help="Multi30k text folder (train.en/.de[.gz]); default synthetic")
  p.add_argument("--steps", type=int, help="timed training steps (default: per size)")
  p.add_argument("--tokens_per_batch", type=int,
                 help="training batch size in tokens a side (default: per size, 4096; "
                 "the paper's is ~25000, for a GPU)")
  p.add_argument("--decode_sentences", type=int, help="sentences per decoding batch")
  p.add_argument("--decode_repeats", type=int,
                 help="timed decoding runs per side, interleaved (default: per size)")
  p.add_argument("--decode_only", action="store_true",
                 help="no training (nor allocator comparison): decoding on initial weights")
  p.add_argument("--max_extra_len", type=int, default=50, help="output limit = source + this (6.1)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="compute dtype of both sides (parameters stay float32; PyTorch: "
                 "torch.autocast); MFU is against the matmul peak in that dtype")
  p.add_argument("--pack", action="store_true",
                 help="our side trains on packed rows (segment masks), PyTorch on the "
                 "bucketed ones: each its natural input, compared in real target tokens/s")
  p.add_argument("--epoch_mix", action="store_true",
                 help="also time one step of every batch shape of each side's epoch and "
                 "report real target tokens/s over the whole epoch's mix of shapes")
  p.add_argument("--no_torch", action="store_true", help="no PyTorch nn.Transformer side")
  p.add_argument("--no_marian", action="store_true",
                 help="no Hugging Face Marian decoding peer (needs torch and transformers)")
  p.add_argument("--malloc", choices=("compare", "skip"), default="compare",
                 help="also time our step of the first size under each allocator "
                 "(benchmarks/allocators.py)")
  p.add_argument("--malloc_steps", type=int, default=5)
  p.add_argument("--malloc_paused_steps", type=int, default=3,
                 help=f"steps timed after a {allocators.PAUSE_S} s pause each")
  p.add_argument("--malloc_rounds", type=int, default=2)
  args = p.parse_args(argv)
  common.check_flags(p, args, least=dict.fromkeys(
      ("steps", "tokens_per_batch", "decode_sentences", "decode_repeats"), 1),
      outputs=("json",))

  names = ["smoke"] if args.smoke else [args.config] if args.config else args.sizes.split(",")
  try:
    sizes = [common.size_from_config(n) if n.partition(":")[0].endswith(".py")
             else common.SIZES[n] for n in names]
  except (OSError, ValueError) as e:
    p.error(str(e))
  except KeyError as e:
    p.error(f"--sizes: no size {e} (sizes: {', '.join(common.SIZES)})")
  overrides = {k: v for k, v in (("train_steps", args.steps),
                                 ("tokens_per_batch", args.tokens_per_batch),
                                 ("decode_sentences", args.decode_sentences),
                                 ("decode_repeats", args.decode_repeats),
                                 ("dtype", args.dtype)) if v}
  sizes = [dataclasses.replace(s, **overrides) for s in sizes]

  use_torch = not args.no_torch
  if use_torch:
    try:
      from benchmarks import torch_bench  # pylint: disable=g-import-not-at-top,unused-import # noqa: F401
    except ImportError as e:
      print(f"PyTorch not importable ({e}): running our half only.")
      use_torch = False
  use_marian = not args.no_marian
  if use_marian:
    try:
      from benchmarks import marian_bench  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      print(f"Marian peer skipped: transformers/torch not importable ({e}); "
            "pip install -r requirements-bench.txt")
      use_marian = False

  results = {"meta": {
      "device": str(jax.devices()[0]), "platform": platform.platform(),
      "cpu_count": os.cpu_count(), **common.cpu_description(),
      "load_average_start": os.getloadavg(),
      "jax": jax.__version__, "dtype": args.dtype,
      "batching": {"ours": "pack" if args.pack else "bucket", "pytorch": "bucket"},
      **{k: os.environ.get(k, "") for k in ("GLIBC_TUNABLES", "LD_PRELOAD", *runtime.TCMALLOC_ENV)},
      "data": args.data_dir or "synthetic", "max_extra_len": args.max_extra_len,
      "torch": use_torch and __import__("torch").__version__,
      "torch_device": use_torch and torch_bench.DEVICE,
      # What --dtype float32 products run as, on both sides (see torch_bench).
      "float32_matmul": use_torch and torch_bench.FLOAT32_MATMUL,
      "transformers": use_marian and marian_bench.VERSION,
      "sizes": {s.name: dataclasses.asdict(s) for s in sizes}}}
  n = peak_size(args.smoke)
  # The peak is measured before and after each size's training; the best one counts
  # (on a shared machine a measurement can only come out low, never high).
  peaks = {"ours": [], "pytorch": []}
  probed, use_torch = use_torch, measure_peak(peaks, use_torch, n, args.dtype)
  if probed and not use_torch and use_marian:
    print("Marian peer skipped too: it runs on the same PyTorch kernels.", flush=True)
    use_marian = False
  results["meta"]["torch"] = use_torch and results["meta"]["torch"]
  results["meta"]["transformers"] = use_marian and results["meta"]["transformers"]
  results["sizes"] = {}
  for size in sizes:
    t0 = time.perf_counter()
    examples = common.examples_of(size, args.data_dir)
    try:
      results["sizes"][size.name] = bench_size(
          size, examples, peaks=peaks, use_torch=use_torch, use_marian=use_marian,
          max_extra_len=args.max_extra_len, pack=args.pack, train=not args.decode_only,
          epoch_mix=args.epoch_mix)
    except Exception as e:  # pylint: disable=broad-except
      if not out_of_memory(e):
        raise
      raise SystemExit(out_of_memory_message(size, args, use_torch or use_marian, e)) from e
    print(f"[{size.name} done in {time.perf_counter() - t0:.0f} s]", flush=True)
  if args.malloc == "compare" and not args.decode_only:
    # The first (smallest) size; the smoke run's two glibc children keep CI short.
    results["malloc"] = allocators.compare(
        sizes[0], args.malloc_steps, 1 if args.smoke else args.malloc_paused_steps,
        1 if args.smoke else args.malloc_rounds,
        allocators.NAMES[:2] if args.smoke else allocators.NAMES)
  results["matmul_peak_gflops"] = {k: max(v) / 1e9 if v else None for k, v in peaks.items()}
  results["matmul_peak_all_gflops"] = {k: [x / 1e9 for x in v] for k, v in peaks.items()}
  report.set_mfu(results, peaks)
  results["meta"]["load_average_end"] = os.getloadavg()
  results["targets"] = report.check_targets(results)
  report.print_table(results)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2, default=str)
  return results


if __name__ == "__main__":
  runtime.use_fast_malloc()  # What the commands use; see transformer/runtime.py.
  main()
