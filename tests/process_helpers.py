"""Running train.py (and the other commands) as real processes, for the tests of
what survives real faults: a kill, a signal, a second writer."""

import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join("tests", "tiny_train_config.py")


def scan_tfds_dir(tmp_path_factory) -> str:
  """A TFDS data dir with SCAN prepared, made once per test session (helpers.built_once,
  shared by the xdist workers) so that the processes started on it only read it."""
  from tests.helpers import built_once  # pylint: disable=g-import-not-at-top
  from transformer.data import scan  # pylint: disable=g-import-not-at-top
  return str(built_once(tmp_path_factory, "scan_tfds", lambda path: scan.Scan(
      config="simple", data_dir=str(path)).download_and_prepare()))


def command_env(**extra):
  """The environment of a command under test: its compiled programs cached with
  the tests' (so that each process compiles little), TensorFlow quiet."""
  cache = os.environ.get("TEST_JAX_CACHE", os.path.join(
      os.environ.get("TMPDIR", "/tmp"), "transformer-test-jax-cache"))
  return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TRANSFORMER_COMPILATION_CACHE": cache,
          **extra}


def closed_descriptor(redirect, *argv):
  """The command line of `python argv...` started with a standard descriptor
  closed, as a shell closes it: `redirect` is '<&-', '>&-' or '2>&-'."""
  return ["bash", "-c", f'exec "$@" {redirect}', "bash", sys.executable, *argv]


def start(argv, log_path, env=None):
  """Popen of `python argv...` in the repository root, stdout and stderr appended
  to `log_path` (read while it runs with `wait_for`)."""
  log = open(log_path, "ab")  # pylint: disable=consider-using-with
  try:
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env=env or command_env())
  finally:
    log.close()


def start_train(workdir, tfds_dir, log_path, *overrides, script="train.py", env=None):
  return start([script, "--config", f"{TINY_CONFIG}:{tfds_dir}", "--workdir", workdir,
                *overrides], log_path, env)


def read(path) -> str:
  with open(path, "rb") as f:
    return f.read().decode("utf-8", errors="replace")


def wait_for(log_path, pattern, process=None, timeout=180.0, start_at=0):
  """The first match of regex `pattern` in the log after offset `start_at`;
  fails if `process` exits first or `timeout` seconds pass."""
  deadline = time.monotonic() + timeout
  while True:
    text = read(log_path)[start_at:]
    found = re.search(pattern, text, re.M)
    if found:
      return found
    if process is not None and process.poll() is not None:
      text = read(log_path)[start_at:]  # What it wrote before exiting.
      found = re.search(pattern, text, re.M)
      if found:
        return found
      raise AssertionError(f"exited ({process.returncode}) before {pattern!r}:\n{text[-4000:]}")
    if time.monotonic() > deadline:
      raise AssertionError(f"no {pattern!r} after {timeout} s:\n{text[-4000:]}")
    time.sleep(0.05)


def wait_for_lock(workdir, process, timeout=120.0) -> dict:
  """The owner record of workdir's LOCK once `process` has written it."""
  path = os.path.join(workdir, "LOCK")
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert process.poll() is None, f"exited ({process.returncode}) before taking {path}"
    try:
      with open(path) as f:
        owner = json.loads(f.read() or "null")
      if owner and owner["pid"] == process.pid:
        return owner
    except (OSError, ValueError):
      pass
    time.sleep(0.05)
  raise AssertionError(f"{path} not taken by pid {process.pid} after {timeout} s")


def kill9(process) -> None:
  process.send_signal(signal.SIGKILL)
  process.wait()


def sigterm_holding_lock(process, log_path, pattern, workdir) -> str:
  """Once `pattern` is in the log, with `workdir` locked, sends `process` SIGTERM;
  checks that it ends with status 143 within 30 s (killed if not) and returns
  its log's text."""
  try:
    wait_for(log_path, pattern, process)
    assert os.path.exists(os.path.join(workdir, "LOCK"))
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM, read(log_path)[-4000:]
  finally:
    if process.poll() is None:
      kill9(process)
  return read(log_path)


def restore_final(workdir, step=None):
  """(state, data iterator state, step) of workdir's checkpoint `step` (default
  the newest), read as the tiny config's state on one device."""
  import jax  # pylint: disable=g-import-not-at-top
  from tests.tiny_train_config import get_config  # pylint: disable=g-import-not-at-top
  from transformer import checkpoints, sharding, state as state_lib  # pylint: disable=g-import-not-at-top
  from transformer.data import tokenizer  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(jax.devices()[:1])
  vocab = tokenizer.Tokenizer.load(os.path.join(workdir, "spm.model")).vocab_size
  _, _, abstract, shardings, _ = state_lib.build(get_config(), vocab, mesh)
  state, data_state, step = checkpoints.Checkpointer(
      os.path.join(workdir, "checkpoints"), read_only=True).restore(abstract, shardings, step)
  return state, checkpoints.stop_marks(data_state)[0], step


def assert_same_state(a, b):
  """Bit for bit: parameters, optimizer state, step and rng, and the data position."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  (state_a, data_a, step_a), (state_b, data_b, step_b) = a, b
  assert (step_a, data_a) == (step_b, data_b)
  leaves_a, tree_a = jax.tree.flatten(state_a)
  leaves_b, tree_b = jax.tree.flatten(state_b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def batch_lineage(runs):
  """The batch each step of the surviving history trained on. `runs`: per
  process in order, (the step it resumed from, its FAULT_BATCH_LOG lines); a
  later run redoes the steps after its resume point, replacing what a killed
  run did there. A run that trained on nothing (killed before its first step)
  changes nothing: the next one resumes where it would have."""
  by_step = {}
  for start, lines in runs:
    if not lines:
      continue
    for i, line in enumerate(lines, start=start + 1):
      by_step[i] = line
    for step in [s for s in by_step if s > start + len(lines)]:
      del by_step[step]  # Done by a killed run after the point this one resumed from.
  return [by_step[s] for s in sorted(by_step)]
