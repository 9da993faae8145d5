"""Orbax checkpoints of the training state and the data iterator's position.

Orbax writes each step into a temporary directory and renames it when complete,
so a run killed while saving resumes from the last complete checkpoint. A
checkpoint that is present but unreadable is skipped with a warning in favour of
the next older one; a training run then renames it to <step>.unreadable (kept,
not deleted) so that it can save that step again.

Each checkpoint also holds a checksum of every array of the state
(`fingerprints`) and of the data iterator's position, checked when it is
restored: damaged bytes in a data file that still decompress (as zstd does, into
different numbers) would otherwise restore without an error, and training would
go on from them. A mismatch makes the checkpoint unreadable, as above.
Checkpoints written before the checksums existed restore unchecked.

A save that fails (a full disk, a denied permission; Orbax writes in the
background, so the error may surface at the next save or at close) raises
CheckpointSaveError naming the step, the reason and the last good checkpoint;
close() then removes what the failed save had written. Training stops there,
and a rerun resumes from that last good checkpoint.
"""

import glob
import json
import os
import shutil
import threading
import zlib

from absl import logging
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from transformer import runtime


class CheckpointSaveError(runtime.CommandError):
  """A checkpoint could not be written; the older ones are intact."""


class UnreadableCheckpointError(runtime.CommandError):
  """The checkpoint asked for, or every checkpoint there is, cannot be read."""


def _first_line(error: Exception) -> str:
  """`Type: first line` of an error (runtime.first_line)."""
  return f"{type(error).__name__}: {runtime.first_line(error)}"


def _checksum(x):
  """A uint32 checksum of an array's bits: sum_i w_i * odd_i mod 2^32 over its
  32-bit (or narrower, zero-extended) words w_i. The multipliers odd_i are odd,
  so a change to any one word always changes the sum; words moved or changed
  together go unnoticed with probability ~2^-32."""
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  else:
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    words = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)  # 8 bytes: [..., 2].
  words = words.reshape(-1)
  odd = jnp.arange(words.size, dtype=jnp.uint32) * 2 + 1
  return jnp.sum(words * (odd * jnp.uint32(0x9E3779B1)), dtype=jnp.uint32)


_checksum_all = jax.jit(lambda leaves: [_checksum(x) for x in leaves])


def fingerprints(tree) -> dict:
  """{key path: checksum} of every array in `tree`, computed where the arrays are."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  sums = jax.device_get(_checksum_all([x for _, x in leaves]))
  return {jax.tree_util.keystr(path): int(v) for (path, _), v in zip(leaves, sums)}


def _checksums(state, data_state) -> dict:
  """What a checkpoint stores to check itself by: the state's fingerprints and a
  CRC-32 of the data iterator's position (JSON, read back as written)."""
  return {"state": fingerprints(state),
          "data": zlib.crc32(json.dumps(data_state, sort_keys=True).encode())}


def _check(state, data_state, saved: dict) -> None:
  """ValueError naming what differs from the checksums saved with a checkpoint."""
  got = _checksums(state, data_state)
  bad = [k for k in sorted(set(got["state"]) | set(saved["state"]))
         if got["state"].get(k) != saved["state"].get(k)]
  if got["data"] != saved["data"]:
    bad.append("the data position")
  if bad:
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    raise ValueError(f"checksum mismatch in {', '.join(bad[:3])}{more}: its files were "
                     "changed after they were written")


def complete_steps(directory: str) -> list:
  """The steps whose checkpoint directories are complete in `directory` (Orbax
  renames a step's directory into place only once it is written), read from the
  directory alone: no CheckpointManager, and [] where there is no directory."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


class Checkpointer:
  """Saves and restores {state, data iterator state} under `directory`."""

  def __init__(self, directory: str, keep: int = 5, read_only: bool = False,
               best_metric: str = ""):
    """With `best_metric`, saves carry metrics and only the `keep` checkpoints
    with the highest value of that metric are kept."""
    self.directory = os.path.abspath(directory)
    self._read_only = read_only
    if read_only and not os.path.isdir(self.directory):
      raise FileNotFoundError(f"no checkpoints at {self.directory}")
    best = {}
    if best_metric:
      best = dict(best_fn=lambda metrics: metrics[best_metric], best_mode="max",
                  keep_checkpoints_without_metrics=False)
    # Read-only: no saving interval and nothing to keep, which Orbax would
    # otherwise warn about on every restore.
    # A writer (which holds the workdir's lock) removes the temporary directories
    # of saves that a kill interrupted; a reader leaves them alone.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else keep, save_interval_steps=0 if read_only else 1,
        create=not read_only, read_only=read_only, cleanup_tmp_directories=not read_only,
        **best)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "data", "checksums"))
    self._pending = None  # The step being written in the background.
    self._failed = False  # A CheckpointSaveError was raised: close() reports no more.

  def steps(self):
    return sorted(self._manager.all_steps())

  def latest_step(self):
    return self._manager.latest_step()

  def save(self, step: int, state, data_state: dict, metrics=None) -> None:
    """Starts writing `step` (in the background); first waits for the previous
    save, raising CheckpointSaveError if it failed."""
    self._wait()
    try:
      self._manager.save(int(step), metrics=metrics, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
          checksums=ocp.args.JsonSave(_checksums(state, data_state))))
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(int(step), e) from e
    self._pending = int(step)

  def _wait(self) -> None:
    """Waits for the save in flight; CheckpointSaveError if it failed (Orbax
    raises, or only logs and skips the step's final rename)."""
    pending, self._pending = self._pending, None
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(pending, e) from e
    if pending is not None and not os.path.isdir(os.path.join(self.directory, str(pending))):
      raise self._save_error(pending, "it was not completed (Orbax's log above says why)")

  def _save_error(self, step, error) -> CheckpointSaveError:
    self._failed = True
    good = [n for n in complete_steps(self.directory) if n != step]
    last = (f"the last good checkpoint is step {max(good)}, which a rerun resumes from"
            if good else "there is no earlier checkpoint")
    return CheckpointSaveError(f"checkpoint {step} could not be written to {self.directory}: "
                               f"{error}. Training stopped; {last}.")

  def best_value(self, metric: str):
    """The best saved value of `metric` (None before the first save)."""
    step = self._manager.best_step()
    if step is None:
      return None
    return self._manager.metrics(step)[metric]

  def restore(self, abstract_state, shardings, step=None):
    """(state, data_state, step) of `step`, or of the newest readable checkpoint.

    Returns None when there is no checkpoint at all. `abstract_state` gives the
    tree and dtypes, `shardings` where each leaf goes.
    """
    candidates = [step] if step is not None else self.steps()[::-1]
    if step is not None and step not in self.steps():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                              f"steps present: {self.steps()}")
    target = _abstract(abstract_state, shardings)
    errors = []
    for candidate in candidates:
      try:
        items = dict(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore())
        checked = os.path.isdir(os.path.join(self.directory, str(candidate), "checksums"))
        if checked:
          items["checksums"] = ocp.args.JsonRestore()
        restored = self._manager.restore(candidate, args=ocp.args.Composite(**items))
        if checked:
          _check(restored.state, restored.data, restored.checksums)
        if errors:
          logging.warning("Restored step %d after skipping unreadable checkpoints: %s",
                          candidate, "; ".join(errors))
          self._set_aside([s for s in candidates if s > candidate])
        return restored.state, restored.data, candidate
      except Exception as e:  # pylint: disable=broad-except
        if step is not None:
          raise UnreadableCheckpointError(
              f"checkpoint {candidate} in {self.directory} is unreadable (damaged or "
              f"incomplete files): {_first_line(e)}") from e
        errors.append(f"step {candidate}: {_first_line(e)}")
        logging.warning("Checkpoint step %d is unreadable (%s); trying an older one.",
                        candidate, _first_line(e))
    if errors:
      raise UnreadableCheckpointError(
          f"no readable checkpoint in {self.directory} (damaged or incomplete files; "
          f"nothing was changed there): {'; '.join(errors)}")
    return None

  def _set_aside(self, steps) -> None:
    """Renames unreadable checkpoints to <step>.unreadable (kept for inspection,
    invisible to Orbax), so that training can save those step numbers again."""
    if self._read_only:
      return
    for step in steps:
      path = os.path.join(self.directory, str(step))
      os.rename(path, f"{path}.unreadable")
      logging.warning("Moved unreadable checkpoint %s to %s.unreadable", path, path)
    self._manager.reload()

  def wait(self) -> None:
    self._wait()

  def close(self) -> None:
    """Waits for the save in flight and closes; raises CheckpointSaveError if
    that save failed, unless a failure was already reported."""
    failed_before = self._failed
    try:
      self._wait()
    except CheckpointSaveError:
      if not failed_before:
        raise
    finally:
      try:
        self._manager.close()
      except Exception:  # pylint: disable=broad-except  # After a failed save: logged.
        if not self._failed:
          raise
      if self._failed:
        # A failed item leaves the other items' writer threads running: let them
        # end (and log) before the message, then remove what the failed save
        # wrote, which frees what it took of a full disk.
        for thread in threading.enumerate():
          if type(thread).__module__.startswith("orbax.") and thread.is_alive():
            thread.join(timeout=30)
        pattern = os.path.join(glob.escape(self.directory), "*.orbax-checkpoint-tmp*")
        for partial in glob.glob(pattern):
          shutil.rmtree(partial, ignore_errors=True)
