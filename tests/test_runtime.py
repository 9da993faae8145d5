"""The commands re-execute themselves once with glibc's huge-page malloc tunable."""

import os
import subprocess
import sys

SCRIPT = ("import os, sys; from transformer import runtime; "
          "runtime.use_huge_page_malloc(); print(os.environ.get('GLIBC_TUNABLES'))")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(**env):
  base = {k: v for k, v in os.environ.items()
          if k not in ("GLIBC_TUNABLES", "TRANSFORMER_DEFAULT_MALLOC")}
  out = subprocess.run([sys.executable, "-c", SCRIPT], env={**base, **env}, cwd=ROOT,
                       capture_output=True, text=True, check=True)
  return out.stdout.strip()


def test_tunable_is_set_once_and_kept_with_others():
  assert run() == "glibc.malloc.hugetlb=1"
  assert run(GLIBC_TUNABLES="glibc.malloc.arena_max=2") == (
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
  assert run(GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"


def test_opt_out():
  assert run(TRANSFORMER_DEFAULT_MALLOC="1") == "None"


def test_library_info_is_dropped_and_warnings_kept():
  script = """
from absl import logging
from transformer import runtime
logging.set_verbosity(logging.INFO)
logging.use_absl_handler()
runtime.quiet_library_logs()
runtime.quiet_library_logs()  # Twice: still one filter.
import orbax.checkpoint._src.logging.standard_logger as lib
# Compiled under an Orbax file name, the calls carry its path as Orbax's own do.
exec(compile("logging.info('library info'); logging.warning('library warning')",
             lib.__file__, "exec"), {"logging": logging})
logging.info("our info")
"""
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, check=True, env=dict(os.environ, TRANSFORMER_DEFAULT_MALLOC="1"))
  assert "library info" not in out.stderr
  assert out.stderr.count("library warning") == 1 and "our info" in out.stderr
