"""Tests for transformer/mixed_precision.py: the Dense layers' products."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from tests.helpers import random_tokens, tiny_config
from transformer import optim
from transformer.mixed_precision import Dense, dense, tokens_dot
from transformer.model import Transformer

# The model's Dense forms: FFN [B,T,D] x [D,F]; Q/K/V [B,T,D] x [D,H,K];
# heads merge [B,T,H,K] x [H,K,D]; an even token count (bf16: the two-blocks
# weight gradient, tokens_dot) with a wide input, as in the FFN's second layer.
FORMS = [((3, 5, 8), (8, 6), 1), ((3, 5, 8), (8, 2, 4), 1), ((3, 5, 2, 4), (2, 4, 8), 2),
         ((2, 4, 16), (16, 4), 1)]


def dense_dims(x_ndim, n):
  return ((tuple(range(x_ndim - n, x_ndim)), tuple(range(n))), ((), ()))


def autodiff_dense(x, w, b, n):
  """The reference: autodiff of lax.dot_general plus a broadcast bias."""
  out = jax.lax.dot_general(x, w, dense_dims(x.ndim, n))
  return out if b is None else out + b.reshape((1,) * (out.ndim - b.ndim) + b.shape)


def loss_fn(fn, dtype, n):
  """A scalar of the layer's output with a non-uniform cotangent."""
  return lambda x, w, b: jnp.sum(jnp.sin(
      fn(x.astype(dtype), w.astype(dtype), b, n).astype(jnp.float32)))


def inputs(x_shape, w_shape, n):
  kx, kw, kb = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(kx, x_shape), jax.random.normal(kw, w_shape),
          jax.random.normal(kb, w_shape[n:]))


@pytest.mark.parametrize("x_shape,w_shape,n", FORMS)
@pytest.mark.parametrize("bias", [True, False])
def test_float32_equals_autodiff(x_shape, w_shape, n, bias):
  """The hand-written gradient (2-D weight-gradient product, bias gradient as a
  product with ones) against autodiff, up to float32 summation order."""
  x, w, b = inputs(x_shape, w_shape, n)
  b = b if bias else None
  argnums = (0, 1, 2) if bias else (0, 1)
  ours = jax.jit(jax.value_and_grad(loss_fn(dense, jnp.float32, n), argnums))(x, w, b)
  ref = jax.jit(jax.value_and_grad(loss_fn(autodiff_dense, jnp.float32, n), argnums))(x, w, b)
  np.testing.assert_allclose(ours[0], ref[0], rtol=1e-6)
  for a, r in zip(ours[1], ref[1]):
    assert a.shape == r.shape and a.dtype == r.dtype
    np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


def test_float32_weight_gradient_is_one_2d_product():
  """What makes the float32 step fast on a CPU: the weight gradient contracts one
  flattened token axis, not autodiff's batch and time axes of [B, T, ...] arrays."""
  x, w, b = inputs((3, 5, 2, 4), (2, 4, 8), 2)
  grad = jax.jit(jax.grad(loss_fn(dense, jnp.float32, 2), 1))
  text = grad.lower(x, w, b).as_text()
  assert re.search(r"stablehlo\.dot_general.*contracting_dims = \[0\] x \[0\].*"
                   r"tensor<15x8xf32>, tensor<15x8xf32>\) -> tensor<8x8xf32>", text), text


@pytest.mark.parametrize("x_shape,w_shape,n", FORMS)
def test_bfloat16_values_and_gradients_match_float32_accumulation(x_shape, w_shape, n):
  """Against float32 math on the same bf16-rounded inputs: only the rounding of
  the product and of the cotangent to bf16 differs (~2^-8 relative)."""
  x, w, b = inputs(x_shape, w_shape, n)
  x16, w16 = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)

  @jax.jit  # Ours and the reference, values and gradients, as one compiled program.
  def values_and_gradients(x16, w16, b):
    x32, w32 = x16.astype(jnp.float32), w16.astype(jnp.float32)
    grads = jax.grad(lambda x, w, b: jnp.sum(jnp.sin(dense(x, w, b, n).astype(jnp.float32))),
                     (0, 1, 2))(x16, w16, b)
    ref_grads = jax.grad(loss_fn(autodiff_dense, jnp.float32, n), (0, 1, 2))(x32, w32, b)
    return dense(x16, w16, b, n), autodiff_dense(x32, w32, b, n), grads, ref_grads

  out, ref, grads, ref_grads = values_and_gradients(x16, w16, b)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(out.astype(jnp.float32), ref, rtol=1e-2, atol=2e-2)

  for g, r, dtype in zip(grads, ref_grads, (jnp.bfloat16, jnp.bfloat16, jnp.float32)):
    assert g.dtype == dtype
    scale = float(jnp.max(jnp.abs(r)))
    np.testing.assert_allclose(g.astype(jnp.float32), r, atol=0.03 * scale)


def test_bfloat16_products_all_accumulate_in_float32():
  """What makes the bf16 step fast on a CPU: every dot of the forward and
  backward pass has a float32 result (a bf16-result dot runs at float32 speed),
  and the bias gradient is a dot, not a reduction of bf16 values."""
  x, w, b = inputs((3, 5, 8), (8, 6), 1)
  grad = jax.jit(jax.grad(loss_fn(dense, jnp.bfloat16, 1), (0, 1, 2)))
  text = grad.lower(x, w, b).as_text()
  results = re.findall(r"stablehlo\.dot_general.*?->\s*tensor<[^>]*x(\w+)>", text)
  assert len(results) == 4 and set(results) == {"f32"}, results
  assert "stablehlo.reduce" not in text
  plain = jax.jit(jax.grad(loss_fn(autodiff_dense, jnp.bfloat16, 1), (0, 1)))
  assert "bf16" in re.findall(r"stablehlo\.dot_general.*?->\s*tensor<[^>]*x(\w+)>",
                              plain.lower(x, w, None).as_text())


@pytest.mark.parametrize("n,a,b", [(64, 8, 24), (64, 24, 8), (64, 16, 16), (63, 24, 8)])
def test_tokens_dot_is_the_float32_accumulated_product(n, a, b):
  """a^T b over the tokens, whichever operand is narrower and for an odd token
  count (the plain form): float32 math on the same bf16 inputs, rounded once."""
  x = jax.random.normal(jax.random.key(0), (n, a)).astype(jnp.bfloat16)
  y = jax.random.normal(jax.random.key(1), (n, b)).astype(jnp.bfloat16)
  out = jax.jit(tokens_dot)(x, y)
  assert out.shape == (a, b) and out.dtype == jnp.bfloat16
  ref = x.astype(jnp.float32).T @ y.astype(jnp.float32)
  np.testing.assert_allclose(out.astype(jnp.float32), ref, rtol=2**-7, atol=1e-2)
  f32 = jax.jit(tokens_dot)(x.astype(jnp.float32), y.astype(jnp.float32))
  assert f32.dtype == jnp.float32
  np.testing.assert_allclose(f32, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU-backend form")
@pytest.mark.parametrize("a,b", [(8, 24), (24, 8)])
def test_bfloat16_tokens_dot_is_not_upcast_to_float32_on_a_cpu(a, b):
  """What makes the bf16 weight gradient fast on a CPU: XLA keeps the product's
  operands in bf16 (copying only the narrower one, transposed), where the plain
  x^T g form gets both operands converted to float32 first."""
  n = 64
  x, y = jnp.ones((n, a), jnp.bfloat16), jnp.ones((n, b), jnp.bfloat16)

  def upcasts(fn):
    text = jax.jit(fn).lower(x, y).compile().as_text()
    return re.findall(rf"f32\[{n},(?:{a}|{b})\]\S* convert\(", text)

  assert upcasts(tokens_dot) == []
  assert upcasts(lambda x, y: jax.lax.dot_general(
      x, y, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU-backend form")
@pytest.mark.parametrize("rows,fan_in,dtype,products", [
    (64, 2048, jnp.bfloat16, 2), (2, 4096, jnp.bfloat16, 4), (40, 3072, jnp.bfloat16, 3),
    (1, 2048, jnp.bfloat16, 1), (65, 2048, jnp.bfloat16, 1), (64, 1024, jnp.bfloat16, 1),
    (64, 2560, jnp.bfloat16, 1), (64, 2048, jnp.float32, 1), (64, 2048, jnp.float16, 1)])
def test_few_rows_with_a_long_contraction_run_in_chunks_on_a_cpu(rows, fan_in, dtype, products):
  """A bfloat16 product of 2-64 rows contracts in chunks of 1024 (decoding's
  feed-forward; XLA's CPU kernel runs it whole erratically slowly), summed in
  float32: the value is the whole product's, float32 math on the same inputs
  rounded once. One row, more rows, a short or uneven contraction, float32 and
  float16 stay one product."""
  x, w, b = inputs((rows, 1, fan_in), (fan_in, 8), 1)
  x, w = x.astype(dtype), w.astype(dtype)
  lowered = jax.jit(lambda x, w, b: dense(x, w, b, 1)).lower(x, w, b)
  assert lowered.as_text().count("stablehlo.dot_general") == products
  out = lowered.compile()(x, w, b)  # The program whose products were counted.
  assert out.shape == (rows, 1, 8) and out.dtype == dtype
  ref = x.astype(jnp.float32) @ w.astype(jnp.float32) + b[None, None]
  np.testing.assert_allclose(out.astype(jnp.float32), ref, rtol=2**-7, atol=1e-2)


def test_other_backends_contract_whole(monkeypatch):
  """The chunks are a CPU kernel's remedy: a GPU or TPU keeps one product."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  x, w, b = inputs((64, 1, 2048), (2048, 8), 1)
  fn = jax.jit(lambda x, w, b: dense(x, w, b, 1))
  text = fn.lower(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), b).as_text()
  assert text.count("stablehlo.dot_general") == 1


@pytest.mark.parametrize("features,axes,x_shape", [(6, 1, (3, 5, 8)), ((2, 4), 1, (3, 5, 8)),
                                                   (8, 2, (3, 5, 2, 4))])
def test_dense_module_is_dense_general(features, axes, x_shape):
  """Dense has nn.DenseGeneral's parameters (names, shapes, initial values) and outputs."""
  x = jax.random.normal(jax.random.key(1), x_shape)
  ours = Dense(features, axes=axes)
  theirs = nn.DenseGeneral(features, axis=tuple(range(-axes, 0)),
                           kernel_init=nn.initializers.xavier_uniform())
  params = ours.init(jax.random.key(2), x)
  ref_params = theirs.init(jax.random.key(2), x)
  jax.tree.map(np.testing.assert_array_equal, params, ref_params)
  params = jax.tree.map(lambda p: p + 0.1, params)  # A nonzero bias.
  np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-5, atol=1e-6)
  assert "bias" not in Dense(features, axes=axes, use_bias=False).init(jax.random.key(2), x)["params"]


def test_bfloat16_bias_is_added_to_the_float32_product_before_rounding():
  """One rounding to bfloat16, of product + bias in float32: a bias rounded to
  bfloat16 first would round twice. Here the product is -0.3 and the bias
  1.6 bfloat16 spacings (2^-7) above 1: their float32 sum rounds to 1.0, while
  the bias rounded first (1 + 2^-7) gives 1.3 spacings, which rounds up."""
  ulp = 2.0 ** -7
  x = jnp.ones((1, 1), jnp.bfloat16)
  w = jnp.asarray([[-0.3 * ulp]], jnp.bfloat16)
  b = jnp.asarray([1 + 0.6 * ulp], jnp.float32)
  product = np.float32(w[0, 0])
  once = jnp.asarray(product + b[0], jnp.float32).astype(jnp.bfloat16)
  twice = jnp.asarray(product + np.float32(b.astype(jnp.bfloat16)[0]),
                      jnp.float32).astype(jnp.bfloat16)
  assert once == 1.0 and twice != once  # The values tell the two roundings apart.
  assert dense(x, w, b, 1)[0, 0] == once
  layer = Dense(1, dtype=jnp.bfloat16)
  params = {"params": {"kernel": w.astype(jnp.float32), "bias": b}}
  assert layer.apply(params, x)[0, 0] == once


def test_auto_dtype_is_bfloat16_on_accelerators_and_float32_on_cpus():
  from transformer.config import ModelConfig, resolve_dtype
  assert [resolve_dtype("auto", b) for b in ("gpu", "tpu", "cpu")] == [
      "bfloat16", "bfloat16", "float32"]
  assert resolve_dtype("float32", "gpu") == "float32"  # An explicit dtype stays.
  want = jnp.bfloat16 if jax.default_backend() in ("gpu", "tpu") else jnp.float32
  assert ModelConfig(dtype="auto").compute_dtype == want


def test_a_bfloat16_model_keeps_float32_parameters_and_moments():
  """model.dtype=bfloat16 (what 'auto' picks on an accelerator) computes in
  bfloat16 and keeps every parameter in float32, the embedding and LayerNorm
  scales included, and so Adam's moments: updates of order lr * 1 added to
  weights of order 1 would round away in bfloat16's 8 bits."""
  x = random_tokens(np.random.default_rng(0), [4, 3], 5)
  params = jax.eval_shape(Transformer(tiny_config(dtype="bfloat16")).init,
                          jax.random.key(0), x, x)["params"]
  tx, _ = optim.make_optimizer(base.get_config().optim, d_model=32)
  moments = jax.eval_shape(tx.init, params)
  wrong = [jax.tree_util.keystr(p) for p, leaf in jax.tree_util.tree_leaves_with_path(
      (params, moments)) if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype != jnp.float32]
  assert not wrong, wrong
