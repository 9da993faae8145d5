"""Translates sentences with a trained model: one output line per input line.

  python -m transformer.translate --workdir DIR [--input FILE|-] [--output FILE|-]
      [--mode beam|greedy|sample] [--beam_size 4] [--alpha 0.6] [--checkpoint latest]
      [--plot_attention OUT.png [--layer -1] [--head all|avg|N]] [--chunk_lines 4096]

  echo "jump twice after walk left" | python -m transformer.translate --workdir runs/default
  # -> I_TURN_LEFT I_WALK I_JUMP I_JUMP  (a well-trained SCAN model)

It streams: the input is read and translated --chunk_lines lines at a time
(sorted by length within the chunk, the outputs put back in input order), each
chunk's translations written and flushed before the next chunk is read, so
memory stays bounded however long the input, and a killed run keeps what it
wrote (a regular --output file's translations so far are in OUTPUT.partial,
renamed to OUTPUT once complete; a symlink, device or pipe is written
directly). An empty line gives an empty line; a line longer than the model's
source limit (min(model.max_len, data.max_length) tokens with EOS) is
truncated to it: the first 10 such lines are named in a warning each on stderr,
and a last warning counts them all; unknown characters become byte pieces (the
UNK token in a word vocabulary), and bad UTF-8 bytes are read as U+FFFD, an
unknown character, with warnings as for over-long lines. Lines end in LF or
CRLF; CR alone (old Mac line ends) is refused, as in the training data.
--plot_attention draws the encoder-decoder attention of the first non-empty
line (plots.py).
"""

if __name__ == "__main__":  # Before JAX starts; see transformer/runtime.py.
  from transformer import runtime, sigterm
  runtime.end_at_interrupt("translate")  # A Ctrl-C at start-up: one line.
  sigterm.watch("translate", "; the chunks translated before it were written (a regular "
                "--output file keeps them as FILE.partial)")  # A SIGTERM: one line (sigterm.py).
  runtime.use_fast_malloc()


import itertools
import os
import stat
import sys

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from transformer import decode, distributed, evaluate, files, inference, plots, runtime, streams
from transformer import workdir as workdir_lib
from transformer.config import DECODE_MODES
from transformer.data import parallel_text
from transformer.data import tokenizer as tokenizer_lib



def source_limit(config):
  """Longest source in tokens, EOS included: positions must exist, and the model
  never saw longer sources in training."""
  return min(config.model.max_len, config.data.max_length)


def iter_lines(path, bad_bytes=None):
  """The lines of a file or of stdin ('-'), one at a time as they arrive,
  without line ends (LF or CRLF; CR alone is an error, as in the training data).
  Bad UTF-8 bytes become U+FFFD (an unknown character) instead of stopping the run, each
  such line counted in `bad_bytes` (a LineWarnings). Lines end at "\n" only
  (not at U+2028 and friends, as str.splitlines() would), so the line count is
  the file's. A byte-order mark before the first line is dropped, as the
  training data's reader drops it."""
  stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # pylint: disable=consider-using-with
  try:
    for number, raw in parallel_text.split_lines(stream, "stdin" if path == "-" else path):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        line = raw.decode("utf-8", errors="replace")
        if bad_bytes is not None:
          bad_bytes.add(number, f"is not valid UTF-8 ({e.reason} at byte {e.start}); its "
                        "bad bytes are read as unknown characters")
      yield line.lstrip("\ufeff") if number == 1 else line
  finally:
    if stream is not sys.stdin.buffer:
      stream.close()


def utf8_stdout():
  """sys.stdout, writing UTF-8 as --output files do whatever the locale's encoding
  (a Latin-1 or cp1252 terminal would fail mid-run on the first character it lacks)."""
  encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower().replace("-", "")
  if encoding != "utf8" and hasattr(sys.stdout, "reconfigure"):  # Not a StringIO.
    sys.stdout.reconfigure(encoding="utf-8")
  return sys.stdout


class LineWarnings:
  """Warnings about input lines: the first WARN_EACH are named on stderr as they
  come, and `summary` gives one line for them all (`what` they were), so that a
  million such lines do not bury stderr."""

  WARN_EACH = 10

  def __init__(self, what: str):
    self.what, self.count, self.first = what, 0, None

  def add(self, line: int, message: str) -> None:
    self.count += 1
    self.first = self.first or line
    if self.count <= self.WARN_EACH and jax.process_index() == 0:
      print(f"translate: warning: line {line} {message}", file=sys.stderr)

  def summary(self, lines: int) -> str:
    return (f"translate: warning: {self.count} of {lines} lines {self.what}; the first is "
            f"line {self.first}")


class Overlong(LineWarnings):
  """The lines cut to the source limit."""

  def __init__(self, limit: int):
    super().__init__(f"were longer than the source limit of {limit} tokens (EOS included) "
                     "and were truncated")
    self.limit = limit

  def add(self, line: int, tokens: int) -> None:  # pylint: disable=arguments-renamed
    super().add(line, f"has {tokens} tokens; keeping the first {self.limit - 1} (the "
                f"model's source limit is {self.limit} with EOS)")


def encode_lines(lines, tokenizer, max_length, first_line=1, overlong=None):
  """(examples, line indices) of the non-empty lines; sources end in EOS and are
  cut to `max_length` tokens, each cut counted in `overlong` (lines numbered
  from `first_line`)."""
  overlong = overlong or Overlong(max_length)
  examples, kept = [], []
  for i, ids in enumerate(tokenizer.encode_batch([line.strip() for line in lines])):
    if not ids:
      continue
    if len(ids) + 1 > max_length:
      overlong.add(i + first_line, len(ids))
      ids = ids[:max_length - 1]
    src = np.array(list(ids) + [tokenizer_lib.EOS_ID], np.int32)
    examples.append((src, src[-1:]))  # The target is unused when decoding.
    kept.append(i)
  return examples, kept


def translate_ids(model, params, tokenizer, config, mesh, lines, first_line=1,
                  overlong=None, **decode_kw):
  """Per input line, (source ids, output ids) or None for an empty line. Line n
  of the input (first_line + its index) samples with the key fold_in(rng, n - 1)."""
  examples, kept = encode_lines(lines, tokenizer, source_limit(config), first_line, overlong)
  outputs = inference.decode_ids(model, params, examples, config, mesh,
                                 example_ids=[first_line - 1 + i for i in kept], **decode_kw)
  result = [None] * len(lines)
  for i, (src, _), out in zip(kept, examples, outputs):
    result[i] = (src, out)
  return result


def translate_lines(model, params, tokenizer, config, mesh, lines, **decode_kw):
  """One detokenized translation per input line, in order ('' for empty lines)."""
  return ["" if r is None else tokenizer.decode(r[1])
          for r in translate_ids(model, params, tokenizer, config, mesh, lines, **decode_kw)]


def token_labels(tokenizer, ids):
  """Readable piece of each id, for plot axes."""
  labels = []
  for i in np.asarray(ids).tolist():
    text = "</s>" if i == tokenizer_lib.EOS_ID else tokenizer.decode([i]).strip()
    labels.append(text or f"<{i}>")
  return labels


def check_paths(input_path: str, output_path: str, plot_attention=None) -> None:
  """Errors, before any work, for an input not every process can read, and for
  files that cannot be written, or whose writing would destroy the input (read
  from stdin too) or another output: --output (written as OUTPUT.partial first)
  and --plot_attention, through symlinks."""
  if input_path != "-" and not os.path.exists(input_path):
    raise FileNotFoundError(f"input {input_path!r} does not exist")
  if input_path == "-" and streams.closed_at_start("stdin"):  # `<&-`
    raise ValueError("--input -: stdin is closed; give the sentences on stdin or a file as "
                     "--input")
  if output_path == "-" and streams.closed_at_start("stdout"):  # `>&-`
    raise ValueError("--output -: stdout is closed; give a file as --output")
  if input_path == "-" and jax.process_count() > 1:
    raise ValueError("--input -: every process of a multi-process job reads the input, and a "
                     "scheduler gives stdin to process 0 alone; give a file they all can read")
  outputs = [] if output_path == "-" else [output_path, output_path + files.PARTIAL_SUFFIX]
  if plot_attention and os.path.realpath(plot_attention) in map(os.path.realpath, outputs):
    raise ValueError(f"--plot_attention {plot_attention!r} is the --output file")
  written = [(path, "--output") for path in outputs] + (
      [(plot_attention, "--plot_attention")] if plot_attention else [])
  for path, flag in written:
    files.check_output(path, flag)
  if plot_attention:
    plots.figure_format(plot_attention, "--plot_attention")
  try:
    source = os.stat(input_path) if input_path != "-" else os.fstat(sys.stdin.fileno())
  except (OSError, ValueError):  # No stdin to stat (closed in Python): nothing it could be.
    source = None
  # Only a regular file can be emptied: a terminal read and written is no loss.
  for path, flag in written:
    if (source is not None and stat.S_ISREG(source.st_mode) and os.path.exists(path)
        and os.path.samestat(os.stat(path), source)):
      raise ValueError(f"{flag} {path!r} is the input" + (" (stdin)" if input_path == "-" else "")
                       + ": writing it would empty it before it is read")


def run(workdir, input_path="-", output_path="-", checkpoint="latest", mode="beam",
        beam_size=None, alpha=None, max_extra_len=None, plot_attention=None, layer=-1,
        head="all", seed=0, temperature=1.0, tokens_per_batch=None,
        chunk_lines=evaluate.CHUNK_LINES, collect=True, compact=None, concurrent_batches=None,
        refill=None):
  """Restores `workdir`, translates the lines of `input_path` into `output_path`
  chunk by chunk (and draws the attention plot if asked); returns the
  translations, or with collect=False (bounded memory) their number."""
  workdir_lib.require_directory(workdir)
  checkpoint = workdir_lib.checkpoint_name(checkpoint)
  decode.check_settings(mode, temperature=temperature)  # The mode, and 0 <= temperature < inf.
  evaluate.check_chunk_lines(chunk_lines)
  if plot_attention == "":  # Was no plot, silently.
    raise ValueError("--plot_attention is empty; give an image file, or leave the flag out")
  config = workdir_lib.load_config(workdir)
  if plot_attention:  # Bad plot flags fail before any work.
    if jax.process_count() > 1:
      raise ValueError("--plot_attention draws in one process; run it without the other "
                       "processes of a multi-process job")
    rnn = config.model.get("architecture") == "rnn"  # One attention: one head, no layers.
    plots.parse_head(head, 1 if rnn else config.model.num_heads)
    if rnn and layer != -1:  # Drawn anyway, the plot would not be of the layer asked.
      raise ValueError(f"--layer {layer}: model.architecture='rnn' has one attention, no "
                       "decoder layers to choose from; leave --layer out")
    if not rnn:
      plots.check_layer(layer, config.model.num_layers)
  if not 0 <= seed < 2**32:  # JAX's keys keep 32 bits: seed and seed + 2^32 would agree.
    raise ValueError(f"seed must be in [0, 2^32), got {seed}")
  check_paths(input_path, output_path, plot_attention)
  settings = evaluate.search_settings("translate", config, mode, beam_size, alpha,
                                      max_extra_len, compact, refill)
  if mode != "sample" and (seed != 0 or temperature != 1.0) and jax.process_index() == 0:
    print(f"translate: warning: --seed and --temperature act in --mode sample only; "
          f"--mode {mode} ignores them", file=sys.stderr)
  if not plot_attention and (layer != -1 or head != "all") and jax.process_index() == 0:
    print("translate: warning: --layer and --head choose what --plot_attention draws; "
          "without it they are ignored", file=sys.stderr)
  restored = workdir_lib.restore(workdir, checkpoint)
  decode_kw = dict(
      mode=mode, **settings,
      temperature=temperature, tokens_per_batch=tokens_per_batch,
      concurrent_batches=concurrent_batches)
  bad_bytes = LineWarnings("were not valid UTF-8 (their bad bytes read as unknown characters)")
  lines = iter_lines(input_path, bad_bytes)
  outputs, count, first = [], 0, None
  overlong = Overlong(source_limit(config))
  # Every process holds every output; the first writes them, a file as
  # OUTPUT.partial until complete.
  partial = output_path != "-" and files.writes_through_partial(output_path)
  out = distributed.process_0_only(
      lambda: (utf8_stdout() if output_path == "-"
               else files.open_partial(output_path) if partial
               else open(output_path, "w", encoding="utf-8")),  # pylint: disable=consider-using-with
      "opening --output")
  try:
    while True:
      chunk = list(itertools.islice(lines, chunk_lines))
      if not chunk:
        break
      results = translate_ids(restored.model, restored.params, restored.tokenizer, config,
                              restored.mesh, chunk, first_line=count + 1, overlong=overlong,
                              rng=jax.random.key(seed), **decode_kw)
      texts = ["" if r is None else restored.tokenizer.decode(r[1]) for r in results]
      if out is not None:
        files.write_lines(out, texts)  # A killed run keeps every chunk written so far.
      first = first or next((r for r in results if r is not None), None)
      count += len(chunk)
      if collect:
        outputs += texts
    if out is not None and partial:
      files.commit_partial(out, output_path)
  finally:
    if out is not None and partial:
      files.close_partial(out, output_path)
    elif out not in (None, sys.stdout):
      with files.naming(output_path):
        out.close()
  for warnings in (bad_bytes, overlong):
    if warnings.count and jax.process_index() == 0:
      print(warnings.summary(count), file=sys.stderr)
  if plot_attention:
    if first is None:
      raise ValueError("nothing to plot: every input line is empty or encodes to no tokens")
    src, out = first
    weights = plots.cross_attention_weights(restored.model, restored.params, src, out, layer)
    plots.plot_attention(weights, token_labels(restored.tokenizer, src),
                         token_labels(restored.tokenizer, out), plot_attention, head=head,
                         title="decoder attention over the source (rnn)"
                         if config.model.get("architecture") == "rnn" else
                         f"encoder-decoder attention, decoder layer "
                         f"{layer % config.model.num_layers}")
  return outputs if collect else count


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # A filter's stderr carries its warnings, not the libraries' INFO lines (Orbax
  # logs a dozen per restore); --verbosity=0 brings them back.
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  with workdir_lib.command("translate", f.workdir):
    run(f.workdir, f.input, f.output, f.checkpoint, f.mode, f.beam_size, f.alpha,
        f.max_extra_len, f.plot_attention, f.layer, f.head, f.seed, f.temperature,
        f.tokens_per_batch, f.chunk_lines, collect=False, compact=f.compact,
        concurrent_batches=f.concurrent_batches, refill=f.refill)


if __name__ == "__main__":
  evaluate.define_decode_flags(DECODE_MODES, "beam")
  flags.adopt_module_key_flags(evaluate)  # Listed by --help with translate's own.
  flags.DEFINE_string("input", "-", "Sentences, one a line; '-' reads stdin.")
  flags.DEFINE_string("output", "-", "Translations, one a line; '-' writes stdout.")
  flags.DEFINE_string("plot_attention", None, "Image file for the attention heatmap of the "
                      "first non-empty input line (its format from the suffix: .png, .svg, "
                      ".pdf, ...).")
  flags.DEFINE_integer("layer", -1, "Decoder layer to plot (-1: the last).")
  flags.DEFINE_string("head", "all", "all (one panel per head) | avg | a head number.")
  flags.DEFINE_integer("seed", 0, "Sampling seed (--mode sample).", lower_bound=0,
                       upper_bound=2**32 - 1)
  flags.DEFINE_float("temperature", 1.0, "Sampling temperature (--mode sample; 0: the "
                     "argmax, as --mode greedy).")
  runtime.run(main, "translate")
