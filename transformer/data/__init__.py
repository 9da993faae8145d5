"""Input pipeline: datasets -> SentencePiece ids -> deterministic, resumable batches.

Entry point for the trainer:

  data = get_train_and_eval(config.data, workdir=..., seed=..., batch_multiple=
                            data-axis devices * config.train.grad_accum_steps,
                            shard_index=jax.process_index(),
                            shard_count=jax.process_count())
  data.tokenizer        # Tokenizer (PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3)
  data.train_batches    # infinite iterator of dicts; get_state()/set_state(dict)
  data.eval_examples    # list of (src_ids, tgt_ids); feed to eval_batches(...)
  data.eval_pairs       # raw (source, target) strings aligned with eval_examples
  data.stats            # {'train': {...}, 'eval': {...}} drop/truncate counts
  get_eval(config.data, data.tokenizer, config.data.test_split)  # another split
  iter_eval(config.data, data.tokenizer, split, chunk)  # the same, chunk by chunk

Modules: scan (SCAN builder), parallel_text (text files), sources (load_pairs),
tokenizer, pipeline (tokenize_pairs, TrainBatches, eval_batches, eval_rows), packing,
prefetch.
"""
import collections
import typing

from absl import logging
import numpy as np

from transformer.data import pipeline
from transformer.data import sources
from transformer.data import tokenizer as tokenizer_lib
from transformer.data.pipeline import TrainBatches, eval_batches, eval_rows, prefetch, tokenize_pairs  # pylint: disable=g-multiple-import
from transformer.data.sources import load_pairs
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer  # pylint: disable=g-multiple-import


class Data(typing.NamedTuple):
  tokenizer: Tokenizer
  train_batches: typing.Any  # TrainBatches, or its Prefetch wrapper.
  eval_examples: list
  eval_pairs: list
  stats: dict


def get_eval(data_config, tokenizer, split, field=None):
  """(examples, raw pairs aligned with them, stats) of an evaluation split (e.g. test_split).

  Overlong examples are truncated, not dropped, so the set stays whole
  (stats['truncated'] counts them, stats['truncated_sources'] and
  stats['truncated_targets'] those whose source, whose target was cut); an empty
  side is kept as EOS alone. `field` is what errors call the split (e.g.
  'config.data.test_split').
  """
  examples, pairs, stats = [], [], collections.Counter()
  for chunk_examples, chunk_pairs, chunk_stats in iter_eval(data_config, tokenizer, split,
                                                            field=field):
    examples += chunk_examples
    pairs += chunk_pairs
    stats.update(chunk_stats)
  return examples, pairs, {k: stats[k] for k in pipeline.STATS}


def iter_eval(data_config, tokenizer, split, chunk=sources.CHUNK, limit=None, field=None):
  """get_eval a chunk of `chunk` pairs at a time, for the first `limit` examples
  (all if None): yields (examples, pairs, stats) of each chunk. `field` as in get_eval."""
  left = limit
  for pairs in sources.iter_pairs(data_config, split, chunk, field=field):
    if left is not None:  # Every pair is kept: the stats count those scored.
      pairs = pairs[:left]
      left -= len(pairs)
    yield _eval_examples(data_config, tokenizer, pairs)
    if left == 0:
      return


def _eval_examples(data_config, tokenizer, pairs):
  """(examples, the pairs they are of, stats) of evaluation pairs, as get_eval gives them."""
  examples, stats, kept = tokenize_pairs(pairs, tokenizer, data_config.max_length, 'truncate',
                                         return_kept=True, keep_empty=True)
  return examples, [pairs[i] for i in kept], stats


DROP_WARNING = 0.01  # The share of training pairs dropped that is warned of.


def _warn_of_drops(stats, data_config) -> None:
  """A warning where a setting (or the data) drops a noticeable share of the
  training pairs, which the data stats' INFO line alone would leave unseen."""
  total = stats['total']
  for key, why, fix in (
      ('dropped_overlong', f'longer than data.max_length={data_config.max_length} tokens '
       f"(data.overlong={data_config.overlong!r})", "raise data.max_length, or set "
       "data.overlong='truncate' to keep them cut"),
      ('dropped_empty', 'with a side that encodes to no tokens', 'check the data')):
    if stats[key] and stats[key] >= DROP_WARNING * total:
      logging.warning('Training drops %d of the %d pairs of split %r (%.1f%%) as %s; %s.',
                      stats[key], total, data_config.train_split, 100 * stats[key] / total,
                      why, fix)


UNK_WARNING = 0.01  # The share of a side's training tokens read as UNK that is warned of.
UNK_SAMPLE = 100_000  # Examples it is measured on, evenly spaced: plenty for a 1% threshold.


def _warn_of_unknowns(examples, data_config, workdir) -> None:
  """A warning where a side of the training examples is more than a little UNK:
  a data.vocab_path vocabulary of other text (a word vocabulary has no byte
  pieces to spell what it lacks) turns most of it into UNK without a word. The
  share is of evenly spaced examples, UNK_SAMPLE at most: all of WMT's 4.5M
  would cost seconds and a gigabyte a side for the same warning."""
  path = tokenizer_lib.vocabulary_path(data_config, workdir)
  external = data_config.get('vocab_path')
  hint = ' (config.data.vocab_path): is it of other text?' if external else ''
  sample = examples[::-(-len(examples) // UNK_SAMPLE)]
  for side, name in enumerate(('source', 'target')):
    ids = np.concatenate([example[side] for example in sample])
    share = np.count_nonzero(ids == UNK_ID) / (ids.size - len(sample))  # Less the EOS.
    if share >= UNK_WARNING:
      logging.warning('%.1f%% of the %s tokens of training split %r (%s) are UNK to the '
                      'vocabulary %s%s', 100 * share, name, data_config.train_split,
                      data_config.get(f'{name}_lang'), path, hint)


def get_train_and_eval(data_config, *, workdir, seed, batch_multiple=1,
                       shard_index=0, shard_count=1):
  """Loads train and eval splits, gets the tokenizer (load_or_train), builds the train iterator.

  The tokenizer is trained on the train split only; eval data as in `get_eval`.
  Both splits are read (a bad line is an error) before a vocabulary is trained
  and saved to the workdir, so that a run that cannot start leaves no vocabulary
  behind.
  """
  train_pairs = sources.load_pairs(data_config, data_config.train_split,
                                   field='config.data.train_split')
  if not train_pairs:  # Else the vocabulary's "no text to train on" would name no split.
    raise ValueError(f'no training examples in split {data_config.train_split!r} of '
                     f'{sources.describe(data_config)}: the split is empty '
                     '(config.data.train_split)')
  eval_pairs = sources.load_pairs(data_config, data_config.eval_split,
                                  field='config.data.eval_split')
  if not eval_pairs:  # Evaluation during training would fail after a run's worth of steps.
    raise ValueError(f'eval split {data_config.eval_split!r} of {data_config.dataset} has no '
                     'examples (config.data.eval_split)')
  tok = tokenizer_lib.load_or_train(
      data_config, workdir, (text for pair in train_pairs for text in pair))
  train_examples, train_stats = tokenize_pairs(
      train_pairs, tok, data_config.max_length, data_config.overlong)
  if not train_examples:
    raise ValueError(
        f'no training examples in split {data_config.train_split!r} of {data_config.dataset}: '
        f'of its {train_stats["total"]} pairs, {train_stats["dropped_overlong"]} are longer '
        f'than data.max_length={data_config.max_length} tokens (data.overlong='
        f'{data_config.overlong!r}) and {train_stats["dropped_empty"]} have an empty side')
  _warn_of_drops(train_stats, data_config)
  _warn_of_unknowns(train_examples, data_config, workdir)
  eval_examples, eval_pairs, eval_stats = _eval_examples(data_config, tok, eval_pairs)
  if eval_stats['truncated_targets']:  # As evaluate warns: eval/loss is not of whole references.
    logging.warning('%d of the %d references of eval split %r are longer than '
                    'data.max_length=%d tokens: training\'s eval loss and perplexity score '
                    'them cut there.', eval_stats['truncated_targets'], len(eval_examples),
                    data_config.eval_split, data_config.max_length)
  batches = TrainBatches(
      train_examples, tokens_per_batch=data_config.tokens_per_batch, seed=seed,
      batching=data_config.batching, max_length=data_config.max_length,
      pack_length=data_config.get('pack_length'),
      pack_source_length=data_config.get('pack_source_length'), batch_multiple=batch_multiple,
      shard_index=shard_index, shard_count=shard_count)
  return Data(tokenizer=tok,
              train_batches=prefetch(batches, data_config.get('prefetch', 0)),
              eval_examples=eval_examples,
              eval_pairs=eval_pairs,
              stats={'train': train_stats, 'eval': eval_stats})


__all__ = ['BOS_ID', 'Data', 'EOS_ID', 'PAD_ID', 'Tokenizer', 'TrainBatches', 'UNK_ID',
           'eval_batches', 'eval_rows', 'get_eval', 'get_train_and_eval', 'iter_eval', 'load_pairs', 'pipeline', 'prefetch',
           'tokenize_pairs']
