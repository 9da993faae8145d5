"""Background-thread prefetching that keeps get_state/set_state exact."""
import queue
import threading

_POLL_S = 0.05  # How often a blocked producer checks whether it should stop.


class Prefetch:
  """Iterates `iterator` in a thread, `size` batches ahead.

  `get_state()` is the state right after the last batch handed out (not the
  last one produced), so checkpointing it and `set_state` on a fresh pipeline
  resumes exactly where the consumer was.
  """

  def __init__(self, iterator, size):
    self._it = iterator
    self._size = size
    self._state = iterator.get_state()
    self._error = None
    self._start()

  def _start(self):
    self._queue = queue.Queue(maxsize=self._size)
    self._stop = threading.Event()
    self._thread = threading.Thread(
        target=self._produce, args=(self._queue, self._stop), daemon=True)
    self._thread.start()

  def _produce(self, q, stop):
    while not stop.is_set():
      try:
        item = (next(self._it), self._it.get_state(), None)
      except BaseException as e:  # Handed to the consumer, raised there.
        item = (None, None, e)
      while not stop.is_set():
        try:
          q.put(item, timeout=_POLL_S)
          break
        except queue.Full:
          pass
      if item[2] is not None:
        return

  def _halt(self):
    self._stop.set()
    self._thread.join()

  def __iter__(self):
    return self

  def __next__(self):
    if self._error is not None:
      raise self._error
    batch, state, error = self._queue.get()
    if error is not None:
      self._error = error
      raise error
    self._state = state
    return batch

  def get_state(self):
    return dict(self._state)

  def set_state(self, state):
    self._halt()  # The thread owns the iterator until it has stopped.
    self._it.set_state(state)
    self._state = self._it.get_state()
    self._error = None
    self._start()

  def close(self):
    self._halt()


def prefetch(iterator, size):
  """`iterator` prefetched `size` batches ahead in a thread; `size` <= 0 returns it as is."""
  return Prefetch(iterator, size) if size and size > 0 else iterator
