"""Training against real faults, as real processes of train.py (through
tests/fault_train.py, which adds the test hooks): SIGTERM and SIGINT save and
stop, kill -9 at random moments (one inside a checkpoint save) loses nothing,
and a failing save stops with a message. Each run ends bit for bit where an
uninterrupted run of the same config ends, having trained on each batch once.

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


def test_sigterm_saves_at_the_current_step_and_resumes_exactly(tmp_path, tfds_dir, reference):
  """SIGTERM once step 5 is logged, then a resume to the end."""
  _stop_and_resume(tmp_path, tfds_dir, reference, ((signal.SIGTERM, 5),))


@pytest.mark.long
def test_sigterm_and_sigint_save_at_the_current_step_and_resume_exactly(
    tmp_path, tfds_dir, reference):
  """SIGTERM once step 5 is logged, a resume, SIGINT once step 10 is, a resume to
  the end."""
  _stop_and_resume(tmp_path, tfds_dir, reference, ((signal.SIGTERM, 5), (signal.SIGINT, 10)))


def _stop_and_resume(tmp_path, tfds_dir, reference, stops):
  """Each (signal, step) of `stops` sent once that step is logged, each stop
  resumed: each signal saves the step in flight (not one of the every-5
  checkpoints) and exits 128 + signal; the end is the uninterrupted run's."""
  workdir, batches = str(tmp_path / "w"), str(tmp_path / "batches")
  slow = ph.command_env(FAULT_BATCH_LOG=batches, FAULT_STEP_SECONDS="0.3")
  runs = []
  for sig, after in stops:
    log = str(tmp_path / f"{sig.name}.log")
    process = ph.start_train(workdir, tfds_dir, log, script=FAULT_TRAIN, env=slow)
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
  process = ph.start_train(workdir, tfds_dir, log, script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_BATCH_LOG=batches))
  assert process.wait(timeout=600) == 0, ph.read(log)[-4000:]
  assert resumed_from(ph.read(log)) == step
  lines = ph.read(batches).splitlines()
  runs.append((step, lines[sum(len(r[1]) for r in runs):]))
  ph.assert_same_state(ph.restore_final(workdir), reference()[0])
  assert ph.batch_lineage(runs) == reference()[1]


def test_a_signal_during_evaluation_stops_at_that_step_and_owes_its_decoding(
    tmp_path, tfds_dir, reference):
  """SIGTERM while step 10 is evaluated: the evaluation ends, its decoding is
  skipped and owed, and the checkpoint is step 10's. Training used to decode,
  then run step 11 first, longer than a preemption's grace may be (an audit's
  finding). The resume decodes step 10 and ends where an uninterrupted run ends."""
  workdir, log, log2 = str(tmp_path / "w"), str(tmp_path / "log"), str(tmp_path / "log2")
  run = ("--config.train.eval_every=10", "--config.train.decode_every=10",
         "--config.train.decode_examples=20")
  process = ph.start_train(workdir, tfds_dir, log, *run, script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_EVAL_SECONDS="3"))
  ph.wait_for(log, r"^fault: evaluating", process)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=120) == 128 + signal.SIGTERM, ph.read(log)[-4000:]
  text = ph.read(log)
  assert re.search(r"train: stopped by SIGTERM after step 10, saved as checkpoint 10 ", text), (
      text[-4000:])
  assert "] [10] eval/" in text and "] [10] decode/" not in text, text[-4000:]
  process = ph.start_train(workdir, tfds_dir, log2, *run, script=FAULT_TRAIN)
  assert process.wait(timeout=600) == 0, ph.read(log2)[-4000:]
  text = ph.read(log2)
  assert "Resumed from step 10; running its decode that the stop skipped" in text, text[-4000:]
  assert "] [10] decode/" in text and "] [10] eval/" not in text, text[-4000:]
  ph.assert_same_state(ph.restore_final(workdir), reference()[0])


def test_kill_9_at_random_moments_ends_where_an_uninterrupted_run_ends(tmp_path, tfds_dir,
                                                                      reference):
  """Three SIGKILLs, each followed by a restart: once a step has run (at a random
  moment in the next 2 s), inside a checkpoint save, and at a random moment from
  the start; then a run to the end. chaos.check: the end is the uninterrupted
  run's bit for bit, each restart restored the newest complete checkpoint, each
  batch was trained on once, nothing is left behind. CHAOS_SEED=N replays a seed."""
  seed = int(os.environ.get("CHAOS_SEED", time.time_ns() % 2**31))
  print(f"CHAOS_SEED={seed}")
  workdir = str(tmp_path / "w")
  runs = chaos.run_with_kills(workdir, tfds_dir, ["training", "save", "anywhere"],
                              random.Random(seed), lifetime=lambda: reference()[2])
  assert "saving" in runs[1], "the second kill did not land inside a save"
  chaos.check(workdir, runs, reference())


def test_a_kill_while_the_best_checkpoint_is_written_loses_no_best_one(tmp_path, tfds_dir):
  """Step 10 decodes to a first best checkpoint and saves a regular one. A kill
  while the best one was still being written, after the regular one was
  complete, left no best checkpoint: the resume from step 10 does not decode it
  again (an audit's finding). The best one is now complete before the regular
  one starts, so the resume comes from step 5 and writes it."""
  workdir, log = str(tmp_path / "w"), str(tmp_path / "log")
  run = ("--config.train.num_steps=10", "--config.train.checkpoint_every=5",
         "--config.train.decode_every=10", "--config.train.decode_examples=20")
  process = ph.start_train(workdir, tfds_dir, log, *run, script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_SAVE_SECONDS="4",
                                              FAULT_SAVE_DIR="checkpoints_best"))
  ph.wait_for(log, r"fault: finalizing .*/checkpoints_best/10$", process)
  time.sleep(2)  # Ample for an unslowed regular save of the tiny model's step 10.
  ph.kill9(process)
  resumed = ph.start_train(workdir, tfds_dir, str(tmp_path / "log2"), *run)
  assert resumed.wait(timeout=600) == 0, ph.read(str(tmp_path / "log2"))[-4000:]
  assert "10" in os.listdir(os.path.join(workdir, "checkpoints_best"))


# ----------------------------------------------------------------------------
# Disk errors.

def test_a_failed_save_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, tfds_dir,
                                                                       reference):
  """The save of step 10 fails in Orbax's background write with ENOSPC (a full
  disk): training stops with one line naming the step, the reason and the last
  good checkpoint; that one (5) restores, equal to the uninterrupted run's step
  5; nothing of the failed save is left."""
  workdir, log = str(tmp_path / "w"), str(tmp_path / "log")
  process = ph.start_train(workdir, tfds_dir, log, script=FAULT_TRAIN,
                           env=ph.command_env(FAULT_SAVE_ERROR_STEP="10"))
  assert process.wait(timeout=600) == 1, ph.read(log)[-4000:]
  last = ph.read(log).strip().splitlines()[-1]
  assert re.fullmatch(
      r"train: error: checkpoint 10 could not be written to .*/checkpoints: \[Errno 28\] No "
      r"space left on device: .*\. Training stopped; the last good checkpoint is step 5, "
      r"which a rerun resumes from\.", last), last
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["5"]
  assert not chaos.temporaries(workdir)
  ph.assert_same_state(ph.restore_final(workdir), ph.restore_final(reference()[3], 5))


def test_a_failed_best_save_stops_before_the_regular_save_of_its_step(tmp_path, tfds_dir):
  """Step 5 is the last, decoded to a first 'best' checkpoint, whose save fails
  in the background. The regular save of step 5 waits for it (a resume must
  decode that step again where the best one is missing), so it is not started:
  the best checkpointer's error is the one line, and nothing is left behind."""
  workdir, log = str(tmp_path / "w"), str(tmp_path / "log")
  process = ph.start_train(workdir, tfds_dir, log, "--config.train.num_steps=5",
                           "--config.train.decode_every=5", "--config.train.decode_examples=20",
                           script=FAULT_TRAIN, env=ph.command_env(FAULT_SAVE_ERROR_STEP="5"))
  assert process.wait(timeout=600) == 1, ph.read(log)[-4000:]
  last = ph.read(log).strip().splitlines()[-1]
  assert re.fullmatch(
      r"train: error: best checkpoint 5 could not be written to .*/checkpoints_best: "
      r"\[Errno 28\] No space left on device: .*\. Training stopped; there is no best "
      r"checkpoint yet, and a rerun resumes from the last regular checkpoint\.", last), last
  assert not chaos.temporaries(workdir)
  assert not os.listdir(os.path.join(workdir, "checkpoints_best"))
  assert not os.listdir(os.path.join(workdir, "checkpoints"))


def test_a_failed_save_is_the_error_reported_not_a_later_one_at_close(tmp_path, tfds_dir):
  """Checkpoint 5 fails in the background; at step 10 the best checkpoint's
  save fails too, and the regular save of 10 raises 5's failure. The best
  checkpointer's failure at close took its place in the one line, which then
  said nothing of checkpoint 5 (an audit's finding): the first failure is the
  line, the later one logged."""
  workdir, log = str(tmp_path / "w"), str(tmp_path / "log")
  process = ph.start_train(workdir, tfds_dir, log, "--config.train.num_steps=10",
                           "--config.train.checkpoint_every=5",
                           "--config.train.decode_every=10", "--config.train.decode_examples=20",
                           script=FAULT_TRAIN, env=ph.command_env(FAULT_SAVE_ERROR_STEP="5,10"))
  assert process.wait(timeout=600) == 1, ph.read(log)[-4000:]
  text = ph.read(log)
  last = text.strip().splitlines()[-1]
  assert re.fullmatch(
      r"train: error: checkpoint 5 could not be written to .*/checkpoints: \[Errno 28\] No "
      r"space left on device: .*\. Training stopped; there is no earlier checkpoint\.", last), last
  assert re.search(r"Also failed while closing: CheckpointSaveError: best checkpoint 10 could "
                   r"not be written", text)
  assert not chaos.temporaries(workdir)


def test_a_save_refused_at_once_names_the_step_and_the_last_good_one(tmp_path, monkeypatch):
  """The synchronous path: Orbax's save itself raises (permission denied)."""
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
