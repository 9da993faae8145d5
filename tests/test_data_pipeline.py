"""Batching: token budget, packing integrity, coverage, determinism, resume, shards, eval."""
import itertools
import json
import time

import ml_collections
import numpy as np
import pytest

from transformer import data as data_lib
from transformer.data import pipeline
from transformer.data.tokenizer import EOS_ID, PAD_ID

N = 300


def _examples(n=N, max_len=40, seed=0):
  """Example i: source starts with token 4+i (so rows identify examples), ends with EOS."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    ls, lt = rng.integers(2, max_len + 1, size=2)
    src = np.concatenate([[4 + i], rng.integers(4, 50, ls - 2), [EOS_ID]]).astype(np.int32)
    tgt = np.concatenate([rng.integers(4, 50, lt - 1), [EOS_ID]]).astype(np.int32)
    out.append((src, tgt))
  return out


EXAMPLES = _examples()
KW = {'bucket': dict(batching='bucket', max_length=40),
      'pack': dict(batching='pack', pack_length=48)}


def _make(mode, tokens=512, seed=1, **kw):
  return pipeline.TrainBatches(EXAMPLES, tokens_per_batch=tokens, seed=seed, **KW[mode], **kw)


def _rows(batch):
  """(example index, source, target) of every example in `batch`, unpacking segments."""
  out = []
  for r in range(batch['inputs'].shape[0]):
    if 'inputs_segmentation' not in batch:
      src, tgt = batch['inputs'][r], batch['targets'][r]
      if src.any():
        out.append((src[0] - 4, src[src != PAD_ID], tgt[tgt != PAD_ID]))
      continue
    segs = [batch[f'{side}_segmentation'][r] for side in ('inputs', 'targets')]
    ids = [set(seg.tolist()) - {0} for seg in segs]
    assert ids[0] == ids[1] == set(range(1, len(ids[0]) + 1))  # Same examples, ids 1..k.
    for k in sorted(ids[0]):
      parts = []
      for side, seg in zip(('inputs', 'targets'), segs):
        where = np.flatnonzero(seg == k)
        assert np.all(np.diff(where) == 1)  # A segment is contiguous ...
        np.testing.assert_array_equal(batch[f'{side}_position'][r, where],
                                      np.arange(len(where)))  # ... and counts from 0.
        parts.append(batch[side][r, where])
      out.append((parts[0][0] - 4, parts[0], parts[1]))
    for side, seg in zip(('inputs', 'targets'), segs):
      assert not batch[side][r][seg == 0].any()  # Outside segments is PAD only.
  return out


def _epoch(it, epoch=0):
  return [next(it) for _ in range(it.num_batches(epoch))]


def _ids(batches):
  return [int(i) for b in batches for i, _, _ in _rows(b)]


def _same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize('mode', ['bucket', 'pack'])
def test_epoch_has_every_example_once_within_budget(mode):
  it = _make(mode, batch_multiple=4)
  batches = _epoch(it)
  assert sorted(_ids(batches)) == list(range(N))
  for b in batches:
    rows, length = b['inputs'].shape
    assert b['targets'].shape == (rows, length)
    assert rows * length <= 512 and rows % 4 == 0
    assert all(v.dtype == np.int32 for v in b.values())
    for i, src, tgt in _rows(b):  # Unpadded content is exactly the example.
      np.testing.assert_array_equal(src, EXAMPLES[i][0])
      np.testing.assert_array_equal(tgt, EXAMPLES[i][1])
  if mode == 'bucket':
    assert {b['inputs'].shape[1] for b in batches} <= set(pipeline.bucket_lengths(40))
  assert it.get_state() == {'epoch': 0, 'index': len(batches), 'num_examples': N,
                            'rows': it.rows()}
  assert sorted(_ids(_epoch(it, 1))) == list(range(N))


@pytest.mark.parametrize('mode', ['bucket', 'pack'])
def test_order_depends_on_seed_and_epoch_only(mode):
  first = _epoch(_make(mode))
  _same(first, _epoch(_make(mode)))
  assert _ids(first) != _ids(_epoch(_make(mode, seed=2)))
  it = _make(mode)
  assert _ids(_epoch(it, 0)) != _ids(_epoch(it, 1))


def test_bucketed_batches_mix_lengths_and_regroup_each_epoch():
  """Section 5.1's batches of about equal lengths, drawn in random order: an
  epoch's batch widths are not bucket by bucket (short to long), and a bucket's
  examples fall into other batches each epoch, not the same groups reshuffled."""
  it = _make('bucket')
  epochs = [_epoch(it, 0), _epoch(it, 1)]
  widths = [b['inputs'].shape[1] for b in epochs[0]]
  assert widths != sorted(widths) and widths != sorted(widths, reverse=True)
  groups = lambda batches: {frozenset(i for i, _, _ in _rows(b)) for b in batches}
  assert groups(epochs[0]) != groups(epochs[1])


@pytest.mark.parametrize('mode', ['bucket', 'pack'])
def test_resume_yields_the_same_batches(mode):
  ref = _make(mode)
  n0 = ref.num_batches(0)
  expected = [next(ref) for _ in range(n0 + 5)]  # Crosses into epoch 1.
  for k in (0, 3, n0 - 1, n0, n0 + 1):
    it = _make(mode)
    for _ in range(k):
      next(it)
    state = json.loads(json.dumps(it.get_state()))
    resumed = _make(mode)
    resumed.set_state(state)
    _same([next(resumed) for _ in range(n0 + 5 - k)], expected[k:])


@pytest.mark.parametrize('mode', ['bucket', 'pack'])
def test_resume_through_prefetch(mode):
  ref = _make(mode)
  expected = [next(ref) for _ in range(12)]
  pre = pipeline.prefetch(_make(mode), 4)
  got = [next(pre) for _ in range(5)]
  time.sleep(0.05)  # Let the thread run ahead: the state must not follow it.
  state = pre.get_state()
  assert state['index'] == 5
  pre.close()
  resumed = pipeline.prefetch(_make(mode), 2)
  resumed.set_state(state)
  _same(got + [next(resumed) for _ in range(7)], expected)
  resumed.close()


class _Stateful:
  """Iterator with get_state, over `items`; an Exception item is raised."""

  def __init__(self, items):
    self.items, self.n = list(items), 0

  def __next__(self):
    if self.n == len(self.items):
      raise StopIteration
    self.n += 1
    if isinstance(self.items[self.n - 1], Exception):
      raise self.items[self.n - 1]
    return self.items[self.n - 1]

  def get_state(self):
    return {'n': self.n}


def test_prefetch_passes_on_end_and_errors():
  pre = pipeline.prefetch(_Stateful([1, 2]), 2)
  assert list(itertools.islice(pre, 5)) == [1, 2]
  pre = pipeline.prefetch(_Stateful([1, ValueError('bad batch'), 3]), 2)
  assert next(pre) == 1
  for _ in range(2):  # Raised again on later calls, never a silent hang.
    with pytest.raises(ValueError, match='bad batch'):
      next(pre)
  assert pre.get_state() == {'n': 1}


@pytest.mark.parametrize('mode', ['bucket', 'pack'])
def test_shards_partition_the_global_batch(mode):
  whole = _epoch(_make(mode, batch_multiple=4))
  parts = [_epoch(_make(mode, batch_multiple=4, shard_index=k, shard_count=2)) for k in (0, 1)]
  for g, a, b in zip(whole, *parts):
    for key in g:
      np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), g[key])


def test_tokens_per_batch_too_small_and_bad_state():
  with pytest.raises(ValueError, match='tokens_per_batch'):
    _make('bucket', tokens=100, batch_multiple=4)  # 4 rows of 40 > 100.
  with pytest.raises(ValueError, match='shard_count'):
    _make('bucket', batch_multiple=3, shard_count=2)
  with pytest.raises(ValueError, match='pack_length'):
    pipeline.TrainBatches(EXAMPLES, tokens_per_batch=512, seed=0, batching='pack',
                          pack_length=16)
  with pytest.raises(ValueError, match='num_examples|data'):
    _make('bucket').set_state({'epoch': 0, 'index': 0, 'num_examples': N + 1})


def test_eval_batches_cover_every_example_once_in_known_rows():
  """Every example once; a partial batch padded to 4 * 2^k rows or a full batch, so
  chunks of a long split reuse a few shapes (each new one is a compilation)."""
  seen = []
  for indices, batch in pipeline.eval_batches(EXAMPLES, 512, batch_multiple=4):
    rows, length = batch['inputs'].shape
    full = 512 // length // 4 * 4
    assert rows * length <= 512 and len(indices) <= rows
    assert rows == full or (rows // 4 in (1, 2, 4, 8, 16, 32) and rows % 4 == 0
                            and rows < 2 * len(indices) + 4), (rows, len(indices), full)
    for r, i in enumerate(indices):
      np.testing.assert_array_equal(batch['inputs'][r, :len(EXAMPLES[i][0])], EXAMPLES[i][0])
      np.testing.assert_array_equal(batch['targets'][r, :len(EXAMPLES[i][1])], EXAMPLES[i][1])
    assert not batch['inputs'][len(indices):].any()  # Filler rows are all PAD.
    assert not batch['targets'][len(indices):].any()
    seen.extend(indices.tolist())
  assert sorted(seen) == list(range(N))


def test_eval_batches_give_a_bucket_too_wide_for_the_budget_one_row_a_device():
  """A budget under one row a device of a bucket's width (a long line late in a
  split; more devices than training had) still evaluates that bucket, in
  batches of batch_multiple rows, instead of stopping after the lines before it."""
  examples = [(np.arange(4, 4 + n, dtype=np.int32), np.array([3], np.int32))
              for n in (3, 30, 5, 29)]
  batches = list(pipeline.eval_batches(examples, 64, batch_multiple=4))
  widths = {tuple(b['inputs'].shape) for _, b in batches}
  assert widths == {(4, 8), (4, 32)}  # 4 rows of 32 exceed 64 tokens: the fewest there can be.
  assert sorted(i for indices, _ in batches for i in indices.tolist()) == [0, 1, 2, 3]


class _CharTokenizer:
  def encode_batch(self, texts):
    return [[4 + ord(c) % 60 for c in t.replace(' ', '')] for t in texts]


def test_tokenize_pairs_drop_truncate_and_empty():
  pairs = [('abc', 'de'), ('abcdefgh', 'x'), ('', 'y'), ('a', ' '), ('ab', 'abcdefg')]
  ex, stats = pipeline.tokenize_pairs(pairs, _CharTokenizer(), 5, 'drop')
  assert stats == {'total': 5, 'kept': 1, 'dropped_empty': 2, 'dropped_overlong': 2,
                   'truncated': 0, 'truncated_sources': 0, 'truncated_targets': 0}
  assert [e.tolist() for e in ex[0]] == [[41, 42, 43, EOS_ID], [44, 45, EOS_ID]]  # ord % 60 + 4
  ex, stats, kept = pipeline.tokenize_pairs(pairs, _CharTokenizer(), 5, 'truncate',
                                            return_kept=True)
  assert (stats['truncated'], stats['kept'], kept) == (2, 3, [0, 1, 4])
  # Pair 1's source was cut, pair 4's target.
  assert (stats['truncated_sources'], stats['truncated_targets']) == (1, 1)
  assert all(len(s) <= 5 and s[-1] == EOS_ID and t[-1] == EOS_ID for s, t in ex)
  # A cut side keeps its beginning (the tokens a decoder is scored on first).
  chars = lambda text: [ord(c) % 60 + 4 for c in text] + [EOS_ID]
  assert [ex[1][0].tolist(), ex[2][1].tolist()] == [chars('abcd'), chars('abcd')]
  assert all(s.dtype == np.int32 for s, _ in ex)
  with pytest.raises(ValueError, match='overlong'):
    pipeline.tokenize_pairs(pairs, _CharTokenizer(), 5, 'clip')
  # An evaluation keeps every pair: an empty side is EOS alone.
  ex, stats, kept = pipeline.tokenize_pairs(pairs, _CharTokenizer(), 5, 'truncate',
                                            return_kept=True, keep_empty=True)
  assert (stats['dropped_empty'], stats['kept'], kept) == (0, 5, [0, 1, 2, 3, 4])
  assert [ex[2][0].tolist(), ex[3][1].tolist()] == [[EOS_ID], [EOS_ID]]


def test_iter_eval_counts_the_truncation_of_the_examples_it_keeps(monkeypatch):
  """--limit N: the stats are those of the first N examples, which are scored."""
  pairs = [('ab', 'c')] + [('abcdefgh', 'x')] * 5  # One short source, five over-long.
  monkeypatch.setattr(data_lib.sources, 'iter_pairs',
                      lambda config, split, chunk, field=None: iter([pairs]))
  config = ml_collections.ConfigDict({'max_length': 5})
  (examples, kept_pairs, stats), = data_lib.iter_eval(config, _CharTokenizer(), 'x', limit=1)
  assert (len(examples), kept_pairs, stats['truncated'], stats['total']) == (1, pairs[:1], 0, 1)
  (examples, _, stats), = data_lib.iter_eval(config, _CharTokenizer(), 'x', limit=3)
  assert (len(examples), stats['truncated']) == (3, 2)


def test_a_position_in_batches_of_other_rows_is_refused_mid_epoch():
  """A saved batch index points into batches of the rows it was saved with: a
  data-parallel size (batch multiple) that gives other rows would skip and
  repeat examples, one that gives the same rows reads the same batches."""
  for mode, same in (('pack', True), ('bucket', False)):
    one, two = _make(mode, batch_multiple=1), _make(mode, batch_multiple=2)
    assert (one.rows() == two.rows()) is same, mode
    next(one); next(one)
    if same:
      two.set_state(one.get_state())
      for _ in range(3):
        _same([next(one)], [next(two)])
    else:
      with pytest.raises(ValueError, match=r"the saved data position, batch 2 of epoch 0, is in "
                         r"batches of \[.*\] rows, and this run's have \[.*\]"):
        two.set_state(one.get_state())
      two.set_state({**one.get_state(), 'index': 0})  # An epoch's start reads alike.
      two.set_state({k: v for k, v in one.get_state().items() if k != 'rows'})  # Older.


def test_bucket_lengths_are_few_and_aligned():
  ladder = pipeline.bucket_lengths(256)
  assert ladder[-1] == 256 and len(ladder) <= 20
  assert all(n % 8 == 0 for n in ladder) and ladder == sorted(set(ladder))
  assert pipeline.bucket_lengths(50)[-1] == 56


def test_a_length_on_a_bucket_boundary_takes_that_bucket():
  """An example of exactly a bucket's width is padded to it, not to the next."""
  buckets, bucket_of = pipeline._buckets(np.array([8, 16, 17, 7]), 40, 'x')  # pylint: disable=protected-access
  assert buckets[bucket_of].tolist() == [8, 16, 24, 8]


def test_an_example_of_exactly_max_length_is_kept_whole():
  """max_length counts EOS: 4 characters + EOS fit max_length=5, on both sides."""
  for overlong in ('drop', 'truncate'):
    ex, stats = pipeline.tokenize_pairs([('abcd', 'wxyz')], _CharTokenizer(), 5, overlong)
    assert (stats['kept'], stats['truncated']) == (1, 0)
    assert [len(side) for side in ex[0]] == [5, 5]


def test_pack_with_shorter_source_rows():
  # Short sources (SCAN commands) need not be padded to the target row length.
  it = _make('pack', pack_source_length=40)
  batches = _epoch(it)
  assert sorted(_ids(batches)) == list(range(N))
  for b in batches:
    assert b['inputs'].shape[1] == 40 and b['targets'].shape[1] == 48
    for i, src, tgt in _rows(b):
      np.testing.assert_array_equal(src, EXAMPLES[i][0])
      np.testing.assert_array_equal(tgt, EXAMPLES[i][1])
  with pytest.raises(ValueError, match=r'packed rows hold 30 and 48 \(config.data.pack_source_length'):
    _make('pack', pack_source_length=30)


def test_pack_with_longer_source_rows():
  # Long sources, short targets: each side fits its own row, and the longer row
  # sets the row count, so neither side holds more than tokens_per_batch.
  rng = np.random.default_rng(3)
  examples = [(np.r_[4 + i, rng.integers(4, 50, rng.integers(1, 59)), EOS_ID].astype(np.int32),
               np.r_[rng.integers(4, 50, rng.integers(1, 20)), EOS_ID].astype(np.int32))
              for i in range(N)]
  it = pipeline.TrainBatches(examples, tokens_per_batch=512, seed=0, batching='pack',
                             pack_length=24, pack_source_length=64)
  batches = [next(it) for _ in range(it.num_batches(0))]
  assert sorted(i for b in batches for i, _, _ in _rows(b)) == list(range(N))
  for b in batches:
    assert b['inputs'].shape == (8, 64) and b['targets'].shape == (8, 24)
    for i, src, tgt in _rows(b):
      np.testing.assert_array_equal(src, examples[i][0])
      np.testing.assert_array_equal(tgt, examples[i][1])


def test_a_pack_too_short_names_the_longest_source_and_target():
  """'an example has 9 source and 6 target tokens' spoke of one example where the
  two figures are the longest of each side, here of two examples."""
  examples = [(np.r_[np.arange(4, 12), EOS_ID].astype(np.int32), np.r_[4, EOS_ID].astype(np.int32)),
              (np.r_[4, EOS_ID].astype(np.int32), np.r_[np.arange(4, 9), EOS_ID].astype(np.int32))]
  with pytest.raises(ValueError, match=r'^the longest source has 9 tokens and the longest '
                     r'target 6; packed rows hold 8 and 8 \(config\.data\.pack_source_length, '
                     r'config\.data\.pack_length\)'):
    pipeline.TrainBatches(examples, tokens_per_batch=64, seed=0, batching='pack', pack_length=8)
