"""Tests for transformer/rnn.py: padding, the encoder's two directions, the decoder's
start state and steps against the papers' formulas recomputed by hand, decoding state
against the teacher-forced pass, beam 1 = greedy, parameter counts, config errors, and
a tiny SCAN run trained, resumed, evaluated and translated through the shared commands."""

import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import process_helpers
from tests.helpers import compiled_apply, random_tokens, tiny_experiment
from tests.test_plots import assert_png
from transformer import decode, evaluate, state as state_lib, training, translate
from transformer.config import ModelConfig, check_config, check_model_axis, model_config
from transformer.model import shift_right
from transformer.rnn import RNNDecoding, RNNEncoderDecoder
from transformer.state import parameter_count, parameter_shapes

V = 23
# Each attention with a different cell, depth and feeding, to cover them in few compilations.
VARIANTS = {
    "bahdanau": dict(rnn_attention="bahdanau", rnn_cell="gru", num_layers=2),
    "luong_general": dict(rnn_attention="luong_general", rnn_cell="lstm", num_layers=1),
    "luong_dot": dict(rnn_attention="luong_dot", rnn_cell="gru", num_layers=1,
                      rnn_input_feeding=False),
}


def rnn_config(**overrides) -> ModelConfig:
  return ModelConfig(**{**dict(input_vocab_size=V, output_vocab_size=V, num_layers=1,
                               d_model=16, dropout=0.0, max_len=24, architecture="rnn"),
                        **overrides})


@functools.lru_cache(maxsize=None)
def tiny(variant):
  """(model, params) of a tiny RNN, initialised once per variant."""
  model = RNNEncoderDecoder(rnn_config(**VARIANTS[variant]))
  ones = jnp.ones((1, 4), jnp.int32)
  return model, jax.jit(model.init)(jax.random.key(0), ones, ones)["params"]


def forward(variant, inputs, targets):
  model, params = tiny(variant)
  return np.asarray(compiled_apply(model, {"params": params}, jnp.asarray(inputs),
                                   jnp.asarray(targets)))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_padding_does_not_change_real_positions(variant):
  """More PAD columns after sources and targets, and a row's batch-mates, change
  nothing at real target positions: the backward direction starts at each row's
  last real token and attention never reads PAD."""
  rng = np.random.default_rng(0)
  inputs, targets = random_tokens(rng, [5, 3], 6, V), random_tokens(rng, [4, 6], 6, V)
  logits = forward(variant, inputs, targets)
  wide = forward(variant, np.pad(inputs, ((0, 0), (0, 4))), np.pad(targets, ((0, 0), (0, 3))))
  alone = forward(variant, inputs[1:, :3], targets[1:])
  for b, n in enumerate([4, 6]):
    np.testing.assert_allclose(wide[b, :n], logits[b, :n], atol=1e-5, rtol=0)
  np.testing.assert_allclose(alone[0], logits[1], atol=1e-5, rtol=0)


def test_encoder_directions_read_left_and_right_context():
  """h_j = [fwd h_j; bwd h_j] (Bahdanau 3.2): the forward half at j reads tokens
  <= j, the backward half tokens >= j of the real sentence. Reversing each row's
  real tokens and swapping the directions' parameters swaps the halves, reversed."""
  model, params = tiny("luong_general")  # One bidirectional layer.
  encode = functools.partial(compiled_apply, model, method="encode")
  h = 16 // 2
  rng = np.random.default_rng(1)
  lengths = [6, 4]
  inputs = random_tokens(rng, lengths, 7, V)
  reversed_inputs = inputs.copy()
  for b, n in enumerate(lengths):
    reversed_inputs[b, :n] = inputs[b, :n][::-1]
  layer = params["encoder"]["layer_0"]
  swapped = {**params, "encoder": {"layer_0": {"forward_rnn": layer["backward_rnn"],
                                               "backward_rnn": layer["forward_rnn"]}}}
  enc = np.asarray(encode({"params": params}, inputs))
  enc_rev = np.asarray(encode({"params": swapped}, reversed_inputs))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(enc_rev[b, :n, :h], enc[b, :n, h:][::-1], atol=1e-6)
    np.testing.assert_allclose(enc_rev[b, :n, h:], enc[b, :n, :h][::-1], atol=1e-6)
  # A changed token at k changes forward outputs at j >= k only, backward at j <= k only.
  k = 2
  changed = inputs.copy()
  changed[:, k] = np.where(changed[:, k] == 4, 5, 4)
  diff = np.abs(np.asarray(encode({"params": params}, changed)) - enc)
  for b, n in enumerate(lengths):
    np.testing.assert_array_equal(diff[b, :n, :h].max(-1) > 0, np.arange(n) >= k)
    np.testing.assert_array_equal(diff[b, :n, h:].max(-1) > 0, np.arange(n) <= k)


def _dense(p, x):
  """x W + b of a Dense's parameters (no b without a bias), in float64."""
  y = x @ np.asarray(p["kernel"], np.float64)
  return y + np.asarray(p["bias"], np.float64) if "bias" in p else y


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def naive_cell(p, state, x):
  """flax's GRU or LSTM cell from its parameters: (new state, its output h)."""
  if "hn" in p:  # GRU: reset r, update z, candidate n; h' = (1 - z) n + z h.
    r = _sigmoid(_dense(p["ir"], x) + _dense(p["hr"], state))
    z = _sigmoid(_dense(p["iz"], x) + _dense(p["hz"], state))
    n = np.tanh(_dense(p["in"], x) + r * _dense(p["hn"], state))
    h = (1 - z) * n + z * state
    return h, h
  c, h = state  # LSTM: gates i, f, o and candidate g; c' = f c + i g, h' = o tanh(c').
  i, f, g, o = (_dense(p["i" + k], x) + _dense(p["h" + k], h) for k in "ifgo")
  c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
  h = _sigmoid(o) * np.tanh(c)
  return (c, h), h


def naive_start(cfg, params, encoded_BxSxD):
  """The decoder's start state by hand: s_0 = tanh(W_s bwd h_1) (Bahdanau A.2.2), bwd
  h_1 the backward direction's state after reading the whole source, one slice of
  W_s per decoder layer; an LSTM's memory starts at 0."""
  D = cfg.d_model
  s0 = np.tanh(_dense(params["decoder"]["init_state"], encoded_BxSxD[:, 0, D // 2:]))
  states = [s0[:, i * D:(i + 1) * D] for i in range(cfg.num_layers)]
  return [(np.zeros_like(s), s) if cfg.rnn_cell == "lstm" else s for s in states]


def naive_rnn_decoder(cfg, params, encoded_BxSxD, inputs_BxS, decoder_inputs_BxT):
  """The teacher-forced decoder step by step with numpy, from the model's parameters
  and annotations h_j: ([B, T, V] tied logits, [B, T, S] attention weights).

  bahdanau: e_ij = v^T tanh(W s_{i-1} + U h_j) (eq. 6) from the top layer's previous
  state, a_ij = softmax_j (eq. 7), c_i = sum_j a_ij h_j (eq. 5), s_i = f(s_{i-1},
  [y_{i-1}; c_i]), output tanh(W_o [y_{i-1}; s_i; c_i] + b_o) (eq. 4).
  luong_*: h_t = f(h_{t-1}, [y_{t-1}; h~_{t-1}]) (input feeding, 3.3, h~_0 = 0) or
  f(h_{t-1}, y_{t-1}); score(h_t, h_s) = h_t^T W_a h_s or h_t^T h_s (eq. 8) from
  the new state h_t; a_t, c_t; h~_t = tanh(W_c [c_t; h_t]) (eq. 5), fed to step t+1.
  """
  D, attention = cfg.d_model, cfg.rnn_attention
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["decoder"])
  embedding_VxD = np.asarray(params["shared_embedding"]["embedding"], np.float64)
  h_BxSxD = np.asarray(encoded_BxSxD, np.float64)
  states = naive_start(cfg, params, h_BxSxD)
  keys_BxSxD = h_BxSxD if attention == "luong_dot" else _dense(p["keys"], h_BxSxD)
  feed_BxD = np.zeros((h_BxSxD.shape[0], D))
  hidden = lambda state: state[1] if isinstance(state, tuple) else state

  def attend(scores_BxS):
    scores_BxS = np.where(inputs_BxS != cfg.pad_id, scores_BxS, -np.inf)
    w = np.exp(scores_BxS - scores_BxS.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w, np.einsum("bs,bsd->bd", w, h_BxSxD)

  def layers(x_BxI):
    for i in range(cfg.num_layers):
      states[i], x_BxI = naive_cell(p["cell"][f"layer_{i}"], states[i], x_BxI)
    return x_BxI

  outs, weights = [], []
  for t in range(decoder_inputs_BxT.shape[1]):
    y_BxD = embedding_VxD[decoder_inputs_BxT[:, t]] * np.sqrt(D)
    if attention == "bahdanau":
      query_BxD = _dense(p["cell"]["query"], hidden(states[-1]))  # W s_{i-1}, before the step.
      a_BxS, c_BxD = attend(np.tanh(query_BxD[:, None] + keys_BxSxD) @ p["cell"]["score_v"])
      s_BxD = layers(np.concatenate([y_BxD, c_BxD], -1))
      out_BxD = np.tanh(_dense(p["cell"]["output"], np.concatenate([y_BxD, s_BxD, c_BxD], -1)))
    else:
      h_BxD = layers(np.concatenate([y_BxD, feed_BxD], -1) if cfg.rnn_input_feeding else y_BxD)
      a_BxS, c_BxD = attend(np.einsum("bd,bsd->bs", h_BxD, keys_BxSxD))  # From the new h_t.
      out_BxD = feed_BxD = np.tanh(_dense(p["cell"]["attentional"],
                                          np.concatenate([c_BxD, h_BxD], -1)))
    outs.append(out_BxD)
    weights.append(a_BxS)
  return np.stack(outs, 1) @ embedding_VxD.T, np.stack(weights, 1)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoder_equals_the_papers_formulas_by_hand(variant):
  """The teacher-forced logits and attention weights equal naive_rnn_decoder's,
  the papers' equations written out step by step on the model's own parameters and
  annotations: the other tests compare the RNN only with itself, which a score
  blind to the decoder state, a Luong score from h_{t-1}, a start state from the
  forward direction or h_t fed instead of h~_t would all pass."""
  model, params = tiny(variant)
  rng = np.random.default_rng(7)
  inputs = random_tokens(rng, [5, 3], 6, V)
  targets = random_tokens(rng, [4, 6], 6, V)
  encoded = compiled_apply(model, {"params": params}, jnp.asarray(inputs), method="encode")
  decoder_inputs = np.asarray(shift_right(jnp.asarray(targets), model.config.bos_id))
  logits, weights = naive_rnn_decoder(model.config, params, encoded, inputs, decoder_inputs)
  np.testing.assert_allclose(
      compiled_apply(model, {"params": params}, jnp.asarray(inputs), jnp.asarray(targets),
                     method="attention_weights"), weights, atol=1e-5, rtol=0)
  np.testing.assert_allclose(forward(variant, inputs, targets), logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_start_state_is_tanh_of_the_backward_first_annotation(variant):
  """start() gives each decoder layer tanh(W_s bwd h_1) (Bahdanau A.2.2): from the
  backward half of the first annotation, which has read the whole source (the
  forward half there has read one token), an LSTM's memory and Luong's h~_0 at 0."""
  model, params = tiny(variant)
  cfg = model.config
  inputs = jnp.asarray(random_tokens(np.random.default_rng(8), [5, 3], 6, V))
  encoded = compiled_apply(model, {"params": params}, inputs, method="encode")
  _, carry = compiled_apply(model, {"params": params}, encoded, inputs, method="start")
  expected = {"layers": tuple(naive_start(cfg, params, np.asarray(encoded, np.float64)))}
  if cfg.rnn_attention != "bahdanau" and cfg.rnn_input_feeding:
    expected["feed"] = np.zeros((2, cfg.d_model))
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6, rtol=0),
               jax.tree.map(np.asarray, carry), expected)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoding_steps_equal_the_teacher_forced_pass(variant):
  """The decoding contract (encode once; start; one step a token) gives the logits
  of the teacher-forced scan step by step, and greedy decoding picks their argmax:
  teacher-forcing the greedy output reproduces it."""
  model, params = tiny(variant)
  decoding = RNNDecoding(model)
  rng = np.random.default_rng(2)
  inputs = jnp.asarray(random_tokens(rng, [5, 3], 6, V))
  targets = jnp.asarray(random_tokens(rng, [7, 7], 7, V))

  @jax.jit
  def stepwise(params, inputs, decoder_inputs):
    context, cache = decoding.init_state(params, decoding.encode(params, inputs), inputs, 0)

    def step(cache, ids_Bx1):
      logits, cache = decoding.step(params, context, cache, ids_Bx1[:, None])
      return decoding.grow(cache, 99), logits

    return jnp.swapaxes(jax.lax.scan(step, cache, decoder_inputs.T)[1], 0, 1)

  np.testing.assert_allclose(stepwise(params, inputs, shift_right(targets, model.config.bos_id)),
                             forward(variant, inputs, targets), atol=1e-5, rtol=0)
  # eos_id = V cannot be emitted: the rows run to their limits, 5 + 4 and 3 + 4 tokens.
  greedy = np.asarray(decode.encode_and_decode(decoding, params, inputs, mode="greedy",
                                               max_extra_len=4, eos_id=V))
  assert greedy.shape == (2, 10) and not greedy[0, 9:].any() and not greedy[1, 7:].any()
  teacher = forward(variant, np.asarray(inputs), greedy).argmax(-1)
  for b, n in enumerate([9, 7]):
    np.testing.assert_array_equal(teacher[b, :n], greedy[b, :n])


@pytest.mark.parametrize("variant", ["bahdanau", "luong_general"])  # GRU and LSTM.
def test_bfloat16_compute_keeps_float32_parameters_and_logits(variant):
  """model.dtype=bfloat16 (what 'auto' picks on accelerators) runs the cells, the
  attention and the decoding steps in bfloat16 on the same float32 parameters
  (each encoder direction carries its state in float32, its output bfloat16):
  logits come back float32 and near the float32 model's, and the gradient is finite."""
  model, params = tiny(variant)
  half = RNNEncoderDecoder(rnn_config(**VARIANTS[variant], dtype="bfloat16"))
  rng = np.random.default_rng(6)
  inputs = jnp.asarray(random_tokens(rng, [5, 3], 6, V))
  targets = jnp.asarray(random_tokens(rng, [4, 6], 6, V))
  logits = compiled_apply(half, {"params": params}, inputs, targets)
  assert logits.dtype == jnp.float32  # Accumulated in float32, tied or not, never rounded:
  assert np.mean(np.asarray(logits) == np.asarray(logits.astype(jnp.bfloat16).astype(
      jnp.float32))) < 0.1
  full = forward(variant, inputs, targets)
  real = np.asarray(targets) != 0
  np.testing.assert_allclose(np.asarray(logits)[real], full[real], atol=0.05, rtol=0.05)

  def loss(params):
    return jnp.mean(half.apply({"params": params}, inputs, targets) ** 2)
  grads = jax.jit(jax.grad(loss))(params)
  assert all(g.dtype == jnp.float32 and bool(jnp.isfinite(g).all())
             for g in jax.tree.leaves(grads))
  # The source annotations (the context decoding reads) and the decoding state
  # are bfloat16, and the greedy search runs on them.
  encoded = compiled_apply(half, {"params": params}, inputs, method="encode")
  assert encoded.dtype == jnp.bfloat16
  decoding = RNNDecoding(half)
  greedy = jax.jit(functools.partial(decode.encode_and_decode, decoding, mode="greedy",
                                     max_extra_len=3, eos_id=V))(params, inputs)
  assert greedy.shape == (2, 9) and int(greedy.max()) < V


def test_beam_size_one_equals_greedy():
  model, params = tiny("bahdanau")
  inputs = jnp.asarray(random_tokens(np.random.default_rng(3), [6, 2], 6, V))
  run = jax.jit(functools.partial(decode.encode_and_decode, RNNDecoding(model), max_extra_len=5),
                static_argnames=("mode", "beam_size"))
  for eos_id in (3, V):  # The real EOS (alpha 0), and one the model cannot emit.
    np.testing.assert_array_equal(
        run(params, inputs, mode="beam", beam_size=1, alpha=0.0, eos_id=eos_id),
        run(params, inputs, mode="greedy", eos_id=eos_id))


def _gru(i, h):  # flax GRUCell: 3 input matrices with biases, 3 recurrent, one bias (hn).
  return 3 * (i * h + h) + 3 * h * h + h


def _lstm(i, h):  # flax (Optimized)LSTMCell: 4 input matrices, 4 recurrent with biases.
  return 4 * i * h + 4 * (h * h + h)


@pytest.mark.parametrize("overrides", [
    dict(), dict(rnn_cell="lstm", num_layers=2),
    dict(rnn_attention="luong_general", share_embeddings=False, tie_output=False,
         output_vocab_size=19),
    dict(rnn_attention="luong_dot", rnn_input_feeding=False, num_layers=2)])
def test_parameter_count_by_formula(overrides):
  cfg = rnn_config(d_model=12, **overrides)
  D, N, h = cfg.d_model, cfg.num_layers, cfg.d_model // 2
  cell = _gru if cfg.rnn_cell == "gru" else _lstm
  embeddings = cfg.input_vocab_size * D + (0 if cfg.share_embeddings else cfg.output_vocab_size * D)
  encoder = N * 2 * cell(D, h)  # Two directions a layer, each reading D = 2 h.
  if cfg.rnn_attention == "bahdanau":
    first_input, attention = 2 * D, D * D + D + D * D  # W (query), v, U (keys).
    output = 3 * D * D + D  # tanh layer over [y; s; c].
  else:
    first_input = 2 * D if cfg.rnn_input_feeding else D
    attention = D * D if cfg.rnn_attention == "luong_general" else 0  # W_a (keys).
    output = 2 * D * D  # W_c [c; h], no bias (eq. 5).
  decoder = cell(first_input, D) + (N - 1) * cell(D, D)
  init = h * N * D + N * D  # s_0 = tanh(W_s bwd h_1), one per decoder layer.
  logits = 0 if cfg.tie_output else D * cfg.output_vocab_size
  expected = embeddings + encoder + attention + decoder + output + init + logits
  assert parameter_count(parameter_shapes(cfg)) == expected


@pytest.mark.parametrize("field,value,message", [
    ("architecture", "lstm", "config.model.architecture='lstm': must be one of"),
    ("rnn_cell", "rnn", "config.model.rnn_cell='rnn': must be one of"),
    ("rnn_attention", "luong", "config.model.rnn_attention='luong': must be one of"),
    ("d_model", 15, "config.model.d_model=15: must be even"),
])
def test_bad_rnn_values_name_the_field(field, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    rnn_config(**{field: value})


def test_rnn_needs_no_heads_and_rejects_packed_batches(tmp_path):
  rnn_config(d_model=18, num_heads=8)  # The heads are the Transformer's.
  # Its fields are warned of as unread on the RNN, so no value of theirs stops
  # the run (num_heads=0 was refused right after the warning).
  rnn_config(num_heads=0, d_ff=-3, d_k=-1, activation="none", attention_score="cosine")
  # Of any type: a config.json's unread field is the model without it.
  assert ModelConfig.from_config(dict(architecture="rnn", num_heads="8",
                                      attention_dropout="0.1")).num_heads == 8
  config = rnn_experiment(tmp_path)
  check_config(config)
  config.data.batching = "pack"
  with pytest.raises(ValueError, match=re.escape(
      "config.data.batching='pack': config.model.architecture='rnn' does not support")):
    check_config(config)
  model = state_lib.make_model(model_config(config, V))
  ones = jnp.ones((1, 3), jnp.int32)
  with pytest.raises(ValueError, match="packed rows"):
    jax.eval_shape(functools.partial(model.init, inputs_segmentation=ones),
                   jax.random.key(0), ones, ones)


# ---------------------------------------------------------------------------
# End to end: train.py's loop, checkpoints, evaluate, translate.

def rnn_experiment(data_dir, **train):
  """tests.helpers.tiny_experiment on the RNN: bucketed batches of SCAN examples of
  at most 24 tokens (few bucket shapes, hence few compilations)."""
  config = tiny_experiment(data_dir, **train)
  config.model.architecture = "rnn"
  config.model.rnn_attention = "bahdanau"
  config.data.batching = "bucket"
  config.data.max_length = 24
  config.optim.grad_clip_norm = 1.0
  return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, workdir, metrics) of a 30-step tiny RNN run (on the session's
  prepared SCAN: process_helpers.scan_tfds_dir)."""
  base = tmp_path_factory.mktemp("rnn_run")
  config = rnn_experiment(process_helpers.scan_tfds_dir(tmp_path_factory))
  workdir = str(base / "run")
  return config, workdir, training.train_and_evaluate(config, workdir)


def test_training_lowers_the_loss_checkpoints_and_resumes(trained):
  config, workdir, first = trained
  # A uniform prediction (where training starts) costs log(23) = 3.1 a token.
  assert first["loss"] < 0.75 * np.log(V) and first["accuracy"] > 0.4  # Measured 1.58, 0.59.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[-1] == "30"
  config.train.num_steps = 40
  second = training.train_and_evaluate(config, workdir)  # Resumes at 30.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[-1] == "40"
  assert second["loss"] < first["loss"]


def test_evaluate_and_translate_the_rnn_workdir(trained, tmp_path):
  _, workdir, _ = trained
  # Three sentences: one batch shape, one beam search program to compile.
  result, path = evaluate.run(workdir, split="test[:3]", mode="beam", beam_size=2)
  assert result["num_sentences"] == 3 and np.isfinite(result["perplexity"])
  assert 0 <= result["metrics"]["exact_match"] <= 1 and json.load(open(path))["mode"] == "beam"
  src, png = tmp_path / "in.txt", tmp_path / "att.png"
  src.write_text("walk twice\n\njump left\n")
  outputs = translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="greedy",
                          plot_attention=str(png))
  assert len(outputs) == 3 and outputs[1] == ""
  assert_png(str(png))
  # One attention: head 0 only (refused before any work), and no layers to choose.
  with pytest.raises(ValueError, match="head 1 out of range: the model has 1 heads"):
    translate.run(workdir, str(src), str(tmp_path / "out2.txt"), plot_attention=str(png),
                  head="1")
  assert not (tmp_path / "out2.txt").exists()


def test_rnn_configs_check():
  from configs import multi30k_rnn, rnn_scan  # pylint: disable=g-import-not-at-top
  check_config(rnn_scan.get_config())
  for attention in ("bahdanau", "luong_general", "luong_dot"):
    config = multi30k_rnn.get_config(attention)
    check_config(config)
    assert config.model.rnn_attention == attention
  with pytest.raises(ValueError, match="must be one of"):
    multi30k_rnn.get_config("luong")


def test_a_model_axis_is_refused_for_the_rnn():
  """The RNN has no tensor-parallel layers: a model axis of 2 trained with both
  devices doing the same work, without a word."""
  from configs import rnn_scan  # pylint: disable=g-import-not-at-top
  config = rnn_scan.get_config()
  config.train.mesh = "data=1,model=2"
  with pytest.raises(ValueError, match=r"config.train.mesh='data=1,model=2': model.architecture="
                     r"'rnn' has no tensor-parallel layers, so the model axis \(2\) must be 1"):
    check_config(config)
  config.train.mesh = "data=1,model=-1"  # Sized once the devices are known.
  check_config(config)
  with pytest.raises(ValueError, match=r"the model axis \(8, of 8 devices\) must be 1"):
    check_model_axis(config, 8, ", of 8 devices")
  check_model_axis(config, 1)
