"""Tests for transformer/search.py: the searches on toy step functions, against
exhaustive and reference searches written in numpy (compaction and refill:
tests/test_beam_loops.py)."""
import functools
import itertools

from hypothesis import given, settings, strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import search

V, H, T_MAX = 6, 97, 8          # toy vocab, hash buckets, max steps
PAD, EOS, BOS = 0, 1, 5          # tokens 2, 3, 4 between


def make_toy(seed, eos_rows=None):
  """A toy step function: next-token logits from a random table indexed by the
  step and a hash of the whole history fed so far. The hash lives in the cache
  (leading dim N), so a wrong beam gather changes the results; the 0-dim step
  counter 'i' is shared and would fail if gathered."""
  r = np.random.RandomState(seed)
  table_TxHxV = (2.0 * r.randn(T_MAX, H, V)).astype(np.float32)
  table_TxHxV[..., [PAD, BOS]] = -np.inf   # as no search emits them (search.allowed)
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
    for prefix in itertools.product(range(EOS + 1, BOS), repeat=n - 1):
      seq = list(prefix) + [EOS]
      out.append((np_logp(item, seq) / lp(n, alpha), seq))
  return sorted(out, key=lambda x: -x[0])


def check_well_formed(ids_L):
  ids_L = np.asarray(ids_L)
  if EOS in ids_L:
    e = list(ids_L).index(EOS)
    assert np.all(ids_L[:e] != PAD) and np.all(ids_L[e + 1:] == PAD)


top_log_probs_jit = jax.jit(search.top_log_probs, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=2)  # One program, not each operation's own.
def lax_top_log_probs(x_BxKxV, offset_BxK, k):
  """(log_softmax(x) + offset flattened per item, lax.top_k of it)."""
  scores = (jax.nn.log_softmax(x_BxKxV) + offset_BxK[:, :, None]).reshape(x_BxKxV.shape[0], -1)
  return scores, jax.lax.top_k(scores, k)


@settings(max_examples=60, deadline=None)
@given(items=st.integers(1, 3), beams=st.integers(1, 8), vocab=st.integers(1, 300),
       k=st.integers(1, 16), chunk=st.sampled_from([None, 1, 2, 3, 8, 16]),
       levels=st.integers(1, 6), neg_inf=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_top_log_probs_equals_lax_top_k_of_the_log_softmax(items, beams, vocab, k, chunk, levels,
                                                           neg_inf, seed):
  """Beam search's top-k of log_softmax(logits) + the beams' scores, without the
  scores written out, is lax.top_k's: the same values and indices, ties (few
  distinct logits and beam scores, -inf among both) going to the lower index,
  for any vocabulary and chunk width, padded or not."""
  k = min(k, beams * vocab)
  r = np.random.default_rng(seed)
  x = r.integers(0, levels, (items, beams, vocab)).astype(np.float32)
  x[r.random(x.shape) < neg_inf] = -np.inf
  x[np.arange(items)[:, None], np.arange(beams), r.integers(0, vocab, (items, beams))] = 0.0
  offset = -r.integers(0, 2, (items, beams)).astype(np.float32)
  offset[r.random(offset.shape) < neg_inf / 2] = -np.inf
  scores, (want_values, want_indices) = lax_top_log_probs(jnp.asarray(x), jnp.asarray(offset), k)
  values, indices = top_log_probs_jit(jnp.asarray(x), jnp.asarray(offset), k, chunk)
  if jax.default_backend() == "cpu":
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices, want_indices)
  else:  # On an H200 the two programs' exp and sums rounded ~1 ulp apart.
    np.testing.assert_allclose(values, want_values, rtol=1e-6)
    np.testing.assert_allclose(np.take_along_axis(scores, indices, 1), want_values, rtol=1e-6)
    assert all(len(set(row)) == k for row in np.asarray(indices))


def test_top_log_probs_padding_never_wins_a_tie():
  """With a chunk width that does not divide the vocabulary, a beam's last chunk
  is padded; where fewer than k scores are above -inf, lax.top_k's ties at -inf
  go to the next beam's tokens, never to the padding (which would repeat one)."""
  x = jnp.zeros((1, 12, 3))
  offset = jnp.full((1, 12), -jnp.inf).at[0, 11].set(0.0)
  want = jax.lax.top_k((jax.nn.log_softmax(x) + offset[:, :, None]).reshape(1, -1), 9)
  got = search.top_log_probs(x, offset, 9, chunk=2)
  np.testing.assert_array_equal(got[1], want[1])
  np.testing.assert_array_equal(got[0], want[0])


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), length=st.integers(1, 300), levels=st.integers(1, 6),
       special=st.floats(0.0, 0.3), seed=st.integers(0, 2**31 - 1))
def test_argmax_equals_numpy_argmax_with_ties(rows, length, levels, special, seed):
  """search.argmax is numpy's argmax: the first of tied maxima, -inf and +inf taken
  as values, the first NaN where a row has one (jnp.argmax on a GPU can give a
  later NaN)."""
  r = np.random.default_rng(seed)
  x = r.integers(0, levels, (rows, length)).astype(np.float32)
  for value in (-np.inf, np.inf, np.nan):
    x[r.random((rows, length)) < special / 3] = value
  got = jax.jit(search.argmax)(jnp.asarray(x))  # As the searches run it: compiled.
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, np.argmax(x, axis=-1))


@pytest.mark.parametrize("vocab", [32000, 37000, 8191])
def test_top_log_probs_on_long_rows_of_distinct_values(vocab):
  """Vocabularies whose chunks are 128, 125 and (8191 is prime) 128 padded."""
  x = jax.random.normal(jax.random.key(0), (2, 4, vocab))
  offset = jax.random.normal(jax.random.key(1), (2, 4))
  for k in (1, 8):
    values, indices = top_log_probs_jit(x, offset, k, None)
    _, (want_values, want_indices) = lax_top_log_probs(x, offset, k)
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(values, want_values)


def test_greedy_stops_and_pads():
  logits_fn, np_logp = make_toy(0, eos_rows=[2])
  ids_BxL = search.greedy_search(logits_fn, toy_cache(3), batch_size=3,
                                 max_len=6, bos_id=BOS, eos_id=EOS)
  assert ids_BxL.shape == (3, 6)
  for row in np.asarray(ids_BxL):
    assert row[2] == EOS and np.all(row[3:] == PAD) and np.all(row[:2] > EOS)


def test_greedy_per_row_max_len_and_batch_independence():
  logits_fn, _ = make_toy(1)
  max_len_B = np.array([2, 5, 3], np.int32)
  ids_BxL = search.greedy_search(logits_fn, toy_cache(3), batch_size=3,
                                 max_len=max_len_B, bos_id=BOS, eos_id=EOS)
  assert ids_BxL.shape == (3, 5)
  full_BxL = search.greedy_search(logits_fn, toy_cache(3), batch_size=3,
                                  max_len=5, bos_id=BOS, eos_id=EOS)
  for b, m in enumerate(max_len_B):
    assert np.all(np.asarray(ids_BxL[b, m:]) == PAD)
    np.testing.assert_array_equal(ids_BxL[b, :m], full_BxL[b, :m])
    check_well_formed(ids_BxL[b])


def test_sample_low_temperature_and_top1_equal_greedy():
  logits_fn, _ = make_toy(2)
  kw = dict(batch_size=4, max_len=6, bos_id=BOS, eos_id=EOS)
  greedy = search.greedy_search(logits_fn, toy_cache(4), **kw)
  rng = jax.random.key(0)
  for temperature, top_k in [(1e-5, 0), (1.0, 1), (0.0, 0)]:
    got = search.sample(logits_fn, toy_cache(4), rng, temperature=temperature,
                        top_k=top_k, **kw)
    np.testing.assert_array_equal(got, greedy)


def test_sample_distribution_and_top_k():
  """Samples follow softmax(logits / temperature) over the tokens a search may
  emit: PAD and BOS, though their logits are the largest, are never drawn."""
  logits_V = jnp.array([3.0, 0.5, 1.0, 0.0, -0.5, 3.0], jnp.float32)

  def logits_fn(ids_Nx1, cache, step):
    return jnp.broadcast_to(logits_V, (ids_Nx1.shape[0], V)), cache

  n = 4000
  kw = dict(batch_size=n, max_len=1, bos_id=BOS, eos_id=EOS)
  ids = np.asarray(search.sample(logits_fn, {}, jax.random.key(1), temperature=2.0, **kw))
  freq_V = np.bincount(ids[:, 0], minlength=V) / n
  want_V = jax.nn.softmax(logits_V.at[jnp.array([PAD, BOS])].set(-jnp.inf) / 2.0)
  np.testing.assert_allclose(freq_V, want_V, atol=0.03)
  ids = np.asarray(search.sample(logits_fn, {}, jax.random.key(1), top_k=2, **kw))
  assert set(np.unique(ids)) == {1, 2}
  # A huge temperature draws the tokens alike: past ~1e38 every draw was PAD
  # (1 / temperature was 0 in float32, and a masked logit times 0 NaN).
  for temperature in (1e38, 1e39):
    ids = np.asarray(search.sample(logits_fn, {}, jax.random.key(1), temperature=temperature,
                                   **kw))
    freq_V = np.bincount(ids[:, 0], minlength=V) / n
    np.testing.assert_allclose(freq_V, [0, .25, .25, .25, .25, 0], atol=0.03)


def test_a_sampled_row_depends_on_its_own_key_alone():
  """With one key a row, a row's samples are the same in any batch at any place
  (decoding gives each example its own key, so devices and batching do not move
  them); with one key, row b draws with fold_in(key, b)."""
  logits_fn, _ = make_toy(5)
  kw = dict(max_len=T_MAX, bos_id=BOS, eos_id=EOS, temperature=1.5)
  keys_B = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(7), i))(jnp.arange(6))
  # Rows start from hash i: cache rows 0..5; the same rows reversed with their keys.
  both = np.asarray(search.sample(logits_fn, toy_cache(6), keys_B, batch_size=6, **kw))
  flipped = np.asarray(search.sample(
      logits_fn, {'h': toy_cache(6)['h'][::-1], 'i': jnp.int32(0)}, keys_B[::-1],
      batch_size=6, **kw))
  np.testing.assert_array_equal(flipped[::-1], both)
  alone = np.asarray(search.sample(logits_fn, {'h': toy_cache(6)['h'][4:5], 'i': jnp.int32(0)},
                                   keys_B[4:5], batch_size=1, **kw))
  np.testing.assert_array_equal(alone[0], both[4])
  one_key = np.asarray(search.sample(logits_fn, toy_cache(6), jax.random.key(7), batch_size=6,
                                     **kw))
  np.testing.assert_array_equal(one_key, both)
  raw_key = np.asarray(search.sample(logits_fn, toy_cache(6), jax.random.PRNGKey(7),
                                     batch_size=6, **kw))  # An old-style uint32[2] key.
  np.testing.assert_array_equal(raw_key, both)
  assert len({tuple(row) for row in both}) > 3  # The rows do differ.


def test_top_k_keeps_exactly_k_tokens_on_ties_and_a_tiny_temperature_is_greedy():
  """Tokens tied with the k-th logit (common after bfloat16 rounding) are not
  all kept: top_k=1 is greedy's choice, the lowest id of the tied maximum, and
  top_k=2 keeps two. A temperature so small that the logits over it overflow
  (1e-39) still picks the maximum, not token 0."""
  logits_V = jnp.array([-9.0, -9.0, 2.0, 0.0, 2.0, -9.0], jnp.float32)

  def logits_fn(ids_Nx1, cache, step):
    return jnp.broadcast_to(logits_V, (ids_Nx1.shape[0], V)), cache

  kw = dict(batch_size=2000, max_len=1, bos_id=BOS, eos_id=EOS)
  top1 = np.asarray(search.sample(logits_fn, {}, jax.random.key(2), top_k=1, **kw))
  assert set(np.unique(top1)) == {2}
  ties = jnp.array([-9.0, 1.0, 3.0, 1.0, 1.0, -9.0], jnp.float32)
  tied_fn = lambda ids_Nx1, cache, step: (jnp.broadcast_to(ties, (ids_Nx1.shape[0], V)), cache)
  top2 = np.asarray(search.sample(tied_fn, {}, jax.random.key(2), top_k=2, **kw))
  assert set(np.unique(top2)) == {1, 2}
  cold = np.asarray(search.sample(tied_fn, {}, jax.random.key(2), temperature=1e-39, **kw))
  assert set(np.unique(cold)) == {2}


def test_beam_matches_exhaustive_search():
  """With K >= all candidates ever (at most 3^3 * 4 = 108 here), nothing is
  pruned: the K best finished hypotheses of each item must be exactly the
  enumerated top K."""
  logits_fn, np_logp = make_toy(3)
  B, K = 2, 128
  max_len_B = np.array([4, 2], np.int32)   # per-row limits
  run = jax.jit(lambda alpha: search.beam_search(
      logits_fn, toy_cache(B, K), batch_size=B, beam_size=K, alpha=alpha,
      max_len=max_len_B, bos_id=BOS, eos_id=EOS))
  for alpha in [0.0, 0.6, 1.5]:
    ids_BxKxL, scores_BxK = run(alpha)
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


def reference_beam(logp_TxHxV, item, K, alpha, max_len):
  """Beam search over the toy, written out in numpy with the same pruning as
  search.beam_search (top 2K extensions; the K best non-EOS stay alive; EOS
  extensions ranked in the top K compete for the K finished slots) but no early
  stop: every item runs to max_len. -> ([(score, seq)] best first, K of them;
  the first step after which no alive beam could still reach the worst
  (`stop_all`) or the best (`stop_best`) finished score)."""
  neg = -np.inf
  alive = [(0.0, [], item)] + [(neg, [], item)] * (K - 1)  # (logp, seq, hash)
  finished = []  # (score, seq), at most K, best first
  stop_all = stop_best = max_len
  for t in range(max_len):
    cands = []
    for k, (logp, seq, h) in enumerate(alive):
      h2 = (h * 7 + (seq[-1] if seq else BOS) + 1) % H
      for v in range(V):
        cands.append((np.float32(logp) + logp_TxHxV[t, h2, v], k * V + v, seq + [v], h2))
    cands.sort(key=lambda c: (-c[0], c[1]))  # top_k: ties to the lower index
    cands = cands[:2 * K]
    alive = [(c[0], c[2], c[3]) for c in cands if c[2][-1] != EOS][:K]
    new = [(c[0] / lp(t + 1, alpha), c[2]) for c in cands[:K]
           if c[2][-1] == EOS and c[0] > neg]
    finished = sorted(finished + new, key=lambda f: -f[0])[:K]  # stable: old first
    reachable = alive[0][0] / lp(max_len, alpha)
    if finished and finished[0][0] > reachable:
      stop_best = min(stop_best, t + 1)
    if len(finished) == K and finished[-1][0] > reachable:
      stop_all = min(stop_all, t + 1)
  alive_scored = [(logp / lp(max_len, alpha), seq) for logp, seq, _ in alive]
  return (finished + alive_scored)[:K], stop_all, stop_best


def test_beam_equals_search_without_early_stopping():
  """K < the candidates, so beams are pruned and items stop early: the result
  must still be that of the same pruned search run to max_len. The stopping
  rule must bound what an alive beam can still reach at a longer length (its
  larger length penalty can lift its score): a rule comparing the best finished
  score with the alive beams' scores as they stand returned a worse hypothesis
  for some of these items."""
  B, L = H, 6

  def toy_logits_fn(table):
    def logits_fn(ids_Nx1, cache, step):
      h_Nx1 = (cache['h'] * 7 + ids_Nx1 + 1) % H
      return table[cache['i'], h_Nx1[:, 0]], {'h': h_Nx1, 'i': cache['i'] + 1}
    return logits_fn

  @functools.partial(jax.jit, static_argnames=('K', 'best_only'))
  def run(table, alpha, K, best_only):
    return search.beam_search(toy_logits_fn(table), toy_cache(B, K), batch_size=B,
                              beam_size=K, alpha=alpha, max_len=L, bos_id=BOS,
                              eos_id=EOS, best_only=best_only)

  checked = stops_early = 0
  for seed in range(4):
    r = np.random.RandomState(100 + seed)
    table_TxHxV = (2.0 * r.randn(L, H, V)).astype(np.float32)
    table_TxHxV[..., [PAD, BOS]] = -np.inf
    table_TxHxV[..., EOS] += r.uniform(-2.0, 2.0)  # finish early in some tables, late in others
    logp_TxHxV = np.asarray(jax.nn.log_softmax(jnp.asarray(table_TxHxV), axis=-1))
    for K in (2, 3, 4):
      for alpha in (0.6, 1.5):
        refs = [reference_beam(logp_TxHxV, b, K, alpha, L) for b in range(B)]
        for best_only in (False, True):
          ids_BxKxL, scores_BxK = run(jnp.asarray(table_TxHxV), alpha, K=K,
                                      best_only=best_only)
          rows = 1 if best_only else K
          for b, (ref, stop_all, stop_best) in enumerate(refs):
            np.testing.assert_allclose(scores_BxK[b, :rows], [sc for sc, _ in ref[:rows]],
                                       rtol=1e-5, err_msg=f'seed {seed} K {K} item {b}')
            for k in range(rows):
              assert [int(x) for x in strip(ids_BxKxL[b, k])] == ref[k][1]
            stops_early += (stop_best if best_only else stop_all) < L
            checked += 1
  assert checked == 4 * 3 * 2 * 2 * B
  assert stops_early > checked // 4  # The early stop is exercised, not only max_len.


def test_no_search_chooses_pad_bos_or_a_nan_logit():
  """PAD, BOS and a NaN logit count as -inf in every search, though here they
  are each step's largest (NaN wins numpy's argmax): the rest of the row decodes
  as if they were impossible, and beam scores renormalize over the others."""
  r = np.random.RandomState(4)
  table = (2.0 * r.randn(T_MAX, V)).astype(np.float32)
  banned, allowed = table.copy(), table.copy()
  banned[:, [PAD, BOS]] = 9.0
  banned[:, 3] = np.nan
  allowed[:, [PAD, BOS, 3]] = -np.inf

  def searches(table):
    table = jnp.asarray(table)
    logits_fn = lambda ids_Nx1, cache, step: (table[cache['i']][None].repeat(ids_Nx1.shape[0], 0),
                                              {'i': cache['i'] + 1})
    kw = dict(max_len=T_MAX, bos_id=BOS, eos_id=EOS)
    cache = {'i': jnp.int32(0)}
    return [search.beam_search(logits_fn, cache, batch_size=1, beam_size=3, alpha=0.6, **kw),
            search.greedy_search(logits_fn, cache, batch_size=2, **kw),
            search.sample(logits_fn, cache, jax.random.key(0), batch_size=64, **kw)]

  (ids, scores), greedy, sampled = searches(banned)
  (want_ids, want_scores), want_greedy, want_sampled = searches(allowed)
  assert np.isfinite(np.asarray(scores)).all()
  for got, want in ((ids, want_ids), (greedy, want_greedy), (sampled, want_sampled)):
    got = np.asarray(got)
    np.testing.assert_array_equal(got, want)
    assert not np.isin(got, [BOS, 3]).any()
    for row in got.reshape(-1, T_MAX):
      check_well_formed(row)  # PAD only after EOS
  np.testing.assert_array_equal(scores, want_scores)


def test_allowed_keeps_bos_where_it_is_the_eos():
  x = jnp.zeros((1, 4))
  np.testing.assert_array_equal(search.allowed(x, bos_id=2, eos_id=3), [[-np.inf, 0, -np.inf, 0]])
  np.testing.assert_array_equal(search.allowed(x, bos_id=2, eos_id=2), [[-np.inf, 0, 0, 0]])


def test_beam_size_one_equals_greedy():
  """Without a length penalty, beam 1 is greedy. With one, greedy's output is
  among the single beam's finished candidates, so beam 1 scores at least as well
  (it may run past the EOS that greedy stops at)."""
  for seed in (4, 5):
    logits_fn, np_logp = make_toy(seed)
    kw = dict(batch_size=6, max_len=7, bos_id=BOS, eos_id=EOS)
    greedy = search.greedy_search(logits_fn, toy_cache(6), **kw)
    ids_BxKxL, _ = search.beam_search(logits_fn, toy_cache(6), beam_size=1, alpha=0.0, **kw)
    np.testing.assert_array_equal(ids_BxKxL[:, 0], greedy)
    ids_BxKxL, scores_BxK = search.beam_search(logits_fn, toy_cache(6), beam_size=1,
                                               alpha=0.6, **kw)
    for b in range(6):
      g = strip(greedy[b])
      if g[-1] == EOS:
        assert scores_BxK[b, 0] >= np_logp(b, g) / lp(len(g), 0.6) - 1e-5


def test_beam_batch_items_independent_and_jit():
  logits_fn, _ = make_toy(6)
  B, K = 3, 4
  kw = dict(beam_size=K, alpha=0.6, max_len=T_MAX, bos_id=BOS, eos_id=EOS)
  run = jax.jit(functools.partial(search.beam_search, logits_fn, batch_size=B, **kw))
  run1 = jax.jit(functools.partial(search.beam_search, logits_fn, batch_size=1, **kw))
  ids_BxKxL, scores_BxK = run(toy_cache(B, K))
  for b in range(B):
    ids1, scores1 = run1({'h': jnp.full((K, 1), b, jnp.int32), 'i': jnp.int32(0)})
    np.testing.assert_array_equal(ids1[0], ids_BxKxL[b])
    np.testing.assert_allclose(scores1[0], scores_BxK[b], rtol=1e-6)
  assert np.all(np.diff(np.asarray(scores_BxK), axis=1) <= 0)


def test_beam_finished_item_stays_finished_while_others_run():
  """Item 0 may stop early; item 1 cannot emit EOS, so the loop runs to max_len.
  A stopped item must stay stopped (its stopping test depends on t): its result
  equals decoding it alone, and it never writes tokens after a PAD gap."""
  K = 3
  for seed in range(10):
    logits_fn, _ = make_toy(20 + seed)

    def no_eos_for_item_1(ids_Nx1, cache, step, logits_fn=logits_fn):
      logits_NxV, cache = logits_fn(ids_Nx1, cache, step)
      item_1 = (jnp.arange(logits_NxV.shape[0]) >= K)[:, None]
      return jnp.where(item_1 & (jnp.arange(V) == EOS)[None, :], -jnp.inf, logits_NxV), cache

    kw = dict(beam_size=K, alpha=0.6, max_len=T_MAX, bos_id=BOS, eos_id=EOS)
    ids_BxKxL, scores_BxK = search.beam_search(no_eos_for_item_1, toy_cache(2, K),
                                               batch_size=2, **kw)
    alone, alone_scores = search.beam_search(logits_fn, toy_cache(1, K), batch_size=1, **kw)
    np.testing.assert_array_equal(ids_BxKxL[0], alone[0])
    np.testing.assert_allclose(scores_BxK[0], alone_scores[0], rtol=1e-6)
    for k in range(K):
      check_well_formed(ids_BxKxL[0, k])
      assert EOS not in list(np.asarray(ids_BxKxL[1, k]))


def test_beam_early_termination():
  """EOS is (almost) certain at step 1: the loop must stop long before max_len."""
  logits_fn, _ = make_toy(7, eos_rows=[1])
  steps = []

  def counting_fn(ids_Nx1, cache, step):
    jax.debug.callback(lambda s: steps.append(int(s)), step)
    return logits_fn(ids_Nx1, cache, step)

  # K=2 < the 3 real non-EOS tokens, so all finished slots hold real hypotheses.
  ids_BxKxL, _ = search.beam_search(counting_fn, toy_cache(2, 2), batch_size=2,
                                    beam_size=2, alpha=0.6, max_len=T_MAX,
                                    bos_id=BOS, eos_id=EOS)
  jax.effects_barrier()
  assert np.all(np.asarray(ids_BxKxL[:, 0, 1]) == EOS)
  assert max(steps) < T_MAX - 1


def test_beam_best_only_stops_once_the_best_is_final():
  """Only the path 3, EOS can finish, so the K=3 finished slots never fill and
  the full search runs to max_len. With best_only it stops as soon as no alive
  beam can beat that hypothesis (log-probs only fall; lp is largest at max_len),
  with the same best output."""
  neg = -jnp.inf

  def logits_fn(ids_Nx1, cache, step):
    del step
    i, first_N = cache['i'], cache['first']
    first_N = jnp.where(i == 1, ids_Nx1[:, 0], first_N)   # the token chosen at step 0
    start_V = jnp.array([neg, neg, -2.0, 0.0, -1.0, neg])
    can_end_N = (i == 1) & (first_N == 3)
    later_NxV = jnp.where(can_end_N[:, None], jnp.array([neg, 5.0, 0.0, 0.0, 0.0, neg]),
                          jnp.array([neg, neg, 0.0, 0.0, 0.0, neg]))
    logits_NxV = jnp.where(i == 0, start_V, later_NxV)
    return logits_NxV, {'i': i + 1, 'first': first_N}

  steps = []

  def counting_fn(ids_Nx1, cache, step):
    jax.debug.callback(lambda s: steps.append(int(s)), step)
    return logits_fn(ids_Nx1, cache, step)

  K = 3
  cache = {'i': jnp.int32(0), 'first': jnp.zeros((2 * K,), jnp.int32)}
  kw = dict(batch_size=2, beam_size=K, alpha=0.6, max_len=T_MAX, bos_id=BOS, eos_id=EOS)
  full, _ = search.beam_search(counting_fn, cache, **kw)
  jax.effects_barrier()
  assert max(steps) == T_MAX - 1
  steps.clear()
  best, _ = search.beam_search(counting_fn, cache, best_only=True, **kw)
  jax.effects_barrier()
  assert max(steps) == 1
  np.testing.assert_array_equal(best[:, 0], full[:, 0])
  assert list(np.asarray(best[0, 0])) == [3, EOS] + [PAD] * (T_MAX - 2)


def test_beam_returns_alive_when_nothing_finished():
  logits_fn, np_logp = make_toy(8, eos_rows=[])   # EOS never possible
  ids_BxKxL, scores_BxK = search.beam_search(
      logits_fn, toy_cache(2, 3), batch_size=2, beam_size=3, alpha=0.6,
      max_len=np.array([3, 5], np.int32), bos_id=BOS, eos_id=EOS)
  for b, m in enumerate([3, 5]):
    for k in range(3):
      seq = list(np.asarray(ids_BxKxL[b, k]))
      assert EOS not in seq and np.all(np.asarray(seq[:m]) > EOS) and seq[m:] == [PAD] * (5 - m)
      np.testing.assert_allclose(np_logp(b, seq[:m]) / lp(m, 0.6), scores_BxK[b, k], rtol=1e-5)


def test_sampling_draws_each_step_with_its_own_key():
  """Row b's token at step t is drawn with fold_in(its key, t): from a flat
  distribution (EOS banned) 40 steps give several tokens, where one key reused
  at every step would repeat the first draw."""
  def flat(ids, cache, step):
    del step
    return jnp.zeros((ids.shape[0], 6)).at[:, 3].set(-1e9), cache
  ids = np.asarray(search.sample(flat, {}, jax.random.key(0), batch_size=1, max_len=40,
                                 bos_id=2, eos_id=3))
  assert len(set(ids[0, 1:].tolist())) > 1, ids
