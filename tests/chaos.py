"""Kill -9 at random moments: train.py (tests/fault_train.py) on the tiny config,
SIGKILLed again and again and restarted each time, must end bit for bit where an
uninterrupted run ends, with nothing lost and nothing left behind.

  python -m tests.chaos --kills 20 [--seed N] [--dir DIR]

Each kill lands at a random moment: anywhere from the process's start (loading,
compiling, restoring, training, saving), during training, or inside a checkpoint
save (the save is held between writing its files and renaming its temporary
directory into place, and the kill is sent there). After the last restart runs
to the end, it checks that
  - the final parameters, optimizer state, step, rng and data position equal
    those of an uninterrupted run of the same config, bit for bit;
  - every restart's log shows the restore of the newest complete checkpoint
    (and the takeover of the killed process's lock);
  - no temporary or partial checkpoint directory, no temporary file and no lock
    is left in the workdir;
  - the steps of the surviving history trained on the uninterrupted run's
    batches, each exactly once.
A run that ends before its kill (the training was done) ends an episode, which
is checked, and the remaining kills go to a new workdir. tests/test_faults.py
runs one episode of 3 kills, after a SIGTERM (kind 'sigterm': a stop that saves
and exits 143, which the checks above take as they take a kill); this command
is the long version (not in the test suite: ~10-30 s a restart on a 2-core
machine).
"""

import argparse
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

from tests import process_helpers as ph

FAULT_TRAIN = os.path.join("tests", "fault_train.py")
NUM_STEPS = 20  # tests/tiny_train_config.py
STEP_SECONDS = "0.2"  # Slowed steps, so that a random moment often falls in training.
SAVE_SECONDS = "60"  # A held save lasts until the kill.
KINDS = ("anywhere", "training", "save")
# Every run's overrides of tests/tiny_train_config.py: its evaluation (at the last
# step) on 20 sentences, not 200 (fewer batch shapes to compile and load; no
# evaluation's value is checked, and training does not depend on it).
OVERRIDES = ("--config.data.eval_split=test[:20]",)


def checkpoint_steps(workdir):
  """Steps of the complete checkpoints (Orbax's temporary directories excluded)."""
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def temporaries(workdir):
  """Paths under `workdir` that a finished writer must not leave: Orbax's
  temporary checkpoint directories, files.atomic_path's NAME.tmp<pid>@<host>, the lock."""
  found = []
  for root, dirs, names in os.walk(workdir):
    for name in dirs + names:
      if ("orbax-checkpoint-tmp" in name or re.search(r"\.tmp\d+@", name)
          or (root == workdir and name == "LOCK")):
        found.append(os.path.join(root, name))
  return found


def uninterrupted(tfds_dir, base):
  """Starts the uninterrupted run; returns a function that waits for it and
  gives (its final checkpoint, its batch log's lines, its wall time, its workdir)."""
  os.makedirs(base, exist_ok=True)
  workdir, batches, log = (os.path.join(base, n) for n in ("w", "batches", "log"))
  started = time.monotonic()
  process = ph.start_train(workdir, tfds_dir, log, *OVERRIDES, script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_BATCH_LOG=batches))

  def result():
    status = process.wait(timeout=900)
    assert status == 0, ph.read(log)[-4000:]
    lines = ph.read(batches).splitlines()
    assert len(lines) == NUM_STEPS, lines
    return ph.restore_final(workdir), lines, time.monotonic() - started, workdir

  return result


def run_with_kills(workdir, tfds_dir, kinds, rng, lifetime, say=print):
  """Runs train.py in `workdir` once per entry of `kinds` ('anywhere', 'training'
  or 'save'), SIGKILLing it there, or ('sigterm') sending it SIGTERM once it
  has logged a step, then once to the end; a run that ends before its kill is
  that end. `lifetime()`: seconds an uninterrupted run takes, the range of
  'anywhere'. Returns one record a run ('killed', 'stopped' with its exit
  status, or 'finished')."""
  os.makedirs(workdir, exist_ok=True)
  runs = []
  for i, kind in enumerate(list(kinds) + ["end"]):
    log, batches = (os.path.join(workdir + ".faults", f"{i}.{n}") for n in ("log", "batches"))
    os.makedirs(os.path.dirname(log), exist_ok=True)
    lock = os.path.join(workdir, "LOCK")
    record = {"kind": kind, "log": log, "checkpoints_before": checkpoint_steps(workdir),
              # A killed owner's record (empty only if killed between creating and
              # writing the file, when there is no owner to name).
              "lock_before": os.path.exists(lock) and bool(ph.read(lock).strip())}
    env = ph.command_env(FAULT_BATCH_LOG=batches, FAULT_STEP_SECONDS=STEP_SECONDS,
                         **({"FAULT_SAVE_SECONDS": SAVE_SECONDS} if kind == "save" else {}))
    if kind == "end":
      env.pop("FAULT_STEP_SECONDS")
    started = time.monotonic()
    process = ph.start_train(workdir, tfds_dir, log, *OVERRIDES, script=FAULT_TRAIN, env=env)
    try:
      if kind == "anywhere":
        with contextlib.suppress(subprocess.TimeoutExpired):  # Or until it ends first.
          process.wait(timeout=rng.uniform(0.0, lifetime()))
      elif kind == "training":  # Once a step has run, within the next ~2 s.
        ph.wait_for(log, r"Setting work unit notes|\] \[\d+\] train/", process, timeout=600)
        time.sleep(rng.uniform(0.0, 2.0))
      elif kind == "save":
        held = ph.wait_for(log, r"^fault: finalizing (.*)/checkpoints/(\d+)$", process,
                           timeout=600)
        record["saving"] = int(held.group(2))
      elif kind == "sigterm":  # Once a step is logged (slowed steps: mid-run).
        ph.wait_for(log, r"\] \[\d+\] train/", process, timeout=600)
        process.send_signal(signal.SIGTERM)
        record["stopped"] = process.wait(timeout=120)
    except AssertionError:  # It exited before the moment aimed at.
      if process.returncode != 0:
        raise
    if "stopped" in record:
      pass
    elif kind == "end" or process.poll() is not None:
      status = process.wait(timeout=900)
      assert status == 0, f"run {i} ({kind}) failed ({status}):\n{ph.read(log)[-4000:]}"
      record["finished"] = True
    else:
      ph.kill9(process)
      record["killed"] = True
    if "saving" in record:  # The kill landed inside the save: its temporary is there.
      pending = [n for n in os.listdir(os.path.join(workdir, "checkpoints"))
                 if n.startswith(f"{record['saving']}.orbax-checkpoint-tmp")]
      assert pending and record["saving"] not in checkpoint_steps(workdir), pending
    record["batches"] = ph.read(batches).splitlines() if os.path.exists(batches) else []
    record["text"] = ph.read(log)
    record["checkpoints_after"] = checkpoint_steps(workdir)
    say(f"run {i}: {kind:8s} {time.monotonic() - started:5.1f} s, resumed from "
        f"{resumed_from(record['text']):2d}, {len(record['batches']):2d} batches, "
        f"checkpoints after: {record['checkpoints_after']}"
        + (f", killed inside the save of step {record['saving']}" if "saving" in record
           else ", killed" if "killed" in record
           else f", stopped ({record['stopped']})" if "stopped" in record else ", finished"))
    runs.append(record)
    if "finished" in record:
      break
  return runs


def resumed_from(text):
  found = re.findall(r"Resumed from step (\d+)\.", text)
  return int(found[-1]) if found else 0


def check(workdir, runs, reference):
  """The promises of this module's docstring; raises AssertionError naming the broken one."""
  final_state, reference_batches = reference[:2]
  assert "finished" in runs[-1] and all("killed" in r or "stopped" in r for r in runs[:-1])
  for i, run in enumerate(runs):
    expected = max(run["checkpoints_before"], default=0)
    assert resumed_from(run["text"]) == expected or (
        "killed" in run and "Resumed from step" not in run["text"]), (
            f"run {i} did not restore checkpoint {expected}:\n{run['text'][-3000:]}")
    if "finished" in run and expected:
      assert f"Resumed from step {expected}." in run["text"]
    if run["lock_before"] and "Parameters:" in run["text"]:  # It got past the lock.
      assert "Took over the lock of workdir" in run["text"], run["text"][-3000:]
  left = temporaries(workdir)
  assert not left, f"left behind: {left}"
  ph.assert_same_state(ph.restore_final(workdir), final_state)
  lineage = ph.batch_lineage([(resumed_from(r["text"]), r["batches"]) for r in runs])
  positions = [line.split()[:2] for line in lineage]
  assert len(lineage) == NUM_STEPS and len({tuple(p) for p in positions}) == NUM_STEPS
  assert lineage == reference_batches, "the surviving history trained on other batches"


def kill_plan(kills, rng):
  """`kills` kinds: at least one inside a save, one in training, one anywhere
  (as far as `kills` allows), the rest at random, in random order."""
  plan = list(KINDS[::-1][:kills]) + [rng.choice(KINDS) for _ in range(kills - len(KINDS))]
  rng.shuffle(plan)
  return plan


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--kills", type=int, default=20)
  parser.add_argument("--seed", type=int, default=None, help="Random seed (default: time).")
  parser.add_argument("--dir", default=None, help="Where to work (default: a new temp dir).")
  args = parser.parse_args(argv)
  seed = args.seed if args.seed is not None else time.time_ns() % 2**31
  rng = random.Random(seed)
  base = args.dir or tempfile.mkdtemp(prefix="chaos-")
  print(f"chaos: seed {seed}, {args.kills} kills, in {base}", flush=True)
  tfds_dir = os.path.join(base, "tfds")
  if not os.path.isdir(os.path.join(tfds_dir, "scan")):
    from transformer.data import scan  # pylint: disable=g-import-not-at-top
    scan.Scan(config="simple", data_dir=tfds_dir).download_and_prepare()
  reference = uninterrupted(tfds_dir, os.path.join(base, "reference"))()
  print(f"chaos: uninterrupted run: {reference[2]:.0f} s", flush=True)
  delivered, inside_saves, episode = [], 0, 0
  while len(delivered) < args.kills:  # A run that ends before its kill ends an episode.
    workdir = os.path.join(base, f"killed{episode}")
    plan = kill_plan(args.kills - len(delivered), rng)
    runs = run_with_kills(workdir, tfds_dir, plan, rng, lifetime=lambda: reference[2],
                          say=lambda s, e=episode: print(f"chaos: episode {e}: {s}", flush=True))
    check(workdir, runs, reference)
    delivered += [r["kind"] for r in runs if "killed" in r]
    inside_saves += sum("saving" in r for r in runs)
    print(f"chaos: episode {episode}: OK", flush=True)
    episode += 1
  print(f"chaos: OK: {len(delivered)} kills ("
        + ", ".join(f"{delivered.count(k)} {k}" for k in KINDS) + f"), {inside_saves} inside a "
        f"save, over {episode} episode(s); each ended bit for bit where the uninterrupted run "
        f"ends, trained on each batch once and left nothing behind (seed {seed})")


if __name__ == "__main__":
  sys.exit(main())
