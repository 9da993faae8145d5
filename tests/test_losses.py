"""Label-smoothed cross-entropy against a hand computation; padding is ignored."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer import losses


def test_label_smoothed_loss_by_hand():
  logits = jnp.asarray([[[2.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 3.0], [5.0, 5.0, 5.0, 5.0]]])
  targets = jnp.asarray([[1, 3, 0]])  # id 0 is padding
  weights = losses.target_weights(targets)  # last token is padding
  eps = 0.1
  sums = losses.cross_entropy_sums(logits, targets, weights, label_smoothing=eps)

  def smoothed(row, target):
    logz = math.log(sum(math.exp(v) for v in row))
    logp = [v - logz for v in row]
    # Szegedy et al.'s smoothing: eps / V on every class, PAD (id 0) included.
    q = [eps / 4 + (1 - eps) * (i == target) for i in range(4)]
    return -sum(qi * lp for qi, lp in zip(q, logp)), -logp[target]

  (l0, n0), (l1, n1) = smoothed([2, 0, 0, 1], 1), smoothed([0, 1, 0, 3], 3)
  assert float(sums["loss"]) == pytest.approx(l0 + l1, rel=1e-6)
  assert float(sums["nll"]) == pytest.approx(n0 + n1, rel=1e-6)
  assert float(sums["tokens"]) == 2.0 and float(sums["correct"]) == 1.0
  per_token = losses.normalize(sums)
  assert float(per_token["loss"]) == pytest.approx((l0 + l1) / 2, rel=1e-6)
  assert float(per_token["accuracy"]) == 0.5


def test_padding_positions_do_not_count():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, 4, 7)), jnp.float32)
  targets = jnp.asarray([[3, 4, 0, 0], [5, 6, 1, 0]])
  sums = losses.cross_entropy_sums(logits, targets, losses.target_weights(targets))
  other = logits.at[0, 2:].set(100.0).at[1, 3].set(-100.0)
  sums2 = losses.cross_entropy_sums(other, targets, losses.target_weights(targets))
  for key in sums:
    assert float(sums[key]) == pytest.approx(float(sums2[key]), rel=1e-6)
  assert float(sums["tokens"]) == 5.0


def test_no_smoothing_is_plain_nll():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(1, 3, 5)), jnp.float32)
  targets = jnp.asarray([[1, 2, 3]])
  sums = losses.cross_entropy_sums(logits, targets, losses.target_weights(targets), 0.0)
  assert float(sums["loss"]) == pytest.approx(float(sums["nll"]), rel=1e-6)


def test_equals_optax_smoothed_labels_in_value_and_gradient():
  """The one-log_softmax form against optax's smooth_labels + softmax_cross_entropy."""
  rng = np.random.default_rng(2)
  logits = jnp.asarray(3 * rng.normal(size=(3, 5, 11)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, size=(3, 5)))
  weights = losses.target_weights(targets)

  def ours(x):
    return losses.cross_entropy_sums(x, targets, weights, 0.1)["loss"]

  def reference(x):
    q = optax.smooth_labels(jax.nn.one_hot(targets, 11), 0.1)
    return jnp.sum(optax.softmax_cross_entropy(x, q) * weights)

  np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(reference)(logits),
                             atol=1e-6)


def test_hand_written_gradient_matches_autodiff_of_the_plain_formula():
  """The custom gradient against jax.grad of log_softmax, for the loss, the nll and a
  mix of both (both cotangents non-zero), with padding and large logits, under jit."""
  rng = np.random.default_rng(3)
  logits = jnp.asarray(30 * rng.normal(size=(2, 6, 13)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 13, size=(2, 6))).at[1, 4:].set(0)
  weights = losses.target_weights(targets)

  def plain(x):
    logp = jax.nn.log_softmax(x)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    loss = 0.9 * nll - 0.1 / 13 * jnp.sum(logp, axis=-1)
    return jnp.sum(loss * weights), jnp.sum(nll * weights)

  def ours(x):
    sums = losses.cross_entropy_sums(x, targets, weights, 0.1)
    return sums["loss"], sums["nll"]

  for mix in (lambda l, n: l, lambda l, n: n, lambda l, n: 0.3 * l - 2.0 * n):
    want = jax.grad(lambda x: mix(*plain(x)))(logits)
    got = jax.jit(jax.grad(lambda x: mix(*ours(x))))(logits)
    np.testing.assert_allclose(got, want, atol=1e-5)
  np.testing.assert_allclose(jax.jit(ours)(logits), plain(logits), rtol=1e-6)
  assert np.all(np.isfinite(jax.grad(lambda x: ours(x)[0])(logits)))


def test_correct_counts_argmax_hits():
  rng = np.random.default_rng(4)
  logits = jnp.asarray(rng.normal(size=(4, 9, 17)), jnp.float32)
  targets = jnp.asarray(rng.integers(1, 17, size=(4, 9)))
  targets = jnp.where(rng.random((4, 9)) < 0.5, jnp.argmax(logits, -1), targets)
  targets = targets.at[0, 5:].set(0)  # padding
  weights = losses.target_weights(targets)
  want = jnp.sum((jnp.argmax(logits, -1) == targets) * weights)
  got = losses.cross_entropy_sums(logits, targets, weights)["correct"]
  assert float(got) == float(want) > 0


def test_a_tie_for_the_largest_logit_is_a_hit_and_a_near_tie_is_not():
  """`correct` counts a reference that ties another token for the largest
  logit (either of the two tied), and not one a hair below it."""
  logits = jnp.asarray([[[1.0, 3.0, 3.0, 0.0], [1.0, 3.0, 3.0 - 1e-4, 0.0]]], jnp.float32)
  correct = lambda *targets: float(losses.cross_entropy_sums(
      logits, jnp.asarray([targets]), jnp.ones((1, 2)))["correct"])
  assert correct(1, 1) == 2.0 and correct(2, 1) == 2.0
  assert correct(2, 2) == 1.0 and correct(0, 3) == 0.0
