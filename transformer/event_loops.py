"""Event loops for Orbax's reads and writes: a loop closed with tasks still
running in it lets them end first (FinishingLoop), and while held (hold() to
release(), or within finishing_event_loops()) asyncio.new_event_loop() gives
such loops, in every thread."""

import asyncio
import contextlib
import threading


# How long a failed read or write waits for those that were running beside it.
FINISH_S = 60


class FinishingLoop(asyncio.SelectorEventLoop):
  """An event loop that, when closed, first lets the tasks still running in it
  end (for at most FINISH_S seconds, then cancels them).

  Orbax runs a restore's reads, and a save's writes of an item (in a thread of
  their own, in the background), as tasks of a fresh loop and closes it as soon
  as one fails. The others' TensorStore operations go on in TensorStore's
  threads, and each, when done, schedules its task on the closed loop: that
  prints `RuntimeError: Event loop is closed` (and `Exception ignored in:
  <coroutine ...>` for each task dropped unfinished, or `Task exception was
  never retrieved` at exit), up to hundreds of times, around the one-line
  error; and a failed save's writes would still be going on in the directory
  that its clean-up removes."""

  def close(self):
    if not self.is_running() and not self.is_closed() and not _loop_running_here():
      pending = [t for t in asyncio.all_tasks(self) if not t.done()]
      if pending:
        _, late = self.run_until_complete(asyncio.wait(pending, timeout=FINISH_S))
        for task in late:
          task.cancel()
        if late:
          self.run_until_complete(asyncio.wait(late))
        for task in pending:  # Their errors are the reported one's siblings.
          if not task.cancelled():
            task.exception()
      # A task that ended in the loop's last step has its callbacks (a
      # gather's, which takes its error as seen) still to run: without them it
      # is logged as `Task exception was never retrieved` when collected.
      self.run_until_complete(asyncio.sleep(0))
    super().close()


def _loop_running_here() -> bool:
  """Whether another loop runs in this thread (where this one cannot run)."""
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return False
  return True


class FinishingPolicy(asyncio.DefaultEventLoopPolicy):

  def new_event_loop(self):
    return FinishingLoop()


_lock = threading.Lock()
_holders = 0  # hold() calls not yet released.
_previous = None  # The policy that the last release() puts back.


def hold() -> None:
  """From now until the matching release(), asyncio.new_event_loop() (which
  Orbax calls for each restore, and in each writing thread of a save) gives
  FinishingLoops. Counted: the policy goes back at the last release()."""
  global _holders, _previous
  with _lock:
    if _holders == 0:
      _previous = asyncio.get_event_loop_policy()
      if not isinstance(_previous, FinishingPolicy):
        asyncio.set_event_loop_policy(FinishingPolicy())
    _holders += 1


def release() -> None:
  global _holders, _previous
  with _lock:
    if _holders == 0:
      raise RuntimeError("event_loops.release() without a hold()")
    _holders -= 1
    if _holders == 0:
      asyncio.set_event_loop_policy(_previous)
      _previous = None


@contextlib.contextmanager
def finishing_event_loops():
  """Within it, asyncio.new_event_loop() gives FinishingLoops (hold, release)."""
  hold()
  try:
    yield
  finally:
    release()
