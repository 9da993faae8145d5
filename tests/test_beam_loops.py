"""Tests for transformer/beam_loops.py through search.beam_search: beam search
that compacts its batch, or refills its rows from a pool, returns what one batch
returns, in fewer rows or steps (toy step functions; the Transformer's side is
tests/test_decode.py)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from tests.test_search import BOS, EOS, H, PAD, V, check_well_formed, toy_cache
from transformer import search


def eos_table(seed, L):
  """(the RandomState, a [L, H, V] logits table for a toy step function) whose EOS
  logits are shifted by a random amount, so that items stop at various steps."""
  r = np.random.RandomState(seed)
  table_TxHxV = (2.0 * r.randn(L, H, V)).astype(np.float32)
  table_TxHxV[..., PAD] = -np.inf
  table_TxHxV[..., EOS] += r.uniform(-1.0, 2.0)
  return r, jnp.asarray(table_TxHxV)


def test_compacting_beam_search_equals_the_full_batch_and_runs_fewer_rows():
  """compact=n halves the batch (up to n times) once half of its items have
  stopped, and writes them back at the end: item for item the results are the
  full batch's, with per-row limits, both stopping rules and a cache that grows
  (the batch shrinks only before it grows); fewer rows pass through logits_fn."""
  B, L, first_len = 24, 7, 4
  rows_run = []

  def toy_logits_fn(table):
    def logits_fn(ids_Nx1, cache, step):
      jax.debug.callback(rows_run.append, ids_Nx1.shape[0])
      h_Nx1 = (cache['h'] * 7 + ids_Nx1 + 1) % H
      return table[cache['i'], h_Nx1[:, 0]], {'h': h_Nx1, 'i': cache['i'] + 1}
    return logits_fn

  @functools.partial(jax.jit, static_argnames=('K', 'best_only', 'compact'))
  def run(table, max_len_B, K, best_only, compact):
    return search.beam_search(toy_logits_fn(table), toy_cache(B, K), batch_size=B,
                              beam_size=K, alpha=0.6, max_len=max_len_B, out_len=L,
                              bos_id=BOS, eos_id=EOS, best_only=best_only,
                              grow=(first_len, lambda cache: cache), compact=compact)

  for seed in range(2):
    r, table = eos_table(200 + seed, L)
    max_len_B = jnp.asarray(r.randint(1, L + 1, size=B), jnp.int32)
    for K, best_only, compacts in ((2, True, (0, 1, 3)), (3, False, (0, 3))):
      rows = []
      for compact in compacts:
        rows_run.clear()
        ids_BxKxL, scores_BxK = jax.block_until_ready(
            run(table, max_len_B, K=K, best_only=best_only, compact=compact))
        jax.effects_barrier()  # Every step's callback has run.
        rows.append(int(sum(rows_run)))
        if compact == 0:
          want_ids, want_scores = ids_BxKxL, scores_BxK
          continue
        np.testing.assert_array_equal(ids_BxKxL, want_ids)
        np.testing.assert_allclose(scores_BxK, want_scores, rtol=1e-6)
      assert rows == sorted(rows, reverse=True)
      if best_only:  # These items stop unevenly: each halving saves rows.
        assert rows[0] > rows[1] > rows[2], rows


def test_refilling_beam_search_equals_the_pool_as_one_batch_in_fewer_steps():
  """With refill, B slots work through a pool of P items, each slot starting the
  next item as soon as its own stops: item for item the best hypotheses and
  scores are those of beam search over the pool as one batch (per-item steps
  and limits, EOS and the early stop, and slots left empty at the end), and the
  loop runs about the pool's item-steps / B steps, far fewer than the slots'
  batches run one after the other."""
  L = 7
  steps_run = []

  def logits_fn(table):
    def fn(ids_Nx1, cache, step):  # Each row counts its own steps ('i').
      jax.debug.callback(lambda: steps_run.append(1))
      h_Nx1 = (cache['h'] * 7 + ids_Nx1 + 1) % H
      return table[cache['i'], h_Nx1[:, 0]], {'h': h_Nx1, 'i': cache['i'] + 1}
    return fn

  def cache(items, K):
    return {'h': jnp.repeat(jnp.asarray(items, jnp.int32)[:, None], K, axis=0),
            'i': jnp.zeros((len(items) * K,), jnp.int32)}

  @functools.partial(jax.jit, static_argnames=('B', 'K', 'refill'))
  def run(table, max_len_P, B, K, refill):
    kw = dict(beam_size=K, alpha=0.6, max_len=max_len_P, out_len=L, bos_id=BOS,
              eos_id=EOS, best_only=True)
    if not refill:
      return search.beam_search(logits_fn(table), cache(range(B), K), batch_size=B, **kw)

    def restart(c, slot, item):  # The slot's K rows: the item's start hash, step 0.
      rows = lambda x, v: jax.lax.dynamic_update_slice(x, jnp.full((K,) + x.shape[1:], v, x.dtype),
                                                      (slot * K,) + (0,) * (x.ndim - 1))
      return {'h': rows(c['h'], item), 'i': rows(c['i'], 0)}
    return search.beam_search(logits_fn(table), cache(range(B), K), batch_size=B,
                              refill=restart, **kw)

  for seed in range(2):
    r, table = eos_table(300 + seed, L)
    P = 30
    max_len_P = r.randint(0, L + 1, size=P)  # 0: a padding row, which emits nothing.
    for K in (2, 3):
      want_ids, want_scores = run(table, jnp.asarray(max_len_P, jnp.int32), B=P, K=K,
                                  refill=False)
      for B in (1, 4, 7):
        steps_run.clear()
        ids, scores = jax.block_until_ready(
            run(table, jnp.asarray(max_len_P, jnp.int32), B=B, K=K, refill=True))
        jax.effects_barrier()
        np.testing.assert_array_equal(ids[:, 0], want_ids[:, 0])
        np.testing.assert_array_equal(scores[:, 0], want_scores[:, 0])
        # Each item searches at most max_len steps: the slots are rarely idle.
        item_steps = int(max_len_P.sum())
        assert len(steps_run) <= item_steps // B + 2 * L, (B, len(steps_run))
        if B == 1:  # One slot: one step per item-step, at most.
          assert len(steps_run) <= item_steps
      for row in np.asarray(ids[:, 0]):
        check_well_formed(row)
