"""Label-smoothed cross-entropy and accuracy over non-padding target tokens (5.4)."""

import jax
import jax.numpy as jnp
import optax


def target_weights(targets_BxT: jax.Array, pad_id: int = 0) -> jax.Array:
  """1.0 on real target tokens, 0.0 on padding."""
  return (targets_BxT != pad_id).astype(jnp.float32)


def cross_entropy_sums(logits_BxTxV, targets_BxT, weights_BxT, label_smoothing=0.1):
  """Sums over real tokens, so that micro-batches and devices can be added up.

  Returns a dict of float32 scalars: `loss` (label-smoothed cross-entropy: the
  target distribution puts 1 - eps on the reference token and eps spread evenly
  over the whole vocabulary, Szegedy et al. 2016 as cited in 5.4), `nll` (the
  unsmoothed negative log-likelihood, for perplexity), `correct` (argmax hits) and
  `tokens` (the number of real tokens). Logits are float32 (see model.py).
  """
  vocab_size = logits_BxTxV.shape[-1]
  onehot_BxTxV = jax.nn.one_hot(targets_BxT, vocab_size, dtype=jnp.float32)
  smoothed_BxTxV = optax.smooth_labels(onehot_BxTxV, label_smoothing)
  loss_BxT = optax.softmax_cross_entropy(logits_BxTxV, smoothed_BxTxV)
  nll_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets_BxT)
  correct_BxT = (jnp.argmax(logits_BxTxV, axis=-1) == targets_BxT).astype(jnp.float32)
  return {
      "loss": jnp.sum(loss_BxT * weights_BxT),
      "nll": jnp.sum(nll_BxT * weights_BxT),
      "correct": jnp.sum(correct_BxT * weights_BxT),
      "tokens": jnp.sum(weights_BxT),
  }


def normalize(sums):
  """Per-token loss, nll and accuracy from the sums (the loss is per real token)."""
  tokens = jnp.maximum(sums["tokens"], 1.0)
  return {"loss": sums["loss"] / tokens, "nll": sums["nll"] / tokens,
          "accuracy": sums["correct"] / tokens, "tokens": sums["tokens"]}
