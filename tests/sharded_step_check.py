"""Run by tests/test_training.py with 8 fake CPU devices (XLA_FLAGS must be set
before JAX starts, hence a separate process): one train step on a mesh of 8
devices, replicated and FSDP, equals the same step on one device.

Tolerance: the 8-way step sums per-device partial gradients in another order
than the single device does, so float32 round-off differs (~1e-7 relative);
1e-5 absolute on parameters after one Adam step is far below any real bug
(a wrong mask or a missing device's rows changes the loss at the 1e-2 level).
"""

import sys

import jax
import numpy as np

sys.path.insert(0, ".")
from tests.test_training import tiny_config  # pylint: disable=g-import-not-at-top
from transformer import sharding, training


def one_step(devices, fsdp):
  config = tiny_config("/tmp/unused")
  config.train.fsdp = fsdp
  config.model.d_model = 128  # Big enough that FSDP really splits leaves.
  config.model.d_ff = 256
  config.optim.adam_eps = 1e-3  # See test_training.ADAM_EPS_NOTE.
  mesh = sharding.make_mesh(devices)
  model, tx, abstract, shardings = training.build(config, 24, mesh)
  state = training.init_state(model, tx, config, shardings)
  train_fn, _ = training.compile_steps(model, tx, config, mesh, shardings)
  rng = np.random.default_rng(0)
  targets = rng.integers(4, 24, size=(16, 12)).astype(np.int32)
  targets[::3, 6:] = 0
  batch = {"inputs": rng.integers(4, 24, size=(16, 10)).astype(np.int32), "targets": targets}
  state, metrics = train_fn(state, sharding.place_batch(batch, mesh))
  split = [x.sharding.spec for x in jax.tree.leaves(state.params)]
  return jax.device_get(state.params), jax.device_get(metrics), split


def main():
  assert jax.device_count() == 8, jax.devices()
  single, m_single, _ = one_step(jax.devices()[:1], fsdp=False)
  for fsdp in (False, True):
    params, metrics, specs = one_step(jax.devices(), fsdp)
    if fsdp:
      assert any(sharding.DATA_AXIS in tuple(s) for s in specs), "FSDP split nothing"
    np.testing.assert_allclose(metrics["loss"], m_single["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(single)):
      np.testing.assert_allclose(a, b, atol=1e-5)
  print("sharded == single-device: replicated, fsdp")


if __name__ == "__main__":
  main()
