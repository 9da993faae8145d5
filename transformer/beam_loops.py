"""How beam search's loop runs over a batch whose items stop at different steps.

search.beam_search defines a step over B items of K beams each (its body_fn)
and when an item stops (its done_fn); this module holds the items' state
(BeamState) and the two loops that spend fewer rows on items that have stopped:
while_compacting halves the batch as its items finish (config.decode.compact),
and while_refilling hands a stopped item's rows to the next item of a larger
pool (config.decode.refill). The plain loop over the whole batch is
search._while, which greedy search and sampling share. Like search.py, it knows
no model: the cache is a pytree whose leaves have rows b*K + k (0-dim leaves are
shared).
"""
from typing import Any, Tuple

import flax
import jax
import jax.numpy as jnp

from transformer.config import PAD_ID

Array = jax.Array
NEG_INF = -jnp.inf


@flax.struct.dataclass
class BeamState:
  """Beam search over B items of K beams (rows b*K + k of the cache)."""
  t: Array  # int32 scalar: the loop's step.
  start: Array  # int32: the step each item began at, 0 (shared), or int32[B] when refilling.
  done: Array  # bool[B]: the item has stopped; its state is frozen.
  steps: Array  # int32[B]: steps the item was active (the alive beams' length).
  live_logp: Array  # float32[B, K]: log P of the alive beams, best first.
  live_seqs: Array  # int32[B, K, L]
  last: Array  # int32[B, K]: each alive beam's last token.
  fin_score: Array  # float32[B, K]: finished hypotheses, logp / lp(length), best first.
  fin_ok: Array  # bool[B, K]: the finished slot holds a hypothesis.
  fin_seqs: Array  # int32[B, K, L]
  limit: Array  # int32[B]: the item's max_len (emitted tokens, EOS included).
  cache: Any


def fresh_items(B: int, K: int, L: int, bos_id: int, limit_B: Array) -> dict:
  """The per-item fields of BeamState for B items starting their search. Only
  beam 0 is alive at the start, so that the K beams do not duplicate."""
  return dict(
      done=jnp.zeros((B,), bool),
      steps=jnp.zeros((B,), jnp.int32),
      live_logp=jnp.broadcast_to(
          jnp.where(jnp.arange(K) == 0, 0.0, NEG_INF).astype(jnp.float32), (B, K)),
      live_seqs=jnp.full((B, K, L), PAD_ID, jnp.int32),
      last=jnp.full((B, K), bos_id, jnp.int32),
      fin_score=jnp.full((B, K), NEG_INF, jnp.float32),
      fin_ok=jnp.zeros((B, K), bool),
      fin_seqs=jnp.full((B, K, L), PAD_ID, jnp.int32),
      limit=limit_B)


def _select_items(s: BeamState, idx_H: Array, K: int) -> BeamState:
  """The state of items idx_H only (their K cache rows each); 0-dim leaves kept."""
  items = lambda x: x if x.ndim == 0 else x[idx_H]
  rows = lambda x: x if x.ndim == 0 else (
      x.reshape((-1, K) + x.shape[1:])[idx_H].reshape((-1,) + x.shape[1:]))
  return jax.tree.map(items, s.replace(cache=None)).replace(cache=jax.tree.map(rows, s.cache))


def _put_items(s: BeamState, part: BeamState, idx_H: Array, K: int) -> BeamState:
  """`s` with items idx_H replaced by `part` (_select_items' inverse); 0-dim leaves
  (the step, a shared cache counter) come from `part`, which ran on."""
  items = lambda x, y: y if x.ndim == 0 else x.at[idx_H].set(y)
  rows = lambda x, y: y if x.ndim == 0 else (
      x.reshape((-1, K) + x.shape[1:]).at[idx_H].set(y.reshape((-1, K) + y.shape[1:]))
      .reshape(x.shape))
  return jax.tree.map(items, s.replace(cache=None), part.replace(cache=None)).replace(
      cache=jax.tree.map(rows, s.cache, part.cache))


def while_compacting(done_fn, body_fn, state: BeamState, out_len: int, grow,
                      K: int, halvings: int) -> BeamState:
  """search._while for beam search, which also drops finished items from the batch.

  Once at most half of the B items are still searching, the loop goes on over a
  batch of B/2 items (those, plus finished ones to fill it) and writes them back
  when it ends; up to `halvings` times (B/2, B/4, ...), each a further loop in the
  compiled program. A finished item's state is frozen, so the results are those of
  the full-batch loop; the rows it saves are the finished items' (sorted batches
  of similar sources still end unevenly). Shapes are static, so the batch can
  only shrink inside the first cache length (the cache grows at full size).
  """
  first_len = out_len if grow is None else min(grow[0], out_len)
  searching = lambda s: ~done_fn(s)

  def run(s, level):
    B = s.done.shape[0]
    half = (B + 1) // 2
    can_halve = level < halvings and half < B

    def cond(s):
      go = (s.t < first_len) & jnp.any(searching(s))
      return go & (jnp.sum(searching(s)) > half) if can_halve else go

    s = jax.lax.while_loop(cond, body_fn, s)
    if not can_halve:
      return s

    def halve(s):
      s = s.replace(done=done_fn(s))  # What the next step would mark; done is sticky.
      idx_H = jnp.argsort(s.done, stable=True)[:half]  # The searching items first.
      return _put_items(s, run(_select_items(s, idx_H, K), level + 1), idx_H, K)

    return jax.lax.cond((s.t < first_len) & jnp.any(searching(s)), halve, lambda s: s, s)

  s = run(state, 0)
  if first_len >= out_len:
    return s
  s = s.replace(cache=grow[1](s.cache))
  return jax.lax.while_loop(lambda s: (s.t < out_len) & jnp.any(searching(s)), body_fn, s)


@flax.struct.dataclass
class _Pool:
  """A refilling beam search: B slots working through P pool items."""
  beam: BeamState
  item: Array  # int32[B]: the item each slot searches; P once it has none.
  next: Array  # int32 scalar: the next item to start.
  seqs: Array  # int32[P, L]: each item's best hypothesis, once it has stopped.
  scores: Array  # float32[P]


def while_refilling(done_fn, body_fn, results_fn, cache, B: int, K: int, L: int,
                    limit_P: Array, restart_fn, bos_id: int, ring=None) -> Tuple[Array, Array]:
  """Beam search over a pool of P items through B slots: each slot whose item
  stops hands its best hypothesis out and starts the next item, so the loop
  runs about (item-steps / B) steps instead of each batch's longest search
  (sorted batches still end unevenly). An item's steps are its own (BeamState.start)
  and its state is that of a search run alone, so the results are those of
  beam_search over the pool as one batch; results_fn(state) gives each item's
  hypotheses and scores, best first. restart_fn(cache, slot, item) gives
  the slot's K cache rows to `item`, one slot at a time; the slots start empty,
  and the first items are started as every later one is.

  With ring = (short, ring_fn) the cache starts as a ring of `short` steps, which
  holds every item that has searched fewer steps than that; before a step in
  which one has not, ring_fn(cache, L) makes it a ring of L steps, and once every
  item searching is again younger than `short`, ring_fn(cache, short) shrinks it
  (most items end early, and a shorter cache is cheaper to attend over)."""
  P = limit_P.shape[0]

  def retire_and_start(r):
    s = r.beam
    done_B = done_fn(s)  # What the next step would mark.
    seqs_BxKxL, scores_BxK = results_fn(s)
    out_B = jnp.where(done_B & (r.item < P), r.item, P)  # P: not written.
    new_B = r.next + jnp.cumsum(done_B) - 1  # The free slots take the next items in order.
    start_B = done_B & (new_B < P)
    fresh = fresh_items(B, K, L, bos_id, limit_P[jnp.minimum(new_B, P - 1)])
    s = s.replace(start=jnp.where(start_B, s.t, s.start),
                  **{k: where_items(start_B, v, getattr(s, k)) for k, v in fresh.items()})
    s = s.replace(done=done_B & ~start_B)
    item_B = jnp.where(start_B, new_B, jnp.where(done_B, P, r.item))
    slots_B = jnp.nonzero(start_B, size=B, fill_value=0)[0]
    cache = jax.lax.fori_loop(0, jnp.sum(start_B),
                              lambda i, c: restart_fn(c, slots_B[i], item_B[slots_B[i]]), s.cache)
    return r.replace(beam=s.replace(cache=cache), item=item_B,
                     next=r.next + jnp.sum(start_B, dtype=jnp.int32),
                     seqs=r.seqs.at[out_B].set(seqs_BxKxL[:, 0], mode="drop"),
                     scores=r.scores.at[out_B].set(scores_BxK[:, 0], mode="drop"))

  def body(r):  # A step, then the slots whose item stops take the next ones.
    return retire_and_start(r.replace(beam=body_fn(r.beam)))

  def steps_until(r, stop=None):
    return jax.lax.while_loop(
        lambda r: jnp.any(r.item < P) & (True if stop is None else ~stop(r)), body, r)

  empty = BeamState(t=jnp.int32(0), start=jnp.zeros((B,), jnp.int32), cache=cache,
                    **fresh_items(B, K, L, bos_id, jnp.zeros((B,), jnp.int32)))
  r = retire_and_start(_Pool(beam=empty.replace(done=jnp.ones((B,), bool)),
                             item=jnp.full((B,), P, jnp.int32), next=jnp.int32(0),
                             seqs=jnp.full((P, L), PAD_ID, jnp.int32),
                             scores=jnp.full((P,), NEG_INF)))
  if ring is None:
    r = steps_until(r)
    return r.seqs[:, None], r.scores[:, None]
  short, ring_fn = ring

  def outgrows(r):  # The next step would overwrite the first key of an item searching.
    s = r.beam
    return jnp.any(~done_fn(s) & (r.item < P) & (s.t - s.start >= short))

  def on_ring(r, length):
    return r.replace(beam=r.beam.replace(cache=ring_fn(r.beam.cache, length)))

  def long_searches(r):
    return on_ring(steps_until(on_ring(r, L), lambda r: ~outgrows(r)), short)

  r = jax.lax.while_loop(
      lambda r: jnp.any(r.item < P),
      lambda r: jax.lax.cond(outgrows(r), long_searches, lambda r: steps_until(r, outgrows), r),
      r)
  return r.seqs[:, None], r.scores[:, None]


def where_items(mask_B: Array, new, old):
  """Per item b, new[b] where mask_B[b], else old[b] (whatever the trailing dims)."""
  return jnp.where(mask_B.reshape(mask_B.shape + (1,) * (jnp.ndim(new) - 1)), new, old)
