"""Tests for transformer/decode.py: the decoding contract with a stand-in model
that is not a Transformer, and the tiny Transformer decoded through it."""
import functools
import itertools

import jax
import jax.numpy as jnp
from flax import traverse_util
import numpy as np
import pytest

from transformer import attention, decode, search
from transformer.config import ModelConfig
from transformer.model import Transformer, TransformerDecoding, shift_right
from tests.test_search import (BOS, EOS, H, PAD, T_MAX, V, check_well_formed, lp,  # pylint: disable=g-multiple-import
                               make_toy, toy_cache)

# The decoding contract, with a stand-in model that is not a Transformer.

class ToyDecoding(decode.DecodingModel):
  """The hash toy of make_toy behind decode.DecodingModel: the parameters are its
  logits table; an item's start hash is its first source token mod H; the cache
  also records the tokens fed (so that it has a length for `grow`). Calls are
  recorded while tracing: which methods ran and the cache lengths `step` saw."""
  pad_id, bos_id, eos_id, max_len = PAD, BOS, EOS, T_MAX

  def __init__(self):
    self.seen = []

  def encode(self, params, inputs_BxS):
    self.seen.append('encode')
    return inputs_BxS[:, 0] % H

  def init_state(self, params, start_B, inputs_BxS, cache_len):
    self.seen.append('init_state')
    cache = {'h': start_B[:, None], 'i': jnp.int32(0),
             'fed': jnp.zeros((inputs_BxS.shape[0], cache_len), jnp.int32)}
    return {'start': start_B}, cache

  def step(self, params, context, cache, ids_Nx1):
    self.seen.append(('step', cache['fed'].shape[1]))
    h_Nx1 = (cache['h'] * 7 + ids_Nx1 + 1) % H
    fed = jax.lax.dynamic_update_slice(cache['fed'], ids_Nx1, (0, cache['i']))
    return params[cache['i'], h_Nx1[:, 0]], {'h': h_Nx1, 'i': cache['i'] + 1, 'fed': fed}

  def grow(self, cache, length):
    self.seen.append(('grow', length))
    return {**cache, 'fed': jnp.pad(cache['fed'], ((0, 0), (0, length - cache['fed'].shape[1])))}

  def reorder(self, cache, parent_BxK):
    self.seen.append('reorder')
    return search.gather_beams(cache, parent_BxK)


def test_decoding_runs_any_model_through_the_contract(monkeypatch):
  """encode_and_decode drives a model only through DecodingModel: on the toy it
  equals the searches run on the toy's step function directly, calls encode
  and init_state once, reorders through the model in beam search, and grows the
  cache through the model when the loop runs past its first length."""
  r = np.random.RandomState(30)
  table = (2.0 * r.randn(T_MAX, H, V)).astype(np.float32)
  table[..., PAD] = -np.inf
  logits_fn, _ = make_toy(30)
  B = 5
  inputs_BxS = jnp.asarray(np.stack([np.arange(B) + H, np.full(B, 4)], 1), jnp.int32)
  kw = dict(batch_size=B, max_len=T_MAX, bos_id=BOS, eos_id=EOS)
  monkeypatch.setattr(decode, 'first_cache_len', lambda S: 3)
  for mode in ('greedy', 'beam'):
    toy = ToyDecoding()
    got = decode.encode_and_decode(toy, jnp.asarray(table), inputs_BxS, mode=mode,
                                   beam_size=3, alpha=0.6, max_extra_len=T_MAX)
    if mode == 'greedy':
      want = search.greedy_search(logits_fn, toy_cache(B), **kw)
    else:
      want = search.beam_search(logits_fn, toy_cache(B, 3), beam_size=3, alpha=0.6,
                                best_only=True, **kw)[0][:, 0]
    np.testing.assert_array_equal(got, want)
    assert toy.seen.count('encode') == toy.seen.count('init_state') == 1
    assert ('grow', T_MAX) in toy.seen
    assert {x[1] for x in toy.seen if isinstance(x, tuple) and x[0] == 'step'} == {3, T_MAX}
    assert ('reorder' in toy.seen) == (mode == 'beam')


# ---------------------------------------------------------------------------
# The real model (tiny, randomly initialised).

M_EOS, M_V = 3, 11
# eos_id is traced: pass it always (an omitted default would be another compilation).
decode_jit = jax.jit(decode.encode_and_decode,
                     static_argnames=('model', 'mode', 'beam_size', 'max_extra_len', 'top_k',
                                      'compact', 'refill'))


@functools.lru_cache(maxsize=None)
def tiny_model(score='scaled_dot', track_beams=True, d_k=0, max_len=16, dtype='float32'):
  """(the tiny Transformer's decoding contract, its parameters); d_k 0 is
  d_model / h, as d_v always is. The parameters do not depend on max_len (the
  positions are sinusoids)."""
  cfg = ModelConfig(input_vocab_size=M_V, output_vocab_size=M_V, num_layers=2,
                    d_model=32, d_ff=64, num_heads=2, dropout=0.0, max_len=max_len,
                    attention_score=score, d_k=d_k, dtype=dtype)
  model = Transformer(cfg)
  ones = jnp.ones((1, 4), jnp.int32)
  return (TransformerDecoding(model, track_beams=track_beams),
          jax.jit(model.init)(jax.random.key(0), ones, ones)['params'])


def sources(lengths, width, seed=0):
  """[B, width] ids in [4, V) (no specials), row b padded after lengths[b]."""
  r = np.random.RandomState(seed)
  ids = r.randint(4, M_V, size=(len(lengths), width)).astype(np.int32)
  for b, n in enumerate(lengths):
    ids[b, n:] = 0
  return ids


def model_scores(model, params, inputs_BxS, ids_BxL, alpha):
  """Teacher-forced log P(Y) / lp(|Y|) of each row (up to its first EOS)."""
  logits_BxLxV = forward(model)({'params': params}, inputs_BxS, ids_BxL)
  logp_BxL = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits_BxLxV)),
                                np.asarray(ids_BxL)[:, :, None], axis=2)[:, :, 0]
  out = []
  for row, logp_L in zip(np.asarray(ids_BxL), logp_BxL):
    n = list(row).index(M_EOS) + 1 if M_EOS in row else int(np.sum(row != 0))
    out.append(logp_L[:n].sum() / lp(n, alpha))
  return np.array(out)


@functools.lru_cache(maxsize=None)
def forward(decoding):
  """The teacher-forced forward pass of the Transformer behind `decoding`."""
  return jax.jit(decoding.model.apply)


# Shared by the model tests (fewer compilations). Row limits: 6 + 12 capped to
# the model's 16 positions, and 3 + 12 = 15.
SRC_LENGTHS, EXTRA = [6, 3], 12


def test_cached_steps_equal_teacher_forced_forward():
  """Both paths are float32 and the same math; only reduction shapes differ (the
  cached path attends over the whole zero-initialised cache with masking, the
  full one over T keys under a causal mask), so summation order changes the
  logits by ~1e-6 (measured 8e-7 on logits of std 0.8): atol 1e-5."""
  model, params = tiny_model()
  inputs_BxS = jnp.asarray(sources(SRC_LENGTHS, 6))
  targets_BxT = jnp.asarray(sources([16, 16], 16, seed=2))  # shapes as model_scores
  full_BxTxV = forward(model)({'params': params}, inputs_BxS, targets_BxT)

  @jax.jit
  def incremental(params, inputs_BxS, dec_in_BxT):
    context, cache = model.init_state(params, model.encode(params, inputs_BxS), inputs_BxS, 16)

    def step(cache, t):
      logits_BxV, cache = model.step(params, context, cache,
                                     jax.lax.dynamic_slice_in_dim(dec_in_BxT, t, 1, axis=1))
      return cache, logits_BxV

    return jax.lax.scan(step, cache, jnp.arange(dec_in_BxT.shape[1]))[1]

  # The encoder's keys/values are context (never reordered by beam search);
  # the self-attention caches and the shared 0-dim step counter are the cache.
  context, cache = jax.eval_shape(lambda p: model.init_state(
      p, jnp.zeros((2, 6, 32)), inputs_BxS, 16), params)
  names = [jax.tree_util.keystr(path) for path, _ in
           jax.tree_util.tree_flatten_with_path(cache)[0]]
  assert names and not any('cross_attention' in n for n in names)
  assert sum('self_attention' in n for n in names) == 2 * 2    # layers x (key, value)
  assert [x.shape for x in jax.tree.leaves(cache) if x.ndim == 0] == [()]
  assert sum('cross_attention' in jax.tree_util.keystr(p)
             for p, _ in jax.tree_util.tree_flatten_with_path(context[2])[0]) == 2 * 2

  logits_TxBxV = incremental(params, inputs_BxS, shift_right(targets_BxT, model.bos_id))
  np.testing.assert_allclose(jnp.transpose(logits_TxBxV, (1, 0, 2)), full_BxTxV,
                             atol=1e-5, rtol=0)


def test_bfloat16_self_attention_cache_dtype_changes_nothing(monkeypatch):
  """A CPU keeps a bfloat16 model's self-attention cache in float32 for greedy
  search and sampling (attention.self_cache_dtype), and beam search converts it
  back (TransformerDecoding.beams); other backends keep bfloat16. The cached
  values are bfloat16's either way and the attention rounds its probabilities
  to bfloat16, so on a CPU the step logits agree to the last bit with either
  cache dtype, and so do the decodes."""
  assert attention.self_cache_dtype(jnp.bfloat16, 'cpu') == jnp.float32
  assert attention.self_cache_dtype(jnp.bfloat16, 'gpu') == jnp.bfloat16
  assert attention.self_cache_dtype(jnp.float32, 'tpu') == jnp.float32
  cfg = ModelConfig(input_vocab_size=M_V, output_vocab_size=M_V, num_layers=2, d_model=32,
                    d_ff=64, num_heads=2, dropout=0.0, max_len=16, dtype='bfloat16')
  ones = jnp.ones((1, 4), jnp.int32)
  model = TransformerDecoding(Transformer(cfg))
  params = jax.jit(Transformer(cfg).init)(jax.random.key(0), ones, ones)['params']
  inputs_BxS = jnp.asarray(sources(SRC_LENGTHS, 6))
  dec_in_BxT = jnp.asarray(sources([16, 16], 16, seed=2))
  landed = attention.self_cache_dtype

  def run(rule):
    monkeypatch.setattr(attention, 'self_cache_dtype', rule)  # Read when tracing.

    seen = {}

    @jax.jit
    def incremental(params):  # The step logits, teacher-forced; records the cache dtypes.
      context, cache = model.init_state(params, model.encode(params, inputs_BxS), inputs_BxS, 16)
      seen['cache'] = {x.dtype for x in jax.tree.leaves(cache) if x.ndim == 4}
      seen['beams'] = {x.dtype for x in jax.tree.leaves(model.beams(cache, 2)) if x.ndim == 4}
      step = lambda cache, t: model.step(params, context, cache, jax.lax.dynamic_slice_in_dim(
          dec_in_BxT, t, 1, axis=1))[::-1]
      return jax.lax.scan(step, cache, jnp.arange(16))[1]

    logits = np.asarray(incremental(params))
    kw = dict(model=model, params=params, inputs_BxS=inputs_BxS, max_extra_len=EXTRA,
              eos_id=M_V)  # An EOS the model cannot emit: every row runs to its limit.
    # Sampling runs greedy search's loop over the same cache.
    decodes = [np.asarray(decode_jit(mode='greedy', **kw)),
               np.asarray(decode_jit(mode='beam', beam_size=3, **kw))]
    return logits, seen['cache'], seen['beams'], decodes

  cpu = run(lambda dtype, backend=None: landed(dtype, 'cpu'))
  gpu = run(lambda dtype, backend=None: landed(dtype, 'gpu'))
  assert cpu[1:3] == ({jnp.dtype(jnp.float32)}, {jnp.dtype(jnp.bfloat16)})
  assert gpu[1:3] == ({jnp.dtype(jnp.bfloat16)}, {jnp.dtype(jnp.bfloat16)})
  assert cpu[0].dtype == np.float32
  if jax.default_backend() != "cpu":
    # On a GPU the two caches' products are different kernels (float32 and
    # bfloat16 GEMMs, summing in other orders), and XLA may drop the bfloat16
    # rounding before a float32 cache (excess precision): the logits agree to
    # bfloat16 round-off, and a random model's near-ties can flip its decodes.
    np.testing.assert_allclose(cpu[0], gpu[0], atol=3e-2)
    return
  np.testing.assert_array_equal(cpu[0], gpu[0])
  for a, b in zip(cpu[3], gpu[3]):
    np.testing.assert_array_equal(a, b)


def test_model_beam_size_one_equals_greedy():
  model, params = tiny_model()
  inputs_BxS = jnp.asarray(sources(SRC_LENGTHS, 6))
  kw = dict(model=model, params=params, inputs_BxS=inputs_BxS, max_extra_len=EXTRA)
  # With an EOS the model cannot emit, both follow the argmax path to each row's
  # limit: they must agree token for token (exercises the cache and per-row limits).
  greedy = decode_jit(mode='greedy', eos_id=M_V, **kw)
  np.testing.assert_array_equal(decode_jit(mode='beam', beam_size=1, eos_id=M_V, **kw),
                                greedy)
  assert [int(np.sum(r != 0)) for r in np.asarray(greedy)] == [16, 15]
  # With the real EOS too (alpha = 0: a length penalty lets one beam run past an EOS).
  greedy = decode_jit(mode='greedy', eos_id=M_EOS, **kw)
  np.testing.assert_array_equal(
      decode_jit(mode='beam', beam_size=1, alpha=0.0, eos_id=M_EOS, **kw), greedy)


@pytest.mark.parametrize('score,track_beams,keys_transposed,d_k', [
    ('scaled_dot', False, False, 0), ('scaled_dot', True, True, 0),
    ('scaled_dot', True, False, 0), ('additive', True, True, 0),
    ('scaled_dot', True, False, 8), ('general', True, True, 8)])
def test_model_reordered_cache_equals_forward_of_reordered_prefixes(
    score, track_beams, keys_transposed, d_k, monkeypatch):
  """After a `reorder` by beam parents at every step, the next cached step of each
  row gives the logits of the teacher-forced forward pass over the history its
  parents chose: the self-attention state moves with the beams (the keys and
  values themselves, or with track_beams the lineage that beam_attention reads
  them through), the encoder's keys and values stay with the item. Distinct
  random tokens and parents make every row's history matter (the tiny model's
  own beams are too alike to show a wrong reorder); the cache grows midway. The
  lineage is tested with the keys transposed, as float32 beam search caches them,
  and in the layout bfloat16 keeps; and where d_k (8) differs from d_v (16), as
  in Table 3's row B."""
  monkeypatch.setattr(attention, 'beam_keys_transposed', lambda dtype: keys_transposed)
  model, params = tiny_model(score, track_beams, d_k)
  B, K, T = 2, 3, 5
  inputs_BxS = jnp.asarray(sources([6, 3], 6, seed=6))
  r = np.random.RandomState(1)
  tokens_NxT = r.randint(4, M_V, (B * K, T + 1)).astype(np.int32)
  tokens_NxT[:, 0] = model.bos_id
  parents_TxBxK = r.randint(0, K, (T, B, K)).astype(np.int32)

  @jax.jit
  def cached(params):
    context, cache = model.init_state(params, model.encode(params, inputs_BxS), inputs_BxS, 3)
    context, cache = jax.tree.map(
        lambda x: x if x.ndim == 0 else jnp.repeat(x, K, axis=0), (context, cache))
    cache = model.beams(cache, K)
    for t in range(T):
      if t == 3:
        cache = model.grow(cache, 8)
      _, cache = model.step(params, context, cache, jnp.asarray(tokens_NxT[:, t:t + 1]))
      cache = model.reorder(cache, jnp.asarray(parents_TxBxK[t]))
    return model.step(params, context, cache, jnp.asarray(tokens_NxT[:, T:]))[0]

  # Row n's history: its parent's history, then the token the parent was fed.
  history_NxT = np.zeros((B * K, 0), np.int32)
  for t in range(T):
    rows_N = (np.arange(B)[:, None] * K + parents_TxBxK[t]).reshape(-1)
    history_NxT = np.concatenate([history_NxT, tokens_NxT[:, t:t + 1]], axis=1)[rows_N]
  full_NxT = np.concatenate([history_NxT, tokens_NxT[:, T:]], axis=1)
  inputs_NxS = jnp.repeat(inputs_BxS, K, axis=0)
  want_NxV = model.model.apply({'params': params}, model.encode(params, inputs_NxS),
                               inputs_NxS, jnp.asarray(full_NxT), method='decode')[:, T]
  np.testing.assert_allclose(cached(params), want_NxV, atol=1e-5, rtol=0)


def test_model_beam_batch_items_independent_of_padding():
  model, params = tiny_model()
  inputs_BxS = jnp.asarray(sources(SRC_LENGTHS, 6))
  kw = dict(model=model, params=params, mode='beam', beam_size=3, max_extra_len=EXTRA,
            eos_id=M_EOS)
  ids_BxL = np.asarray(decode_jit(inputs_BxS=inputs_BxS, **kw))
  assert ids_BxL.shape == (2, 16)
  alone = np.asarray(decode_jit(inputs_BxS=inputs_BxS[1:, :3], **kw))[0]  # no padding
  assert alone.shape == (15,)
  np.testing.assert_array_equal(ids_BxL[1], np.pad(alone, (0, 1)))
  for row in ids_BxL:
    check_well_formed(row)


def test_model_compacting_beam_search_changes_nothing():
  """Beam search that drops finished items' rows from the batch (compact) decodes
  what the full batch decodes: the context is gathered with the cache. The row
  limits (source length + 2: 3 to 8 steps) stop 5 of the 8 items by step 5, so the
  batch halves twice even if no item emits EOS (with EOS 8 this model's outputs
  end unevenly; with M_EOS every one would end at its first token). Both decode
  what beam search over reordered keys and values (track_beams=False) decodes."""
  model, params = tiny_model()
  inputs_BxS = jnp.asarray(sources([1, 6, 2, 5, 1, 3, 2, 4], 6, seed=3))
  kw = dict(params=params, inputs_BxS=inputs_BxS, mode='beam', beam_size=3,
            max_extra_len=2, eos_id=8)
  full = np.asarray(decode_jit(model=model, **kw))
  assert len(set((full != 0).sum(1))) > 2, full
  np.testing.assert_array_equal(np.asarray(decode_jit(model=model, compact=2, **kw)), full)
  reordered = tiny_model(track_beams=False)[0]
  np.testing.assert_array_equal(np.asarray(decode_jit(model=reordered, **kw)), full)



# (score, max_len, eos_id, max_extra_len, refills): EOS 8 ends this model's outputs
# after 1 to 16 tokens, M_V never (the limits do); max_len 48 with 40 extra tokens
# widens the key ring to L = 46 many times. Each refill size is run where its case
# is hardest, additive scores (their own masking) at both ends of the settings.
REFILL_CASES = [('scaled_dot', 16, 8, EXTRA, (1, 3, 12)), ('scaled_dot', 16, 8, 2, (3,)),
                ('scaled_dot', 16, M_V, 5, (1,)), ('scaled_dot', 48, M_V, 40, (3,)),
                ('additive', 16, 8, EXTRA, (3,)), ('additive', 48, M_V, 40, (1,))]


@pytest.mark.parametrize('score,max_len,eos_id,extra,refills', REFILL_CASES)
def test_model_refilling_beam_search_changes_nothing(score, max_len, eos_id, extra, refills):
  """Beam search whose rows take the next sentence as soon as theirs stops
  (refill = n: the 12 sources searched n at a time; 12 is the whole batch, the
  search without refilling) decodes what the whole batch decodes at once: each
  restarted item's positions count from its own first step, its emptied lineage
  hides the keys the row's previous item left, and its keys go round a ring of
  first_len = 14 steps, widened to L while an item is older. The limits (source
  length + extra) stop items unevenly; an all-PAD row emits nothing."""
  lengths = [1, 6, 2, 5, 1, 3, 2, 4, 6, 1, 0, 3]
  kw = dict(inputs_BxS=jnp.asarray(sources(lengths, 6, seed=5)), mode='beam', beam_size=3,
            max_extra_len=extra, eos_id=eos_id)
  model, params = tiny_model(score, max_len=max_len)
  full = np.asarray(decode_jit(model=model, params=params, **kw))
  lengths_out = (full != 0).sum(1)
  assert len(set(lengths_out)) > 3, lengths_out  # Items stop unevenly.
  for refill in refills:
    np.testing.assert_array_equal(
        np.asarray(decode_jit(model=model, params=params, refill=refill, **kw)), full)
  assert not full[lengths.index(0)].any()


def test_a_refill_that_cannot_be_done_is_refused():
  """Refilling needs the lineage (track_beams), beam search's one way of spending
  its finished rows at a time, and a model that restarts rows."""
  model, params = tiny_model()
  kw = dict(params=params, inputs_BxS=jnp.asarray(sources([1, 6, 2], 6)), mode='beam',
            beam_size=3)
  with pytest.raises(NotImplementedError, match='lineage'):
    decode_jit(model=tiny_model(track_beams=False)[0], max_extra_len=2, eos_id=8, refill=2,
               **kw)
  with pytest.raises(ValueError, match='compact .* and refill'):
    decode_jit(model=model, max_extra_len=2, eos_id=8, refill=2, compact=1, **kw)
  with pytest.raises(ValueError, match='ToyDecoding cannot restart decoding rows'):
    decode.encode_and_decode(ToyDecoding(), None, kw['inputs_BxS'], mode='beam', beam_size=2,
                             refill=2)


def test_a_refill_the_model_cannot_do_is_named_with_the_value_given_before_compiling(
    monkeypatch):
  """inference.decode_ids on the RNN with refill = 3: the error quotes 3, not the
  items a batch of tokens_per_batch holds (8 here), which each decode is given
  instead; and it comes before any program is compiled (the parameters are not
  even needed)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from transformer import inference, sharding, state as state_lib  # pylint: disable=g-import-not-at-top
  model = state_lib.make_model(ModelConfig(input_vocab_size=V, output_vocab_size=V,
                                           num_layers=1, d_model=8, architecture='rnn'))
  config = ml_collections.ConfigDict({'data': {'tokens_per_batch': 64, 'max_length': 8},
                                      'decode': {'concurrent_batches': 1}})
  src = np.array([5, 6, 7, 8, EOS], np.int32)
  monkeypatch.setattr(inference, '_COMPILED', {})
  with pytest.raises(ValueError, match=r'^refill=3: RNNDecoding cannot restart decoding rows'):
    inference.decode_ids(model, None, [(src, src[-1:])] * 30, config, sharding.make_mesh(),
                         mode='beam', beam_size=2, tokens_per_batch=64, refill=3)
  assert not inference._COMPILED  # pylint: disable=protected-access
  assert decode.restarts_rows(TransformerDecoding) and not decode.restarts_rows(ToyDecoding())


def test_the_settings_checks_name_the_architectures_whose_decoding_refills():
  """config.REFILLING_ARCHITECTURES (what check_config and evaluate's and
  translate's settings check read) agrees with the decoding classes."""
  from transformer import config as config_lib, state as state_lib  # pylint: disable=g-import-not-at-top
  assert set(config_lib.REFILLING_ARCHITECTURES) == {
      name for name, (_, decoding) in state_lib.ARCHITECTURES.items()
      if decode.restarts_rows(decoding)}


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])  # Keys [.., K, steps] / [.., steps, K].
@pytest.mark.parametrize('t, old, new', [(3, 5, 9), (23, 5, 9), (23, 9, 5), (7, 9, 5)])
def test_model_ring_keeps_the_last_steps_in_their_slots(t, old, new, dtype):
  """TransformerDecoding.ring (refilling beam search's cache, step t in slot
  t mod length): the keys, values and lineage of the last min(old, new) steps
  written before step t move to their slots in the new ring; the other slots
  are empty. Each slot's keys and values here are the step that wrote them,
  plus 1; its lineage, whether that is odd."""
  model, params = tiny_model(dtype=dtype)

  @jax.jit  # One program, not each operation compiled on its own.
  def beams_cache(params, inputs_BxS):
    _, cache = model.init_state(params, model.encode(params, inputs_BxS), inputs_BxS, old)
    return model.beams(jax.tree.map(lambda x: x if x.ndim == 0 else jnp.repeat(x, 2, axis=0),
                                    cache), 2)

  flat = traverse_util.flatten_dict(beams_cache(params, jnp.asarray(sources([3, 2], 4))))

  def held(length, first):  # Slot s holds the last step before t that is s mod length.
    written = t - 1 - (t - 1 - np.arange(length)) % length
    return np.where(written >= first, written + 1, 0)

  def filled(path, x, stamps):
    axis = 3 if path[-1] == 'cached_key' and attention.beam_keys_transposed(x.dtype) else 2
    shape = [len(stamps) if a == axis else 1 for a in range(x.ndim)]
    stamps = stamps % 2 == 1 if path[-1] == 'lineage' else stamps
    return axis, np.broadcast_to(stamps.reshape(shape), x.shape)

  steps = ('cached_key', 'cached_value', 'lineage')
  flat = {k: (jnp.asarray(filled(k, v, held(old, 0))[1], v.dtype) if k[-1] in steps else v)
          for k, v in flat.items()}
  flat[('decoder', 'step')] = jnp.int32(t)
  ring = jax.jit(model.ring, static_argnums=1)
  got = traverse_util.flatten_dict(ring(traverse_util.unflatten_dict(flat), new))
  for k, v in got.items():
    if k[-1] in steps:
      axis, want = filled(k, v, held(new, max(t - old, 0)))
      assert v.shape[axis] == new
      np.testing.assert_array_equal(np.asarray(v), want.astype(v.dtype), err_msg=str(k))


def test_model_all_pad_rows_emit_nothing():
  """A row with no source tokens only pads a batch: it emits PAD and must not
  keep the loop running (its limit is 0, not max_extra_len); the real row is
  decoded as it is beside a copy of itself (the shapes of SRC_LENGTHS: the
  shared programs)."""
  model, params = tiny_model()
  inputs_BxS = jnp.asarray(sources([3, 0], 6))
  kw = dict(model=model, params=params, max_extra_len=EXTRA, eos_id=M_EOS)
  for mode, beam in (('greedy', {}), ('beam', dict(beam_size=3))):
    ids_BxL = np.asarray(decode_jit(inputs_BxS=inputs_BxS, mode=mode, **kw, **beam))
    twice = np.asarray(decode_jit(inputs_BxS=inputs_BxS[:1].repeat(2, 0), mode=mode, **kw,
                                  **beam))
    np.testing.assert_array_equal(ids_BxL[0], twice[0])
    np.testing.assert_array_equal(twice[1], twice[0])
    assert not ids_BxL[1].any()


def test_model_an_output_limit_near_2_31_is_the_model_s_max_len():
  """max_extra_len 2^31 - 1 (translate --max_extra_len 2147483647): its int32 sum
  with a source length wrapped around, and every output was empty."""
  model, params = tiny_model()
  kw = dict(model=model, params=params, inputs_BxS=jnp.asarray(sources(SRC_LENGTHS, 6)),
            mode='greedy', eos_id=M_EOS)
  want = np.asarray(decode_jit(max_extra_len=model.max_len, **kw))
  assert (want != 0).any()
  np.testing.assert_array_equal(np.asarray(decode_jit(max_extra_len=2**31 - 1, **kw)), want)


def test_model_cache_growth_changes_nothing(monkeypatch):
  """Decoding starts on a cache of first_cache_len steps and pads it to the full
  length if the batch runs past them: the outputs must not depend on where (or
  whether) that happens. With an EOS the model cannot emit, every row runs to
  its limit through the growth: after step 0, at first_cache_len(6) = 14 (the
  shared decode_jit's programs), or never (a first length capped to L)."""
  model, params = tiny_model()
  inputs_BxS = jnp.asarray(sources(SRC_LENGTHS, 6))
  outputs = {}
  for first in (1, None, 100):
    if first is None:
      run = functools.partial(decode_jit, model)
    else:
      monkeypatch.setattr(decode, 'first_cache_len', lambda S, first=first: first)
      run = jax.jit(functools.partial(decode.encode_and_decode, model),
                    static_argnames=('mode', 'max_extra_len', 'beam_size'))
    for mode, eos_id in itertools.product(('greedy', 'beam'), (M_EOS, M_V)):
      beam = dict(beam_size=3) if mode == 'beam' else {}
      outputs.setdefault((mode, eos_id), []).append(np.asarray(
          run(params, inputs_BxS, mode=mode, eos_id=eos_id, max_extra_len=EXTRA, **beam)))
  for (mode, eos_id), (grown_early, grown_late, full) in outputs.items():
    np.testing.assert_array_equal(grown_early, full)
    np.testing.assert_array_equal(grown_late, full)
    if eos_id == M_V:
      assert [int(np.sum(r != 0)) for r in full] == [16, 15]


def test_model_sampling_top1_is_greedy():
  model, params = tiny_model()
  kw = dict(model=model, params=params, inputs_BxS=jnp.asarray(sources(SRC_LENGTHS, 6)),
            max_extra_len=EXTRA, eos_id=M_EOS)
  np.testing.assert_array_equal(
      decode_jit(mode='sample', rng=jax.random.key(3), top_k=1, **kw),
      decode_jit(mode='greedy', **kw))


def test_settings_out_of_range_and_over_long_sources_are_named():
  """A setting out of range is a ValueError naming it before anything runs (a
  negative temperature would sample the least likely token; a negative top_k
  would mean the whole vocabulary); a source longer than the model's positions
  is refused, not decoded from NaN."""
  model, params = tiny_model()
  kw = dict(model=model, params=params, inputs_BxS=jnp.asarray(sources(SRC_LENGTHS, 6)),
            max_extra_len=EXTRA, eos_id=M_EOS, rng=jax.random.key(0))
  for bad, message in [(dict(mode='sample', temperature=-1.0), 'temperature must be'),
                       (dict(mode='sample', temperature=float('nan')), 'temperature must be'),
                       (dict(mode='sample', top_k=-5), 'top_k must be >= 0, got -5'),
                       (dict(mode='beam', beam_size=0), 'beam_size must be >= 1, got 0'),
                       (dict(mode='beam', alpha=-0.5), 'alpha must be'),
                       (dict(mode='greedy', max_extra_len=-3), 'max_extra_len must be >= 0')]:
    with pytest.raises(ValueError, match=message):
      decode.encode_and_decode(**{**kw, **bad})
  # The vocabulary is the logits' width: a top_k over it is named while tracing.
  with pytest.raises(ValueError, match=f'top_k={M_V + 1} is larger than'):
    decode_jit(**{**kw, 'mode': 'sample', 'top_k': M_V + 1})
  too_long = jnp.asarray(sources([17], 17))  # max_len=16 positions.
  with pytest.raises(ValueError, match='17 tokens is longer than config.model.max_len=16'):
    decode.encode_and_decode(**{**kw, 'inputs_BxS': too_long})


def test_the_edges_of_each_settings_range_are_settings_not_errors():
  """alpha 0 (beams ranked by log-probability alone: the length penalty's
  ablation), temperature 0 (the argmax), top_k 0 (the whole vocabulary) and
  max_extra_len 0 are accepted, as the checks' messages (>= 0) say."""
  model, params = tiny_model()
  kw = dict(model=model, params=params, inputs_BxS=jnp.asarray(sources(SRC_LENGTHS, 6)),
            max_extra_len=EXTRA, eos_id=M_EOS, rng=jax.random.key(0))
  # temperature 0 is a Python number (static): the others run the shared programs.
  cold = functools.partial(decode.encode_and_decode, mode='sample', temperature=0.0)
  for run, edge in ((decode_jit, dict(mode='beam', beam_size=3, alpha=0.0)),
                    (jax.jit(cold, static_argnames=('model', 'max_extra_len')), {}),
                    (decode_jit, dict(mode='sample', top_k=0)),
                    (decode_jit, dict(mode='greedy', max_extra_len=0))):
    decode.check_settings(**(edge or dict(mode='sample', temperature=0.0)))
    assert run(**{**kw, **edge}).shape[0] == len(SRC_LENGTHS), edge
