"""Process set-up shared by the commands: glibc's malloc with transparent huge
pages, and a training log without the libraries' INFO chatter.

On a CPU, XLA allocates and frees large buffers every step; with glibc's default
malloc each step then takes tens of thousands of page faults. Measured on a
2-core CPU with the default SCAN config: 68,700 minor page faults and ~650 ms a
training step by default, ~450 and ~440-530 ms with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (benchmarks/ has the comparison). glibc
reads tunables only at process start, so the commands re-execute themselves
once with it set. Older glibc versions ignore the unknown tunable. Opt out with
TRANSFORMER_DEFAULT_MALLOC=1.
"""

import logging
import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
NOISY_LIBRARIES = ("/orbax/", "/tensorflow_datasets/")


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


def _not_library_info(record: logging.LogRecord) -> bool:
  # Python's levels: absl.logging.WARNING is absl's own scale (-1), not 30.
  return (record.levelno >= logging.WARNING
          or not any(name in record.pathname for name in NOISY_LIBRARIES))


def quiet_library_logs() -> None:
  """Drops Orbax's and TFDS's INFO records (a dozen lines per checkpoint) from
  absl's log; their warnings and errors still pass."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logger = absl_logging.get_absl_logger()
  if _not_library_info not in absl_logger.filters:
    absl_logger.addFilter(_not_library_info)
