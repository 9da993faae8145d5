"""Aligned plain or gzip text files, one sentence per line: `{text_dir}/{split}.{lang}[.gz]`.

A direct reader, not a TFDS builder: a TFDS cache is keyed by name and version,
not file contents, so editing or replacing the files would silently keep serving
the old data. These corpora (e.g. Multi30k, 29k lines) are read in well under a
second, so a cache would buy nothing.
"""
import gzip
import itertools
import os
import zlib


def find_file(text_dir, split, lang):
  """Path of `{split}.{lang}` or `{split}.{lang}.gz` in `text_dir` (exactly one must exist)."""
  plain = os.path.join(text_dir, f'{split}.{lang}')
  gz = plain + '.gz'
  found = [p for p in (plain, gz) if os.path.isfile(p)]
  folders = [p for p in (plain, gz) if os.path.isdir(p)]
  if not found and folders:  # Not a misnamed split or language: name what is there.
    raise IsADirectoryError(f'{folders[0]} is a directory, not the text file of split '
                            f'{split!r}, language {lang!r}')
  if not found:
    raise FileNotFoundError(f'no text file for split {split!r}, language {lang!r}: '
                            f'tried {plain} and {gz}')
  if len(found) == 2:
    # Which one is current is unknowable; refuse rather than guess.
    raise ValueError(f'both {plain} and {gz} exist; keep only one')
  return found[0]


def split_lines(stream, name):
  """Yields (1-based line number, raw bytes without the line end) of a binary
  stream, lines ending in LF or CRLF; ValueError, naming `name`, for CR alone
  (old Mac line ends), with which the whole file would read as one line. That
  shows as CRs inside a line that is the file's last without an LF, or its only
  one, or that holds two or more; a single stray CR inside a line of an LF file
  stays part of the line."""
  held = None  # A first line with a CR: refused if it is the file's only one.
  for n, raw in enumerate(stream, start=1):
    line = raw.rstrip(b'\r\n')
    crs = line.count(b'\r')
    if crs > 1 or (crs and not raw.endswith(b'\n')):
      raise _cr_error(name, n)
    if held:
      yield held
      held = None
    if crs and n == 1:
      held = (n, line)
    else:
      yield n, line
  if held:
    raise _cr_error(name, 1)


def _cr_error(name, n):
  return ValueError(f'{name}:{n}: lines end in a carriage return (CR) alone; they must '
                    'end in LF or CRLF')


def _lines(path):
  """split_lines of a plain or gzip file; errors name the file."""
  opener = gzip.open if path.endswith('.gz') else open
  n = 0
  try:
    with opener(path, 'rb') as f:
      for n, line in split_lines(f, path):
        yield n, line
  except (OSError, EOFError, zlib.error) as e:  # Corrupt or truncated gzip stream.
    raise ValueError(f'{path}: cannot read after line {n}: {e}') from e


def _decode(path, n, raw):
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    raise ValueError(f'{path}:{n}: line is not valid UTF-8 ({e.reason} at byte '
                     f'{e.start})') from e
  if n == 1:
    text = text.lstrip('\ufeff')  # Byte-order mark some editors write.
  text = text.strip()
  if not text:
    raise ValueError(f'{path}:{n}: empty line (every line must hold a sentence)')
  return text


def read_pairs(source_path, target_path):
  """(source, target) string pairs from two line-aligned files; ValueError names file:line."""
  return [pair for pairs in iter_pairs(source_path, target_path) for pair in pairs]


def iter_pairs(source_path, target_path, chunk=4096):
  """read_pairs as lists of up to `chunk` pairs, read as they are asked for."""
  pairs = []
  zipped = itertools.zip_longest(_lines(source_path), _lines(target_path))
  for src, tgt in zipped:
    if src is None or tgt is None:
      longer, shorter = (target_path, source_path) if src is None else (source_path, target_path)
      n = (tgt or src)[0]
      raise ValueError(f'{longer}:{n}: line has no counterpart: {shorter} has only '
                       f'{n - 1} lines (the files must be line-aligned)')
    pairs.append((_decode(source_path, *src), _decode(target_path, *tgt)))
    if len(pairs) == chunk:
      yield pairs
      pairs = []
  if pairs:
    yield pairs


def load_split(text_dir, split, source_lang, target_lang):
  """(source, target) pairs of `split` read from `text_dir`."""
  return read_pairs(find_file(text_dir, split, source_lang),
                    find_file(text_dir, split, target_lang))
