"""The recurrent encoder-decoders with attention that the Transformer replaced (its
section 4 and Table 1): Bahdanau et al. 2015 ("Neural Machine Translation by Jointly
Learning to Align and Translate") and Luong et al. 2015 ("Effective Approaches to
Attention-based Neural Machine Translation"), in Flax linen's recurrent cells.

config.model.architecture = "rnn". The encoder is num_layers bidirectional layers of
d_model / 2 units a direction, so its annotations h_j are d_model wide like the
decoder state; the decoder is num_layers recurrent layers of d_model units. Same
shapes as model.py (B batch, S source, T target, D d_model, V vocabulary); packed
rows are not supported (a recurrence would carry its state across examples).

Where it departs from the papers (tests/test_rnn.py writes the equations out as
they are here): the GRU is Flax's, whose reset gate scales the recurrent
product, r * (W_hn s + b_hn), where Bahdanau's A.2.2 scales the state before it,
U (r * s); Bahdanau's output layer reads s_i, as eq. 4 writes g (A.2.2 reads
s_{i-1}), through a tanh layer in place of the maxout; and the Luong variants
start from the same s_0 = tanh(W_s bwd h_1), the encoder being bidirectional
(Luong's is one-directional, its last state the start).
"""

import dataclasses
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.config import ModelConfig
from transformer.dropout import Dropout
from transformer.model import ModuleDecoding, embeddings, shift_right, untied_logits

Array = jax.Array


def _cell(cfg: ModelConfig, features: int, **kw):
  cell = nn.GRUCell if cfg.rnn_cell == "gru" else nn.OptimizedLSTMCell
  return cell(features, dtype=cfg.compute_dtype, **kw)


def _hidden(state):
  """The output h of a layer's state: GRU h, LSTM (c, h)."""
  return state[1] if isinstance(state, tuple) else state


class RNNEncoder(nn.Module):
  """Embedding, then bidirectional layers (Bahdanau 3.2): h_j = [fwd h_j; bwd h_j].

  seq_lengths makes the backward direction start at each row's last real token, so
  no real position reads padding.
  """

  config: ModelConfig
  embed: nn.Module

  @nn.compact
  def __call__(self, inputs_BxS, *, deterministic: bool):
    cfg = self.config
    lengths_B = jnp.sum(inputs_BxS != cfg.pad_id, axis=1)
    x_BxSxD = self.embed(inputs_BxS)
    for i in range(cfg.num_layers):
      x_BxSxD = Dropout(cfg.dropout)(x_BxSxD, deterministic=deterministic)
      # parent=None: each RNN adopts its cell, the layer its RNNs (named parameters).
      direction = lambda: nn.RNN(_cell(cfg, cfg.d_model // 2, parent=None), parent=None)
      # Each direction carries its state in float32 (Flax's initial carry takes
      # the parameters' dtype): the outputs are rounded to the compute dtype.
      x_BxSxD = nn.Bidirectional(direction(), direction(), name=f"layer_{i}")(
          x_BxSxD, seq_lengths=lengths_B).astype(cfg.compute_dtype)
    return x_BxSxD


class AttentionDecoderCell(nn.Module):
  """One decoder step: (state, embedded previous token, context) -> (state,
  (output before the vocabulary projection, attention weights over the source)).

  bahdanau: e_ij = v^T tanh(W s_{i-1} + U h_j) from the previous state (eq. 6, A.1.2),
  c_i = sum_j a_ij h_j (eq. 5), s_i = f(s_{i-1}, y_{i-1}, c_i) (3.1), and the output
  reads y_{i-1}, s_i and c_i (eq. 4's g; a tanh layer in place of A.2.2's maxout).
  luong_*: h_t from the previous state (and h~_{t-1} with input feeding, 3.3), then
  score(h_t, h_s) = h_t^T h_s (dot) or h_t^T W h_s (general) (eq. 8), a_t (eq. 7),
  c_t, and the attentional hidden state h~_t = tanh(W_c [c_t; h_t]) (eq. 5).
  U h_j (bahdanau) and W h_s (general) are the context's keys, computed once.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, carry, y_BxD, context, deterministic: bool = True):
    cfg = self.config
    encoded_BxSxD, keys_BxSxD, mask_BxS = context
    dense = lambda features, name, bias=True: nn.Dense(
        features, use_bias=bias, dtype=cfg.compute_dtype, name=name)

    def attend(scores_BxS):
      # float32 softmax; a large finite negative keeps an all-PAD row finite.
      scores_BxS = jnp.where(mask_BxS, scores_BxS.astype(jnp.float32),
                             jnp.finfo(jnp.float32).min)
      weights_BxS = jax.nn.softmax(scores_BxS, axis=-1)
      c_BxD = jnp.einsum("bs,bsd->bd", weights_BxS.astype(encoded_BxSxD.dtype),
                         encoded_BxSxD)
      return weights_BxS, c_BxD

    def layers(states, x_BxI):
      new_states = []
      for i, state in enumerate(states):
        if i:
          x_BxI = Dropout(cfg.dropout)(x_BxI, deterministic=deterministic)
        state, x_BxI = _cell(cfg, cfg.d_model, name=f"layer_{i}")(state, x_BxI)
        new_states.append(state)
      return tuple(new_states), x_BxI

    if cfg.rnn_attention == "bahdanau":
      query_BxD = dense(cfg.d_model, "query", bias=False)(_hidden(carry["layers"][-1]))
      v_D = self.param("score_v", nn.initializers.normal(cfg.d_model**-0.5),
                       (cfg.d_model,), jnp.float32)
      scores_BxS = jnp.einsum("bsd,d->bs", jnp.tanh(query_BxD[:, None] + keys_BxSxD),
                              v_D.astype(keys_BxSxD.dtype))
      weights_BxS, c_BxD = attend(scores_BxS)
      states, s_BxD = layers(carry["layers"], jnp.concatenate([y_BxD, c_BxD], -1))
      out_BxD = jnp.tanh(dense(cfg.d_model, "output")(
          jnp.concatenate([y_BxD, s_BxD, c_BxD], -1)))
      return {"layers": states}, (out_BxD, weights_BxS)

    feeding = cfg.rnn_input_feeding
    x_BxI = jnp.concatenate([y_BxD, carry["feed"]], -1) if feeding else y_BxD
    states, h_BxD = layers(carry["layers"], x_BxI)
    weights_BxS, c_BxD = attend(jnp.einsum("bd,bsd->bs", h_BxD, keys_BxSxD))
    out_BxD = jnp.tanh(dense(cfg.d_model, "attentional", bias=False)(
        jnp.concatenate([c_BxD, h_BxD], -1)))
    new_carry = {"layers": states, "feed": out_BxD} if feeding else {"layers": states}
    return new_carry, (out_BxD, weights_BxS)


class RNNDecoder(nn.Module):
  """The attention decoder: its start state, the teacher-forced pass (a scan of the
  cell over the targets) and the single step of decoding share one cell."""

  config: ModelConfig
  embed: nn.Module

  def setup(self):
    cfg = self.config
    # s_0 = tanh(W_s bwd h_1) (Bahdanau A.2.2): the backward direction's state after
    # reading the whole source; one W_s per decoder layer.
    self.init_state = nn.Dense(cfg.num_layers * cfg.d_model, dtype=cfg.compute_dtype)
    if cfg.rnn_attention != "luong_dot":
      self.keys = nn.Dense(cfg.d_model, use_bias=False, dtype=cfg.compute_dtype)
    self.cell = AttentionDecoderCell(cfg)
    self.dropout = Dropout(cfg.dropout)
    if not cfg.tie_output:
      self.logits = untied_logits(cfg)

  def start(self, encoded_BxSxD, inputs_BxS):
    """(context, carry): what every step reads, and the state before the first step."""
    cfg = self.config
    B, D = inputs_BxS.shape[0], cfg.d_model
    keys_BxSxD = encoded_BxSxD if cfg.rnn_attention == "luong_dot" else self.keys(encoded_BxSxD)
    context = (encoded_BxSxD, keys_BxSxD, inputs_BxS != cfg.pad_id)
    s0_BxLD = jnp.tanh(self.init_state(encoded_BxSxD[:, 0, D // 2:]))
    s0 = [s0_BxLD[:, i * D:(i + 1) * D] for i in range(cfg.num_layers)]
    if cfg.rnn_cell == "lstm":  # (c, h): the memory starts empty.
      s0 = [(jnp.zeros_like(h), h) for h in s0]
    carry = {"layers": tuple(s0)}
    if cfg.rnn_attention != "bahdanau" and cfg.rnn_input_feeding:
      carry["feed"] = jnp.zeros((B, D), s0_BxLD.dtype)
    return context, carry

  def project(self, out_BxTxD, deterministic: bool):
    """Pre-softmax projection, float32 logits; the target embedding's when tied."""
    out_BxTxD = self.dropout(out_BxTxD, deterministic=deterministic)
    if self.config.tie_output:
      return self.embed.attend(out_BxTxD)
    return self.logits(out_BxTxD)

  def __call__(self, encoded_BxSxD, inputs_BxS, decoder_inputs_BxT, *,
               deterministic: bool = True):
    """-> ([B, T, V] logits, [B, T, S] attention weights), teacher-forced."""
    context, carry = self.start(encoded_BxSxD, inputs_BxS)
    y_BxTxD = self.dropout(self.embed(decoder_inputs_BxT), deterministic=deterministic)
    scan = nn.scan(lambda cell, carry, y, context, det: cell(carry, y, context, det),
                   variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                   in_axes=(1, nn.broadcast, nn.broadcast), out_axes=1)
    _, (out_BxTxD, weights_BxTxS) = scan(self.cell, carry, y_BxTxD, context, deterministic)
    return self.project(out_BxTxD, deterministic), weights_BxTxS

  def step(self, context, carry, ids_Bx1):
    """One decoding step (dropout off) -> (logits_BxV, carry)."""
    carry, (out_BxD, _) = self.cell(carry, self.embed(ids_Bx1[:, 0]), context)
    return self.project(out_BxD[:, None], True)[:, 0], carry


class RNNEncoderDecoder(nn.Module):
  """The RNN with attention, called as the Transformer is (state.build picks it)."""

  config: ModelConfig

  def setup(self):
    source_embed, target_embed = embeddings(self.config)
    self.encoder = RNNEncoder(self.config, source_embed)
    self.decoder = RNNDecoder(self.config, target_embed)

  def encode(self, inputs_BxS, *, deterministic: bool = True):
    """[B, S] source ids -> [B, S, D] annotations."""
    return self.encoder(inputs_BxS, deterministic=deterministic)

  def start(self, encoded_BxSxD, inputs_BxS):
    return self.decoder.start(encoded_BxSxD, inputs_BxS)

  def step(self, context, carry, ids_Bx1):
    return self.decoder.step(context, carry, ids_Bx1)

  def attention_weights(self, inputs_BxS, targets_BxT):
    """[B, T, S]: the soft alignment of the step predicting each target over the source."""
    encoded_BxSxD = self.encode(inputs_BxS)
    return self.decoder(encoded_BxSxD, inputs_BxS,
                        shift_right(targets_BxT, self.config.bos_id))[1]

  def __call__(self, inputs_BxS, targets_BxT, inputs_segmentation=None,
               targets_segmentation=None, inputs_position=None, targets_position=None,
               *, deterministic: bool = True):
    """Teacher-forced forward pass: [B, T, V] float32 logits predicting `targets`.
    Positions are implicit in the recurrence and ignored."""
    del inputs_position, targets_position
    if inputs_segmentation is not None or targets_segmentation is not None:
      raise ValueError("the rnn does not support packed rows: set data.batching='bucket'")
    encoded_BxSxD = self.encode(inputs_BxS, deterministic=deterministic)
    decoder_inputs_BxT = shift_right(targets_BxT, self.config.bos_id)
    return self.decoder(encoded_BxSxD, inputs_BxS, decoder_inputs_BxT,
                        deterministic=deterministic)[0]


@dataclasses.dataclass(frozen=True)
class RNNDecoding(ModuleDecoding):
  """The decoding contract (transformer.decode.DecodingModel) for the RNN.

  Context: the annotations, their attention keys and the source mask, computed
  once. Cache: the recurrent state of each decoder layer (and h~_{t-1} with Luong's
  input feeding); it has no length, so `grow` has nothing to do, and beam search
  reorders it row by row like any cache.
  """
  model: RNNEncoderDecoder

  def init_state(self, params, encoded_BxSxD, inputs_BxS, cache_len):
    del cache_len
    return self.model.apply({"params": params}, encoded_BxSxD, inputs_BxS, method="start")

  def step(self, params, context, cache, ids_Nx1):
    return self.model.apply({"params": params}, context, cache, ids_Nx1, method="step")

  def grow(self, cache, length):
    return cache
