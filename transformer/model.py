"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), in Flax linen.

Shapes: B batch, S source length, T target length, D d_model, V vocabulary.
Token ids are int32 with 0 = padding. Packed rows carry segment ids (1, 2, ...;
0 on padding) and positions that restart at 0 for every packed example.
"""

import dataclasses
import math
from typing import Optional

from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import attention, decode
from transformer.attention import MultiHeadAttention
from transformer.config import ModelConfig
from transformer.dropout import Dropout
from transformer.mixed_precision import Dense, dot_f32, tokens_dot

Array = jax.Array


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
  """[max_len, D]: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...) (3.5)."""
  pos_Lx1 = np.arange(max_len, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)
  angles = pos_Lx1 / np.power(10000.0, two_i / d_model)[None, :]
  table = np.zeros((max_len, d_model), dtype=np.float32)
  table[:, 0::2] = np.sin(angles)
  table[:, 1::2] = np.cos(angles[:, : d_model // 2])
  return table


def shift_right(targets_BxT: Array, bos_id: int, segments_BxT: Optional[Array] = None):
  """Decoder inputs for teacher forcing: BOS, then the targets one step late.

  In packed rows every example starts with its own BOS.
  """
  shifted_BxT = jnp.pad(targets_BxT, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]
  if segments_BxT is not None:
    previous_BxT = jnp.pad(segments_BxT, ((0, 0), (1, 0)))[:, :-1]
    shifted_BxT = jnp.where(segments_BxT != previous_BxT, bos_id, shifted_BxT)
  return shifted_BxT


class Embed(nn.Module):
  """Learned token embeddings, multiplied by sqrt(d_model) (section 3.4)."""

  config: ModelConfig
  vocab_size: int

  def setup(self):
    # Normal(0, D^-0.5): after the sqrt(D) scale the embedded tokens have unit
    # variance, like the positional encodings they are added to.
    self.embedding = self.param(
        "embedding", nn.initializers.normal(stddev=self.config.d_model**-0.5),
        (self.vocab_size, self.config.d_model), jnp.float32)

  def __call__(self, ids):
    x = jnp.take(self.embedding, ids, axis=0) * math.sqrt(self.config.d_model)
    return x.astype(self.config.compute_dtype)

  def attend(self, x_BxTxD):
    """The pre-softmax projection sharing this matrix: logits in float32 (3.4)."""
    return tied_logits(x_BxTxD, self.embedding.astype(self.config.compute_dtype))


@jax.custom_vjp
def tied_logits(x_BxTxD, embedding_VxD):
  """logits_BxTxV = x @ embedding^T in float32, with autodiff's gradient.

  The gradient is written out to choose its products' forms. The embedding's is
  (x^T @ d logits)^T, a weight gradient over the tokens (mixed_precision.tokens_dot):
  from autodiff's form, d logits^T @ x, XLA's CPU layout assignment makes a
  transposed copy of the [B*T, V] logits gradient, the largest tensor of the step.
  In half precision the float32 logits gradient is first rounded to the compute
  dtype, as a bfloat16 layer under mixed precision receives it, so that both
  products run with half-precision inputs (on a CPU, twice as fast as with a
  float32 operand); it is autodiff's gradient of that rounded cotangent
  (benchmarks/README.md, 'Measurements behind the code').
  """
  return dot_f32(x_BxTxD, embedding_VxD, (2,), (1,))


def _tied_logits_fwd(x_BxTxD, embedding_VxD):
  return tied_logits(x_BxTxD, embedding_VxD), (x_BxTxD, embedding_VxD)


def _tied_logits_bwd(residuals, d_logits_BxTxV):
  x_BxTxD, embedding_VxD = residuals
  d_logits_BxTxV = d_logits_BxTxV.astype(x_BxTxD.dtype)
  d_x_BxTxD = dot_f32(d_logits_BxTxV, embedding_VxD, (2,), (0,))
  d_embedding_DxV = tokens_dot(x_BxTxD.reshape(-1, x_BxTxD.shape[-1]),
                               d_logits_BxTxV.reshape(-1, d_logits_BxTxV.shape[-1]))
  return (d_x_BxTxD.astype(x_BxTxD.dtype),
          d_embedding_DxV.T.astype(embedding_VxD.dtype))


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


class PositionalEncoding(nn.Module):
  """Adds position information: sinusoidal (3.5) or learned (Table 3 row E)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, positions_BxT):
    cfg = self.config
    if cfg.positional == "learned":
      table = self.param("embedding", nn.initializers.normal(stddev=0.02),
                         (cfg.max_len, cfg.d_model), jnp.float32)
    else:
      table = jnp.asarray(sinusoidal_table(cfg.max_len, cfg.d_model))
    return x_BxTxD + jnp.take(table, positions_BxT, axis=0).astype(x_BxTxD.dtype)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position (3.3)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.config
    dense = lambda features, name: Dense(features, dtype=cfg.compute_dtype, name=name)
    h_BxTxF = getattr(jax.nn, cfg.activation)(dense(cfg.d_ff, "inner")(x_BxTxD))
    return dense(cfg.d_model, "outer")(h_BxTxF)


def _residual(cfg: ModelConfig, x, sublayer, *, deterministic: bool, name: str):
  """Post-LN: LayerNorm(x + Dropout(Sublayer(x))) (3.1, 5.4); pre-LN: x + Dropout(Sublayer(LayerNorm(x)))."""
  norm = nn.LayerNorm(epsilon=1e-6, dtype=cfg.compute_dtype, name=f"{name}_norm")
  y = sublayer(norm(x) if cfg.norm_position == "pre" else x)
  y = Dropout(cfg.dropout)(y, deterministic=deterministic)
  return x + y if cfg.norm_position == "pre" else norm(x + y)


class EncoderLayer(nn.Module):
  """Self-attention, then feed-forward, each inside a residual block."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxSxD, mask, *, deterministic: bool):
    cfg = self.config
    attend = MultiHeadAttention(cfg, self_attention=True, name="self_attention")
    x_BxSxD = _residual(cfg, x_BxSxD,
                        lambda h: attend(h, h, mask, deterministic=deterministic),
                        deterministic=deterministic, name="self_attention")
    return _residual(cfg, x_BxSxD, FeedForward(cfg, name="feed_forward"),
                     deterministic=deterministic, name="feed_forward")


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, feed-forward (3.1)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, y_BxTxD, encoded_BxSxD, self_mask, cross_mask, *,
               deterministic: bool, decode: bool = False, decode_step=None, lineage=None):
    cfg = self.config
    self_attend = MultiHeadAttention(cfg, self_attention=True, name="self_attention")
    cross_attend = MultiHeadAttention(cfg, self_attention=False, name="cross_attention")
    y_BxTxD = _residual(
        cfg, y_BxTxD,
        lambda h: self_attend(h, h, self_mask, deterministic=deterministic,
                              decode=decode, decode_step=decode_step, lineage=lineage),
        deterministic=deterministic, name="self_attention")
    y_BxTxD = _residual(
        cfg, y_BxTxD,
        lambda h: cross_attend(h, encoded_BxSxD, cross_mask,
                               deterministic=deterministic, decode=decode),
        deterministic=deterministic, name="cross_attention")
    return _residual(cfg, y_BxTxD, FeedForward(cfg, name="feed_forward"),
                     deterministic=deterministic, name="feed_forward")


def _positions(tokens_BxT, positions_BxT, max_len: int):
  """Explicit (packed) positions, or 0..T-1. A position past the table would read
  NaN (jnp.take's fill), which attention spreads over the whole sequence."""
  if positions_BxT is not None:
    return positions_BxT
  if tokens_BxT.shape[1] > max_len:
    raise ValueError(f"a sequence of {tokens_BxT.shape[1]} tokens is longer than "
                     f"config.model.max_len={max_len}, the positions the model has")
  return jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)


class Encoder(nn.Module):
  """Embedding + positions, N encoder layers (and a final LayerNorm when pre-LN)."""

  config: ModelConfig
  embed: nn.Module

  @nn.compact
  def __call__(self, inputs_BxS, inputs_segmentation=None, inputs_position=None, *,
               deterministic: bool):
    cfg = self.config
    x_BxSxD = PositionalEncoding(cfg, name="positional")(
        self.embed(inputs_BxS), _positions(inputs_BxS, inputs_position, cfg.max_len))
    x_BxSxD = Dropout(cfg.dropout)(x_BxSxD, deterministic=deterministic)
    mask = attention.padding_mask(inputs_BxS, cfg.pad_id)
    if inputs_segmentation is not None:
      mask = attention.combine_masks(
          mask, attention.segment_mask(inputs_segmentation, inputs_segmentation))
    for i in range(cfg.num_layers):
      x_BxSxD = EncoderLayer(cfg, name=f"layer_{i}")(x_BxSxD, mask,
                                                     deterministic=deterministic)
    if cfg.norm_position == "pre":
      x_BxSxD = nn.LayerNorm(epsilon=1e-6, dtype=cfg.compute_dtype, name="final_norm")(x_BxSxD)
    return x_BxSxD


class Decoder(nn.Module):
  """Embedding + positions, N decoder layers, then the pre-softmax projection."""

  config: ModelConfig
  embed: nn.Module

  @nn.compact
  def __call__(self, encoded_BxSxD, inputs_BxS, decoder_inputs_BxT,
               inputs_segmentation=None, targets_segmentation=None,
               targets_position=None, *, deterministic: bool, decode: bool = False):
    cfg = self.config
    cross_mask = attention.padding_mask(inputs_BxS, cfg.pad_id)
    self_mask = attention.causal_mask(decoder_inputs_BxT.shape[1])
    if targets_segmentation is not None:
      self_mask = attention.combine_masks(
          self_mask, attention.segment_mask(targets_segmentation, targets_segmentation))
      cross_mask = attention.combine_masks(
          cross_mask, attention.segment_mask(targets_segmentation, inputs_segmentation))
    decode_step = lineage = None
    positions_BxT = _positions(decoder_inputs_BxT, targets_position, cfg.max_len)
    if decode:
      # One shared step counter; it exists once the cache has been created.
      stepping = self.has_variable("cache", "step")
      step = self.variable("cache", "step", lambda: jnp.zeros((), jnp.int32))
      if stepping:
        decode_step = step.value
        step.value = decode_step + 1
        positions_BxT = jnp.full(decoder_inputs_BxT.shape, decode_step)
        self_mask = None  # The cache builds its own: keys at positions <= step.
        if self.has_variable("cache", "lineage"):  # Beam search (TransformerDecoding.beams).
          # Each row's item began at its own step (`restart`): its position is
          # step - start, and its keys and values go round the cache (slot step
          # mod length), which refilling beam search keeps longer than any item
          # searching (TransformerDecoding.ring). A row left with no item runs
          # on past the positions, clipped: its outputs are never read.
          start_N = self.get_variable("cache", "start")
          positions_BxT = jnp.broadcast_to(
              jnp.minimum(decode_step - start_N, cfg.max_len - 1)[:, None],
              decoder_inputs_BxT.shape)
          var = self.variable("cache", "lineage")
          N, J, length = var.value.shape
          decode_step = decode_step % length
          # Each row writes this step's keys and values into its own slot.
          own_NxJx1 = ((jnp.arange(N) % J)[:, None] == jnp.arange(J)[None, :])[:, :, None]
          var.value = jax.lax.dynamic_update_slice(var.value, own_NxJx1, (0, 0, decode_step))
          lineage = var.value

    y_BxTxD = PositionalEncoding(cfg, name="positional")(
        self.embed(decoder_inputs_BxT), positions_BxT)
    y_BxTxD = Dropout(cfg.dropout)(y_BxTxD, deterministic=deterministic)
    for i in range(cfg.num_layers):
      y_BxTxD = DecoderLayer(cfg, name=f"layer_{i}")(
          y_BxTxD, encoded_BxSxD, self_mask, cross_mask, deterministic=deterministic,
          decode=decode, decode_step=decode_step, lineage=lineage)
    if cfg.norm_position == "pre":
      y_BxTxD = nn.LayerNorm(epsilon=1e-6, dtype=cfg.compute_dtype, name="final_norm")(y_BxTxD)
    if cfg.tie_output:
      return self.embed.attend(y_BxTxD)
    return untied_logits(cfg, "logits")(y_BxTxD)


def untied_logits(cfg: ModelConfig, name: Optional[str] = None) -> Dense:
  """The pre-softmax projection with its own matrix: float32 logits, accumulated
  in float32 as the tied one's are (nn.Dense's initialisation, so its parameters
  and their initial values are nn.Dense's)."""
  return Dense(cfg.output_vocab_size, use_bias=False, dtype=cfg.compute_dtype,
               kernel_init=nn.initializers.lecun_normal(), out_dtype=jnp.float32, name=name)


def embeddings(cfg: ModelConfig):
  """(source, target) Embed modules, one shared matrix when cfg.share_embeddings
  (3.4). Called from a model's setup, which they then belong to."""
  if cfg.share_embeddings:
    shared = Embed(cfg, cfg.input_vocab_size, name="shared_embedding")
    return shared, shared
  return (Embed(cfg, cfg.input_vocab_size, name="source_embedding"),
          Embed(cfg, cfg.output_vocab_size, name="target_embedding"))


class Transformer(nn.Module):
  """Encoder-decoder Transformer with separate `encode` and `decode` entry points."""

  config: ModelConfig

  def setup(self):
    source_embed, target_embed = embeddings(self.config)
    self.encoder = Encoder(self.config, source_embed)
    self.decoder = Decoder(self.config, target_embed)

  def encode(self, inputs_BxS, inputs_segmentation=None, inputs_position=None, *,
             deterministic: bool = True):
    """[B, S] source ids -> [B, S, D] encoder output."""
    return self.encoder(inputs_BxS, inputs_segmentation, inputs_position,
                        deterministic=deterministic)

  def decode(self, encoded_BxSxD, inputs_BxS, decoder_inputs_BxT,
             inputs_segmentation=None, targets_segmentation=None, targets_position=None,
             *, deterministic: bool = True, decode: bool = False):
    """Decoder inputs (BOS-shifted targets) and encoder output -> [B, T, V] float32 logits.

    With `decode=True` and a 'cache' collection, `decoder_inputs_BxT` is one step
    ([B, 1]). Called with `decode=True`, no cache and mutable=['cache'], it creates
    a cache for T steps (see transformer.decode).
    """
    return self.decoder(encoded_BxSxD, inputs_BxS, decoder_inputs_BxT,
                        inputs_segmentation, targets_segmentation, targets_position,
                        deterministic=deterministic, decode=decode)

  def __call__(self, inputs_BxS, targets_BxT, inputs_segmentation=None,
               targets_segmentation=None, inputs_position=None, targets_position=None,
               *, deterministic: bool = True):
    """Teacher-forced forward pass: [B, T, V] float32 logits predicting `targets`."""
    encoded_BxSxD = self.encode(inputs_BxS, inputs_segmentation, inputs_position,
                                deterministic=deterministic)
    decoder_inputs_BxT = shift_right(targets_BxT, self.config.bos_id, targets_segmentation)
    return self.decode(encoded_BxSxD, inputs_BxS, decoder_inputs_BxT,
                       inputs_segmentation, targets_segmentation, targets_position,
                       deterministic=deterministic)


class ModuleDecoding(decode.DecodingModel):
  """What every Flax model's decoding contract shares: the special ids and length
  from its ModelConfig, and its `encode` method. Subclasses are frozen
  dataclasses with a `model` field."""

  pad_id = property(lambda self: self.model.config.pad_id)
  bos_id = property(lambda self: self.model.config.bos_id)
  eos_id = property(lambda self: self.model.config.eos_id)
  max_len = property(lambda self: self.model.config.max_len)

  def encode(self, params, inputs_BxS):
    return self.model.apply({"params": params}, inputs_BxS, method="encode")


@dataclasses.dataclass(frozen=True)
class TransformerDecoding(ModuleDecoding):
  """The decoding contract (transformer.decode.DecodingModel) for a Transformer.

  Context: the encoder output, the source ids (the cross-attention mask) and
  every decoder layer's cross-attention keys/values. Cache: every decoder layer's
  self-attention keys/values, [N, H, steps, K] (attention.py), and the decoder's
  shared step counter; in beam search also the beams' lineage (`beams`), so that
  keys and values stay where they were written, and in float32 the keys as
  [N, H, K, steps] (attention.beam_keys_transposed). track_beams=False reorders the
  keys and values themselves instead, as the RNN's cache is: the reference that
  the lineage is tested against (tests/test_decode.py). The lineage also lets a
  refilling beam search restart rows (`restart`, `ring`).
  """
  model: Transformer
  track_beams: bool = True

  def init_state(self, params, encoded_BxSxD, inputs_BxS, cache_len):
    # `decode` in decode mode without a cache, on dummy [B, cache_len] inputs,
    # creates zero self-attention caches of that length and the encoder's
    # cross-attention keys/values (under jit the unused dummy logits are removed).
    dummy_BxL = jnp.zeros((inputs_BxS.shape[0], cache_len), jnp.int32)
    _, variables = self.model.apply({"params": params}, encoded_BxSxD, inputs_BxS,
                                    dummy_BxL, decode=True, mutable=["cache"],
                                    method="decode")
    cross, cache = _split_cross_attention(variables["cache"])
    return (encoded_BxSxD, inputs_BxS, cross), cache

  def step(self, params, context, cache, ids_Nx1):
    encoded_NxSxD, inputs_NxS, cross = context
    full = traverse_util.unflatten_dict({**traverse_util.flatten_dict(cache),
                                         **traverse_util.flatten_dict(cross)})
    logits_Nx1xV, variables = self.model.apply(
        {"params": params, "cache": full}, encoded_NxSxD, inputs_NxS, ids_Nx1,
        decode=True, mutable=["cache"], method="decode")
    return logits_Nx1xV[:, 0], _split_cross_attention(variables["cache"])[1]

  def grow(self, cache, length):
    flat = traverse_util.flatten_dict(cache)
    beams = ("decoder", "lineage") in flat

    def grow(path, x):  # Steps on axis 2, or 3 for keys transposed (`beams`).
      if path[-1] not in ("cached_key", "cached_value", "lineage"):
        return x
      axis = 3 if path[-1] == "cached_key" and beams and _transposed(x) else 2
      return jnp.pad(x, [(0, length - x.shape[axis]) if a == axis else (0, 0)
                         for a in range(x.ndim)])
    return traverse_util.unflatten_dict({k: grow(k, v) for k, v in flat.items()})

  def beams(self, cache, beam_size):
    """Adds the decoder's lineage, [N, J, steps] bool over J beams (attention.beam_attention):
    beam search then reorders it instead of the keys and values. The keys and
    values are then held in the compute dtype (where attention.self_cache_dtype
    made them float32, bfloat16 beam search is faster with them 16-bit), the
    keys as [N, H, K, steps] where attention.beam_keys_transposed says so. With
    the lineage comes each row's first step, so that rows can restart (`restart`)."""
    if beam_size == 1 or not self.track_beams:
      return cache
    flat = traverse_util.flatten_dict(cache)
    N, _, steps, _ = next(v.shape for k, v in flat.items() if k[-1] == "cached_key")

    def held(path, x):
      if path[-1] not in ("cached_key", "cached_value"):
        return x
      x = x.astype(self.model.config.compute_dtype)
      return jnp.swapaxes(x, 2, 3) if path[-1] == "cached_key" and _transposed(x) else x
    flat = {k: held(k, v) for k, v in flat.items()}
    flat[("decoder", "lineage")] = jnp.zeros((N, beam_size, steps), jnp.bool_)
    flat[("decoder", "start")] = jnp.zeros((N,), jnp.int32)  # The step each row's item began.
    return traverse_util.unflatten_dict(flat)

  def ring(self, cache, length):
    """Refilling beam search: the self-attention keys, values and lineage as a
    ring of `length` steps (`Decoder`: step t in slot t mod length) that holds
    the last min(length, its length now) steps; slots of older steps are empty."""
    flat = traverse_util.flatten_dict(cache)
    t = flat[("decoder", "step")]  # The next step; t - 1 was the last written.

    def recut(path, x):
      if path[-1] not in ("cached_key", "cached_value", "lineage"):
        return x
      axis = 3 if path[-1] == "cached_key" and _transposed(x) else 2
      written = t - 1 - (t - 1 - jnp.arange(length)) % length  # The step each new slot holds.
      kept = written >= jnp.maximum(t - x.shape[axis], 0)  # Still in the old ring.
      y = jnp.take(x, written % x.shape[axis], axis=axis)
      return jnp.where(kept.reshape([length if a == axis else 1 for a in range(x.ndim)]),
                       y, jnp.zeros((), x.dtype))
    return traverse_util.unflatten_dict({k: recut(k, v) for k, v in flat.items()})

  def restart(self, context, cache, pool, slot, item, beam_size):
    """Refilling beam search: the beam_size rows of `slot` take pool item
    `item`'s context and start its search at the current step. Their lineage is
    emptied, so the keys and values the slot's previous item left are no one's
    ancestors, and the ring of keys (`Decoder`) overwrites them."""
    flat = traverse_util.flatten_dict(cache)
    if ("decoder", "lineage") not in flat:
      raise NotImplementedError("refilling beam search needs the beams' lineage "
                                "(track_beams=True, beam_size > 1)")
    row = slot * beam_size

    def put(x, value_1x):
      value = jnp.broadcast_to(value_1x, (beam_size,) + x.shape[1:]).astype(x.dtype)
      return jax.lax.dynamic_update_slice(x, value, (row,) + (0,) * (x.ndim - 1))

    context = jax.tree.map(
        lambda x, p: x if x.ndim == 0 else put(x, jax.lax.dynamic_slice_in_dim(p, item, 1)),
        context, pool)
    flat[("decoder", "lineage")] = put(flat[("decoder", "lineage")], jnp.zeros((1,), bool))
    flat[("decoder", "start")] = put(flat[("decoder", "start")], flat[("decoder", "step")])
    return context, traverse_util.unflatten_dict(flat)

  def reorder(self, cache, parent_BxJ):
    flat = traverse_util.flatten_dict(cache)
    if ("decoder", "lineage") not in flat:
      return decode.gather_beams(cache, parent_BxJ)
    # The keys and values stay in their slots; the lineage says whose they are.
    moved = {k: v for k, v in flat.items() if k[-1] not in ("cached_key", "cached_value")}
    return traverse_util.unflatten_dict({**flat, **decode.gather_beams(moved, parent_BxJ)})


def _transposed(key):
  """Whether beam search keeps this self-attention key cache transposed."""
  return attention.beam_keys_transposed(key.dtype)


def _split_cross_attention(cache):
  """(cross-attention keys/values, the rest) of a decoder's 'cache' collection."""
  flat = traverse_util.flatten_dict(cache)
  cross = {k: v for k, v in flat.items() if "cross_attention" in k}
  rest = {k: v for k, v in flat.items() if "cross_attention" not in k}
  return traverse_util.unflatten_dict(cross), traverse_util.unflatten_dict(rest)
