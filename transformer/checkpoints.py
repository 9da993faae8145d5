"""Orbax checkpoints of the training state and the data iterator's position.

Orbax writes each step into a temporary directory and renames it when complete,
so a run killed while saving resumes from the last complete checkpoint. A
checkpoint that is present but unreadable is skipped with a warning in favour of
the next older one; a training run then renames it to <step>.unreadable (or
<step>.unreadable.1, ... where that name is taken; kept, not deleted) so that it
can save that step again.

Each checkpoint also holds checksums of its arrays and of the data iterator's
position (`checksums`), checked when it is restored; a mismatch makes the
checkpoint unreadable, as above. Checkpoints written before the checksums
existed restore unchecked.

The best checkpoints (`best_metric`) keep the highest values of a metric,
whatever their steps: a run resumed from before the kept best (after a stop on
non-finite values, say) saves a better result at an earlier or the same step,
and it replaces the kept one. A best checkpoint whose saved metrics cannot be
read is named in a warning and set aside as above.

A save that fails (a full disk, a denied permission; Orbax writes in the
background, so the error may surface at the next save or at close) raises
CheckpointSaveError naming the step, the reason and the last good checkpoint;
close() then lets the failed save's other writes end (event_loops) and
removes what it had written. Training stops there, and a rerun resumes from the
last good regular checkpoint.

In a multi-process job every process runs the same calls; process 0 alone
moves checkpoint directories aside (and back), and the others wait for it. A
step that any process could not read is unreadable for all (checkpoint_reads).
"""

import errno
import glob
import hashlib
import json
import os
import shutil
import threading

from absl import logging
from etils import epath
import jax
import orbax.checkpoint as ocp

from transformer import checkpoint_reads, checksums, distributed, event_loops, runtime
# Raised by restore, with checkpoint_reads.MismatchedCheckpointError.
from transformer.checkpoint_reads import UnreadableCheckpointError
from transformer.checksums import NewerCheckpointError

UNREADABLE_SUFFIX = ".unreadable"
REPLACED_SUFFIX = ".replaced"  # A best checkpoint moved aside while its step is saved again.
_METRICS = ocp.checkpoint_manager.METRIC_ITEM_NAME  # The item (and file) of a step's metrics.
# Keys training adds to the data state of a checkpoint that a stop saved: its
# mark, and the evaluation and decoding its step skipped (the resumed run's first).
STOPPED, OWED = "stopped", "owed"


def stop_marks(data_state: dict):
  """(the data position alone, whether a stop saved it, what that stop skipped)
  of a checkpoint's data state."""
  position = {k: v for k, v in data_state.items() if k not in (STOPPED, OWED)}
  return position, bool(data_state.get(STOPPED)), list(data_state.get(OWED, []))


class CheckpointSaveError(runtime.CommandError):
  """A checkpoint could not be written; the older ones are intact. `step` and
  `reason` let a writer other than training (average_checkpoints) say so its way."""

  def __init__(self, message, step=None, reason=None):
    super().__init__(message)
    self.step, self.reason = step, reason


def complete_steps(directory: str) -> list:
  """The steps whose checkpoint directories are complete in `directory` (Orbax
  renames a step's directory into place only once it is written), read from the
  directory alone: no CheckpointManager, and [] where there is no directory."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if n.isdecimal())


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def replaced_aside(directory: str) -> list:
  """(step, path) of each best checkpoint moved aside (<step>.replaced, or
  .replaced.1, ...) while a better one of its step is saved."""
  if not os.path.isdir(directory):
    return []
  found = []
  for name in sorted(os.listdir(directory)):
    step, _, rest = name.partition(".")
    path = os.path.join(directory, name)
    if step.isdecimal() and f".{rest}".startswith(REPLACED_SUFFIX) and os.path.isdir(path):
      found.append((int(step), path))
  return found


def _free_name(path: str) -> str:
  """`path`, or `path.1`, `path.2`, ...: the first name not taken."""
  name, n = path, 0
  while os.path.lexists(name):
    n += 1
    name = f"{path}.{n}"
  return name


def saved_metrics(directory: str, step: int):
  """The metrics saved with `step` of `directory` (a best checkpoint's score),
  read as Orbax reads them."""
  return ocp.JsonCheckpointHandler(filename=_METRICS).restore(
      epath.Path(directory) / str(step) / _METRICS)


def checksums_digest(directory: str, step: int):
  """A SHA-256 of the checksums `step` of `directory` holds of its arrays: what
  tells this checkpoint from another of the same step (a workdir trained again
  after its checkpoints were deleted). None where it holds none (checkpoints
  from before the checksums) or they cannot be read."""
  try:
    value = ocp.JsonCheckpointHandler().restore(epath.Path(directory) / str(step) / "checksums")
  except Exception:  # pylint: disable=broad-except  # Orbax's reader: any error is unreadable.
    return None
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def metric_value(directory: str, step: int, metric: str) -> float:
  """The saved value of `metric` at `step` (-inf where unreadable)."""
  try:
    return float(saved_metrics(directory, step)[metric])
  except Exception:  # pylint: disable=broad-except
    return float("-inf")


def best_first(directory: str, steps, metric: str) -> list:
  """`steps` of a best checkpoints' `directory`, the best value of `metric`
  first (the later step first among equals): the order a restore tries them."""
  return sorted(steps, key=lambda s: (metric_value(directory, s, metric), s), reverse=True)


def barrier_options(directory: str):
  """Orbax's multi-process options for the checkpoints in `directory`: its
  barriers named after the directory (alike in every process), apart from
  those of another directory's checkpoints saved at the same time."""
  return ocp.options.MultiprocessingOptions(
      barrier_sync_key_prefix=os.path.basename(os.path.abspath(directory)))


class Checkpointer:
  """Saves and restores {state, data iterator state} under `directory`."""

  def __init__(self, directory: str, keep: int = 5, read_only: bool = False,
               best_metric: str = ""):
    """With `best_metric`, saves carry metrics and only the `keep` checkpoints
    with the highest value of that metric are kept."""
    self.directory = os.path.abspath(directory)
    self._read_only = read_only
    self._best_metric = best_metric
    self._replaced = None  # (step, where it was moved): a best checkpoint being replaced.
    if read_only and not os.path.isdir(self.directory):
      raise FileNotFoundError(f"no checkpoints at {self.directory}")
    if not read_only and jax.process_index() == 0:
      # Made here: Orbax makes it in a background thread, whose failure (a file
      # at the path) was a logged traceback, and training ran to its first save.
      if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory, where checkpoints are "
                                 "saved; move it away", self.directory)
      os.makedirs(self.directory, exist_ok=True)
    best = {}
    if best_metric:
      best = dict(best_fn=lambda metrics: metrics[best_metric], best_mode="max",
                  keep_checkpoints_without_metrics=False)
      if not read_only:
        # Orbax reads every step's metrics when it opens the directory, and one
        # damaged file would stop it there.
        if jax.process_index() == 0:
          self._recover_replaced()
          self._set_aside_unreadable_metrics()
        distributed.barrier("checkpoints: best checkpoints checked")
    # Read-only: no saving interval and nothing to keep, which Orbax would
    # otherwise warn about on every restore; nor the metrics of every step,
    # which a restore does not need.
    # A writer (which holds the workdir's lock) removes the temporary directories
    # of saves that a kill interrupted; a reader leaves them alone.
    # Orbax names its processes' barriers by step alone ("async_write_complete.10"),
    # so the regular and the best checkpoint of one step, saved at once, would
    # meet at one barrier ("already ongoing": the job fails); each directory's
    # barriers carry its name.
    # A step's directory is made in save() itself: made in Orbax's background
    # thread, a failure (an unwritable directory) left its writer threads
    # waiting 300 s for the directory's signal, and the process with them.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else keep, save_interval_steps=0 if read_only else 1,
        create=not read_only, read_only=read_only, cleanup_tmp_directories=not read_only,
        lightweight_initialize=read_only, multiprocessing_options=barrier_options(self.directory),
        async_options=ocp.options.AsyncOptions(create_directories_asynchronously=False),
        **best)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          handler_registry=checkpoint_reads.handlers())
    self._pending = None  # The step being written in the background.
    self._failed = False  # A CheckpointSaveError was raised: close() reports no more.
    self._holding = False  # Holds event_loops' FinishingLoops for its saves' threads.

  def steps(self):
    return sorted(self._manager.all_steps())

  def latest_step(self):
    return self._manager.latest_step()

  def save(self, step: int, state, data_state: dict, metrics=None) -> None:
    """Starts writing `step` (in the background); first waits for the previous
    save, raising CheckpointSaveError if it failed.

    With `best_metric` the caller saves only results better than the kept ones,
    and each is written whatever its step: Orbax's `force` lifts its rule of
    saving only after its latest step (its `keep` best then stay), and a kept
    checkpoint of the same step is moved aside until the new one is complete."""
    self._wait()
    step = int(step)
    try:
      if self._best_metric and step in self.steps():
        if jax.process_index() == 0:
          self._replaced = (step, self._move_aside(step, REPLACED_SUFFIX))
        distributed.barrier("checkpoints: best checkpoint moved aside")
        self._manager.reload()
      self._hold_loops()
      self._manager.save(step, metrics=metrics, force=bool(self._best_metric),
                         args=ocp.args.Composite(
                             state=ocp.args.StandardSave(state),
                             data=ocp.args.JsonSave(data_state),
                             checksums=ocp.args.JsonSave(checksums.compute(state, data_state))))
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(step, e) from e
    self._pending = step

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
    self._settle_replaced()
    if not self._failed:  # Its threads have ended (after a failure, close() waits for them).
      self._release_loops()

  def _hold_loops(self) -> None:
    """Until its saves' threads end, the event loops that Orbax makes for them
    are event_loops.FinishingLoops: where one array's write fails, Orbax would
    close the loop while the others' go on (see there)."""
    if not self._holding:
      event_loops.hold()
      self._holding = True

  def _release_loops(self) -> None:
    if self._holding:
      self._holding = False
      event_loops.release()

  def _save_error(self, step, error) -> CheckpointSaveError:
    self._failed = True
    try:
      self._settle_replaced()  # The kept best goes back where the new one failed.
    except OSError as e:  # The next writer puts it back (_recover_replaced).
      logging.warning("Could not put back the replaced best checkpoint: %s", e)
    if self._best_metric:
      # Training resumes from its regular checkpoints, never from these.
      kept = complete_steps(self.directory)
      last = (f"the best checkpoint kept is step {max(kept, key=self._value)}, and a rerun "
              "resumes from the last regular checkpoint" if kept
              else "there is no best checkpoint yet, and a rerun resumes from the last "
              "regular checkpoint")
      return CheckpointSaveError(f"best checkpoint {step} could not be written to "
                                 f"{self.directory}: {error}. Training stopped; {last}.",
                                 step, str(error))
    good = [n for n in complete_steps(self.directory) if n != step]
    last = (f"the last good checkpoint is step {max(good)}, which a rerun resumes from"
            if good else "there is no earlier checkpoint")
    return CheckpointSaveError(f"checkpoint {step} could not be written to {self.directory}: "
                               f"{error}. Training stopped; {last}.", step, str(error))

  def _value(self, step):
    """The saved value of the best metric at `step` (-inf where unreadable)."""
    return metric_value(self.directory, step, self._best_metric)

  def best_value(self, metric: str):
    """The best saved value of `metric` (None before the first save). Waits for
    a save in flight: Orbax lists its step at once but reads its metrics from
    the file, which is there only once the save is complete."""
    self._wait()
    step = self._manager.best_step()
    if step is None:
      return None
    return self._manager.metrics(step)[metric]

  def _read_metrics(self, step):
    """The metrics saved with `step`, read as Orbax reads them."""
    return saved_metrics(self.directory, step)

  def _set_aside_unreadable_metrics(self) -> None:
    """Sets aside (as unreadable) the best checkpoints whose metrics cannot be
    read or hold no number for the metric. A step without metrics is left to
    Orbax, which reads it as having none and drops it at the next save."""
    for step in complete_steps(self.directory):
      try:
        value = self._read_metrics(step)[self._best_metric]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
          raise ValueError(f"{self._best_metric} is {value!r}, not a number")
      except FileNotFoundError:
        continue
      except Exception as e:  # pylint: disable=broad-except
        moved = self._move_aside(step, UNREADABLE_SUFFIX)
        logging.warning("Best checkpoint %d in %s has unreadable metrics (%s); moved it to "
                        "%s.", step, self.directory, checkpoint_reads.first_line(e), moved)

  def _move_aside(self, step, suffix) -> str:
    """Renames `step`'s directory to <step><suffix> (or <step><suffix>.1, ...),
    a name Orbax does not take for a step; returns the new path."""
    path = os.path.join(self.directory, str(step))
    moved = _free_name(path + suffix)
    os.rename(path, moved)
    return moved

  def _settle_replaced(self) -> None:
    """After a save that replaced a kept best checkpoint of its step: removes the
    old one if the new one is complete, else puts it back."""
    if self._replaced is None:
      return
    (step, moved), self._replaced = self._replaced, None
    self._settle(step, moved)
    self._manager.reload()

  def _settle(self, step, moved) -> None:
    path = os.path.join(self.directory, str(step))
    if os.path.isdir(path):
      shutil.rmtree(moved, ignore_errors=True)
    else:
      os.rename(moved, path)
      logging.warning("Put back best checkpoint %s: its replacement was not completed.", path)

  def _recover_replaced(self) -> None:
    """Settles what a run killed while replacing a best checkpoint left: the old
    one moved aside, and the new one complete or not."""
    for step, moved in replaced_aside(self.directory):
      self._settle(step, moved)

  def restore(self, abstract_state, shardings, step=None):
    """(state, data_state, step) of `step`, or of the newest readable checkpoint.

    Returns None when there is no checkpoint at all. `abstract_state` gives the
    tree and dtypes, `shardings` where each leaf goes.
    """
    if step is not None:
      candidates = [step]
    elif self._best_metric:  # The best first: a better result may sit at an earlier step.
      candidates = best_first(self.directory, self.steps(), self._best_metric)
    else:
      candidates = self.steps()[::-1]
    if step is not None and step not in self.steps():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                              f"steps present: {self.steps()}")
    target = _abstract(abstract_state, shardings)
    errors, failed = [], []
    for candidate in candidates:
      error = None
      checked = os.path.isdir(os.path.join(self.directory, str(candidate), "checksums"))
      try:
        items = dict(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore())
        if checked:
          items["checksums"] = ocp.args.JsonRestore()
        restored = self._manager.restore(candidate, args=ocp.args.Composite(**items))
        failures = [restored[k] for k in items
                    if isinstance(restored[k], checkpoint_reads.ReadFailure)]
        if failures:
          error = failures[0].error
      except Exception as e:  # pylint: disable=broad-except
        error = e
      # Each process reads only its own shards: all take a step that any of
      # them could not read as unreadable, before the checksums' collective.
      reason, messages = checkpoint_reads.agreed_failure(error)
      checkpoint_reads.raise_if_mismatched(messages, candidate, self.directory, target)
      if reason is None and checked:
        try:  # The same outcome in every process: global checksums, one saved file.
          checksums.check(restored.state, restored.data, restored.checksums)
        except NewerCheckpointError as e:
          raise NewerCheckpointError(f"checkpoint {candidate} in {self.directory}: {e}") from e
        except Exception as e:  # pylint: disable=broad-except
          error, reason = e, checkpoint_reads.first_line(e)
      if reason is not None:
        if step is not None:
          raise UnreadableCheckpointError(
              f"checkpoint {candidate} in {self.directory} is unreadable (damaged or "
              f"incomplete files): {reason}") from error
        errors.append(f"step {candidate}: {reason}")
        failed.append(candidate)
        logging.warning("Checkpoint step %d is unreadable (%s); trying an older one.",
                        candidate, reason)
        continue
      if errors:
        logging.warning("Restored step %d after skipping unreadable checkpoints: %s",
                        candidate, "; ".join(errors))
        # Outside the `try`: a failure here is not the restored checkpoint's.
        self._set_aside(failed)
      return restored.state, restored.data, candidate
    if errors:
      raise UnreadableCheckpointError(
          f"no readable checkpoint in {self.directory} (damaged or incomplete files; "
          f"nothing was changed there): {'; '.join(errors)}")
    return None

  def _set_aside(self, steps) -> None:
    """Renames unreadable checkpoints to <step>.unreadable (or .unreadable.1, ...
    where a step was set aside before; kept for inspection, invisible to Orbax),
    so that training can save those step numbers again. Process 0 renames; the
    others, which found the same checkpoints unreadable, wait for it."""
    if self._read_only:
      return
    if jax.process_index() == 0:
      for step in steps:
        try:
          moved = self._move_aside(step, UNREADABLE_SUFFIX)
        except OSError as e:
          raise runtime.CommandError(
              f"checkpoint {step} in {self.directory} is unreadable and could not be moved "
              f"aside: {e}. Move it out of that directory and rerun (an older checkpoint "
              "restores).") from e
        logging.warning("Moved unreadable checkpoint %s to %s",
                        os.path.join(self.directory, str(step)), moved)
    distributed.barrier("checkpoints: unreadable checkpoints set aside")
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
        self._close_manager()
      finally:
        self._release_loops()

  def _close_manager(self) -> None:
    try:
      self._manager.close()
    except Exception:  # pylint: disable=broad-except  # After a failed save: logged.
      if not self._failed:
        raise
    if self._failed:
      # A failed item leaves the other items' writer threads running: let them
      # end (and log) before the message (each thread's writes end before it
      # does: event_loops.FinishingLoop), then remove what the failed save
      # wrote, which frees what it took of a full disk. Thread's own join:
      # Orbax's raises the thread's error, which would stand in for the one
      # reported, and leave the rest behind.
      for thread in threading.enumerate():
        if type(thread).__module__.startswith("orbax.") and thread.is_alive():
          threading.Thread.join(thread, timeout=30)
      pattern = os.path.join(glob.escape(self.directory), "*.orbax-checkpoint-tmp*")
      for partial in glob.glob(pattern):
        shutil.rmtree(partial, ignore_errors=True)
