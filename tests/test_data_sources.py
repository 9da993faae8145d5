"""Registered TFDS translation datasets: direction by language code, never downloaded."""
import contextlib
import os
import re

import ml_collections
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from transformer.data import sources

NAME = 'wmt14_translate/de-en'


def _config(data_dir, source_lang='en', target_lang='de'):
  return ml_collections.ConfigDict({'dataset': NAME, 'tfds_data_dir': data_dir,
                                    'source_lang': source_lang, 'target_lang': target_lang})


def _fake_split(self, split, **kwargs):
  del self, kwargs
  n = {'train': 3, 'validation': 2}[split]
  return tf.data.Dataset.from_tensor_slices({
      'de': [f'Satz {i}' for i in range(n)], 'en': [f'sentence {i}' for i in range(n)]})


def test_registered_dataset_direction_from_languages(tmp_path):
  with tfds.testing.mock_data(as_dataset_fn=_fake_split):
    assert sources.load_pairs(_config(str(tmp_path)), 'validation') == [
        ('sentence 0', 'Satz 0'), ('sentence 1', 'Satz 1')]
    assert sources.load_pairs(_config(str(tmp_path), 'de', 'en'), 'train')[2] == (
        'Satz 2', 'sentence 2')
    with pytest.raises(ValueError, match="source_lang='fr'"):
      sources.load_pairs(_config(str(tmp_path), 'fr', 'en'), 'train')


def test_registered_dataset_with_tfds_mock_examples():
  with tfds.testing.mock_data(num_examples=4):
    pairs = sources.load_pairs(_config(None), 'train')
  assert len(pairs) == 4
  assert all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)


def test_unprepared_dataset_says_how_to_prepare(tmp_path):
  with pytest.raises(sources.DataNotPreparedError) as e:
    sources.load_pairs(_config(str(tmp_path)), 'train')
  assert f'tfds build {NAME} --data_dir={tmp_path}' in str(e.value)
  assert not any(tmp_path.iterdir())  # Nothing was downloaded or written.


def test_an_empty_tfds_data_dir_is_tfds_default_not_the_current_directory(monkeypatch):
  """An override `--config.data.tfds_data_dir=` gives '': TFDS took it as the
  current directory and prepared SCAN there."""
  seen = []
  monkeypatch.setattr(sources, '_iter_scan',
                      lambda config, split, data_dir, chunk, field=None: seen.append(data_dir)
                      or iter(()))
  monkeypatch.setattr(tfds, 'builder', lambda name, data_dir: seen.append(data_dir) or 1 / 0)
  for dataset in ('scan/simple', NAME):
    config = _config('')
    config.dataset = dataset
    with pytest.raises(ZeroDivisionError) if dataset == NAME else contextlib.nullcontext():
      sources.load_pairs(config, 'train')
  assert seen == [None, None]


def test_unknown_dataset_name(tmp_path):
  with pytest.raises(ValueError, match='no_such_corpus'):
    sources.load_pairs(ml_collections.ConfigDict({
        'dataset': 'no_such_corpus/x', 'tfds_data_dir': str(tmp_path),
        'source_lang': 'en', 'target_lang': 'de'}), 'train')


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """The data dir of a prepared TFDS dataset that TFDS does not register, 'mywmt/de-en'
  (as `tfds build` of one's own dataset leaves it): read from its files alone."""
  data_dir = tmp_path_factory.mktemp('tfds')
  def split(n):
    return tf.data.Dataset.from_tensor_slices({'de': [f'ein Satz {i}' for i in range(n)],
                                               'en': [f'a sentence {i}' for i in range(n)]})
  tfds.dataset_builders.TfDataBuilder(
      name='mywmt', config='de-en', version='1.0.0', data_dir=str(data_dir),
      split_datasets={'train': split(6), 'validation': split(2)},
      features=tfds.features.FeaturesDict({'de': tfds.features.Text(),
                                           'en': tfds.features.Text()})).download_and_prepare()
  return str(data_dir)


def _run_config(data_dir, **overrides):
  config = _config(data_dir)
  config.update({'dataset': 'mywmt/de-en', 'train_split': 'train', 'eval_split': 'validation',
                 'max_length': 16, 'overlong': 'drop', 'vocab_path': None, 'vocab_type': 'word',
                 'vocab_size': 40, 'tokens_per_batch': 64, 'batching': 'bucket'})
  config.update(overrides)
  return config


def test_a_tfds_split_that_does_not_resolve_names_its_field(prepared, tmp_path):
  """'split 'training' of mywmt: Unknown split ...' named no config field; and an
  eval split that does not resolve failed only after spm.model was saved."""
  from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'w'
  for field in ('train_split', 'eval_split'):
    with pytest.raises(ValueError, match=re.escape(
        "split 'valid' of mywmt: Unknown split 'valid'. Should be one of ['train', "
        f"'validation'] (config.data.{field})")):
      data_lib.get_train_and_eval(_run_config(prepared, **{field: 'valid'}),
                                  workdir=str(workdir), seed=0)
    assert not workdir.exists()  # No vocabulary of a run that never started.
  with pytest.raises(ValueError, match=re.escape(
      "split 'validation[1:1]' of mywmt selects no examples (config.data.eval_split)")):
    data_lib.get_train_and_eval(_run_config(prepared, eval_split='validation[1:1]'),
                                workdir=str(workdir), seed=0)
  assert not workdir.exists()
  data = data_lib.get_train_and_eval(_run_config(prepared), workdir=str(workdir), seed=0)
  assert data.eval_pairs == [('a sentence 0', 'ein Satz 0'), ('a sentence 1', 'ein Satz 1')]
  assert os.listdir(workdir) == ['spm.model']
  # Without a field (evaluate's --split), the message is TFDS's alone.
  with pytest.raises(ValueError, match=r"Should be one of \['train', 'validation'\]$"):
    sources.load_pairs(_run_config(prepared), 'dev')


def test_a_tfds_dataset_not_found_says_why_and_names_the_fields(prepared, tmp_path):
  """'unknown dataset ...' for a data dir that does not exist and for a config not
  prepared alike, naming neither the data dir nor why; and TFDS's own text for a
  registered dataset's unknown config ended in 'closely match: ' and nothing."""
  missing = tmp_path / 'nonexistent'
  for config, said in (
      (_run_config(str(missing)), f"unknown dataset 'mywmt/de-en' (config.data.dataset): TFDS "
       f"registers no such dataset, and config.data.tfds_data_dir={missing} does not exist"),
      (_run_config(prepared, dataset='mywmt/fr-en'), "dataset 'mywmt/fr-en' "
       f"(config.data.dataset): {os.path.join(prepared, 'mywmt')} has no config 'fr-en'; it "
       'has de-en'),
      (_run_config(prepared, dataset='mywmt/de-en:2.0.0'), "dataset 'mywmt/de-en:2.0.0' "
       f'(config.data.dataset) cannot be read from config.data.tfds_data_dir={prepared}: No '
       'version matching the requested 2.0.0 was found'),
      (_run_config(str(tmp_path), dataset='wmt14_translate/xx-en'), "dataset "
       "'wmt14_translate/xx-en' (config.data.dataset): TFDS's wmt14_translate has no config "
       "'xx-en'; it has cs-en, de-en, fr-en, hi-en, ru-en")):
    with pytest.raises(ValueError) as e:
      sources.load_pairs(config, 'train')
    assert str(e.value).startswith(said), str(e.value)
    assert '\n' not in str(e.value)
  with pytest.raises(ValueError, match=r"^unknown dataset 'no_such_corpus/x' "
                     r'\(config\.data\.dataset\): TFDS registers no such dataset, and '
                     rf'config\.data\.tfds_data_dir={re.escape(prepared)} holds no '
                     'no_such_corpus; use scan/simple'):
    sources.load_pairs(_run_config(prepared, dataset='no_such_corpus/x'), 'train')


def _prepare(data_dir, name, de):
  """Prepares TFDS dataset `name`/de-en of one split, 'train', with German side `de`
  (bytes); returns the English sides in the order the split reads."""
  en = [f'sentence {i}' for i in range(len(de))]
  tfds.dataset_builders.TfDataBuilder(
      name=name, config='de-en', version='1.0.0', data_dir=str(data_dir),
      split_datasets={'train': tf.data.Dataset.from_tensor_slices({'de': de, 'en': en})},
      features=tfds.features.FeaturesDict({'de': tfds.features.Text(),
                                           'en': tfds.features.Text()})).download_and_prepare()
  builder = tfds.builder(f'{name}/de-en', data_dir=str(data_dir))
  return [x['en'].decode() for x in tfds.as_numpy(builder.as_dataset('train',
                                                                     shuffle_files=False))]


def test_a_damaged_tfds_split_names_the_split_directory_and_example(tmp_path):
  """A truncated tfrecord file gave TensorFlow's traceback ('DataLossError:
  {{function_node __wrapped__IteratorGetNext...}} truncated record at ...'), and
  Latin-1 text "'utf-8' codec can't decode byte 0xe9", naming no dataset or example."""
  de = [b'Satz %d' % i for i in range(40)]
  de[21] = b'caf\xe9 21'  # Latin-1.
  order = _prepare(tmp_path, 'mylatin', de)
  folder = tmp_path / 'mylatin' / 'de-en' / '1.0.0'
  config = _config(str(tmp_path))
  config.dataset = 'mylatin/de-en'
  with pytest.raises(ValueError, match=re.escape(
      f"split 'train' of mylatin ({folder}): example {order.index('sentence 21')}: feature "
      "'de' is not valid UTF-8 (invalid continuation byte at byte 3)")):
    sources.load_pairs(config, 'train')
  _prepare(tmp_path, 'mytruncated', [b'Satz %d' % i for i in range(200)])
  folder = tmp_path / 'mytruncated' / 'de-en' / '1.0.0'
  (record,) = folder.glob('mytruncated-train.tfrecord*')
  record.write_bytes(record.read_bytes()[:record.stat().st_size // 2])
  config.dataset = 'mytruncated/de-en'
  with pytest.raises(ValueError) as e:
    sources.load_pairs(config, 'train')
  assert re.fullmatch(
      rf"split 'train' of mytruncated \({re.escape(str(folder))}\): cannot read after "
      r'\d+ examples \(damaged or truncated files\? prepare it again\): truncated record at '
      r'\d+.*', str(e.value)), str(e.value)


@pytest.mark.parametrize('damage', [b'', b'{"name": "sc', b'\x98\xfa\x00garbage'])
def test_a_damaged_dataset_info_names_the_dataset_and_its_data_dir(damage, tmp_path):
  """A prepared dataset's dataset_info.json, empty, cut short or not UTF-8: TFDS
  raised protobuf's ParseError (a traceback from train.py) or a
  UnicodeDecodeError, naming neither the file nor the dataset."""
  info = tmp_path / 'scan' / 'simple' / '2.0.0' / 'dataset_info.json'
  info.parent.mkdir(parents=True)
  info.write_bytes(damage)
  config = _config(str(tmp_path))
  config.dataset = 'scan/simple'
  said = (f'scan/simple in {tmp_path}: its dataset_info.json cannot be read (damaged? '
          'prepare it again): ')
  for read in (sources.check_split, sources.load_pairs):
    with pytest.raises(ValueError, match=re.escape(said)):
      read(config, 'train')
  _prepare(tmp_path, 'myinfo', [b'Satz %d' % i for i in range(4)])
  (tmp_path / 'myinfo' / 'de-en' / '1.0.0' / 'dataset_info.json').write_bytes(damage)
  config.dataset = 'myinfo/de-en'
  with pytest.raises(ValueError, match=re.escape(
      f'myinfo/de-en in {tmp_path}: its dataset_info.json cannot be read')):
    sources.load_pairs(config, 'train')


def test_a_tfds_data_dir_that_is_a_file_names_the_field(tmp_path):
  """A file as data.tfds_data_dir gave "[Errno 20] Not a directory: 'FILE/downloads'"
  for SCAN, and for a registered dataset 'not prepared in FILE/...' with a
  command to prepare it there; neither named the field."""
  afile = tmp_path / 'afile'
  afile.write_text('')
  for dataset in ('scan/simple', NAME, 'mywmt/de-en'):
    config = _config(str(afile))
    config.dataset = dataset
    with pytest.raises(NotADirectoryError, match=re.escape(
        f'config.data.tfds_data_dir={afile} is not a directory')):
      sources.load_pairs(config, 'train')
    with pytest.raises(NotADirectoryError, match='config.data.tfds_data_dir'):
      sources.check_split(config, 'train')
  config = _config(str(afile / 'sub'))  # A directory below a file: SCAN cannot be prepared.
  config.dataset = 'scan/simple'
  with pytest.raises(NotADirectoryError, match=re.escape(
      f"cannot prepare scan/simple in {afile / 'sub' / 'scan' / 'simple' / '2.0.0'} "
      "(config.data.tfds_data_dir): [Errno 20] Not a directory")):
    sources.load_pairs(config, 'train')
