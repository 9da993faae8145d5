"""Small shared fixtures for the tests: a tiny model and random token batches."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import ModelConfig
from transformer.model import Transformer

TINY = dict(input_vocab_size=23, output_vocab_size=23, num_layers=2, d_model=32,
            d_ff=64, num_heads=4, dropout=0.0, max_len=32)


def tiny_config(**overrides) -> ModelConfig:
  return ModelConfig(**{**TINY, **overrides})


def random_tokens(rng: np.random.Generator, lengths, width, vocab=23):
  """[B, width] int32 ids in [4, vocab) with row b padded (0) after lengths[b]."""
  ids = rng.integers(4, vocab, size=(len(lengths), width)).astype(np.int32)
  for b, n in enumerate(lengths):
    ids[b, n:] = 0
  return ids


def init_model(cfg, inputs, targets, seed=0):
  model = Transformer(cfg)
  params = model.init(jax.random.key(seed), jnp.asarray(inputs), jnp.asarray(targets))["params"]
  return model, params
