"""`load_pairs(data_config, split)`: raw (source, target) strings from the configured dataset.

`data_config.dataset` is one of:
  'scan/simple', 'scan/length': SCAN generated in code (`scan.Scan`), prepared
      on first use into `tfds_data_dir` (None: the TFDS default,
      ~/tensorflow_datasets) under scan/{config}/2.0.0; takes a few seconds.
  'parallel_text': `{text_dir}/{split}.{lang}[.gz]` files (`parallel_text`).
  any registered TFDS translation dataset, e.g. 'wmt14_translate/de-en': read
      from `tfds_data_dir`, never downloaded here; its features are keyed by
      language code, so source_lang/target_lang choose the direction.
"""
import numpy as np

SCAN_CONFIGS = ('simple', 'length')
_READ_BATCH = 4096  # Examples per tf.data batch when copying a TFDS split into Python.


class DataNotPreparedError(FileNotFoundError):
  """A registered TFDS dataset has not been prepared in the data dir."""


def prepare_command(name, data_dir):
  """The shell command that prepares TFDS dataset `name` into `data_dir`."""
  where = f' --data_dir={data_dir}' if data_dir else ''
  return f'tfds build {name}{where}'


def _read_tfds(builder, split, keys):
  """Rows of `split` as tuples of str, one per key in `keys`."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  ds = builder.as_dataset(split=split, shuffle_files=False).batch(_READ_BATCH)
  out = []
  for batch in tfds.as_numpy(ds):
    columns = [[b.decode('utf-8') for b in np.asarray(batch[k]).tolist()] for k in keys]
    out.extend(zip(*columns))
  return out


def _load_scan(config, split, data_dir):
  from transformer.data import scan  # pylint: disable=g-import-not-at-top
  # Checked before spending seconds on preparation; TFDS slices ('test[:500]') pass.
  if split.split('[', 1)[0] not in ('train', 'test'):
    raise ValueError(f"SCAN has splits 'train' and 'test', not {split!r}")
  builder = scan.Scan(config=config, data_dir=data_dir)
  if not builder.is_prepared():
    try:
      builder.download_and_prepare()  # Generates from the grammar; nothing is downloaded.
    except OSError:
      # TFDS builds in a temporary directory and renames it; when another process
      # (of a multi-process job, on a host-local data dir) renamed its own first,
      # this rename fails and that process's identical dataset is used.
      builder = scan.Scan(config=config, data_dir=data_dir)
      if not builder.is_prepared():
        raise
  return _read_tfds(builder, split, ('source', 'target'))


def _load_registered(name, split, data_config):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  data_dir = data_config.get('tfds_data_dir')
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(f'unknown dataset {name!r}: use scan/simple, scan/length, '
                     f'parallel_text or a registered TFDS translation dataset') from e
  src, tgt = data_config.source_lang, data_config.target_lang
  keys = tuple(getattr(builder.info.features, 'keys', lambda: ())())
  if src not in keys or tgt not in keys:
    raise ValueError(f'{name} has features {keys}; source_lang={src!r} and '
                     f'target_lang={tgt!r} must both be among them')
  try:
    return _read_tfds(builder, split, (src, tgt))
  except AssertionError as e:  # What TFDS raises for data that is not prepared.
    if builder.is_prepared():
      raise
    raise DataNotPreparedError(
        f'{name} is not prepared in {builder.data_dir} (this program never downloads). '
        f'Prepare it with:\n  {prepare_command(name, data_dir)}\nor\n  python -c "import '
        f"tensorflow_datasets as tfds; tfds.builder('{name}', data_dir={data_dir!r})"
        f'.download_and_prepare()"') from e


def load_pairs(data_config, split):
  """(source, target) string pairs of `split` of `data_config.dataset`."""
  dataset = data_config.dataset
  if dataset.startswith('scan/'):
    config = dataset.split('/', 1)[1]
    if config not in SCAN_CONFIGS:
      raise ValueError(f'unknown SCAN split {dataset!r}; use scan/simple or scan/length')
    return _load_scan(config, split, data_config.get('tfds_data_dir'))
  if dataset == 'parallel_text':
    from transformer.data import parallel_text  # pylint: disable=g-import-not-at-top
    if not data_config.get('text_dir'):
      raise ValueError("dataset 'parallel_text' needs data_config.text_dir")
    return parallel_text.load_split(data_config.text_dir, split,
                                    data_config.source_lang, data_config.target_lang)
  return _load_registered(dataset, split, data_config)
