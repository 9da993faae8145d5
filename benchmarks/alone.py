"""Each framework alone in a process of its own, the processes in alternation:
the comparison benchmarks.run's one process cannot give. There, after each of
PyTorch's steps, our base training step spent ~2 s more in the kernel faulting
in its huge pages (benchmarks/README.md, 'Session 39'), and a training run or a
translation never shares its process with the other framework.

  python -m benchmarks.alone --sizes small,base --dtype bfloat16 --pack --rounds 2
  python -m benchmarks.alone --sizes base --dtype bfloat16 --decode --rounds 2

Training (the default) sets ours against PyTorch eager: each run is a fresh
process (`--side`) with benchmarks.run's batches (ours packed with --pack,
PyTorch's bucketed; synthetic sentences, or with --data_dir Multi30k's, which
each process tokenizes alike), one warm-up step per shape and
size.train_steps timed steps; figure: real target tokens/s. --decode sets ours
against Hugging Face Marian (KV cache, random weights; marian_bench.py): greedy
and beam-4 decoding of benchmarks.run's sources, each row run to its limit,
--decode_repeats timed runs after a warm-up one; figures: sentences/s
(medians). Each side runs under its own allocator (side_env): ours under the
one our commands use, the peer under glibc's default malloc, as its users run
it. Rounds alternate which side goes first (ABBA...). Printed: each run's
figures, and ours/peer of the medians.
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

PEERS = {"train": "pytorch", "decode": "marian"}  # Whom ours is set against.
FIGURES = {"train": ("target_tokens_per_s",),  # What a run reports; ours/peer of each.
           "decode": ("greedy sentences/s", "beam4 sentences/s")}
PEER_NAMES = {"pytorch": "PyTorch", "marian": "Marian"}
RESULT = "RESULT "  # The line a side's process prints its figures on.


def train_side(side, size, pack, data_dir=None):
  """{'target_tokens_per_s', 'step_s_median', 'step_s_all', 'padding_source_target',
  'tokens_per_batch', 'data_sha1'} of `side`'s timed steps, in this process."""
  examples = common.examples_of(size, data_dir)
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
  return {**{k: figures[k] for k in ("target_tokens_per_s", "step_s_median", "step_s_all",
                                     "padding_source_target")},
          "tokens_per_batch": size.tokens_per_batch,
          "data_sha1": common.data_sha1(a for pair in examples for a in pair)}


def decode_side(side, size, data_dir=None, max_extra_len=50):
  """{'greedy sentences/s', 'beam4 sentences/s'} (medians of size.decode_repeats
  timed runs, after a warm-up one), 'greedy s all', 'beam4 s all' of `side`'s
  decoding of benchmarks.run's sources (common.decode_batch), and their 'data_sha1',
  in this process; ours from freshly initialised parameters (every
  row runs to its limit, so the weights change no work)."""
  sources, limits = common.decode_batch(size, common.examples_of(size, data_dir),
                                        max_extra_len)
  if side == "ours":
    from benchmarks import jax_bench  # pylint: disable=g-import-not-at-top
    model, state, _, _ = jax_bench.setup(size)
    runs = {name: run for name, (_, run) in jax_bench.decoders(
        model, state.params, sources, max_extra_len).items()}
  else:
    from benchmarks import marian_bench  # pylint: disable=g-import-not-at-top
    hf = marian_bench.build(size, common.experiment_config(size).model.max_len)
    runs = marian_bench.decoders(hf, sources, limits, size.dtype)
  times = common.interleaved(runs, size.decode_repeats)  # As in benchmarks.run.
  return {**{f"{name} sentences/s": len(sources) / statistics.median(ts)
             for name, ts in times.items()},
          **{f"{name} s all": ts for name, ts in times.items()},
          "data_sha1": common.data_sha1(sources)}


def side_env(side, peer_malloc, environ=os.environ):
  """The environment of `side`'s process. Ours runs under the allocator our
  commands use (its process re-executes itself with it: runtime.use_fast_malloc);
  the peer under glibc's default malloc, as its users run it, unless
  `peer_malloc` is "commands". PyTorch's base training step ran 1.19x faster
  under glibc's default than under our huge pages (benchmarks/README.md,
  'Session 39')."""
  env = dict(environ)
  if side != "ours" and peer_malloc == "default":
    env["TRANSFORMER_DEFAULT_MALLOC"] = "1"
  return env


def allocator() -> str:
  """This process's allocator, as its environment sets it."""
  tunables = os.environ.get("GLIBC_TUNABLES")
  preload = os.environ.get("LD_PRELOAD")
  return ", ".join(filter(None, [preload and f"LD_PRELOAD={preload}",
                                 tunables and f"GLIBC_TUNABLES={tunables}"])) or (
                                     "glibc malloc, default settings")


def _spawn(side, args, name):
  command = [sys.executable, "-m", "benchmarks.alone", "--side", side, "--sizes", name,
             "--dtype", args.dtype] + [f"--{flag}={getattr(args, flag)}" for flag in (
                 "steps", "tokens_per_batch", "decode_repeats", "data_dir")
                 if getattr(args, flag)] + [
                     flag for flag in ("--pack", "--decode") if getattr(args, flag[2:])]
  done = subprocess.run(command, capture_output=True, text=True, check=False,
                        env=side_env(side, args.peer_malloc))
  lines = [l for l in done.stdout.splitlines() if l.startswith(RESULT)]
  if done.returncode or not lines:
    raise SystemExit(f"benchmarks.alone: error: the {side} run at {name} failed "
                     f"(status {done.returncode}):\n{done.stderr[-2000:]}")
  return json.loads(lines[-1][len(RESULT):])


def _peer_missing(kind):
  """Why the peer of `kind` cannot run here, or None."""
  needed = ("torch",) + (("transformers",) if kind == "decode" else ())
  missing = [m for m in needed if importlib.util.find_spec(m) is None]
  return f"{' and '.join(missing)} not installed (requirements-bench.txt)" if missing else None


def _number(value):
  return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _describe(kind, figures):
  if kind == "train":
    return f"{_number(figures['target_tokens_per_s'])} real target tokens/s"
  return ", ".join(f"{k.split()[0]} {_number(figures[k])}" for k in FIGURES[kind]) + " sentences/s"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="small,base", help="comma-separated: smoke, small, base")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--decode", action="store_true",
                 help="decoding against Marian instead of training against PyTorch")
  p.add_argument("--pack", action="store_true", help="ours on packed rows (its recipes' input)")
  p.add_argument("--steps", type=int, help="timed training steps a run (default: the size's)")
  p.add_argument("--tokens_per_batch", type=int,
                 help="training batch size in tokens a side, as benchmarks.run's "
                 "(default: the size's, 4096)")
  p.add_argument("--decode_repeats", type=int,
                 help="timed decoding runs a process, after a warm-up one (default: the size's)")
  p.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating")
  p.add_argument("--peer_malloc", choices=("default", "commands"), default="default",
                 help="the peer's allocator: glibc's default malloc (as its users run it), "
                 "or the one our commands use (runtime.py; ours always runs under it)")
  p.add_argument("--data_dir", help="Multi30k text folder (train.en/.de[.gz]), as "
                 "benchmarks.run's; default synthetic")
  p.add_argument("--json", help="write the results here")
  p.add_argument("--side", choices=("ours", *PEERS.values()),
                 help=argparse.SUPPRESS)  # A side's own process.
  args = p.parse_args(argv)
  common.check_flags(p, args, least={"steps": 1, "tokens_per_batch": 1, "decode_repeats": 1,
                                     "rounds": 1},
                     outputs=("json",))
  kind = "decode" if args.decode else "train"
  other_kind = ({"--pack": args.pack, "--steps": args.steps,
                 "--tokens_per_batch": args.tokens_per_batch} if args.decode
                else {"--decode_repeats": args.decode_repeats})
  wrong = [flag for flag, value in other_kind.items() if value]
  if wrong:
    p.error(f"{wrong[0]} is for {'training' if args.decode else '--decode'} runs")
  names = args.sizes.split(",")
  unknown = [n for n in names if n not in common.SIZES]
  if unknown:
    p.error(f"--sizes: no size {unknown[0]!r} (sizes: {', '.join(common.SIZES)})")
  overrides = {k: v for k, v in (("train_steps", args.steps),
                                 ("tokens_per_batch", args.tokens_per_batch),
                                 ("decode_repeats", args.decode_repeats)) if v}
  sizes = {n: dataclasses.replace(common.SIZES[n], dtype=args.dtype, **overrides)
           for n in names}
  if args.side:
    runtime.use_fast_malloc()  # Re-executes ours (side_env) with the commands' allocator.
    for name, size in sizes.items():
      figures = (decode_side(args.side, size, args.data_dir) if args.decode
                 else train_side(args.side, size, args.pack, args.data_dir))
      print(RESULT + json.dumps({**figures, "allocator": allocator()}), flush=True)
    return None

  peer = PEERS[kind]
  sides = ["ours", peer]
  missing = _peer_missing(kind)
  if missing:
    print(f"{PEER_NAMES[peer]} skipped: {missing}: ours alone.", flush=True)
    sides = ["ours"]
  results = {"meta": {"kind": kind, "peer": peer, "peer_malloc": args.peer_malloc,
                      "dtype": args.dtype, "pack": args.pack,
                      "data": args.data_dir or "synthetic",
                      "rounds": args.rounds, "cpu_count": os.cpu_count(),
                      **common.cpu_description()},
             "sizes": {}}
  for name in names:
    runs = {side: [] for side in sides}
    for r in range(args.rounds):
      for side in sides if r % 2 == 0 else sides[::-1]:
        runs[side].append(_spawn(side, args, name))
        print(f"{name} round {r + 1} {side}: {_describe(kind, runs[side][-1])}", flush=True)
    medians = {side: {k: statistics.median(x[k] for x in runs[side]) for k in FIGURES[kind]}
               for side in sides}
    res = {"runs": runs, "medians": medians}
    if peer in medians:
      res[f"ours/{peer}"] = {k: medians["ours"][k] / medians[peer][k] for k in FIGURES[kind]}
      ratios = ", ".join(f"{k} {v:.2f} ({_number(medians['ours'][k])} against "
                         f"{_number(medians[peer][k])})" for k, v in res[f"ours/{peer}"].items())
      print(f"{name}: ours/{PEER_NAMES[peer]}, each alone, medians of {args.rounds} runs: "
            f"{ratios}", flush=True)
    results["sizes"][name] = res
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == "__main__":
  main()  # This process only starts the sides' processes, each with its allocator.
