"""Packing several examples into fixed-length rows (first fit over a window of open rows)."""
import numpy as np

from transformer.config import PAD_ID

# Rows kept open for first fit. A wider window packs tighter but costs a Python
# scan per example; 32 already leaves little padding for sentence-length data.
PACK_WINDOW = 32
MIN_EXAMPLE_LENGTH = 2  # One token plus EOS: a row with less room left is full.


def pack_rows(order, src_lens, tgt_lens, pack_length, window=PACK_WINDOW,
              source_pack_length=None):
  """Groups example indices (taken in `order`) into rows; returns a list of index lists.

  An example occupies one row on both sides: it goes into the first open row
  where both its source and its target still fit. Source rows hold
  `source_pack_length` tokens (default: `pack_length`, the target rows' length).
  Rows come out in the order they were closed, so the result depends only on `order`.
  """
  source_pack_length = source_pack_length or pack_length
  done, open_rows = [], []  # open_rows: [indices, source room, target room]
  for i in order.tolist():
    ls, lt = int(src_lens[i]), int(tgt_lens[i])
    for r, row in enumerate(open_rows):
      if row[1] >= ls and row[2] >= lt:
        row[0].append(i)
        row[1] -= ls
        row[2] -= lt
        if row[1] < MIN_EXAMPLE_LENGTH or row[2] < MIN_EXAMPLE_LENGTH:
          done.append(open_rows.pop(r)[0])
        break
    else:
      if len(open_rows) == window:
        done.append(open_rows.pop(0)[0])
      open_rows.append([[i], source_pack_length - ls, pack_length - lt])
  done.extend(row[0] for row in open_rows)
  return done


def _pack_side(seqs, rows, pack_length):
  """(tokens, segmentation, position) arrays [len(rows), pack_length] for one side."""
  tokens = np.full((len(rows), pack_length), PAD_ID, np.int32)
  seg = np.zeros((len(rows), pack_length), np.int32)
  pos = np.zeros((len(rows), pack_length), np.int32)
  for r, row in enumerate(rows):
    start = 0
    for k, i in enumerate(row):
      n = len(seqs[i])
      tokens[r, start:start + n] = seqs[i]
      seg[r, start:start + n] = k + 1
      pos[r, start:start + n] = np.arange(n)
      start += n
  return tokens, seg, pos


def packed_batch(examples, rows, pack_length, source_pack_length=None):
  """Batch dict for `rows` (lists of example indices; [] is an all-padding row)."""
  src, src_seg, src_pos = _pack_side(_Side(examples, 0), rows,
                                     source_pack_length or pack_length)
  tgt, tgt_seg, tgt_pos = _pack_side(_Side(examples, 1), rows, pack_length)
  return {'inputs': src, 'targets': tgt,
          'inputs_segmentation': src_seg, 'targets_segmentation': tgt_seg,
          'inputs_position': src_pos, 'targets_position': tgt_pos}


class _Side:
  """View of one side (0: source, 1: target) of the examples, without copying."""

  def __init__(self, examples, side):
    self._examples, self._side = examples, side

  def __getitem__(self, i):
    return self._examples[i][self._side]
