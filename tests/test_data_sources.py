"""Registered TFDS translation datasets: direction by language code, never downloaded."""
import contextlib

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
                      lambda config, split, data_dir, chunk: seen.append(data_dir) or iter(()))
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
