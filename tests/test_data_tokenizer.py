"""SentencePiece tokenizer: special ids, round trip, UNK, load_or_train caching."""
import os

import ml_collections
import numpy as np
import pytest
import sentencepiece as spm

from transformer.data import tokenizer as tok_lib

TEXTS = ['a small dog runs on the grass', 'ein kleiner Hund rennt auf dem Gras',
         'two dogs play in the snow', 'zwei Hunde spielen im Schnee'] * 5


def _config(**kw):
  c = ml_collections.ConfigDict({'vocab_path': None, 'vocab_type': 'bpe', 'vocab_size': 300})
  c.update(kw)
  return c


@pytest.fixture(scope='module')
def bpe():
  return tok_lib.train(TEXTS, 'bpe', 300)


def test_special_ids_are_fixed_and_distinct(bpe):
  ids = (tok_lib.PAD_ID, tok_lib.UNK_ID, tok_lib.BOS_ID, tok_lib.EOS_ID)
  assert ids == (0, 1, 2, 3)
  assert len(set(ids)) == 4
  sp = spm.SentencePieceProcessor(model_proto=bpe.model_proto)
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == ids


def test_round_trip_and_no_specials_in_encode(bpe):
  text = 'two small dogs play on the grass'
  ids = bpe.encode(text)
  assert tok_lib.BOS_ID not in ids and tok_lib.EOS_ID not in ids and tok_lib.PAD_ID not in ids
  assert bpe.decode(ids) == text
  assert bpe.decode([tok_lib.BOS_ID] + ids + [tok_lib.EOS_ID] + ids + [0, 0]) == text
  assert bpe.encode_batch([text, 'dog']) == [ids, bpe.encode('dog')]


# Characters that SentencePiece's default NFKC normalization rewrites (ligature,
# vulgar fraction, no-break space, full-width letter, superscript), and ones
# never seen in training (CJK, symbol, emoji, combining accent, RTL script).
FIDELITY_TEXTS = ['a ﬁne dog runs ½ way', 'two\u00a0dogs play in Ｓnow²',
                  'dog 犬 ☃ 🐕 in the grass', 'e\u0301te\u0301 über Straße', 'كلب on the snow']


@pytest.mark.parametrize('vocab_type', ['bpe', 'unigram'])
def test_detokenize_encode_is_identity_on_any_characters(vocab_type):
  """Outputs are scored against references as written: no normalization, and byte
  fallback instead of UNK (the default NFKC model fails every line here)."""
  tok = tok_lib.train(TEXTS, vocab_type, 300)
  for text in FIDELITY_TEXTS:
    ids = tok.encode(text)
    assert tok_lib.UNK_ID not in ids, text
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok_lib.EOS_ID, 5]) == text
  # Runs of spaces collapse (sacreBLEU's tokenizers ignore them too).
  assert tok.decode(tok.encode(' two  dogs ')) == 'two dogs'


@pytest.mark.parametrize('vocab_type', ['bpe', 'unigram'])
def test_decode_gives_one_line_when_byte_pieces_spell_line_breaks(vocab_type):
  """Byte fallback can spell a line break; translate and evaluate write one line
  per input line, so decode gives each break as a space."""
  tok = tok_lib.train(TEXTS, vocab_type, 300)
  sp = spm.SentencePieceProcessor(model_proto=tok.model_proto)
  dog = tok.encode('dog')
  for breaks in ('\n', '\r\n', '\r', '\u2028', '\x85'):
    ids = dog + tok.encode(breaks) + dog
    assert tok_lib.UNK_ID not in ids
    assert len(sp.decode(ids).splitlines()) == 2, breaks  # What SentencePiece gives.
    assert tok.decode(ids).splitlines() == [tok.decode(ids)], breaks
    assert tok.decode(ids).split() == ['dog', 'dog'], breaks
  newline = sp.piece_to_id('<0x0A>')
  assert tok.decode(dog + [newline, newline]) == 'dog '


def test_default_sentencepiece_normalization_would_fail_fidelity():
  """The check above can fail: SentencePiece's defaults rewrite these texts."""
  import io  # pylint: disable=g-import-not-at-top
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=proto,
                                 vocab_size=60, hard_vocab_limit=False, minloglevel=2)
  sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
  assert all(sp.decode(sp.encode(t)) != t for t in FIDELITY_TEXTS)


def test_word_vocabulary_maps_unseen_words_to_unk():
  word = tok_lib.train(['walk left twice'], 'word', 32)
  assert word.encode('walk 犬') == [word.encode('walk')[0], tok_lib.UNK_ID]


def test_word_vocabulary_for_scan():
  word = tok_lib.train(['walk left twice', 'I_TURN_LEFT I_WALK I_TURN_LEFT I_WALK'], 'word', 32)
  assert word.vocab_size == 4 + 5  # Fewer pieces than asked for is fine.
  assert word.decode(word.encode('walk left twice')) == 'walk left twice'
  assert word.encode('run left') == [tok_lib.UNK_ID, word.encode('left')[0]]


def test_a_word_vocabulary_too_small_for_the_text_is_warned_of(caplog):
  """A word vocabulary of fewer pieces than the text has words reads the rest
  as UNK: legitimate for a large corpus, a mistake for a closed one (SCAN), so
  it is said, with the size that would hold them all."""
  text = ['walk left twice', 'jump right thrice after look']
  with caplog.at_level('WARNING'):
    small = tok_lib.train(text, 'word', 6)
  assert small.vocab_size == 6
  assert ("vocab_size=6: the word vocabulary leaves 6 of the text's 8 distinct words out, "
          "and they read as UNK (12 holds them all)") in caplog.text
  caplog.clear()
  with caplog.at_level('WARNING'):
    assert tok_lib.train(text, 'word', 12).vocab_size == 12
  assert 'read as UNK' not in caplog.text


def test_training_is_deterministic(bpe):
  assert tok_lib.train(TEXTS, 'bpe', 300).model_proto == bpe.model_proto
  small = tok_lib.train(TEXTS, 'unigram', 290, max_sentences=7)
  assert small.model_proto == tok_lib.train(TEXTS, 'unigram', 290, max_sentences=7).model_proto


def test_load_or_train_saves_then_reuses(tmp_path):
  tok = tok_lib.load_or_train(_config(), str(tmp_path), iter(TEXTS))
  assert os.listdir(tmp_path) == ['spm.model']  # No temporary file left behind.
  # A second call must load, not train: training on no text would raise.
  again = tok_lib.load_or_train(_config(vocab_type='unigram'), str(tmp_path), [])
  assert again.model_proto == tok.model_proto
  other = tmp_path / 'other'
  from_path = tok_lib.load_or_train(
      _config(vocab_path=str(tmp_path / 'spm.model')), str(other), [])
  assert from_path.model_proto == tok.model_proto and not other.exists()


def test_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match='vocab_type'):
    tok_lib.train(TEXTS, 'char-ish', 300)
  with pytest.raises(ValueError, match='vocab_size=60 is too small .* 256 byte pieces'):
    tok_lib.train(TEXTS, 'bpe', 60)
  # Trained for a run, the size is named as the config field it came from.
  with pytest.raises(ValueError, match=r'^config\.data\.vocab_size=60 is too small for a bpe '
                     r'vocabulary of this text: .* 2\d\d pieces at least'):
    tok_lib.load_or_train(_config(vocab_size=60), str(tmp_path / 'small'), TEXTS)
  assert not (tmp_path / 'small').exists()
  with pytest.raises(FileNotFoundError, match='nope.model'):
    tok_lib.load_or_train(_config(vocab_path=str(tmp_path / 'nope.model')), str(tmp_path), [])
  # A model with SentencePiece's default ids (unk=0, no pad) is refused.
  path = tmp_path / 'default_ids.model'
  with open(path, 'wb') as f:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=f,
                                   vocab_size=40, hard_vocab_limit=False, minloglevel=2)
  with pytest.raises(ValueError, match='default_ids.model: special ids'):
    tok_lib.Tokenizer.load(str(path))
  # A damaged vocabulary file (truncated, as a full disk leaves it) is named.
  truncated = tmp_path / 'truncated.model'
  truncated.write_bytes(tok_lib.train(TEXTS, 'bpe', 300).model_proto[:500])
  with pytest.raises(ValueError, match='truncated.model is not a SentencePiece model'):
    tok_lib.Tokenizer.load(str(truncated))
  # A flipped byte can make SentencePiece's own error undecodable: its
  # UnicodeDecodeError named no file.
  proto = tok_lib.train(TEXTS, 'bpe', 300).model_proto
  flipped = tmp_path / 'flipped.model'
  flipped.write_bytes(next(damaged for damaged in (
      proto[:i] + bytes([proto[i] ^ 0xff]) + proto[i + 1:] for i in range(len(proto)))
                           if _spm_raises(damaged, UnicodeDecodeError)))
  with pytest.raises(ValueError, match="flipped.model is not a SentencePiece model .*can't "
                     'decode byte'):
    tok_lib.Tokenizer.load(str(flipped))


def _spm_raises(model_proto, error):
  try:
    spm.SentencePieceProcessor(model_proto=model_proto)
  except error:
    return True
  except Exception:  # pylint: disable=broad-except
    pass
  return False


def test_a_missing_vocab_path_names_the_field(tmp_path):
  """open()'s '[Errno 2] No such file or directory' named the file, not the field
  it came from; nothing is trained or written in its place."""
  missing = tmp_path / 'nope.model'
  with pytest.raises(FileNotFoundError, match=rf'^vocabulary {missing} not found '
                     r'\(config\.data\.vocab_path\)$'):
    tok_lib.load_or_train(_config(vocab_path=str(missing)), str(tmp_path / 'w'), TEXTS)
  with pytest.raises(IsADirectoryError, match=rf'^vocabulary {tmp_path} is a directory, not a '
                     r'SentencePiece model file \(config\.data\.vocab_path\)$'):  # Was 'not found'.
    tok_lib.load_or_train(_config(vocab_path=str(tmp_path)), str(tmp_path / 'w'), TEXTS)
  assert not (tmp_path / 'w').exists()


def test_an_empty_vocabulary_file_is_named_as_empty(tmp_path):
  """A zero-byte spm.model loaded as a model without ids, and the message asked
  for a retrained vocabulary over special ids (-1, -1, -1, -1)."""
  empty = tmp_path / 'spm.model'
  empty.write_bytes(b'')
  with pytest.raises(ValueError, match=r'spm\.model is not a SentencePiece model: it is '
                     r'empty \(damaged or truncated\?\)$'):
    tok_lib.Tokenizer.load(str(empty))
  # Loaded from the workdir (a vocabulary of this run), or from config.data.vocab_path.
  with pytest.raises(ValueError, match='spm.model is not a SentencePiece model: it is empty'):
    tok_lib.load_or_train(_config(), str(tmp_path), TEXTS)
  with pytest.raises(ValueError, match=r'it is empty .*\(config\.data\.vocab_path\)$'):
    tok_lib.load_or_train(_config(vocab_path=str(empty)), str(tmp_path / 'w'), TEXTS)


@pytest.mark.parametrize('vocab_type', ['bpe', 'unigram'])
def test_a_vocabulary_the_text_cannot_fill_is_warned_of(vocab_type, caplog):
  """hard_vocab_limit=False trained vocab_size=20000 on 300 Multi30k lines as 8,885
  pieces, silently: the size trained is said, naming the field."""
  with caplog.at_level('WARNING'):
    tok = tok_lib.train(TEXTS, vocab_type, 2000, field='config.data.vocab_size')
  assert tok.vocab_size < 2000
  assert (f'config.data.vocab_size=2000: this text gives a {vocab_type} vocabulary of '
          f'{tok.vocab_size} pieces only; that is the size trained') in caplog.text
  caplog.clear()
  with caplog.at_level('WARNING'):
    tok_lib.train(TEXTS, vocab_type, tok.vocab_size)  # What the text holds: no warning.
  assert 'pieces only' not in caplog.text


def test_a_word_vocabulary_holding_every_word_is_not_warned_of(caplog):
  """A word vocabulary smaller than vocab_size holds every word (SCAN's 32 gives
  23): as before, only words left out are warned of."""
  with caplog.at_level('WARNING'):
    assert tok_lib.train(['walk left twice'], 'word', 32).vocab_size == 7
  assert not caplog.text


def test_lines_longer_than_sentencepieces_default_limit_are_trained_on():
  """SentencePiece skips lines over 4192 bytes (its default max_sentence_length)
  without a word: a word found only in them got no piece and read byte by byte;
  and a text of such lines alone stopped with `RuntimeError ... [!sentences_.empty()]`."""
  tok = tok_lib.train(TEXTS + ['zebra ' * 1000] * 5, 'bpe', 300)  # 6000-byte lines.
  assert len(tok.encode('zebra')) == 1
  assert tok.decode(tok.encode('zebra dog')) == 'zebra dog'
  all_long = tok_lib.train([f'word{i} ' * 1000 for i in range(10)], 'word', 40)
  assert all_long.vocab_size == 4 + 10
  assert tok_lib.UNK_ID not in all_long.encode('word0 word9')


def test_a_line_of_hundreds_of_kilobytes_trains_on_its_beginning():
  """SentencePiece's unigram trainer fails (`[std::isfinite(score)]`) on a line of
  a few hundred KB, here 450 KB of unspaced CJK: lines over MAX_SENTENCE_BYTES
  train the vocabulary on their first bytes, which hold a word found only there."""
  rng = np.random.default_rng(0)
  chars = [chr(0x4e00 + i) for i in range(100)]
  texts = [''.join(rng.choice(chars[:40], 30)) for _ in range(20_000)]
  huge = ''.join(rng.choice(chars, 150_000))
  assert len(huge.encode('utf-8')) > 400_000
  tok = tok_lib.train(texts + [huge], 'unigram', 2000)
  assert tok_lib.UNK_ID not in tok.encode(huge[:100])
  long_lines = ['zebra ' * 5000] * 5  # 30,000 bytes each, cut to their beginning.
  assert len(long_lines[0]) > tok_lib.MAX_SENTENCE_BYTES
  assert len(tok_lib.train(TEXTS + long_lines, 'bpe', 300).encode('zebra')) == 1


def test_a_text_of_spaces_alone_says_it_holds_no_text():
  """SentencePiece stopped with `RuntimeError ... [(all_chars_count) > (0)]`."""
  with pytest.raises(ValueError, match=r'^no text to train the vocabulary on: SentencePiece '
                     r'reads no characters from its 2 lines'):
    tok_lib.train(['   ', '\u2581'], 'bpe', 300)
