"""The training step, the evaluation step and teacher-forced loss evaluation:
pure functions of (state, batch), jitted once in `compile_steps` over the mesh.
The loop that drives them (checkpoints, logging, decoding, preemption) is
training.py's.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer import data as data_lib, losses, sharding


def _model_inputs(batch):
  return dict(inputs_BxS=batch["inputs"], targets_BxT=batch["targets"],
              inputs_segmentation=batch.get("inputs_segmentation"),
              targets_segmentation=batch.get("targets_segmentation"),
              inputs_position=batch.get("inputs_position"),
              targets_position=batch.get("targets_position"))


def loss_sums(params, batch, model, label_smoothing, rng=None):
  """Summed loss/nll/correct/tokens over the real target tokens of `batch`."""
  deterministic = rng is None
  logits = model.apply({"params": params}, **_model_inputs(batch),
                        deterministic=deterministic,
                        rngs=None if deterministic else {"dropout": rng})
  return losses.cross_entropy_sums(logits, batch["targets"],
                                   losses.target_weights(batch["targets"]),
                                   label_smoothing)


def train_step(state, batch, *, model, tx, label_smoothing, grad_accum_steps=1):
  """One update from a batch of k micro-batches; gradients are of the mean loss
  per real target token over the whole batch, whatever k is."""
  dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

  def micro_batches(x):  # [B, ...] -> [k, B/k, ...]; row r goes to micro-batch r % k,
    rows = x.shape[0]  # which keeps each device's rows on that device.
    x = x.reshape((rows // grad_accum_steps, grad_accum_steps) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)

  def accumulate(carry, micro):
    index, micro_batch = micro
    rng = jax.random.fold_in(dropout_rng, index)

    def loss_fn(params):
      sums = loss_sums(params, micro_batch, model, label_smoothing, rng)
      return sums["loss"], sums

    grads, sums = jax.grad(loss_fn, has_aux=True)(state.params)
    return jax.tree.map(jnp.add, carry, (grads, sums)), None

  zeros = (jax.tree.map(jnp.zeros_like, state.params),
           {k: jnp.zeros((), jnp.float32) for k in ("loss", "nll", "correct", "tokens")})
  if grad_accum_steps == 1:
    (grad_sums, sums), _ = accumulate(zeros, (0, batch))
  else:
    (grad_sums, sums), _ = jax.lax.scan(
        accumulate, zeros,
        (jnp.arange(grad_accum_steps), jax.tree.map(micro_batches, batch)))
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grad_sums)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = losses.normalize(sums)
  metrics.update(grad_norm=optax.tree.norm(grads), param_norm=optax.tree.norm(params),
                 update_norm=optax.tree.norm(updates))
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def eval_step(params, batch, *, model, label_smoothing):
  """Summed metrics of one evaluation batch (dropout off)."""
  return loss_sums(params, batch, model, label_smoothing)


def compile_steps(model, tx, config, mesh, state_shardings):
  """The jitted train and eval steps, with explicit shardings and donated state."""
  batch = sharding.batch_sharding(mesh)
  replicated = sharding.replicated(mesh)
  train = jax.jit(
      functools.partial(train_step, model=model, tx=tx,
                        label_smoothing=config.train.label_smoothing,
                        grad_accum_steps=config.train.grad_accum_steps),
      in_shardings=(state_shardings, batch), out_shardings=(state_shardings, replicated),
      donate_argnums=0)
  evaluate = jax.jit(
      functools.partial(eval_step, model=model, label_smoothing=config.train.label_smoothing),
      in_shardings=(state_shardings.params, batch), out_shardings=replicated)
  return train, evaluate


def eval_loss_sums(eval_fn, params, examples, config, mesh, totals=None):
  """Teacher-forced loss sums over `examples`, added to `totals` if given
  (losses.normalize turns them into per-token figures)."""
  # Every host builds the same batches and places its own share of their rows.
  # In a multi-process job, and over several CPU devices, each batch ends before
  # the next starts: the batches' programs do not depend on each other, so a CPU
  # client runs several at once, and one process's all-reduce of one batch can
  # meet another process's of the next, which hangs the job; in one process,
  # devices waiting in the all-reduces of many batches at once outlast the
  # rendezvous' 40 s (seen over 300 batches on 4 CPU devices).
  one_at_a_time = jax.process_count() > 1 or (
      mesh.devices.size > 1 and jax.default_backend() == "cpu")
  for _, batch in data_lib.eval_batches(examples, config.data.tokens_per_batch,
                                        batch_multiple=sharding.row_multiple(mesh),
                                        max_length=config.data.max_length):
    sums = eval_fn(params, sharding.place_batch(sharding.host_rows(batch), mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    if one_at_a_time:
      jax.block_until_ready(totals)
  return totals


def loss_metrics(totals):
  """Per-token loss, nll, accuracy and perplexity from eval_loss_sums' totals."""
  metrics = {k: float(v) for k, v in losses.normalize(jax.device_get(totals)).items()}
  metrics["perplexity"] = float(np.exp(min(metrics["nll"], 50.0)))
  return metrics


def evaluate_loss(eval_fn, params, examples, config, mesh):
  """Teacher-forced loss, perplexity and token accuracy over `examples`."""
  return loss_metrics(eval_loss_sums(eval_fn, params, examples, config, mesh))
