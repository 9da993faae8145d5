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
