"""Tests for transformer/dropout.py: 16-bit draws, the rate, the scale, the rng stream."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from transformer.dropout import Dropout, dropout


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_rate_and_expectation(rate):
  """Over 2^20 elements the dropped share is rate (to sampling error) and the mean
  is kept: kept elements are scaled by the inverse of the keep probability."""
  x = jnp.ones((256, 16, 256))
  y = np.asarray(dropout(x, rate, jax.random.key(0)))
  t = round(rate * 65536)
  kept = y != 0
  assert abs((~kept).mean() - t / 65536) < 5 * np.sqrt(rate * (1 - rate) / y.size)
  np.testing.assert_allclose(y[kept], 65536 / (65536 - t), rtol=1e-7)
  assert abs(y.mean() - 1.0) < 0.01


def test_both_halves_of_a_word_are_used_independently():
  """Element pairs drawn from one 32-bit word: the two halves' masks agree no
  more often than independent draws would (p^2 + q^2)."""
  x = jnp.ones((1 << 20,))
  kept = np.asarray(dropout(x, 0.5, jax.random.key(1))) != 0
  half = kept.size // 2
  agree = (kept[:half] == kept[half:]).mean()
  assert abs(agree - 0.5) < 0.005
  assert abs(kept[:half].mean() - 0.5) < 0.005 and abs(kept[half:].mean() - 0.5) < 0.005


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=0, max_size=3),
       rate=st.floats(0.0, 0.95), seed=st.integers(0, 2**31 - 1))
def test_each_element_is_zero_or_scaled(shape, rate, seed):
  """Any shape (an odd last axis leaves half of a row's last word unused), any rate."""
  x = jax.random.normal(jax.random.key(seed), tuple(shape)) + 3.0  # never 0
  y = np.asarray(dropout(x, rate, jax.random.key(seed + 1)))
  assert y.shape == x.shape and y.dtype == x.dtype
  t = round(rate * 65536)
  scaled = np.asarray(x) * (65536 / (65536 - t)) if t < 65536 else np.zeros_like(y)
  kept = y != 0
  np.testing.assert_allclose(y[kept], scaled[kept], rtol=1e-6)
  if rate == 0.0:
    assert kept.all()


def test_a_row_s_mask_does_not_depend_on_the_rows_after_it():
  """The words are drawn in the input's shape, so the first rows of a batch get the
  masks they get alone: what lets a mesh split the draws with the rows
  (tests/sharded_step_check.py checks that each device draws only its own)."""
  x = jnp.ones((8, 5, 6))
  rng = jax.random.key(2)
  whole = np.asarray(dropout(x, 0.5, rng))
  for rows in (1, 3, 7):
    np.testing.assert_array_equal(dropout(x[:rows], 0.5, rng), whole[:rows])


def test_module_uses_the_dropout_stream_and_is_off_when_deterministic():
  x = jnp.ones((4, 8, 16), jnp.bfloat16)
  module = Dropout(0.25)
  np.testing.assert_array_equal(module.apply({}, x, deterministic=True), x)
  a = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  b = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  c = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert a.dtype == jnp.bfloat16
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  with pytest.raises(Exception, match="dropout"):
    module.apply({}, x, deterministic=False)


def test_gradient_is_the_mask():
  """d/dx of sum(dropout(x) * w) is w where kept, scaled, and 0 where dropped."""
  x = jnp.ones((64, 32)); w = jax.random.normal(jax.random.key(3), (64, 32))
  rng = jax.random.key(4)
  g = jax.grad(lambda x: jnp.sum(dropout(x, 0.2, rng) * w))(x)
  y = dropout(x, 0.2, rng)
  np.testing.assert_allclose(g, np.where(np.asarray(y) != 0, np.asarray(w) * y, 0), rtol=1e-6)
