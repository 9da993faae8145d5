"""Event loops for Orbax's reads: a loop closed with tasks still running in it
lets them end first (FinishingLoop), and finishing_event_loops() makes the
loops that asyncio.new_event_loop() gives such loops."""

import asyncio
import contextlib


# How long a failed read waits for the reads that were running beside it.
FINISH_S = 60


class FinishingLoop(asyncio.SelectorEventLoop):
  """An event loop that, when closed, first lets the tasks still running in it
  end (for at most FINISH_S seconds, then cancels them).

  Orbax runs a restore's reads as tasks of a fresh loop and closes it as soon as
  one read fails. The other reads' TensorStore operations go on in TensorStore's
  threads, and each, when done, schedules its task on the closed loop: that
  prints `RuntimeError: Event loop is closed` (and `Exception ignored in:
  <coroutine ...>` for each task dropped unfinished), up to hundreds of times,
  after the one-line error."""

  def close(self):
    pending = [t for t in asyncio.all_tasks(self) if not t.done()]
    if pending and not self.is_running() and not self.is_closed():
      _, late = self.run_until_complete(asyncio.wait(pending, timeout=FINISH_S))
      for task in late:
        task.cancel()
      if late:
        self.run_until_complete(asyncio.wait(late))
      for task in pending:  # Their errors are the reported one's siblings.
        if not task.cancelled():
          task.exception()
    super().close()


class FinishingPolicy(asyncio.DefaultEventLoopPolicy):

  def new_event_loop(self):
    return FinishingLoop()


@contextlib.contextmanager
def finishing_event_loops():
  """Within it, asyncio.new_event_loop() (which Orbax's restore calls) gives
  FinishingLoops."""
  previous = asyncio.get_event_loop_policy()
  if isinstance(previous, FinishingPolicy):  # Already (a nested restore).
    yield
    return
  asyncio.set_event_loop_policy(FinishingPolicy())
  try:
    yield
  finally:
    asyncio.set_event_loop_policy(previous)
