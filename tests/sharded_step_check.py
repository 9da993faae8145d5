"""Run by tests/test_training.py with 8 fake CPU devices (XLA_FLAGS must be set
before JAX starts, hence a separate process): training steps on a mesh of 8
devices (data parallel with FSDP, and data=2 x model=4 tensor parallel with
FSDP) equal the same steps on one device, each device drawing only its own
rows' dropout masks on the data-parallel mesh, and each mesh's state
initialised straight into its shardings; greedy, beam (also refilling) and
sampled decoding on the data=2 x model=4 mesh, with parameters split over both
axes at once (FSDP and tensor parallel) and the rows over the data axis, two
batches at a time, equal decoding on one device one batch at a time. The RNN
baseline, data parallel with FSDP, trains (from the single device's initial
state placed over the mesh: initialising into shardings is the Transformer's
part above, and compiling the RNN's initialisation for 8 devices costs more
than the rest of its checks) and decodes as on one device too.

Tolerance: the 8-way step sums per-device partial gradients in another order
than the single device does, so float32 round-off differs (~1e-7 relative, and
Adam's division by sqrt(v) carries it into the parameters); a wrong mask or a
missing device's rows changes the loss and gradient norm at the 1e-2 level.
Each step's loss and gradient norm are compared (the gradient, not only Adam's
nearly sign-only update), over several steps, so that an error in one step
shows in the next steps' values too.
"""

import math
import re
import sys

import jax
import numpy as np

sys.path.insert(0, ".")
from tests.helpers import tiny_experiment  # pylint: disable=g-import-not-at-top
from transformer import inference, runtime, sharding, state as state_lib, steps

STEPS = 4


# Data parallel with FSDP, and tensor parallel with FSDP (both axes split the
# parameters at once); replicated data parallel is test_multiprocess.py's.
MESHES = (("data=8,model=1", True), ("data=2,model=4", True))


def config_for(fsdp, mesh="data=-1,model=1"):
  config = tiny_experiment("/tmp/unused")
  config.train.fsdp = fsdp
  config.train.mesh = mesh
  config.model.d_model = 128  # Big enough that FSDP really splits leaves.
  config.model.d_ff = 256
  config.model.num_heads = 4  # The model axis splits whole heads.
  config.optim.adam_eps = 1e-3  # See tests/helpers.ADAM_EPS_NOTE.
  return config


def batches():
  rng = np.random.default_rng(0)
  for _ in range(STEPS):
    targets = rng.integers(4, 24, size=(16, 12)).astype(np.int32)
    targets[::3, 6:] = 0
    yield {"inputs": rng.integers(4, 24, size=(16, 10)).astype(np.int32), "targets": targets}


def rnn_config_for(fsdp, mesh="data=-1,model=1"):
  """The RNN baseline (configs/rnn_scan.py) at d_model 128: data parallel only."""
  from configs import rnn_scan  # pylint: disable=g-import-not-at-top
  config = rnn_scan.get_config()
  config.train.fsdp = fsdp
  config.train.mesh = mesh
  config.model.d_model = 128
  config.optim.adam_eps = 1e-3
  return config


def train(devices, fsdp, spec="data=-1,model=1", make_config=config_for, initial=None):
  """STEPS steps on `devices` from init_state, or from `initial` (a host copy of a
  state) placed on the mesh; (model, state, metrics, parameter specs, dropout
  words, a host copy of the initial state)."""
  config = make_config(fsdp, spec)
  mesh = sharding.make_mesh(devices, spec)
  model, tx, _, shardings, _ = state_lib.build(config, 24, mesh)
  if initial is None:
    state = state_lib.init_state(model, tx, config, shardings)
  else:
    state = jax.device_put(initial, shardings)
  initial = jax.device_get(state)  # Before the steps donate it.
  train_fn, _ = steps.compile_steps(model, tx, config, mesh, shardings)
  words = largest_random_draw(train_fn, state, sharding.place_batch(next(batches()), mesh))
  metrics = []
  for batch in batches():
    state, m = train_fn(state, sharding.place_batch(batch, mesh))
    metrics.append(jax.device_get(m))
  split = [x.sharding.spec for x in jax.tree.leaves(state.params)]
  return model, state, metrics, split, words, initial


def largest_random_draw(train_fn, state, placed):
  """Elements in the compiled step's largest uint32 array, per device: the
  dropout masks' random words (token ids are int32)."""
  text = train_fn.lower(state, placed).compile().as_text()
  return max(math.prod(int(d) for d in dims.split(",") if d)
             for dims in re.findall(r"\bu32\[([0-9,]*)\]", text))


def decode_all(model, params, config, mesh, concurrent_batches=None,
               modes=("greedy", "beam", "sample")):
  rng = np.random.default_rng(1)
  # 21 sources of 2-8 tokens: three batches of 8 rows of width 8 (one compilation
  # a mode and mesh; the padding rows are split over the devices too), decoded
  # two at a time unless concurrent_batches says otherwise.
  examples = [(rng.integers(4, 24, size=n).astype(np.int32), np.array([3], np.int32))
              for n in rng.integers(2, 9, size=21)]
  return {mode: [ids.tolist() for ids in inference.decode_ids(
      model, params, examples, config, mesh, mode=mode, beam_size=3, max_extra_len=6,
      tokens_per_batch=64, concurrent_batches=concurrent_batches,
      refill=config.decode.get("refill", 0))]
          for mode in modes}


def main():
  assert jax.device_count() == 8, jax.devices()
  model, single, m_single, _, words_single, _ = train(jax.devices()[:1], fsdp=False)
  for spec, fsdp in MESHES:
    _, state, metrics, specs, words, _ = train(jax.devices(), fsdp, spec)
    if spec.startswith("data=8"):  # Each device draws its own rows' dropout words only.
      assert words_single >= 16 * 12 * 128 // 2 and words <= words_single // 8, (
          words, words_single)
    split = {axis for s in specs for axis in tuple(s) if axis}
    want_split = ({sharding.DATA_AXIS} if fsdp else set()) | (
        {sharding.MODEL_AXIS} if "model=4" in spec else set())
    assert split == want_split, (spec, fsdp, split)
    for step, (m, want) in enumerate(zip(metrics, m_single), start=1):
      for key in ("loss", "grad_norm", "update_norm", "tokens"):
        np.testing.assert_allclose(m[key], want[key], rtol=1e-5,
                                   err_msg=f"{spec} fsdp={fsdp} step {step} {key}")
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(single.params)):
      np.testing.assert_allclose(a, b, atol=1e-5)
  print(f"sharded == single-device over {STEPS} steps: " + ", ".join(
      f"{spec}{' fsdp' * fsdp}" for spec, fsdp in MESHES))

  # Decoding with the single-device parameters placed over 8 devices, split over
  # both axes (data=8 FSDP alone splits them over one: the same code, less of it).
  one = decode_all(model, single.params, config_for(False),
                   sharding.make_mesh(jax.devices()[:1]), concurrent_batches=1)
  config = config_for(True, "data=2,model=4")
  mesh = sharding.make_mesh(spec="data=2,model=4")
  _, _, _, shardings, _ = state_lib.build(config, 24, mesh)
  params = jax.device_put(jax.device_get(single.params), shardings.params)
  assert decode_all(model, params, config, mesh) == one
  # Refilling beam search: the rows restart items from a batch split over the devices.
  config.decode.refill = 3
  assert decode_all(model, params, config, mesh, modes=("beam",))["beam"] == one["beam"]
  print("decoding with FSDP- and tensor-parallel-sharded parameters, two batches at a "
        "time == single-device, one at a time: greedy, beam, sampling, beam with refill")

  # The RNN baseline: data parallel with FSDP, training and decoding.
  model, single, m_single, _, _, initial = train(jax.devices()[:1], False,
                                                 make_config=rnn_config_for)
  _, state, metrics, specs, _, _ = train(jax.devices(), True, "data=8,model=1",
                                         make_config=rnn_config_for, initial=initial)
  assert {axis for s in specs for axis in tuple(s) if axis} == {sharding.DATA_AXIS}, specs
  for step, (m, want) in enumerate(zip(metrics, m_single), start=1):
    for key in ("loss", "grad_norm", "update_norm", "tokens"):
      np.testing.assert_allclose(m[key], want[key], rtol=1e-5, err_msg=f"rnn step {step} {key}")
  one = decode_all(model, single.params, rnn_config_for(False),
                   sharding.make_mesh(jax.devices()[:1]), concurrent_batches=1,
                   modes=("greedy", "beam"))
  mesh = sharding.make_mesh(spec="data=8,model=1")
  shardings = state_lib.build(rnn_config_for(True), 24, mesh)[3]
  params = jax.device_put(jax.device_get(single.params), shardings.params)
  assert decode_all(model, params, rnn_config_for(True), mesh, modes=("greedy", "beam")) == one
  print("the RNN: data=8 fsdp == single-device over 4 steps, and greedy and beam decoding")


if __name__ == "__main__":
  runtime.use_compilation_cache()  # The tests' cache (TRANSFORMER_COMPILATION_CACHE).
  main()
