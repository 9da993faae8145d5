"""SentencePiece tokenizer with fixed special ids, trained in-process on a shared vocabulary.

Text is not normalized (SentencePiece's 'identity' rule, not its default NFKC), and
bpe/unigram vocabularies fall back to UTF-8 bytes for characters unseen in
training. Outputs are scored against references as written, so the model must be
able to emit every character a reference can hold: under NFKC "ﬁ" came out as
"fi" and "½" as "1⁄2", and an unseen character as "⁇", each a silent BLEU loss.
Runs of spaces still collapse to one, which sacreBLEU's tokenizers ignore, and
U+2581 (SentencePiece's space marker) reads back as a space.
Word vocabularies (SCAN) have no byte pieces: an unseen word is UNK.
"""
import io
import os
import re
from typing import Optional

from absl import logging
import numpy as np
import sentencepiece as spm

from transformer import files, runtime
from transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, VOCAB_TYPES  # pylint: disable=g-multiple-import
MODEL_FILENAME = 'spm.model'
MAX_TRAIN_SENTENCES = 300_000  # Caps training time at seconds; more barely changes the pieces.
MAX_SENTENCE_BYTES = 16_384  # Longer training lines train the vocabulary on their beginning.
TRAIN_SEED = 0
TRAIN_THREADS = 4  # The trained model depends on the thread count: fixed, not os.cpu_count().


class Tokenizer:
  """Text <-> ids. `encode` adds no BOS/EOS; `decode` stops at EOS and drops PAD/BOS."""

  def __init__(self, model_proto, name='<memory>'):
    if not model_proto:  # SentencePiece loads no bytes as a model without ids (all -1).
      raise ValueError(f'{name} is not a SentencePiece model: it is empty (damaged or '
                       'truncated?)')
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    # SentencePiece's parse error names neither file nor cause; some damage makes
    # its message undecodable (a UnicodeDecodeError).
    except (RuntimeError, UnicodeDecodeError) as e:
      raise ValueError(f'{name} is not a SentencePiece model (damaged or truncated?): '
                       f'{runtime.first_line(e)}') from e
    self.model_proto = model_proto
    found = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
    if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
      raise ValueError(f'{name}: special ids (pad, unk, bos, eos) are {found}, expected '
                       f'{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; retrain the vocabulary')

  @classmethod
  def load(cls, path):
    with open(path, 'rb') as f:  # FileNotFoundError names the path.
      return cls(f.read(), name=path)

  @property
  def vocab_size(self):
    return self._sp.get_piece_size()

  def encode(self, text):
    """Ids of `text` (unknown characters -> UNK_ID)."""
    return self._sp.encode(text)

  def encode_batch(self, texts):
    """`encode` over many texts, in C++ threads."""
    return self._sp.encode(list(texts), num_threads=os.cpu_count() or 1)

  def decode(self, ids):
    """Text of `ids` up to the first EOS, as one line; PAD and BOS are skipped.

    Byte pieces can spell a line break (`<0x0A>`), and every caller writes one
    output line per input line: each line boundary of str.splitlines() becomes
    a space, which sacreBLEU's tokenizers treat as the break would have been.
    """
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i not in (PAD_ID, BOS_ID):
        out.append(i)
    return ' '.join(self._sp.decode(out).splitlines())

  def save(self, path):
    """Writes the model atomically: a crash never leaves a partial file."""
    files.write_atomic(path, self.model_proto)


def train(texts, vocab_type, vocab_size, max_sentences=MAX_TRAIN_SENTENCES, seed=TRAIN_SEED,
          field='vocab_size'):
  """Trains a SentencePiece model on `texts`; deterministic for the same inputs.
  `field` is what messages call the size (the config field it came from)."""
  if vocab_type not in VOCAB_TYPES:
    raise ValueError(f'vocab_type must be one of {VOCAB_TYPES}, got {vocab_type!r}')
  texts = [t for t in texts if t]
  if not texts:
    raise ValueError('no text to train the vocabulary on')
  if len(texts) > max_sentences:
    # Our own seeded sample: SentencePiece's sampler is not seeded per call.
    keep = np.random.default_rng(seed).choice(len(texts), max_sentences, replace=False)
    texts = [texts[i] for i in np.sort(keep)]
  # SentencePiece skips lines over max_sentence_length bytes (4192 by default)
  # without a word, and its unigram trainer fails on lines of a few hundred KB:
  # longer lines train on their beginning, and the longest line sets the limit.
  lengths = [len(t.encode('utf-8')) for t in texts]
  cut = [i for i, n in enumerate(lengths) if n > MAX_SENTENCE_BYTES]
  for i in cut:
    texts[i] = texts[i].encode('utf-8')[:MAX_SENTENCE_BYTES].decode('utf-8', 'ignore')
  if cut:
    logging.info('%d training line(s) over %d bytes train the vocabulary on their first '
                 '%d bytes', len(cut), MAX_SENTENCE_BYTES, MAX_SENTENCE_BYTES)
  longest = max(min(n, MAX_SENTENCE_BYTES) for n in lengths)
  spm.set_random_generator_seed(seed)
  proto = io.BytesIO()
  byte_fallback = vocab_type != 'word'
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=proto,
        model_type=vocab_type, vocab_size=vocab_size,
        hard_vocab_limit=False,  # Small corpora (SCAN words) have fewer pieces than asked.
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        normalization_rule_name='identity', byte_fallback=byte_fallback,
        input_sentence_size=0, shuffle_input_sentence=False,  # Sampled above already.
        num_threads=TRAIN_THREADS,
        max_sentence_length=max(longest, 10),  # 10: the least SentencePiece takes.
        minloglevel=2)
  except RuntimeError as e:
    if 'sentences_.empty()' in str(e) or 'all_chars_count' in str(e):
      # SentencePiece says so as a failed assertion naming its own source line.
      raise ValueError(f'no text to train the vocabulary on: SentencePiece reads no '
                       f'characters from its {len(texts)} lines (spaces and U+2581 are '
                       'word boundaries to it)') from e
    if 'Vocabulary size is smaller than required_chars' not in str(e):
      raise
    needed = re.search(r'\d+ vs (\d+)', str(e))
    raise ValueError(
        f'{field}={vocab_size} is too small for a {vocab_type} vocabulary of this '
        'text: it must hold the 256 byte pieces, the special ids and every character '
        f'of the text, {needed.group(1) if needed else "more"} pieces at least') from e
  tok = Tokenizer(proto.getvalue())
  if vocab_type != 'word' and tok.vocab_size < vocab_size:
    # hard_vocab_limit=False lets a corpus too small for the size give fewer pieces;
    # the model is built for the size trained, so a sweep over sizes above it would
    # compare identical vocabularies.
    logging.warning('%s=%d: this text gives a %s vocabulary of %d pieces only; that is the '
                    'size trained', field, vocab_size, vocab_type, tok.vocab_size)
  if vocab_type == 'word':  # No byte fallback: a word left out reads as UNK.
    words = sorted({w for t in texts for w in t.split()})
    missing = sum(ids == [UNK_ID] for ids in tok.encode_batch(words))
    if missing:
      logging.warning('%s=%d: the word vocabulary leaves %d of the text\'s %d distinct '
                      'words out, and they read as UNK (%d holds them all)', field,
                      vocab_size, missing, len(words), tok.vocab_size + missing)
  return tok


def vocabulary_path(data_config, workdir) -> str:
  """Where a run's vocabulary is: `data_config.vocab_path` if set, else `{workdir}/spm.model`."""
  return data_config.get('vocab_path') or os.path.join(workdir, MODEL_FILENAME)


def given_vocab_size(data_config) -> Optional[int]:
  """The size of the vocabulary `data_config.vocab_path` names, where it names a
  readable one (counts before training are of it, not of data.vocab_size); else None."""
  path = data_config.get('vocab_path')
  if not path or not os.path.isfile(path):
    return None
  try:
    return Tokenizer.load(path).vocab_size
  except ValueError:  # Training's load names the field and the file.
    return None


def load_or_train(data_config, workdir, texts):
  """The vocabulary at vocabulary_path: `data_config.vocab_path` if set, else
  `{workdir}/spm.model` if present, else one trained and saved there.

  `texts` (sources and targets together, for a shared vocabulary) is only
  consumed when training.
  """
  path = vocabulary_path(data_config, workdir)
  if data_config.get('vocab_path'):
    if os.path.isdir(path):
      raise IsADirectoryError(f'vocabulary {path} is a directory, not a SentencePiece model '
                              'file (config.data.vocab_path)')
    if not os.path.isfile(path):  # open()'s error would name the path, not the field.
      raise FileNotFoundError(f'vocabulary {path} not found (config.data.vocab_path)')
    try:
      return Tokenizer.load(path)
    except ValueError as e:
      raise ValueError(f'{e} (config.data.vocab_path)') from e
  if os.path.exists(path):
    return Tokenizer.load(path)
  tok = train(texts, data_config.vocab_type, data_config.vocab_size,
              field='config.data.vocab_size')
  os.makedirs(workdir, exist_ok=True)
  tok.save(path)
  return tok
