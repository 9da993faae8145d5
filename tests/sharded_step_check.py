"""Run by tests/test_training.py with 8 fake CPU devices (XLA_FLAGS must be set
before JAX starts, hence a separate process): training steps on a mesh of 8
devices, replicated and FSDP, equal the same steps on one device, and greedy and
beam decoding with FSDP-sharded parameters equal decoding on one device.

Tolerance: the 8-way step sums per-device partial gradients in another order
than the single device does, so float32 round-off differs (~1e-7 relative, and
Adam's division by sqrt(v) carries it into the parameters); a wrong mask or a
missing device's rows changes the loss and gradient norm at the 1e-2 level.
Each step's loss and gradient norm are compared (the gradient, not only Adam's
nearly sign-only update), over several steps, so that an error in one step
shows in the next steps' values too.
"""

import sys

import jax
import numpy as np

sys.path.insert(0, ".")
from tests.helpers import tiny_experiment  # pylint: disable=g-import-not-at-top
from transformer import inference, sharding, state as state_lib, training

STEPS = 4


def config_for(fsdp):
  config = tiny_experiment("/tmp/unused")
  config.train.fsdp = fsdp
  config.model.d_model = 128  # Big enough that FSDP really splits leaves.
  config.model.d_ff = 256
  config.optim.adam_eps = 1e-3  # See test_training.ADAM_EPS_NOTE.
  return config


def batches():
  rng = np.random.default_rng(0)
  for _ in range(STEPS):
    targets = rng.integers(4, 24, size=(16, 12)).astype(np.int32)
    targets[::3, 6:] = 0
    yield {"inputs": rng.integers(4, 24, size=(16, 10)).astype(np.int32), "targets": targets}


def train(devices, fsdp):
  config = config_for(fsdp)
  mesh = sharding.make_mesh(devices)
  model, tx, _, shardings, _ = state_lib.build(config, 24, mesh)
  state = state_lib.init_state(model, tx, config, shardings)
  train_fn, _ = training.compile_steps(model, tx, config, mesh, shardings)
  metrics = []
  for batch in batches():
    state, m = train_fn(state, sharding.place_batch(batch, mesh))
    metrics.append(jax.device_get(m))
  split = [x.sharding.spec for x in jax.tree.leaves(state.params)]
  return model, state, metrics, split


def decode_all(model, params, config, mesh):
  rng = np.random.default_rng(1)
  examples = [(rng.integers(4, 24, size=n).astype(np.int32), np.array([3], np.int32))
              for n in rng.integers(2, 12, size=21)]
  return {mode: [ids.tolist() for ids in inference.decode_ids(
      model, params, examples, config, mesh, mode=mode, beam_size=3, max_extra_len=6)]
          for mode in ("greedy", "beam")}


def main():
  assert jax.device_count() == 8, jax.devices()
  model, single, m_single, _ = train(jax.devices()[:1], fsdp=False)
  for fsdp in (False, True):
    _, state, metrics, specs = train(jax.devices(), fsdp)
    if fsdp:
      assert any(sharding.DATA_AXIS in tuple(s) for s in specs), "FSDP split nothing"
    for step, (m, want) in enumerate(zip(metrics, m_single), start=1):
      for key in ("loss", "grad_norm", "update_norm", "tokens"):
        np.testing.assert_allclose(m[key], want[key], rtol=1e-5, err_msg=f"step {step} {key}")
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(single.params)):
      np.testing.assert_allclose(a, b, atol=1e-5)
  print(f"sharded == single-device over {STEPS} steps: replicated, fsdp")

  # Decoding with the single-device parameters placed FSDP-style over 8 devices.
  config = config_for(fsdp=True)
  mesh = sharding.make_mesh()
  _, _, abstract, shardings, _ = state_lib.build(config, 24, mesh)
  params = jax.device_put(jax.device_get(single.params), shardings.params)
  assert any(sharding.DATA_AXIS in tuple(x.sharding.spec) for x in jax.tree.leaves(params))
  one = decode_all(model, single.params, config, sharding.make_mesh(jax.devices()[:1]))
  assert decode_all(model, params, config, mesh) == one
  print("decoding with FSDP-sharded parameters == single-device: greedy, beam")


if __name__ == "__main__":
  main()
