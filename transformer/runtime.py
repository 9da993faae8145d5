"""Process set-up shared by the commands: glibc's malloc with transparent huge pages.

On a CPU, XLA allocates and frees large buffers every step; with glibc's default
malloc each step then takes tens of thousands of page faults. Measured on a
2-core CPU with the default SCAN config: 68,700 minor page faults and ~650 ms a
training step by default, ~450 and ~440-530 ms with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (benchmarks/ has the comparison). glibc
reads tunables only at process start, so the commands re-execute themselves
once with it set. Older glibc versions ignore the unknown tunable. Opt out with
TRANSFORMER_DEFAULT_MALLOC=1.
"""

import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"


def use_huge_page_malloc() -> None:
  """Re-executes this command with the tunable set (Linux only, at most once)."""
  current = os.environ.get("GLIBC_TUNABLES", "")
  if (not sys.platform.startswith("linux") or "glibc.malloc.hugetlb" in current
      or os.environ.get("TRANSFORMER_DEFAULT_MALLOC")):
    return
  env = dict(os.environ, GLIBC_TUNABLES=":".join(filter(None, [current, TUNABLE])))
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, env)
