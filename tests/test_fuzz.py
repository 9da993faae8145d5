"""Generated inputs (hypothesis): the text-data reader on files holding anything
(empty or whitespace-only lines, mismatched counts, invalid UTF-8, NUL bytes,
CRLF, very long lines, damaged gzip) gives the dataset or a ValueError naming
the file and line, never another exception; a config override of any field with
any value parses and passes the checks, or stops in one line naming the field."""

import gzip
import math
import os
import re
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from configs import default
from transformer.config import check_config
from transformer.data import parallel_text
from tests.helpers import DEFAULT, train_flags

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# A line's bytes, without its line end: text (any Unicode but newlines, so NUL,
# controls, RTL and emoji included; lone surrogates have no UTF-8 form, invalid
# bytes come from st.binary), empty, whitespace only, invalid UTF-8, or long.
_TEXT = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)),
                max_size=40).map(str.encode)
LINE = st.one_of(
    _TEXT, _TEXT, st.just(b""), st.sampled_from([b" ", b"\t \t", "\u3000 \u2028".encode()]),
    st.binary(max_size=12).filter(lambda b: b"\n" not in b and b"\r" not in b),
    st.integers(5_000, 50_000).map(lambda n: b"x" * n), st.just(b"a\x00b"))


@st.composite
def text_files(draw):
  """(source bytes, target bytes, gzip either?, damage to the gzip stream)."""
  src = draw(st.lists(LINE, max_size=8))
  tgt = draw(st.lists(LINE, max_size=8)) if draw(st.booleans()) else list(src)
  end = draw(st.sampled_from([b"\n", b"\r\n"]))
  last = draw(st.booleans())  # A line end after the last line, or not.
  data = [end.join(lines) + (end if lines and last else b"") for lines in (src, tgt)]
  gz = draw(st.sampled_from([None, "source", "target"]))
  damage = draw(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3))
  cut = draw(st.one_of(st.none(), st.integers(0, 10**6)))
  return data, gz, damage, cut


def _write(directory, lang, data, gz, damage, cut):
  path = os.path.join(directory, f"train.{lang}" + (".gz" if gz else ""))
  if gz:
    data = bytearray(gzip.compress(data))
    for at, value in damage:
      data[at % len(data)] = value
    data = bytes(data[:cut]) if cut is not None else bytes(data)
  with open(path, "wb") as f:
    f.write(data)
  return path


def _lines(path):
  """The lines of `path` as bytes without their ends, read one by one as the
  reader does (so a damaged gzip stream fails where the reader's does)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    for raw in f:
      yield raw.rstrip(b"\r\n")


def _line(path, n):
  """Line n (1-based) of `path`, or None past the end."""
  for i, raw in enumerate(_lines(path), start=1):
    if i == n:
      return raw
  return None


def _bad_line(raw, n):
  """Why line `raw` (line n) cannot be a sentence, or None."""
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError:
    return "not valid UTF-8"
  return None if (text.lstrip("\ufeff") if n == 1 else text).strip() else "empty line"


@FUZZ
@given(text_files())
def test_reader_gives_the_pairs_or_names_file_and_line(case):
  (src_data, tgt_data), gz, damage, cut = case
  with tempfile.TemporaryDirectory() as directory:
    src = _write(directory, "en", src_data, gz == "source", damage, cut)
    tgt = _write(directory, "de", tgt_data, gz == "target", damage, cut)
    try:
      pairs = parallel_text.read_pairs(src, tgt)
    except ValueError as e:
      message = str(e)
      found = re.match(r"(.+?):(\d+): ", message) or re.match(
          r"(.+?): cannot read after line (\d+): ", message)
      assert found and found.group(1) in (src, tgt), message
      path, n = found.group(1), int(found.group(2))
      if "cannot read" in message:  # Damaged gzip: it is the gzip file named.
        assert gz and path.endswith(".gz"), message
      elif "no counterpart" in message:
        other = tgt if path == src else src
        assert _line(path, n) is not None and _line(other, n) is None, message
      else:
        assert _bad_line(_line(path, n), n) in message, message
      return
    for path in (src, tgt):  # Every line came through, as a non-empty sentence.
      assert sum(1 for _ in _lines(path)) == len(pairs)
    for pair in pairs:
      assert all(s and s == s.strip() for s in pair)


def test_damaged_gzip_is_named_not_a_zlib_traceback(tmp_path):
  data = bytearray(gzip.compress(b"".join(b"sentence %d\n" % i for i in range(300))))
  data[len(data) // 2] ^= 0xFF
  (tmp_path / "train.en.gz").write_bytes(bytes(data))
  (tmp_path / "train.de").write_bytes(b"".join(b"satz %d\n" % i for i in range(300)))
  with pytest.raises(ValueError, match=r"train\.en\.gz: cannot read after line \d+: "):
    parallel_text.load_split(str(tmp_path), "train", "en", "de")



# ----------------------------------------------------------------------------
# Config overrides.

def _leaves(tree, prefix=""):
  for key, value in tree.items():
    if hasattr(value, "items"):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}"


FIELDS = sorted(_leaves(default.get_config()))
# The ranges the checks promise, field by field: a value outside must be refused.
POSITIVE_INTS = ("data.vocab_size", "data.max_length", "data.tokens_per_batch",
                 "data.pack_length", "optim.warmup_steps", "train.num_steps",
                 "train.grad_accum_steps", "train.log_every", "train.eval_every",
                 "train.checkpoint_every", "train.keep_checkpoints", "decode.beam_size",
                 "decode.concurrent_batches", "model.num_layers", "model.d_model", "model.d_ff", "model.num_heads",
                 "model.max_len", "distributed.initialization_timeout_s",
                 "distributed.heartbeat_timeout_s", "distributed.shutdown_timeout_s")
NON_NEGATIVE_INTS = ("seed", "data.pack_source_length", "data.prefetch",
                     "decode.tokens_per_batch", "decode.max_extra_len", "decode.compact",
                     "decode.refill",
                     "train.decode_every",
                     "train.decode_examples", "model.d_k")
UNIT_FLOATS = ("train.label_smoothing", "optim.adam_b1", "optim.adam_b2", "model.dropout",
               "model.attention_dropout")  # [0, 1)
POSITIVE_FLOATS = ("optim.learning_rate_scale", "optim.adam_eps")
NON_NEGATIVE_FLOATS = ("decode.alpha", "optim.weight_decay", "optim.grad_clip_norm")
_NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


def _bad_value(field):
  if field in POSITIVE_INTS:
    return st.integers(max_value=0)
  if field == "seed":  # jax.random.key keeps 32 bits.
    return st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32))
  if field in NON_NEGATIVE_INTS:
    return st.integers(max_value=-1)
  if field in UNIT_FLOATS:
    return st.one_of(st.floats(max_value=-1e-12), st.floats(min_value=1.0), _NOT_FINITE)
  if field in POSITIVE_FLOATS:
    return st.one_of(st.floats(max_value=0.0), _NOT_FINITE)
  return st.one_of(st.floats(max_value=-1e-12), _NOT_FINITE)


def test_every_numeric_field_has_a_promised_range():
  numeric = {f for f in FIELDS if isinstance(_get(default.get_config(), f), (int, float))
             and not isinstance(_get(default.get_config(), f), bool)}
  assert numeric == set(POSITIVE_INTS + NON_NEGATIVE_INTS + UNIT_FLOATS + POSITIVE_FLOATS
                        + NON_NEGATIVE_FLOATS)


def _get(config, field):
  for part in field.split("."):
    config = config[part]
  return config


@FUZZ
@given(st.sampled_from(POSITIVE_INTS + NON_NEGATIVE_INTS + UNIT_FLOATS + POSITIVE_FLOATS
                       + NON_NEGATIVE_FLOATS).flatmap(lambda f: st.tuples(st.just(f),
                                                                          _bad_value(f))))
def test_a_value_out_of_range_is_refused_naming_the_field(case):
  field, value = case
  config = default.get_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(ValueError) as raised:
    check_config(config)
  message = str(raised.value)
  assert field in message and "\n" not in message, message


_ANY_TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            max_size=12),
    st.integers(-10**12, 10**12).map(str), st.floats().map(str),
    st.sampled_from(["", "nan", "-inf", "1e400", "True", "none", "None", "0x10", "1_000"]))


@FUZZ
@given(st.sampled_from(FIELDS), _ANY_TEXT)
def test_any_override_parses_and_checks_or_stops_in_one_line_naming_the_field(field, text):
  config, error = train_flags(DEFAULT, f"--config.{field}={text}")
  if error is not None:
    assert error.startswith("train: error: ") and "\n" not in error, error
    assert f"--config.{field}" in error, error
    return
  try:
    check_config(config)
  except ValueError as e:
    assert field.rpartition(".")[2] in str(e) and "\n" not in str(e), str(e)
