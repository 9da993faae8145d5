"""One workdir, one writer: WORKDIR/LOCK, held by training and average_checkpoints.

Two writers on one workdir would interleave checkpoints, delete each other's
unfinished saves and race on config.json. So a writer takes an exclusive
flock(2) on WORKDIR/LOCK for as long as it runs and writes its host, pid,
command and start time into the file: a second writer stops at once with a
message naming the first. The kernel drops the flock when its holder dies,
however it dies (kill -9 included), so a LOCK file left behind by a dead
process is taken over, with a warning naming that process. A clean exit
removes the file, and so does a SIGTERM during train.py's start-up or
average_checkpoints (transformer/sigterm.py).

Where the filesystem cannot flock (some network filesystems), the recorded pid
is checked instead: a lock whose pid is dead on this host is stale; a lock of
another host is never taken over (delete the file once that job is gone). A
stale lock is removed under a guard file that one process at a time creates,
and only if it still holds the record judged stale: a process that took the
lock over meanwhile keeps it.

Holding the lock, a writer removes the temporaries that dead writers of its
host left (files.remove_dead_temporaries): no other writer can be using them.
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time

from absl import logging

from transformer import files, runtime, sigterm

LOCK_NAME = "LOCK"
TAKEOVER_SUFFIX = ".takeover"  # LOCK.takeover: held while a stale LOCK is removed (no flock).
# flock's answers on a filesystem that does not implement it.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class WorkdirBusyError(runtime.CommandError):
  """Another live process writes this workdir."""


def _process_start(pid):
  """The kernel's start time of `pid` (clock ticks since boot; None where /proc
  has none), which tells a live owner from a later process given its pid."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _pid_alive(pid, start=None) -> bool:
  """Alive, and (where its start time was recorded) not a later process given the pid."""
  return files.pid_alive(pid) and (start is None or _process_start(pid) in (None, start))


def describe(owner) -> str:
  """`train (pid 123 on host h, since 2025-01-01 12:00:00)` of a lock's owner record."""
  if not owner:
    return "a process that has not yet written its name into the lock"
  since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("time", 0)))
  return (f"{owner.get('command', '?')} (pid {owner.get('pid', '?')} on host "
          f"{owner.get('host', '?')}, since {since})")


def _read_owner(path):
  """The owner record in the lock at `path`: None where there is none to read
  (gone, written half-way by a killed owner, or not a record: edited by hand)."""
  try:
    with open(path) as f:
      owner = json.loads(f.read() or "null")
  except (OSError, ValueError):
    return None
  return owner if isinstance(owner, dict) else None


def _owner_alive(owner) -> bool:
  """Whether a lock's owner record may be a live process, as this host can tell
  by pid: one of another host, or a record not yet written (or without a pid),
  counts as alive."""
  if (not owner or owner.get("host") != socket.gethostname()
      or not isinstance(owner.get("pid"), int)):
    return True
  return _pid_alive(owner["pid"], owner.get("start"))


def held(workdir: str) -> bool:
  """Whether a live process holds `workdir`'s lock, as this host can tell from
  the owner record alone (a reader takes no flock: a writer taking the lock
  meanwhile would find it busy); a dead owner's left-behind file does not."""
  path = os.path.join(workdir, LOCK_NAME)
  if not os.path.exists(path):
    return False  # Released: a writer removes it on exit.
  return _owner_alive(_read_owner(path))


class WorkdirLock:
  """The exclusive right to write `workdir`; a context manager, or acquire()/release()."""

  def __init__(self, workdir: str, command: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_NAME)
    self.command = command
    self._fd = None
    self._forget = lambda: None  # Takes back sigterm.release_first's registration.

  def _record(self):
    return {"host": socket.gethostname(), "pid": os.getpid(), "command": self.command,
            "argv": " ".join(sys.argv), "time": time.time(),
            "start": _process_start(os.getpid())}

  def _busy(self, owner, note=""):
    return WorkdirBusyError(
        f"workdir {self.workdir} is being written by {describe(owner)}: one workdir has one "
        f"writer. Wait for it to finish or stop it, or use another workdir (its lock: "
        f"{self.path}){note}.")

  def acquire(self) -> "WorkdirLock":
    try:
      os.makedirs(self.workdir, exist_ok=True)
      while True:
        try:
          fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
          try:
            fd, created = os.open(self.path, os.O_RDWR), False
          except FileNotFoundError:  # Its holder released it meanwhile.
            continue
        try:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          os.close(fd)
          raise self._busy(_read_owner(self.path)) from None
        except OSError as e:
          os.close(fd)
          if e.errno not in _NO_FLOCK:
            raise
          if created:  # Empty: the pid check would take it for a live owner's.
            os.remove(self.path)
          return self._acquire_by_pid()
        # A holder that released the lock meanwhile removed the file we opened:
        # lock the file now at the path instead.
        try:
          if os.path.samestat(os.fstat(fd), os.stat(self.path)):
            break
        except FileNotFoundError:
          pass
        os.close(fd)
      self._fd = fd
      previous = _read_owner(self.path)
      if previous is not None:
        logging.warning("Took over the lock of workdir %s from %s, which is no longer "
                        "running (killed, or its machine went down).", self.workdir,
                        describe(previous))
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(self._record()).encode(), 0)
      self._forget = sigterm.release_first(self.release)
      files.remove_dead_temporaries(self.workdir)
    except OSError as e:  # Not a directory, no permission, a read-only filesystem...
      a_file = os.path.exists(self.workdir) and not os.path.isdir(self.workdir)
      raise runtime.CommandError(f"workdir {self.workdir} cannot be used: " + (
          "it is a file, not a directory" if a_file else f"{e.strerror or e}")) from e
    return self

  def _acquire_by_pid(self):
    """acquire() without flock: the recorded owner's pid decides (see above)."""
    logging.warning("%s cannot be flock()ed on this filesystem; judging its owner by pid.",
                    self.path)
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
      except FileExistsError:
        owner = _read_owner(self.path)
        if _owner_alive(owner):
          raise self._busy(owner) from None
        self._take_over(owner)
        continue
      os.write(fd, json.dumps(self._record()).encode())
      self._fd = fd
      self._forget = sigterm.release_first(self.release)
      files.remove_dead_temporaries(self.workdir)
      return self
    raise self._busy(_read_owner(self.path))

  def _take_over(self, stale) -> None:
    """Removes the lock file whose owner record `stale` was judged dead, holding
    a guard file (LOCK.takeover, created exclusively: one process at a time).
    While the guard exists no other process removes LOCK, and none can create it
    while it is there, so the record read again under the guard is the one
    removed: a process that took the lock over in the meantime keeps it."""
    guard = self.path + TAKEOVER_SUFFIX
    try:
      fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # Another takeover is under way: its owner will hold the lock.
      raise self._busy(_read_owner(self.path) or _read_owner(guard),
                       f" (or remove {guard} if no process is starting: a takeover "
                       "was interrupted there)") from None
    try:
      os.write(fd, json.dumps(self._record()).encode())
      owner = _read_owner(self.path)
      if owner != stale:  # Taken over (or released) since it was read.
        if owner is None and not os.path.lexists(self.path):
          return  # Released: create it anew.
        raise self._busy(owner)
      logging.warning("Took over the lock of workdir %s from %s, which is no longer "
                      "running.", self.workdir, describe(stale))
      os.remove(self.path)
    finally:
      try:
        os.close(fd)
      finally:
        os.remove(guard)

  def release(self) -> None:
    """Removes the file (a clean exit leaves nothing to take over) and unlocks."""
    if self._fd is None:
      return
    try:
      if os.path.samestat(os.fstat(self._fd), os.stat(self.path)):
        os.remove(self.path)
    except OSError:
      pass
    os.close(self._fd)
    self._fd = None
    self._forget()

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


def hold(workdir: str, command: str, primary: bool = True):
  """WorkdirLock(workdir, command) where `primary` (process 0 of a multi-host
  run; the others write through it), else a context that only makes the workdir."""
  files.check_local(workdir)
  if primary:
    return WorkdirLock(workdir, command)
  os.makedirs(workdir, exist_ok=True)
  return contextlib.nullcontext()
