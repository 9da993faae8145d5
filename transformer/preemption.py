"""SIGTERM and SIGINT stop training at a step boundary, with a checkpoint.

From the moment the loop begins: before it, in train.py's start-up, SIGTERM ends
the process at once (transformer/sigterm.py), and StopSignals.install takes it
over from there.

A scheduler preempting a job sends SIGTERM and waits a grace period before
SIGKILL; Ctrl-C sends SIGINT. Either asks training to finish the step in
flight (and those the loop has queued behind it: `training.steps_ahead`), save a
checkpoint at that step (skipping that step's evaluation and decoding, which
the grace period may not cover, or what is left of them where
the signal comes during them: `stop_now`) and raise Preempted, which
train.py turns into exit status 128 + the signal's number (143 for SIGTERM, 130
for SIGINT: what a shell reports for a process the signal killed), so a
requeued job, or the same command rerun, resumes from that checkpoint. A second
signal acts at once, as if none of this were here: an impatient Ctrl-C still
stops, and the save it interrupts is never mistaken for a checkpoint (Orbax
writes a temporary directory and renames it when complete). Except a second
SIGTERM within DUPLICATE_S of the first: that is the same request sent twice (a
scheduler signals every process of a job, and a sweep passes its own on to the
training it runs), and training still saves.

Signals reach Python's main thread only, so the handlers are installed only
there. A multi-process job must stop every process after the same step, or the
others would wait in that step's collectives for the one that stopped. There
JAX's preemption service decides: jax.distributed.initialize installs its
SIGTERM notifier, which tells every process of the job, and
`reached_preemption_sync_point` names one step, after the newest any process
has reached, at which all of them save and stop. A SIGTERM to one process is
enough; a SIGINT is passed to the service as a SIGTERM to the same process.
There the notifier keeps SIGTERM: a second one is dropped, while a second
SIGINT (or SIGKILL, which a scheduler sends after its grace period) stops the
process at once. Other commands join without the service
(distributed.maybe_initialize), so SIGTERM ends them as usual.
"""

import os
import signal
import threading
import time

from absl import logging
import jax
from jax.experimental import multihost_utils

from transformer import sigterm

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Seconds within which a second SIGTERM is taken for the first one sent twice.
DUPLICATE_S = 1.0


class Preempted(Exception):
  """Training stopped on a signal after saving a checkpoint at `step`."""

  def __init__(self, signum: int, step: int, directory: str):
    self.signum, self.step = signum, step
    self.exit_status = 128 + signum
    super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}, saved as "
                     f"checkpoint {step} in {directory}; rerun the same command to resume")


def _job_wide_service() -> bool:
  """Whether this process is one of several that JAX's preemption service joins."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return (jax.process_count() > 1
          and distributed.global_state.preemption_sync_manager is not None)


class StopSignals:
  """Catches SIGTERM and SIGINT between install() and restore(); `received` is
  the first one's number in this process (None before); `stop_after(step)` says
  whether training stops after `step` (called at every step)."""

  def __init__(self):
    self.received = None
    self._received_at = None
    self._previous = {}
    self._job_wide = False

  def install(self) -> "StopSignals":
    if threading.current_thread() is not threading.main_thread():
      return self
    self._job_wide = _job_wide_service()
    sigterm.hand_over(restore_default=not self._job_wide)
    if self._job_wide:  # SIGTERM stays with JAX's notifier.
      self._previous = {signal.SIGINT: signal.signal(signal.SIGINT, self._handle)}
    else:
      self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
    return self

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    now = time.monotonic()
    if self.received is not None:  # A second signal.
      if signum == self.received == signal.SIGTERM and now - self._received_at < DUPLICATE_S:
        logging.warning("SIGTERM received again within %.1f s: the same stop request.",
                        DUPLICATE_S)
        return
      self.restore()
      os.kill(os.getpid(), signum)  # Delivered again, to the handler before ours.
      return
    self.received, self._received_at = signum, now
    logging.warning("%s received: saving a checkpoint after the step in flight, then "
                    "stopping (send it again to stop at once).", signal.Signals(signum).name)
    if self._job_wide:
      self.restore()
      os.kill(os.getpid(), signal.SIGTERM)  # To JAX's notifier: every process stops.

  def stop_after(self, step: int) -> bool:
    if self._job_wide:
      return multihost_utils.reached_preemption_sync_point(step)
    return self.received is not None

  def stop_now(self) -> bool:
    """Whether a signal came since stop_after(step) said no, and training may
    stop at that step all the same (skipping the rest of its evaluation and
    decoding): a process alone may; the processes of a job stop at the step
    the preemption service names, after the next one."""
    return not self._job_wide and self.received is not None

  @property
  def signum(self) -> int:
    """The signal to report: this process's own, or the job's SIGTERM."""
    return self.received or signal.SIGTERM

  def restore(self) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}
