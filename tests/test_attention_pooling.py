"""Tests for examples/attention_pooling.py: the kernel weights are a softmax over the
training points, and the learned kernel beats average pooling on held-out points."""

import numpy as np

from examples import attention_pooling
from tests.test_plots import assert_png


def test_kernel_weights_are_a_softmax_over_training_points():
  x_train, _, x_test, _ = attention_pooling.make_data(seed=1)
  for w in (0.5, 1.0, 3.0):
    weights = np.asarray(attention_pooling.attention_weights(x_test, x_train, w))
    assert weights.shape == (len(x_test), len(x_train)) and (weights >= 0).all()
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  # Leave-one-out: a point never attends to itself, and its row still sums to one.
  others = ~np.eye(len(x_train), dtype=bool)
  weights = np.asarray(attention_pooling.attention_weights(x_train, x_train, 2.0, others))
  assert not weights.diagonal().any()
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  # A wider kernel (smaller w) spreads each query's weight over more points.
  narrow = attention_pooling.attention_weights(x_test, x_train, 3.0).max(-1)
  wide = attention_pooling.attention_weights(x_test, x_train, 0.5).max(-1)
  assert (np.asarray(narrow) > np.asarray(wide)).all()


def test_kernel_weights_are_the_gaussian_kernels_by_hand():
  """Nadaraya-Watson with the Gaussian kernel: alpha(q, k_i) is
  exp(-((q - k_i) w)^2 / 2) over its sum, and the pooled value their average of
  the values."""
  queries, keys, values = np.array([0.0, 1.5]), np.array([-1.0, 0.5, 2.0]), np.array([1., 2., 4.])
  for w in (0.5, 2.0):
    kernel = np.exp(-((queries[:, None] - keys[None, :]) * w) ** 2 / 2)
    want = kernel / kernel.sum(-1, keepdims=True)
    got = np.asarray(attention_pooling.attention_weights(queries, keys, w))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(attention_pooling.nadaraya_watson(queries, keys, values, w)), want @ values,
        rtol=1e-6)


def test_parametric_pooling_beats_average_pooling_and_draws(tmp_path):
  mse, w = attention_pooling.run(str(tmp_path), seed=0, steps=100)
  average, nonparametric, parametric = mse.values()
  assert w > 1.0  # The fit narrows the kernel: the curve bends faster than w = 1 follows.
  assert parametric < nonparametric < average
  assert parametric < 0.25 * average
  for name in ("attention_pooling_fit.png", "attention_pooling_weights.png"):
    assert_png(str(tmp_path / name))
