"""SIGTERM and SIGINT stop training at a step boundary, with a checkpoint.

A scheduler preempting a job sends SIGTERM and waits a grace period before
SIGKILL; Ctrl-C sends SIGINT. Either asks training to finish the step in
flight, save a checkpoint at that step (skipping that step's evaluation and
decoding, which the grace period may not cover) and raise Preempted, which
train.py turns into exit status 128 + the signal's number (143 for SIGTERM, 130
for SIGINT: what a shell reports for a process the signal killed), so a
requeued job, or the same command rerun, resumes from that checkpoint. A second
signal acts at once, as if none of this were here: an impatient Ctrl-C still
stops, and the save it interrupts is never mistaken for a checkpoint (Orbax
writes a temporary directory and renames it when complete).

Signals reach Python's main thread only, so the handlers are installed only
there. In a multi-host run every process must receive the signal (schedulers
signal every task of a job); one that does not would wait for the others'
checkpoint.
"""

import signal
import threading

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """Training stopped on a signal after saving a checkpoint at `step`."""

  def __init__(self, signum: int, step: int, directory: str):
    self.signum, self.step = signum, step
    self.exit_status = 128 + signum
    super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}, saved as "
                     f"checkpoint {step} in {directory}; rerun the same command to resume")


class StopSignals:
  """Catches SIGTERM and SIGINT between install() and restore(); `received` is
  the first one's number (None before)."""

  def __init__(self):
    self.received = None
    self._previous = {}

  def install(self) -> "StopSignals":
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
    return self

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    self.received = signum
    logging.warning("%s received: saving a checkpoint after the step in flight, then "
                    "stopping (send it again to stop at once).", signal.Signals(signum).name)
    self.restore()  # The second signal gets the usual behaviour.

  def restore(self) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}
