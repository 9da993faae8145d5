"""Masks and multi-head attention (section 3.2), with an optional key/value cache.

The score of a query against a key is config.model.attention_score: the
paper's scaled dot product, or for ablations the unscaled dot product, Luong's
general or Bahdanau's additive score (`attention_scores`).

Shapes: B batch, T query length, S key length, H heads, K head dim (d_k; Kv,
d_v, where config.d_k makes them differ), D model width, J beams of an item.
Masks are boolean, True where attention is allowed, and have shape [B, 1, T, S]
(or broadcast to it): the 1 is the head axis.
"""

import functools
import math
from typing import Optional

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import runtime
from transformer.config import ModelConfig
from transformer.dropout import dropout
from transformer.mixed_precision import Dense

Array = jax.Array


def padding_mask(key_tokens_BxS: Array, pad_id: int = 0) -> Array:
  """[B, 1, 1, S]: every query may attend to every non-pad key."""
  return (key_tokens_BxS != pad_id)[:, None, None, :]


def causal_mask(length: int) -> Array:
  """[1, 1, T, T]: position t attends to positions <= t (decoder, section 3.2.3)."""
  return jnp.tril(jnp.ones((length, length), jnp.bool_))[None, None]


def segment_mask(query_segments_BxT: Array, key_segments_BxS: Array) -> Array:
  """[B, 1, T, S]: packed examples (segment ids) never attend to each other."""
  return (query_segments_BxT[:, None, :, None] == key_segments_BxS[:, None, None, :])


def combine_masks(*masks: Optional[Array]) -> Optional[Array]:
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  mask = masks[0]
  for m in masks[1:]:
    mask = jnp.logical_and(mask, m)
  return mask


SCORED_BY_FUSED = ("scaled_dot", "dot")  # The scores jax.nn.dot_product_attention computes.


def _dot_scale(score, head_dim):
  """1/sqrt(d_k) of ONE head for the paper's score (3.2.1); 1 for the others."""
  return 1.0 / math.sqrt(head_dim) if score == "scaled_dot" else 1.0


def attention_scores(q_BxTxHxK, k_BxSxHxK, score="scaled_dot", score_params=None, *,
                     heads_major=False, keys_transposed=False):
  """[B, H, T, S] float32 scores of queries against keys (config.model.attention_score).

  scaled_dot: q.k / sqrt(d_k) (3.2.1); dot: q.k, the unscaled form footnote 4
  argues against; general (Luong et al. 2015): q^T W k, computed as (q^T W) k so
  that cached keys stay plain keys; additive (Bahdanau et al. 2015):
  v^T tanh(W_q q + W_k k) with d_k hidden units. `score_params` holds the
  per-head [H, K, K] score_w (general), score_wq, score_wk and [H, K] score_v
  (additive). Scores are float32 whatever the compute dtype: bf16 exponentials
  lose too much precision. Keys are [B, S, H, K], [B, H, S, K] with heads_major,
  or [B, H, K, S] with keys_transposed (beam_keys_transposed).
  """
  kv = "bhks" if keys_transposed else "bhsk" if heads_major else "bshk"
  p = score_params
  # The score matrices multiply in float32 (XLA's CPU runtime has no bf16 x bf16 ->
  # float32 dot with these batch axes; the scores are float32 anyway).
  f32 = lambda x: x.astype(jnp.float32)
  if score == "additive":
    wq_BxHxTxK = jnp.einsum("bthk,hkj->bhtj", f32(q_BxTxHxK), p["score_wq"])
    wk_BxHxSxK = jnp.einsum(f"{kv},hkj->bhsj", f32(k_BxSxHxK), p["score_wk"])
    hidden_BxHxTxSxK = jnp.tanh(wq_BxHxTxK[:, :, :, None] + wk_BxHxSxK[:, :, None])
    return jnp.einsum("bhtsk,hk->bhts", hidden_BxHxTxSxK, p["score_v"])
  if score == "general":
    q_BxTxHxK = jnp.einsum("bthk,hkj->bthj", f32(q_BxTxHxK),
                           p["score_w"]).astype(q_BxTxHxK.dtype)
  scale = _dot_scale(score, q_BxTxHxK.shape[-1])
  return jnp.einsum(f"bthk,{kv}->bhts", q_BxTxHxK, k_BxSxHxK,
                    preferred_element_type=jnp.float32) * scale


def attention_probs(q_BxTxHxK, k_BxSxHxK, mask, *, score="scaled_dot", score_params=None,
                    heads_major=False):
  """[B, H, T, S] softmax over the keys of score(Q, K) where `mask` allows (float32):
  the attention weights, which attention plots draw."""
  scores_BxHxTxS = attention_scores(q_BxTxHxK, k_BxSxHxK, score, score_params,
                                    heads_major=heads_major)
  if mask is not None:
    # A large finite negative rather than -inf: a fully masked row (a padding
    # query) then gives a uniform distribution instead of NaN.
    scores_BxHxTxS = jnp.where(mask, scores_BxHxTxS, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(scores_BxHxTxS, axis=-1)


def reference_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, *, score="scaled_dot",
                        score_params=None, dropout_rate=0.0, dropout_rng=None,
                        heads_major=False):
  """softmax(score(Q, K)) V, written out: the definition the fused path must match,
  and the only path for the additive and general scores.

  With heads_major, keys and values are [B, H, S, K], as the decoding cache keeps
  them: the dots then read the cache in place, where the [B, S, H, K] layout makes
  XLA transpose (copy) the whole cache at every step, about half of a beam-search
  step on a CPU.
  """
  probs_BxHxTxS = attention_probs(q_BxTxHxK, k_BxSxHxK, mask, score=score,
                                  score_params=score_params, heads_major=heads_major)
  if dropout_rate > 0.0 and dropout_rng is not None:
    probs_BxHxTxS = dropout(probs_BxHxTxS, dropout_rate, dropout_rng)
  kv = "bhsk" if heads_major else "bshk"
  # The probabilities in the compute dtype even where a float32 cache holds the
  # values (self_cache_dtype).
  return jnp.einsum(f"bhts,{kv}->bthk", probs_BxHxTxS.astype(q_BxTxHxK.dtype), v_BxSxHxK
                    ).astype(q_BxTxHxK.dtype)


def self_cache_dtype(dtype, backend: Optional[str] = None):
  """The dtype of the decoding self-attention cache under compute `dtype`: float32
  on a CPU, where XLA runs a single query's attention as float32 products and
  writes a 16-bit cache through a float32 copy of the whole cache at every step
  (its float-normalization pass), so that a 16-bit cache costs two conversions
  a step and saves nothing; `dtype` elsewhere, where it halves the bytes each
  step reads. Beam search's attention reads a 16-bit cache without converting
  it, and TransformerDecoding.beams converts the cache back. The cached values
  are the compute dtype's either way (written from its projections) and the
  attention rounds its probabilities to the compute dtype, so the outputs do
  not depend on this choice (tests/test_decode.py)."""
  backend = backend or jax.default_backend()
  return jnp.float32 if backend == "cpu" else jnp.dtype(dtype)


def beam_keys_transposed(dtype) -> bool:
  """Whether beam search caches self-attention keys as [N, H, K, steps]
  (TransformerDecoding.beams): in float32, beam_attention's scores are then a
  plain product that YNNPACK runs at about twice the bandwidth of the product
  with the keys' K minor; in bfloat16, XLA's CPU backend turns each step's
  write into a float32 round trip over the whole cache, twice as slow into the
  transposed layout, and the plain layout is faster (benchmarks/README.md,
  'Session 19')."""
  return jnp.dtype(dtype) == jnp.float32


def beam_attention(q_Nx1xHxK, k_NxHxSxK, v_NxHxSxK, lineage_NxJxS, *, score="scaled_dot",
                   score_params=None, keys_transposed=False):
  """One decoding step of beam search's self-attention over a cache that beams
  never move: each row's cache slot keeps the keys and values written by
  whichever beam held that slot at each step, and lineage[b*J + k, j, s] says
  whether beam k of item b descends from slot j's entry at position s (one slot
  per position). The scores are each slot's keys against all J queries of its
  item, so every cache row is read once, as the plain step reads it, and beam
  search reorders only the lineage, not every layer's keys and values at every
  step (benchmarks/README.md measures the difference). Equals
  reference_attention over the beams' reordered caches. With keys_transposed
  the keys are [N, H, K, S].
  """
  N, _, H, K = q_Nx1xHxK.shape
  J, S = lineage_NxJxS.shape[1:]
  B = N // J
  # Row (b, j) holds the queries of beams 0..J-1 of item b, as J query positions.
  q_NxJxHxK = jnp.broadcast_to(q_Nx1xHxK.reshape(B, 1, J, H, K),
                               (B, J, J, H, K)).reshape(N, J, H, K)
  scores_BxJxHxJxS = attention_scores(q_NxJxHxK, k_NxHxSxK, score, score_params,
                                      heads_major=True, keys_transposed=keys_transposed
                                      ).reshape(B, J, H, J, S)
  # [b, slot j, 1, beam k, s] = lineage[b*J + k, j, s].
  mask = jnp.swapaxes(lineage_NxJxS.reshape(B, J, J, S), 1, 2)[:, :, None]
  scores_BxJxHxJxS = jnp.where(mask, scores_BxJxHxJxS, jnp.finfo(jnp.float32).min)
  # One distribution per beam over every (slot, position); non-ancestors get 0.
  probs_NxHxJxS = jax.nn.softmax(scores_BxJxHxJxS, axis=(1, 4)).reshape(N, H, J, S)
  # Heads before beams in the product's output: probs [J, S] x values [S, K] per
  # (row, head), a plain matrix product (the beams-first output made XLA run it
  # transposed, several times slower).
  Kv = v_NxHxSxK.shape[-1]  # d_v: Table 3's row B changes d_k alone.
  out_BxJxHxJxKv = jnp.einsum("bhts,bhsk->bhtk", probs_NxHxJxS.astype(q_Nx1xHxK.dtype),
                              v_NxHxSxK, preferred_element_type=jnp.float32
                              ).reshape(B, J, H, J, Kv)
  out_BxJxHxKv = jnp.swapaxes(out_BxJxHxJxKv.sum(axis=1), 1, 2)
  return out_BxJxHxKv.reshape(N, 1, H, Kv).astype(q_Nx1xHxK.dtype)


# What cuDNN's fused attention takes (jax.nn.dot_product_attention, implementation
# 'cudnn'): 16-bit inputs, and a head size that is a multiple of 8 up to 128.
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


def fused_implementation(dtype, head_dim: int, backend: Optional[str] = None) -> str:
  """'cudnn' where cuDNN's kernel serves (a GPU, 16-bit compute, a head size it
  takes); 'reference' on a CPU, where XLA has no fused kernel either and our
  written-out form trains 2-5% faster than jax.nn's XLA form (benchmarks/README.md,
  'Session 20'); else 'xla' (TPUs, GPUs in float32: XLA fuses those itself)."""
  backend = backend or jax.default_backend()
  if (backend in ("gpu", "cuda") and jnp.dtype(dtype) in map(jnp.dtype, CUDNN_DTYPES)
      and head_dim % 8 == 0 and head_dim <= CUDNN_MAX_HEAD_DIM):
    return "cudnn"
  return "reference" if backend == "cpu" else "xla"


def cudnn_mask(mask, B: int, T: int, S: int):
  """A [B|1, 1, T|1, S] boolean mask as cuDNN's kernel takes it: one row per query
  (it refuses a mask broadcast over the queries, such as the padding mask), and no
  row without a key. A query that sees no key (a padding position of packed rows,
  whose output no loss reads) gets every key instead: through cuDNN, packed
  bfloat16 training's loss turns NaN without it (benchmarks/README.md, 'Session 22')."""
  mask = jnp.broadcast_to(mask, (B, 1, T, S))
  return mask | ~mask.any(axis=-1, keepdims=True)


_LOGGED_REFUSALS = set()  # (query type, first line of cuDNN's error) already logged.


def fused_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, score="scaled_dot",
                    implementation: Optional[str] = None):
  """The same function through jax.nn.dot_product_attention: cuDNN's kernel on a GPU
  (every mask we use, padding, causal or packed segments, goes in as a boolean
  mask of one row per query, cudnn_mask), XLA's on TPUs and wherever cuDNN
  refuses a case when the program is traced (an old cuDNN, a GPU generation, a
  shape it lacks); on a CPU the reference (fused_implementation)."""
  assert score in SCORED_BY_FUSED, score
  attend = functools.partial(jax.nn.dot_product_attention, q_BxTxHxK, k_BxSxHxK, v_BxSxHxK,
                             scale=_dot_scale(score, q_BxTxHxK.shape[-1]))
  implementation = implementation or fused_implementation(q_BxTxHxK.dtype,
                                                          q_BxTxHxK.shape[-1])
  if implementation == "reference":
    return reference_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, score=score)
  if implementation == "cudnn":
    B, T, _, _ = q_BxTxHxK.shape
    try:
      return attend(mask=None if mask is None else cudnn_mask(mask, B, T, k_BxSxHxK.shape[1]),
                    implementation="cudnn")
    except (ValueError, NotImplementedError, RuntimeError) as e:
      refusal = (str(jax.typeof(q_BxTxHxK)), runtime.first_line(e) or type(e).__name__)
      if refusal not in _LOGGED_REFUSALS:  # Once, not at every layer and trace.
        _LOGGED_REFUSALS.add(refusal)
        logging.warning("cuDNN attention refused queries %s: %s; using XLA's", *refusal)
  return attend(mask=mask, implementation="xla")


def _heads_major(x_BxSxHxK):
  return jnp.swapaxes(x_BxSxHxK, 1, 2)


def _score_params(module, cfg):
  """The learned per-head score matrices of `module` (none for the dot products)."""
  H, K = cfg.num_heads, cfg.key_dim
  matrix = lambda name: module.param(  # Xavier over each head's K x K.
      name, nn.initializers.xavier_uniform(batch_axis=(0,)), (H, K, K), jnp.float32)
  if cfg.attention_score == "general":
    return {"score_w": matrix("score_w")}
  if cfg.attention_score == "additive":
    # |v| ~ 1: the initial scores are O(1), as the scaled dot product's.
    v_HxK = module.param("score_v", nn.initializers.normal(stddev=K**-0.5), (H, K),
                         jnp.float32)
    return {"score_wq": matrix("score_wq"), "score_wk": matrix("score_wk"), "score_v": v_HxK}
  return {}


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W_O (section 3.2.2).

  W_Q, W_K, W_V are each one D x (H*K) matrix viewed as H heads of size K (K = d_k
  for W_Q and W_K, d_v = d_model / h for W_V; d_k = d_v unless config.d_k is set);
  like W_O they have no bias unless config.attention_bias (the paper's have none).
  With `decode=True`, self-attention appends each step's key/value to a cache of
  the length it was created with; cross-attention computes the encoder's keys and
  values when the cache is created and reuses them at every step. Cached keys
  and values are stored heads-major, [B, H, S, K], whatever the score. The
  general and additive scores add their per-head matrices (`attention_scores`).
  """

  config: ModelConfig
  self_attention: bool

  @nn.compact
  def __call__(self, x_BxTxD, memory_BxSxD, mask, *, deterministic: bool,
               decode: bool = False, decode_step: Optional[Array] = None,
               lineage: Optional[Array] = None):
    cfg = self.config
    dense = lambda name, size: Dense(
        (cfg.num_heads, size), use_bias=cfg.attention_bias, dtype=cfg.compute_dtype,
        name=name)
    merge_heads = lambda out_BxTxHxK: Dense(  # Concat(head_1..head_h) W_O.
        cfg.d_model, axes=2, use_bias=cfg.attention_bias, dtype=cfg.compute_dtype,
        name="out")(out_BxTxHxK)
    q_BxTxHxK = dense("query", cfg.key_dim)(x_BxTxD)
    score_params = _score_params(self, cfg)
    # One cache layout for every score: additive recomputes W_k k from the cached keys.
    attend = lambda *args, **kwargs: reference_attention(
        *args, score=cfg.attention_score, score_params=score_params, **kwargs)

    if decode and not self.self_attention and self.has_variable("cache", "cached_key"):
      # Every step after the first: the encoder's keys and values never change.
      k_BxHxSxK = self.get_variable("cache", "cached_key")
      v_BxHxSxK = self.get_variable("cache", "cached_value")
      out_BxTxHxK = attend(q_BxTxHxK, k_BxHxSxK, v_BxHxSxK, mask, heads_major=True)
      return merge_heads(out_BxTxHxK)
    k_BxSxHxK = dense("key", cfg.key_dim)(memory_BxSxD)
    v_BxSxHxK = dense("value", cfg.head_dim)(memory_BxSxD)
    if decode and not self.self_attention:  # Creating the cache.
      self.put_variable("cache", "cached_key", _heads_major(k_BxSxHxK))
      self.put_variable("cache", "cached_value", _heads_major(v_BxSxHxK))

    if decode and self.self_attention:
      cached = self.has_variable("cache", "cached_key")
      dtype = self_cache_dtype(k_BxSxHxK.dtype)
      key = self.variable("cache", "cached_key", jnp.zeros,
                          _heads_major(k_BxSxHxK).shape, dtype)
      value = self.variable("cache", "cached_value", jnp.zeros,
                            _heads_major(v_BxSxHxK).shape, dtype)
      if cached:  # One step: x is [B, 1, D]; write it at decode_step, attend to <= step.
        start = (0, 0, decode_step, 0)
        # Beam search may keep the keys as [B, H, K, steps] (beam_keys_transposed).
        transposed = lineage is not None and beam_keys_transposed(key.value.dtype)
        new_key = jnp.transpose(k_BxSxHxK, (0, 2, 3, 1)) if transposed else _heads_major(k_BxSxHxK)
        key.value = jax.lax.dynamic_update_slice(
            key.value, new_key.astype(key.value.dtype),
            (0, 0, 0, decode_step) if transposed else start)
        value.value = jax.lax.dynamic_update_slice(
            value.value, _heads_major(v_BxSxHxK).astype(value.value.dtype), start)
        if lineage is not None:  # Beam search: the cache stays where it was written.
          return merge_heads(beam_attention(q_BxTxHxK, key.value, value.value, lineage,
                                            score=cfg.attention_score,
                                            score_params=score_params,
                                            keys_transposed=transposed))
        mask = (jnp.arange(key.value.shape[2]) <= decode_step)[None, None, None, :]
        out_BxTxHxK = attend(q_BxTxHxK, key.value, value.value, mask, heads_major=True)
        return merge_heads(out_BxTxHxK)

    use_reference = (cfg.attention_impl == "reference"
                     or cfg.attention_score not in SCORED_BY_FUSED
                     or cfg.key_dim != cfg.head_dim  # The fused path needs d_k == d_v.
                     or (cfg.attention_dropout > 0.0 and not deterministic))
    if use_reference:
      rng = None if deterministic else self.make_rng("dropout")
      out_BxTxHxK = attend(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask,
                           dropout_rate=cfg.attention_dropout, dropout_rng=rng)
    else:
      out_BxTxHxK = fused_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask,
                                    cfg.attention_score)
    return merge_heads(out_BxTxHxK)
