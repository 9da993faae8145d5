"""The Dense layers' products and their gradients, written out for speed on a CPU.

`dense_dot_general` is what the model's Dense layers call. It computes the same
values as jax.lax.dot_general, with a hand-written gradient for two reasons
(benchmarks/README.md, 'Measurements behind the code'):
- The weight gradient is one 2-D product, x[N, in]^T g[N, out], with the tokens
  flattened into N. Autodiff's form contracts the batch and time axes of [B, T, ...]
  arrays, and XLA's CPU backend then copies one operand transposed, fused into
  whatever produced it (a dropout or ReLU gradient), which runs far slower than
  the copy alone; the 2-D form needs no copy.
- With half-precision inputs every product accumulates in float32
  (preferred_element_type) and rounds the result to the input dtype: XLA runs a
  dot with a bfloat16 *output* at float32 speed on a CPU, and bfloat16 inputs
  with a float32 output at about twice that. Half-precision gradients
  accumulated in float32 are also what mixed-precision training prescribes.
"""
import math

import functools

import jax
import jax.numpy as jnp

_HALF = (jnp.bfloat16, jnp.float16)
_DTYPES = _HALF + (jnp.float32,)


def dot_f32(a, b, contract_a, contract_b, dtype=jnp.float32):
  """a . b over the given axes (no batch axes), accumulated in float32, as dtype."""
  out = jax.lax.dot_general(a, b, ((contract_a, contract_b), ((), ())),
                            preferred_element_type=jnp.float32)
  return out.astype(dtype)


def _first(n):
  return tuple(range(n))


def _last(n, ndim):
  return tuple(range(ndim - n, ndim))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _tensordot(x, w, n):
  """Contracts the last n axes of x with the first n of w (a Dense layer's product)."""
  return dot_f32(x, w, _last(n, x.ndim), _first(n), x.dtype)


def _tensordot_fwd(x, w, n):
  return _tensordot(x, w, n), (x, w)


def _tensordot_bwd(n, residuals, g):
  x, w = residuals
  k = w.ndim - n  # output feature axes
  # dx[..., c] = sum_o g[..., o] w[c, o];  dw[c, o] = sum_n x[n, c] g[n, o].
  dx = dot_f32(g, w, _last(k, g.ndim), _last(k, w.ndim), x.dtype)
  fan_in, fan_out = math.prod(w.shape[:n]), math.prod(w.shape[n:])
  dw = dot_f32(x.reshape(-1, fan_in), g.reshape(-1, fan_out), (0,), (0,), w.dtype)
  return dx, dw.reshape(w.shape)


_tensordot.defvjp(_tensordot_fwd, _tensordot_bwd)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                      preferred_element_type=None, **kwargs):
  """jax.lax.dot_general, with the gradient above for a Dense layer's product.

  Takes that path only for the Dense form (the last n axes of lhs against the
  first n of rhs, no batch axes) with both inputs of one dtype (float32 or a
  half precision) and no precision asked for; anything else is
  jax.lax.dot_general unchanged.
  """
  (contract_l, contract_r), (batch_l, batch_r) = dimension_numbers
  n = len(contract_l)
  dense_form = (not batch_l and not batch_r
                and tuple(contract_l) == _last(n, lhs.ndim)
                and tuple(contract_r) == _first(n))
  if (dense_form and lhs.dtype == rhs.dtype and lhs.dtype in _DTYPES
      and precision is None and preferred_element_type in (None, lhs.dtype)):
    return _tensordot(lhs, rhs, n)
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                             preferred_element_type=preferred_element_type, **kwargs)
