"""steps.train_step on its own: gradient accumulation equals one big batch, padding
changes no update, dropout draws new masks per step and micro-batch, and the
compiled step makes no host transfers (the loop around it: test_training.py).

The tests share one initial state and one jitted step per dropout rate and
number of micro-batches (_tiny_step), and batch shapes where they can: each
distinct step is a compilation of its own."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import ADAM_EPS_NOTE, tiny_experiment
from transformer import sharding, state as state_lib, steps


@functools.lru_cache(maxsize=None)
def _built(dropout):
  """(model, tx, config, shardings) of the tiny model at `dropout`."""
  config = tiny_experiment("/tmp/unused")  # No data is read.
  config.model.dropout = dropout
  config.optim.adam_eps = ADAM_EPS_NOTE
  mesh = sharding.make_mesh(jax.devices()[:1])
  model, tx, _, shardings, _ = state_lib.build(config, 23, mesh)
  return model, tx, config, shardings


@functools.lru_cache(maxsize=None)
def _initial_state():
  """The tiny model's initial state: the same at every dropout rate (dropout
  draws no parameters), initialised once."""
  return state_lib.init_state(*_built(0.0))


@functools.lru_cache(maxsize=None)
def _jitted_step(dropout, k=1):
  model, tx, _, _ = _built(dropout)
  return jax.jit(lambda s, b: steps.train_step(s, b, model=model, tx=tx, label_smoothing=0.1,
                                               grad_accum_steps=k))


def _tiny_step(dropout=0.0):
  """A tiny model's state, an 8-row batch whose rows hold different numbers of
  real tokens, and train_step jitted for k micro-batches: step(k). (The jitted
  step does not donate the state, which the tests share.)"""
  state = _initial_state()
  rng = np.random.default_rng(0)
  targets = rng.integers(4, 23, size=(8, 12)).astype(np.int32)
  targets[::3, 7:] = 0
  batch = {"inputs": rng.integers(4, 23, size=(8, 10)).astype(np.int32), "targets": targets}
  return state, batch, functools.partial(_jitted_step, dropout)


def test_gradient_accumulation_equals_one_big_batch():
  """Two micro-batches of 4 rows (rows 0, 2, 4, 6 and 1, 3, 5, 7: 2 and 1 of them
  padded, so they hold different numbers of tokens) make the update of the
  8-row batch at once (the step with k=2 is test_each_micro_batch_draws_its_own_
  dropout_masks' too)."""
  state, batch, step = _tiny_step()  # No dropout: micro-batches draw other masks.
  (s1, m1), (s2, m2) = step(1)(state, batch), step(2)(state, batch)
  np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5)
  np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
  for x, y in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(x, y, atol=1e-6)


def test_padding_changes_no_update():
  """Gradients are of the mean loss per real target token: the same batch with
  more PAD columns gives the same gradient norm and update (divided by the
  padded size, the gradients would shrink with the padding, and so would
  clipping's and the batches' weights)."""
  state, batch, step = _tiny_step()
  padded = {k: np.pad(v, ((0, 0), (0, 6))) for k, v in batch.items()}
  (s1, m1), (s2, m2) = step()(state, batch), step()(state, padded)
  for name in ("loss", "grad_norm", "update_norm", "tokens"):
    np.testing.assert_allclose(m1[name], m2[name], rtol=1e-5, err_msg=name)
  for x, y in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(x, y, atol=1e-6)


def test_each_step_draws_new_dropout_masks():
  """The dropout key is folded with the step: the same batch and parameters at
  steps 0 and 1 give other gradients under dropout, the same without it (one
  key for every step would drop the same units of each batch shape forever).
  The batch: 4 of the rows, the shape of the next test's single micro-batch."""
  for dropout, same in ((0.3, False), (0.0, True)):
    state, batch, step = _tiny_step(dropout)
    half = {k: v[:4] for k, v in batch.items()}
    norms = [float(step(1)(state.replace(step=jnp.asarray(n, state.step.dtype)), half)[1][
        "grad_norm"]) for n in (0, 1)]
    assert (norms[0] == norms[1]) is same, (dropout, norms)


def test_each_micro_batch_draws_its_own_dropout_masks():
  """With gradient accumulation, micro-batch i's dropout key is folded with i:
  two identical micro-batches (rows 2r and 2r+1 alike; row r goes to micro-batch
  r % k) under dropout give another gradient than one of them alone, as two
  draws do; without dropout the same (one key for all would give the same too)."""
  for dropout, same in ((0.3, False), (0.0, True)):
    state, batch, step = _tiny_step(dropout)
    half = {k: v[:4] for k, v in batch.items()}
    twice = {k: np.repeat(v[:4], 2, axis=0) for k, v in batch.items()}
    norms = float(step(1)(state, half)[1]["grad_norm"]), float(step(2)(state, twice)[1][
        "grad_norm"])
    assert bool(np.isclose(*norms, rtol=1e-5)) is same, (dropout, norms)


def test_train_step_makes_no_host_transfers():
  """The compiled step reads only arrays already on the devices and returns device
  arrays: under jax.transfer_guard('disallow') any implicit host<->device copy (a
  numpy batch, a Python value pulled out of a traced array) raises. The control: the
  same step fed an unplaced numpy batch does raise."""
  config = tiny_experiment("/tmp/unused")  # No data is read.
  mesh = sharding.make_mesh()
  model, tx, _, shardings, _ = state_lib.build(config, 23, mesh)
  state = state_lib.init_state(model, tx, config, shardings)
  train_fn, _ = steps.compile_steps(model, tx, config, mesh, shardings)
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.integers(4, 23, size=(8, 10)).astype(np.int32),
           "targets": rng.integers(4, 23, size=(8, 12)).astype(np.int32)}
  placed = sharding.place_batch(batch, mesh)  # The loop's one explicit transfer.
  state, _ = train_fn(state, placed)  # Compiled outside the guard.
  with jax.transfer_guard("disallow"):
    for _ in range(2):
      state, metrics = train_fn(state, placed)
    jax.block_until_ready((state, metrics))
    with pytest.raises(Exception, match="[Dd]isallowed"):
      train_fn(state, batch)
  assert int(jax.device_get(state.step)) == 3
