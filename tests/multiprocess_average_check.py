"""Run by tests/test_multiprocess.py as each process of a job: average_checkpoints,
with process 1 finishing its save 2 s after process 0 (a slower disk or host).

  python tests/multiprocess_average_check.py --workdir DIR [--last N]
"""

import sys
import time

from absl import app
from absl import flags
import jax

sys.path.insert(0, ".")
from transformer import average_checkpoints, checkpoints  # pylint: disable=g-import-not-at-top

_wait = checkpoints.Checkpointer._wait  # pylint: disable=protected-access


def _slow_wait(self):
  if jax.process_index() == 1:
    time.sleep(2)
  return _wait(self)


if __name__ == "__main__":
  checkpoints.Checkpointer._wait = _slow_wait  # pylint: disable=protected-access
  flags.DEFINE_string("workdir", None, "Training workdir.", required=True)
  flags.DEFINE_integer("last", None, "Checkpoints to average.")
  app.run(average_checkpoints.main)
