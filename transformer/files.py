"""Writing a file so that a crash never leaves half of it: a temporary file in
the same directory, renamed over the target only once it is complete."""

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
from typing import Optional

from absl import logging

from transformer import runtime


TMP_INFIX = ".tmp"  # NAME.tmp<pid>@<host>: a temporary of the process <pid> of <host>.


def check_local(path: str, what: str = "workdir") -> None:
  """A ValueError for a URL (gs://, s3://): reading and writing here are local
  file operations, which would take it as a relative path (a directory 'gs:').
  And for a path with '[' or ']' (its folders' names included): Orbax finds a
  checkpoint's parts with a glob of the path, where those are a pattern, so it
  would write checkpoints that it then cannot read."""
  if "://" in str(path):
    raise ValueError(f"{what} {path!r} is a URL; give a local path (a bucket mounted with "
                     "gcsfuse, say)")
  if re.search(r"[][]", os.path.abspath(path)):
    raise ValueError(f"{what} {os.path.abspath(path)!r} has '[' or ']' in its path, which "
                     "Orbax reads as a glob pattern (its checkpoints could not be read "
                     "back); use a path without them")


def pid_alive(pid: int) -> bool:
  """Whether a process of this host has that pid (another user's included)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def temporary_path(path: str) -> str:
  """`path`.tmp<pid>@<host>: this process's temporary for `path`. The host
  tells a workdir on a shared file system which host's pid it is, and makes
  the name one that no file of a user's is likely to have."""
  return f"{path}{TMP_INFIX}{os.getpid()}@{socket.gethostname()}"


def remove_dead_temporaries(directory: str) -> None:
  """Removes the NAME.tmp<pid>@<this host> files and directories in `directory`
  whose process is dead: what a writer killed mid-write left (they are never
  read). Only the workdir's writer calls it, holding its lock
  (transformer/lock.py); a live process's temporaries (an evaluation writing its
  results) and other hosts' are kept."""
  own = re.escape(TMP_INFIX) + r"(\d+)@" + re.escape(socket.gethostname())
  for name in os.listdir(directory):
    found = re.fullmatch(r".+" + own, name)
    if not found or pid_alive(int(found.group(1))):
      continue
    path = os.path.join(directory, name)
    logging.warning("Removing %s, left by a process killed while writing it.", path)
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path):
  """Yields a temporary path to write; renames it to `path` if the block ends
  normally, removes it if not. A symlink is written through (its target is
  replaced, the link kept), and a path that exists but is not a regular file (a
  device, a pipe) is yielded itself: renaming over it would replace it."""
  if os.path.islink(path):
    path = os.path.realpath(path)
  if os.path.exists(path) and not os.path.isfile(path):
    yield path
    return
  tmp = temporary_path(path)
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


@contextlib.contextmanager
def naming(path):
  """An OSError raised within without a file name (a write's or a close's full
  disk, ENOSPC, or file size limit, EFBIG) is raised again naming `path`: the
  one line a command prints then says which file could not be written."""
  try:
    yield
  except OSError as e:
    if e.filename is not None or not e.errno:
      raise
    raise OSError(e.errno, e.strerror, str(path)) from e


def write_atomic(path, data) -> None:
  """Writes `data` (str as UTF-8, or bytes) to `path` atomically."""
  with naming(path), atomic_path(path) as tmp:
    if isinstance(data, bytes):
      with open(tmp, "wb") as f:
        f.write(data)
    else:
      with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)


def write_lines(out, lines) -> None:
  """Writes `lines` to the open text file `out`, one a line, and flushes them (a
  killed run keeps every line written); a full disk names the file. (An
  unbuffered stdout is made to write whole texts first: streams.whole_writes.)"""
  with naming(getattr(out, "name", out)):
    out.write("".join(line + "\n" for line in lines))
    out.flush()


PARTIAL_SUFFIX = ".partial"


class BusyError(runtime.CommandError):
  """Another run is writing the same output file."""


def check_output(path: str, flag: str) -> None:
  """A ValueError naming `flag` for an output file that cannot be written (a
  directory at its path, or its folder missing): commands check before any
  work, so that a bad path does not throw away what they computed. An empty
  path, or one ending in '/', names no file (abspath would make them the current
  folder and the folder itself)."""
  if not path:
    raise ValueError(f"{flag} is empty; give a file name")
  if path.endswith(os.sep):
    raise ValueError(f"{flag} {path!r}: ends in {os.sep!r}, a folder; give a file name")
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise ValueError(f"{flag} {path!r}: is a directory; give a file name")
  if not os.path.isdir(folder):
    raise ValueError(f"{flag} {path!r}: its folder {folder!r} does not exist")


def writes_through_partial(path: str) -> bool:
  """Whether `path` is written as `path`.partial and renamed: a regular file or
  a new name. A symlink, a device (/dev/null) or a pipe (/dev/fd/N) is written
  directly: renaming over it would replace it."""
  return not os.path.lexists(path) or (os.path.isfile(path) and not os.path.islink(path))


def open_partial(path: str):
  """`path`.partial, opened empty for writing and locked (flock) while open:
  output streamed there stays inspectable if the run dies, and `path` itself
  is never half written. A second run writing the same `path` meanwhile stops
  with BusyError instead of emptying the first one's file and writing into it.
  The caller renames it with commit_partial, then closes it with close_partial."""
  partial = path + PARTIAL_SUFFIX
  out = open(partial, "a", encoding="utf-8")  # pylint: disable=consider-using-with
  try:
    fcntl.flock(out, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    out.close()
    raise BusyError(f"another run is writing {partial}: wait for it to end (or stop it) and "
                    "rerun") from None
  except OSError:  # A file system without flock: one run at a time is assumed.
    pass
  out.truncate(0)
  return out


def commit_partial(out, path: str) -> None:
  """Gives the open_partial file `out` its final name `path`: renamed while
  still locked, so that no other run can have taken it."""
  with naming(out.name):
    out.flush()
  os.replace(path + PARTIAL_SUFFIX, path)


def close_partial(out, path: str) -> None:
  """Closes the open_partial file `out` of `path`; one a failed run wrote
  nothing into is removed first, still locked (what a run wrote stays), unless
  it was renamed already and the name is another run's."""
  partial = path + PARTIAL_SUFFIX
  try:
    ours = os.path.samestat(os.fstat(out.fileno()), os.stat(partial))
  except FileNotFoundError:
    ours = False
  if out.tell() == 0 and ours:
    os.remove(partial)
  with naming(out.name):
    out.close()


def read_json_object(path: str) -> Optional[dict]:
  """A JSON file's object; None, with a warning naming the file, where it is
  damaged: its reader goes on without it (a table leaves its figures blank)."""
  try:
    with open(path) as f:
      value = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    logging.warning("Skipping %s: not valid JSON (%s).", path, e)
    return None
  if not isinstance(value, dict):
    logging.warning("Skipping %s: a %s, not a JSON object.", path, type(value).__name__)
    return None
  return value
