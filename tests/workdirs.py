"""The tiny trained SCAN workdir that the evaluate, translate, inference,
workdir and benchmark tests share, and stand-ins for a command's work."""

import os
import shutil

from tests.helpers import built_once, fake_workdir, tiny_experiment
from transformer import training
from transformer import workdir as workdir_lib


def trained_workdir(tmp_path_factory):
  """A 20-step tiny SCAN run (checkpoints 10 and 20), trained once per test session
  (built_once) and copied once into each xdist worker's base temp dir, where
  every module asking gets the same copy: the tests write their outputs there."""
  base = tmp_path_factory.getbasetemp() / "tiny_trained_workdir"
  done = base / "DONE"
  if not done.exists():
    shutil.rmtree(base, ignore_errors=True)  # A half-made one from a failed attempt.
    built = built_once(tmp_path_factory, "tiny_trained_workdir.built", _train)
    shutil.copytree(built / "run", base / "run")  # Its config reads built's SCAN.
    done.touch()
  return str(base / "run")


def _train(path):
  config = tiny_experiment(path / "tfds", num_steps=20, eval_every=100, checkpoint_every=10)
  training.train_and_evaluate(config, str(path / "run"))


def rnn_workdir(path, name="rnn", **decode_fields):
  """A workdir holding only the config.json of a tiny RNN run (config.decode
  fields changed as given): what evaluate and translate check before any work."""
  config = tiny_experiment(os.path.join(path, "tfds"))
  config.model.architecture = "rnn"
  config.data.batching = "bucket"
  config.decode.update(decode_fields)
  fake_workdir(os.path.join(path, name), config)
  return os.path.join(path, name)


class Stopped(Exception):
  """Raised where a test stops a command that has started its work."""


def stop_at(monkeypatch, *names):
  """Makes workdir_lib's functions `names` (restore, load_tokenizer: the work)
  raise Stopped."""
  def stopped(*args, **kwargs):
    raise Stopped
  for name in names:
    monkeypatch.setattr(workdir_lib, name, stopped)
