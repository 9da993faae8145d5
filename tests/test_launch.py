"""The local launcher with stand-in commands (no JAX): each process's variables
and prefixed output, and a failed job ended and reported, not left running.
(Jobs of JAX processes: tests/test_multiprocess.py.)"""

import io
import os
import signal
import socket
import subprocess
import sys
import time

from transformer import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRINT_ENV = ("import os; print(*(os.environ.get(k) for k in ('JAX_COORDINATOR_ADDRESS', "
             "'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID', 'XLA_FLAGS', 'JAX_PLATFORMS')))")


def python(code, index_code=None):
  """A command running `code`, or in process 1 `index_code`."""
  if index_code is not None:
    code = f"import os\nif os.environ['JAX_PROCESS_ID'] == '1':\n  {index_code}\n{code}"
  return [sys.executable, "-c", code]


def test_each_process_gets_its_variables_and_a_prefix():
  out = subprocess.run([sys.executable, "-m", "transformer.launch", "--processes=3",
                        "--devices_per_process=2", "--port=4567", "--", sys.executable,
                        "-c", PRINT_ENV], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, XLA_FLAGS="--xla_foo=1"))
  assert out.returncode == 0, out.stdout + out.stderr
  for i in range(3):
    assert (f"[p{i}] 127.0.0.1:4567 3 {i} --xla_foo=1 "
            "--xla_force_host_platform_device_count=2 cpu\n") in out.stdout
    assert f"[launch] process {i}: exited with status 0\n" in out.stdout


def test_a_failure_ends_the_others_after_the_grace_period():
  out = io.StringIO()
  code = launch.launch(python("import time; time.sleep(60)", "raise SystemExit(3)"), 2,
                       grace_s=0.5, out=out)
  text = out.getvalue()
  assert code == 3, text
  assert "[launch] process 0: killed by SIGTERM (by the launcher)" in text
  assert "[launch] process 1: exited with status 3\n" in text
  assert "[launch] failed: process 1 exited with status 3 first" in text


def test_a_job_that_fails_by_itself_is_reported_in_order():
  out = io.StringIO()
  code = launch.launch(python("import time; time.sleep(1); raise SystemExit(1)",
                              "import signal; os.kill(os.getpid(), signal.SIGKILL)"),
                       2, grace_s=30, out=out)
  text = out.getvalue()
  assert code == 128 + 9, text
  assert "[launch] process 0: exited with status 1\n" in text  # Not by the launcher.
  assert "[launch] failed: process 1 killed by SIGKILL first" in text


def test_a_stopped_process_that_others_fail_waiting_for_is_named():
  """Process 1 stops (SIGSTOP: alive and silent), process 0 then fails, as it
  would timing out in a collective with it: the launcher names the stopped one
  beside the first failure, which alone would point at process 0."""
  out = io.StringIO()
  code = launch.launch(python("import time; time.sleep(1); raise SystemExit(1)",
                              "import signal; os.kill(os.getpid(), signal.SIGSTOP)"),
                       2, grace_s=0.5, out=out)
  text = out.getvalue()
  assert code == 1, text
  assert ("[launch] process 1 is stopped (SIGSTOP or a debugger): process 0 may have failed "
          "waiting for it\n") in text
  assert "[launch] process 1: killed by SIGTERM (by the launcher)" in text
  assert not launch.is_stopped(os.getpid())


class _QuitAfter(io.StringIO):
  """An output whose reader quits (`| head -3`) after `lines` writes."""

  def __init__(self, lines):
    super().__init__()
    self.left = lines

  def write(self, text):
    if self.left <= 0:
      raise BrokenPipeError(32, "Broken pipe")
    self.left -= 1
    return super().write(text)


def test_a_reader_that_quits_does_not_block_the_processes():
  """Output past a closed pipe is read and dropped: the processes, writing more
  than a pipe holds, still finish (they blocked on a full pipe, to the limit)."""
  out = _QuitAfter(3)
  code = launch.launch(python("print(('x' * 99 + '\\n') * 3000, flush=True)"), 2, timeout_s=20,
                       out=out)
  assert code == 0
  assert "killed" not in out.getvalue()


def test_a_port_in_use_is_named_as_the_flag():
  with socket.socket() as taken:
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "transformer.launch", "--processes=2",
                          f"--port={port}", "--", sys.executable, "-c", "pass"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
  assert out.stderr.strip().splitlines()[-1] == (
      f"launch: error: --port={port} is in use on this host; choose another, or leave --port "
      "out for a free one")


def test_a_job_past_its_time_limit_is_ended():
  out = io.StringIO()
  code = launch.launch(python("import time; time.sleep(60)"), 2, timeout_s=0.5, out=out)
  text = out.getvalue()
  assert code == 124, text
  assert "[launch] failed: the job ran past --timeout_s=0.5" in text
  assert text.count("killed by SIGTERM (by the launcher)") == 2


def test_terminated_processes_get_the_stop_grace_together_and_unnamed_signals_are_named():
  """A process saving on SIGTERM (as train.py does) longer than one child's wait
  still ends by itself within --stop_grace_s; one killed by a real-time signal is
  reported by its number."""
  saves_then_ends = ("import signal, sys, time\n"
                     "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(143)))\n"
                     "time.sleep(60)")
  out = io.StringIO()
  code = launch.launch(python(saves_then_ends), 2, timeout_s=0.5, stop_grace_s=10, out=out)
  text = out.getvalue()
  assert code == 124, text
  assert text.count("exited with status 143 (by the launcher)") == 2, text
  out = io.StringIO()  # A grace shorter than the save: SIGKILL.
  launch.launch(python(saves_then_ends), 2, timeout_s=0.5, stop_grace_s=0.5, out=out)
  assert out.getvalue().count("killed by SIGKILL (by the launcher)") == 2, out.getvalue()
  out = io.StringIO()
  code = launch.launch(python("import time; time.sleep(60)", "os.kill(os.getpid(), 40)"), 2,
                       grace_s=0.5, stop_grace_s=0, out=out)
  text = out.getvalue()
  assert code == 128 + 40, text
  assert "[launch] failed: process 1 killed by signal 40 first" in text



def _wait_gone(pid, within_s=10.0) -> bool:
  """Whether process `pid` has ended (and been reaped) within `within_s`."""
  deadline = time.monotonic() + within_s
  while time.monotonic() < deadline:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return True
    time.sleep(0.05)
  return False


def test_a_ctrl_c_at_the_terminal_reaches_each_process_once_as_the_launchers_sigterm():
  """A terminal's Ctrl-C goes to its whole foreground process group. The
  processes got it, then the launcher's SIGTERM 0.1 s later: train.py took the
  second signal as 'stop at once' and saved nothing. Each process now has a group
  of its own, and gets one SIGTERM from the launcher."""
  records = ("import signal, sys, time\n"
             "def got(signum, _):\n"
             "  print('got', signal.Signals(signum).name, flush=True)\n"
             "  time.sleep(1)\n"
             "  sys.exit(143)\n"
             "signal.signal(signal.SIGTERM, got)\n"
             "signal.signal(signal.SIGINT, got)\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
  job = subprocess.Popen([sys.executable, "-m", "transformer.launch", "--processes=2", "--",
                          sys.executable, "-c", records], cwd=ROOT, stdout=subprocess.PIPE,
                         text=True, start_new_session=True)  # As a terminal's foreground job.
  ready = 0
  for line in job.stdout:
    ready += line.endswith("] ready\n")
    if ready == 2:
      break
  os.killpg(job.pid, signal.SIGINT)  # Ctrl-C: the launcher's whole group.
  rest = job.stdout.read()
  assert job.wait(timeout=60) == 130, rest
  assert rest.count("] got SIGTERM") == 2 and "] got SIGINT" not in rest, rest
  assert rest.count("exited with status 143 (by the launcher)") == 2, rest


def test_what_a_stopped_process_started_ends_with_it():
  """A shell or script around the real command: the launcher's SIGTERM reached
  the wrapper alone, and what it had started ran on after the job ended."""
  starts = ("import subprocess, sys, time\n"
            "print(subprocess.Popen(['sleep', '60']).pid, flush=True)\n"
            "time.sleep(60)\n")
  out = io.StringIO()
  assert launch.launch(python(starts), 2, timeout_s=1, stop_grace_s=5, out=out) == 124
  pids = [int(line.split()[-1]) for line in out.getvalue().splitlines()
          if line.startswith("[p") and line.split()[-1].isdigit()]
  assert len(pids) == 2, out.getvalue()
  assert all(_wait_gone(pid) for pid in pids), pids


def test_bad_port_timeout_and_command_are_one_line_each():
  for flag, message in (("--port=70000", "--port=70000"), ("--port=-5", "--port=-5"),
                        ("--timeout_s=0", "--timeout_s=0 must be > 0"),
                        # NaN passed absl's bounds: no limit, no grace, an instant SIGKILL.
                        ("--timeout_s=nan", "--timeout_s=nan must be > 0 and finite"),
                        ("--grace_s=nan", "--grace_s=nan must be >= 0 and finite"),
                        ("--stop_grace_s=nan", "--stop_grace_s=nan must be >= 0 and finite"),
                        (None, "launch: error: no command: python -m transformer.launch "
                         "[flags] -- COMMAND ...")):  # Was absl's whole usage.
    command = [flag, "--", sys.executable, "-c", "pass"] if flag else []
    out = subprocess.run([sys.executable, "-m", "transformer.launch", *command], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error: ") and message in lines[0], (
        out.stderr)
  out = subprocess.run([sys.executable, "-m", "transformer.launch", "--",
                        "no_such_command_here", "x"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
  assert out.stderr.strip().splitlines()[-1] == (
      "launch: error: no such command: 'no_such_command_here'")
