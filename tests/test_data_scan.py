"""SCAN generated from its grammar: size, known pairs, splits, TFDS builder."""
import re

import ml_collections
import pytest

from transformer.data import scan
from transformer.data import sources


def test_exactly_20910_unique_commands():
  pairs = scan.all_pairs()
  assert len(pairs) == 20910
  assert len({c for c, _ in pairs}) == 20910


@pytest.mark.parametrize('command, actions', [
    ('jump twice after walk left', 'I_TURN_LEFT I_WALK I_JUMP I_JUMP'),
    ('turn around right', ' '.join(['I_TURN_RIGHT'] * 4)),
    ('walk opposite left thrice', ' '.join(['I_TURN_LEFT I_TURN_LEFT I_WALK'] * 3)),
    ('turn opposite left', 'I_TURN_LEFT I_TURN_LEFT'),
    ('jump around left', ' '.join(['I_TURN_LEFT I_JUMP'] * 4)),
    ('look and run right', 'I_LOOK I_TURN_RIGHT I_RUN'),
    ('turn left twice and jump', 'I_TURN_LEFT I_TURN_LEFT I_JUMP'),
    ('run after look opposite right twice',
     'I_TURN_RIGHT I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_TURN_RIGHT I_LOOK I_RUN'),
    ('walk', 'I_WALK'),
])
def test_known_pairs(command, actions):
  assert dict(scan.all_pairs())[command] == actions


def test_no_command_outside_the_grammar():
  words = {w for c, _ in scan.all_pairs() for w in c.split()}
  assert words == {'walk', 'look', 'run', 'jump', 'turn', 'left', 'right', 'opposite',
                   'around', 'twice', 'thrice', 'and', 'after'}
  assert not any('turn twice' in c or c.startswith('turn and') for c, _ in scan.all_pairs())
  assert max(len(a.split()) for _, a in scan.all_pairs()) == 48  # around x thrice, twice.


def test_length_split_boundary():
  train = scan.split_pairs('length', 'train')
  test = scan.split_pairs('length', 'test')
  assert max(len(a.split()) for _, a in train) == 22
  assert min(len(a.split()) for _, a in test) > 22
  assert (len(train), len(test)) == (16990, 3920)
  assert set(train) | set(test) == set(scan.all_pairs())


def test_simple_split_is_a_fixed_80_20_partition():
  train = scan.split_pairs('simple', 'train')
  test = scan.split_pairs('simple', 'test')
  assert (len(train), len(test)) == (16728, 4182)
  assert not set(train) & set(test)
  assert set(train) | set(test) == set(scan.all_pairs())
  assert scan.split_pairs('simple', 'test') == test  # Fixed seed.


def test_bad_split_names():
  with pytest.raises(ValueError, match='validation'):
    scan.split_pairs('simple', 'validation')
  with pytest.raises(ValueError, match='jump'):
    scan.split_pairs('jump', 'train')


def test_tfds_builder_via_load_pairs(tmp_path):
  config = ml_collections.ConfigDict({'dataset': 'scan/length', 'tfds_data_dir': str(tmp_path)})
  test = sources.load_pairs(config, 'test')
  assert sorted(test) == sorted(scan.split_pairs('length', 'test'))
  assert (tmp_path / 'scan' / 'length' / scan.Scan.VERSION.__str__()).is_dir()
  with pytest.raises(ValueError, match="'train' and 'test'"):
    sources.load_pairs(config, 'validation')
  # Slices that select nothing or do not parse: a TensorFlow traceback, or TFDS's
  # "Instruction [] corresponds to no data!" naming no split, before.
  assert len(sources.load_pairs(config, 'test[-5:]')) == 5
  for split, said in (('test[5:2]', 'selects no examples'), ('train[:0]', 'selects no examples'),
                      ('test[abc]', "Unrecognized split format: 'test[abc]'"),
                      ('test[200%:]', 'When unit=%, percent slice boundaries should be in [-100, 100]')):
    with pytest.raises(ValueError, match=re.escape(f"split {split!r} of scan") + ":? "
                       + re.escape(said)):
      sources.load_pairs(config, split)


def _lose_the_race(self, *args, **kwargs):
  del self, args, kwargs  # What TFDS raises when another process renamed its build first:
  raise FileExistsError('Cannot rename .../incomplete.X_2.0.0. Destination exists.')


def test_a_process_that_loses_the_preparation_race_reads_the_winners(tmp_path, monkeypatch):
  config = ml_collections.ConfigDict({'dataset': 'scan/length', 'tfds_data_dir': str(tmp_path)})
  monkeypatch.setattr(scan.Scan, 'download_and_prepare', _lose_the_race)
  with pytest.raises(FileExistsError):  # No dataset from any process: the error stands.
    sources.load_pairs(config, 'test')
  monkeypatch.undo()
  winner = sources.load_pairs(config, 'test')
  is_prepared = scan.Scan.is_prepared
  checks = []  # Unprepared when this process looks, prepared once its rename fails.
  monkeypatch.setattr(scan.Scan, 'is_prepared',
                      lambda self: bool(checks.append(1) or len(checks) > 1) and is_prepared(self))
  monkeypatch.setattr(scan.Scan, 'download_and_prepare', _lose_the_race)
  assert sources.load_pairs(config, 'test') == winner
  assert len(checks) == 2
