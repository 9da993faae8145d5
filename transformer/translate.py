"""Translates sentences with a trained model: one output line per input line.

  python -m transformer.translate --workdir DIR [--input FILE|-] [--output FILE|-]
      [--mode beam|greedy|sample] [--beam_size 4] [--alpha 0.6] [--checkpoint latest]
      [--plot_attention OUT.png [--layer -1] [--head all|avg|N]]

  echo "jump twice after walk left" | python -m transformer.translate --workdir runs/default
  # -> I_TURN_LEFT I_WALK I_JUMP I_JUMP  (a well-trained SCAN model)

Sentences are batched by length and the outputs put back in input order. An
empty line gives an empty line; a line longer than the model's source limit
(min(model.max_len, data.max_length) tokens with EOS) is truncated, with a
warning on stderr; unknown characters become the UNK token. An --output file is
written whole or not at all. --plot_attention draws the encoder-decoder
attention of the first non-empty line (plots.py).
"""

if __name__ == "__main__":  # Before JAX starts; see transformer/runtime.py.
  from transformer import runtime
  runtime.use_fast_malloc()


import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

from transformer import distributed, evaluate, files, inference, plots, runtime
from transformer import workdir as workdir_lib
from transformer.config import DECODE_MODES
from transformer.data import tokenizer as tokenizer_lib



def source_limit(config):
  """Longest source in tokens, EOS included: positions must exist, and the model
  never saw longer sources in training."""
  return min(config.model.max_len, config.data.max_length)


def read_lines(path):
  """Lines of a file or of stdin ('-'), without line ends; bad UTF-8 bytes become
  U+FFFD (then UNK) instead of stopping the run."""
  if path == "-":
    text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
  else:
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
  # split("\n"), not splitlines(): the latter also breaks at U+2028 and friends,
  # which would change the line count.
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  return [line.rstrip("\r") for line in lines]


def encode_lines(lines, tokenizer, max_length):
  """(examples, line indices) of the non-empty lines; sources end in EOS and are
  cut to `max_length` tokens, with a warning on stderr naming the line."""
  examples, kept = [], []
  for i, ids in enumerate(tokenizer.encode_batch([line.strip() for line in lines])):
    if not ids:
      continue
    if len(ids) + 1 > max_length:
      print(f"translate: warning: line {i + 1} has {len(ids)} tokens; keeping the first "
            f"{max_length - 1} (the model's source limit is {max_length} with EOS)",
            file=sys.stderr)
      ids = ids[:max_length - 1]
    src = np.array(list(ids) + [tokenizer_lib.EOS_ID], np.int32)
    examples.append((src, src[-1:]))  # The target is unused when decoding.
    kept.append(i)
  return examples, kept


def translate_ids(model, params, tokenizer, config, mesh, lines, **decode_kw):
  """Per input line, (source ids, output ids) or None for an empty line."""
  examples, kept = encode_lines(lines, tokenizer, source_limit(config))
  outputs = inference.decode_ids(model, params, examples, config, mesh, **decode_kw)
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


def run(workdir, input_path="-", output_path="-", checkpoint="latest", mode="beam",
        beam_size=None, alpha=None, max_extra_len=None, plot_attention=None, layer=-1,
        head="all", seed=0, temperature=1.0, tokens_per_batch=None):
  """Restores `workdir`, translates the lines of `input_path` into `output_path`
  (and draws the attention plot if asked); returns the translations."""
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"workdir {workdir!r} does not exist")
  workdir_lib.checkpoint_location(workdir, checkpoint)
  if mode not in DECODE_MODES:
    raise ValueError(f"mode must be one of {DECODE_MODES}, got {mode!r}")
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  config = workdir_lib.load_config(workdir)
  if plot_attention:  # Bad plot flags fail before any work.
    if jax.process_count() > 1:
      raise ValueError("--plot_attention draws in one process; run it without the other "
                       "processes of a multi-process job")
    plots.parse_head(head, config.model.num_heads)
    if not -config.model.num_layers <= layer < config.model.num_layers:
      raise ValueError(f"layer {layer} out of range for a {config.model.num_layers}-layer "
                       "decoder")
  lines = read_lines(input_path)
  restored = workdir_lib.restore(workdir, checkpoint)
  decode_kw = dict(
      mode=mode, **inference.decode_settings(config, beam_size, alpha, max_extra_len),
      rng=jax.random.key(seed), temperature=temperature, tokens_per_batch=tokens_per_batch)
  results = translate_ids(restored.model, restored.params, restored.tokenizer, config,
                          restored.mesh, lines, **decode_kw)
  outputs = ["" if r is None else restored.tokenizer.decode(r[1]) for r in results]
  text = "".join(o + "\n" for o in outputs)
  if jax.process_index() > 0:  # Every process holds every output; the first writes them.
    return outputs
  if output_path == "-":
    sys.stdout.write(text)
    sys.stdout.flush()
  else:
    files.write_atomic(output_path, text)
  if plot_attention:
    first = next((r for r in results if r is not None), None)
    if first is None:
      raise ValueError("nothing to plot: every input line is empty")
    src, out = first
    weights = plots.cross_attention_weights(restored.model, restored.params, src, out, layer)
    plots.plot_attention(weights, token_labels(restored.tokenizer, src),
                         token_labels(restored.tokenizer, out), plot_attention, head=head,
                         title="decoder attention over the source (rnn)"
                         if config.model.get("architecture") == "rnn" else
                         f"encoder-decoder attention, decoder layer "
                         f"{layer % config.model.num_layers}")
  return outputs


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  runtime.use_compilation_cache()
  f = flags.FLAGS
  with distributed.exit_at_once_on_error():
    try:
      distributed.maybe_initialize(workdir_lib.distributed_settings(f.workdir))
      run(f.workdir, f.input, f.output, f.checkpoint, f.mode, f.beam_size, f.alpha,
          f.max_extra_len, f.plot_attention, f.layer, f.head, f.seed, f.temperature,
          f.tokens_per_batch)
    except (FileNotFoundError, ValueError) as e:  # Bad input: the message, not a traceback.
      sys.exit(f"translate: error: {e}")


if __name__ == "__main__":
  evaluate.define_decode_flags(DECODE_MODES, "beam")
  flags.DEFINE_string("input", "-", "Sentences, one a line; '-' reads stdin.")
  flags.DEFINE_string("output", "-", "Translations, one a line; '-' writes stdout.")
  flags.DEFINE_string("plot_attention", None, "PNG file for the attention heatmap of the "
                      "first non-empty input line.")
  flags.DEFINE_integer("layer", -1, "Decoder layer to plot (-1: the last).")
  flags.DEFINE_string("head", "all", "all (one panel per head) | avg | a head number.")
  flags.DEFINE_integer("seed", 0, "Sampling seed (--mode sample).")
  flags.DEFINE_float("temperature", 1.0, "Sampling temperature (--mode sample).")
  app.run(main)
