"""A SIGTERM that a command does not take for itself ends it at once, in one
line, its workdir unlocked.

Training takes SIGTERM to save and stop at a step (transformer/preemption.py), but
only once its loop begins: before that (imports, the vocabulary, data, compiling,
restoring; a minute or more) there is nothing to save. evaluate, translate and
average_checkpoints never take it: what they write survives a kill at any moment
(written atomically, or streamed and flushed). Left to SIGTERM's default action,
each would end silently, and the next run would warn that it took over a dead
process's lock. `watch(command, outcome)`, called first thing in each command, makes that SIGTERM
end the process with `{command}: stopped by SIGTERM{outcome}` and status 143,
after running what `release_first` registered (the workdir lock's release).
`hand_over()` ends this once training (or JAX's preemption service, in a
multi-process job) takes SIGTERM, or once a command has written its results.
Inside `with held():` a SIGTERM waits for the block to end: for files that
must change together (evaluate's hypotheses and the JSON that names them).

Why a thread: a Python signal handler runs only between bytecodes of the main
thread, so it would wait for a compilation or a vocabulary's training to return
(seconds to minutes: for a large model, past a scheduler's grace period).
Python's C-level handler writes the signal's number to `signal.set_wakeup_fd` at
once, and a thread waiting on that pipe runs while the main thread is in such a
call (they release the GIL). It ends the process with os._exit, no more abruptly
than the default action did: files are written atomically and the kill -9 tests
cover any moment of a run.
"""

import contextlib
import os
import signal
import threading

from transformer import streams

# train's outcome (train.py and the fault tests' copy of it).
BEFORE_TRAINING = (" during start-up, before training began: nothing to save; "
                   "rerun the same command to resume")

_state = {}  # While the watch is on: its pipe, message, releases.
# The watcher ends the process holding it; hand-over and held() blocks make it wait.
# Reentrant: a held block may hand over.
_lock = threading.RLock()


def watch(command: str, outcome: str) -> None:
  """Watches for SIGTERM until hand_over (see above); `outcome` follows
  `stopped by SIGTERM` and says what the stop leaves. Only in the main thread,
  and only where SIGTERM has its default action: a command started with SIGTERM
  ignored keeps ignoring it."""
  streams.set_up()  # Before the pipe, which could take a closed one's number.
  if (_state or threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
    return
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)  # set_wakeup_fd's requirement.
  signal.signal(signal.SIGTERM, _python_handler)
  previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  _state.update(message=f"{command}: stopped by SIGTERM{outcome}\n", write_fd=write_fd,
                previous_fd=previous, releases=[])
  threading.Thread(target=_watch, args=(read_fd,), name="sigterm-watch",
                   daemon=True).start()


def _python_handler(signum, frame):
  """Nothing: the watcher acts (the wakeup fd is written only for signals with a
  Python handler)."""
  del signum, frame


def _watch(read_fd: int) -> None:
  with os.fdopen(read_fd, "rb", buffering=0) as pipe:
    while True:
      numbers = pipe.read(64)  # Each byte a signal's number (SIGINT's too).
      if not numbers:  # hand_over closed the other end.
        return
      if signal.SIGTERM in numbers:
        with _lock:
          if _state:
            _end(_state["message"], _state["releases"])


def _end(message: str, releases: list) -> None:
  for release in list(releases):
    try:
      release()
    except Exception:  # pylint: disable=broad-except
      pass  # The lock is then taken over by the next run, with a warning.
  # os.write: the main thread may hold sys.stderr's buffer lock.
  os.write(2, message.encode())
  os._exit(128 + signal.SIGTERM)  # pylint: disable=protected-access


def release_first(release):
  """Has watch's end call `release()` first; returns a function that takes it
  back (call it once `release` has run). Nothing while no watch is on."""
  releases = _state.get("releases")
  if releases is None:
    return lambda: None
  releases.append(release)
  return lambda: release in releases and releases.remove(release)


@contextlib.contextmanager
def held():
  """A SIGTERM that arrives inside the block ends the process (as `watch` says)
  once the block has ended, whether it returns or raises."""
  with _lock:
    yield


def hand_over(restore_default: bool = True) -> None:
  """Ends the watch (in the main thread): SIGTERM is the caller's from here on,
  with its default action restored first, unless `restore_default` is False (JAX's
  preemption service has installed its own handler, which this must not replace).
  A SIGTERM during the hand-over still ends the process, by one or the other."""
  if not _state:
    return
  if restore_default and signal.getsignal(signal.SIGTERM) is _python_handler:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  with _lock:
    signal.set_wakeup_fd(_state["previous_fd"])
    os.close(_state["write_fd"])
    _state.clear()
