"""train.py's config for the tests that run it as a real process: the tiny SCAN
experiment of tests.helpers, 20 steps, a checkpoint every 5.

  python train.py --config tests/tiny_train_config.py:TFDS_DIR --workdir DIR
"""

from tests.helpers import tiny_experiment


def get_config(tfds_dir=""):
  return tiny_experiment(tfds_dir, num_steps=20, eval_every=100, checkpoint_every=5)
