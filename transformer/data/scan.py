"""SCAN (Lake & Baroni, 2018): commands -> action sequences, generated from its grammar.

`all_pairs()` enumerates every (command, actions) pair without TFDS; `Scan` is a
local TFDS builder with configs `simple` (random 80/20 split, fixed seed) and
`length` (train: at most 22 actions, test: longer).

The builder is not added to the TFDS registry (TFDS ships a download-based
`scan` of its own); use it as `Scan(config='length', data_dir=...)`. It writes
to `{data_dir}/scan/{config}/{VERSION}`; VERSION differs from the official
builder's (1.1.1) so the two never read each other's files.
"""
import functools

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

PRIMITIVES = {'walk': 'I_WALK', 'look': 'I_LOOK', 'run': 'I_RUN', 'jump': 'I_JUMP'}
DIRECTIONS = {'left': 'I_TURN_LEFT', 'right': 'I_TURN_RIGHT'}
LENGTH_SPLIT_MAX_ACTIONS = 22  # Train on action sequences of at most 22 actions.
SIMPLE_TRAIN_FRACTION = 0.8
SIMPLE_SPLIT_SEED = 0


def _verb_phrases():
  """(words, actions) for every V: U | D | D[1] opposite D[2] | D[1] around D[2]."""
  out = [((u,), [a]) for u, a in PRIMITIVES.items()]
  # `turn` has no action of its own: "turn left" is just the turn.
  for u, act in list(PRIMITIVES.items()) + [('turn', None)]:
    body = [] if act is None else [act]
    for d, turn in DIRECTIONS.items():
      out.append(((u, d), [turn] + body))
      out.append(((u, 'opposite', d), [turn, turn] + body))
      out.append(((u, 'around', d), ([turn] + body) * 4))
  return out


def _sentences():
  """(words, actions) for every S: V | V twice | V thrice."""
  out = []
  for words, actions in _verb_phrases():
    out.append((words, actions))
    out.append((words + ('twice',), actions * 2))
    out.append((words + ('thrice',), actions * 3))
  return out


@functools.lru_cache(maxsize=1)
def all_pairs():
  """All 20,910 SCAN (command, actions) pairs as space-separated strings, fixed order."""
  sentences = _sentences()
  pairs = [(' '.join(w), ' '.join(a)) for w, a in sentences]
  for w1, a1 in sentences:
    for w2, a2 in sentences:
      pairs.append((' '.join(w1 + ('and',) + w2), ' '.join(a1 + a2)))
      pairs.append((' '.join(w1 + ('after',) + w2), ' '.join(a2 + a1)))
  return tuple(pairs)


def split_pairs(config, split):
  """Pairs of `split` ('train' or 'test') under split `config` ('simple' or 'length')."""
  if split not in ('train', 'test'):
    raise ValueError(f"SCAN has splits 'train' and 'test', not {split!r}")
  pairs = all_pairs()
  if config == 'simple':
    order = np.random.default_rng(SIMPLE_SPLIT_SEED).permutation(len(pairs))
    n_train = round(SIMPLE_TRAIN_FRACTION * len(pairs))
    chosen = order[:n_train] if split == 'train' else order[n_train:]
    return [pairs[i] for i in sorted(chosen)]
  if config == 'length':
    short = lambda p: len(p[1].split()) <= LENGTH_SPLIT_MAX_ACTIONS
    return [p for p in pairs if short(p) == (split == 'train')]
  raise ValueError(f"unknown SCAN split config {config!r}; use 'simple' or 'length'")


class Scan(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """SCAN generated in code: no download, takes seconds to prepare."""

  name = 'scan'
  VERSION = tfds.core.Version('2.0.0')
  RELEASE_NOTES = {'2.0.0': 'Generated from the grammar (not the official download).'}
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(name='simple', description='Random 80/20 split.'),
      tfds.core.BuilderConfig(
          name='length', description='Train: <= 22 actions; test: longer.'),
  ]

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    # TFDS's own lookup imports `importlib_resources`, which tensorflow-datasets
    # 4.9.10 does not install on Python >= 3.9 (tensorflow/datasets#11212).
    return epath.Path(__file__)

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'source': tfds.features.Text(),
            'target': tfds.features.Text(),
        }),
        supervised_keys=('source', 'target'),
        homepage='https://github.com/brendenlake/SCAN',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {s: self._generate_examples(s) for s in ('train', 'test')}

  def _generate_examples(self, split):
    for i, (src, tgt) in enumerate(split_pairs(self.builder_config.name, split)):
      yield i, {'source': src, 'target': tgt}
