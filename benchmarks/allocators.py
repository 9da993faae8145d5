"""Our training step under each memory allocator, one fresh process per allocator.

  python -m benchmarks.allocators --size small            # the comparison alone
  python -m benchmarks.run --sizes small                  # runs it after the benchmark

Allocators: glibc malloc as is, GLIBC_TUNABLES=glibc.malloc.hugetlb=1, and, where
tcmalloc is installed (Debian/Ubuntu: libtcmalloc-minimal4), tcmalloc by LD_PRELOAD as
is and with TCMALLOC_RELEASE_RATE=0 (what our commands use; transformer/runtime.py).
Such variables act only when set before a process starts, hence one child process
per allocator and round; the rounds interleave the allocators so that a change in
the machine's load hits all of them alike. Each child times steps back to back and
steps after a 2 s pause (memory handed back to a virtual machine's host during a
pause is slow to get back), with page faults and CPU seconds per step.
"""

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top

from benchmarks import common, jax_bench
from transformer import runtime

HUGETLB = "glibc.malloc.hugetlb=1"
PAUSE_S = 2.0  # Linux reports free pages to a VM's host after ~2 s (page_reporting).
NAMES = ("default malloc", "hugetlb=1", "tcmalloc", "tcmalloc, release 0")


def probe(size, steps, paused_steps):
  """Child process: our step on one pipeline batch; prints step time and faults as JSON."""
  from transformer import sharding  # pylint: disable=g-import-not-at-top
  batch = common.timed_batches(size, common.synthetic_examples(size), 1)[0]
  _, state, step, mesh = jax_bench.setup(size)
  placed = sharding.place_batch(batch, mesh)
  holder = [state]

  def run():  # One step; its wall seconds.
    t0 = time.perf_counter()
    holder[0], m = step(holder[0], placed)
    jax.block_until_ready((holder[0], m))
    return time.perf_counter() - t0

  for _ in range(2):  # Compile, then one more step for the allocator to settle.
    run()
  times, faults, cpu, sys_cpu = [], [], [], []
  for _ in range(steps):
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    times.append(run())
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    faults.append(u1.ru_minflt - u0.ru_minflt)
    sys_cpu.append(u1.ru_stime - u0.ru_stime)
    cpu.append(u1.ru_utime - u0.ru_utime + sys_cpu[-1])
  paused = []
  for _ in range(paused_steps):
    time.sleep(PAUSE_S)
    paused.append(run())
  # CPU seconds (user + kernel, all threads) are less sensitive to other processes'
  # load than wall time; page faults show up as kernel time.
  print(json.dumps({"step_s_median": statistics.median(times), "step_s_all": times,
                    "paused_step_s_all": paused,
                    "cpu_s_per_step": statistics.median(cpu),
                    "sys_s_per_step": statistics.median(sys_cpu),
                    "page_faults_per_step": statistics.median(faults),
                    "shape": list(batch["targets"].shape)}))


def environments():
  """name -> environment of the child process; the tcmalloc ones where it is installed.

  Looked up when the comparison runs; a bad TRANSFORMER_TCMALLOC raises
  FileNotFoundError (benchmarks.run's use_fast_malloc stops on it first).
  """
  envs = {"default malloc": {}, "hugetlb=1": {"GLIBC_TUNABLES": HUGETLB}}
  tcmalloc = runtime.find_tcmalloc()
  if tcmalloc:
    envs["tcmalloc"] = {"LD_PRELOAD": tcmalloc}
    envs["tcmalloc, release 0"] = {"LD_PRELOAD": tcmalloc, **runtime.TCMALLOC_ENV}
  return envs


def compare(size, steps, paused_steps, rounds, names=NAMES):
  """Our step on `size` in a fresh process per allocator and round; medians over
  all of an allocator's steps. The child gets the whole Size, overrides included."""
  envs = environments()
  names = [n for n in names if n in envs]
  runs = {n: [] for n in names}
  for _ in range(rounds):
    for name in names:
      env = {k: v for k, v in os.environ.items()
             if k not in ("GLIBC_TUNABLES", "LD_PRELOAD", *runtime.TCMALLOC_ENV)}
      env.update(envs[name], TRANSFORMER_DEFAULT_MALLOC="1")  # No re-execution.
      cmd = [sys.executable, "-m", "benchmarks.allocators", "--probe",
             json.dumps(dataclasses.asdict(size)), "--steps", str(steps),
             "--paused_steps", str(paused_steps)]
      proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
      if proc.returncode:
        raise RuntimeError(f"malloc probe ({name}) failed:\n{proc.stderr[-3000:]}")
      runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
  out = {"size": size.name}
  for name, rs in runs.items():
    median = lambda key, rs=rs: statistics.median(r[key] for r in rs)
    out[name] = {"step_s_median": statistics.median(t for r in rs for t in r["step_s_all"]),
                 "step_s_all": [t for r in rs for t in r["step_s_all"]],
                 "paused_step_s_median": statistics.median(
                     t for r in rs for t in r["paused_step_s_all"]),
                 "cpu_s_per_step": median("cpu_s_per_step"),
                 "sys_s_per_step": median("sys_s_per_step"),
                 "page_faults_per_step": median("page_faults_per_step"),
                 "env": envs[name], "shape": rs[0]["shape"]}
  return out


def print_table(results):
  """`results`: what compare returns."""
  m = dict(results)
  size = m.pop("size")
  base = m["default malloc"]
  print(f"our train step ({size}, batch {base['shape']}), one fresh process per allocator:")
  print(f"  {'allocator':<20} {'step s (median)':>16} {'vs default':>11} "
        f"{'after ' + str(PAUSE_S) + ' s pause':>17} "
        f"{'CPU s/step':>11} {'kernel s/step':>14} {'page faults/step':>17}")
  for name, r in m.items():
    print(f"  {name:<20} {r['step_s_median']:>16.3f} "
          f"{r['step_s_median'] / base['step_s_median']:>11.3f} "
          f"{r['paused_step_s_median']:>17.3f} "
          f"{r['cpu_s_per_step']:>11.2f} {r['sys_s_per_step']:>14.2f} "
          f"{r['page_faults_per_step']:>17,.0f}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="small", help="smoke, small, base or a config file")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--steps", type=int, default=5, help="steps timed back to back")
  p.add_argument("--paused_steps", type=int, default=3,
                 help=f"steps timed after a {PAUSE_S} s pause each")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--json", help="write the results here")
  p.add_argument("--probe", metavar="SIZE_JSON", help=argparse.SUPPRESS)  # One child.
  args = p.parse_args(argv)
  if args.probe:
    return probe(common.Size(**json.loads(args.probe)), args.steps, args.paused_steps)
  size = (common.size_from_config(args.size) if args.size.endswith(".py")
          else common.SIZES[args.size])
  try:
    results = compare(dataclasses.replace(size, dtype=args.dtype), args.steps,
                      args.paused_steps, args.rounds)
  except FileNotFoundError as e:  # A bad TRANSFORMER_TCMALLOC: the message, no traceback.
    p.error(str(e))
  print_table(results)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == "__main__":
  main()
