"""Decoding a model: the contract a model implements to be decoded (DecodingModel)
and `encode_and_decode`, which runs a search of transformer/search.py over it and
knows nothing else of the model. transformer.model.TransformerDecoding implements
the contract for the Transformer, transformer.rnn.RNNDecoding for the RNN.
"""
import functools
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from transformer.config import DECODE_MODES
from transformer.search import beam_search, gather_beams, greedy_search, sample  # pylint: disable=g-multiple-import

Array = jax.Array


def check_settings(mode, beam_size=4, alpha=0.6, max_extra_len=50, compact=0,
                   temperature=1.0, top_k=0, refill=0):
  """A ValueError naming the first search setting out of range. Values that are
  traced (alpha, temperature under jit) are not checked."""
  number = lambda x: isinstance(x, (int, float))
  if mode not in DECODE_MODES:
    raise ValueError(f"mode must be one of {DECODE_MODES}, got {mode!r}")
  for name, value, low in (("beam_size", beam_size, 1), ("max_extra_len", max_extra_len, 0),
                           ("compact", compact, 0), ("top_k", top_k, 0), ("refill", refill, 0)):
    if int(value) < low:
      raise ValueError(f"{name} must be >= {low}, got {value}")
  for name, value in (("beam_size", beam_size), ("top_k", top_k), ("refill", refill)):
    if int(value) >= 2**31:  # Array sizes: an OverflowError's traceback, deep in the model.
      raise ValueError(f"{name} must be < 2^31, got {value}")
  if int(compact) and int(refill):
    raise ValueError(f"compact ({compact}) and refill ({refill}) are two ways to spend "
                     "fewer steps on finished sentences; set one of them to 0")
  if number(alpha) and not 0 <= alpha < float("inf"):
    raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
  if number(temperature) and not 0 <= temperature < float("inf"):
    raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), "
                     f"got {temperature}")


def restarts_rows(model) -> bool:
  """Whether a DecodingModel (or its class) implements `restart` (and `ring`),
  which refilling beam search needs: the Transformer's does, the RNN's not."""
  cls = model if isinstance(model, type) else type(model)
  return cls.restart is not DecodingModel.restart


def check_refill(model, refill) -> None:
  """A ValueError where `refill` is on and `model` (a DecodingModel or its class)
  cannot restart rows. Callers check the value they were given: encode_and_decode
  gets the items searched at once, inference.decode_ids the batch multiple."""
  if refill and not restarts_rows(model):
    name = (model if isinstance(model, type) else type(model)).__name__
    raise ValueError(f"refill={refill}: {name} cannot restart decoding rows (refilling "
                     "beam search needs a Transformer); set it to 0")


class DecodingModel:
  """What decoding needs from a model; transformer.model.TransformerDecoding is one.

  Decoding runs `encode` once per batch, then `init_state` for `cache_len` steps,
  which splits the decoding state in two: the *context*, which every step reads
  and none changes (the encoder's output, the cross-attention keys/values), and
  the *cache*, which each step updates (self-attention keys/values, a recurrent
  state). Beam search repeats both for the beams of an item (batch-major rows
  b*K + k), lets the model add to the cache what it tracks of the beams
  (`beams`), and reorders only the cache; a refilling beam search also restarts
  rows (`restart`) on a cache that is a ring (`ring`), which are optional.
  Implementations are hashable (they are static under jit): frozen dataclasses
  of a Flax module do.
  """
  pad_id: int
  bos_id: int
  eos_id: int
  max_len: int  # Longest output the model can produce (decoder positions).

  def encode(self, params, inputs_BxS: Array) -> Any:
    """The sources' encoding, computed once per batch."""
    raise NotImplementedError

  def init_state(self, params, encoded: Any, inputs_BxS: Array,
                 cache_len: int) -> Tuple[Any, Any]:
    """(context, cache) for B rows, the cache holding `cache_len` steps."""
    raise NotImplementedError

  def step(self, params, context: Any, cache: Any, ids_Nx1: Array) -> Tuple[Array, Any]:
    """The next token's logits for each row given its last token -> (logits_NxV, cache)."""
    raise NotImplementedError

  def grow(self, cache: Any, length: int) -> Any:
    """The cache extended to hold `length` steps (a no-op where it has no length)."""
    raise NotImplementedError

  def beams(self, cache: Any, beam_size: int) -> Any:
    """The cache for beam search, its rows already repeated for the beams; a model
    that keeps track of its beams itself adds what it needs here (and reorders
    that in `reorder`)."""
    del beam_size
    return cache

  def reorder(self, cache: Any, parent_BxK: Array) -> Any:
    """Beam search: row b*K + k of the new cache is row b*K + parent[b, k] of the old."""
    return gather_beams(cache, parent_BxK)

  def restart(self, context: Any, cache: Any, pool: Any, slot: Array, item: Array,
              beam_size: int) -> Tuple[Any, Any]:
    """Refilling beam search (`refill`): rows slot*beam_size.. of (context, cache),
    whose item has stopped, start the search of item `item` of the pool, whose
    context `pool` holds (one row an item). Optional."""
    raise NotImplementedError(f"{type(self).__name__} cannot refill beam search rows")

  def ring(self, cache: Any, length: int) -> Any:
    """Refilling beam search: the cache, whose steps go round it (step t in slot
    t mod its length), as a ring of `length` steps holding the last ones.
    Optional, with `restart`."""
    raise NotImplementedError(f"{type(self).__name__} cannot refill beam search rows")


def first_cache_len(source_len: int) -> int:
  """Steps the decoding cache holds before it grows to its full length.

  Outputs are about as long as their sources, so most batches end well inside
  S + S/4 steps and never pay for attending over (and reordering) the full
  S + max_extra_len cache; the policy was chosen by measurement
  (benchmarks/README.md, 'Measurements behind the code').
  """
  return source_len + max(8, source_len // 4)


def encode_and_decode(model: DecodingModel, params, inputs_BxS: Array, *,
                      mode: str = 'greedy', beam_size: int = 4, alpha: float = 0.6,
                      max_extra_len: int = 50, rng: Optional[Array] = None,
                      temperature: float = 1.0, top_k: int = 0,
                      eos_id: Optional[int] = None, compact: int = 0,
                      refill: int = 0) -> Array:
  """Source ids (PAD on the right) -> output ids_BxL, L = min(S + max_extra_len,
  model.max_len); best beam in 'beam' mode. `model` is a DecodingModel.

  Row b emits at most min(len_b + max_extra_len, model.max_len) tokens (EOS
  included), len_b = its non-PAD source tokens (sec. 6.1); an all-PAD row
  (batch padding) emits none. The encoder runs once; beams share it by
  repetition. Jittable with model, mode, beam_size, max_extra_len, top_k (and
  temperature if 0) static; L, hence the compiled program, depends on the source
  width S. `eos_id` defaults to the model's. `compact` (beam mode, static): how
  many times beam search may halve its batch as items finish (search.beam_search).
  `refill` = n with 0 < n < B (beam mode with beam_size > 1, static): the B
  sources are searched n at a time, each of the n items' rows taking the next
  source as soon as its own stops (beam_loops.while_refilling; the model's
  `restart`); otherwise all B at once. Either way the outputs are those of the
  whole batch searched at once.
  """
  check_settings(mode, beam_size, alpha, max_extra_len, compact, temperature, top_k, refill)
  if mode == 'sample' and rng is None:
    raise ValueError("mode='sample' needs rng")
  B, S = inputs_BxS.shape
  # No output is longer than model.max_len: more changes nothing, and near 2^31 the
  # int32 sum below wrapped around, every output empty.
  max_extra_len = min(int(max_extra_len), model.max_len)
  L = min(S + max_extra_len, model.max_len)  # Decoder positions must exist.
  src_len_B = jnp.sum(inputs_BxS != model.pad_id, axis=1)
  # An all-PAD row pads the batch: it emits nothing rather than keep the loop
  # running for max_extra_len steps of output no one reads.
  max_len_B = jnp.where(src_len_B > 0, jnp.minimum(src_len_B + max_extra_len, L), 0)
  K = beam_size if mode == 'beam' else 1
  # The lineage tracks the beams of each row's item.
  refill = refill if K > 1 and refill < B else 0
  check_refill(model, refill)
  first_len = min(L, first_cache_len(S))
  pool, cache = model.init_state(params, model.encode(params, inputs_BxS), inputs_BxS,
                                 first_len)
  slots = refill or B
  # Computed once per item, then repeated for the beams (batch-major: row b*K + k);
  # a refilling search starts with the pool's first `slots` items.
  repeat = lambda tree: jax.tree.map(
      lambda x: x if x.ndim == 0 else jnp.repeat(x[:slots], K, axis=0), tree)
  context, cache = repeat(pool), repeat(cache)
  if mode == 'beam':
    cache = model.beams(cache, K)

  def logits_fn(ids_Nx1, cache, step):
    del step  # The model keeps its own step, if it needs one, in the cache.
    return model.step(params, context, cache, ids_Nx1)

  kw = dict(batch_size=B, max_len=max_len_B.astype(jnp.int32), out_len=L,
            bos_id=model.bos_id, eos_id=model.eos_id if eos_id is None else eos_id,
            grow=(first_len, functools.partial(model.grow, length=L)))
  if mode == 'greedy':
    return greedy_search(logits_fn, cache, **kw)
  if mode == 'sample':
    return sample(logits_fn, cache, rng, temperature=temperature, top_k=top_k, **kw)
  if not compact and not refill:
    return beam_search(logits_fn, cache, beam_size=K, alpha=alpha, best_only=True,
                       reorder_fn=model.reorder, **kw)[0][:, 0]
  # Compacting drops finished items' rows and refilling replaces them, so the
  # context travels with the cache instead of being closed over.
  def step_both(ids_Nx1, both, step):
    del step
    logits_NxV, new_cache = model.step(params, both[0], both[1], ids_Nx1)
    return logits_NxV, (both[0], new_cache)

  kw['grow'] = (first_len, lambda both: (both[0], model.grow(both[1], length=L)))
  if refill:  # The rows' keys go round a ring of first_len steps, or of L while needed.
    kw.update(batch_size=slots, grow=None,
              ring=(first_len, lambda both, length: (both[0], model.ring(both[1], length))),
              refill=lambda both, slot, item: model.restart(*both, pool, slot, item, K))
  return beam_search(step_both, (context, cache), beam_size=K, alpha=alpha, best_only=True,
                     reorder_fn=lambda both, parent: (both[0], model.reorder(both[1], parent)),
                     compact=compact, **kw)[0][:, 0]
