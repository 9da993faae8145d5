"""Decodes a split with a trained model and scores it: sacreBLEU for translation,
exact match for SCAN.

  python -m transformer.evaluate --workdir DIR [--split test] [--checkpoint latest|best|averaged|STEP]
      [--mode beam|greedy] [--beam_size 4] [--alpha 0.6] [--max_extra_len 50] [--limit N]

Decoding settings default to config.decode (section 6.1: beam 4, alpha 0.6,
input length + 50), the split to config.data.test_split. Results are printed and
written to DIR/eval_{split}_{checkpoint}_{mode}.json (mode: greedy, or beam{K}-a{alpha};
'-n{N}' added with --limit), the hypotheses to the same name with .txt, one per
line in the split's order.

BLEU is sacreBLEU's corpus BLEU of detokenized, cased text (13a tokenizer), the
standard figure today; the paper's 27.3/28.4 were computed on tokenized text and
are not directly comparable.
"""

if __name__ == "__main__":  # Before JAX starts; see transformer/runtime.py.
  from transformer import runtime
  runtime.use_fast_malloc()


import json
import os
import re
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from transformer import data as data_lib
from transformer import runtime
from transformer import decode, sharding

MODES = ("greedy", "beam", "sample")
# Compiled decoders by (settings, batch shape, parameter layout). jax.jit would also
# cache, but compiling ahead of time lets us report compile and decode time apart,
# and keeps the training loop's repeated evaluations from compiling again.
_COMPILED = {}
_MAX_COMPILED = 64


def _check_settings(mode, beam_size, alpha, max_extra_len):
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  if int(beam_size) < 1:
    raise ValueError(f"beam_size must be >= 1, got {beam_size}")
  if float(alpha) < 0:
    raise ValueError(f"alpha must be >= 0, got {alpha}")
  if int(max_extra_len) < 0:
    raise ValueError(f"max_extra_len must be >= 0, got {max_extra_len}")


def _compiled(model, params, inputs, rng, mesh, settings):
  layout = (jax.tree.structure(params),
            tuple((x.shape, x.dtype, getattr(x, "sharding", None))
                  for x in jax.tree.leaves(params)))
  key = (model, mesh, settings, inputs.shape, inputs.sharding, layout)
  if key not in _COMPILED:
    mode, beam_size, alpha, max_extra_len, temperature, top_k = settings

    def run(params, inputs_BxS, rng):
      return decode.encode_and_decode(
          model, params, inputs_BxS, mode=mode, beam_size=beam_size, alpha=alpha,
          max_extra_len=max_extra_len, rng=rng if mode == "sample" else None,
          temperature=temperature, top_k=top_k)

    if len(_COMPILED) >= _MAX_COMPILED:
      _COMPILED.clear()
    # Replicated output: every host can read every row.
    fn = jax.jit(run, out_shardings=sharding.replicated(mesh))
    _COMPILED[key] = fn.lower(params, inputs, rng).compile()
  return _COMPILED[key]


def _row_count(rows, full_rows, multiple):
  """Rows padded up to multiple * 2^k (at most a full batch), so the last, partial
  batch of each length reuses few shapes, hence few compilations."""
  padded = multiple
  while padded < rows:
    padded *= 2
  return max(rows, min(padded, full_rows))


def decode_ids(model, params, examples, config, mesh, *, mode="greedy", beam_size=4,
               alpha=0.6, max_extra_len=50, rng=None, temperature=1.0, top_k=0,
               tokens_per_batch=None, timings=None):
  """Output ids for the sources of `examples` ((src, tgt) id arrays), in their order.

  Each is cut after its first EOS (kept), or has trailing PAD removed if it hit
  the length limit. Batches are grouped by length (eval_batches), split over the
  mesh's data axis, and decoded by one compiled program per batch shape. If
  `timings` is a dict it receives compile_seconds, decode_seconds and batches.
  Batch size (source tokens): `tokens_per_batch`, else config.decode's, else
  config.data's.
  """
  _check_settings(mode, beam_size, alpha, max_extra_len)
  rng = jax.random.key(0) if rng is None else rng  # Used by 'sample' only.
  settings = (mode, int(beam_size), float(alpha), int(max_extra_len), float(temperature),
              int(top_k))
  # .get: configs saved before the field existed lack it.
  tokens_per_batch = (tokens_per_batch or config.decode.get("tokens_per_batch")
                      or config.data.tokens_per_batch)
  out = [None] * len(examples)
  compile_s = decode_s = 0.0
  batches = 0
  # Bucketed by source length alone (a one-token dummy target): targets do not
  # enter decoding, and longer widths would cost time and compilations. Sorted
  # by length first, so a batch holds sentences of about the same length: it
  # runs until its longest output is done.
  order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
  sources = [(examples[i][0], examples[i][0][-1:]) for i in order]
  for positions, batch in data_lib.eval_batches(sources, tokens_per_batch,
                                                batch_multiple=mesh.size,
                                                max_length=config.data.max_length):
    indices = [order[p] for p in positions.tolist()]
    inputs = batch["inputs"]
    rows, width = inputs.shape
    rows = _row_count(rows, (tokens_per_batch // width) // mesh.size * mesh.size, mesh.size)
    inputs = np.pad(inputs, ((0, rows - inputs.shape[0]), (0, 0)))
    placed = sharding.place_batch(sharding.host_rows({"inputs": inputs}), mesh)["inputs"]
    batch_rng = jax.random.fold_in(rng, batches)
    start = time.perf_counter()
    fn = _compiled(model, params, placed, batch_rng, mesh, settings)
    compiled = time.perf_counter()
    ids = np.asarray(jax.device_get(fn(params, placed, batch_rng)))
    compile_s += compiled - start
    decode_s += time.perf_counter() - compiled
    batches += 1
    for row, index in enumerate(indices):
      out[index] = _cut(ids[row])
  if timings is not None:
    timings.update(compile_seconds=compile_s, decode_seconds=decode_s, batches=batches)
  return out


def _cut(ids):
  eos = np.flatnonzero(ids == data_lib.EOS_ID)
  return ids[:eos[0] + 1] if eos.size else np.trim_zeros(ids, "b")


def decode_examples(model, params, examples, tokenizer, config, mesh, **decode_kw):
  """Detokenized outputs for the sources of `examples`, in their order (see decode_ids)."""
  return [tokenizer.decode(ids)
          for ids in decode_ids(model, params, examples, config, mesh, **decode_kw)]


def sequence_accuracy(hypotheses, references):
  """SCAN metrics on whitespace tokens: exact_match (whole sequence equal) and
  token_accuracy, position-wise over the reference length: hypothesis token i is
  right if it equals reference token i; missing tokens are wrong, extra ones ignored."""
  exact = correct = total = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    exact += h == r
    correct += sum(a == b for a, b in zip(h, r))
    total += len(r)
  return {"exact_match": exact / len(references),
          "token_accuracy": correct / max(total, 1)}


def corpus_bleu(hypotheses, references):
  """sacreBLEU corpus BLEU (cased, 13a, exp smoothing) and chrF, with signatures."""
  bleu, chrf = BLEU(), CHRF()
  b = bleu.corpus_score(list(hypotheses), [list(references)])
  c = chrf.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": b.score, "bleu_precisions": list(b.precisions),
          "bleu_brevity_penalty": b.bp, "bleu_length_ratio": b.ratio,
          "hyp_length": b.sys_len, "ref_length": b.ref_len, "chrf": c.score,
          "bleu_signature": str(bleu.get_signature()),
          "chrf_signature": str(chrf.get_signature())}


def score(hypotheses, references, task):
  """Metrics of detokenized outputs against references: sequence_accuracy when
  `task` (the dataset name) starts with 'scan', else corpus_bleu."""
  hypotheses, references = list(hypotheses), list(references)
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  if not references:
    raise ValueError("nothing to score: no references")
  if task.startswith("scan"):
    return sequence_accuracy(hypotheses, references)
  return corpus_bleu(hypotheses, references)


def evaluate_examples(model, params, examples, references, tokenizer, config, mesh,
                      **decode_kw):
  """(metrics with timing, hypotheses) of decoding `examples` against `references`."""
  timings = {}
  start = time.perf_counter()
  hypotheses = decode_examples(model, params, examples, tokenizer, config, mesh,
                               timings=timings, **decode_kw)
  metrics = score(hypotheses, references, config.data.dataset)
  metrics.update(timings, num_sentences=len(hypotheses),
                 wall_seconds=time.perf_counter() - start,
                 sentences_per_second=len(hypotheses) / max(timings["decode_seconds"], 1e-9))
  return metrics, hypotheses


def result_name(split, checkpoint, mode, beam_size, alpha, limit=None):
  """File stem of an evaluation: eval_{split}_{checkpoint}_{mode}, filename-safe."""
  label = f"beam{beam_size}-a{alpha:g}" if mode == "beam" else mode
  parts = [split, str(checkpoint), label + (f"-n{limit}" if limit else "")]
  return "_".join(["eval"] + [re.sub(r"[^A-Za-z0-9.-]+", "_", p).strip("_") for p in parts])


def write_atomic(path, text):
  """Writes via a temporary file and a rename: a crash never leaves half a file."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def run(workdir, split=None, checkpoint="latest", mode="beam", beam_size=None, alpha=None,
        max_extra_len=None, limit=None, tokens_per_batch=None):
  """Restores `workdir`, decodes and scores `split`, writes the JSON; returns (result, path)."""
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"workdir {workdir!r} does not exist")
  # Imported here: training imports this module (and workdir imports training).
  from transformer import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  workdir_lib.checkpoint_location(workdir, checkpoint)  # A bad name fails before loading.
  if limit is not None and limit < 1:
    raise ValueError(f"limit must be >= 1, got {limit}")
  config = workdir_lib.load_config(workdir)
  split = split or config.data.test_split
  beam_size = config.decode.beam_size if beam_size is None else beam_size
  alpha = config.decode.alpha if alpha is None else alpha
  max_extra_len = config.decode.max_extra_len if max_extra_len is None else max_extra_len
  _check_settings(mode, beam_size, alpha, max_extra_len)
  # The data first: a bad split fails before the checkpoint is read.
  tokenizer = workdir_lib.load_tokenizer(workdir, config)
  examples, pairs, stats = data_lib.get_eval(config.data, tokenizer, split)
  examples, pairs = examples[:limit], pairs[:limit]
  if not examples:
    raise ValueError(f"split {split!r} of {config.data.dataset} has no examples")
  restored = workdir_lib.restore(workdir, checkpoint)
  metrics, hypotheses = evaluate_examples(
      restored.model, restored.params, examples, [t for _, t in pairs], restored.tokenizer,
      config, restored.mesh, mode=mode, beam_size=beam_size, alpha=alpha,
      max_extra_len=max_extra_len, tokens_per_batch=tokens_per_batch)
  stem = os.path.join(workdir, result_name(split, checkpoint, mode, beam_size, alpha, limit))
  result = {
      "workdir": os.path.abspath(workdir), "checkpoint": str(checkpoint),
      "step": int(restored.step), "dataset": config.data.dataset, "split": split,
      "limit": limit, "mode": mode,
      "beam_size": beam_size if mode == "beam" else None,
      "alpha": alpha if mode == "beam" else None, "max_extra_len": max_extra_len,
      "num_sentences": metrics.pop("num_sentences"),
      "truncated_sources": stats.get("truncated", 0),
      "signature": metrics.get("bleu_signature"),
      **{k: metrics.pop(k) for k in ("compile_seconds", "decode_seconds", "wall_seconds",
                                     "sentences_per_second", "batches")},
      "metrics": metrics, "hypotheses_file": stem + ".txt",
  }
  if jax.process_index() == 0:
    write_atomic(stem + ".txt", "".join(h + "\n" for h in hypotheses))
    write_atomic(stem + ".json", json.dumps(result, indent=2, sort_keys=True) + "\n")
  return result, stem + ".json"


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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  runtime.use_compilation_cache()
  f = flags.FLAGS
  try:
    result, path = run(f.workdir, f.split, f.checkpoint, f.mode, f.beam_size, f.alpha,
                       f.max_extra_len, f.limit, f.tokens_per_batch)
  except (FileNotFoundError, ValueError) as e:  # Bad input: the message, not a traceback.
    sys.exit(f"evaluate: error: {e}")
  print(json.dumps(result, indent=2, sort_keys=True))
  print(f"wrote {path}")


if __name__ == "__main__":
  define_decode_flags(("greedy", "beam"), "beam")
  flags.DEFINE_string("split", None, "Split to evaluate; default config.data.test_split.")
  flags.DEFINE_integer("limit", None, "Evaluate the first N examples only.", lower_bound=1)
  app.run(main)
