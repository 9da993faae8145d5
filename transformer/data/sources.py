"""Raw (source, target) strings from the configured dataset: `load_pairs(data_config,
split)` all at once, `iter_pairs(data_config, split, chunk)` a chunk at a time (what
`evaluate` reads, so a split of any size fits in memory).

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
CHUNK = 4096  # Pairs per chunk (and per tf.data batch when copying a TFDS split).


class DataNotPreparedError(FileNotFoundError):
  """A registered TFDS dataset has not been prepared in the data dir."""


def prepare_command(name, data_dir):
  """The shell command that prepares TFDS dataset `name` into `data_dir`."""
  where = f' --data_dir={data_dir}' if data_dir else ''
  return f'tfds build {name}{where}'


def _iter_tfds(builder, split, keys, chunk):
  """Lists of up to `chunk` rows of `split`, each a tuple of str, one per key in `keys`."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  # A bad or empty slice would fail in as_dataset with a TensorFlow traceback.
  try:
    size = builder.info.splits[split].num_examples
  except (KeyError, ValueError) as e:
    if builder.is_prepared():  # Else as_dataset says that it is not (_iter_registered).
      reason = [line for line in str(e).strip("'\"").splitlines() if line.strip()][-1]
      raise ValueError(f'split {split!r} of {builder.name}: {reason}') from e
    size = None
  if size is not None and size <= 0:
    raise ValueError(f'split {split!r} of {builder.name} selects no examples')
  ds = builder.as_dataset(split=split, shuffle_files=False).batch(chunk)
  for batch in tfds.as_numpy(ds):
    columns = [[b.decode('utf-8') for b in np.asarray(batch[k]).tolist()] for k in keys]
    yield list(zip(*columns))


def _iter_scan(config, split, data_dir, chunk):
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
  yield from _iter_tfds(builder, split, ('source', 'target'), chunk)


def _iter_registered(name, split, data_config, chunk):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  data_dir = tfds_data_dir(data_config)
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
    yield from _iter_tfds(builder, split, (src, tgt), chunk)
  except AssertionError as e:  # What TFDS raises for data that is not prepared.
    if builder.is_prepared():
      raise
    raise DataNotPreparedError(
        f'{name} is not prepared in {builder.data_dir} (this program never downloads). '
        f'Prepare it with:\n  {prepare_command(name, data_dir)}\nor\n  python -c "import '
        f"tensorflow_datasets as tfds; tfds.builder('{name}', data_dir={data_dir!r})"
        f'.download_and_prepare()"') from e


def tfds_data_dir(data_config):
  """config.data.tfds_data_dir, None (TFDS's default) where unset or empty: an
  empty string would make TFDS prepare the dataset in the current directory."""
  return data_config.get('tfds_data_dir') or None


def load_pairs(data_config, split):
  """(source, target) string pairs of `split` of `data_config.dataset`."""
  return [pair for pairs in iter_pairs(data_config, split) for pair in pairs]


def iter_pairs(data_config, split, chunk=CHUNK):
  """The pairs of `split` in their order, as lists of up to `chunk` pairs. A
  generator: nothing is read, and no error raised, before the first is asked for."""
  if chunk < 1:
    raise ValueError(f'chunk must be >= 1, got {chunk}')
  dataset = data_config.dataset
  if dataset.startswith('scan/'):
    config = dataset.split('/', 1)[1]
    if config not in SCAN_CONFIGS:
      raise ValueError(f'unknown SCAN split {dataset!r}; use scan/simple or scan/length')
    yield from _iter_scan(config, split, tfds_data_dir(data_config), chunk)
    return
  if dataset == 'parallel_text':
    from transformer.data import parallel_text  # pylint: disable=g-import-not-at-top
    if not data_config.get('text_dir'):
      raise ValueError("dataset 'parallel_text' needs data_config.text_dir")
    yield from parallel_text.iter_split(data_config.text_dir, split, data_config.source_lang,
                                        data_config.target_lang, chunk)
    return
  yield from _iter_registered(dataset, split, data_config, chunk)
