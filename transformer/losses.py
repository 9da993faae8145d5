"""Label-smoothed cross-entropy and accuracy over non-padding target tokens (5.4)."""

import functools

import jax
import jax.numpy as jnp


def target_weights(targets_BxT: jax.Array, pad_id: int = 0) -> jax.Array:
  """1.0 on real target tokens, 0.0 on padding."""
  return (targets_BxT != pad_id).astype(jnp.float32)


def cross_entropy_sums(logits_BxTxV, targets_BxT, weights_BxT, label_smoothing=0.1):
  """Sums over real tokens, so that micro-batches and devices can be added up.

  Returns a dict of float32 scalars: `loss` (label-smoothed cross-entropy: the
  target distribution puts 1 - eps on the reference token and eps spread evenly
  over the whole vocabulary, PAD included, Szegedy et al. 2016 as cited in 5.4;
  tensor2tensor and fairseq spread it over the V - 1 other classes), `nll` (the
  unsmoothed negative log-likelihood, for perplexity), `correct` (tokens whose
  reference has the largest logit) and `tokens` (the number of real tokens).
  Logits are float32 (see model.py). Differentiable in the logits only.
  """
  loss, nll, correct = _smoothed_sums(logits_BxTxV, targets_BxT, weights_BxT,
                                      float(label_smoothing))
  return {"loss": loss, "nll": nll, "correct": correct, "tokens": jnp.sum(weights_BxT)}


# The [B, T, V] logits are the largest tensor of a training step, so the loss
# touches them as few times as it can. With lse = logsumexp(x) and
# q = (1 - eps) one_hot(y) + eps / V:
#   nll  = lse - x_y
#   loss = -sum_v q_v (x_v - lse) = (1 - eps) nll - (eps / V) (sum_v x_v - V lse)
#   correct = x_y >= max_v x_v        (a tie with another token counts as a hit)
# so the forward pass is reductions over V (max, sum of exp, sum) and one gather,
# with no log-probabilities, one-hot or argmax built; and the gradient is one
# elementwise pass, d loss / d x = softmax(x) - q, with the one-hot an iota compare
# (autodiff would scatter into zeros). The values and gradients are those of
# optax's smooth_labels + softmax_cross_entropy (tests/test_losses.py); the
# speed-up is in benchmarks/README.md, 'Measurements behind the code'.

@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _smoothed_sums(logits, targets, weights, eps):
  return _smoothed_sums_fwd(logits, targets, weights, eps)[0]


def _smoothed_sums_fwd(logits, targets, weights, eps):
  vocab_size = logits.shape[-1]
  max_x = jnp.max(logits, axis=-1)
  lse = max_x + jnp.log(jnp.sum(jnp.exp(logits - max_x[..., None]), axis=-1))
  x_y = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = lse - x_y
  loss = (1.0 - eps) * nll - eps / vocab_size * (jnp.sum(logits, axis=-1) - vocab_size * lse)
  sums = (jnp.sum(loss * weights), jnp.sum(nll * weights),
          jnp.sum((x_y >= max_x) * weights))
  return sums, (logits, targets, weights, lse)


def _smoothed_sums_bwd(eps, residuals, cotangents):
  logits, targets, weights, lse = residuals
  g_loss, g_nll, _ = cotangents  # `correct` is piecewise constant: no gradient.
  vocab_size = logits.shape[-1]
  # d loss/dx = p - (1-eps) onehot - eps/V and d nll/dx = p - onehot, per token.
  a = ((g_loss + g_nll) * weights)[..., None]
  b = (((1.0 - eps) * g_loss + g_nll) * weights)[..., None]
  c = (eps / vocab_size * g_loss * weights)[..., None]
  hit = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1) == targets[..., None]
  d_logits = a * jnp.exp(logits - lse[..., None]) - jnp.where(hit, b, 0.0) - c
  return d_logits, None, None


_smoothed_sums.defvjp(_smoothed_sums_fwd, _smoothed_sums_bwd)


def normalize(sums):
  """Per-token loss, nll and accuracy from the sums (the loss is per real token)."""
  tokens = jnp.maximum(sums["tokens"], 1.0)
  return {"loss": sums["loss"] / tokens, "nll": sums["nll"] / tokens,
          "accuracy": sums["correct"] / tokens, "tokens": sums["tokens"]}
