"""The model's Dense layer, with its products and gradients written out for speed on a CPU.

`Dense` is nn.DenseGeneral's parameters over `dense`, which computes the same
values as jax.lax.dot_general (plus the bias) with a hand-written gradient, for
these reasons (benchmarks/README.md, 'Measurements behind the code'):
- The weight gradient is one 2-D product, x[N, in]^T g[N, out], with the tokens
  flattened into N. Autodiff's form contracts the batch and time axes of [B, T, ...]
  arrays, and XLA's CPU backend then copies one operand transposed, fused into
  whatever produced it (a dropout or ReLU gradient), which runs far slower than
  the copy alone; the 2-D form needs no copy in float32.
- With half-precision inputs every product accumulates in float32
  (preferred_element_type) and rounds the result to the input dtype: XLA runs a
  dot with a bfloat16 *output* at float32 speed on a CPU, and bfloat16 inputs
  with a float32 output at about twice that. Half-precision gradients
  accumulated in float32 are also what mixed-precision training prescribes.
- The bias is added to the float32 product before rounding, and its gradient is
  a float32 product of a ones vector with g: the sum of a bfloat16 g over the
  tokens became slow `reduce-window` thunks on a CPU.
- In half precision on a CPU the weight gradient is written so that XLA runs it
  as a bf16 x bf16 -> f32 product instead of upcasting both operands (`tokens_dot`).
- In bfloat16 on a CPU a product of few rows with a long contraction (the
  feed-forward's second layer while decoding) runs in chunks of the contraction
  (`_contract`).
"""
import functools
import math
from typing import Any, Callable, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def dot_f32(a, b, contract_a, contract_b, dtype=jnp.float32):
  """a . b over the given axes (no batch axes), accumulated in float32, as dtype."""
  out = jax.lax.dot_general(a, b, ((contract_a, contract_b), ((), ())),
                            preferred_element_type=jnp.float32)
  return out.astype(dtype)


def tokens_dot(a_NxA: Array, b_NxB: Array) -> Array:
  """a^T b, contracting the token axis N: [A, B], accumulated in float32, as a.dtype.

  XLA's CPU backend runs a bf16 x bf16 -> f32 product in its fast kernels
  (YNNPACK) only when the left operand is contracted over its last axis; a^T b
  contracts the first, so XLA upcasts both operands to float32 and runs the
  product at float32 speed. With N split into two blocks of rows and both block
  axes contracted, XLA instead copies one operand transposed (a copy it cannot
  fold back into the product) and runs the fast kernel. The narrower operand is
  the one copied, so a wide `a` gives b^T a, rounded and then transposed: the
  transpose of the float32 result would be folded into the product, which then
  needs a kernel XLA's CPU runtime lacks ("UNIMPLEMENTED ... BF16 x BF16 = F32").
  Float32 inputs, odd N and other backends keep the plain form (on a CPU, the
  blocks form measured 2-3% slower in float32).
  """
  n = a_NxA.shape[0]
  if a_NxA.dtype == jnp.float32 or n % 2 or jax.default_backend() != "cpu":
    return dot_f32(a_NxA, b_NxB, (0,), (0,), a_NxA.dtype)

  def two_blocks(l_NxL, r_NxR):
    return dot_f32(l_NxL.reshape(2, n // 2, -1), r_NxR.reshape(2, n // 2, -1), (0, 1), (0, 1),
                   a_NxA.dtype)

  if a_NxA.shape[1] <= b_NxB.shape[1]:
    return two_blocks(a_NxA, b_NxB)
  return two_blocks(b_NxB, a_NxA).T


def _first(n):
  return tuple(range(n))


def _last(n, ndim):
  return tuple(range(ndim - n, ndim))


# XLA's CPU kernel for bfloat16 products (YNNPACK) runs those of 2-64 rows with a
# long contraction erratically slowly: [64, 2048] x [2048, 512] takes 1.7x the time
# of the same product as two contractions of 1024 summed in float32, and no row
# count from 2 to 64 measured slower in chunks; 1 row is 3-4x slower in chunks and
# 128 rows 1.1x (benchmarks/README.md, 'Session 24').
CONTRACTION_CHUNK = 1024
MAX_CHUNKED_ROWS = 64


def _contract(x: Array, w: Array, n: int) -> Array:
  """x's last n axes contracted with w's first n, as float32."""
  fan_in = math.prod(w.shape[:n])
  rows = x.size // fan_in
  chunks = fan_in // CONTRACTION_CHUNK
  if (x.dtype != jnp.bfloat16 or jax.default_backend() != "cpu" or chunks < 2
      or fan_in % CONTRACTION_CHUNK or not 2 <= rows <= MAX_CHUNKED_ROWS):
    return dot_f32(x, w, _last(n, x.ndim), _first(n))
  x_RxCxI = x.reshape(rows, chunks, CONTRACTION_CHUNK)
  w_CxIxO = w.reshape(chunks, CONTRACTION_CHUNK, -1)
  out_RxO = dot_f32(x_RxCxI[:, 0], w_CxIxO[0], (1,), (0,))
  for c in range(1, chunks):
    out_RxO = out_RxO + dot_f32(x_RxCxI[:, c], w_CxIxO[c], (1,), (0,))
  return out_RxO.reshape(x.shape[:x.ndim - n] + w.shape[n:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def dense(x: Array, w: Array, b: Optional[Array], n: int, out_dtype=None) -> Array:
  """x's last n axes contracted with w's first n, plus b (float32 accumulation),
  as out_dtype (default x.dtype)."""
  out = _contract(x, w, n)
  if b is not None:
    out = out + b.astype(jnp.float32).reshape((1,) * (out.ndim - b.ndim) + b.shape)
  return out.astype(x.dtype if out_dtype is None else out_dtype)


def _dense_fwd(x, w, b, n, out_dtype):
  return dense(x, w, b, n, out_dtype), (x, w, b)


def _dense_bwd(n, out_dtype, residuals, g):
  del out_dtype
  x, w, b = residuals
  g = g.astype(x.dtype)  # A float32 output's gradient enters the products as x's dtype.
  k = w.ndim - n  # output feature axes
  # dx[..., c] = sum_o g[..., o] w[c, o];  dw[c, o] = sum_t x[t, c] g[t, o];  db[o] = sum_t g[t, o].
  dx = dot_f32(g, w, _last(k, g.ndim), _last(k, w.ndim), x.dtype)
  fan_in, fan_out = math.prod(w.shape[:n]), math.prod(w.shape[n:])
  g_NxO = g.reshape(-1, fan_out)
  dw = tokens_dot(x.reshape(-1, fan_in), g_NxO).astype(w.dtype).reshape(w.shape)
  db = None
  if b is not None:
    ones_N = jnp.ones(g_NxO.shape[:1], g.dtype)
    db = dot_f32(ones_N, g_NxO, (0,), (0,), b.dtype).reshape(b.shape)
  return dx, dw, db


dense.defvjp(_dense_fwd, _dense_bwd)


class Dense(nn.Module):
  """nn.DenseGeneral over the last `axes` input axes, computed by `dense`.

  The parameters are DenseGeneral's (so checkpoints and sharding rules carry
  over): kernel [*in, *features], initialised on its [fan_in, fan_out] form;
  bias [*features], zeros, float32. Inputs and kernel are cast to `dtype`; the
  output is `out_dtype` (default `dtype`): float32 for logits.
  """

  features: Union[int, Sequence[int]]
  axes: int = 1
  use_bias: bool = True
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.xavier_uniform()
  out_dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    fan_in = x.shape[x.ndim - self.axes:]
    kernel = self.param(
        "kernel", lambda rng, shape: self.kernel_init(
            rng, (math.prod(fan_in), math.prod(features))).reshape(shape),
        fan_in + features)
    bias = (self.param("bias", nn.initializers.zeros_init(), features)
            if self.use_bias else None)
    return dense(x.astype(self.dtype), kernel.astype(self.dtype), bias, self.axes,
                 self.out_dtype)
