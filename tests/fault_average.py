"""`python -m transformer.average_checkpoints` with test hooks, for the fault
tests: FAULT_SAVE_SECONDS of tests/fault_hooks.py (holds the save of the new
average), and FAULT_SWAP_SECONDS=S, which holds S seconds between moving the
previous average aside and moving the new one in, printing `fault: swapping`
first, so that a kill lands there.

  python tests/fault_average.py --workdir DIR --last N
"""

import os
import runpy
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import fault_hooks  # pylint: disable=g-import-not-at-top

OLD_INFIX = ".old"  # average_checkpoints.OLD_INFIX (not imported: runpy runs that module).

if __name__ == "__main__":
  fault_hooks.install_hooks(os.environ)
  swap_seconds = float(os.environ.get("FAULT_SWAP_SECONDS", 0))
  if swap_seconds:
    rename = os.rename

    def slow_rename(src, dst):
      rename(src, dst)
      if dst.endswith(f"{OLD_INFIX}{os.getpid()}"):
        sys.stderr.write(f"fault: swapping, the previous average is at {dst}\n")
        sys.stderr.flush()
        time.sleep(swap_seconds)

    os.rename = slow_rename
  sys.argv[0] = "average_checkpoints"
  runpy.run_module("transformer.average_checkpoints", run_name="__main__", alter_sys=True)
