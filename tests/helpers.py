"""Small shared fixtures for the tests: a tiny model, a tiny experiment, random
token batches, train.py's flag parsing, and the sweep files and fake workdirs of
the sweep and results tests."""

import contextlib
import fcntl
import json
import os
import shutil

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from configs import default
from transformer import runtime
from transformer.config import ModelConfig
from transformer.model import Transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
MULTI30K = os.path.join(ROOT, "configs", "multi30k.py")

# Adam's first update is g / (|g| + eps). With the paper's eps = 1e-9 it turns
# round-off in gradients that are mathematically zero (the key projection's bias:
# softmax ignores a shift shared by all of a query's scores) into full +-lr steps
# whose sign depends on summation order. Equivalence tests use eps = 1e-3, which
# leaves every real gradient (>> 1e-3 here) normalised as before.
ADAM_EPS_NOTE = 1e-3

TINY = dict(input_vocab_size=23, output_vocab_size=23, num_layers=2, d_model=32,
            d_ff=64, num_heads=4, dropout=0.0, max_len=32)


def train_flags(config_path, *overrides):
  """(config, None) of `train.py --config CONFIG_PATH OVERRIDES` as train.py
  parses it, or (None, the one line it stops with)."""
  argv = ["train.py", "--config", config_path, *overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values,
                                  lock_config=True, sys_argv=argv)  # Overrides come from argv.
  try:
    runtime.parse_flags(argv, "train", flag_values=flag_values)
  except SystemExit as e:
    return None, str(e.code)
  return flag_values["config"].value, None


def tiny_config(**overrides) -> ModelConfig:
  """A tiny ModelConfig for the model-level tests."""
  return ModelConfig(**{**TINY, **overrides})


def random_tokens(rng: np.random.Generator, lengths, width, vocab=23):
  """[B, width] int32 ids in [4, vocab) with row b padded (0) after lengths[b]."""
  ids = rng.integers(4, vocab, size=(len(lengths), width)).astype(np.int32)
  for b, n in enumerate(lengths):
    ids[b, n:] = 0
  return ids


# Flax's apply as one compiled program: compiled_apply(module, variables, *args,
# method=...). The module is a static argument, so equal modules (equal configs)
# share a trace and its compilation per shape. (Run eagerly, each operation
# compiles on its own for each new shape, but serves every config at that shape:
# tests that run many configs at shared shapes are faster eager.)
compiled_apply = jax.jit(nn.Module.apply, static_argnums=0,
                         static_argnames=("method", "mutable", "deterministic", "decode"))


def init_model(cfg, inputs, targets, seed=0):
  """Transformer(cfg) and its parameters from `seed`. They do not depend on the
  batch's shape, so it initialises on the first token of `inputs` and `targets`:
  every init runs at one shape, and the operations (each compiled on its own,
  eagerly) that configs have in common are compiled once, not once per shape."""
  model = Transformer(cfg)
  params = model.init(jax.random.key(seed), jnp.asarray(inputs)[:1, :1],
                      jnp.asarray(targets)[:1, :1])["params"]
  return model, params


def built_once(tmp_path_factory, name, build):
  """The folder `name`, built by `build(path)` once per test session: pytest-xdist's
  workers share it (their base temp dirs' parent is the session's), the first to
  come building it under a file lock while the others wait. A build that failed
  half-way is started over. (fcntl: a file lock is all this needs.)"""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent
  path, done = root / name, root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # Released when the file closes.
    if not done.exists():
      with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
      build(path)
      done.touch()
  return path


def tiny_experiment(data_dir, **train):
  """A whole experiment config (SCAN, a 1+1-layer d_model 32 model, 30 steps) for
  end-to-end runs; `train` overrides config.train fields."""
  config = default.get_config()
  config.model.num_layers = 1
  config.model.d_model = 32
  config.model.d_ff = 64
  config.model.num_heads = 2
  config.data.tfds_data_dir = str(data_dir)
  config.data.eval_split = "test[:200]"
  config.data.batching = "pack"
  config.data.tokens_per_batch = 512
  config.data.prefetch = 2
  config.optim.warmup_steps = 20
  config.train.num_steps = 30
  config.train.log_every = 5
  config.train.eval_every = 15
  config.train.checkpoint_every = 10
  config.train.decode_every = 0
  for k, v in train.items():
    config.train[k] = v
  return config


def write_sweep(tmp_path, text, base=DEFAULT, name="demo.py"):
  """A sweep file from `text`, its {base} filled in; its path."""
  path = tmp_path / name
  path.write_text(text.format(base=base))
  return str(path)


def fake_workdir(variant_dir, config, status=None, scalars=(), evaluations=(),
                 checkpoints=()):
  """A variant's workdir as training and evaluate leave it, without training:
  config.json, a sweep status, empty checkpoint folders, TensorBoard scalars
  ((tag, step, value)) and evaluate JSONs."""
  # Imported here: train.py subprocesses import this module for tiny_experiment.
  from transformer import results, training  # pylint: disable=g-import-not-at-top
  os.makedirs(variant_dir)
  training.save_config(config, variant_dir)
  if status:
    results.write_status(variant_dir, status)
  for step in checkpoints:
    os.makedirs(os.path.join(variant_dir, "checkpoints", str(step)))
  if scalars:
    from flax.metrics import tensorboard  # pylint: disable=g-import-not-at-top
    writer = tensorboard.SummaryWriter(variant_dir)
    for tag, step, value in scalars:
      writer.scalar(tag, value, step)
    writer.close()
  for i, result in enumerate(evaluations):
    with open(os.path.join(variant_dir, f"eval_{i}.json"), "w") as f:
      json.dump({"checkpoint": "latest", "limit": None, "beam_size": None, "alpha": None,
                 **result}, f)
