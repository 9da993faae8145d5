"""Parallel text files: reading, and errors that name the file and 1-based line."""
import gzip
import logging
import os
import pathlib
import re

import ml_collections
import pytest

from transformer.data import parallel_text
from transformer.data import sources

MULTI30K = pathlib.Path(os.environ.get(
    'MULTI30K_DIR', pathlib.Path(__file__).resolve().parents[2] / 'shared/data/multi30k'))


def _write(path, data, gz=False):
  if isinstance(data, str):
    data = data.encode('utf-8')
  path = pathlib.Path(str(path) + ('.gz' if gz else ''))
  path.write_bytes(gzip.compress(data) if gz else data)
  return str(path)


def test_reads_plain_and_gzip_pairs(tmp_path):
  _write(tmp_path / 'train.en', 'A dog .\r\n Two cats \nfinal line')
  _write(tmp_path / 'train.de', 'Ein Hund .\nZwei Katzen\nletzte Zeile\n', gz=True)
  pairs = parallel_text.load_split(str(tmp_path), 'train', 'en', 'de')
  assert pairs == [('A dog .', 'Ein Hund .'), ('Two cats', 'Zwei Katzen'),
                   ('final line', 'letzte Zeile')]
  config = ml_collections.ConfigDict({'dataset': 'parallel_text', 'text_dir': str(tmp_path),
                                      'source_lang': 'de', 'target_lang': 'en'})
  assert sources.load_pairs(config, 'train')[1] == ('Zwei Katzen', 'Two cats')


def test_chunks_are_read_as_asked_for(tmp_path):
  """iter_pairs (what evaluate streams through) yields the same pairs in chunks,
  and a bad line stops it only when its chunk is read, naming file and line."""
  _write(tmp_path / 'test.en', ''.join(f'line {i}\n' for i in range(1, 6)) + '\n', gz=True)
  _write(tmp_path / 'test.de', ''.join(f'Zeile {i}\n' for i in range(1, 7)))
  config = ml_collections.ConfigDict({'dataset': 'parallel_text', 'text_dir': str(tmp_path),
                                      'source_lang': 'en', 'target_lang': 'de'})
  chunks = sources.iter_pairs(config, 'test', chunk=2)
  assert next(chunks) == [('line 1', 'Zeile 1'), ('line 2', 'Zeile 2')]
  assert next(chunks) == [('line 3', 'Zeile 3'), ('line 4', 'Zeile 4')]
  with pytest.raises(ValueError, match=r'test\.en\.gz:6: empty line'):
    next(chunks)
  _write(tmp_path / 'val.en', 'a\nb\nc\n')
  _write(tmp_path / 'val.de', 'A\nB\nC\n')
  assert [len(c) for c in sources.iter_pairs(config, 'val', chunk=2)] == [2, 1]
  assert sum(sources.iter_pairs(config, 'val', chunk=2), []) == sources.load_pairs(config, 'val')
  with pytest.raises(ValueError, match='chunk must be >= 1'):
    next(sources.iter_pairs(config, 'val', chunk=0))


def test_empty_line_names_file_and_line(tmp_path):
  _write(tmp_path / 'val.en', 'one\ntwo\n \nfour\n')
  path = _write(tmp_path / 'val.de', 'eins\nzwei\ndrei\nvier\n', gz=True)
  with pytest.raises(ValueError, match=r'val\.en:3: empty line'):
    parallel_text.load_split(str(tmp_path), 'val', 'en', 'de')
  del path


def test_mismatched_line_counts_name_file_and_line(tmp_path):
  _write(tmp_path / 'test.en', 'one\ntwo\n')
  de = _write(tmp_path / 'test.de', 'eins\nzwei\ndrei\n', gz=True)
  with pytest.raises(ValueError) as e:
    parallel_text.load_split(str(tmp_path), 'test', 'en', 'de')
  assert f'{de}:3:' in str(e.value) and 'test.en has only 2 lines' in str(e.value)


def test_non_utf8_line_names_file_and_line(tmp_path):
  en = _write(tmp_path / 'train.en', b'ok\nfine\ncaf\xe9\n', gz=True)
  _write(tmp_path / 'train.de', 'a\nb\nc\n')
  with pytest.raises(ValueError, match=rf'{en}:3: line is not valid UTF-8'):
    parallel_text.load_split(str(tmp_path), 'train', 'en', 'de')


def test_corrupt_gzip_names_file(tmp_path):
  _write(tmp_path / 'train.en', 'a\nb\n')
  de = tmp_path / 'train.de.gz'
  de.write_bytes(gzip.compress(b'x\ny\n')[:-6])
  with pytest.raises(ValueError, match='train.de.gz'):
    parallel_text.load_split(str(tmp_path), 'train', 'en', 'de')


def test_missing_and_ambiguous_files(tmp_path):
  _write(tmp_path / 'train.en', 'a\n')
  with pytest.raises(FileNotFoundError, match=r'train\.fr\.gz'):
    parallel_text.load_split(str(tmp_path), 'train', 'en', 'fr')
  _write(tmp_path / 'train.en', 'a\n', gz=True)
  with pytest.raises(ValueError, match='both'):
    parallel_text.find_file(str(tmp_path), 'train', 'en')
  config = ml_collections.ConfigDict({'dataset': 'parallel_text', 'text_dir': '',
                                      'source_lang': 'en', 'target_lang': 'de'})
  with pytest.raises(ValueError, match='text_dir'):
    sources.load_pairs(config, 'train')


@pytest.mark.skipif(not (MULTI30K / 'val.de.gz').exists(), reason=f'{MULTI30K} absent')
def test_multi30k_validation_split():
  pairs = parallel_text.load_split(str(MULTI30K), 'val', 'en', 'de')
  assert len(pairs) == 1014
  assert all(s and t for s, t in pairs)


def test_carriage_return_line_ends_are_named(tmp_path):
  """CR alone (old Mac line ends) made each file one line, and a SentencePiece
  traceback followed; CRLF reads as LF."""
  _write(tmp_path / 'train.en', 'a dog\rtwo cats\r')
  _write(tmp_path / 'train.de', 'ein Hund\rzwei Katzen\r')
  with pytest.raises(ValueError, match=r'train\.en:1: lines end in a carriage return'):
    parallel_text.load_split(str(tmp_path), 'train', 'en', 'de')
  # With a final LF (as editors add) the file was one line, read without a word:
  # a line of two or more CRs, or a file's only line with one, is refused too.
  for en, de in (('a dog\rtwo cats\rthree\n', 'ein Hund\rzwei Katzen\rdrei\n'),
                 ('a dog\rtwo cats\n', 'ein Hund\rzwei Katzen\n'),
                 ('a dog\nthe cat\rtwo cats\rthree\n', 'ein Hund\nx\ny\nz\n')):
    _write(tmp_path / 'train.en', en)
    _write(tmp_path / 'train.de', de)
    with pytest.raises(ValueError, match=r'train\.en:\d: lines end in a carriage return'):
      parallel_text.load_split(str(tmp_path), 'train', 'en', 'de')
  # A stray CR inside a line of an LF file stays part of the line.
  _write(tmp_path / 'train.en', 'a dog\rbarks\ntwo cats\n')
  _write(tmp_path / 'train.de', 'ein Hund\nzwei Katzen\n')
  assert parallel_text.load_split(str(tmp_path), 'train', 'en', 'de')[0] == (
      'a dog\rbarks', 'ein Hund')


def test_a_split_whose_every_pair_is_too_long_says_so(tmp_path):
  """Every training pair over data.max_length (dropped): the error counts them and
  names the field, not just 'no training examples'."""
  from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
  _write(tmp_path / 'train.en', 'a b c d e f\ng h i j k l\n')
  _write(tmp_path / 'train.de', 'A B C D E F\nG H I J K L\n')
  config = ml_collections.ConfigDict({
      'dataset': 'parallel_text', 'text_dir': str(tmp_path), 'source_lang': 'en',
      'target_lang': 'de', 'train_split': 'train', 'eval_split': 'train', 'max_length': 4,
      'overlong': 'drop', 'vocab_path': None, 'vocab_type': 'word', 'vocab_size': 40,
      'tokens_per_batch': 64, 'batching': 'bucket'})
  with pytest.raises(ValueError, match=r"no training examples in split 'train' of "
                     r"parallel_text: of its 2 pairs, 2 are longer than data.max_length=4 "
                     r"tokens \(data.overlong='drop'\) and 0 have an empty side"):
    data_lib.get_train_and_eval(config, workdir=str(tmp_path / 'w'), seed=0)


def test_a_setting_that_drops_most_pairs_is_warned_of(tmp_path, caplog):
  """data.max_length=4 kept 3 of 2,000 pairs with only the INFO line of the data
  stats to say so; a share of 1% or more dropped is now a warning naming the
  field. Nothing dropped: no warning."""
  from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
  _write(tmp_path / 'train.en', 'a b c d e f\na b\n' * 3 + 'a\n' * 94)
  _write(tmp_path / 'train.de', 'A B C D E F\nA B\n' * 3 + 'A\n' * 94)
  config = ml_collections.ConfigDict({
      'dataset': 'parallel_text', 'text_dir': str(tmp_path), 'source_lang': 'en',
      'target_lang': 'de', 'train_split': 'train', 'eval_split': 'train', 'max_length': 4,
      'overlong': 'drop', 'vocab_path': None, 'vocab_type': 'word', 'vocab_size': 40,
      'tokens_per_batch': 64, 'batching': 'bucket'})
  with caplog.at_level(logging.WARNING):
    data_lib.get_train_and_eval(config, workdir=str(tmp_path / 'w'), seed=0)
  assert ("Training drops 3 of the 100 pairs of split 'train' (3.0%) as longer than "
          "data.max_length=4 tokens (data.overlong='drop'); raise data.max_length") in caplog.text
  # The eval split keeps them, cut: training's eval loss says so too (evaluate did).
  assert ("3 of the 100 references of eval split 'train' are longer than data.max_length=4 "
          "tokens: training's eval loss and perplexity score them cut there.") in caplog.text
  caplog.clear()
  config.max_length = 8
  with caplog.at_level(logging.WARNING):
    data_lib.get_train_and_eval(config, workdir=str(tmp_path / 'w2'), seed=0)
  assert 'Training drops' not in caplog.text and 'references of eval split' not in caplog.text


def _text_config(text_dir, **overrides):
  config = ml_collections.ConfigDict({
      'dataset': 'parallel_text', 'text_dir': str(text_dir), 'source_lang': 'en',
      'target_lang': 'de', 'train_split': 'train', 'eval_split': 'val', 'max_length': 16,
      'overlong': 'drop', 'vocab_path': None, 'vocab_type': 'word', 'vocab_size': 40,
      'tokens_per_batch': 64, 'batching': 'bucket'})
  config.update(overrides)
  return config


def test_an_empty_training_split_names_split_directory_and_field(tmp_path):
  """Empty train files reached the vocabulary first: 'no text to train the
  vocabulary on', naming no split, directory or field."""
  from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
  _write(tmp_path / 'train.en', '')
  _write(tmp_path / 'train.de', '', gz=True)
  _write(tmp_path / 'val.en', 'a dog\n')
  _write(tmp_path / 'val.de', 'ein Hund\n')
  with pytest.raises(ValueError, match=re.escape(
      f"no training examples in split 'train' of parallel_text ({tmp_path}): the split is "
      "empty (config.data.train_split)")):
    data_lib.get_train_and_eval(_text_config(tmp_path), workdir=str(tmp_path / 'w'), seed=0)
  assert not (tmp_path / 'w').exists()


def test_an_eval_split_that_is_not_there_stops_before_the_vocabulary(tmp_path):
  """`--config.data.eval_split=valid` (or no val files) failed only after
  spm.model was trained and saved: the workdir kept the vocabulary of a run that
  never started. The eval split is now found first."""
  from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
  _write(tmp_path / 'train.en', 'a dog\ntwo cats\n')
  _write(tmp_path / 'train.de', 'ein Hund\nzwei Katzen\n')
  workdir = tmp_path / 'w'
  for split in ('valid', 'val'):  # A typo; a split without files.
    with pytest.raises(FileNotFoundError, match=re.escape(
        f"no text file for split {split!r}, language 'en': tried {tmp_path / split}.en and "
        f"{tmp_path / split}.en.gz; {tmp_path} has split 'train' in 'en' "
        "(config.data.eval_split)")):
      data_lib.get_train_and_eval(_text_config(tmp_path, eval_split=split),
                                  workdir=str(workdir), seed=0)
    assert not workdir.exists()
  # The split there in one language only: the other language is the one misnamed.
  _write(tmp_path / 'val.en', 'a dog\n')
  _write(tmp_path / 'val.fr', 'un chien\n')
  with pytest.raises(FileNotFoundError, match=r"split 'val', language 'de': .* "
                     r"\(config\.data\.target_lang\)$"):
    data_lib.get_train_and_eval(_text_config(tmp_path), workdir=str(workdir), seed=0)
  assert not workdir.exists()
  _write(tmp_path / 'val.de', 'ein Hund\n')
  data = data_lib.get_train_and_eval(_text_config(tmp_path), workdir=str(workdir), seed=0)
  assert data.eval_pairs == [('a dog', 'ein Hund')]
  assert os.listdir(workdir) == ['spm.model']


def test_a_sliced_text_split_says_slices_are_tfds_only(tmp_path):
  """`evaluate --split 'val[:5]'` on text files said 'no text file for split
  'val[:5]''; a slice is TFDS's, and evaluate's --limit reads the first N."""
  _write(tmp_path / 'val.en', 'a\nb\n')
  _write(tmp_path / 'val.de', 'A\nB\n')
  config = _text_config(tmp_path)
  with pytest.raises(ValueError, match=re.escape(
      "split 'val[:5]' of parallel_text has a slice, and slices are for TFDS datasets only: "
      f"a parallel_text split is a file name ({tmp_path}/{{split}}.{{lang}}); to evaluate its "
      "first N examples, give evaluate --limit N")):
    sources.load_pairs(config, 'val[:5]')
  with pytest.raises(ValueError, match=r'evaluate --limit N \(config\.data\.eval_split\)$'):
    sources.check_split(config, 'val[:1]', field='config.data.eval_split')
  # A missing text_dir is named as such (the field, too).
  with pytest.raises(FileNotFoundError, match=r"no text file for split 'val'.* "
                     r"\(config\.data\.text_dir: .*nowhere does not exist\)$"):
    sources.load_pairs(_text_config(tmp_path / 'nowhere'), 'val')
  # A file as text_dir, and a directory in a text file's place, were 'does not
  # exist' and a misnamed language.
  (tmp_path / 'afile').write_text('')
  with pytest.raises(FileNotFoundError, match=r"\(config\.data\.text_dir: .*afile is a file, "
                     r"not a directory\)$"):
    sources.load_pairs(_text_config(tmp_path / 'afile'), 'val')
  (tmp_path / 'folders' / 'val.en').mkdir(parents=True)
  (tmp_path / 'folders' / 'val.de').write_text('Hallo\n')
  with pytest.raises(IsADirectoryError, match=r"val\.en is a directory, not the text file of "
                     r"split 'val', language 'en'$"):
    sources.load_pairs(_text_config(tmp_path / 'folders'), 'val')


def test_a_vocabulary_of_other_text_is_warned_of(tmp_path, caplog):
  """A word vocabulary of other text as data.vocab_path (SCAN's for Multi30k)
  read 82% of the source tokens and all of the target as UNK, and nothing said
  so. The run's own vocabulary of the same text is not warned of."""
  from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
  from transformer.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  _write(tmp_path / 'train.en', 'a dog runs\ntwo cats sleep\n' + 'a dog\n' * 48)
  _write(tmp_path / 'train.de', 'ein Hund rennt\nzwei Katzen schlafen\n' + 'ein Hund\n' * 48)
  _write(tmp_path / 'val.en', 'a dog\n')
  _write(tmp_path / 'val.de', 'ein Hund\n')
  other = tmp_path / 'other.model'
  tok_lib.train(['a dog runs', 'walk left twice'], 'word', 32).save(str(other))
  with caplog.at_level(logging.WARNING):
    data_lib.get_train_and_eval(_text_config(tmp_path, vocab_path=str(other)),
                                workdir=str(tmp_path / 'w'), seed=0)
  # 'two cats sleep' is one UNK of 1 + 3 + 48 * 2 source tokens; each German line one UNK.
  assert (f"1.0% of the source tokens of training split 'train' (en) are UNK to the vocabulary "
          f'{other} (config.data.vocab_path): is it of other text?') in caplog.text
  assert (f"100.0% of the target tokens of training split 'train' (de) are UNK to the "
          f'vocabulary {other} (config.data.vocab_path)') in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    data_lib.get_train_and_eval(_text_config(tmp_path), workdir=str(tmp_path / 'w'), seed=0)
  assert 'UNK' not in caplog.text


def test_a_bad_eval_line_stops_before_the_vocabulary(tmp_path):
  """A blank line in val.en stopped the run only after spm.model was trained and
  saved: the eval split was found, not read, before the vocabulary."""
  from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
  _write(tmp_path / 'train.en', 'a dog\ntwo cats\n')
  _write(tmp_path / 'train.de', 'ein Hund\nzwei Katzen\n')
  _write(tmp_path / 'val.en', 'a dog\n\n')
  _write(tmp_path / 'val.de', 'ein Hund\nzwei Katzen\n')
  workdir = tmp_path / 'w'
  with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'val.en'}:2: empty line")):
    data_lib.get_train_and_eval(_text_config(tmp_path), workdir=str(workdir), seed=0)
  assert not workdir.exists()
  # Nor an empty one (empty files), named only after the vocabulary was saved.
  _write(tmp_path / 'val.en', '')
  _write(tmp_path / 'val.de', '')
  with pytest.raises(ValueError, match=re.escape(
      "eval split 'val' of parallel_text has no examples (config.data.eval_split)")):
    data_lib.get_train_and_eval(_text_config(tmp_path), workdir=str(workdir), seed=0)
  assert not workdir.exists()


def test_misnamed_languages_and_a_missing_text_dir_name_their_fields(tmp_path):
  """source_lang and target_lang both without files blamed the split: "...; DIR has
  splits none in 'fr' (config.data.train_split)"; an empty text_dir asked for
  'data_config.text_dir', a name no config has."""
  _write(tmp_path / 'train.en', 'a dog\n')
  _write(tmp_path / 'train.de', 'ein Hund\n')
  with pytest.raises(FileNotFoundError, match=re.escape(
      f"; {tmp_path} has no file in 'fr' or 'xx' (config.data.source_lang, "
      'config.data.target_lang)')):
    sources.load_pairs(_text_config(tmp_path, source_lang='fr', target_lang='xx'), 'train',
                       field='config.data.train_split')
  with pytest.raises(FileNotFoundError, match=re.escape(
      f"; {tmp_path} has no file in 'xx' (config.data.target_lang)")):
    sources.load_pairs(_text_config(tmp_path, target_lang='xx'), 'valid')
  config = _text_config(tmp_path)
  config.text_dir = ''  # As --config.data.text_dir= gives it.
  with pytest.raises(ValueError, match=r"^dataset 'parallel_text' needs config\.data\.text_dir"):
    sources.load_pairs(config, 'train')
