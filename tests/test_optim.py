"""The learning-rate schedule of section 5.3 and the paper's Adam settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer import optim


@pytest.mark.parametrize("step", [1, 10, 100, 3999, 4000, 4001, 10000, 100000])
def test_schedule_matches_formula(step):
  schedule = optim.transformer_schedule(512, 4000)
  expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
  assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)


def test_schedule_peaks_at_warmup():
  schedule = optim.transformer_schedule(512, 4000)
  lrs = np.asarray(jax.vmap(schedule)(jnp.arange(20000)))
  assert int(np.argmax(lrs)) + 1 == 4000
  assert lrs.max() == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-5)


def adam_by_hand(grads, lrs, b1, b2, eps):
  """Kingma & Ba's Adam with bias correction, one update per gradient."""
  m = v = np.zeros_like(grads[0], np.float64)
  updates = []
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    updates.append(-lr * m_hat / (np.sqrt(v_hat) + eps))
  return updates


@pytest.mark.parametrize("b1,b2,eps", [(0.9, 0.98, 1e-9), (0.5, 0.9, 1e-2)])
def test_optimizer_updates_equal_adam_by_hand_over_several_steps(b1, b2, eps):
  """Gradients that change sign and size, so that every update after the first
  depends on beta1 and beta2; gradients of the order of eps, so that eps
  shows (the first update alone is -lr * sign(g) whatever b1 and b2 are)."""
  config = base.get_config().optim
  config.adam_b1, config.adam_b2, config.adam_eps = b1, b2, eps
  tx, _ = optim.make_optimizer(config, d_model=512)
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=6) * rng.choice([1e-2, 1.0, 10.0]) for _ in range(8)]
  params = {"w": jnp.zeros(6)}
  state = tx.init(params)
  schedule = optim.transformer_schedule(512, config.warmup_steps)
  want = adam_by_hand(grads, [float(schedule(i)) for i in range(8)], b1, b2, eps)
  for g, expected in zip(grads, want):
    updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
    np.testing.assert_allclose(updates["w"], expected, rtol=2e-5, atol=1e-12)
  # The hand computation tells the settings apart: other betas give other updates.
  other = adam_by_hand(grads, [1.0] * 8, 0.0, 0.5, eps)
  assert not np.allclose(other[-1] * float(schedule(7)), want[-1], rtol=1e-2)


def test_optimizer_is_adam_with_paper_hyperparameters():
  config = base.get_config().optim
  tx, schedule = optim.make_optimizer(config, d_model=512)
  params = {"w": jnp.asarray([1.0, -2.0])}
  grads = {"w": jnp.asarray([0.5, 0.25])}
  updates, _ = tx.update(grads, tx.init(params), params)
  # First Adam step: m_hat = g, v_hat = g^2, update = -lr * g / (|g| + eps).
  lr = 512**-0.5 * 4000**-1.5
  np.testing.assert_allclose(updates["w"], -lr * np.sign([0.5, 0.25]), rtol=1e-5)
  # The returned schedule (what training logs) is the rate that update used.
  np.testing.assert_allclose(float(schedule(0)), lr, rtol=1e-6)
  assert (config.adam_b1, config.adam_b2, config.adam_eps) == (0.9, 0.98, 1e-9)


def test_clipping_scales_the_global_norm_to_its_bound_before_adam():
  """optim.grad_clip_norm (the RNN configs' 1.0): a gradient of global norm 5 is
  scaled to norm 1 before Adam sees it, one under the bound is left alone.
  Adam is scale-invariant at its first step, so the check is the second update,
  whose moments mix the clipped first gradient with the unclipped second."""
  config = base.get_config().optim
  config.grad_clip_norm = 1.0
  tx, schedule = optim.make_optimizer(config, d_model=512)
  params = {"w": jnp.zeros(2), "b": jnp.zeros(1)}
  state = tx.init(params)
  first = {"w": jnp.asarray([3.0, 0.0]), "b": jnp.asarray([4.0])}  # Global norm 5.
  second = {"w": jnp.asarray([0.3, -0.1]), "b": jnp.asarray([0.2])}  # Norm < 1.
  _, state = tx.update(first, state, params)
  updates, _ = tx.update(second, state, params)
  clipped = [np.array([0.6, 0.0, 0.8]), np.array([0.3, -0.1, 0.2])]
  want = adam_by_hand(clipped, [float(schedule(0)), float(schedule(1))],
                      config.adam_b1, config.adam_b2, config.adam_eps)[-1]
  np.testing.assert_allclose(np.r_[updates["w"], updates["b"]], want, rtol=1e-5)
  unclipped = adam_by_hand([np.array([3.0, 0.0, 4.0]), clipped[1]],
                           [float(schedule(0)), float(schedule(1))], 0.9, 0.98, 1e-9)[-1]
  assert not np.allclose(unclipped, want, rtol=1e-2)


def test_weight_decay_is_decoupled_and_applies_to_every_parameter():
  """optim.weight_decay (off in the paper): AdamW's -lr * wd * w beside Adam's
  step, on every leaf (biases and LayerNorm scales included: no mask)."""
  config = base.get_config().optim
  config.weight_decay = 0.1
  tx, schedule = optim.make_optimizer(config, d_model=512)
  params = {"w": jnp.asarray([1.0, -2.0]), "scale": jnp.asarray([3.0])}
  grads = {"w": jnp.asarray([0.5, 0.25]), "scale": jnp.asarray([-1.0])}
  updates, _ = tx.update(grads, tx.init(params), params)
  lr = float(schedule(0))
  np.testing.assert_allclose(updates["w"], -lr * (np.sign([0.5, 0.25]) + 0.1 * np.array([1., -2.])),
                             rtol=1e-5)
  np.testing.assert_allclose(updates["scale"], -lr * (-1.0 + 0.1 * 3.0), rtol=1e-5)
