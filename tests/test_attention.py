"""Attention equals a naive per-head reference for every score; masks do what they say."""

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import attention
from transformer import dropout as dropout_lib
from transformer.attention import MultiHeadAttention
from transformer.config import ATTENTION_IMPLEMENTATIONS, ATTENTION_SCORES
from tests.helpers import tiny_config


def naive_attention(q, k, v, mask):
  """Per batch item and head, with numpy loops: softmax(q k^T / sqrt(d_k)) v."""
  B, T, H, K = q.shape
  out = np.zeros((B, T, H, K))
  for b in range(B):
    for h in range(H):
      scores = q[b, :, h] @ k[b, :, h].T / math.sqrt(K)
      if mask is not None:
        m = np.broadcast_to(mask, (B, 1, T, k.shape[1]))[b, 0]
        scores = np.where(m, scores, -1e30)
      w = np.exp(scores - scores.max(-1, keepdims=True))
      out[b, :, h] = (w / w.sum(-1, keepdims=True)) @ v[b, :, h]
  return out


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("masked", [False, True])
def test_reference_and_fused_equal_naive(heads, masked):
  rng = np.random.default_rng(heads)
  q, k, v = (rng.normal(size=(2, 5 if i == 0 else 7, heads, 8)) for i in range(3))
  mask = None
  if masked:
    key_tokens = np.array([[5, 6, 7, 0, 0, 0, 0], [5, 6, 7, 8, 9, 10, 11]])
    mask = np.asarray(attention.padding_mask(jnp.asarray(key_tokens)))
  expected = naive_attention(q, k, v, mask)
  args = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
  jmask = None if mask is None else jnp.asarray(mask)
  np.testing.assert_allclose(attention.reference_attention(*args, jmask), expected, atol=1e-5)
  np.testing.assert_allclose(attention.fused_attention(*args, jmask), expected, atol=1e-5)


def _mask(kind, B=2, T=6):
  """Each mask the model builds: encoder padding, decoder causal (+ padding), packed
  rows' segments (+ causal), over [B, T] token rows with padding at the end."""
  tokens = jnp.array([[5, 6, 7, 8, 0, 0], [5, 6, 7, 8, 9, 10]])
  segments = jnp.array([[1, 1, 2, 2, 0, 0], [1, 2, 2, 2, 3, 3]])
  return {
      "none": None,
      "padding": attention.padding_mask(tokens),
      "causal": attention.causal_mask(T),
      "causal+padding": attention.combine_masks(attention.causal_mask(T),
                                                attention.padding_mask(tokens)),
      "segments": attention.segment_mask(segments, segments),
      "segments+causal": attention.combine_masks(attention.segment_mask(segments, segments),
                                                 attention.causal_mask(T)),
  }[kind]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "causal+padding", "segments",
                                  "segments+causal"])
def test_the_chosen_fused_path_equals_the_reference_on_every_mask(kind, dtype):
  """What the model runs (fused_attention with the implementation chosen for this
  backend; asked for cuDNN on a CPU, the XLA fallback; XLA's asked for) equals the
  reference, on rows whose queries have at least one key (a padding query's
  output is never read)."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 4, 8)), dtype) for _ in range(3))
  mask = _mask(kind)
  tol = dict(atol=1e-5) if dtype == "float32" else dict(atol=2e-2)
  implementations = (None, "cudnn", "xla")
  # The reference and the three, compiled as one program.
  want, gots = jax.jit(lambda q, k, v: (attention.reference_attention(q, k, v, mask), [
      attention.fused_attention(q, k, v, mask, implementation=implementation)
      for implementation in implementations]))(q, k, v)
  for implementation, got in zip(implementations, gots, strict=True):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               **tol, err_msg=f"{kind} {implementation}")


def _model_shaped_mask(kind, B, T):
  """Each of the model's masks over [B, T] rows with random lengths and packing. In
  packed rows a padding query (segment 0) of the encoder or the cross-attention
  sees no key: the padding keys are masked out."""
  def rows(seed):
    rng = np.random.default_rng(seed)
    tokens = np.arange(T)[None] < rng.integers(T // 4, T + 1, size=B)[:, None]
    segments = np.where(tokens, np.cumsum(rng.random((B, T)) < 0.05, axis=1) + 1, 0)
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(segments)

  (tokens, segments), (_, query_segments) = rows(0), rows(1)
  causal, padding = attention.causal_mask(T), attention.padding_mask(tokens)
  return {
      "padding": padding,
      "causal+padding": attention.combine_masks(causal, padding),
      "segments+causal": attention.combine_masks(attention.segment_mask(segments, segments),
                                                 causal),
      "packed encoder": attention.combine_masks(
          padding, attention.segment_mask(segments, segments)),
      "packed cross": attention.combine_masks(
          padding, attention.segment_mask(query_segments, segments)),
  }[kind]


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's kernel needs a GPU")
@pytest.mark.parametrize("kind", ["padding", "causal+padding", "segments+causal",
                                  "packed encoder", "packed cross"])
def test_cudnn_attention_runs_and_equals_the_reference_with_gradients(kind):
  """At the model's shapes in bfloat16, the compiled step calls cuDNN's fused
  kernel (not a silent fallback to XLA's), and its output on queries that see
  a key, and the gradients of q, k and v, equal the float32 reference's; the
  outputs of queries that see no key (never read in the model: the cotangent
  is 0 there) stay finite."""
  B, T, H, K = 4, 128, 8, 64
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v = (jax.random.normal(key, (B, T, H, K), jnp.float32).astype(jnp.bfloat16)
             for key in keys[:3])
  mask = _model_shaped_mask(kind, B, T)
  sees_key_BxTx1x1 = jnp.broadcast_to(mask, (B, 1, T, T)).any(-1)[:, 0, :, None, None]
  assert bool(sees_key_BxTx1x1.all()) == (kind not in ("packed encoder", "packed cross"))
  cotangent = jax.random.normal(keys[3], (B, T, H, K), jnp.float32) * sees_key_BxTx1x1

  def loss(implementation, q, k, v):
    if implementation == "reference":
      out = attention.reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), mask)
    else:
      out = attention.fused_attention(q, k, v, mask, implementation=implementation)
    return (out.astype(jnp.float32) * cotangent).sum(), out

  grads = {impl: jax.jit(jax.value_and_grad(functools.partial(loss, impl), argnums=(0, 1, 2),
                                            has_aux=True))
           for impl in ("cudnn", "reference")}
  hlo = grads["cudnn"].lower(q, k, v).compile().as_text()
  assert "cudnn" in hlo.lower() and "fmha" in hlo.lower(), "cuDNN's kernel is not called"
  (_, out), dqkv = grads["cudnn"](q, k, v)
  (_, want), want_dqkv = grads["reference"](q, k, v)
  relative = lambda a, b: float(jnp.linalg.norm(jnp.asarray(a, jnp.float32) - b)
                                / jnp.linalg.norm(b))
  assert bool(jnp.isfinite(out.astype(jnp.float32)).all()), kind
  assert relative(out * sees_key_BxTx1x1, want * sees_key_BxTx1x1) < 1e-2, kind
  for name, g, want_g in zip("qkv", dqkv, want_dqkv):
    assert relative(g, want_g) < 2e-2, f"{kind}: d{name}"


def _cudnn_refusing(message, masks=None):
  """A stand-in for jax.nn.dot_product_attention whose cuDNN path raises `message`;
  `masks` records the mask each implementation was given."""
  def attend(q, k, v, *, scale, mask, implementation):
    if masks is not None:
      masks[implementation] = mask
    if implementation == "cudnn":
      raise RuntimeError(message)
    return q
  return attend


def test_fused_attention_gives_cudnn_its_mask_and_xla_the_model_s(monkeypatch):
  """Wherever it runs, a cuDNN request passes cudnn_mask (one row per query, no
  keyless row) and a fallback to XLA's the mask as the model built it."""
  masks = {}
  monkeypatch.setattr(jax.nn, "dot_product_attention", _cudnn_refusing("no cuDNN here", masks))
  q = jnp.zeros((1, 3, 2, 8), jnp.bfloat16)
  mask = attention.combine_masks(attention.padding_mask(jnp.array([[5, 0, 0]])),
                                 attention.segment_mask(jnp.array([[1, 0, 0]]),
                                                        jnp.array([[1, 0, 0]])))
  attention.fused_attention(q, q, q, mask, implementation="cudnn")
  np.testing.assert_array_equal(masks["cudnn"], attention.cudnn_mask(mask, 1, 3, 3))
  np.testing.assert_array_equal(masks["xla"], mask)


def test_a_cudnn_refusal_is_logged_once_per_query_shape_and_reason(monkeypatch):
  warnings = []
  monkeypatch.setattr(attention.logging, "warning", lambda *a: warnings.append(a))
  monkeypatch.setattr(attention, "_LOGGED_REFUSALS", set())
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      _cudnn_refusing("no cuDNN here\nmore lines"))
  small, large = jnp.zeros((1, 3, 2, 8), jnp.bfloat16), jnp.zeros((1, 5, 2, 8), jnp.bfloat16)
  for q in (small, small, large, small):  # Every layer of every trace asks again.
    attention.fused_attention(q, q, q, None, implementation="cudnn")
  assert [w[1:] for w in warnings] == [("bfloat16[1,3,2,8]", "no cuDNN here"),
                                       ("bfloat16[1,5,2,8]", "no cuDNN here")]


def test_cudnn_mask_gives_every_query_its_own_row_and_at_least_one_key():
  mask = attention.combine_masks(  # Row 0: the last query is padding and sees no key.
      attention.padding_mask(jnp.array([[5, 6, 0], [5, 6, 7]])),
      attention.segment_mask(jnp.array([[1, 2, 0], [1, 1, 2]]), jnp.array([[1, 2, 0],
                                                                          [1, 1, 2]])))
  got = attention.cudnn_mask(mask, 2, 3, 3)
  assert got.shape == (2, 1, 3, 3)
  np.testing.assert_array_equal(got[0, 0], [[1, 0, 0], [0, 1, 0], [1, 1, 1]])
  np.testing.assert_array_equal(got[1, 0], mask[1, 0])
  causal = attention.cudnn_mask(attention.causal_mask(3), 2, 3, 3)  # Broadcast over B.
  np.testing.assert_array_equal(causal, jnp.broadcast_to(attention.causal_mask(3), (2, 1, 3, 3)))
  padding = attention.cudnn_mask(attention.padding_mask(jnp.array([[5, 0]])), 1, 3, 2)
  np.testing.assert_array_equal(padding[0, 0], [[1, 0]] * 3)  # One row per query.


def test_fused_implementation_per_backend_dtype_and_head_size():
  choose = attention.fused_implementation
  assert choose(jnp.bfloat16, 64, "gpu") == "cudnn"
  assert choose(jnp.float16, 128, "gpu") == "cudnn"
  assert choose(jnp.float32, 64, "gpu") == "xla"  # cuDNN's kernel takes 16-bit inputs.
  assert choose(jnp.bfloat16, 12, "gpu") == "xla"  # Not a multiple of 8.
  assert choose(jnp.bfloat16, 256, "gpu") == "xla"  # Over 128.
  assert choose(jnp.bfloat16, 64, "cpu") == "reference"  # Measured faster there.
  assert choose(jnp.float32, 64, "cpu") == "reference"
  assert choose(jnp.bfloat16, 64, "tpu") == "xla"
  assert choose(jnp.bfloat16, 64) == {"gpu": "cudnn", "cpu": "reference"}.get(
      jax.default_backend(), "xla")


def test_scale_is_one_head_not_d_model():
  # With identical keys the output is v whatever the scale; so use two keys.
  q = jnp.ones((1, 1, 2, 16)); k = jnp.stack([jnp.ones((2, 16)), jnp.zeros((2, 16))])[None]
  v = jnp.stack([jnp.ones((2, 16)), jnp.zeros((2, 16))])[None]
  out = attention.reference_attention(q, k, v, None)
  p = 1 / (1 + math.exp(-16 / math.sqrt(16)))  # scores 16/sqrt(d_k=16) vs 0
  np.testing.assert_allclose(out[0, 0, :, 0], [p, p], rtol=1e-5)


def naive_scores(score, q_BxTxK, k_BxSxK, params, h):
  """[B, T, S] scores of head h as the papers write them, with column vectors:
  W_q q is score_wq[h]^T q (the code computes q^T score_wq[h])."""
  if score in ("scaled_dot", "dot"):
    scale = 1 / math.sqrt(q_BxTxK.shape[-1]) if score == "scaled_dot" else 1.0
    return np.einsum("btk,bsk->bts", q_BxTxK, k_BxSxK) * scale
  if score == "general":  # Luong et al. 2015: q^T W k.
    return np.einsum("btk,kj,bsj->bts", q_BxTxK, np.asarray(params["score_w"][h]), k_BxSxK)
  # Additive, Bahdanau et al. 2015: v^T tanh(W_q q + W_k k), one (query, key) at a time.
  wq, wk, v = (np.asarray(params[n][h]) for n in ("score_wq", "score_wk", "score_v"))
  (B, T, _), S = q_BxTxK.shape, k_BxSxK.shape[1]
  scores = np.zeros((B, T, S))
  for b, t, s in itertools.product(range(B), range(T), range(S)):
    scores[b, t, s] = v @ np.tanh(wq.T @ q_BxTxK[b, t] + wk.T @ k_BxSxK[b, s])
  return scores


@pytest.mark.parametrize("bias,score", [(False, "scaled_dot"), (True, "scaled_dot"),
                                        (False, "dot"), (False, "general"),
                                        (False, "additive"), (True, "additive")])
def test_multi_head_split_merge_matches_per_head_matrices(bias, score):
  cfg = tiny_config(attention_bias=bias, attention_score=score)
  mha = MultiHeadAttention(cfg, self_attention=False)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 3, cfg.d_model)), jnp.float32)
  mem = jnp.asarray(rng.normal(size=(2, 5, cfg.d_model)), jnp.float32)
  params = mha.init(jax.random.key(0), x, mem, None, deterministic=True)["params"]
  out = mha.apply({"params": params}, x, mem, None, deterministic=True)
  # Head i uses columns [i*K, (i+1)*K) of W_Q, W_K, W_V; the heads are concatenated
  # and multiplied by W_O (section 3.2.2).
  H, K, D = cfg.num_heads, cfg.head_dim, cfg.d_model
  # The paper's W^Q, W^K, W^V, W^O have no biases (the default); with them, zeros
  # stand in for the ones absent.
  assert ("bias" in params["query"]) == ("bias" in params["out"]) == bias
  get_bias = lambda n, size: np.asarray(params[n].get("bias", np.zeros(size))).reshape(size)
  mat = lambda n: (np.asarray(params[n]["kernel"]).reshape(D, H * K), get_bias(n, H * K))
  (wq, bq), (wk, bk), (wv, bv) = mat("query"), mat("key"), mat("value")
  wo = np.asarray(params["out"]["kernel"]).reshape(H * K, D)
  xs, ms = np.asarray(x), np.asarray(mem)
  heads = []
  for i in range(H):
    cols = slice(i * K, (i + 1) * K)
    q = xs @ wq[:, cols] + bq[cols]; k = ms @ wk[:, cols] + bk[cols]
    v = ms @ wv[:, cols] + bv[cols]
    s = naive_scores(score, q, k, params, i)
    w = np.exp(s - s.max(-1, keepdims=True)); w /= w.sum(-1, keepdims=True)
    heads.append(np.einsum("bts,bsk->btk", w, v))
  expected = np.concatenate(heads, -1) @ wo + get_bias("out", D)
  np.testing.assert_allclose(out, expected, atol=1e-4)


@pytest.mark.parametrize("score", ["scaled_dot", "general", "additive"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("keys_transposed", [False, True])
def test_beam_attention_equals_the_reference_over_gathered_caches(score, dtype,
                                                                   keys_transposed):
  """beam_attention over slots that beams never leave equals reference_attention
  over each beam's own cache, gathered position by position from the slot its
  lineage names; positions no beam has reached yet (all False) are ignored. The
  keys may be cached [N, H, S, K] or transposed, [N, H, K, S]. The values' head
  size (d_v) differs from the keys' (d_k), as in Table 3's row B."""
  B, J, H, K, Kv, S, P = 2, 3, 2, 8, 6, 7, 5  # P positions written so far.
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(rng.normal(size=shape), dtype) for shape in
             ((B * J, 1, H, K), (B * J, H, S, K), (B * J, H, S, Kv)))
  slot_NxP = rng.integers(0, J, (B * J, P))
  lineage = np.zeros((B * J, J, S), bool)
  for n, p in itertools.product(range(B * J), range(P)):
    lineage[n, slot_NxP[n, p], p] = True
  params = {}
  if score != "scaled_dot":
    cfg = tiny_config(attention_score=score, num_heads=H, d_model=H * K)
    mha = MultiHeadAttention(cfg, self_attention=True)
    x = jnp.zeros((1, 1, H * K))
    variables = mha.init(jax.random.key(1), x, x, None, deterministic=True)["params"]
    params = {n: variables[n] for n in variables if n.startswith("score_")}
  cached_k = jnp.swapaxes(k, 2, 3) if keys_transposed else k
  got = attention.beam_attention(q, cached_k, v, jnp.asarray(lineage), score=score,
                                 score_params=params, keys_transposed=keys_transposed)
  # Row n's own cache: position p from row (n // J) * J + slot[n, p].
  rows_NxS = (np.arange(B * J) // J * J)[:, None] + np.pad(slot_NxP, ((0, 0), (0, S - P)))
  gather = lambda x: np.stack([np.asarray(x, np.float32)[rows_NxS[n], :, np.arange(S)]
                               .transpose(1, 0, 2) for n in range(B * J)])
  mask = (np.arange(S) < P)[None, None, None, :]
  want = attention.reference_attention(
      q.astype(jnp.float32), jnp.asarray(gather(k)), jnp.asarray(gather(v)), mask,
      score=score, score_params=params, heads_major=True)
  assert got.shape == (B * J, 1, H, Kv) and got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), want,
                             atol=1e-5 if dtype == jnp.float32 else 2e-2)


def test_masks():
  causal = np.asarray(attention.causal_mask(3))[0, 0]
  np.testing.assert_array_equal(causal, [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
  seg = jnp.asarray([[1, 1, 2, 0]])
  m = np.asarray(attention.segment_mask(seg, seg))[0, 0]
  assert m[0, 1] and not m[0, 2] and not m[2, 1] and m[2, 2] and not m[1, 3]
  pad = np.asarray(attention.padding_mask(jnp.asarray([[4, 5, 0]])))
  assert pad.shape == (1, 1, 1, 3) and pad[0, 0, 0].tolist() == [True, True, False]


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_dot_is_scaled_dot_without_the_scale(impl):
  """dot(q / sqrt(d_k), k) = scaled_dot(q, k): W_Q (and its bias) scaled by
  1/sqrt(d_k) turns one into the other; unscaled, they differ."""
  cfg = tiny_config(attention_impl=impl, attention_bias=True)
  scaled = MultiHeadAttention(cfg, self_attention=False)
  dot = MultiHeadAttention(dataclasses.replace(cfg, attention_score="dot"),
                           self_attention=False)
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(2, 3, cfg.d_model)), jnp.float32)
  mem = jnp.asarray(rng.normal(size=(2, 5, cfg.d_model)), jnp.float32)
  mask = attention.padding_mask(jnp.asarray([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]))
  params = scaled.init(jax.random.key(0), x, mem, mask, deterministic=True)["params"]
  with jax.default_matmul_precision("float32"):  # Not a GPU's TF32 products.
    want = scaled.apply({"params": params}, x, mem, mask, deterministic=True)
    query = jax.tree.map(lambda w: w / math.sqrt(cfg.head_dim), params["query"])
    got = dot.apply({"params": {**params, "query": query}}, x, mem, mask, deterministic=True)
  np.testing.assert_allclose(got, want, atol=1e-5)
  unscaled = dot.apply({"params": params}, x, mem, mask, deterministic=True)
  assert not np.allclose(unscaled, want, atol=1e-3)


@pytest.mark.parametrize("score", ATTENTION_SCORES)
@pytest.mark.parametrize("self_attention", [True, False])
def test_padded_keys_do_not_change_real_outputs(score, self_attention):
  """Whatever vectors sit at padded key positions, outputs at real positions stay."""
  cfg = tiny_config(attention_score=score)
  mha = MultiHeadAttention(cfg, self_attention=self_attention)
  rng = np.random.default_rng(3)
  mask = attention.padding_mask(jnp.asarray([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]))
  mem = rng.normal(size=(2, 5, cfg.d_model)).astype(np.float32)
  x = mem if self_attention else rng.normal(size=(2, 3, cfg.d_model)).astype(np.float32)
  params = mha.init(jax.random.key(0), x, mem, mask, deterministic=True)["params"]
  out = mha.apply({"params": params}, x, mem, mask, deterministic=True)
  changed = mem.copy()
  changed[0, 3:] = 10 * rng.normal(size=(2, cfg.d_model))
  x_changed = changed if self_attention else x
  out_changed = mha.apply({"params": params}, x_changed, changed, mask, deterministic=True)
  real = 3 if self_attention else None  # Self-attention: the padded queries moved too.
  np.testing.assert_allclose(out_changed[0, :real], out[0, :real], atol=1e-5)
  np.testing.assert_allclose(out_changed[1], out[1], atol=1e-5)


@pytest.mark.parametrize("score", ATTENTION_SCORES)
@pytest.mark.parametrize("impl", ATTENTION_IMPLEMENTATIONS)
def test_attention_dropout_drops_probabilities_at_its_own_rate_only(score, impl,
                                                                    monkeypatch):
  """config.model.attention_dropout, not P_drop (config.model.dropout, which the
  paper applies to sublayer outputs and embeddings only, 5.4), drops attention
  probabilities. With dropout=0.3 and attention_dropout=0 a training forward equals
  the deterministic one for every rng; with attention_dropout=0.3 it equals
  softmax(scores) dropped at 0.3 (with the rng the module drew) times V, W_O, written
  out from the parameters, and moves with the rng."""
  cfg = tiny_config(dropout=0.3, attention_score=score, attention_impl=impl)
  mha = MultiHeadAttention(cfg, self_attention=False)
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(2, 3, cfg.d_model)), jnp.float32)
  mem = jnp.asarray(rng.normal(size=(2, 5, cfg.d_model)), jnp.float32)
  mask = attention.padding_mask(jnp.asarray([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]))
  params = mha.init(jax.random.key(0), x, mem, mask, deterministic=True)["params"]
  det = mha.apply({"params": params}, x, mem, mask, deterministic=True)
  train = lambda cfg, seed: MultiHeadAttention(cfg, self_attention=False).apply(
      {"params": params}, x, mem, mask, deterministic=False,
      rngs={"dropout": jax.random.key(seed)})
  for seed in (1, 2):
    np.testing.assert_allclose(train(cfg, seed), det, atol=1e-6)

  rngs = []  # The rng of each dropout the attention code runs.

  def recording(probs, rate, rng):
    rngs.append(rng)
    return dropout_lib.dropout(probs, rate, rng)

  monkeypatch.setattr(attention, "dropout", recording)
  cfg = dataclasses.replace(cfg, attention_dropout=0.3)
  with jax.default_matmul_precision("float32"):  # Not a GPU's TF32 products.
    got = train(cfg, 1)
    assert len(rngs) == 1
    project = lambda name, inputs: jnp.einsum("btd,dhk->bthk", inputs, params[name]["kernel"])
    score_params = {n: params[n] for n in params if n.startswith("score_")}
    probs = attention.attention_probs(project("query", x), project("key", mem), mask,
                                      score=score, score_params=score_params)
    dropped = dropout_lib.dropout(probs, 0.3, rngs[0])
    want = jnp.einsum("bhts,bshk,hkd->btd", dropped, project("value", mem),
                      params["out"]["kernel"])
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.abs(got - det).max() > 1e-2
  assert np.abs(train(cfg, 2) - got).max() > 1e-2
