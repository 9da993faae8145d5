"""Tests for transformer/checkpoints.py: the array checksums, and the Checkpointer
on a tiny state (unreadable checkpoints set aside, the best checkpoints). The
save/restore paths are tested end to end in test_training.py, test_faults.py
and test_workdir.py."""

import asyncio
import gc
import glob
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import checkpoint_reads, checkpoints, checksums, event_loops, runtime


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int32, np.uint32, np.int8,
                                   np.bool_])
def test_any_flipped_bit_or_swapped_pair_changes_the_checksum(dtype):
  rng = np.random.default_rng(0)
  x = (rng.random((3, 5)) > 0.5 if dtype == np.bool_
       else (rng.standard_normal((3, 5)) * 50).astype(dtype))
  words = x.view(np.uint8).copy() if dtype != np.bool_ else x.astype(np.uint8)
  base = checksums.fingerprints({"x": x})
  assert base == checksums.fingerprints({"x": x.copy()}) and list(base) == ["['x']"]
  bits = range(1) if dtype == np.bool_ else range(8)
  for i in range(words.size):
    for bit in bits:
      flipped = words.copy()
      flipped.reshape(-1)[i] ^= 1 << bit
      y = flipped.astype(bool) if dtype == np.bool_ else flipped.view(x.dtype)
      assert checksums.fingerprints({"x": y}) != base, (i, bit)
  swapped = x.copy().reshape(-1)
  j = next(j for j in range(1, swapped.size) if swapped[j] != swapped[0])
  swapped[[0, j]] = swapped[[j, 0]]
  assert checksums.fingerprints({"x": swapped.reshape(x.shape)}) != base


def test_checksums_name_every_leaf_by_its_path():
  tree = {"params": {"w": np.ones((2, 2), np.float32)}, "step": np.int32(3)}
  assert sorted(checksums.fingerprints(tree)) == ["['params']['w']", "['step']"]


def test_swapped_values_and_two_flipped_signs_change_the_checksum():
  """Algorithm 1's terms were linear in the words: these swaps and sign flips
  cancelled out in it."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal(1000).astype(np.float32)
  y = x.copy()
  y[[17, 802]] = -y[[17, 802]]
  pairs = [([1.0, -1.0, 3.0, 0.25], [-1.0, 1.0, 3.0, 0.25]),
           ([0.5, 2.0, -0.5], [-0.5, 2.0, 0.5]), (x, y)]
  for a, b in pairs:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert checksums.fingerprints({"x": a}, 1) == checksums.fingerprints({"x": b}, 1)
    assert checksums.fingerprints({"x": a}) != checksums.fingerprints({"x": b})


# ----------------------------------------------------------------------------
# Checkpointer on a tiny state: {"w": [4] float32, "step": int32}.

def _state(value):
  return {"w": jnp.full((4,), float(value)), "step": jnp.int32(value)}


def _restore(directory, step=None, like=None, **kwargs):
  """Restores a state of the tree of `like` (default _state's)."""
  like = _state(0) if like is None else like
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return checkpoints.Checkpointer(str(directory), **kwargs).restore(
      like, jax.tree.map(lambda _: sharding, like), step)


def _saved(directory, steps, **kwargs):
  checkpointer = checkpoints.Checkpointer(str(directory), **kwargs)
  for step in steps:
    checkpointer.save(step, _state(step), {"index": step})
  checkpointer.close()


def test_a_checkpoint_of_the_first_checksum_algorithm_still_verifies(tmp_path, monkeypatch):
  """Checkpoints written before algorithm 2 carry algorithm 1's checksums and
  no algorithm: they verify with algorithm 1, which still catches a change."""
  compute = checksums.compute

  def first_algorithm(state, data_state):
    old = compute(state, data_state, 1)
    del old["algorithm"]
    return old

  with monkeypatch.context() as m:
    m.setattr(checksums, "compute", first_algorithm)
    _saved(tmp_path / "c", [1])
  saved = tmp_path / "c" / "1" / "checksums" / "metadata"
  record = json.loads(saved.read_text())
  assert "algorithm" not in record
  assert _restore(tmp_path / "c", 1, read_only=True)[2] == 1
  record["state"]["['w']"] ^= 1  # As if the array had changed.
  saved.write_text(json.dumps(record))
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"checkpoint 1 .* checksum mismatch in \['w'\]"):
    _restore(tmp_path / "c", 1, read_only=True)


def test_a_step_unreadable_twice_is_set_aside_under_a_new_name(tmp_path):
  """Step 20 damaged, set aside, saved again and damaged again: the second goes
  to 20.unreadable.1, and step 15 restores both times."""
  directory = tmp_path / "c"
  _saved(directory, [10, 15, 20])
  for aside in (["20.unreadable"], ["20.unreadable", "20.unreadable.1"]):
    shutil.rmtree(directory / "20" / "state")
    assert _restore(directory)[2] == 15
    assert sorted(os.listdir(directory)) == ["10", "15"] + aside
    _saved(directory, [20])


def test_a_failed_set_aside_is_not_blamed_on_the_older_checkpoints(tmp_path, monkeypatch):
  directory = tmp_path / "c"
  _saved(directory, [10, 20])
  shutil.rmtree(directory / "20" / "state")

  def refuse(src, dst):
    raise PermissionError(13, "Permission denied", src)

  monkeypatch.setattr(checkpoints.os, "rename", refuse)
  with pytest.raises(runtime.CommandError) as raised:
    _restore(directory)
  message = str(raised.value)
  assert re.fullmatch(r"checkpoint 20 in .* is unreadable and could not be moved aside: "
                      r"\[Errno 13\] Permission denied: .*\. Move it out of that directory and "
                      r"rerun \(an older checkpoint restores\)\.", message), message


def test_only_process_0_sets_unreadable_checkpoints_aside(tmp_path, monkeypatch):
  """Every process of a job restores; the renames are process 0's (a second
  rename of the same directory would fail)."""
  directory = tmp_path / "c"
  _saved(directory, [10, 20])
  shutil.rmtree(directory / "20" / "state")
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  assert _restore(directory)[2] == 10
  assert sorted(os.listdir(directory)) == ["10", "20"]


def _best(directory):
  return checkpoints.Checkpointer(str(directory), keep=1, best_metric="bleu")


def _save_best(directory, step, bleu):
  best = _best(directory)
  best.save(step, _state(step * 100 + bleu), {"index": step}, metrics={"bleu": bleu})
  best.close()


@pytest.mark.parametrize("step", [12, 15])
def test_a_better_result_replaces_the_best_checkpoint_at_an_earlier_or_the_same_step(
    tmp_path, step):
  """After a resume from before the kept best (step 15), a better decode at an
  earlier or the same step replaces it (Orbax alone skips both)."""
  _save_best(tmp_path / "b", 15, 1)
  _save_best(tmp_path / "b", step, 2)
  assert os.listdir(tmp_path / "b") == [str(step)]
  assert _best(tmp_path / "b").best_value("bleu") == 2
  assert float(_restore(tmp_path / "b", read_only=True)[0]["w"][0]) == step * 100 + 2


def test_a_failed_replacement_of_the_best_checkpoint_keeps_the_old_one(tmp_path, monkeypatch):
  """The same step saved again fails: the kept one is put back, and the message
  names it and where a rerun resumes from. A run killed while replacing it
  leaves it moved aside: the next writer puts it back."""
  _save_best(tmp_path / "b", 15, 1)
  best = _best(tmp_path / "b")

  def refuse(*args, **kwargs):
    raise PermissionError(13, "Permission denied", str(tmp_path / "b" / "15"))

  monkeypatch.setattr(best._manager, "save", refuse)  # pylint: disable=protected-access
  with pytest.raises(checkpoints.CheckpointSaveError,
                     match=r"^best checkpoint 15 could not be written to .*/b: \[Errno 13\] "
                     r"Permission denied: .*\. Training stopped; the best checkpoint kept is step "
                     r"15, and a rerun resumes from the last regular checkpoint\.$"):
    best.save(15, _state(1502), {"index": 15}, metrics={"bleu": 2})
  best.close()
  assert os.listdir(tmp_path / "b") == ["15"]
  assert _best(tmp_path / "b").best_value("bleu") == 1
  os.rename(tmp_path / "b" / "15", tmp_path / "b" / "15.replaced")  # Killed there.
  assert _best(tmp_path / "b").best_value("bleu") == 1
  assert os.listdir(tmp_path / "b") == ["15"]


def test_a_best_checkpoint_with_damaged_metrics_is_set_aside_with_a_warning(tmp_path, caplog):
  """Orbax reads every step's metrics when it opens the directory: an empty
  metrics file stopped every resume with a JSONDecodeError. A reader (evaluate
  --checkpoint best) does not need them."""
  _save_best(tmp_path / "b", 5, 1)
  (tmp_path / "b" / "5" / "metrics" / "metrics").write_text("")
  assert _restore(tmp_path / "b", read_only=True)[2] == 5
  with caplog.at_level(logging.WARNING):
    best = _best(tmp_path / "b")
  assert re.search(r"Best checkpoint 5 in .*/b has unreadable metrics \(JSONDecodeError: "
                   r"Expecting value.*\); moved it to .*/b/5\.unreadable\.", caplog.text)
  assert best.best_value("bleu") is None and best.steps() == []
  best.save(10, _state(10), {"index": 10}, metrics={"bleu": 0.5})
  best.close()
  assert sorted(os.listdir(tmp_path / "b")) == ["10", "5.unreadable"]


def test_the_best_value_right_after_a_save_is_the_saved_one(tmp_path, monkeypatch):
  """Two decodes close together: the second asks for the best value while the
  first's save is still being written, whose metrics file does not exist yet."""
  best = _best(tmp_path / "b")
  manager = best._manager  # pylint: disable=protected-access
  finished, metrics, wait = [], manager.metrics, manager.wait_until_finished
  monkeypatch.setattr(manager, "wait_until_finished", lambda: (wait(), finished.append(1)))
  monkeypatch.setattr(manager, "metrics", lambda step: metrics(step) if finished else None)
  best.save(5, _state(5), {"index": 5}, metrics={"bleu": 1.5})
  finished.clear()  # What save itself waited for was the save before.
  assert best.best_value("bleu") == 1.5
  best.close()



def test_readers_take_the_best_checkpoint_by_its_value_not_its_step(tmp_path):
  """A better result may sit at an earlier step (after a resume from before the
  kept best); a run killed before Orbax removed the worse one leaves both."""
  _save_best(tmp_path / "b", 15, 1)
  _save_best(tmp_path / "c", 12, 2)
  shutil.copytree(tmp_path / "c" / "12", tmp_path / "b" / "12")
  assert _restore(tmp_path / "b", read_only=True, best_metric="bleu")[2] == 12
  assert _restore(tmp_path / "b", read_only=True)[2] == 15  # By step alone.


def test_a_checkpoint_of_a_newer_checksum_algorithm_is_named_not_set_aside(tmp_path):
  directory = tmp_path / "c"
  _saved(directory, [10, 20])
  saved = directory / "20" / "checksums" / "metadata"
  saved.write_text(json.dumps({**json.loads(saved.read_text()), "algorithm": 3}))
  with pytest.raises(checkpoints.NewerCheckpointError,
                     match=r"checkpoint 20 in .*: its checksums are of algorithm 3, and this "
                     r"code knows algorithms 1 to 2: it was written by a newer version"):
    _restore(directory)
  assert sorted(os.listdir(directory)) == ["10", "20"]


def _arrays(count, rows=64):
  """`count` random [rows, 32] float32 arrays w0, w1, ...: 8 KB each at least,
  beyond what OCDBT keeps inline in its index, so each is in a data file."""
  keys = jax.random.split(jax.random.key(0), count)
  return {f"w{i}": jax.random.normal(key, (rows, 32)) for i, key in enumerate(keys)}


def _truncated(directory, state, keep=0.99) -> int:
  """Saves `state` as step 1 and truncates its largest data file to `keep` of
  its length, as a disk that filled up or a copy cut short leaves it: the
  arrays written last in it are cut. Returns the length left."""
  checkpointer = checkpoints.Checkpointer(str(directory))
  checkpointer.save(1, state, {"index": 1})
  checkpointer.close()
  data = max(glob.glob(str(directory / "1" / "state" / "ocdbt.process_0" / "d" / "*")),
             key=os.path.getsize)
  size = int(os.path.getsize(data) * keep)
  os.truncate(data, size)
  return size


def test_a_truncated_data_file_is_named_with_the_array_and_what_is_wrong(tmp_path):
  """The reason was Orbax's wrapper cut at 200 characters: an array index and
  the repr of a bound method, naming neither the array nor the problem."""
  size = _truncated(tmp_path / "c", _arrays(4), keep=0.5)
  with pytest.raises(checkpoints.UnreadableCheckpointError) as raised:
    _restore(tmp_path / "c", 1, like=_arrays(4), read_only=True)
  message = str(raised.value)
  assert re.fullmatch(r"checkpoint 1 in .*/c is unreadable \(damaged or incomplete files\): "
                      r".*\"w[0-3]/0\.0\" .*/c/1/state/.*is not valid for value of size "
                      + str(size), message), message



def test_a_missing_index_is_named_without_tensorstore_s_spec(tmp_path):
  """TensorStore appends the array's whole spec (JSON, over 1000 characters) to
  its message; the cut at 200 characters left the problem unsaid."""
  _saved(tmp_path / "c", [1])
  os.remove(tmp_path / "c" / "1" / "state" / "manifest.ocdbt")
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"unreadable \(damaged or incomplete files\): .*Metadata at "
                     r"\"(w|step)/\.zarray\" in OCDBT database at local file \".*/c/1/state/\" "
                     r"does not exist$"):
    _restore(tmp_path / "c", 1, read_only=True)

# Ten restores of 16 arrays of 1 MB: a read of the cut array fails while most of
# the others are still being read, in about 3 restores of 4 before the fix.
_RESTORE_TRUNCATED = """
import sys
from tests.test_checkpoints import _arrays, _restore
for _ in range(10):
  try:
    _restore(sys.argv[1], 1, like=_arrays(16, 8192), read_only=True)
  except Exception as e:
    print(type(e).__name__, "is not valid for value of size" in str(e))
"""


def test_a_failed_read_lets_the_reads_beside_it_end_before_the_process_does(tmp_path):
  """Orbax closed its event loop at the first failed read while the other
  reads went on; each, when done, met the closed loop, and the process printed
  tracebacks of `RuntimeError: Event loop is closed` after the error (about a
  hundred in these ten restores; a few, in some runs only, in one restore of a
  small model)."""
  _truncated(tmp_path / "c", _arrays(16, 8192))
  result = subprocess.run([sys.executable, "-c", _RESTORE_TRUNCATED, str(tmp_path / "c")],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == "UnreadableCheckpointError True\n" * 10, result.stdout
  for noise in ("Event loop is closed", "Exception ignored", "Traceback"):
    assert noise not in result.stderr, result.stderr[-3000:]


# Four saves of 16 arrays of 1 MB that fail at step 2, reported at the next
# save or at close: the write of w3 fails (ENOSPC) while the other arrays are
# being written, then the JSON items' (the checksums 0.2 s later, the data 1 s
# later). Each prints the error, how many of the other 15 writes had ended when
# it was reported and the checkpointer closed, and what is left.
_SAVE_FAILING = """
import asyncio, errno, os, sys
import orbax.checkpoint as ocp
from orbax.checkpoint._src.serialization import serialization
from tests.test_checkpoints import _arrays
from transformer import checkpoints

write, ended = serialization.async_serialize_from_host, []
save_json = ocp.JsonCheckpointHandler._save_fn

async def failing(value, spec, *args, **kwargs):
  if "/2.orbax-checkpoint-tmp/" not in str(spec):
    return await write(value, spec, *args, **kwargs)
  if spec["kvstore"]["path"] == "w3":
    await asyncio.sleep(0)  # The others' writes have started.
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "w3")
  try:
    return await write(value, spec, *args, **kwargs)
  finally:
    ended.append(spec["kvstore"]["path"])

async def failing_json(self, x, directory):
  if "/2.orbax-checkpoint-tmp/" not in str(directory):
    return await save_json(self, x, directory)
  item = os.path.basename(str(directory)).split(".")[0]
  await asyncio.sleep({"checksums": 0.2, "data": 1}[item])
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), item)

serialization.async_serialize_from_host = failing
ocp.JsonCheckpointHandler._save_fn = failing_json
state = _arrays(16, 8192)
for run, at_close in enumerate([False, True] * 2):
  ended.clear()
  directory = os.path.join(sys.argv[1], str(run))
  checkpointer = checkpoints.Checkpointer(directory)
  checkpointer.save(1, state, {"index": 1})
  try:
    checkpointer.save(2, state, {"index": 2})
    if at_close:
      checkpointer.close()
    else:
      checkpointer.save(3, state, {"index": 3})
  except checkpoints.CheckpointSaveError as e:
    if not at_close:
      checkpointer.close()
    print(f"{'close' if at_close else 'next save'}: {e} ended {len(ended)} "
          f"left {sorted(os.listdir(directory))}")
"""


def test_a_failed_write_lets_the_writes_beside_it_end_before_the_error(tmp_path):
  """Orbax writes a save's arrays as tasks of one event loop, in a thread of
  its own, and closed it at the first failed write while the others went on:
  each, when done, met the closed loop, and the process printed tracebacks of
  `RuntimeError: Event loop is closed` (and at exit `Task exception was never
  retrieved`, after the error), and the abandoned writes went on while close()
  removed the failed save's directory. And close() waited for Orbax's threads
  with their own join, which raises the thread's error: a later failure (here
  the data item's) came out of close() in place of the CheckpointSaveError, and
  what the save had written was left."""
  result = subprocess.run([sys.executable, "-c", _SAVE_FAILING, str(tmp_path)],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert [line.split(":")[0] for line in lines] == ["next save", "close"] * 2, (
      result.stdout + result.stderr[-3000:])
  for line in lines:
    assert re.fullmatch(
        r"(next save|close): checkpoint 2 could not be written to .*: \[Errno 28\] No space "
        r"left on device: '(w3|checksums|data)'\. Training stopped; the last good checkpoint is "
        r"step 1, which a rerun resumes from\. ended 15 left \['1'\]", line), line
  for noise in ("Event loop is closed", "Exception ignored", "never retrieved"):
    assert noise not in result.stderr, result.stderr[-3000:]


# A save whose step directory cannot be made (as in a directory made read-only).
_SAVE_UNMAKEABLE = """
import os, sys, time
import jax.numpy as jnp
from transformer import checkpoints
c = checkpoints.Checkpointer(sys.argv[1])
makedirs = os.makedirs
def refused(path, *args, **kwargs):
  if "orbax-checkpoint-tmp" in str(path):
    raise PermissionError(1, "Operation not permitted", str(path))
  return makedirs(path, *args, **kwargs)
os.makedirs = refused
start = time.time()
try:
  c.save(1, {"w": jnp.ones(3)}, {"position": 1})
  c.close()
except checkpoints.CheckpointSaveError as e:
  print(str(e).split(":")[0], time.time() - start < 60)
"""


def test_a_file_where_checkpoints_go_is_named_before_training(tmp_path):
  """A file at `checkpoints` (or `checkpoints_best`): Orbax failed to make the
  directory in a background thread, logged a traceback, and training ran on to
  its first save, whose error came only then."""
  (tmp_path / "checkpoints").write_text("x")
  with pytest.raises(NotADirectoryError, match=r"not a directory, where checkpoints are "
                     r"saved; move it away: '.*checkpoints'"):
    checkpoints.Checkpointer(str(tmp_path / "checkpoints"))
  with pytest.raises(NotADirectoryError, match="Not a directory"):  # A folder under the file.
    checkpoints.Checkpointer(str(tmp_path / "checkpoints" / "best"), best_metric="bleu")
  assert (tmp_path / "checkpoints").read_text() == "x"


def test_a_step_directory_that_cannot_be_made_is_reported_at_once(tmp_path):
  """Orbax made a step's directory in a background thread; where that failed (an
  unwritable checkpoints directory), the writer threads waited 300 s for its
  signal: the error came after 3 minutes, the process ended 2 minutes later."""
  result = subprocess.run([sys.executable, "-c", _SAVE_UNMAKEABLE, str(tmp_path)],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == f"checkpoint 1 could not be written to {tmp_path} True\n", (
      result.stdout + result.stderr[-3000:])


def test_a_closed_loop_lets_its_tasks_end_and_takes_their_errors_as_seen():
  """Orbax closes an event loop as soon as one task of a gather fails (a read
  or a write): the others end first, and their errors count as seen. One that
  failed in the loop's last step (3 steps after the first here) had its
  gather's callback dropped, and was logged when collected, after the one-line
  error: `Task exception was never retrieved` (train.py on a full disk, 1 run
  in 16)."""

  async def fail(steps):
    for _ in range(steps):
      await asyncio.sleep(0)
    raise ValueError(steps)

  async def siblings(steps):
    await asyncio.gather(*(fail(n) for n in steps))

  seen = {}  # Each loop's logged messages; a task dropped unretrieved logs when collected.
  for steps in [(0, n) for n in range(8)] + [(0, n, n + 50) for n in range(8)]:
    loop, seen[steps] = event_loops.FinishingLoop(), []
    loop.set_exception_handler(lambda _, context, log=seen[steps]: log.append(context["message"]))
    with pytest.raises(ValueError):
      loop.run_until_complete(siblings(steps))
    loop.close()
    assert not asyncio.all_tasks(loop)
  gc.collect()  # Once for all the loops: a collection takes a second in a test worker.
  assert not any(seen.values()), seen


def test_a_tree_mismatch_names_the_arrays_each_side_lacks():
  """Orbax lists a tree mismatch's differences on lines after its first: the
  one-line reason keeps them (the model's parameters first), and any process's
  is a MismatchedCheckpointError in all."""
  text = ("User-provided restore item and on-disk value metadata tree structures do not "
          "match:\nopt_state[0][0].mu.decoder.layer_2:\n    - Source: MISSING\n"
          "    - Target: {'kernel': 1}\n\nparams.decoder.layer_2:\n    - Source: MISSING\n"
          "    - Target: {'kernel': 1}\n\nparams.encoder.layer_9:\n    - Source: {'kernel': 1}\n"
          "    - Target: MISSING\nIf this mismatch is intentional, pass `partial_restore=True`.")
  line = checkpoint_reads.reason(ValueError(text))
  assert line == (
      "ValueError: User-provided restore item and on-disk value metadata tree structures do "
      "not match: params/decoder/layer_2 (only in the checkpoint), params/encoder/layer_9 "
      "(only in the model), opt_state/0/0/mu/decoder/layer_2 (only in the checkpoint)")
  with pytest.raises(checkpoint_reads.MismatchedCheckpointError,
                     match=r"checkpoint 20 in d does not fit the model built to restore it: its "
                     r"arrays are not the model's: params/decoder/layer_2 \(only in the "
                     r"checkpoint\), .*\. config\.model changed"):
    checkpoint_reads.raise_if_mismatched(["", line], 20, "d", {})


def test_a_shape_mismatch_in_any_process_is_one_error_in_all():
  """Every process decides from the same gathered messages: one that failed
  otherwise (a missing shard) raises the mismatch too, instead of trying an older
  checkpoint while the others stop. A scalar asked for is not the vocabulary's
  doing (Orbax's replicated scalars on another topology): it stays unreadable."""
  target = {"params": {"embedding": jax.ShapeDtypeStruct((19, 32), jnp.float32)},
            "opt_state": {"mu": jax.ShapeDtypeStruct((19, 32), jnp.float32)},
            "step": jax.ShapeDtypeStruct((), jnp.int32)}
  mismatch = ("ValueError: Requested shape: (19, 32) is not compatible with the stored "
              "shape: (23, 32). Truncating/padding is disabled.")
  for messages in (["FileNotFoundError: no shard", mismatch], [mismatch, ""]):
    with pytest.raises(checkpoint_reads.MismatchedCheckpointError,
                       match=r"checkpoint 20 in d does not fit .* stores \(23, 32\) where the "
                       r"model has \(19, 32\) \(params/embedding\)\."):
      checkpoint_reads.raise_if_mismatched(messages, 20, "d", target)
  scalar = "ValueError: Requested shape: () is not compatible with the stored shape: (2,)."
  checkpoint_reads.raise_if_mismatched(["", scalar], 20, "d", target)
  checkpoint_reads.raise_if_mismatched(["", "OSError: gone"], 20, "d", target)
