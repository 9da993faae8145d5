"""Trains a Transformer: flags only; the work is in transformer.training.

  python train.py --config configs/default.py [--workdir DIR] [--config.field=value ...]

The workdir defaults to runs/<config file stem> (runs/multi30k_de-en for
configs/multi30k.py:de-en). Rerunning the same command resumes from the latest
checkpoint in the workdir.
"""

from transformer import runtime

if __name__ == "__main__":
  runtime.use_fast_malloc()  # Before JAX starts; see transformer/runtime.py.

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
from ml_collections import config_flags

from transformer import distributed, training
from transformer import workdir as workdir_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, logs and the vocabulary "
                               "go; default runs/<config file stem>.")


def main(argv):
  runtime.quiet_library_logs()
  runtime.use_compilation_cache()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  workdir = _WORKDIR.value or workdir_lib.default_workdir(flags.FLAGS["config"].config_filename)
  logging.info("Config:\n%s", _CONFIG.value)
  with distributed.exit_at_once_on_error():
    training.train_and_evaluate(_CONFIG.value, workdir)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)
