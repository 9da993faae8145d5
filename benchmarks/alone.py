"""Each framework's training step alone in a process of its own, the processes in
alternation: the comparison benchmarks.run's one process cannot give. There, the
order in which the two frameworks run moved each side's step by 1.2-1.4x
(benchmarks/README.md, 'Session 38'), and a training run never shares its
process with the other framework.

  python -m benchmarks.alone --sizes small,base --dtype bfloat16 --pack --rounds 2

Each run is a fresh process (`--side`), with benchmarks.run's batches (ours
packed with --pack, PyTorch's bucketed; synthetic sentences), allocator set-up,
one warm-up step per shape and size.train_steps timed steps. Rounds alternate
which side goes first (ABBA...). Printed: each run's real target tokens/s, and
ours/PyTorch of the medians.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys

from benchmarks import common
from transformer import runtime

SIDES = ("ours", "pytorch")
RESULT = "RESULT "  # The line a side's process prints its figures on.


def run_side(side, size, pack):
  """{'target_tokens_per_s', 'step_s_median', 'step_s_all', 'padding_source_target'}
  of `side`'s timed steps, in this process."""
  examples = common.synthetic_examples(size)
  if side == "ours":
    from benchmarks import jax_bench  # pylint: disable=g-import-not-at-top
    batching, make = ("pack" if pack else "bucket"), jax_bench.Trainer
  else:
    from benchmarks import torch_bench  # pylint: disable=g-import-not-at-top
    batching, make = "bucket", torch_bench.Trainer
  batches = common.timed_batches(size, examples, size.train_steps, batching=batching)
  trainer = make(size, batches)
  trainer.warm_up()
  for i in range(len(batches)):
    trainer.step(i)
  figures = trainer.figures()
  return {k: figures[k] for k in ("target_tokens_per_s", "step_s_median", "step_s_all",
                                  "padding_source_target")}


def _spawn(side, args, name):
  command = [sys.executable, "-m", "benchmarks.alone", "--side", side, "--sizes", name,
             "--dtype", args.dtype] + (["--pack"] if args.pack else []) + (
                 ["--steps", str(args.steps)] if args.steps else [])
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  lines = [l for l in done.stdout.splitlines() if l.startswith(RESULT)]
  if done.returncode or not lines:
    raise SystemExit(f"benchmarks.alone: error: the {side} run at {name} failed "
                     f"(status {done.returncode}):\n{done.stderr[-2000:]}")
  return json.loads(lines[-1][len(RESULT):])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="small,base", help="comma-separated: smoke, small, base")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--pack", action="store_true", help="ours on packed rows (its recipes' input)")
  p.add_argument("--steps", type=int, help="timed steps a run (default: the size's)")
  p.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating")
  p.add_argument("--json", help="write the results here")
  p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # A side's own process.
  args = p.parse_args(argv)
  common.check_flags(p, args, least={"steps": 1, "rounds": 1}, outputs=("json",))
  names = args.sizes.split(",")
  unknown = [n for n in names if n not in common.SIZES]
  if unknown:
    p.error(f"--sizes: no size {unknown[0]!r} (sizes: {', '.join(common.SIZES)})")
  sizes = {n: dataclasses.replace(common.SIZES[n], dtype=args.dtype,
                                  **({"train_steps": args.steps} if args.steps else {}))
           for n in names}
  if args.side:
    for name, size in sizes.items():
      print(RESULT + json.dumps(run_side(args.side, size, args.pack)), flush=True)
    return None

  sides = list(SIDES)
  if importlib.util.find_spec("torch") is None:
    print("PyTorch not installed (requirements-bench.txt): ours alone.", flush=True)
    sides = ["ours"]
  results = {"meta": {"dtype": args.dtype, "pack": args.pack, "rounds": args.rounds,
                      "cpu_count": os.cpu_count(), **common.cpu_description()},
             "sizes": {}}
  for name in names:
    runs = {side: [] for side in sides}
    for r in range(args.rounds):
      for side in sides if r % 2 == 0 else sides[::-1]:
        runs[side].append(_spawn(side, args, name))
        print(f"{name} round {r + 1} {side}: {runs[side][-1]['target_tokens_per_s']:,.0f} "
              "real target tokens/s", flush=True)
    medians = {side: statistics.median(x["target_tokens_per_s"] for x in runs[side])
               for side in sides}
    res = {"runs": runs, "median_target_tokens_per_s": medians}
    if "pytorch" in medians:
      res["ours/pytorch"] = medians["ours"] / medians["pytorch"]
      print(f"{name}: ours/PyTorch real target tokens/s, each alone: {res['ours/pytorch']:.2f} "
            f"({medians['ours']:,.0f} against {medians['pytorch']:,.0f}, medians of "
            f"{args.rounds})", flush=True)
    results["sizes"][name] = res
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == "__main__":
  runtime.use_fast_malloc()  # As benchmarks.run: both sides under the same allocator.
  main()
