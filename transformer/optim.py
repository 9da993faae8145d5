"""The paper's optimiser: Adam with warmup and inverse-square-root decay (5.3)."""

import jax.numpy as jnp
import optax


def transformer_schedule(d_model: int, warmup_steps: int = 4000, scale: float = 1.0):
  """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (5.3).

  Steps count from 1 (optax passes the number of updates done, from 0), so the
  first update uses step 1 and the peak is at step == warmup_steps.
  """

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule


def make_optimizer(config, d_model: int):
  """(Adam(beta1=0.9, beta2=0.98, eps=1e-9), its schedule) (5.3).

  `config` holds learning_rate_scale, warmup_steps, adam_b1, adam_b2, adam_eps,
  weight_decay and grad_clip_norm (0 = off); the last two are not in the paper.
  The schedule is returned so that what training logs is what Adam used: it maps
  the number of updates done (the train state's step) to the next update's rate.
  """
  schedule = transformer_schedule(d_model, config.warmup_steps, config.learning_rate_scale)
  parts = []
  if config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  parts.append(optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                           eps=config.adam_eps, weight_decay=config.weight_decay))
  return optax.chain(*parts), schedule
