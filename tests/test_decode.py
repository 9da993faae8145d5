"""Tests for transformer/decode.py: searches on toy step functions."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import decode

V, H, T_MAX = 5, 97, 8          # toy vocab, hash buckets, max steps
PAD, EOS, BOS = 0, 1, 2


def make_toy(seed, eos_rows=None):
  """A toy step function: next-token logits from a random table indexed by the
  step and a hash of the whole history fed so far. The hash lives in the cache
  (leading dim N), so a wrong beam gather changes the results; the 0-dim step
  counter 'i' is shared and would fail if gathered."""
  r = np.random.RandomState(seed)
  table_TxHxV = (2.0 * r.randn(T_MAX, H, V)).astype(np.float32)
  table_TxHxV[..., PAD] = -np.inf   # the toy never emits PAD
  if eos_rows is not None:       # EOS only at the given steps, then as argmax
    table_TxHxV[..., EOS] = -np.inf
    for t in eos_rows:
      table_TxHxV[t, :, EOS] = table_TxHxV[t].max(-1) + 5.0
  table = jnp.asarray(table_TxHxV)

  def logits_fn(ids_Nx1, cache, step):
    h_Nx1 = (cache['h'] * 7 + ids_Nx1 + 1) % H
    logits_NxV = table[cache['i'], h_Nx1[:, 0]]
    return logits_NxV, {'h': h_Nx1, 'i': cache['i'] + 1}

  def np_logp(item, seq):
    """log P(seq) for batch item `item` (its start hash is the item index)."""
    h, prev, total = item, BOS, 0.0
    for t, tok in enumerate(seq):
      h = (h * 7 + prev + 1) % H
      row = table_TxHxV[t, h].astype(np.float64)
      total += row[tok] - (row.max() + np.log(np.exp(row - row.max()).sum()))
      prev = tok
    return total

  return logits_fn, np_logp


def toy_cache(batch_size, beam_size=1):
  h_Bx1 = jnp.arange(batch_size, dtype=jnp.int32)[:, None]
  return {'h': jnp.repeat(h_Bx1, beam_size, axis=0), 'i': jnp.int32(0)}


def lp(n, alpha):
  return ((5.0 + n) / 6.0) ** alpha


def strip(seq):
  """Tokens up to and including the first EOS (or all non-PAD)."""
  seq = list(np.asarray(seq))
  return seq[:seq.index(EOS) + 1] if EOS in seq else [t for t in seq if t != PAD]


def enumerate_scores(np_logp, item, max_len, alpha):
  """All finished sequences (n-1 non-EOS tokens then EOS, n <= max_len), best first."""
  out = []
  for n in range(1, max_len + 1):
    for prefix in itertools.product(range(2, V), repeat=n - 1):
      seq = list(prefix) + [EOS]
      out.append((np_logp(item, seq) / lp(n, alpha), seq))
  return sorted(out, key=lambda x: -x[0])


def check_well_formed(ids_L):
  ids_L = np.asarray(ids_L)
  if EOS in ids_L:
    e = list(ids_L).index(EOS)
    assert np.all(ids_L[:e] != PAD) and np.all(ids_L[e + 1:] == PAD)


def test_greedy_stops_and_pads():
  logits_fn, np_logp = make_toy(0, eos_rows=[2])
  ids_BxL = decode.greedy_search(logits_fn, toy_cache(3), batch_size=3,
                                 max_len=6, bos_id=BOS, eos_id=EOS)
  assert ids_BxL.shape == (3, 6)
  for row in np.asarray(ids_BxL):
    assert row[2] == EOS and np.all(row[3:] == PAD) and np.all(row[:2] > EOS)


def test_greedy_per_row_max_len_and_batch_independence():
  logits_fn, _ = make_toy(1)
  max_len_B = np.array([2, 5, 3], np.int32)
  ids_BxL = decode.greedy_search(logits_fn, toy_cache(3), batch_size=3,
                                 max_len=max_len_B, bos_id=BOS, eos_id=EOS)
  assert ids_BxL.shape == (3, 5)
  full_BxL = decode.greedy_search(logits_fn, toy_cache(3), batch_size=3,
                                  max_len=5, bos_id=BOS, eos_id=EOS)
  for b, m in enumerate(max_len_B):
    assert np.all(np.asarray(ids_BxL[b, m:]) == PAD)
    np.testing.assert_array_equal(ids_BxL[b, :m], full_BxL[b, :m])
    check_well_formed(ids_BxL[b])


def test_sample_low_temperature_and_top1_equal_greedy():
  logits_fn, _ = make_toy(2)
  kw = dict(batch_size=4, max_len=6, bos_id=BOS, eos_id=EOS)
  greedy = decode.greedy_search(logits_fn, toy_cache(4), **kw)
  rng = jax.random.key(0)
  for temperature, top_k in [(1e-5, 0), (1.0, 1), (0.0, 0)]:
    got = decode.sample(logits_fn, toy_cache(4), rng, temperature=temperature,
                        top_k=top_k, **kw)
    np.testing.assert_array_equal(got, greedy)


def test_sample_distribution_and_top_k():
  logits_V = jnp.array([-1e9, 0.5, 1.0, 0.0, -0.5], jnp.float32)

  def logits_fn(ids_Nx1, cache, step):
    return jnp.broadcast_to(logits_V, (ids_Nx1.shape[0], V)), cache

  n = 4000
  kw = dict(batch_size=n, max_len=1, bos_id=BOS, eos_id=EOS)
  ids = np.asarray(decode.sample(logits_fn, {}, jax.random.key(1), temperature=2.0, **kw))
  freq_V = np.bincount(ids[:, 0], minlength=V) / n
  np.testing.assert_allclose(freq_V, jax.nn.softmax(logits_V / 2.0), atol=0.03)
  ids = np.asarray(decode.sample(logits_fn, {}, jax.random.key(1), top_k=2, **kw))
  assert set(np.unique(ids)) == {1, 2}


@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.5])
def test_beam_matches_exhaustive_search(alpha):
  """With 2K >= all candidates ever, nothing is pruned: the K best finished
  hypotheses of each item must be exactly the enumerated top K."""
  logits_fn, np_logp = make_toy(3)
  B, K = 2, 64
  max_len_B = np.array([4, 2], np.int32)   # per-row limits
  ids_BxKxL, scores_BxK = decode.beam_search(
      logits_fn, toy_cache(B, K), batch_size=B, beam_size=K, alpha=alpha,
      max_len=max_len_B, bos_id=BOS, eos_id=EOS)
  assert ids_BxKxL.shape == (B, K, 4)
  for b in range(B):
    ref = enumerate_scores(np_logp, b, int(max_len_B[b]), alpha)
    n = min(K, len(ref))
    np.testing.assert_allclose(scores_BxK[b, :n], [s for s, _ in ref[:n]], rtol=1e-5)
    assert strip(ids_BxKxL[b, 0]) == ref[0][1]
    for k in range(n):
      seq = strip(ids_BxKxL[b, k])
      assert seq[-1] == EOS and len(seq) <= max_len_B[b]
      check_well_formed(ids_BxKxL[b, k])
      np.testing.assert_allclose(np_logp(b, seq) / lp(len(seq), alpha),
                                 scores_BxK[b, k], rtol=1e-5)


def test_beam_size_one_equals_greedy_when_eos_only_as_argmax():
  """Beam 1 keeps the best EOS hypothesis seen so far as 'finished' while its one
  alive beam follows the best non-EOS token, so it equals greedy exactly when EOS
  can only appear as the argmax (here: only at step 3)."""
  logits_fn, _ = make_toy(4, eos_rows=[3])
  kw = dict(batch_size=3, max_len=7, bos_id=BOS, eos_id=EOS)
  greedy = decode.greedy_search(logits_fn, toy_cache(3), **kw)
  ids_BxKxL, _ = decode.beam_search(logits_fn, toy_cache(3), beam_size=1,
                                    alpha=0.6, **kw)
  np.testing.assert_array_equal(ids_BxKxL[:, 0], greedy)


@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_beam_size_one_never_worse_than_greedy(alpha):
  logits_fn, np_logp = make_toy(5)
  kw = dict(batch_size=6, max_len=6, bos_id=BOS, eos_id=EOS)
  greedy = np.asarray(decode.greedy_search(logits_fn, toy_cache(6), **kw))
  _, scores_BxK = decode.beam_search(logits_fn, toy_cache(6), beam_size=1,
                                     alpha=alpha, **kw)
  for b in range(6):
    seq = strip(greedy[b])
    if seq[-1] == EOS:
      assert scores_BxK[b, 0] >= np_logp(b, seq) / lp(len(seq), alpha) - 1e-5


def test_beam_batch_items_independent_and_jit():
  logits_fn, _ = make_toy(6)
  B, K = 3, 4
  search = jax.jit(functools.partial(
      decode.beam_search, logits_fn, batch_size=B, beam_size=K, alpha=0.6,
      max_len=T_MAX, bos_id=BOS, eos_id=EOS))
  ids_BxKxL, scores_BxK = search(toy_cache(B, K))
  for b in range(B):
    cache = {'h': jnp.full((K, 1), b, jnp.int32), 'i': jnp.int32(0)}
    ids1, scores1 = decode.beam_search(
        logits_fn, cache, batch_size=1, beam_size=K, alpha=0.6, max_len=T_MAX,
        bos_id=BOS, eos_id=EOS)
    np.testing.assert_array_equal(ids1[0], ids_BxKxL[b])
    np.testing.assert_allclose(scores1[0], scores_BxK[b], rtol=1e-6)
  assert np.all(np.diff(np.asarray(scores_BxK), axis=1) <= 0)


def test_beam_early_termination():
  """EOS is (almost) certain at step 1: the loop must stop long before max_len."""
  logits_fn, _ = make_toy(7, eos_rows=[1])
  steps = []

  def counting_fn(ids_Nx1, cache, step):
    jax.debug.callback(lambda s: steps.append(int(s)), step)
    return logits_fn(ids_Nx1, cache, step)

  # K=2 < the 3 real non-EOS tokens, so all finished slots hold real hypotheses.
  ids_BxKxL, _ = decode.beam_search(counting_fn, toy_cache(2, 2), batch_size=2,
                                    beam_size=2, alpha=0.6, max_len=T_MAX,
                                    bos_id=BOS, eos_id=EOS)
  jax.effects_barrier()
  assert np.all(np.asarray(ids_BxKxL[:, 0, 1]) == EOS)
  assert max(steps) < T_MAX - 1


def test_beam_returns_alive_when_nothing_finished():
  logits_fn, np_logp = make_toy(8, eos_rows=[])   # EOS never possible
  ids_BxKxL, scores_BxK = decode.beam_search(
      logits_fn, toy_cache(2, 3), batch_size=2, beam_size=3, alpha=0.6,
      max_len=np.array([3, 5], np.int32), bos_id=BOS, eos_id=EOS)
  for b, m in enumerate([3, 5]):
    for k in range(3):
      seq = list(np.asarray(ids_BxKxL[b, k]))
      assert EOS not in seq and np.all(np.asarray(seq[:m]) > EOS) and seq[m:] == [PAD] * (5 - m)
      np.testing.assert_allclose(np_logp(b, seq[:m]) / lp(m, 0.6), scores_BxK[b, k], rtol=1e-5)
