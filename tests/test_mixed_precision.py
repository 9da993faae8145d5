"""Tests for transformer/mixed_precision.py: the Dense layers' products."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.mixed_precision import dense_dot_general

# The model's Dense forms: FFN [B,T,D] x [D,F]; Q/K/V [B,T,D] x [D,H,K];
# heads merge [B,T,H,K] x [H,K,D].
FORMS = [((3, 5, 8), (8, 6), 1), ((3, 5, 8), (8, 2, 4), 1), ((3, 5, 2, 4), (2, 4, 8), 2)]


def dense_dims(x_ndim, n):
  return ((tuple(range(x_ndim - n, x_ndim)), tuple(range(n))), ((), ()))


def loss_fn(dot, dtype, dims):
  """A scalar of the product with a non-uniform cotangent."""
  return lambda x, w: jnp.sum(jnp.sin(dot(x.astype(dtype), w.astype(dtype), dims)
                                      .astype(jnp.float32)))


def inputs(x_shape, w_shape):
  kx, kw = jax.random.split(jax.random.key(0))
  return jax.random.normal(kx, x_shape), jax.random.normal(kw, w_shape)


@pytest.mark.parametrize("x_shape,w_shape,n", FORMS)
def test_float32_equals_autodiff_of_lax_dot_general(x_shape, w_shape, n):
  """The hand-written gradient (2-D weight-gradient product) against autodiff:
  the same value exactly, the same gradients up to float32 summation order."""
  x, w = inputs(x_shape, w_shape)
  dims = dense_dims(len(x_shape), n)
  ours = jax.jit(jax.value_and_grad(loss_fn(dense_dot_general, jnp.float32, dims), (0, 1)))(x, w)
  ref = jax.jit(jax.value_and_grad(loss_fn(jax.lax.dot_general, jnp.float32, dims), (0, 1)))(x, w)
  np.testing.assert_array_equal(ours[0], ref[0])
  for a, b in zip(ours[1], ref[1]):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_float32_weight_gradient_is_one_2d_product():
  """What makes the float32 step fast on a CPU: the weight gradient contracts one
  flattened token axis, not autodiff's batch and time axes of [B, T, ...] arrays."""
  x, w = inputs((3, 5, 2, 4), (2, 4, 8))
  dims = dense_dims(4, 2)
  grad = jax.jit(jax.grad(loss_fn(dense_dot_general, jnp.float32, dims), 1))
  text = grad.lower(x, w).as_text()
  assert re.search(r"stablehlo\.dot_general.*contracting_dims = \[0\] x \[0\].*"
                   r"tensor<15x8xf32>, tensor<15x8xf32>\) -> tensor<8x8xf32>", text), text


@pytest.mark.parametrize("x_shape,w_shape,n", FORMS)
def test_bfloat16_values_and_gradients_match_float32_accumulation(x_shape, w_shape, n):
  """Against float32 math on the same bf16-rounded inputs: only the rounding of
  the product and of the cotangent to bf16 differs (~2^-8 relative)."""
  x, w = inputs(x_shape, w_shape)
  dims = dense_dims(len(x_shape), n)
  x16, w16 = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  out = dense_dot_general(x16, w16, dims)
  assert out.dtype == jnp.bfloat16
  ref = jax.lax.dot_general(x16.astype(jnp.float32), w16.astype(jnp.float32), dims)
  np.testing.assert_allclose(out.astype(jnp.float32), ref, rtol=1e-2, atol=1e-2)

  grads = jax.grad(lambda x, w: jnp.sum(jnp.sin(dense_dot_general(x, w, dims)
                                                .astype(jnp.float32))), (0, 1))(x16, w16)
  ref_grads = jax.grad(loss_fn(jax.lax.dot_general, jnp.float32, dims), (0, 1))(
      x16.astype(jnp.float32), w16.astype(jnp.float32))
  for g, r in zip(grads, ref_grads):
    assert g.dtype == jnp.bfloat16
    scale = float(jnp.max(jnp.abs(r)))
    np.testing.assert_allclose(g.astype(jnp.float32), r, atol=0.03 * scale)


def test_bfloat16_products_all_accumulate_in_float32():
  """What makes the bf16 step fast on a CPU: every dot of the forward and
  backward pass has a float32 result (a bf16-result dot runs at float32 speed)."""
  x, w = inputs((3, 5, 8), (8, 6))
  dims = dense_dims(3, 1)
  grad = jax.jit(jax.grad(loss_fn(dense_dot_general, jnp.bfloat16, dims), (0, 1)))
  text = grad.lower(x, w).as_text()
  results = re.findall(r"stablehlo\.dot_general.*?->\s*tensor<[^>]*x(\w+)>", text)
  assert len(results) == 3 and set(results) == {"f32"}, results
  plain = jax.jit(jax.grad(loss_fn(jax.lax.dot_general, jnp.bfloat16, dims), (0, 1)))
  assert "bf16" in re.findall(r"stablehlo\.dot_general.*?->\s*tensor<[^>]*x(\w+)>",
                              plain.lower(x, w).as_text())


def test_other_forms_pass_through():
  """A batched product (not a Dense layer's) is jax.lax.dot_general as is."""
  a = jnp.ones((2, 3, 4), jnp.bfloat16); b = jnp.ones((2, 4, 5), jnp.bfloat16)
  dims = (((2,), (1,)), ((0,), (0,)))
  out = dense_dot_general(a, b, dims)
  assert out.dtype == jnp.bfloat16 and out.shape == (2, 3, 5)
  np.testing.assert_array_equal(out, jax.lax.dot_general(a, b, dims))
  # A Dense product that asks for a precision keeps it: lax.dot_general's path.
  x, w = (v.astype(jnp.bfloat16) for v in inputs((3, 5, 8), (8, 6)))
  highest = jax.lax.Precision.HIGHEST
  text = jax.jit(lambda x, w: dense_dot_general(x, w, dense_dims(3, 1), precision=highest)
                 ).lower(x, w).as_text()
  assert "HIGHEST" in text and "f32" not in re.findall(
      r"stablehlo\.dot_general.*?->\s*tensor<[^>]*x(\w+)>", text)


def test_auto_dtype_is_bfloat16_on_accelerators_and_float32_on_cpus():
  from transformer.config import ModelConfig, resolve_dtype
  assert [resolve_dtype("auto", b) for b in ("gpu", "tpu", "cpu")] == [
      "bfloat16", "bfloat16", "float32"]
  assert resolve_dtype("float32", "gpu") == "float32"  # An explicit dtype stays.
  want = jnp.bfloat16 if jax.default_backend() in ("gpu", "tpu") else jnp.float32
  assert ModelConfig(dtype="auto").compute_dtype == want
