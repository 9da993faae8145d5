"""Deterministic, checkpointable batching in pure numpy (no tf.data, so resume is exact).

Token budget (bucket mode): a batch of B rows in bucket L has `inputs` [B, L]
and `targets` [B, L] (one padded length for both sides, so jit sees one shape
per bucket) with B * L <= tokens_per_batch: the budget bounds source tokens and
target tokens separately, each side at most tokens_per_batch (as in the paper,
~25000 source + ~25000 target tokens per step). In pack mode B rows of
pack_length target and pack_source_length source tokens, with B times the
longer of the two <= tokens_per_batch likewise.

Pack mode adds `inputs_segmentation`/`targets_segmentation` (1, 2, ... per
example in a row, 0 on padding) and `inputs_position`/`targets_position` (0, 1,
... within each example, 0 on padding). Eval batches are never packed.

Budgets and row counts are global (all hosts): `batch_multiple` is the global
number of data-parallel devices and must be divisible by `shard_count`; host k
(`shard_index`) keeps the contiguous rows [k * B/shard_count, (k+1) * B/shard_count).

Every batch has the same row count within its bucket: an epoch's last partial
batch of each bucket is filled with all-PAD rows, so the loss must be weighted
by `targets != PAD_ID` (it has to be anyway for padding).
"""
import numpy as np

from transformer.data import packing
from transformer.data.prefetch import prefetch  # pylint: disable=unused-import
from transformer.config import BATCHING, EOS_ID, OVERLONG, PAD_ID  # pylint: disable=g-multiple-import

BUCKET_STEP = 8  # Padded lengths are multiples of 8 (friendly to accelerator tiles).
BUCKET_GROWTH = 1.125  # Above 64, buckets grow ~12.5%: few shapes, < ~12.5% padding.


# The counts tokenize_pairs reports.
# truncated: examples cut on either side; truncated_sources, truncated_targets:
# those whose source, whose target was.
STATS = ('total', 'kept', 'dropped_empty', 'dropped_overlong', 'truncated', 'truncated_sources',
         'truncated_targets')


def tokenize_pairs(pairs, tokenizer, max_length, overlong='drop', return_kept=False,
                   keep_empty=False):
  """Encodes (source, target) strings into int32 id arrays, each ending with EOS.

  `max_length` counts EOS. Overlong examples are dropped or truncated (keeping
  EOS last). An example whose source or target encodes to no ids (an empty
  string; a text of U+2581 alone) is dropped, or with `keep_empty` kept with EOS
  alone on that side, so that an evaluation scores every reference. Returns
  (examples, stats), plus the indices of kept pairs if `return_kept`.
  """
  if overlong not in OVERLONG:
    raise ValueError(f'overlong must be one of {OVERLONG}, got {overlong!r}')
  if max_length < 2:
    raise ValueError(f'max_length must be >= 2 (one token plus EOS), got {max_length}')
  pairs = list(pairs)
  src_ids = tokenizer.encode_batch([p[0] for p in pairs])
  tgt_ids = tokenizer.encode_batch([p[1] for p in pairs])
  stats = dict.fromkeys(STATS, 0)
  stats['total'] = len(pairs)
  examples, kept = [], []
  for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
    if (not s or not t) and not keep_empty:
      stats['dropped_empty'] += 1
      continue
    if max(len(s), len(t)) + 1 > max_length:
      if overlong == 'drop':
        stats['dropped_overlong'] += 1
        continue
      stats['truncated'] += 1
      stats['truncated_sources'] += len(s) + 1 > max_length
      stats['truncated_targets'] += len(t) + 1 > max_length
      s, t = s[:max_length - 1], t[:max_length - 1]
    examples.append((np.array(s + [EOS_ID], np.int32), np.array(t + [EOS_ID], np.int32)))
    kept.append(i)
  stats['kept'] = len(examples)
  return (examples, stats, kept) if return_kept else (examples, stats)


def bucket_lengths(max_length):
  """Padded lengths: multiples of 8 up to 64, then ~12.5% apart, up to max_length (rounded up to 8)."""
  top = -(-max_length // BUCKET_STEP) * BUCKET_STEP
  out, n = [], BUCKET_STEP
  while n < top:
    out.append(n)
    n = max(n + BUCKET_STEP, -(-int(n * BUCKET_GROWTH) // BUCKET_STEP) * BUCKET_STEP)
  return out + [top]


def _rows_for(length, tokens_per_batch, batch_multiple, at_least_one_each=False):
  """Rows of a batch of padded `length`: a multiple of batch_multiple within the
  budget. Under one row a device, an error; or with at_least_one_each (batches
  that only evaluate), batch_multiple rows over the budget, the fewest there can be."""
  rows = (tokens_per_batch // length) // batch_multiple * batch_multiple
  if rows < batch_multiple:
    if at_least_one_each:
      return batch_multiple
    raise ValueError(f'tokens_per_batch={tokens_per_batch} is too small: a batch of padded '
                     f'length {length} needs at least batch_multiple={batch_multiple} rows '
                     '(the data-parallel devices times train.grad_accum_steps), '
                     f'i.e. tokens_per_batch >= {length * batch_multiple}')
  return rows


def eval_rows(length, tokens_per_batch, batch_multiple=1):
  """Rows of a full eval_batches batch of padded `length`."""
  return _rows_for(length, tokens_per_batch, batch_multiple, True)


def _buckets(lengths, max_length, what):
  """(padded lengths, each example's bucket index); an example too long for the
  largest bucket is an error naming `what`."""
  buckets = np.array(bucket_lengths(max_length or int(lengths.max())))
  if lengths.max() > buckets[-1]:
    raise ValueError(f'{what} has {lengths.max()} tokens > max_length={max_length}')
  return buckets, np.searchsorted(buckets, lengths)


def _bucket_chunks(buckets, bucket_of, tokens_per_batch, batch_multiple, order=None,
                   at_least_one_each=False):
  """Yields (padded length, example indices) of each batch, bucket by bucket; a
  bucket's examples come in index order, or in `order(indices)`."""
  for b, length in enumerate(buckets.tolist()):
    idx = np.flatnonzero(bucket_of == b)
    idx = (idx if order is None else order(idx)).tolist()
    if idx:
      rows = _rows_for(length, tokens_per_batch, batch_multiple, at_least_one_each)
      for start in range(0, len(idx), rows):
        yield length, idx[start:start + rows]


def _lengths(examples):
  src = np.array([len(e[0]) for e in examples], np.int64)
  tgt = np.array([len(e[1]) for e in examples], np.int64)
  return src, tgt


def _padded_batch(examples, rows, length):
  """{'inputs', 'targets'} [len(rows), length]; row index -1 is an all-PAD row."""
  out = {k: np.full((len(rows), length), PAD_ID, np.int32) for k in ('inputs', 'targets')}
  for r, i in enumerate(rows):
    if i >= 0:
      src, tgt = examples[i]
      out['inputs'][r, :len(src)] = src
      out['targets'][r, :len(tgt)] = tgt
  return out


def _fill(rows, count, filler):
  return list(rows) + [filler] * (count - len(rows))


class TrainBatches:
  """Infinite iterator of training batches; each epoch's order depends only on (seed, epoch).

  State is {'epoch', 'index', 'num_examples'} (JSON-serialisable): `index` is
  the number of batches of `epoch` already handed out.
  """

  def __init__(self, examples, *, tokens_per_batch, seed, batching='bucket',
               max_length=None, pack_length=None, pack_source_length=None,
               batch_multiple=1,
               shard_index=0, shard_count=1):
    if not examples:
      raise ValueError('no training examples')
    if batching not in BATCHING:
      raise ValueError(f'batching must be one of {BATCHING}, got {batching!r}')
    if batch_multiple % shard_count or not 0 <= shard_index < shard_count:
      raise ValueError(f'need batch_multiple ({batch_multiple}) divisible by shard_count '
                       f'({shard_count}) and 0 <= shard_index ({shard_index}) < shard_count')
    self._examples = examples
    self._seed = seed
    self._mode = batching
    self._shard = (shard_index, shard_count)
    self._src_lens, self._tgt_lens = _lengths(examples)
    if batching == 'pack':
      if not pack_length:
        raise ValueError("batching='pack' needs pack_length")
      self._source_pack_length = pack_source_length or pack_length
      longest_source, longest_target = int(self._src_lens.max()), int(self._tgt_lens.max())
      if longest_target > pack_length or longest_source > self._source_pack_length:
        raise ValueError(
            f'the longest source has {longest_source} tokens and the longest target '
            f'{longest_target}; packed rows hold {self._source_pack_length} and {pack_length} '
            '(config.data.pack_source_length, config.data.pack_length): raise those, or '
            'lower config.data.max_length to at most both')
      self._pack_length = pack_length
      # The longer row bounds each side's tokens by tokens_per_batch.
      self._rows = _rows_for(max(pack_length, self._source_pack_length), tokens_per_batch,
                             batch_multiple)
    else:
      self._buckets, self._bucket_of = _buckets(
          np.maximum(self._src_lens, self._tgt_lens), max_length, 'an example')
      _rows_for(int(self._buckets[-1]), tokens_per_batch, batch_multiple)  # Fails now, not later.
      self._batching = (tokens_per_batch, batch_multiple)
    self._epoch, self._index = 0, 0
    self._plans = {}  # epoch -> plan

  def _epoch_plan(self, epoch):
    """The epoch's global batches: (padded length, row entries) per batch."""
    if epoch not in self._plans:
      for old in [e for e in self._plans if e != self._epoch]:
        del self._plans[old]  # Keep the current epoch's plan and at most one other.
      rng = np.random.default_rng([self._seed, epoch])
      self._plans[epoch] = (self._pack_plan(rng) if self._mode == 'pack'
                            else self._bucket_plan(rng))
    return self._plans[epoch]

  def _bucket_plan(self, rng):
    plan = [(length, _fill(chunk, _rows_for(length, *self._batching), -1))
            for length, chunk in _bucket_chunks(self._buckets, self._bucket_of,
                                                *self._batching, order=rng.permutation)]
    # Shuffle across buckets so consecutive steps see different lengths.
    return [plan[i] for i in rng.permutation(len(plan))]

  def _pack_plan(self, rng):
    rows = packing.pack_rows(rng.permutation(len(self._examples)),
                             self._src_lens, self._tgt_lens, self._pack_length,
                             source_pack_length=self._source_pack_length)
    n = self._rows
    return [(self._pack_length, _fill(rows[s:s + n], n, [])) for s in range(0, len(rows), n)]

  def num_batches(self, epoch):
    """Number of batches in `epoch` (bucket mode: the same every epoch)."""
    return len(self._epoch_plan(epoch))

  def __iter__(self):
    return self

  def __next__(self):
    if self._index >= len(self._epoch_plan(self._epoch)):
      self._epoch, self._index = self._epoch + 1, 0
    length, rows = self._epoch_plan(self._epoch)[self._index]
    self._index += 1
    k, count = self._shard
    per_host = len(rows) // count
    rows = rows[k * per_host:(k + 1) * per_host]
    if self._mode == 'pack':
      return packing.packed_batch(self._examples, rows, length, self._source_pack_length)
    return _padded_batch(self._examples, rows, length)

  def rows(self):
    """Rows per batch (pack mode), or of each bucket's batches: what an epoch's
    batches, and so a batch index into them, depend on beyond the data and the
    seed (tokens_per_batch and the batch multiple set them)."""
    if self._mode == 'pack':
      return [self._rows]
    return [_rows_for(int(length), *self._batching) for length in self._buckets]

  def get_state(self):
    return {'epoch': self._epoch, 'index': self._index,
            'num_examples': len(self._examples), 'rows': self.rows()}

  def set_state(self, state):
    if state.get('num_examples', len(self._examples)) != len(self._examples):
      raise ValueError(f"state is for {state['num_examples']} examples, this pipeline has "
                       f'{len(self._examples)}: the data or its preprocessing changed')
    epoch, index = int(state['epoch']), int(state['index'])
    # A position saved before 'rows' was recorded is taken as it is.
    if index and state.get('rows', self.rows()) != self.rows():
      raise ValueError(
          f"the saved data position, batch {index} of epoch {epoch}, is in batches of "
          f"{state['rows']} rows, and this run's have {self.rows()} (data.tokens_per_batch, "
          "the data-parallel size or train.grad_accum_steps differ): resuming mid-epoch "
          "would skip and repeat examples. Resume with the settings it was saved with, "
          "or from an epoch's start, or use a new --workdir")
    if epoch < 0 or not 0 <= index <= len(self._epoch_plan(epoch)):
      raise ValueError(f'invalid pipeline state {state}')
    self._epoch, self._index = epoch, index


def eval_batches(examples, tokens_per_batch, batch_multiple=1, max_length=None):
  """Yields (indices, batch) covering every example once, bucketed by length, in a fixed order.

  `indices` are the example indices of the batch's first len(indices) rows; the
  remaining rows are all PAD. A bucket's last, partial batch is padded to
  batch_multiple * 2^k rows (at most a full batch), so the batches of every chunk
  of a long split share a few shapes: each new shape is another compiled program
  held in memory by whoever runs them (evaluate's loss and decoding). A bucket
  too wide for one row a device within tokens_per_batch gets one row a device:
  a long line late in a split (or more devices than training had) is evaluated,
  not an error after the lines before it.
  """
  if not examples:
    return
  buckets, bucket_of = _buckets(np.maximum(*_lengths(examples)), max_length,
                                'an eval example')
  for length, chunk in _bucket_chunks(buckets, bucket_of, tokens_per_batch, batch_multiple,
                                      at_least_one_each=True):
    full, padded = eval_rows(length, tokens_per_batch, batch_multiple), batch_multiple
    while padded < len(chunk):
      padded *= 2
    padded = max(len(chunk), min(padded, full))
    yield np.array(chunk, np.int64), _padded_batch(examples, _fill(chunk, padded, -1), length)
