"""The commands re-execute themselves once with a faster allocator set up, and
keep TensorFlow's start-up notes off their stderr."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import process_helpers
from transformer import runtime

SCRIPT = ("import json, os, sys; from transformer import runtime; runtime.use_fast_malloc(); "
          "print(json.dumps({k: os.environ.get(k) for k in ('GLIBC_TUNABLES', 'LD_PRELOAD', "
          "'TCMALLOC_RELEASE_RATE')}))")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = ("GLIBC_TUNABLES", "TRANSFORMER_DEFAULT_MALLOC", "TRANSFORMER_TCMALLOC", "LD_PRELOAD",
        runtime.RESTARTED_ENV, *runtime.TCMALLOC_ENV)


def run(stderr=None, **env):
  base = {k: v for k, v in os.environ.items() if k not in OURS}
  out = subprocess.run([sys.executable, "-c", SCRIPT], env={**base, **env}, cwd=ROOT,
                       capture_output=True, text=True, check=True)
  if stderr is not None:
    stderr.append(out.stderr)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_restart_says_what_it_did_and_how_to_turn_it_off():
  stderr = []
  run(stderr=stderr)
  lines = [l for l in stderr[0].splitlines() if l.startswith("[transformer] restarted")]
  assert len(lines) == 1
  assert "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in lines[0]
  assert "TRANSFORMER_DEFAULT_MALLOC=1 turns this off" in lines[0]
  run(stderr=stderr, TRANSFORMER_DEFAULT_MALLOC="1")
  assert "restarted" not in stderr[1]


def test_compilation_cache_directory_and_off_switch(tmp_path):
  script = ("import jax; from transformer import runtime; print(runtime.use_compilation_cache()); "
            "print(jax.config.jax_compilation_cache_dir)")

  def cache(value=None):
    env = {k: v for k, v in os.environ.items() if k != runtime.CACHE_ENV}
    if value is not None:
      env[runtime.CACHE_ENV] = value
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.split()

  assert cache(str(tmp_path)) == [str(tmp_path)] * 2
  default = os.path.expanduser(os.path.join("~", ".cache", "transformer", "jax"))
  assert cache() == [default] * 2
  assert cache("0") == ["None", "None"]


def test_a_ctrl_c_swallowed_where_it_was_raised_still_stops_training():
  """Python raises a SIGINT's KeyboardInterrupt wherever the main thread is: in
  a callback that swallows exceptions (JAX's garbage-collection callback), it
  was lost, and a Ctrl-C at start-up let training run to its last step. Here a
  __del__ swallows it; the check before the training loop raises it again."""
  out = _swallowed_ctrl_c("train", "  runtime.raise_lost_interrupt()\n"
                                   "  print('trained to the end', flush=True)\n")
  assert out.stdout == "went on\n" and "Exception ignored" in out.stderr, out
  assert out.stderr.endswith("train: interrupted\n") and out.returncode == -signal.SIGINT, out


def test_a_ctrl_c_swallowed_in_a_command_still_ends_it_by_sigint():
  """evaluate or translate with a swallowed Ctrl-C finished and exited 0, and a
  shell loop over them went on: the command's block ends as interrupted."""
  out = _swallowed_ctrl_c("evaluate", "  print('decoded', flush=True)\n")
  assert out.stdout == "went on\ndecoded\n" and "Exception ignored" in out.stderr, out
  assert out.stderr.endswith("evaluate: interrupted\n") and out.returncode == -signal.SIGINT, out


def test_a_ctrl_c_at_start_up_ends_the_command_in_one_line_until_its_block_takes_over():
  """A Ctrl-C while a command imported (before one_line_errors) printed a
  KeyboardInterrupt traceback (or an extension's ImportError, or was lost in
  use_fast_malloc's restart): end_at_interrupt ends it at once, in one line, by
  SIGINT; inside the block the Ctrl-C is remembered and raised as before."""
  script = ("import signal, sys\n"
            "from transformer import runtime\n"
            "runtime.end_at_interrupt('translate')\n"
            "if sys.argv[1] == 'block':\n"
            "  with runtime.one_line_errors('translate'):\n"
            "    signal.raise_signal(signal.SIGINT)\n"
            "    print('not here', flush=True)\n"
            "signal.raise_signal(signal.SIGINT)\n"
            "print('went on', flush=True)\n")
  for where in ("start-up", "block"):
    out = subprocess.run(_as_from_a_terminal([sys.executable, "-c", script, where]), cwd=ROOT,
                         capture_output=True, text=True)
    assert out.stdout == "" and out.stderr == "translate: interrupted\n", (where, out)
    assert out.returncode == -signal.SIGINT, (where, out)
  # Started ignoring SIGINT (`cmd &` in a script): the Ctrl-C is the foreground's.
  ignoring = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, "
              "signal.SIG_IGN); os.execvp(sys.argv[1], sys.argv[1:])"]
  out = subprocess.run([*ignoring, sys.executable, "-c", script, "block"], cwd=ROOT,
                       capture_output=True, text=True)
  assert out.returncode == 0 and out.stdout == "not here\nwent on\n", out


def _signalled_early(tmp_path, command, signum, status, last_line):
  """Sends `signum` to `command` at moments of its start-up (its imports): the
  command ends with `status` and `last_line` on stderr, and no traceback."""
  env = {**os.environ, "TRANSFORMER_DEFAULT_MALLOC": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
  signalled = 0
  for delay in (0.4, 0.55, 0.7, 0.85):  # It ends by itself (no workdir) after ~1.6 s.
    process = subprocess.Popen(_as_from_a_terminal(
        [sys.executable, "-m", f"transformer.{command}", "--workdir", str(tmp_path)]),
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    if process.poll() is not None:  # Ended already (a fast machine): nothing to check.
      continue
    process.send_signal(signum)
    signalled += 1
    _, err = process.communicate(timeout=60)
    assert process.returncode == status and "Traceback" not in err, (delay, err)
    assert err.splitlines()[-1] == last_line, (delay, err[-3000:])
  assert signalled >= 2


def test_a_ctrl_c_early_in_a_command_is_one_line(tmp_path):
  """translate (and evaluate, train.py) set end_at_interrupt before anything else
  in __main__: a Ctrl-C during their imports is one line and status 130."""
  _signalled_early(tmp_path, "translate", signal.SIGINT, -signal.SIGINT,
                   "translate: interrupted")


def test_a_sigterm_in_evaluate_is_one_line(tmp_path):
  """evaluate (and translate, average_checkpoints) ended silently by SIGTERM's
  default action (status -15 here), at any moment: now in one line that says
  what is kept, with status 143 (transformer/sigterm.py; translate's and
  average_checkpoints' are tested mid-run)."""
  _signalled_early(tmp_path, "evaluate", signal.SIGTERM, 128 + signal.SIGTERM,
                   "evaluate: stopped by SIGTERM before its results were written (those it "
                   "would replace are kept); rerun the same command")


def _printing(size):
  return ["-c", "from transformer import runtime\n"
                "with runtime.one_line_errors('cmd'):\n"
                f"  print('x' * {size})\n"]


@pytest.mark.parametrize("argv,line", [
    (_printing(100), "cmd: error: [Errno 28] No space left on device: '<stdout>'"),
    (_printing(100_000), "cmd: error: [Errno 28] No space left on device"),
    (["-m", "transformer.sweep", "--sweep", "configs/sweeps/table3_cpu.py", "--emit",
      "commands"], "sweep: error: [Errno 28] No space left on device: '<stdout>'"),
    # Unbuffered (streams.whole_writes), the failing write is inside print: named too.
    (["-u", "-c", "from transformer import runtime, streams\nstreams.set_up()\n"
                  "with runtime.one_line_errors('cmd'):\n  print('x' * 100)\n"],
     "cmd: error: [Errno 28] No space left on device: '<stdout>'"),
])
def test_a_full_disk_under_stdout_is_one_line_and_status_1(argv, line):
  """`cmd > FILE` on a full disk (/dev/full): a buffered stdout wrote its last
  lines only at the interpreter's exit, which printed `Exception ignored in:
  <_io.TextIOWrapper name='<stdout>' ...>` and made the status 120 (sweep
  --emit too). Now the block's end flushes them: one line naming stdout,
  status 1, and nothing left for the exit to fail on. A text larger than the
  buffer fails inside the command, as before: its one line, status 1."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # Buffered.
  with open("/dev/full", "w") as full:  # Linux's: every write fails with ENOSPC.
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=full,
                         stderr=subprocess.PIPE, text=True, env=env, timeout=120)
  assert (out.returncode, out.stderr) == (1, line + "\n"), out.stderr


def test_an_unbuffered_stdout_writes_a_text_whole_or_ends_by_sigpipe():
  """Under `python -u` (PYTHONUNBUFFERED=1, which containers often set) a text
  printed without a line end after it (sweep's `--collect` table, its `--emit
  slurm` script) went to one write of the descriptor, which dropped what it did
  not take: with the reader gone mid-write, the output was cut short and the
  status 0. A command's stdout now writes whole texts (streams.whole_writes,
  set up by runtime.run), so the reader's leaving ends it by SIGPIPE, as a
  filter ends."""
  code = ("from transformer import runtime\n"
          "def main(argv):\n"
          "  with runtime.one_line_errors('cmd'):\n"
          "    print('x' * 2_000_000, end='')\n"
          "runtime.run(main, 'cmd')\n")
  process = subprocess.Popen([sys.executable, "-u", "-c", code], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  process.stdout.read(100)
  process.stdout.close()  # Gone mid-write: 2 MB is far more than a pipe holds.
  err = process.stderr.read()
  assert (process.wait(timeout=60), err) == (-signal.SIGPIPE, b""), err


def test_running_out_of_device_memory_is_one_line():
  """XLA's failed allocation (a --beam_size of 100,000, say) was a JaxRuntimeError's
  traceback; NumPy's MemoryError is one line too (test_config's summary test)."""
  code = ("import jax.numpy as jnp\n"
          "from transformer import runtime\n"
          "with runtime.one_line_errors('cmd'):\n"
          "  jnp.zeros((2**40,), jnp.float32).block_until_ready()\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=process_helpers.command_env())
  assert (out.returncode, out.stderr) == (1, "cmd: error: out of memory: RESOURCE_EXHAUSTED: "
                                             "Out of memory allocating 4398046511104 bytes.\n"), (
      out.stderr[-3000:])


def test_summary_with_stdout_closed_prints_nothing_and_raises_nothing():
  """Started with descriptor 1 closed (`>&-`), summary's stdout was Python's
  None, on which one_line_errors' flush at the block's end raised
  AttributeError. runtime.run now opens /dev/null there first: the table goes
  nowhere, and the command ends as usual."""
  command = process_helpers.closed_descriptor(">&-", "-m", "transformer.summary", "--config",
                                              "configs/default.py")
  out = subprocess.run(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, timeout=120)
  assert (out.returncode, out.stderr) == (0, ""), out.stderr


@pytest.mark.parametrize("fd,name", [(0, "stdin"), (1, "stdout"), (2, "stderr")])
def test_a_standard_descriptor_started_closed_is_opened_on_devnull_first(fd, name, tmp_path):
  """Started with descriptor 0, 1 or 2 closed, a command's first pipe (sigterm's
  watch) took that number, so a library's write to stdout or stderr reached the
  watcher as signal numbers, and Python's stream was None (a write to
  sys.stderr raised AttributeError). The watch opens /dev/null there first,
  and closed_at_start remembers the stream was closed."""
  report = tmp_path / "report.json"
  script = ("import json, os, sys\n"
            "from transformer import sigterm, streams\n"
            "sigterm.watch('cmd', '')\n"
            f"stream = sys.{name}\n"
            "with open(sys.argv[1], 'w') as f:\n"
            f"  json.dump([os.readlink('/proc/self/fd/{fd}'), stream is not None,\n"
            f"             streams.closed_at_start({name!r})], f)\n")
  command = process_helpers.closed_descriptor(f"{fd}>&-", "-c", script, str(report))
  out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  assert json.loads(report.read_text()) == [os.devnull, True, True]


def _swallowed_ctrl_c(command, rest):
  """Runs `rest` in `command`'s one_line_errors block after a __del__ swallowed
  a SIGINT's KeyboardInterrupt, as JAX's garbage-collection callback does."""
  script = ("import gc, signal\n"
            "from transformer import runtime\n"
            "class Swallows:\n"
            "  def __del__(self):\n"
            "    signal.raise_signal(signal.SIGINT)\n"
            "    sum(range(1000))  # Python's handler runs here, inside __del__.\n"
            f"with runtime.one_line_errors({command!r}):\n"
            "  Swallows()\n"
            "  gc.collect()\n"
            "  print('went on', flush=True)\n" + rest)
  return subprocess.run(_as_from_a_terminal([sys.executable, "-c", script]), cwd=ROOT,
                        capture_output=True, text=True)


def test_a_cache_entry_cut_off_by_a_file_size_limit_is_not_left_behind(tmp_path):
  """JAX writes a cache entry in place and never replaces one: an entry cut off
  by a full disk (here a file size limit) stayed, and every later run warned
  that it could not read it and compiled again. The failed write is removed, and
  the next run writes the entry whole."""
  script = (
      "import resource, sys, warnings\n"
      "import jax, jax.numpy as jnp\n"
      "from transformer import runtime\n"
      "runtime.use_compilation_cache()\n"
      "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n"
      "if sys.argv[1] == 'limited':\n"
      "  resource.setrlimit(resource.RLIMIT_FSIZE,\n"
      "                     (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
      "with warnings.catch_warnings(record=True) as caught:\n"
      "  warnings.simplefilter('always')\n"
      "  print(float(jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((8, 8)))))\n"
      "print(sorted({str(w.message).split(' for ')[0] for w in caught\n"
      "              if 'persistent compilation cache' in str(w.message)}))\n")
  env = {**os.environ, runtime.CACHE_ENV: str(tmp_path / "cache")}
  run = lambda mode: subprocess.run([sys.executable, "-c", script, mode], env=env, cwd=ROOT,
                                    capture_output=True, text=True, check=True).stdout.split("\n")
  assert run("limited")[1] == "['Error writing persistent compilation cache entry']"
  assert not [p for p in os.listdir(tmp_path / "cache") if p.endswith("-cache")]
  assert run("whole")[1] == "[]"
  assert run("whole")[1] == "[]"  # Read back: no error reading it.
  entries = [p for p in os.listdir(tmp_path / "cache") if p.endswith("-cache")]
  assert entries and all(os.path.getsize(tmp_path / "cache" / e) > 1024 for e in entries)


def test_tunable_is_set_once_and_kept_with_others():
  assert run()["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  assert run(GLIBC_TUNABLES="glibc.malloc.arena_max=2")["GLIBC_TUNABLES"] == (
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
  assert run(GLIBC_TUNABLES="glibc.malloc.hugetlb=0")["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


def test_tcmalloc_is_preloaded_where_installed_and_never_releases():
  tcmalloc = runtime.find_tcmalloc()
  got = run()
  if tcmalloc is None:  # Not installed here: glibc's malloc with the tunable only.
    assert got["LD_PRELOAD"] is None and got["TCMALLOC_RELEASE_RATE"] is None
  else:
    assert got["LD_PRELOAD"] == tcmalloc and got["TCMALLOC_RELEASE_RATE"] == "0"
  kept = run(LD_PRELOAD="libfoo.so", TCMALLOC_RELEASE_RATE="2")
  if tcmalloc is not None:
    assert kept == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
                    "LD_PRELOAD": f"{tcmalloc}:libfoo.so", "TCMALLOC_RELEASE_RATE": "2"}
  assert run(TRANSFORMER_TCMALLOC="0") == {
      "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "LD_PRELOAD": None,
      "TCMALLOC_RELEASE_RATE": None}


def test_a_missing_tcmalloc_path_is_named(monkeypatch):
  monkeypatch.setenv("TRANSFORMER_TCMALLOC", "/nonexistent/libtcmalloc.so")
  with pytest.raises(FileNotFoundError, match="/nonexistent/libtcmalloc.so"):
    runtime.fast_malloc_env({})


@pytest.mark.parametrize("command", [["-c", SCRIPT],
                                     ["-m", "benchmarks.run", "--smoke", "--no_torch"]])
def test_a_missing_tcmalloc_path_stops_the_command_with_its_name(command):
  base = {k: v for k, v in os.environ.items() if k not in OURS}
  out = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True,
                       env={**base, "TRANSFORMER_TCMALLOC": "/nonexistent/libtcmalloc.so"})
  assert out.returncode != 0 and not out.stdout
  assert "TRANSFORMER_TCMALLOC='/nonexistent/libtcmalloc.so'" in out.stderr
  assert "Traceback" not in out.stderr


COMMANDS = ["train.py", "-m transformer.evaluate", "-m transformer.translate",
            "-m transformer.average_checkpoints", "-m transformer.launch",
            "-m transformer.sweep", "-m transformer.summary", "-m transformer.plots"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_flag_is_one_line_naming_it_in_every_command(command):
  """absl's parser says 'FATAL Flags parsing error' and adds a usage hint: two
  lines where every other bad value is one."""
  name = "train" if command == "train.py" else command.split(".")[-1]
  out = subprocess.run([sys.executable, *command.split(), "--no_such_flag=3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TRANSFORMER_DEFAULT_MALLOC": "1"})
  assert out.returncode == 1 and not out.stdout
  assert out.stderr.splitlines() == [
      f"{name}: error: Unknown command line flag 'no_such_flag'"], out.stderr


@pytest.mark.parametrize("command", ["-m transformer.evaluate --workdir w",
                                     "-m transformer.translate --workdir w",
                                     "-m transformer.average_checkpoints --workdir w",
                                     "-m transformer.sweep --sweep s.py"])
def test_a_stray_argument_is_one_line_in_every_command(command):
  """absl printed its whole usage (20-69 lines) for the commands' UsageError."""
  name = command.split()[1].split(".")[-1]
  out = subprocess.run([sys.executable, *command.split(), "stray"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TRANSFORMER_DEFAULT_MALLOC": "1"})
  assert out.returncode == 1 and not out.stdout
  assert out.stderr.splitlines() == [f"{name}: error: unexpected arguments: ['stray']"], (
      out.stderr)


def test_no_restart_where_jax_computes_on_a_gpu_or_tpu():
  """The allocator is for XLA's CPU buffers: on a GPU (session 32's H200) every
  command restarted for nothing."""
  assert run(JAX_PLATFORMS="cuda")["GLIBC_TUNABLES"] is None
  assert run(JAX_PLATFORMS="cpu")["GLIBC_TUNABLES"] == runtime.TUNABLE
  expected = runtime.accelerator_expected
  nothing = dict(exists=lambda path: False, find_spec=lambda name: None)
  assert expected({"JAX_PLATFORMS": "cuda,cpu"}, **nothing)
  assert not expected({"JAX_PLATFORMS": "cpu"}, exists=lambda path: True,
                      find_spec=lambda name: object())
  assert not expected({}, **nothing)
  cuda13 = lambda name: object() if name == "jax_cuda13_plugin" else None
  assert expected({}, exists=lambda path: path == "/dev/nvidiactl", find_spec=cuda13)
  assert not expected({}, exists=lambda path: False, find_spec=cuda13)  # No driver.
  assert expected({}, exists=lambda path: path == "/dev/accel0",
                  find_spec=lambda name: object() if name == "libtpu" else None)


def test_opt_out():
  assert run(TRANSFORMER_DEFAULT_MALLOC="1") == {
      "GLIBC_TUNABLES": None, "LD_PRELOAD": None, "TCMALLOC_RELEASE_RATE": None}


def test_library_info_and_expected_warnings_are_dropped_and_others_kept():
  script = """
from absl import logging
from transformer import runtime
logging.set_verbosity(logging.INFO)
logging.use_absl_handler()
runtime.quiet_library_logs()
runtime.quiet_library_logs()  # Twice: still one filter.
import orbax.checkpoint._src.logging.standard_logger as lib
# Compiled under an Orbax file name, the calls carry its path as Orbax's own do.
exec(compile("logging.info('library info'); logging.warning('library warning'); "
             "logging.warning('Given directory is read only=%s', '/ckpt')",
             lib.__file__, "exec"), {"logging": logging})
logging.warning("Given directory is read only, said we")
logging.info("our info")
"""
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, check=True, env=dict(os.environ, TRANSFORMER_DEFAULT_MALLOC="1"))
  assert "library info" not in out.stderr
  assert out.stderr.count("library warning") == 1 and "our info" in out.stderr
  # Orbax's warning on a checkpoint opened read-only (as restore does) is dropped;
  # the same words from elsewhere are not.
  assert "read only=/ckpt" not in out.stderr and "said we" in out.stderr


@pytest.mark.parametrize("quiet", [False, True])
def test_jax_s_info_on_the_backends_it_tried_is_dropped(quiet):
  """Without a TPU, JAX logs "Unable to initialize backend 'tpu': ... libtpu.so"
  at INFO in every command (absl's log is at INFO for clu's metrics)."""
  script = f"""
from absl import logging
from transformer import runtime
logging.set_verbosity(logging.INFO)
logging.use_absl_handler()
if {quiet}:
  runtime.quiet_library_logs()
import jax
jax.devices()
logging.info("our info")
"""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, check=True, env=dict(env, TRANSFORMER_DEFAULT_MALLOC="1"))
  assert "our info" in out.stderr
  assert ("Unable to initialize backend" in out.stderr) is not quiet, out.stderr


# What TensorFlow printed on stderr as it loaded (TFDS's data preparation and
# reading, TensorBoard's event reader): absl's note before its first C++ log
# line, oneDNN's note, cpu_feature_guard's, and any other C++ INFO line.
TENSORFLOW_NOISE = ("absl::InitializeLog()", "oneDNN custom operations", "cpu_feature_guard",
                    "rebuild TensorFlow")
CPP_INFO_LINE = re.compile(r"^I\d{4} [\d:.]+\s+\d+ [\w/.-]+\.cc:\d+\]", re.M)


def command_without_tensorflow_settings(args, timeout=180):
  """A command run as a user runs it, without TF_CPP_MIN_LOG_LEVEL (which the
  tests set) or TF_ENABLE_ONEDNN_OPTS in its environment."""
  env = {k: v for k, v in process_helpers.command_env().items()
         if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        env=env, timeout=timeout)


def assert_no_tensorflow_noise(stderr):
  """Nor JAX's INFO line on the backends it tried (quiet_library_logs)."""
  for noise in TENSORFLOW_NOISE + ("Unable to initialize backend",):
    assert noise not in stderr, stderr[-3000:]
  assert not CPP_INFO_LINE.search(stderr), stderr[-3000:]


def test_summary_and_plots_stderr_hold_no_library_notes(tmp_path):
  """summary and plots built their model or table without quiet_library_logs:
  JAX's "Unable to initialize backend 'tpu'" line showed."""
  out = command_without_tensorflow_settings(
      ["-m", "transformer.summary", "--config", "configs/default.py"])
  assert out.returncode == 0 and "Total parameters: 926,720" in out.stdout, out.stderr[-3000:]
  assert_no_tensorflow_noise(out.stderr)
  out = command_without_tensorflow_settings(
      ["-m", "transformer.plots", "positional", "--d_model", "16", "--max_len", "8",
       "--out", str(tmp_path / "pe.png")])
  assert out.returncode == 0 and (tmp_path / "pe.png").exists(), out.stderr[-3000:]
  assert_no_tensorflow_noise(out.stderr)


def test_train_stderr_has_our_warning_and_error_and_no_tensorflow_notes(tmp_path):
  """TFDS prepares SCAN in a new data dir (loading TensorFlow), then the run
  stops on the split: our warning and our one-line error show, TensorFlow's
  load-time INFO notes do not."""
  out = command_without_tensorflow_settings([
      "train.py", "--config", f"tests/tiny_train_config.py:{tmp_path / 'tfds'}",
      "--workdir", str(tmp_path / "w"), "--config.model.rnn_cell=gru",
      "--config.data.eval_split=nosuch"])
  assert out.returncode == 1, out.stderr[-3000:]
  assert "--config.model.rnn_cell has no effect" in out.stderr
  assert "train: error: SCAN has splits 'train' and 'test', not 'nosuch'" in out.stderr
  assert os.path.isdir(tmp_path / "tfds" / "scan")  # TensorFlow did load: it wrote the data.
  assert_no_tensorflow_noise(out.stderr)


def test_sweep_collect_stderr_has_our_warning_and_no_tensorflow_notes(tmp_path):
  """--collect reads the TensorBoard events with TensorBoard's reader, which
  loads TensorFlow; a damaged sweep status is still named."""
  from tests.helpers import fake_workdir, write_sweep  # pylint: disable=g-import-not-at-top
  from transformer import results, sweep as sweep_lib  # pylint: disable=g-import-not-at-top
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n")
  workdir = tmp_path / "runs"
  fake_workdir(str(workdir / "base"), sweep_lib.resolve(path).variants[0].config,
               scalars=[("eval/loss", 10, 1.5)])
  damaged = workdir / "base" / results.STATUS_FILE
  damaged.write_text('{"status": "fini')
  out = command_without_tensorflow_settings(
      ["-m", "transformer.sweep", "--sweep", path, "--workdir", str(workdir), "--collect"])
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"Skipping {damaged}: not valid JSON" in out.stderr
  assert_no_tensorflow_noise(out.stderr)


def test_tensorflow_settings_already_set_are_kept():
  script = ("import os; from transformer import runtime; "
            "print(os.environ['TF_CPP_MIN_LOG_LEVEL'], os.environ['TF_ENABLE_ONEDNN_OPTS'])")
  base = {k: v for k, v in os.environ.items()
          if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
  for env, printed in [({}, "1 0"), ({"TF_CPP_MIN_LOG_LEVEL": "0"}, "0 0"),
                       ({"TF_ENABLE_ONEDNN_OPTS": "1"}, "1 1")]:
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={**base, **env})
    assert out.stdout.strip() == printed


def _as_from_a_terminal(argv):
  """`argv` run with SIGINT as a command started from a terminal has it: a test
  runner started in the background of a script (nohup ... &) ignores it, and so
  would its children. (Reset by an exec'ing Python, not a preexec_fn, which would
  fork this multithreaded process.)"""
  return [sys.executable, "-c", "import os, signal, sys; "
          "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])",
          *argv]


def test_a_ctrl_c_outside_training_s_steps_is_one_line_and_ends_by_sigint():
  """Ctrl-C at start-up or in evaluate or translate printed KeyboardInterrupt's
  traceback; now one line. The process still ends by SIGINT (status 130 in a
  shell), so that a shell loop running the command stops too: an exit status of
  130 alone let bash go on to the loop's next command."""
  script = ("import time\n"
            "from transformer import runtime\n"
            "with runtime.one_line_errors('evaluate'):\n"
            "  print('ready', flush=True)\n"
            "  time.sleep(60)\n")
  # A terminal's Ctrl-C: SIGINT to the foreground process group, the loop's shell too.
  loop = subprocess.Popen(_as_from_a_terminal(
      ["bash", "-c", f"for i in 1 2; do {sys.executable} -c \"{script}\"; done; echo after"]),
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  assert loop.stdout.readline() == "ready\n"
  os.killpg(loop.pid, signal.SIGINT)
  out, err = loop.communicate(timeout=60)
  assert err == "evaluate: interrupted\n" and "after" not in out, (out, err)
  assert loop.returncode == -signal.SIGINT, loop.returncode
