"""Test-only fault hooks for the commands run as real processes by the fault
tests (tests/fault_train.py, tests/fault_average.py). Each is off unless its
environment variable is set; the library reads none of them.

  FAULT_BATCH_LOG=PATH     appends `epoch index crc32` of every training batch
                           the loop takes (the iterator's position after it, and
                           the batch's content), unbuffered, so a kill loses none.
  FAULT_STEP_SECONDS=S     sleeps S seconds per training batch, so that a signal
                           or a kill sent from outside lands mid-run.
  FAULT_START_SECONDS=S    sleeps S seconds before loading the data (the workdir
                           locked, nothing trained), printing `fault: starting`
                           first, so that a signal lands in the start-up.
  FAULT_SAVE_SECONDS=S     sleeps S seconds inside every checkpoint save, after
                           its items are written and before Orbax renames the
                           step's temporary directory into place, printing
                           `fault: finalizing PATH` first, so a kill lands inside it.
  FAULT_SAVE_DIR=NAME      slows only the saves into the workdir's folder NAME
                           (checkpoints_best, say).
  FAULT_EVAL_SECONDS=S     sleeps S seconds in each in-training evaluation of the
                           loss, printing `fault: evaluating` first, so a signal
                           lands inside it.
  FAULT_SAVE_ERROR_STEP=N[,M...]  the saves of those steps (regular and best)
                           fail with OSError(ENOSPC) while writing, as on a full disk.
"""

import asyncio
import errno
import os
import sys
import time
import zlib

import numpy as np

from transformer import data as data_lib


class _LoggedBatches:
  """The training iterator, writing each batch's position and checksum."""

  def __init__(self, batches, fd, seconds):
    self._batches, self._fd, self._seconds = batches, fd, seconds

  def __iter__(self):
    return self

  def __next__(self):
    batch = next(self._batches)
    if self._fd is not None:
      state = self._batches.get_state()
      crc = zlib.crc32(np.ascontiguousarray(batch["inputs"]).tobytes())
      crc = zlib.crc32(np.ascontiguousarray(batch["targets"]).tobytes(), crc)
      os.write(self._fd, f"{state['epoch']} {state['index']} {crc:08x}\n".encode())
    if self._seconds:
      time.sleep(self._seconds)
    return batch

  def get_state(self):
    return self._batches.get_state()

  def set_state(self, state):
    self._batches.set_state(state)

  def close(self):
    if hasattr(self._batches, "close"):
      self._batches.close()


def _held(function, note, seconds):
  """`function`, first printing `fault: {note}` and sleeping `seconds`."""
  def held(*args, **kwargs):
    sys.stderr.write(f"fault: {note}\n")
    sys.stderr.flush()
    time.sleep(seconds)
    return function(*args, **kwargs)
  return held


def install_hooks(environ):
  log, seconds = environ.get("FAULT_BATCH_LOG"), float(environ.get("FAULT_STEP_SECONDS", 0))
  if log or seconds:
    get_train_and_eval = data_lib.get_train_and_eval
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else None

    def logged(*args, **kwargs):
      data = get_train_and_eval(*args, **kwargs)
      return data._replace(train_batches=_LoggedBatches(data.train_batches, fd, seconds))

    data_lib.get_train_and_eval = logged

  start_seconds = float(environ.get("FAULT_START_SECONDS", 0))
  if start_seconds:
    data_lib.get_train_and_eval = _held(data_lib.get_train_and_eval, "starting", start_seconds)

  eval_seconds = float(environ.get("FAULT_EVAL_SECONDS", 0))
  if eval_seconds:
    from transformer import steps  # pylint: disable=g-import-not-at-top
    steps.evaluate_loss = _held(steps.evaluate_loss, "evaluating", eval_seconds)

  from orbax.checkpoint._src.path import atomicity  # pylint: disable=g-import-not-at-top
  save_seconds = float(environ.get("FAULT_SAVE_SECONDS", 0))
  save_dir = environ.get("FAULT_SAVE_DIR")
  if save_seconds:
    finalize = atomicity.AtomicRenameTemporaryPath.finalize

    async def slow_finalize(self):
      final = self.get_final()  # A step's directory, its items already in it:
      if final.name.isdigit() and save_dir in (None, final.parent.name):
        sys.stderr.write(f"fault: finalizing {final}\n")
        sys.stderr.flush()
        await asyncio.sleep(save_seconds)
      await finalize(self)

    atomicity.AtomicRenameTemporaryPath.finalize = slow_finalize

  error_steps = environ.get("FAULT_SAVE_ERROR_STEP")
  if error_steps:  # In the background write, where a full disk shows up.
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as json_handler  # pylint: disable=g-import-not-at-top
    save_fn = json_handler.JsonCheckpointHandler._save_fn  # pylint: disable=protected-access

    async def failing_save_fn(self, x, directory):
      if any(f"/{step}.orbax-checkpoint-tmp" in str(directory)
             for step in error_steps.split(",")):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
      return await save_fn(self, x, directory)

    json_handler.JsonCheckpointHandler._save_fn = failing_save_fn  # pylint: disable=protected-access
