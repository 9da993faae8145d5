"""The learning-rate schedule of section 5.3 and the paper's Adam settings."""

import jax
import jax.numpy as jnp
import ml_collections
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


def test_optimizer_is_adam_with_paper_hyperparameters():
  config = base.get_config().optim
  tx = optim.make_optimizer(config, d_model=512)
  params = {"w": jnp.asarray([1.0, -2.0])}
  grads = {"w": jnp.asarray([0.5, 0.25])}
  updates, _ = tx.update(grads, tx.init(params), params)
  # First Adam step: m_hat = g, v_hat = g^2, update = -lr * g / (|g| + eps).
  lr = 512**-0.5 * 4000**-1.5
  np.testing.assert_allclose(updates["w"], -lr * np.sign([0.5, 0.25]), rtol=1e-5)
  assert (config.adam_b1, config.adam_b2, config.adam_eps) == (0.9, 0.98, 1e-9)
