"""The commands re-execute themselves once with a faster allocator set up."""

import json
import os
import subprocess
import sys

import pytest

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
