"""Runs a command as an N-process JAX job on this machine: multi-process code
tried and tested without a cluster.

  python -m transformer.launch --processes 2 --devices_per_process 2 -- \\
      train.py --config configs/default.py --workdir runs/default_mp

Process i gets JAX_COORDINATOR_ADDRESS=127.0.0.1:<a free port>,
JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=i (transformer/distributed.py reads
them) and, with --devices_per_process D, D CPU devices (XLA_FLAGS,
JAX_PLATFORMS=cpu). A command whose first word ends in .py or is -m runs under
this Python. Output lines come prefixed with [p<i>]; stdin is not shared (give
translate an --input file).

Each process runs in a process group of its own: a Ctrl-C at the terminal
reaches the launcher alone, which passes it on as one SIGTERM to each process
(a second signal would stop train.py before it saves), and a signal the
launcher sends reaches what the process started too (a shell's children).

A job fails as a whole: once a process fails, the others get --grace_s seconds
to end by themselves (a JAX process notices a dead peer within
config.distributed.heartbeat_timeout_s), then are terminated. The exit status is
then non-zero (the first failure's status, or 128 + its signal) and the last
lines say how each process ended and which failed first; a process found stopped
then (SIGSTOP, a debugger), which the others may have failed waiting for, is
named too. --timeout_s bounds the whole job the same way.
"""

import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from transformer import distributed, runtime

_POLL_S = 0.1


def free_port() -> int:
  """A TCP port nothing listens on now (the OS's pick)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(environ, port, processes, index, devices_per_process=None) -> dict:
  """`environ` plus the variables that make a process process `index` of the job."""
  env = dict(environ, **{distributed.ADDRESS: f"127.0.0.1:{port}",
                         distributed.COUNT: str(processes), distributed.INDEX: str(index)})
  if devices_per_process:
    env.update(cpu_devices(environ, devices_per_process))
  return env


def cpu_devices(environ, count) -> dict:
  """XLA_FLAGS and JAX_PLATFORMS for `count` CPU devices; `environ`'s other XLA
  flags are kept, its device count replaced."""
  flags_ = re.sub(r"--xla_force_host_platform_device_count=\S*", "", environ.get("XLA_FLAGS", ""))
  return {"XLA_FLAGS": " ".join(filter(None, [flags_.strip(),
                                              f"--xla_force_host_platform_device_count={count}"])),
          "JAX_PLATFORMS": "cpu"}


def command_line(command) -> list:
  """A .py script or -m module runs under this Python; anything else as given."""
  if command and (command[0] == "-m" or command[0].endswith(".py")):
    return [sys.executable] + list(command)
  return list(command)


def how_it_ended(returncode) -> str:
  if returncode < 0:
    try:
      return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:  # A number Python does not name (a real-time signal).
      return f"killed by signal {-returncode}"
  return f"exited with status {returncode}"


# Linux: each child asks for SIGTERM should the launcher die (even by SIGKILL), so
# that no process of a job is left behind; the request survives exec (train.py
# re-executes itself). The child makes it itself before exec'ing the command, not a
# preexec_fn: Python code between fork and exec in a threaded parent can deadlock.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit('launcher gone')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")


def child_command(command) -> list:
  """`command` (command_line's) as a child that gets SIGTERM should this process die."""
  if not sys.platform.startswith("linux"):
    return command_line(command)
  return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid())] + command_line(command)


def _signal_group(child, signum) -> None:
  """`signum` to the child's process group (the child and what it started)."""
  with contextlib.suppress(ProcessLookupError, PermissionError):  # The group has ended.
    os.killpg(child.pid, signum)


def is_stopped(pid: int) -> bool:
  """Whether process `pid` is stopped (SIGSTOP, SIGTSTP, a debugger): its state in
  /proc (Linux); False where that cannot be read."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rpartition(")")[2].split()[0] in ("T", "t")
  except (OSError, IndexError):
    return False


def _pump(stream, prefix, out, lock):
  """Copies a process's output lines to `out`, prefixed. Once `out` is gone (a
  reader that quit: `| head`), the rest is read and dropped, so that the process
  never blocks writing to a full pipe."""
  for line in iter(stream.readline, b""):
    if out is None:
      continue
    with lock:
      try:
        out.write(prefix + line.decode("utf-8", "replace"))
        out.flush()
      except (BrokenPipeError, ValueError):  # ValueError: `out` closed.
        out = None
  stream.close()


def launch(command, processes, devices_per_process=None, port=None, grace_s=30.0,
           timeout_s=None, out=sys.stdout, environ=None, stop_grace_s=60.0) -> int:
  """Runs `command` (a list) as processes 0..N-1 of one job; returns the exit
  status: 0 if every process exited with 0. Processes the launcher terminates get
  `stop_grace_s` together to end (train.py saves a checkpoint first) before
  SIGKILL."""
  if processes < 1:
    raise ValueError(f"--processes={processes} must be >= 1")
  if port is not None and not 0 < port < 65536:
    raise ValueError(f"--port={port} must be in 1..65535")
  if timeout_s is not None and not 0 < timeout_s < math.inf:  # NaN too: it compares False.
    raise ValueError(f"--timeout_s={timeout_s:g} must be > 0 and finite (leave it out for no "
                     "limit)")
  for name, value in (("grace_s", grace_s), ("stop_grace_s", stop_grace_s)):
    if not 0 <= value < math.inf:
      raise ValueError(f"--{name}={value:g} must be >= 0 and finite")
  if not command or shutil.which(command_line(command)[0]) is None:
    raise ValueError(f"no such command: {command_line(command)[0] if command else '(none)'!r}")
  if port and distributed.port_in_use(port):  # Said here, not as a variable's problem.
    raise ValueError(f"--port={port} is in use on this host; choose another, or leave "
                     "--port out for a free one")
  port = port or free_port()
  environ = os.environ if environ is None else environ
  lock = threading.Lock()

  def say(message):
    with lock, contextlib.suppress(BrokenPipeError, ValueError):  # A reader that quit.
      out.write(f"[launch] {message}\n")
      out.flush()

  say(f"{processes} processes, coordinator 127.0.0.1:{port}: {' '.join(command)}")
  children = []
  for i in range(processes):
    children.append(subprocess.Popen(
        child_command(command), env=process_env(environ, port, processes, i,
                                                 devices_per_process),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True))  # Its own process group (see the module's docstring).
    say(f"process {i}: pid {children[-1].pid}")
  pumps = [threading.Thread(target=_pump, args=(c.stdout, f"[p{i}] ", out, lock),
                            daemon=True) for i, c in enumerate(children)]
  ended = []  # Process indices in the order they ended: which failed first.

  def wait_for(i):
    children[i].wait()
    ended.append(i)

  waiters = [threading.Thread(target=wait_for, args=(i,), daemon=True)
             for i in range(processes)]
  for t in pumps + waiters:
    t.start()

  stopped = []  # Processes the launcher ended.
  stop_reason = []  # (why, exit status) when the launcher ends the job itself.

  def on_signal(signum, _):
    stop_reason.append((f"the launcher got {signal.Signals(signum).name}", 128 + signum))

  previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
  start, first_failure, deadline = time.monotonic(), None, None
  try:
    while any(c.poll() is None for c in children):
      now = time.monotonic()
      if first_failure is None:
        failed = [i for i in list(ended) if children[i].returncode != 0]
        if failed:
          first_failure = failed[0]
          say(f"process {first_failure} {how_it_ended(children[first_failure].returncode)}; "
              f"waiting up to {grace_s:g} s for the others to end")
          deadline = now + grace_s
          # A stopped process fails nothing itself, but the others time out waiting
          # for it in a collective: it, not the first to fail, is then the cause.
          frozen = [i for i, c in enumerate(children) if c.poll() is None and is_stopped(c.pid)]
          if frozen:
            say(f"process{'es' if len(frozen) > 1 else ''} {', '.join(map(str, frozen))} "
                f"{'are' if len(frozen) > 1 else 'is'} stopped (SIGSTOP or a debugger): "
                f"process {first_failure} may have failed waiting for "
                f"{'them' if len(frozen) > 1 else 'it'}")
      if timeout_s and now - start > timeout_s and not stop_reason:
        stop_reason.append((f"the job ran past --timeout_s={timeout_s:g}", 124))
      if stop_reason or (deadline is not None and now > deadline):
        reason = (stop_reason[0][0] if stop_reason
                  else f"{grace_s:g} s after the first failure")
        for i, c in enumerate(children):
          if c.poll() is None:
            _signal_group(c, signal.SIGTERM)
            _signal_group(c, signal.SIGCONT)  # A stopped process acts on SIGTERM once continued.
            stopped.append(i)
        say(f"terminating processes {stopped}: {reason}; SIGKILL after "
            f"{stop_grace_s:g} s")
        kill_at = time.monotonic() + stop_grace_s
        for c in children:
          try:
            c.wait(timeout=max(0.0, kill_at - time.monotonic()))
          except subprocess.TimeoutExpired:
            _signal_group(c, signal.SIGKILL)
            c.wait()
        break
      time.sleep(_POLL_S)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    for i, c in enumerate(children):
      if c.poll() is None:
        _signal_group(c, signal.SIGKILL)
        c.wait()
      if i in stopped:  # What a stopped process started ends with it.
        _signal_group(c, signal.SIGKILL)
    for t in pumps + waiters:
      t.join(timeout=5)

  codes = [c.returncode for c in children]
  for i, code in enumerate(codes):
    note = " (by the launcher)" if i in stopped else ""
    say(f"process {i}: {how_it_ended(code)}{note}")
  if first_failure is None:
    failed = [i for i in ended if codes[i] != 0 and i not in stopped]
    first_failure = failed[0] if failed else None
  if first_failure is not None:
    code = codes[first_failure]
    say(f"failed: process {first_failure} {how_it_ended(code)} first")
    return code if code > 0 else 128 - code
  if stop_reason:
    say(f"failed: {stop_reason[0][0]}")
    return stop_reason[0][1]
  return 0


def define_flags():
  """Defined when run (as sweep's and evaluate's), so that importing this module
  (sweep does, for child_command) defines no flags."""
  flags.DEFINE_integer("processes", 2, "Processes in the job.", lower_bound=1)
  flags.DEFINE_integer("devices_per_process", None, "CPU devices each process gets; unset: "
                       "the platform's own devices.", lower_bound=1)
  flags.DEFINE_integer("port", None, "Coordinator port; default: a free one.",
                       lower_bound=1, upper_bound=65535)
  flags.DEFINE_float("grace_s", 30.0, "Seconds the others get to end by themselves once a "
                     "process has failed.", lower_bound=0.0)
  flags.DEFINE_float("timeout_s", None, "Terminate the job after this many seconds (> 0); "
                     "unset: no limit.")
  flags.DEFINE_float("stop_grace_s", 60.0, "Seconds terminated processes get (to save a "
                     "checkpoint) before SIGKILL.", lower_bound=0.0)


def main(argv):
  if len(argv) < 2:
    sys.exit("launch: error: no command: python -m transformer.launch [flags] -- COMMAND ...")
  try:
    f = flags.FLAGS
    code = launch(argv[1:], f.processes, f.devices_per_process, f.port, f.grace_s,
                  f.timeout_s, stop_grace_s=f.stop_grace_s)
  except ValueError as e:  # A bad flag: one line, not a traceback.
    sys.exit(f"launch: error: {e}")
  sys.exit(code)


if __name__ == "__main__":
  define_flags()
  runtime.run(main, "launch")
