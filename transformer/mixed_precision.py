"""Dense-layer products for a bfloat16 (or float16) compute dtype.

`dense_dot_general` is what the model's Dense layers call. In float32 it is
jax.lax.dot_general. With half-precision inputs it multiplies them with float32
accumulation (preferred_element_type) and rounds the result to the input dtype,
and its gradient does the same for both of its products. Autodiff of a plain
half-precision dot_general gives the same values up to rounding, but on a CPU
XLA runs a dot with a bfloat16 *output* at float32 speed, while bfloat16
inputs with a float32 output run at about twice that (benchmarks/README.md, 'Measurements behind the code').
Half-precision gradients accumulated in float32 are also what mixed-precision
training prescribes.
"""
import functools

import jax
import jax.numpy as jnp

_HALF = (jnp.bfloat16, jnp.float16)


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
  # dx[..., c] = sum_o g[..., o] w[c, o];  dw[c, o] = sum_... x[..., c] g[..., o].
  dx = dot_f32(g, w, _last(k, g.ndim), _last(k, w.ndim), x.dtype)
  lead = x.ndim - n
  dw = dot_f32(x, g, _first(lead), _first(lead), w.dtype)
  return dx, dw


_tensordot.defvjp(_tensordot_fwd, _tensordot_bwd)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                      preferred_element_type=None, **kwargs):
  """jax.lax.dot_general, with float32 accumulation for half-precision Dense products.

  Takes the half-precision path only for the Dense form (the last n axes of lhs
  against the first n of rhs, no batch axes) with both inputs of one half
  dtype and no precision asked for; anything else is jax.lax.dot_general
  unchanged.
  """
  (contract_l, contract_r), (batch_l, batch_r) = dimension_numbers
  n = len(contract_l)
  dense_form = (not batch_l and not batch_r
                and tuple(contract_l) == _last(n, lhs.ndim)
                and tuple(contract_r) == _first(n))
  if (dense_form and lhs.dtype == rhs.dtype and lhs.dtype in _HALF
      and precision is None and preferred_element_type in (None, lhs.dtype)):
    return _tensordot(lhs, rhs, n)
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                             preferred_element_type=preferred_element_type, **kwargs)
