"""A command's standard streams: descriptors it was started without are opened on
/dev/null, an unbuffered stdout writes each text whole, stdout's last lines are
flushed where a failure is still the command's to report, and a stdout whose
reader has gone ends the command as it ends a C filter. set_up() runs first in
each command (sigterm.watch, runtime.run); runtime.one_line_errors uses the rest.
"""

import contextlib
import io
import os
import signal
import sys

# The standard streams a command was started without: `<&-`, `>&-` or `2>&-`.
_CLOSED_AT_START = set()


def set_up() -> None:
  """open_closed(), then whole_writes(): what every command needs of its streams
  before it opens a file or writes a line. Calling it again changes nothing."""
  open_closed()
  whole_writes()


def open_closed() -> None:
  """Opens /dev/null on each of descriptors 0-2 that the command was started
  without (Python's sys.stdin, sys.stdout or sys.stderr is then None), with the
  Python stream on it. Otherwise the next file or pipe the command opens takes
  the free number, and whatever a library writes to stdout or stderr lands in
  it (in sigterm's pipe, as signal numbers); and writing to sys.stderr fails
  (train's stop line, the sweep's echo of its training). Called first in each
  command (set_up); closed_at_start still says which were closed."""
  for fd, name in enumerate(("stdin", "stdout", "stderr")):
    if getattr(sys, name) is not None:
      continue
    try:
      os.fstat(fd)
      continue  # Taken since Python started; not ours to replace.
    except OSError:
      pass
    _devnull_onto(fd, os.O_RDONLY if fd == 0 else os.O_WRONLY)
    setattr(sys, name, open(fd, "r" if fd == 0 else "w", encoding="utf-8", closefd=False))  # pylint: disable=consider-using-with
    _CLOSED_AT_START.add(name)


def _naming(name):
  """files.naming: an OSError without a file name raised again naming `name`.
  (Imported at use: files imports runtime, which imports this module.)"""
  from transformer import files  # pylint: disable=g-import-not-at-top
  return files.naming(name)


class _NamedWrites(io.FileIO):
  """A descriptor's writer whose failures name it ('<stdout>'), as flush_stdout
  names a failed flush of a buffered stdout: an OSError from inside a print
  names no file."""

  def write(self, data):
    with _naming(self.name):
      return super().write(data)


def whole_writes() -> None:
  """Where stdout is unbuffered (`python -u`, or PYTHONUNBUFFERED=1, which
  containers often set), Python's text layer hands each text to a single
  write(2) of the descriptor and drops whatever that call did not take: a pipe
  whose reader left mid-write (`translate | head`), or a disk that filled, cut
  the output short with no error and status 0. stdout is then put on a buffered
  writer of the same descriptor, which writes until all is taken or fails
  (naming '<stdout>'), and flushed at each line end, so lines still appear as
  they are printed."""
  out = sys.stdout
  if out is None or not isinstance(getattr(out, "buffer", None), io.RawIOBase):
    return
  out.flush()
  raw = _NamedWrites(out.fileno(), "w", closefd=False)  # Its own: closing it leaves out's.
  raw.name = out.buffer.name  # '<stdout>', which messages name.
  sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=out.encoding,
                                errors=out.errors, line_buffering=True)


def closed_at_start(name: str) -> bool:
  """Whether the standard stream `name` ('stdin', 'stdout') was closed when the
  command started (open_closed), or is closed in Python now."""
  return getattr(sys, name) is None or name in _CLOSED_AT_START


def reader_gone() -> bool:
  """Whether stdout is a pipe whose reading end is closed: `translate |
  head -1` once head has its line. Only then is a BrokenPipeError the reader's
  choice rather than a fault."""
  import select  # pylint: disable=g-import-not-at-top
  try:
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
  except (AttributeError, OSError, ValueError):  # No file descriptor (a StringIO).
    return False


def end_reader_gone() -> None:
  """Ends as a C filter ends when its reader leaves: by SIGPIPE, with no message
  (a shell reports 141, and `set -o pipefail` sees it). stdout is pointed at
  /dev/null first, so the interpreter's last flush has nothing to complain of."""
  _stdout_to_devnull()
  signal.signal(signal.SIGPIPE, signal.SIG_DFL)
  os.kill(os.getpid(), signal.SIGPIPE)
  sys.exit(141)  # Where the signal does not end the process.


def _devnull_onto(fd: int, flags: int) -> None:
  """/dev/null opened (with `flags`) as descriptor `fd`, whether open or closed."""
  null = os.open(os.devnull, flags)
  if null != fd:  # Opened as fd itself where fd was the lowest free number.
    os.dup2(null, fd)
    os.close(null)


def _stdout_to_devnull() -> None:
  _devnull_onto(sys.stdout.fileno(), os.O_WRONLY)


def flush_stdout() -> None:
  """Flushes what stdout holds, naming it in a failure. A buffered stdout (`cmd >
  FILE`) holds its last lines until the interpreter's exit, whose failing flush
  (a full disk) prints `Exception ignored in: <_io.TextIOWrapper name='<stdout>'
  ...>` and makes the status 120: flushed here, the failure is the command's
  one line. Nothing where stdout is closed (`>&-`: Python's sys.stdout is None
  and print writes nothing)."""
  if sys.stdout is None:
    return
  with _naming(getattr(sys.stdout, "name", "<stdout>")):
    sys.stdout.flush()


def drop_what_stdout_cannot_write() -> None:
  """Where stdout still holds bytes it cannot write, points it at /dev/null: the
  interpreter's flush at exit would fail again, add its note after the
  command's line and make the exit status 120."""
  try:
    if sys.stdout is not None:
      sys.stdout.flush()
  except (OSError, ValueError):
    with contextlib.suppress(OSError, ValueError):
      _stdout_to_devnull()
