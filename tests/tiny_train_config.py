"""train.py's config for the tests that run it as a real process: the tiny SCAN
experiment of tests.helpers, 20 steps, a checkpoint every 5, on the first 2,000
training examples (each process reads and tokenizes them at start).

  python train.py --config tests/tiny_train_config.py:TFDS_DIR --workdir DIR
"""

from tests.helpers import tiny_experiment


def get_config(tfds_dir=""):
  config = tiny_experiment(tfds_dir, num_steps=20, eval_every=100, checkpoint_every=5)
  config.data.train_split = "train[:2000]"
  return config
