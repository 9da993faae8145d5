"""Training against real faults, as real processes of train.py (through
tests/fault_train.py, which adds the test hooks): SIGTERM and SIGINT save and
stop, kill -9 at random moments (one inside a checkpoint save) loses nothing,
and a failing save stops with a message. Each run ends bit for bit where an
uninterrupted run of the same config ends, having trained on each batch once.

Each process costs seconds of start-up (imports, data), so the faults that one
workdir can go through one after another share its runs: `stopped_and_killed`
(a SIGTERM, then three kills, then a run to the end) and `decode_faults` (a
failed best save, a kill inside a best save, a SIGTERM during an evaluation,
then a run to the end); each test checks its own fault's part. Every run
evaluates on 20 sentences (chaos.OVERRIDES; the decoded ones are those 20).

The long version of the kill test: python -m tests.chaos --kills 20
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import chaos
from tests import process_helpers as ph

NUM_STEPS = 20  # tests/tiny_train_config.py: 20 steps, a checkpoint every 5.
FAULT_TRAIN = os.path.join("tests", "fault_train.py")


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  return ph.scan_tfds_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tfds_dir):
  """An uninterrupted run, started at once and waited for when first asked:
  () -> (its final checkpoint, its batch log's lines, its wall time, its workdir)."""
  wait = chaos.uninterrupted(tfds_dir, str(tmp_path_factory.mktemp("reference")))
  done = []
  return lambda: done[0] if done else done.append(wait()) or done[0]


def resumed_from(log_text):
  found = re.findall(r"Resumed from step (\d+)\.", log_text)
  return int(found[-1]) if found else 0


@pytest.fixture(scope="module")
def stopped_and_killed(tmp_path_factory, tfds_dir, reference):
  """One workdir through a SIGTERM once step 5 is logged (steps slowed), then
  three SIGKILLs, each followed by a restart: once a step has run (at a random
  moment in the next 2 s), inside a checkpoint save, and at a random moment
  from the start; then a run to the end (chaos.run_with_kills): (the workdir,
  the runs' records, the seed). CHAOS_SEED=N replays a seed."""
  seed = int(os.environ.get("CHAOS_SEED", time.time_ns() % 2**31))
  print(f"CHAOS_SEED={seed}")
  workdir = str(tmp_path_factory.mktemp("stopped_and_killed") / "w")
  runs = chaos.run_with_kills(workdir, tfds_dir, ["sigterm", "training", "save", "anywhere"],
                              random.Random(seed), lifetime=lambda: reference()[2])
  return workdir, runs, seed


def test_sigterm_saves_at_the_current_step_and_resumes_exactly(stopped_and_killed, reference):
  """SIGTERM once step 5 is logged: it saves the step in flight (not one of the
  every-5 checkpoints), the newest checkpoint, and exits 143 with one line; the
  restart resumes from it, and the workdir, resumed on through the kills of
  `stopped_and_killed`, ends bit for bit where the uninterrupted run ends,
  having trained on each of its batches once."""
  workdir, runs, _ = stopped_and_killed
  stop = runs[0]
  assert stop["kind"] == "sigterm" and stop.get("stopped") == 128 + signal.SIGTERM, (
      stop["text"][-4000:])
  stopped = re.search(r"train: stopped by SIGTERM after step (\d+), saved as checkpoint \1 in "
                      r".*; rerun the same command to resume", stop["text"])
  assert stopped, stop["text"][-4000:]
  step = int(stopped.group(1))
  assert 5 < step < NUM_STEPS and "Traceback" not in stop["text"]
  assert max(stop["checkpoints_after"]) == step  # The newest checkpoint is the stop's.
  assert resumed_from(runs[1]["text"]) == step
  chaos.check(workdir, runs, reference())


def test_sigterm_at_start_up_ends_at_once_in_one_line_and_unlocks_the_workdir(tmp_path,
                                                                              tfds_dir):
  """SIGTERM while train.py starts (the workdir locked, the hook sleeping 120 s
  before the data loads: a handler that only noted the signal would sleep on):
  it ends within seconds, status 143, with one line and no traceback; the LOCK
  is removed (it was left, for the next run to take over with a warning) and
  nothing else is left behind."""
  workdir, log = str(tmp_path / "w"), str(tmp_path / "log")
  process = ph.start_train(workdir, tfds_dir, log, *chaos.OVERRIDES, script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_START_SECONDS="120"))
  text = ph.sigterm_holding_lock(process, log, r"^fault: starting", workdir)
  assert text.rstrip().splitlines()[-1] == (
      "train: stopped by SIGTERM during start-up, before training began: nothing to save; "
      "rerun the same command to resume"), text[-4000:]
  assert "Traceback" not in text
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))
  assert not chaos.temporaries(workdir)  # The LOCK among them.


_STOPPED_AT_START_UP = ("cmd: stopped by SIGTERM during start-up, before training began: "
                        "nothing to save; rerun the same command to resume\n")


@pytest.mark.parametrize("how,status,stderr", [
    ("watched", 143, _STOPPED_AT_START_UP),
    ("handed over", -signal.SIGTERM, ""),  # The default action again.
    ("ignored", 0, ""),  # Started with SIGTERM ignored: it stays ignored.
    ("held", 143, _STOPPED_AT_START_UP),
])
def test_sigterm_at_start_up_until_it_is_handed_over(how, status, stderr):
  """sigterm's watch: a SIGTERM ends the command in one line, after the
  registered releases (a workdir lock's), or, sent inside a held() block, once
  the block has ended; hand_over gives SIGTERM its default action back; a
  SIGTERM the command was started ignoring is ignored."""
  script = (
      "import os, signal, sys, time\n"
      "from transformer import sigterm\n"
      f"how = {how!r}\n"
      "if how == 'ignored':\n"
      "  signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
      "sigterm.watch('cmd', sigterm.BEFORE_TRAINING)\n"
      "sigterm.release_first(lambda: print('released', flush=True))\n"
      "if how == 'handed over':\n"
      "  sigterm.hand_over()\n"
      "if how == 'held':\n"
      "  with sigterm.held():\n"
      "    os.kill(os.getpid(), signal.SIGTERM)\n"
      "    time.sleep(0.5)\n"
      "    print('the block ended', flush=True)\n"
      "os.kill(os.getpid(), signal.SIGTERM)\n"
      "time.sleep(0.5 if how == 'ignored' else 30)\n")
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        cwd=ph.ROOT, timeout=20)
  assert (done.returncode, done.stderr) == (status, stderr), done.stderr
  assert done.stdout == {"watched": "released\n",
                         "held": "the block ended\nreleased\n"}.get(how, "")


@pytest.mark.long
def test_sigterm_and_sigint_save_at_the_current_step_and_resume_exactly(
    tmp_path, tfds_dir, reference):
  """SIGTERM once step 5 is logged, a resume, SIGINT once step 10 is, a resume to
  the end."""
  _stop_and_resume(tmp_path, tfds_dir, reference, ((signal.SIGTERM, 5), (signal.SIGINT, 10)))


def _stop_and_resume(tmp_path, tfds_dir, reference, stops):  # For the long test above.
  """Each (signal, step) of `stops` sent once that step is logged, each stop
  resumed: each signal saves the step in flight (not one of the every-5
  checkpoints) and exits 128 + signal; the end is the uninterrupted run's."""
  workdir, batches = str(tmp_path / "w"), str(tmp_path / "batches")
  slow = ph.command_env(FAULT_BATCH_LOG=batches, FAULT_STEP_SECONDS="0.3")
  runs = []
  for sig, after in stops:
    log = str(tmp_path / f"{sig.name}.log")
    process = ph.start_train(workdir, tfds_dir, log, *chaos.OVERRIDES, script=FAULT_TRAIN,
                             env=slow)
    ph.wait_for(log, rf"\] \[{after}\] train/", process)
    process.send_signal(sig)
    assert process.wait(timeout=120) == 128 + sig, ph.read(log)[-4000:]
    text = ph.read(log)
    stopped = re.search(rf"train: stopped by {sig.name} after step (\d+), saved as checkpoint "
                        r"\1 in .*; rerun the same command to resume", text)
    assert stopped, text[-4000:]
    step = int(stopped.group(1))
    assert after < step < NUM_STEPS and "Traceback" not in text
    assert ph.restore_final(workdir)[2] == step  # The newest checkpoint is the stop's.
    done = len(ph.read(batches).splitlines()) - sum(len(r[1]) for r in runs)
    runs.append((resumed_from(text), ph.read(batches).splitlines()[-done:]))
  log = str(tmp_path / "end.log")
  process = ph.start_train(workdir, tfds_dir, log, *chaos.OVERRIDES, script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_BATCH_LOG=batches))
  assert process.wait(timeout=600) == 0, ph.read(log)[-4000:]
  assert resumed_from(ph.read(log)) == step
  lines = ph.read(batches).splitlines()
  runs.append((step, lines[sum(len(r[1]) for r in runs):]))
  ph.assert_same_state(ph.restore_final(workdir), reference()[0])
  assert ph.batch_lineage(runs) == reference()[1]


DECODE_RUN = ("--config.train.eval_every=10", "--config.train.decode_every=10",
              "--config.train.decode_examples=20")


@pytest.fixture(scope="module")
def decode_faults(tmp_path_factory, tfds_dir):
  """One workdir of 20 steps evaluated and decoded at 10 and 20 (DECODE_RUN),
  through four runs, each resuming from the newest checkpoint:
    0. the save of step 10's first best checkpoint fails (ENOSPC in its
       background write);
    1. a kill 2 s into the best save of step 10 (held there 4 s; 2 s is ample
       for an unslowed regular save of the tiny model's step 10);
    2. a SIGTERM while step 10 is evaluated (the evaluation slowed by 3 s);
    3. a run to the end.
  Runs 2 and 3 note their best saves in their logs, as the hook's `fault:
  finalizing` lines (the saves held 0.01 s; the best checkpoint kept at the end
  may be step 20's).
  Per run: a dict of its log's text, exit status, and what it left: the
  listings of checkpoints/ and checkpoints_best/ (names, sorted), and the
  temporaries (chaos.temporaries)."""
  base = tmp_path_factory.mktemp("decode_faults")
  workdir = str(base / "w")
  runs = []

  def run(env, then=None):
    log = str(base / f"{len(runs)}.log")
    process = ph.start_train(workdir, tfds_dir, log, *chaos.OVERRIDES, *DECODE_RUN,
                             script=FAULT_TRAIN, env=ph.command_env(**env))
    try:
      if then:
        then(log, process)
      status = process.wait(timeout=600)
    finally:
      if process.poll() is None:
        ph.kill9(process)
    listing = lambda name: sorted(os.listdir(os.path.join(workdir, name)))
    runs.append({"text": ph.read(log), "status": status,
                 "checkpoints": listing("checkpoints"),
                 "best": listing("checkpoints_best"), "left": chaos.temporaries(workdir)})

  def kill_in_best_save(log, process):
    ph.wait_for(log, r"fault: finalizing .*/checkpoints_best/10$", process)
    time.sleep(2)  # Ample for an unslowed regular save of the tiny model's step 10.
    ph.kill9(process)

  def sigterm_in_evaluation(log, process):
    ph.wait_for(log, r"^fault: evaluating", process)
    process.send_signal(signal.SIGTERM)

  run({"FAULT_SAVE_ERROR_STEP": "10"})
  run({"FAULT_SAVE_SECONDS": "4", "FAULT_SAVE_DIR": "checkpoints_best"}, kill_in_best_save)
  noted = {"FAULT_SAVE_SECONDS": "0.01", "FAULT_SAVE_DIR": "checkpoints_best"}
  run({"FAULT_EVAL_SECONDS": "3", **noted}, sigterm_in_evaluation)
  run(noted)
  return workdir, runs


def test_a_failed_best_save_stops_before_the_regular_save_of_its_step(decode_faults):
  """Step 10 decodes to a first 'best' checkpoint, whose save fails in the
  background. The regular save of step 10 waits for it (a resume must decode
  that step again where the best one is missing), so it is not started: the
  best checkpointer's error is the one line, and nothing is left behind (the
  regular checkpoint 5 is the newest)."""
  failed = decode_faults[1][0]
  assert failed["status"] == 1, failed["text"][-4000:]
  last = failed["text"].strip().splitlines()[-1]
  assert re.fullmatch(
      r"train: error: best checkpoint 10 could not be written to .*/checkpoints_best: "
      r"\[Errno 28\] No space left on device: .*\. Training stopped; there is no best "
      r"checkpoint yet, and a rerun resumes from the last regular checkpoint\.", last), last
  assert not failed["left"]
  assert (failed["checkpoints"], failed["best"]) == (["5"], [])


def test_a_kill_while_the_best_checkpoint_is_written_loses_no_best_one(decode_faults):
  """Step 10 decodes to a first best checkpoint and saves a regular one. A kill
  while the best one was still being written, after the regular one was
  complete, left no best checkpoint: the resume from step 10 does not decode it
  again (an audit's finding). The best one is now complete before the regular
  one starts, so the resume comes from step 5, and step 10 is decoded again to
  a best checkpoint 10, written to the end (by that resume, or where a stop
  at step 10 owes its decoding, as here, by the run after it)."""
  _, (_, killed, resumed, end) = decode_faults
  assert killed["status"] == -signal.SIGKILL, killed["text"][-4000:]
  assert killed["checkpoints"] == ["5"] and not [n for n in killed["best"] if n.isdigit()]
  assert "Resumed from step 5." in resumed["text"], resumed["text"][-4000:]
  assert any(re.search(r"^fault: finalizing .*/checkpoints_best/10$", run["text"], re.M)
             for run in (resumed, end)), end["text"][-4000:]
  assert end["status"] == 0, end["text"][-4000:]
  assert end["best"] and not end["left"]  # Step 10's, or step 20's where it decodes better.


def test_a_signal_during_evaluation_stops_at_that_step_and_owes_its_decoding(decode_faults,
                                                                           reference):
  """SIGTERM while step 10 is evaluated: the evaluation ends, its decoding is
  skipped and owed, and the checkpoint is step 10's. Training used to decode,
  then run step 11 first, longer than a preemption's grace may be (an audit's
  finding). The resume decodes step 10 and ends where an uninterrupted run ends."""
  workdir, (_, _, stopped, end) = decode_faults
  assert stopped["status"] == 128 + signal.SIGTERM, stopped["text"][-4000:]
  text = stopped["text"]
  assert re.search(r"train: stopped by SIGTERM after step 10, saved as checkpoint 10 ", text), (
      text[-4000:])
  assert "] [10] eval/" in text and "] [10] decode/" not in text, text[-4000:]
  assert stopped["checkpoints"] == ["10", "5"]
  text = end["text"]
  assert end["status"] == 0, text[-4000:]
  assert "Resumed from step 10; running its decode that the stop skipped" in text, text[-4000:]
  assert "] [10] decode/" in text and "] [10] eval/" not in text, text[-4000:]
  ph.assert_same_state(ph.restore_final(workdir), reference()[0])


def test_kill_9_at_random_moments_ends_where_an_uninterrupted_run_ends(stopped_and_killed,
                                                                      reference):
  """The kills of `stopped_and_killed` (after its SIGTERM): once a step has run,
  inside a checkpoint save, and at a random moment from the start; then a run
  to the end. chaos.check: the end is the uninterrupted run's bit for bit, each
  restart restored the newest complete checkpoint, each batch was trained on
  once, nothing is left behind. CHAOS_SEED=N replays a seed."""
  workdir, runs, seed = stopped_and_killed
  print(f"CHAOS_SEED={seed}")
  assert [r["kind"] for r in runs[:3]] == ["sigterm", "training", "save"]
  assert "killed" in runs[1] and "saving" in runs[2], "the kill did not land inside a save"
  chaos.check(workdir, runs, reference())


# ----------------------------------------------------------------------------
# Disk errors.

def test_a_failed_save_stops_training_keeps_the_last_good_one_and_is_the_error_reported(
    tmp_path, tfds_dir, reference):
  """The save of step 10 fails in Orbax's background write with ENOSPC (a full
  disk); step 12 decodes to a first best checkpoint, whose save fails too; the
  regular save of step 15 raises 10's failure. Training stops with one line
  naming the step, the reason and the last good checkpoint; that one (5)
  restores, equal to the uninterrupted run's step 5; nothing of the failed
  saves is left. The best checkpointer's failure at close took the place of the
  first failure in the one line, which then said nothing of checkpoint 10 (an
  audit's finding): the later one is logged."""
  workdir, log = str(tmp_path / "w"), str(tmp_path / "log")
  process = ph.start_train(workdir, tfds_dir, log, *chaos.OVERRIDES,
                           "--config.train.decode_every=12", "--config.train.decode_examples=20",
                           script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_SAVE_ERROR_STEP="10,12"))
  assert process.wait(timeout=600) == 1, ph.read(log)[-4000:]
  text = ph.read(log)
  last = text.strip().splitlines()[-1]
  assert re.fullmatch(
      r"train: error: checkpoint 10 could not be written to .*/checkpoints: \[Errno 28\] No "
      r"space left on device: .*\. Training stopped; the last good checkpoint is step 5, "
      r"which a rerun resumes from\.", last), last
  assert re.search(r"Also failed while closing: CheckpointSaveError: best checkpoint 12 could "
                   r"not be written", text), text[-4000:]
  assert "] [15] train/" in text  # Raised by step 15's regular save (not at step 12).
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["5"]
  assert not chaos.temporaries(workdir)
  ph.assert_same_state(ph.restore_final(workdir), ph.restore_final(reference()[3], 5))


def test_a_save_refused_at_once_names_the_step_and_the_last_good_one(tmp_path, monkeypatch):
  """The synchronous path: Orbax's save itself raises (permission denied); the
  message names the last good checkpoint, or that there is none."""
  import errno  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from transformer import checkpoints  # pylint: disable=g-import-not-at-top
  state = {"w": jnp.arange(4.0), "step": jnp.int32(1)}
  checkpointer = checkpoints.Checkpointer(str(tmp_path / "c"))
  checkpointer.save(1, state, {"index": 1})

  def refuse(*args, **kwargs):
    raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "c" / "2"))

  monkeypatch.setattr(checkpointer._manager, "save", refuse)  # pylint: disable=protected-access
  with pytest.raises(checkpoints.CheckpointSaveError,
                     match=r"checkpoint 2 could not be written to .*: \[Errno 13\] Permission "
                     r"denied.*last good checkpoint is step 1, which a rerun resumes from"):
    checkpointer.save(2, state, {"index": 2})
  checkpointer.close()  # Reported once, not again.
  first = checkpoints.Checkpointer(str(tmp_path / "first"))  # Nothing saved before it.
  monkeypatch.setattr(first._manager, "save", refuse)  # pylint: disable=protected-access
  with pytest.raises(checkpoints.CheckpointSaveError,
                     match=r"checkpoint 1 could not be written to .*: \[Errno 13\] Permission "
                     r"denied.*Training stopped; there is no earlier checkpoint\.$"):
    first.save(1, state, {"index": 1})
  first.close()
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restored, data_state, step = checkpoints.Checkpointer(str(tmp_path / "c"), read_only=True
                                                        ).restore(state, {"w": sharding,
                                                                          "step": sharding})
  assert step == 1 and data_state == {"index": 1}
  assert restored["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_sigterm_sent_twice_at_once_is_one_stop_request_a_later_one_or_sigint_acts():
  """A scheduler's SIGTERM to every process of a job reaches training twice when
  a sweep runs it (the sweep passes its own on): training stopped at once, without
  saving. Now a second SIGTERM within preemption.DUPLICATE_S is the same request;
  one after it, or a second SIGINT, goes to the handler before ours at once."""
  from transformer import preemption  # pylint: disable=g-import-not-at-top
  seen = []
  before = {s: signal.signal(s, lambda signum, frame: seen.append(signum))
            for s in preemption.SIGNALS}
  try:
    for second, pause, passed_on in ((signal.SIGTERM, 0.0, []),
                                     (signal.SIGTERM, preemption.DUPLICATE_S + 0.2,
                                      [signal.SIGTERM]),
                                     (signal.SIGINT, 0.0, [signal.SIGINT])):
      seen.clear()
      signals = preemption.StopSignals().install()
      first = signal.SIGINT if second == signal.SIGINT else signal.SIGTERM
      os.kill(os.getpid(), first)
      time.sleep(0.05)  # Python runs the handler between bytecodes of this thread.
      assert signals.received == first and signals.stop_after(1) and seen == []
      time.sleep(pause)
      os.kill(os.getpid(), second)
      time.sleep(0.05)
      assert seen == passed_on, (second, pause, seen)
      signals.restore()
  finally:
    for s, handler in before.items():
      signal.signal(s, handler)


def test_a_write_cut_off_by_a_file_size_limit_names_its_file(tmp_path):
  """A write's EFBIG (a file size limit) or ENOSPC (a full disk) comes without a
  file name: the one-line error of train, evaluate or translate said only
  '[Errno 27] File too large'. Atomic writes and streamed outputs now name the
  file; the limit is set in a process of its own."""
  targets = [str(tmp_path / "config.json"), str(tmp_path / "out.txt")]
  script = (
      "import resource, sys\n"
      "from transformer import files\n"
      "resource.setrlimit(resource.RLIMIT_FSIZE,\n"
      "                   (2048, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
      f"atomic, streamed = {targets!r}\n"
      "for write in (lambda: files.write_atomic(atomic, 'x' * 4096),\n"
      "              lambda: files.write_lines(open(streamed, 'w'), ['y' * 4096])):\n"
      "  try:\n"
      "    write()\n"
      "  except OSError as e:\n"
      "    print(e)\n")
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        cwd=ph.ROOT, timeout=120)
  assert done.stdout.splitlines() == [f"[Errno 27] File too large: {t!r}" for t in targets], (
      done.stdout + done.stderr)
  assert not os.path.exists(targets[0])  # No half-written config.json.
