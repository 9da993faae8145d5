"""Dropout (Srivastava et al., 2014; the paper's P_drop, 5.4) from 16 random bits an element.

Our own rather than Flax's nn.Dropout, which draws one 32-bit threefry word per
element: this splits each word into two 16-bit draws, half the random-number
work, which makes the small float32 training step ~1.06x faster on a CPU
(benchmarks/README.md, 'Measurements behind the code'). The words are drawn in
the input's shape with its last axis halved, so that on a mesh each device draws
only its own rows' words (a flat draw is not split: every device would draw the
whole batch's). An element is kept when its draw u (0 <= u < 2^16) is at least
t = round(rate * 2^16), so the drop rate is t / 2^16, within 2^-17 of `rate`,
and kept elements are scaled by 2^16 / (2^16 - t), the inverse of the keep
probability: the output's expectation is the input.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

_LEVELS = 1 << 16


def dropout(x, rate, rng):
  """x with each element zeroed with probability ~rate, the rest scaled up."""
  if rate <= 0.0:
    return x
  threshold = round(rate * _LEVELS)
  if threshold >= _LEVELS:
    return jnp.zeros_like(x)
  if x.ndim == 0:
    return dropout(x[None], rate, rng)[0]
  last = x.shape[-1]
  words = jax.random.bits(rng, x.shape[:-1] + ((last + 1) // 2,), jnp.uint32)
  draws = jnp.concatenate([words & 0xFFFF, words >> 16], axis=-1)[..., :last]
  scale = _LEVELS / (_LEVELS - threshold)
  return jnp.where(draws >= threshold, x * scale, jnp.zeros((), x.dtype))


class Dropout(nn.Module):
  """nn.Dropout's interface (rate, deterministic, the "dropout" rng stream)."""

  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate <= 0.0:
      return x
    return dropout(x, self.rate, self.make_rng("dropout"))
