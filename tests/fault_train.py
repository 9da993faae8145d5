"""train.py with the test hooks of tests/fault_hooks.py (a batch log, slowed
steps, held or failing checkpoint saves, each set by an environment variable):
the same flags and code, run as a real process by the fault tests.

  FAULT_BATCH_LOG=batches.txt python tests/fault_train.py \
      --config tests/tiny_train_config.py:TFDS --workdir DIR
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformer import runtime, sigterm  # pylint: disable=g-import-not-at-top

if __name__ == "__main__":  # As train.py does.
  sigterm.watch("train", sigterm.BEFORE_TRAINING)
  runtime.use_fast_malloc()

from tests import fault_hooks
import train

if __name__ == "__main__":
  fault_hooks.install_hooks(os.environ)
  train.flags.mark_flag_as_required("config")
  runtime.run(train.main, "train")
