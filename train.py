"""Trains a Transformer: flags only; the work is in transformer.training.

  python train.py --config configs/default.py [--workdir DIR] [--config.field=value ...]

The workdir defaults to runs/<config file stem> (runs/multi30k_de-en for
configs/multi30k.py:de-en). Rerunning the same command resumes from the latest
checkpoint in the workdir.

A bad value (a config field, a data path, the workdir) stops it at once with one
line on stderr naming the problem, and exit status 1 (`--verbosity=1` logs the
traceback too). SIGTERM or SIGINT (a scheduler's preemption, Ctrl-C) saves a
checkpoint after the step in flight and exits with status 143 or 130 (128 + the
signal); rerunning resumes from it (transformer/preemption.py). A SIGTERM before
training begins ends it at once, in one line (transformer/sigterm.py).
"""

from transformer import runtime, sigterm

if __name__ == "__main__":
  runtime.end_at_interrupt("train")  # A Ctrl-C at start-up: one line (see there).
  sigterm.watch("train", sigterm.BEFORE_TRAINING)  # A SIGTERM before training takes it.
  runtime.use_fast_malloc()  # Before JAX starts; see transformer/runtime.py.

import sys  # pylint: disable=g-import-not-at-top

from absl import flags  # pylint: disable=g-import-not-at-top
from absl import logging
from ml_collections import config_flags

from transformer import config as config_lib
from transformer import distributed, preemption, training
from transformer import workdir as workdir_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, logs and the vocabulary "
                               "go; default runs/<config file stem>.")


def main(argv):
  runtime.quiet_library_logs()
  if len(argv) > 1:
    sys.exit(f"train: error: unexpected arguments {argv[1:]}")
  config = _CONFIG.value
  if _WORKDIR.value == "":  # An unset shell variable: not runs/<config>, which may hold a run.
    sys.exit("train: error: --workdir is empty (leave the flag out for runs/<config file stem>)")
  workdir = _WORKDIR.value or workdir_lib.default_workdir(flags.FLAGS["config"].config_filename)
  for field, why in config_lib.unread_overrides(config,
                                                config_lib.overridden_fields(sys.argv[1:])):
    logging.warning("--config.%s %s: this run trains as without it.", field, why)
  try:
    # In a multi-process job a failing process exits at once (distributed.py);
    # alone, a bad value stops it in one line.
    one_line = (FloatingPointError,)
    with runtime.one_line_errors("train", extra=one_line), \
        distributed.exit_at_once_on_error("train", one_line=one_line):
      runtime.use_compilation_cache()
      training.train_and_evaluate(config, workdir)  # Logs the config once it is usable.
  except preemption.Preempted as e:  # A checkpoint is saved; a rerun resumes from it.
    sys.stderr.write(f"train: {e}\n")
    sys.exit(e.exit_status)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  runtime.run(main, "train")  # A bad flag or --config value: one line.
