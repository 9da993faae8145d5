"""Decodes a split with a trained model and scores it: sacreBLEU for translation,
exact match for SCAN.

  python -m transformer.evaluate --workdir DIR [--split test] [--checkpoint latest|best|averaged|STEP]
      [--mode beam|greedy] [--beam_size 4] [--alpha 0.6] [--max_extra_len 50] [--limit N]
      [--compact 2 | --refill 8] [--concurrent_batches 2]

Decoding settings default to config.decode (section 6.1: beam 4, alpha 0.6,
input length + 50), the split to config.data.test_split. The split's perplexity
per target token without label smoothing (teacher-forced; Table 3's "PPL (dev)"
on the dev split) is reported beside the scores: over the references as the
model sees them, so one longer than data.max_length counts cut there
(`truncated_targets` counts those, and a warning says so). Results are printed and
written to DIR/eval_{split}_{checkpoint}_{mode}.json (split in file-name characters:
test[:50] as test.to50; mode: greedy, or beam{K}-a{alpha};
'-n{N}' added with --limit, '-x{N}' with a --max_extra_len other than the config's), the hypotheses to the same name with .txt, one per
line in the split's order. The JSON records which `best` or `averaged` checkpoint
it scored (checkpoint_identity: the score saved with it, or the steps averaged),
which a later one may replace under the same name and step.

It streams: the split is read, decoded (sorted by length within the chunk) and
scored --chunk_lines examples at a time (default 4096, so a dev or test set is
one chunk), the scores summed from per-sentence statistics (metrics.Scorer) and
each chunk's hypotheses written and flushed to .txt.partial, renamed to .txt at
the end; memory stays bounded however large the split.

BLEU is sacreBLEU's corpus BLEU of detokenized, cased text (13a tokenizer), the
standard figure today; the paper's 27.3/28.4 were computed on tokenized text and
are not directly comparable.
"""

if __name__ == "__main__":  # Before JAX starts; see transformer/runtime.py.
  from transformer import runtime, sigterm
  runtime.end_at_interrupt("evaluate")  # A Ctrl-C at start-up: one line.
  sigterm.watch("evaluate", " before its results were written (those it would replace are "
                "kept); rerun the same command")  # A SIGTERM: one line (sigterm.py).
  runtime.use_fast_malloc()


import collections
import functools
import itertools
import json
import os
import re
import sys
import time
import zlib

from absl import app
from absl import flags
from absl import logging
import jax

from transformer import data as data_lib
from transformer import decode, distributed, files, inference, runtime, sigterm, steps
from transformer import metrics as metrics_lib
from transformer import workdir as workdir_lib
from transformer.config import REFILLING_ARCHITECTURES, SCORED_DECODE_MODES

CHUNK_LINES = data_lib.sources.CHUNK  # Examples (lines) decoded together: bounded memory.


def result_name(split, checkpoint, mode, beam_size, alpha, limit=None, max_extra_len=None):
  """File stem of an evaluation: eval_{split}_{checkpoint}_{mode}, filename-safe;
  `max_extra_len` (given where it is not the config's) adds -x{N}, so that it
  does not replace the evaluation at the config's output limit."""
  label = f"beam{beam_size}-a{alpha:g}" if mode == "beam" else mode
  label += (f"-n{limit}" if limit else "") + (
      f"-x{max_extra_len}" if max_extra_len is not None else "")
  return "_".join(["eval", _file_part(split), _file_part(str(checkpoint)), label])


# A split as TFDS writes it: names, each with a slice or not, joined by "+".
_SLICE_END = r"-?\d*%?"
_TERM = rf"[\w-]+(?:\[{_SLICE_END}:{_SLICE_END}\])?"
_SPLIT = re.compile(rf"{_TERM}(?:\+{_TERM})*", re.ASCII)
_SLICE_SPELLING = str.maketrans({"[": ".", "]": "", ":": "to", "%": "pct"})


def _file_part(text: str) -> str:
  """`text` in file-name characters, one name for one text. A TFDS split has its
  slices spelled out (test[:50] -> test.to50, test[50:] -> test.50to: a "_"
  for each character would make both test_50). Anything else is kept where
  file-name-safe, other characters made "_", and a checksum of `text` appended,
  so that texts differing only there keep apart."""
  if _SPLIT.fullmatch(text):
    return text.translate(_SLICE_SPELLING)
  safe = re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)
  return f"{safe}-{zlib.crc32(text.encode()):08x}"


def search_settings(command, config, mode, beam_size=None, alpha=None, max_extra_len=None,
                    compact=None, refill=None) -> dict:
  """inference.decode_settings of the flags given (None: config.decode's), checked
  before any work, for evaluate and translate (`command`, which warnings name):
  --compact or --refill outside --mode beam is warned of (the other searches
  ignore them), and a refill the model's decoding cannot do is refused."""
  settings = inference.decode_settings(config, beam_size, alpha, max_extra_len, compact, refill)
  flags_given = {"compact": compact, "refill": refill}
  for (flag, value), kept in zip(flags_given.items(), ("refill", "compact")):
    if value and flags_given[kept] is None and settings[kept]:  # The workdir's.
      raise ValueError(f"--{flag} {value}, and the workdir's config.decode.{kept} is "
                       f"{settings[kept]}: two ways to spend fewer steps on finished "
                       f"sentences; add --{kept} 0")
  decode.check_settings(mode, **settings)
  if mode != "beam":
    if (compact or refill) and jax.process_index() == 0:
      print(f"{command}: warning: --compact and --refill act in --mode beam only; "
            f"--mode {mode} ignores them", file=sys.stderr)
    return settings
  # Refused here, not at compile time (config.check_config asks the same at training).
  architecture = config.model.get("architecture", "transformer")
  if settings["refill"] and architecture not in REFILLING_ARCHITECTURES:
    given = (f"--refill {refill}" if refill is not None
             else f"config.decode.refill={settings['refill']}")
    raise ValueError(f"{given}: model.architecture={architecture!r} cannot refill beam "
                     "search rows (its decoding cannot restart them; decode.refill needs a "
                     "Transformer); set it to 0")
  return settings


def _commit_results(out, stem: str, result_json: str) -> None:
  """Gives the hypotheses (the open_partial file `out`) their name, then writes
  the JSON that names them; where the JSON cannot be written (its file cannot be
  replaced), the previous hypotheses go back and the new ones to their .partial
  file, as a stopped run leaves them: the two files stay of one evaluation."""
  hypotheses, previous = stem + ".txt", stem + ".txt.previous"
  if os.path.isfile(previous) or os.path.islink(previous):
    os.remove(previous)
  try:
    os.link(hypotheses, previous)  # Kept under a second name while the new one lands.
  except OSError:  # None yet (or no hard links here): nothing to put back.
    previous = None
  try:
    files.commit_partial(out, hypotheses)
    files.write_atomic(stem + ".json", result_json)
  except BaseException:
    if previous and os.path.samefile(previous, hypotheses):  # Not renamed: still the old.
      os.remove(previous)
    elif previous:
      os.replace(hypotheses, hypotheses + files.PARTIAL_SUFFIX)
      os.replace(previous, hypotheses)
    raise
  if previous:
    os.remove(previous)


def run(workdir, split=None, checkpoint="latest", mode="beam", beam_size=None, alpha=None,
        max_extra_len=None, limit=None, tokens_per_batch=None, chunk_lines=CHUNK_LINES,
        compact=None, concurrent_batches=None, refill=None):
  """Restores `workdir`, decodes and scores `split`, writes the JSON; returns (result, path)."""
  workdir_lib.require_directory(workdir)
  checkpoint = workdir_lib.checkpoint_name(checkpoint)  # A bad name fails before loading.
  if limit is not None and limit < 1:
    raise ValueError(f"limit must be >= 1, got {limit}")
  check_chunk_lines(chunk_lines)
  if split == "":  # An unset shell variable: not the default split.
    raise ValueError("--split is empty (leave the flag out for config.data.test_split)")
  config = workdir_lib.load_config(workdir)
  field = "--split" if split else "config.data.test_split"  # What errors name.
  split = split or config.data.test_split
  settings = search_settings("evaluate", config, mode, beam_size, alpha, max_extra_len, compact,
                             refill)
  beam_size, alpha = settings["beam_size"], settings["alpha"]
  extra = settings["max_extra_len"]
  stem = os.path.join(workdir, result_name(
      split, checkpoint, mode, beam_size, alpha, limit,
      None if extra == config.decode.get("max_extra_len", extra) else extra))
  for path in (stem + ".txt", stem + ".json", stem + ".txt.previous"):  # After decoding: late.
    if os.path.isdir(path):
      raise ValueError(f"{path} is a directory, where evaluate writes its results: move it")
  tokenizer = workdir_lib.load_tokenizer(workdir, config)
  chunks = data_lib.iter_eval(config.data, tokenizer, split, chunk_lines, limit, field=field)
  # The first chunk first: a bad split fails before the checkpoint is read, and
  # process 0 prepares a generated dataset before the other processes read it.
  first = distributed.process_0_first(lambda: next(chunks, None), "evaluate data")
  if first is None:
    raise ValueError(f"split {split!r} of {config.data.dataset} has no examples")
  # Which best or average it is (a later one takes the name, at any step): read
  # before and after the restore, so that the record is of the state scored.
  metric = metrics_lib.main_metric(config.data.dataset)
  identity = workdir_lib.checkpoint_identity(workdir, checkpoint, metric)
  restored = workdir_lib.restore(workdir, checkpoint)
  if identity != workdir_lib.checkpoint_identity(workdir, checkpoint, metric, restored.step):
    raise runtime.CommandError(f"the {checkpoint} checkpoint of {workdir} was replaced while "
                               "evaluate read it: rerun")
  eval_fn = jax.jit(functools.partial(steps.eval_step, model=restored.model,
                                      label_smoothing=config.train.label_smoothing))
  scorer = metrics_lib.Scorer(config.data.dataset)
  timings, truncated, loss_totals, wall = collections.Counter(), collections.Counter(), None, 0.0
  # Each chunk's hypotheses are written and flushed before the next chunk is
  # read; the file takes its final name once all are scored, so a killed run
  # leaves what it wrote under .partial, never a short file under the real name.
  out = distributed.process_0_only(lambda: files.open_partial(stem + ".txt"),
                                   "opening the hypotheses file")
  try:
    for examples, pairs, stats in itertools.chain([first], chunks):
      start, chunk_timings = time.perf_counter(), {}
      hypotheses = inference.decode_examples(
          restored.model, restored.params, examples, restored.tokenizer, config, restored.mesh,
          mode=mode, **settings, tokens_per_batch=tokens_per_batch,
          concurrent_batches=concurrent_batches, timings=chunk_timings)
      scorer.add(hypotheses, [t for _, t in pairs])
      wall += time.perf_counter() - start
      timings.update(chunk_timings)
      truncated.update({k: stats[k] for k in ("truncated_sources", "truncated_targets")})
      loss_totals = steps.eval_loss_sums(eval_fn, restored.params, examples, config,
                                            restored.mesh, loss_totals)
      if out is not None:
        files.write_lines(out, hypotheses)
    if not scorer.count:
      raise ValueError(f"split {split!r} of {config.data.dataset} has no examples")
    loss = steps.loss_metrics(loss_totals)
    if truncated["truncated_targets"] and jax.process_index() == 0:
      logging.warning("%d references of %s are longer than data.max_length=%d tokens: the "
                      "perplexity scores them cut there, with an EOS they lack (the scores "
                      "read them whole).", truncated["truncated_targets"], split,
                      config.data.max_length)
    result = {
        "workdir": os.path.abspath(workdir), "checkpoint": str(checkpoint),
        "step": int(restored.step), workdir_lib.IDENTITY_KEY: identity,
        workdir_lib.CHECKSUMS_KEY: workdir_lib.checkpoint_checksums(workdir, checkpoint,
                                                                    int(restored.step)),
        "dataset": config.data.dataset, "split": split,
        "limit": limit, "mode": mode,
        "beam_size": beam_size if mode == "beam" else None,
        "alpha": alpha if mode == "beam" else None, "max_extra_len": settings["max_extra_len"],
        "compact": settings["compact"] if mode == "beam" else None,
        "refill": settings["refill"] if mode == "beam" else None,
        "num_sentences": scorer.count, "truncated_sources": truncated["truncated_sources"],
        "truncated_targets": truncated["truncated_targets"],
        "perplexity": loss["perplexity"], "nll": loss["nll"],
        "compile_seconds": timings["compile_seconds"],
        "decode_seconds": timings["decode_seconds"], "batches": timings["batches"],
        "wall_seconds": wall,
        "sentences_per_second": scorer.count / max(timings["decode_seconds"], 1e-9),
        "metrics": scorer.result(), "hypotheses_file": stem + ".txt",
    }
    result["signature"] = result["metrics"].get("bleu_signature")
    if out is not None:
      with sigterm.held():  # The new hypotheses never sit beside the old JSON.
        _commit_results(out, stem, json.dumps(result, indent=2, sort_keys=True) + "\n")
  finally:
    if out is not None:
      files.close_partial(out, stem + ".txt")
  return result, stem + ".json"


def check_chunk_lines(chunk_lines: int) -> None:
  """Lines read at a time, an index of Python's and TensorFlow's: a huge one
  failed inside them, naming no flag."""
  if not 1 <= chunk_lines < 2**31:
    raise ValueError(f"chunk_lines must be in [1, 2^31), got {chunk_lines}")


def define_decode_flags(modes, default_mode):
  """Flags shared with transformer.translate; defined on demand so that both
  modules can be imported into one process (tests) without clashing."""
  flags.DEFINE_string("workdir", None, "Training workdir to restore.", required=True)
  flags.DEFINE_string("checkpoint", "latest", "latest | best | averaged | a step number.")
  flags.DEFINE_enum("mode", default_mode, modes, "Search.")
  flags.DEFINE_integer("beam_size", None, "Beam width; default config.decode.beam_size.",
                       lower_bound=1)
  flags.DEFINE_float("alpha", None, "Length penalty; default config.decode.alpha.",
                     lower_bound=0.0)
  flags.DEFINE_integer("max_extra_len", None, "Output limit = input length + this; "
                       "default config.decode.max_extra_len.", lower_bound=0)
  flags.DEFINE_integer("tokens_per_batch", None, "Source tokens per decoding batch; "
                       "default config.decode.tokens_per_batch (if 0, "
                       "config.data.tokens_per_batch).", lower_bound=1)
  flags.DEFINE_integer("chunk_lines", CHUNK_LINES, "Lines (examples) read, decoded and "
                       "written together: memory stays bounded however long the input "
                       "(1: each as soon as it arrives).", lower_bound=1)
  flags.DEFINE_integer("compact", None, "Beam search: halvings of the batch as sentences "
                       "finish (same outputs; pays on large inputs, each compiles another "
                       "loop); default config.decode.compact.", lower_bound=0)
  flags.DEFINE_integer("refill", None, "Beam search: batches this many times as large go "
                       "through the rows of one, each row taking the next sentence when its "
                       "own stops (same outputs up to bfloat16 rounding); default "
                       "config.decode.refill.", lower_bound=0)
  flags.DEFINE_integer("concurrent_batches", None, "Batches decoded at once, each from its "
                       "own thread (same outputs); default config.decode.concurrent_batches "
                       "(2 where the config lacks it); one on a GPU or TPU.", lower_bound=1)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  with workdir_lib.command("evaluate", f.workdir):
    result, path = run(f.workdir, f.split, f.checkpoint, f.mode, f.beam_size, f.alpha,
                       f.max_extra_len, f.limit, f.tokens_per_batch, f.chunk_lines, f.compact,
                       f.concurrent_batches, f.refill)
  sigterm.hand_over()  # Written: SIGTERM's message would no longer be true.
  if jax.process_index() == 0:
    with runtime.one_line_errors("evaluate"):  # A full disk under stdout: one line.
      print(json.dumps(result, indent=2, sort_keys=True))
      print(f"wrote {path}")


if __name__ == "__main__":
  define_decode_flags(SCORED_DECODE_MODES, "beam")
  flags.DEFINE_string("split", None, "Split to evaluate; default config.data.test_split.")
  flags.DEFINE_integer("limit", None, "Evaluate the first N examples only.", lower_bound=1)
  runtime.run(main, "evaluate")
