"""Behaviour of the Transformer: positions, padding, causality, packing, caching, dtypes,
for every attention score."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import attention as attention_lib
from transformer import dropout as dropout_lib
from transformer.attention import MultiHeadAttention
from transformer.config import ACTIVATIONS, ATTENTION_IMPLEMENTATIONS, ATTENTION_SCORES
from transformer.model import (DecoderLayer, Embed, EncoderLayer, FeedForward, Transformer,
                               shift_right, sinusoidal_table, tied_logits)
from transformer.state import parameter_count, parameter_shapes
from tests.helpers import TINY, init_model, random_tokens, tiny_config
from tests.helpers import compiled_apply as apply  # For the passes whose shapes are their own.


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (50, 10), (99, 31)])
def test_sinusoidal_encoding_matches_formula(pos, i):
  d = 64
  table = sinusoidal_table(100, d)
  angle = pos / 10000 ** (2 * i / d)
  assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
  assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_embedding_scaled_by_sqrt_d_model_and_shared_with_output():
  cfg = tiny_config()
  embed = Embed(cfg, cfg.input_vocab_size)
  ids = jnp.asarray([[3, 5]])
  params = embed.init(jax.random.key(0), ids)["params"]
  table = np.asarray(params["embedding"])
  np.testing.assert_allclose(embed.apply({"params": params}, ids)[0],
                             table[[3, 5]] * math.sqrt(cfg.d_model), rtol=1e-6)
  model, params = init_model(cfg, np.ones((1, 3), np.int32), np.ones((1, 3), np.int32))
  assert set(params) == {"shared_embedding", "encoder", "decoder"}  # one matrix
  untied, p2 = init_model(tiny_config(share_embeddings=False, tie_output=False,
                                      output_vocab_size=19),
                          np.ones((1, 3), np.int32), np.ones((1, 3), np.int32))
  assert p2["target_embedding"]["embedding"].shape == (19, 32)
  assert p2["decoder"]["logits"]["kernel"].shape == (32, 19)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("tokens", [(3, 5), (2, 4)])  # odd and even B*T (tokens_dot's forms)
def test_tied_logits_gradient_equals_autodiff(dtype, tokens):
  """The hand-written gradient of the output projection against jax.grad of the plain
  einsum, under jit, in both compute dtypes (logits float32 either way). In bfloat16
  the float32 cotangent is rounded to bfloat16 first, as autocast would: autodiff
  gets that rounded cotangent, and the results agree to bfloat16's last bit."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k1, tokens + (8,)).astype(dtype)
  w = jax.random.normal(k2, (11, 8)).astype(dtype)
  g = jax.random.normal(k3, tokens + (11,))  # an arbitrary cotangent

  def plain(x, w):
    return jnp.einsum("btd,vd->btv", x, w, preferred_element_type=jnp.float32)

  out, vjp = jax.vjp(jax.jit(tied_logits), x, w)
  want_out, want_vjp = jax.vjp(plain, x, w)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, want_out, rtol=1e-6)
  rtol = 1e-5 if dtype == jnp.float32 else 2**-7
  for got, want in zip(vjp(g), want_vjp(g.astype(dtype).astype(jnp.float32))):
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=rtol, atol=1e-5)
  if dtype == jnp.bfloat16:  # The rounding is what the test allows for, and it shows.
    unrounded = want_vjp(g)[1]
    assert not np.array_equal(np.asarray(vjp(g)[1], np.float32), np.asarray(unrounded, np.float32))


def test_shift_right_restarts_per_packed_segment():
  targets = jnp.asarray([[5, 6, 3, 7, 3, 0]])
  segments = jnp.asarray([[1, 1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets, 2), [[2, 5, 6, 3, 7, 3]])
  np.testing.assert_array_equal(shift_right(targets, 2, segments)[0, :5], [2, 5, 6, 2, 7])


@pytest.mark.parametrize("norm_position,score", [("post", "scaled_dot"), ("pre", "scaled_dot"),
                                                 ("post", "dot"), ("post", "additive"),
                                                 ("post", "general")])
def test_padding_invariance(norm_position, score):
  cfg = tiny_config(norm_position=norm_position, attention_score=score)
  rng = np.random.default_rng(0)
  inputs = random_tokens(rng, [5, 3], 8)
  targets = random_tokens(rng, [6, 2], 7)
  model, params = init_model(cfg, inputs, targets)
  logits = model.apply({"params": params}, inputs, targets)
  # Garbage under the padding (non-zero ids would be real tokens, so we only
  # widen the padding: extra pad columns on both sides).
  wider_in = np.pad(inputs, ((0, 0), (0, 4)))
  wider_tg = np.pad(targets, ((0, 0), (0, 3)))
  logits_wide = model.apply({"params": params}, wider_in, wider_tg)
  for b, n in enumerate([6, 2]):
    np.testing.assert_allclose(logits_wide[b, :n], logits[b, :n], atol=1e-5)
  # Source-side padding is masked out: the encoder output of real tokens and the
  # decoder logits do not move when the pad positions hold other embeddings.
  enc = model.apply({"params": params}, inputs, method=Transformer.encode)
  enc_wide = model.apply({"params": params}, wider_in, method=Transformer.encode)
  np.testing.assert_allclose(enc_wide[0, :5], enc[0, :5], atol=1e-5)


@pytest.mark.parametrize("attention_impl,score", [("fused", "scaled_dot"),
                                                  ("reference", "scaled_dot"), ("fused", "dot"),
                                                  ("fused", "additive"), ("fused", "general")])
def test_causality_by_perturbation_and_gradient(attention_impl, score):
  cfg = tiny_config(attention_impl=attention_impl, attention_score=score)
  rng = np.random.default_rng(1)
  inputs = random_tokens(rng, [6], 6)
  targets = random_tokens(rng, [8], 8)
  model, params = init_model(cfg, inputs, targets)
  forward = lambda i, t: apply(model, {"params": params}, i, t)
  logits = forward(inputs, targets)
  for t in range(7):
    changed = targets.copy()
    changed[0, t + 1:] = rng.integers(4, 23, size=7 - t)
    # Logits at t predict target t from targets < t: targets >= t must not matter.
    changed[0, t] = (targets[0, t] + 1 - 4) % 19 + 4
    out = forward(inputs, changed)
    np.testing.assert_allclose(out[0, :t + 1], logits[0, :t + 1], atol=1e-5)
    assert not np.allclose(out[0, t + 1:], logits[0, t + 1:], atol=1e-5)

  # The same through gradients: logits at t w.r.t. the decoder input vector at u.
  decoder_inputs = shift_right(jnp.asarray(targets), cfg.bos_id)
  grads = _grad_of_logits_wrt_positions(model, params, inputs, decoder_inputs)
  for t in range(8):
    assert np.all(grads[t, t + 1:] == 0.0), f"logits at {t} see later tokens"
    assert np.all(grads[t, :t + 1] != 0.0)


def _grad_of_logits_wrt_positions(model, params, inputs, decoder_inputs):
  """[T, T]: |d logits[t] / d (decoder input vector at position u)|."""
  cfg = model.config
  T = decoder_inputs.shape[1]

  def logit_sums_T(offsets_TxD):
    # Encoded in the same program (it does not depend on the offsets).
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    # Learned positions initialised to the sinusoid give the same model, with a
    # differentiable per-position input vector.
    p = dict(params)
    learned = {"embedding": jnp.asarray(sinusoidal_table(cfg.max_len, cfg.d_model))
               .at[:T].add(offsets_TxD)}
    p["decoder"] = dict(p["decoder"], positional=learned)
    out = Transformer(dataclasses.replace(cfg, positional="learned")).apply(
        {"params": p}, encoded, inputs, decoder_inputs, method=Transformer.decode)
    return out[0].sum(-1)

  jacobian_TxTxD = jax.jit(jax.jacrev(logit_sums_T))(jnp.zeros((T, cfg.d_model)))
  return np.abs(np.asarray(jacobian_TxTxD)).sum(-1)


def test_packed_rows_equal_separate_examples():
  cfg = tiny_config()
  rng = np.random.default_rng(2)
  srcs = [rng.integers(4, 23, size=n).astype(np.int32) for n in (4, 3)]
  tgts = [rng.integers(4, 23, size=n).astype(np.int32) for n in (3, 5)]
  model, params = init_model(cfg, srcs[0][None], tgts[0][None])
  packed_in = np.zeros((1, 9), np.int32); packed_tg = np.zeros((1, 10), np.int32)
  in_seg = np.zeros_like(packed_in); tg_seg = np.zeros_like(packed_tg)
  in_pos = np.zeros_like(packed_in); tg_pos = np.zeros_like(packed_tg)
  i = j = 0
  for k, (s, t) in enumerate(zip(srcs, tgts)):
    packed_in[0, i:i + len(s)] = s; in_seg[0, i:i + len(s)] = k + 1
    in_pos[0, i:i + len(s)] = np.arange(len(s))
    packed_tg[0, j:j + len(t)] = t; tg_seg[0, j:j + len(t)] = k + 1
    tg_pos[0, j:j + len(t)] = np.arange(len(t))
    i += len(s); j += len(t)
  packed = apply(model, {"params": params}, packed_in, packed_tg, in_seg, tg_seg,
                 in_pos, tg_pos)
  j = 0
  for s, t in zip(srcs, tgts):
    alone = apply(model, {"params": params}, s[None], t[None])
    np.testing.assert_allclose(packed[0, j:j + len(t)], alone[0], atol=1e-5)
    j += len(t)


@pytest.mark.parametrize("norm_position,dtype,score,d_k", [
    ("post", "float32", "scaled_dot", 0), ("pre", "float32", "scaled_dot", 0),
    ("post", "bfloat16", "scaled_dot", 0), ("post", "float32", "dot", 0),
    ("post", "float32", "additive", 0), ("post", "float32", "general", 0),
    ("post", "bfloat16", "additive", 0), ("post", "bfloat16", "general", 0),
    # d_k = 4 with d_v = 8: queries/keys and values of different sizes (Table 3 row B).
    ("post", "float32", "scaled_dot", 4), ("post", "float32", "general", 4),
    ("post", "float32", "additive", 4)])
def test_cached_decoding_equals_full_forward(norm_position, dtype, score, d_k):
  cfg = tiny_config(norm_position=norm_position, dtype=dtype, attention_score=score, d_k=d_k)
  rng = np.random.default_rng(3)
  inputs = random_tokens(rng, [5, 3], 6)
  targets = random_tokens(rng, [7, 7], 7)
  model, params = init_model(cfg, inputs, targets)
  full = model.apply({"params": params}, inputs, targets)
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
  decoder_inputs = shift_right(jnp.asarray(targets), cfg.bos_id)
  _, state = model.apply({"params": params}, encoded, inputs, jnp.zeros((2, 7), jnp.int32),
                         decode=True, mutable=["cache"], method=Transformer.decode)
  cache = state["cache"]
  for t in range(7):
    step_logits, state = model.apply(
        {"params": params, "cache": cache}, encoded, inputs, decoder_inputs[:, t:t + 1],
        decode=True, mutable=["cache"], method=Transformer.decode)
    cache = state["cache"]
    # Same arithmetic in another order (one query row at a time): round-off of
    # float32 (~1e-6 here), or of bfloat16 where a sum can round to the next of its
    # 2^-8-spaced values (logits here are O(1); a GPU, whose kernels differ between
    # the two programs, gave 0.021); a wrong position, mask or cache entry moves
    # logits by O(1).
    atol = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(step_logits[:, 0], full[:, t], atol=atol)
  # The encoder's keys and values are cached in the compute dtype; the decoder's
  # own in attention.self_cache_dtype's (float32 on a CPU).
  cached = jax.tree_util.tree_flatten_with_path(cache)[0]
  dtypes = lambda part: {x.dtype for p, x in cached if part in jax.tree_util.keystr(p)}
  assert dtypes("cross_attention") == {jnp.dtype(dtype)}
  assert dtypes("self_attention") == {jnp.dtype(attention_lib.self_cache_dtype(dtype))}


@pytest.mark.parametrize("score", ATTENTION_SCORES)
@pytest.mark.parametrize("d_k", [0, 4])
def test_parameter_count_per_score(score, d_k):
  """The tiny model counted by hand: V*D shared embedding; per attention 2 D H d_k
  (W^Q, W^K) + 2 D^2 (W^V, W^O; d_v = D / H) plus the score's own per-head
  matrices, H K^2 for general (W) and H (2 K^2 + K) for additive (W_q, W_k, v),
  K = d_k; 2 D d_ff + d_ff + D per FFN; 2 D per LayerNorm. 3N attentions: one per
  encoder layer, two per decoder layer."""
  cfg = tiny_config(attention_score=score, d_k=d_k)
  V, D, F, N = TINY["input_vocab_size"], TINY["d_model"], TINY["d_ff"], TINY["num_layers"]
  H, K = cfg.num_heads, d_k or D // cfg.num_heads
  extra = {"scaled_dot": 0, "dot": 0, "general": H * K * K, "additive": H * (2 * K * K + K)}
  attention, ffn = 2 * D * H * K + 2 * D * D + extra[score], 2 * D * F + F + D
  expected = V * D + N * (attention + ffn + 2 * 2 * D) + N * (2 * attention + ffn + 3 * 2 * D)
  assert parameter_count(parameter_shapes(cfg)) == expected


def test_d_k_of_d_model_over_h_is_the_default_model():
  """Setting d_k to d_model / h changes nothing: same parameters, same outputs."""
  rng = np.random.default_rng(8)
  inputs, targets = random_tokens(rng, [5, 3], 6), random_tokens(rng, [4, 6], 6)
  _, default = init_model(tiny_config(), inputs, targets)
  model, explicit = init_model(tiny_config(d_k=8), inputs, targets)
  jax.tree.map(np.testing.assert_array_equal, default, explicit)
  np.testing.assert_array_equal(model.apply({"params": default}, inputs, targets),
                                model.apply({"params": explicit}, inputs, targets))


# The activations by their formulas: relu is the paper's max(0, x) (3.3); gelu is
# jax.nn.gelu's default, the tanh approximation; silu is x * sigmoid(x).
ACTIVATION_FORMULAS = {
    "relu": lambda h: np.maximum(0.0, h),
    "gelu": lambda h: 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3))),
    "silu": lambda h: h / (1 + np.exp(-h)),
}


def _perturbed(params, seed=0, scale=0.2):
  """params plus N(0, scale^2) noise: LayerNorm scales move away from 1 and biases
  from 0, so that a norm or a bias left out or misplaced changes the outputs."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [p + scale * jax.random.normal(k, p.shape, p.dtype)
                                   for p, k in zip(leaves, keys)])


def _layer_norm(x, p):
  """LayerNorm over the last axis with epsilon 1e-6, its scale and bias from `p`."""
  x = np.asarray(x, np.float64)
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def _ffn(x, p, activation):
  """activation(x W1 + b1) W2 + b2 from FeedForward's parameters (3.3)."""
  h = np.asarray(x, np.float64) @ np.asarray(p["inner"]["kernel"]) + np.asarray(p["inner"]["bias"])
  return (ACTIVATION_FORMULAS[activation](h) @ np.asarray(p["outer"]["kernel"])
          + np.asarray(p["outer"]["bias"]))


def _attend(cfg, p, self_attention, x, memory, mask):
  """MultiHeadAttention with parameters `p` (itself checked against per-head
  matrices in test_attention)."""
  out = MultiHeadAttention(cfg, self_attention=self_attention).apply(
      {"params": p}, jnp.asarray(x, jnp.float32), jnp.asarray(memory, jnp.float32), mask,
      deterministic=True)
  return np.asarray(out, np.float64)


def _block(cfg, x, sublayer, norm_params):
  """The paper's LayerNorm(x + Sublayer(x)) (3.1) post-LN; x + Sublayer(LayerNorm(x)) pre-LN."""
  if cfg.norm_position == "pre":
    return x + sublayer(_layer_norm(x, norm_params))
  return _layer_norm(x + sublayer(x), norm_params)


def _encoder_layer(cfg, p, x, mask):
  x = _block(cfg, x, lambda h: _attend(cfg, p["self_attention"], True, h, h, mask),
             p["self_attention_norm"])
  return _block(cfg, x, lambda h: _ffn(h, p["feed_forward"], cfg.activation),
                p["feed_forward_norm"])


def _decoder_layer(cfg, p, y, encoded, self_mask, cross_mask):
  y = _block(cfg, y, lambda h: _attend(cfg, p["self_attention"], True, h, h, self_mask),
             p["self_attention_norm"])
  y = _block(cfg, y, lambda h: _attend(cfg, p["cross_attention"], False, h, encoded, cross_mask),
             p["cross_attention_norm"])
  return _block(cfg, y, lambda h: _ffn(h, p["feed_forward"], cfg.activation),
                p["feed_forward_norm"])


def test_activation_formulas_cover_every_activation_and_relu_is_the_default():
  """A new activation needs its formula here; the paper's FFN is max(0, .) (3.3)."""
  assert set(ACTIVATION_FORMULAS) == set(ACTIVATIONS)
  assert tiny_config().activation == "relu"


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_feed_forward_is_activation_of_x_w1_plus_b1_times_w2_plus_b2(activation):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (3.3) with config.model.activation in place of
  max(0, .), from the module's own parameters (biases made non-zero): the
  activation the config names is the one applied, between the two layers."""
  cfg = tiny_config(activation=activation)
  ffn = FeedForward(cfg)
  x = jax.random.normal(jax.random.key(0), (2, 5, cfg.d_model))
  params = _perturbed(ffn.init(jax.random.key(1), x)["params"])
  assert jax.tree.map(jnp.shape, params) == {
      "inner": {"kernel": (cfg.d_model, cfg.d_ff), "bias": (cfg.d_ff,)},
      "outer": {"kernel": (cfg.d_ff, cfg.d_model), "bias": (cfg.d_model,)}}
  with jax.default_matmul_precision("float32"):  # Not a GPU's TF32 products.
    got = ffn.apply({"params": params}, x)
  np.testing.assert_allclose(got, _ffn(x, params, activation), atol=1e-5)
  # The activations differ by O(0.1) on these inputs: another one would show.
  for other in set(ACTIVATIONS) - {activation}:
    assert np.abs(_ffn(x, params, other) - got).max() > 1e-2, other


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_layers_are_their_sublayers_in_residual_blocks(norm_position):
  """An encoder layer is self-attention then the FFN, a decoder layer masked
  self-attention, encoder-decoder attention, then the FFN (3.1), each sublayer in
  LayerNorm(x + Sublayer(x)) post-LN (the paper's) or x + Sublayer(LayerNorm(x))
  pre-LN: the layers equal that composition written out, from their parameters
  (LayerNorm scales and all biases made non-trivial)."""
  cfg = tiny_config(norm_position=norm_position)
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.normal(size=(2, 5, cfg.d_model)), jnp.float32)
  y = jnp.asarray(rng.normal(size=(2, 4, cfg.d_model)), jnp.float32)
  mask = attention_lib.padding_mask(jnp.asarray([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]))
  causal = attention_lib.causal_mask(4)

  with jax.default_matmul_precision("float32"):  # Not a GPU's TF32 products.
    encoder_layer = EncoderLayer(cfg)
    params = _perturbed(encoder_layer.init(jax.random.key(0), x, mask,
                                           deterministic=True)["params"])
    got = encoder_layer.apply({"params": params}, x, mask, deterministic=True)
    np.testing.assert_allclose(got, _encoder_layer(cfg, params, x, mask), atol=1e-4)

    decoder_layer = DecoderLayer(cfg)
    params = _perturbed(decoder_layer.init(jax.random.key(1), y, x, causal, mask,
                                           deterministic=True)["params"], seed=1)
    got = decoder_layer.apply({"params": params}, y, x, causal, mask, deterministic=True)
    np.testing.assert_allclose(got, _decoder_layer(cfg, params, y, x, causal, mask),
                               atol=1e-4)


def test_bfloat16_layer_norms_reduce_in_float32():
  """Under bfloat16 compute LayerNorm's mean and variance are float32 reductions
  (flax's default, kept). Pre-LN's norms read the unnormalised residual stream:
  with its offset here, 48 (bfloat16's spacing there: 0.25, and 16 at E[x^2] ~
  2300), a bfloat16 E[x^2] - E[x]^2 keeps nothing of a unit variance, and the
  layer's output is off by thousands. In float32 the bfloat16 layer equals its
  float32 composition up to bfloat16's rounding of that stream."""
  cfg = tiny_config(norm_position="pre", dtype="bfloat16")
  rng = np.random.default_rng(6)
  x = jnp.asarray(48 + rng.normal(size=(2, 5, cfg.d_model)), jnp.bfloat16)
  mask = attention_lib.padding_mask(jnp.asarray([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]))
  layer = EncoderLayer(cfg)
  params = _perturbed(layer.init(jax.random.key(0), x, mask, deterministic=True)["params"])
  got = layer.apply({"params": params}, x, mask, deterministic=True)
  want = _encoder_layer(tiny_config(norm_position="pre"), params, np.asarray(x, np.float64), mask)
  np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=1.0)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_stacks_are_their_layers_then_a_final_norm_when_pre_ln(norm_position):
  """Each stack is embeddings * sqrt(d_model) + positions, then its N layers; pre-LN
  leaves the residual stream unnormalised, so each stack ends in its own LayerNorm
  (`final_norm`) there, and post-LN (whose layers end in one) has none. The whole
  model equals that composition written out: encoder output and logits (x E^T
  through the shared embedding E, 3.4)."""
  cfg = tiny_config(norm_position=norm_position)
  rng = np.random.default_rng(7)
  inputs = random_tokens(rng, [5, 3], 6)
  targets = random_tokens(rng, [4, 6], 6)
  model, params = init_model(cfg, inputs, targets)
  params = _perturbed(params, seed=2)
  layers = {f"layer_{i}" for i in range(cfg.num_layers)}
  final = {"final_norm"} if norm_position == "pre" else set()
  assert set(params["encoder"]) == layers | final
  assert set(params["decoder"]) == layers | final

  with jax.default_matmul_precision("float32"):  # Not a GPU's TF32 products.
    table = np.asarray(params["shared_embedding"]["embedding"], np.float64)
    positions = sinusoidal_table(cfg.max_len, cfg.d_model)
    embed = lambda ids: table[ids] * math.sqrt(cfg.d_model) + positions[:ids.shape[1]]
    mask = attention_lib.padding_mask(jnp.asarray(inputs))
    x = embed(inputs)
    for i in range(cfg.num_layers):
      x = _encoder_layer(cfg, params["encoder"][f"layer_{i}"], x, mask)
    if norm_position == "pre":
      x = _layer_norm(x, params["encoder"]["final_norm"])
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    np.testing.assert_allclose(encoded, x, atol=1e-4)

    y = embed(np.asarray(shift_right(jnp.asarray(targets), cfg.bos_id)))
    causal = attention_lib.causal_mask(targets.shape[1])
    for i in range(cfg.num_layers):
      y = _decoder_layer(cfg, params["decoder"][f"layer_{i}"], y, x, causal, mask)
    if norm_position == "pre":
      y = _layer_norm(y, params["decoder"]["final_norm"])
    logits = model.apply({"params": params}, inputs, targets)
    np.testing.assert_allclose(logits, y @ table.T, atol=1e-4)


def test_dropout_is_active_only_in_training():
  cfg = tiny_config(dropout=0.3)
  rng = np.random.default_rng(4)
  inputs = random_tokens(rng, [5], 5); targets = random_tokens(rng, [5], 5)
  model, params = init_model(cfg, inputs, targets)
  det = model.apply({"params": params}, inputs, targets)
  np.testing.assert_array_equal(det, model.apply({"params": params}, inputs, targets))
  a = model.apply({"params": params}, inputs, targets, deterministic=False,
                  rngs={"dropout": jax.random.key(1)})
  b = model.apply({"params": params}, inputs, targets, deterministic=False,
                  rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(a, b) and not np.allclose(a, det)


def test_dropout_acts_on_sublayer_outputs_and_embedding_sums_only():
  """Section 5.4: dropout on each sub-layer's output before the residual add, and
  on the sums of embeddings and positional encodings, in both stacks; nowhere
  else. Every Dropout call is recorded with the module that ran just before it
  in the same scope: it must be one of those, and the value dropped must be
  exactly that module's output."""
  from transformer.attention import MultiHeadAttention  # pylint: disable=g-import-not-at-top
  from transformer.dropout import Dropout  # pylint: disable=g-import-not-at-top
  from transformer.model import FeedForward, PositionalEncoding  # pylint: disable=g-import-not-at-top
  for norm_position in ("post", "pre"):
    cfg = tiny_config(dropout=0.3, norm_position=norm_position)
    rng = np.random.default_rng(4)
    inputs = random_tokens(rng, [5], 5); targets = random_tokens(rng, [5], 5)
    model, params = init_model(cfg, inputs, targets)
    calls = []  # (module, its parent's path, input, output), in the order calls end.

    def record(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if context.method_name == "__call__":
        calls.append((context.module, context.module.path[:-1], args[0], out))
      return out

    with nn.intercept_methods(record):
      model.apply({"params": params}, inputs, targets, deterministic=False,
                  rngs={"dropout": jax.random.key(1)})
    sites = []
    for i, (module, parent, x, _) in enumerate(calls):
      if not isinstance(module, Dropout):
        continue
      before = [c for c in calls[:i] if c[1] == parent and not isinstance(c[0], Dropout)]
      source, _, _, source_out = before[-1]
      assert isinstance(source, (MultiHeadAttention, FeedForward, PositionalEncoding))
      np.testing.assert_array_equal(x, source_out)
      sites.append("/".join(parent[:2]) + ":" + type(source).__name__)
    n = cfg.num_layers
    expected = (["encoder:PositionalEncoding"]
                + [f"encoder/layer_{i}:{m}" for i in range(n)
                   for m in ("MultiHeadAttention", "FeedForward")]
                + ["decoder:PositionalEncoding"]
                + [f"decoder/layer_{i}:{m}" for i in range(n)
                   for m in ("MultiHeadAttention", "MultiHeadAttention", "FeedForward")])
    assert sites == expected, norm_position


@pytest.mark.parametrize("score", ATTENTION_SCORES)
@pytest.mark.parametrize("attention_impl", ATTENTION_IMPLEMENTATIONS)
def test_attention_dropout_is_its_own_rate_in_every_attention(score, attention_impl,
                                                              monkeypatch):
  """Dropout on the attention probabilities is config.model.attention_dropout's, not
  P_drop's (the paper has none there: 5.4): in a training forward with dropout=0.1
  it never runs at attention_dropout=0, and at 0.2 it runs once in each of the 3N
  attentions, at that rate, on [B, H, T, S] probabilities. Every dropout of the
  attention code is recorded (attention.dropout)."""
  calls = []

  def recording(x, rate, rng):
    calls.append((x.shape, rate))
    return dropout_lib.dropout(x, rate, rng)

  monkeypatch.setattr(attention_lib, "dropout", recording)
  rng = np.random.default_rng(4)
  inputs = random_tokens(rng, [5, 3], 5); targets = random_tokens(rng, [4, 4], 4)
  for attention_dropout in (0.0, 0.2):
    cfg = tiny_config(dropout=0.1, attention_dropout=attention_dropout,
                      attention_score=score, attention_impl=attention_impl)
    model, params = init_model(cfg, inputs, targets)
    calls.clear()
    # Traced, not run: the dropouts a trace records are the program's. (A new
    # function, so traced anew, with the recording dropout.)
    jax.eval_shape(lambda p, i, t, rng: model.apply(p, i, t, deterministic=False,
                                                    rngs={"dropout": rng}),
                   {"params": params}, inputs, targets, jax.random.key(1))
    if attention_dropout == 0.0:
      assert calls == []
      continue
    H, S, T = cfg.num_heads, inputs.shape[1], targets.shape[1]
    expected = [((2, H, S, S), 0.2)] * cfg.num_layers + [((2, H, T, T), 0.2),
                                                         ((2, H, T, S), 0.2)] * cfg.num_layers
    assert calls == expected


@pytest.mark.parametrize("tie_output", [True, False])
def test_bfloat16_compute_is_finite_and_close_to_float32(tie_output):
  rng = np.random.default_rng(5)
  inputs = random_tokens(rng, [6, 4], 6); targets = random_tokens(rng, [5, 5], 5)
  untied = {} if tie_output else dict(share_embeddings=False, tie_output=False)
  model32, params = init_model(tiny_config(**untied), inputs, targets)
  model16 = Transformer(tiny_config(dtype="bfloat16", **untied))
  out32 = model32.apply({"params": params}, inputs, targets)
  out16 = model16.apply({"params": params}, inputs, targets)
  assert out16.dtype == jnp.float32  # logits stay float32 ...
  as_bf16 = np.asarray(out16.astype(jnp.bfloat16).astype(jnp.float32))
  assert np.mean(np.asarray(out16) == as_bf16) < 0.1  # ... and were never rounded to bf16.
  assert np.all(np.isfinite(out16))  # (Parameters stay float32: test_mixed_precision.)
  # bf16 keeps 8 significant bits. Its computation may deviate from float32 by
  # about as much as rounding the parameters alone to bf16 does (both ~0.02 on
  # these O(1) logits), not by more: a product or softmax left in bf16 end to
  # end would.
  rounded = jax.tree.map(lambda p: p.astype(jnp.bfloat16).astype(jnp.float32), params)
  rounding_error = np.abs(model32.apply({"params": rounded}, inputs, targets) - out32).max()
  assert np.abs(out16 - out32).max() <= 2 * rounding_error
  probs32 = jax.nn.softmax(out32); probs16 = jax.nn.softmax(out16)
  assert float(jnp.abs(probs32 - probs16).max()) < 0.02


def test_a_sequence_longer_than_max_len_is_refused_not_nan():
  """Positions past the table would read NaN, which attention spreads to every
  position of the sequence: the model names the limit instead."""
  cfg = tiny_config()
  rng = np.random.default_rng(2)
  model, params = init_model(cfg, random_tokens(rng, [4], 4), random_tokens(rng, [4], 4))
  fits = random_tokens(rng, [cfg.max_len], cfg.max_len)
  assert np.isfinite(apply(model, {"params": params}, fits, fits)).all()
  over = random_tokens(rng, [cfg.max_len + 1], cfg.max_len + 1)
  for inputs, targets in ((over, fits), (fits, over)):
    with pytest.raises(ValueError, match=f"longer than config.model.max_len={cfg.max_len}"):
      apply(model, {"params": params}, inputs, targets)

