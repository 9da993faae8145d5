"""The tiny experiment as a config file, for the train.py runs of
tests/test_multiprocess.py: --config tests/multiprocess_config.py:DATA_DIR."""

from tests.helpers import tiny_experiment
from tests.helpers import ADAM_EPS_NOTE


def get_config(data_dir):
  config = tiny_experiment(data_dir, num_steps=6, checkpoint_every=6, eval_every=1000,
                           log_every=1)
  config.data.train_split = "train[:2000]"  # ~60 batches an epoch; seconds less to prepare.
  config.data.eval_split = "test[:4]"  # The last step's evaluation compiles few shapes.
  config.model.d_model = 128  # Leaves of 2**14 and more, which FSDP splits.
  config.model.d_ff = 256
  config.optim.adam_eps = ADAM_EPS_NOTE  # See tests/helpers.py.
  config.distributed.heartbeat_timeout_s = 10  # A dead process ends the job in seconds.
  return config
