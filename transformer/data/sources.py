"""Raw (source, target) strings from the configured dataset: `load_pairs(data_config,
split)` all at once, `iter_pairs(data_config, split, chunk)` a chunk at a time (what
`evaluate` reads, so a split of any size fits in memory), `check_split(data_config,
split)` whether a split can be read, without reading it.

`data_config.dataset` is one of:
  'scan/simple', 'scan/length': SCAN generated in code (`scan.Scan`), prepared
      on first use into `tfds_data_dir` (None: the TFDS default,
      ~/tensorflow_datasets) under scan/{config}/2.0.0; takes a few seconds.
  'parallel_text': `{text_dir}/{split}.{lang}[.gz]` files (`parallel_text`).
  any registered TFDS translation dataset, e.g. 'wmt14_translate/de-en': read
      from `tfds_data_dir`, never downloaded here; its features are keyed by
      language code, so source_lang/target_lang choose the direction.

`field` (of load_pairs, iter_pairs, check_split) is what messages call the split:
the config field or flag it came from, e.g. 'config.data.eval_split'.
"""
import os
import re

import numpy as np

from transformer import runtime

SCAN_CONFIGS = ('simple', 'length')
CHUNK = 4096  # Pairs per chunk (and per tf.data batch when copying a TFDS split).


class DataNotPreparedError(FileNotFoundError):
  """A registered TFDS dataset has not been prepared in the data dir."""


class DamagedInfoError(ValueError):
  """A prepared TFDS dataset's dataset_info.json cannot be read."""


def _builder(make, name, data_dir):
  """make(), a TFDS builder, which reads a prepared dataset's dataset_info.json:
  a damaged one is named here, where TFDS raises protobuf's ParseError (a
  traceback from the commands) or a UnicodeDecodeError, naming neither the file
  nor the dataset."""
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
  try:
    return make()
  except (json_format.Error, UnicodeDecodeError) as e:
    where = data_dir or "TFDS's default data dir"
    raise DamagedInfoError(f'{name} in {where}: its dataset_info.json cannot be read (damaged? '
                           f'prepare it again): {runtime.first_line(e)}') from e


def _scan_builder(config, data_dir):
  """SCAN's builder of `config` in `data_dir` (_builder: a damaged info file named)."""
  from transformer.data import scan  # pylint: disable=g-import-not-at-top
  return _builder(lambda: scan.Scan(config=config, data_dir=data_dir), f'scan/{config}', data_dir)


def prepare_command(name, data_dir):
  """The shell command that prepares TFDS dataset `name` into `data_dir`."""
  where = f' --data_dir={data_dir}' if data_dir else ''
  return f'tfds build {name}{where}'


def _with_field(message, field):
  """`message` naming the config field (or flag) that chose the split, where known."""
  return f'{message} ({field})' if field else message


def describe(data_config):
  """The dataset as messages name it, with the directory it is read from."""
  if data_config.dataset == 'parallel_text':
    return f"parallel_text ({data_config.get('text_dir')})"
  data_dir = tfds_data_dir(data_config)
  return f'{data_config.dataset} ({data_dir})' if data_dir else data_config.dataset


def _tfds_split_size(builder, split, field):
  """Examples in `split` of a TFDS builder, None where it is not prepared (reading
  then says so); ValueError, naming `field`, where the split does not resolve or
  selects nothing: as_dataset would fail with a TensorFlow traceback."""
  try:
    size = builder.info.splits[split].num_examples
  except (KeyError, ValueError) as e:
    if not builder.is_prepared():
      return None
    reason = [line for line in str(e).strip("'\"").splitlines() if line.strip()][-1]
    raise ValueError(_with_field(f'split {split!r} of {builder.name}: {reason.rstrip(".")}',
                                 field)) from e
  if size <= 0:
    raise ValueError(_with_field(f'split {split!r} of {builder.name} selects no examples',
                                 field))
  return size


def _iter_tfds(builder, split, keys, chunk, field=None):
  """Lists of up to `chunk` rows of `split`, each a tuple of str, one per key in `keys`.
  Damaged files and text that is not UTF-8 are a ValueError naming the split, the
  dataset's directory and the example: TensorFlow's own error names none of them.
  Example N counts from 0 in the order read, within `split` (a slice's own first
  example is 0)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  _tfds_split_size(builder, split, field)
  where = f'split {split!r} of {builder.name} ({builder.data_dir})'
  ds = builder.as_dataset(split=split, shuffle_files=False).batch(chunk)
  done = 0  # Examples read so far.
  try:
    for batch in tfds.as_numpy(ds):
      columns = [_decode_column(np.asarray(batch[k]).tolist(), k, done, where) for k in keys]
      yield list(zip(*columns))
      done += len(columns[0])
  except tf.errors.OpError as e:  # DataLossError for a truncated file, among others.
    reason = re.sub(r'^\{\{.*?\}\}\s*|\s*\[Op:.*', '', e.message.strip())
    raise ValueError(f'{where}: cannot read after {done} examples (damaged or truncated '
                     f'files? prepare it again): {runtime.first_line(reason)}') from e


def _decode_column(values, key, first, where):
  """UTF-8 text of `values`, the `key` feature of examples `first`, `first` + 1, ..."""
  texts = []
  for i, b in enumerate(values):
    try:
      texts.append(b.decode('utf-8'))
    except UnicodeDecodeError as e:
      raise ValueError(f'{where}: example {first + i}: feature {key!r} is not valid UTF-8 '
                       f'({e.reason} at byte {e.start})') from e
  return texts


def _scan_config(dataset):
  config = dataset.split('/', 1)[1]
  if config not in SCAN_CONFIGS:
    raise ValueError(f'unknown SCAN split {dataset!r}; use scan/simple or scan/length')
  return config


def _check_scan_split_name(split, field):
  # Checked before spending seconds on preparation; TFDS slices ('test[:500]') pass.
  if split.split('[', 1)[0] not in ('train', 'test'):
    raise ValueError(_with_field(f"SCAN has splits 'train' and 'test', not {split!r}", field))


def _iter_scan(config, split, data_dir, chunk, field=None):
  _check_scan_split_name(split, field)
  builder = _scan_builder(config, data_dir)
  if not builder.is_prepared():
    try:
      builder.download_and_prepare()  # Generates from the grammar; nothing is downloaded.
    except OSError as e:
      # TFDS builds in a temporary directory and renames it; when another process
      # (of a multi-process job, on a host-local data dir) renamed its own first,
      # this rename fails and that process's identical dataset is used.
      builder = _scan_builder(config, data_dir)
      if not builder.is_prepared():  # The data dir cannot be written: say which setting.
        raise type(e)(f'cannot prepare {builder.name}/{config} in {builder.data_dir} '
                      f'(config.data.tfds_data_dir): {e}') from e
  yield from _iter_tfds(builder, split, ('source', 'target'), chunk, field)


def _tfds_reason(error):
  """TFDS's own reason in a DatasetNotFoundError, which opens with every registered
  dataset's name and a checklist: the first line after them, else the first line."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  for i, line in enumerate(lines[:-1]):
    if 'module defining the dataset class' in line:
      return lines[i + 1]
  return runtime.first_line(error)


def _is_version(name):
  return re.fullmatch(r'\d+\.\d+\.\d+', name) is not None


def _unknown_dataset(name, data_dir, error):
  """Why tfds.builder(name, data_dir) failed, in one line naming the config fields:
  TFDS's own text opens with hundreds of dataset names, says 'not found' for a
  missing data dir and a missing config alike, and lists no configs of a
  registered dataset whose config is misspelled."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  base, _, config = name.partition('/')
  base, config = base.split(':', 1)[0], config.split(':', 1)[0]
  what = f'dataset {name!r} (config.data.dataset)'
  try:
    configs = sorted(tfds.builder_cls(base).builder_configs)
  except ValueError:  # DatasetNotFoundError: no registered builder of that name.
    configs = None
  if configs is not None:
    if config and config not in configs:
      return f"{what}: TFDS's {base} has no config {config!r}; it has {', '.join(configs)}"
    return f'{what}: {runtime.first_line(error)}'
  root = data_dir or os.path.expanduser(str(tfds.core.constants.DATA_DIR))
  where = (f'config.data.tfds_data_dir={data_dir}' if data_dir else
           f"TFDS's default data dir {root} (config.data.tfds_data_dir is unset)")
  if not os.path.isdir(root):
    return f'unknown {what}: TFDS registers no such dataset, and {where} does not exist'
  folder = os.path.join(root, base)
  if not os.path.isdir(folder):
    return (f'unknown {what}: TFDS registers no such dataset, and {where} holds no {base}; '
            'use scan/simple, scan/length, parallel_text or a TFDS translation dataset')
  prepared = sorted(d for d in os.listdir(folder) if not d.startswith('.') and not _is_version(d)
                    and os.path.isdir(os.path.join(folder, d)))
  if config and config not in prepared:
    return (f'{what}: {folder} has no config {config!r}; it has '
            f"{', '.join(prepared) if prepared else 'none'}")
  return f'{what} cannot be read from {where}: {_tfds_reason(error)}'


def _registered_builder(name, data_config):
  """The TFDS builder of `name` in the data dir, its features checked against the languages."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  data_dir = tfds_data_dir(data_config)
  try:
    builder = _builder(lambda: tfds.builder(name, data_dir=data_dir), name, data_dir)
  except DamagedInfoError:
    raise
  except ValueError as e:  # DatasetNotFoundError is one; a bad config of a registered one too.
    raise ValueError(_unknown_dataset(name, data_dir, e)) from e
  src, tgt = data_config.source_lang, data_config.target_lang
  keys = tuple(getattr(builder.info.features, 'keys', lambda: ())())
  if src not in keys or tgt not in keys:
    raise ValueError(f'{name} has features {keys}; source_lang={src!r} and '
                     f'target_lang={tgt!r} must both be among them')
  return builder


def _not_prepared(name, builder, data_config):
  data_dir = tfds_data_dir(data_config)
  return DataNotPreparedError(
      f'{name} is not prepared in {builder.data_dir} (this program never downloads). '
      f'Prepare it with:\n  {prepare_command(name, data_dir)}\nor\n  python -c "import '
      f"tensorflow_datasets as tfds; tfds.builder('{name}', data_dir={data_dir!r})"
      f'.download_and_prepare()"')


def _iter_registered(name, split, data_config, chunk, field=None):
  builder = _registered_builder(name, data_config)
  try:
    yield from _iter_tfds(builder, split, (data_config.source_lang, data_config.target_lang),
                          chunk, field)
  except AssertionError as e:  # What TFDS raises for data that is not prepared.
    if builder.is_prepared():
      raise
    raise _not_prepared(name, builder, data_config) from e


def _text_exists(text_dir, split, lang):
  plain = os.path.join(text_dir, f'{split}.{lang}')
  return os.path.isfile(plain) or os.path.isfile(plain + '.gz')


def _text_splits(text_dir, lang):
  """The splits of `text_dir` that have a file in language `lang`, sorted."""
  ends = (f'.{lang}', f'.{lang}.gz')
  return sorted({f[:-len(end)] for f in os.listdir(text_dir) for end in ends
                 if f.endswith(end) and len(f) > len(end)})


def _text_files(data_config, split, field):
  """(source path, target path) of `split` of a parallel_text dataset; a missing
  file's error says which setting is wrong: the directory, the split or a language."""
  from transformer.data import parallel_text  # pylint: disable=g-import-not-at-top
  text_dir = data_config.get('text_dir')
  if not text_dir:
    raise ValueError("dataset 'parallel_text' needs config.data.text_dir, the directory of "
                     'its text files')
  langs = (data_config.source_lang, data_config.target_lang)
  try:
    return tuple(parallel_text.find_file(text_dir, split, lang) for lang in langs)
  except FileNotFoundError as e:
    if not os.path.isdir(text_dir):
      what = 'is a file, not a directory' if os.path.exists(text_dir) else 'does not exist'
      raise FileNotFoundError(f'{e} (config.data.text_dir: {text_dir} {what})') from e
    if re.fullmatch(r'.+\[.*\]', split):  # A TFDS slice, e.g. 'val[:5]'.
      raise ValueError(_with_field(
          f'split {split!r} of parallel_text has a slice, and slices are for TFDS datasets '
          f'only: a parallel_text split is a file name ({text_dir}/{{split}}.{{lang}}); '
          'to evaluate its first N examples, give evaluate --limit N', field)) from e
    present = [lang for lang in langs if _text_exists(text_dir, split, lang)]
    if present:  # The split is there in one language: the other language is misnamed.
      which = 'source_lang' if langs[0] not in present else 'target_lang'
      raise FileNotFoundError(f'{e} (config.data.{which})') from e
    unknown = [(name, lang) for name, lang in zip(('source_lang', 'target_lang'), langs)
               if not _text_splits(text_dir, lang)]
    if unknown:  # No split at all in a language: the language is misnamed, not the split.
      raise FileNotFoundError(
          f"{e}; {text_dir} has no file in {' or '.join(repr(lang) for _, lang in unknown)} "
          f"({', '.join(f'config.data.{name}' for name, _ in unknown)})") from e
    splits = _text_splits(text_dir, langs[0])
    raise FileNotFoundError(_with_field(
        f"{e}; {text_dir} has split{'s' if len(splits) != 1 else ''} "
        f"{', '.join(map(repr, splits))} in {langs[0]!r}", field)) from e


def tfds_data_dir(data_config):
  """config.data.tfds_data_dir, None (TFDS's default) where unset or empty: an
  empty string would make TFDS prepare the dataset in the current directory. A
  file in its place is an error naming the field, where TFDS says '[Errno 20] Not
  a directory' of a path inside it (SCAN) or that the dataset is not prepared."""
  data_dir = data_config.get('tfds_data_dir') or None
  if data_dir and os.path.exists(data_dir) and not os.path.isdir(data_dir):
    raise NotADirectoryError(f'config.data.tfds_data_dir={data_dir} is not a directory')
  return data_dir


def load_pairs(data_config, split, field=None):
  """(source, target) string pairs of `split` of `data_config.dataset`."""
  return [pair for pairs in iter_pairs(data_config, split, field=field) for pair in pairs]


def iter_pairs(data_config, split, chunk=CHUNK, field=None):
  """The pairs of `split` in their order, as lists of up to `chunk` pairs. A
  generator: nothing is read, and no error raised, before the first is asked for."""
  if chunk < 1:
    raise ValueError(f'chunk must be >= 1, got {chunk}')
  dataset = data_config.dataset
  if dataset.startswith('scan/'):
    yield from _iter_scan(_scan_config(dataset), split, tfds_data_dir(data_config), chunk,
                          field=field)
    return
  if dataset == 'parallel_text':
    from transformer.data import parallel_text  # pylint: disable=g-import-not-at-top
    yield from parallel_text.iter_pairs(*_text_files(data_config, split, field), chunk)
    return
  yield from _iter_registered(dataset, split, data_config, chunk, field)


def check_split(data_config, split, field=None):
  """Raises what reading `split` would where it cannot be found (no text files; a
  TFDS dataset, split name or slice that does not resolve), without reading it.
  A SCAN dataset not yet prepared has only its split name checked."""
  dataset = data_config.dataset
  if dataset.startswith('scan/'):
    config = _scan_config(dataset)
    _check_scan_split_name(split, field)
    builder = _scan_builder(config, tfds_data_dir(data_config))
    if builder.is_prepared():
      _tfds_split_size(builder, split, field)
    return
  if dataset == 'parallel_text':
    _text_files(data_config, split, field)
    return
  builder = _registered_builder(dataset, data_config)
  if not builder.is_prepared():
    raise _not_prepared(dataset, builder, data_config)
  _tfds_split_size(builder, split, field)
