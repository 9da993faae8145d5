"""What both frameworks share: benchmark sizes, the real pipeline's batches, the FLOP count.

Sizes (vocabulary sizes are ours: the paper does not give an exact one):
  smoke  1+1 layers, d_model 32,  d_ff 64,   2 heads, V 320,   256 tokens a batch (CI)
  small  3+3 layers, d_model 256, d_ff 1024, 4 heads, V 8000,  4096 tokens a batch
  base   6+6 layers, d_model 512, d_ff 2048, 8 heads, V 37000, 4096 tokens a batch
         (Table 3 base with configs/base.py's shared 37k vocabulary)
"""

import dataclasses
import hashlib
import importlib.util
import math
import os

import numpy as np

from configs import base as base_config
from transformer import files
from transformer.data import pipeline
from transformer.data.tokenizer import EOS_ID, PAD_ID


@dataclasses.dataclass(frozen=True)
class Size:
  name: str
  num_layers: int
  d_model: int
  d_ff: int
  num_heads: int
  vocab_size: int
  tokens_per_batch: int = 4096  # Bucketed: each side of a batch has <= this many slots.
  max_length: int = 64  # Longest example (EOS included); sets the largest bucket.
  dropout: float = 0.1
  train_steps: int = 10  # Timed training steps (after one warm-up step per shape).
  decode_sentences: int = 32  # Sentences per decoding batch.
  decode_repeats: int = 3  # Timed decoding runs (median).
  # Compute dtype: ours config.model.dtype (parameters float32), PyTorch's
  # torch.autocast to the same dtype around forward and loss.
  dtype: str = "float32"


SIZES = {
    # V 320: room for the 256 byte pieces of a byte-fallback vocabulary (--data_dir).
    "smoke": Size("smoke", 1, 32, 64, 2, 320, tokens_per_batch=256, max_length=16,
                  train_steps=3, decode_sentences=4, decode_repeats=1),
    "small": Size("small", 3, 256, 1024, 4, 8000),
    # ~1.5 TFLOP a step: few steps and a short decoding batch keep it to minutes on a CPU.
    "base": Size("base", 6, 512, 2048, 8, 37000, train_steps=4, decode_sentences=16,
                 decode_repeats=2),
}


# The model fields a Size carries; the benchmark runs configs/base.py's model
# (the paper's, as nn.Transformer builds it too) with these set.
SIZE_FIELDS = ("num_layers", "d_model", "d_ff", "num_heads", "dropout", "dtype", "max_len")


def size_from_config(path, tokens_per_batch=4096, max_length=64):
  """A Size with the model of a config file (`file.py` or `file.py:argument`; its
  data.vocab_size as the vocabulary). A config whose model differs from the
  paper's in other fields (an RNN, learned positions, pre-LN...) is refused:
  the benchmark would run another model than it names."""
  path, _, argument = path.partition(":")
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(argument) if argument else module.get_config()
  m, paper = config.model, base_config.get_config().model
  other = [f"model.{k}={m[k]!r}" for k in paper.keys()
           if k not in SIZE_FIELDS and k in m and m[k] != paper[k]]
  if other:
    raise ValueError(f"--config {path}: the benchmark runs the paper's Transformer at a "
                     f"config's sizes, and this config also sets {', '.join(other)}")
  name = os.path.splitext(os.path.basename(path))[0] + (f"_{argument}" if argument else "")
  return Size(name, m.num_layers, m.d_model, m.d_ff, m.num_heads, config.data.vocab_size,
              tokens_per_batch=tokens_per_batch, max_length=min(max_length, m.max_len),
              dropout=m.dropout)


def experiment_config(size: Size):
  """configs/base.py with the model and batch of `size` (paper optimiser, label smoothing)."""
  config = base_config.get_config()
  for field in ("num_layers", "d_model", "d_ff", "num_heads", "dropout", "dtype"):
    config.model[field] = getattr(size, field)
  config.model.max_len = max(256, size.max_length)
  config.data.vocab_size = size.vocab_size
  config.data.tokens_per_batch = size.tokens_per_batch
  config.data.max_length = size.max_length
  return config


# ----------------------------------------------------------------------------
# Examples and batches: the input pipeline's own TrainBatches.
# ----------------------------------------------------------------------------

def synthetic_examples(size: Size, count=None, seed=0):
  """Sentence-like (source, target) id arrays, each ending with EOS.

  Lengths are log-normal (median ~14 tokens, like Multi30k under a subword
  vocabulary), targets ~1.1x their sources, all clipped to max_length. `count`
  defaults to 20,000, or 4 per token of a larger batch: 70-85 full batches an epoch,
  so the timed ones are full (timed_batches).
  """
  count = count or max(20000, 4 * size.tokens_per_batch)
  rng = np.random.default_rng(seed)
  top = size.max_length - 1  # Room for EOS.
  src_len = np.clip(np.round(rng.lognormal(math.log(13), 0.4, count)), 1, top).astype(int)
  tgt_len = np.clip(np.round(src_len * rng.normal(1.1, 0.15, count)), 1, top).astype(int)
  ids = lambda n: np.append(rng.integers(4, size.vocab_size, n), EOS_ID).astype(np.int32)
  return [(ids(s), ids(t)) for s, t in zip(src_len, tgt_len)]


def multi30k_examples(size: Size, data_dir, source_lang="en", target_lang="de"):
  """Multi30k train pairs, tokenized by a BPE SentencePiece model trained on them.

  The tokenizer asks for size.vocab_size pieces; on 29k sentences it may get
  fewer (hard_vocab_limit is off), and the model keeps size.vocab_size rows.
  """
  from transformer.data import parallel_text, tokenizer  # pylint: disable=g-import-not-at-top
  pairs = parallel_text.load_split(data_dir, "train", source_lang, target_lang)
  tok = tokenizer.train([t for p in pairs for t in p], "bpe", size.vocab_size)
  examples, _ = pipeline.tokenize_pairs(pairs, tok, size.max_length, "drop")
  return examples


def examples_of(size: Size, data_dir=None):
  """What both sides train and decode on: Multi30k's train pairs from `data_dir`
  (each process tokenizes them alike: the same text, the same SentencePiece
  training), else synthetic ones."""
  return multi30k_examples(size, data_dir) if data_dir else synthetic_examples(size)


def data_sha1(arrays) -> str:
  """A short digest of id arrays (examples' sources and targets, or a decoding
  batch): whether two processes worked on the same data."""
  digest = hashlib.sha1()
  for a in arrays:
    digest.update(np.asarray(a, np.int32).tobytes() + b"|")
  return digest.hexdigest()[:16]


def train_batches(size: Size, examples, seed=0, batching="bucket"):
  """The pipeline's batches of `size`: bucketed rows of about one length, or
  packed rows of size.max_length slots with segment masks ('pack')."""
  return pipeline.TrainBatches(examples, tokens_per_batch=size.tokens_per_batch, seed=seed,
                               batching=batching, max_length=size.max_length,
                               pack_length=size.max_length if batching == "pack" else None)


def topped_up(batch) -> bool:
  """Whether `batch` is a bucket's (or the packed rows') last of an epoch, topped
  up with all-PAD rows to its shape's row count."""
  return bool((batch["targets"] == PAD_ID).all(axis=1).any())


def epoch_stats(size: Size, examples, batching="bucket"):
  """Padding and shapes over one whole epoch of the pipeline (numpy only, no
  model), and the same over its full batches ("full_*", "first_of_shape"): what
  the epoch mix times (epoch_tokens_per_s)."""
  it = train_batches(size, examples, batching=batching)
  slots = real_src = real_tgt = full_real_tgt = 0
  counts, full_counts, first = {}, {}, {}  # Per target shape: batches; full ones; the first.
  for _ in range(it.num_batches(0)):
    b = next(it)
    shape = b["targets"].shape
    counts[shape] = counts.get(shape, 0) + 1
    slots += b["targets"].size
    real_src += int(np.count_nonzero(b["inputs"]))
    real_tgt += int(np.count_nonzero(b["targets"]))
    if not topped_up(b):
      full_counts[shape] = full_counts.get(shape, 0) + 1
      full_real_tgt += int(np.count_nonzero(b["targets"]))
      first.setdefault(shape, b)
  return {"batches": it.num_batches(0), "shapes": len(counts),
          "padding_target": 1.0 - real_tgt / slots,
          "padding_source_target": 1.0 - (real_src + real_tgt) / (2 * slots),
          "real_target": real_tgt, "shape_counts": counts,
          "full_real_target": full_real_tgt, "full_shape_counts": full_counts,
          "first_of_shape": first}


def epoch_tokens_per_s(stats, step_seconds):
  """Real target tokens/s over the full batches of an epoch of `stats`
  (epoch_stats), from one step time per target shape ({shape: seconds}): their
  real target tokens over the sum, across shapes, of batches of that shape x
  their step time. The topped-up batches are left out, as from the timed ones: a
  long corpus's epoch hardly has them, and a peer's natural pipeline would send
  them short."""
  seconds = sum(n * step_seconds[shape] for shape, n in stats["full_shape_counts"].items())
  return stats["full_real_target"] / seconds


def timed_batches(size: Size, examples, count, seed=0, batching="bucket"):
  """The first `count` full batches of an epoch: mixed shapes, as training sees them.

  An epoch ends each bucket (or the packed rows) with a batch topped up with
  all-PAD rows, which our fixed shapes compute and a peer's natural pipeline would
  not. On a corpus small beside the batch they are many (the synthetic 20,000
  sentences at 25k tokens: one in the first four, 96% padding), and the
  side timed on one would be charged for rows a long corpus hardly has. They are
  timed only where the epoch's full batches run out.
  """
  it = train_batches(size, examples, seed, batching)
  full, short = [], []
  for _ in range(it.num_batches(0)):
    batch = next(it)
    (short if topped_up(batch) else full).append(batch)
    if len(full) == count:
      return full
  batches = (full + short)[:count]
  print(f"Timed batches: an epoch of {len(examples)} examples has {len(full)} full batches "
        f"of {size.tokens_per_batch} tokens ({batching}): the {count} timed include batches "
        "topped up with all-PAD rows (a larger corpus avoids them).",
        flush=True)
  return batches + [next(it) for _ in range(count - len(batches))]


def decode_sources(size: Size, examples, seed=1):
  """A decoding batch: size.decode_sentences sources, right-padded to the longest."""
  rng = np.random.default_rng(seed)
  chosen = [examples[i][0] for i in rng.choice(len(examples), size.decode_sentences,
                                               replace=False)]
  width = -(-max(len(s) for s in chosen) // 8) * 8
  out = np.zeros((len(chosen), width), np.int32)
  for r, s in enumerate(chosen):
    out[r, :len(s)] = s
  return out


def generated_tokens(sources_BxS, max_extra_len, max_len):
  """Tokens the search emits with no EOS: min(len_b + max_extra_len, L) per row."""
  L = min(sources_BxS.shape[1] + max_extra_len, max_len)
  return np.minimum(np.count_nonzero(sources_BxS, axis=1) + max_extra_len, L)


def decode_batch(size: Size, examples, max_extra_len):
  """(sources, each row's output limit): what every decoding side runs, each
  row to its limit (the model's max_len caps it, as experiment_config sets it)."""
  sources = decode_sources(size, examples)
  max_len = experiment_config(size).model.max_len
  return sources, generated_tokens(sources, max_extra_len, max_len)


def interleaved(runs, repeats):
  """{name: seconds of each of `repeats` rounds}: every run() once a round, in
  turn, so that a change in the machine's load hits all of them alike."""
  times = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      times[name].append(run())
  return times


def summarize(size: Size, batches, times, cpu_times, losses, faults):
  """Throughput figures of timed steps, one per batch.

  CPU seconds (all threads, user + kernel) move less than wall time when other
  processes load the machine; wall time is what the figures are computed from.
  """
  tgt = sum(token_counts(b)[0] for b in batches)
  both = sum(token_counts(b)[1] for b in batches)
  slots = sum(b["inputs"].size + b["targets"].size for b in batches)
  flops = sum(batch_flops(size, b) for b in batches)
  return {"step_s_median": float(np.median(times)), "step_s_all": list(times),
          "target_tokens_per_s": tgt / sum(times), "tokens_per_s": both / sum(times),
          "padding_source_target": 1.0 - both / slots,  # Of these timed batches.
          "flops_per_step": flops / len(batches), "flops_per_s": flops / sum(times),
          "page_faults_per_step": faults / len(batches),
          "cpu_s_per_step": float(np.median(cpu_times)),
          "loss_first": losses[0], "loss_last": losses[-1]}


def token_counts(batch):
  """(real target tokens, real source + target tokens) of a batch."""
  tgt = int(np.count_nonzero(batch["targets"]))
  return tgt, tgt + int(np.count_nonzero(batch["inputs"]))


# ----------------------------------------------------------------------------
# FLOPs.
# ----------------------------------------------------------------------------

def train_flops(size: Size, batch_size, src_len, tgt_len):
  """Analytic FLOPs of one training step on a padded [B, S] -> [B, T] batch.

  A matmul of [m, k] x [k, n] is 2mkn FLOPs; everything else (softmax,
  LayerNorm, Adam, the loss) is left out. With D d_model, F d_ff, V vocabulary,
  N layers on each side, the forward pass is

    encoder  N * B*S * (8 D^2        + 4 D F + 4 S D)      Q,K,V,O; FFN; QK^T and PV
    decoder  N * B*T * (12 D^2       + 4 D F + 4 T D + 4 S D)  self Q,K,V,O + cross Q,O;
           + N * B*S * 4 D^2                                   cross K,V on the memory
    output   2 * B*T * D * V                                   tied pre-softmax projection

  (attention: scores and values cost 4*T*S*D per layer and batch row; the
  causal mask is not credited: the kernels compute all T*T scores). Training =
  3x forward (the backward pass is two matmuls per forward matmul). Counted on
  the padded shapes, i.e. the work the device does.
  """
  B, S, T = batch_size, src_len, tgt_len
  D, F, V, N = size.d_model, size.d_ff, size.vocab_size, size.num_layers
  encoder = N * B * S * (8 * D * D + 4 * D * F + 4 * S * D)
  decoder = N * B * T * (12 * D * D + 4 * D * F + 4 * T * D + 4 * S * D) + N * B * S * 4 * D * D
  output = 2 * B * T * D * V
  return 3 * (encoder + decoder + output)


def batch_flops(size: Size, batch):
  B, S = batch["inputs"].shape
  return train_flops(size, B, S, batch["targets"].shape[1])


# The CPU features that decide matmul speed in float32 and bfloat16.
MATMUL_FLAGS = ("fma", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_description(path="/proc/cpuinfo"):
  """{'cpu_model', 'cpu_flags'}: machines differ between runs (AVX-512 with bfloat16
  instructions, or AVX2 only), and the figures mean little without it. The model
  name is followed by the family and model numbers, which tell chips apart
  where a VM names them all "Intel(R) Xeon(R) Processor"."""
  first = {}  # The first processor's fields.
  try:
    with open(path) as f:
      for line in f:
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  have = set(first.get("flags", "").split())
  model = first.get("model name", "")
  if model and first.get("cpu family") and first.get("model"):
    model += f" (family {first['cpu family']}, model {first['model']})"
  return {"cpu_model": model, "cpu_flags": [flag for flag in MATMUL_FLAGS if flag in have]}


def probed_peak(measure, n, dtype, budget_s=30.0, repeats=5):
  """(measure(n, repeats, dtype) in FLOP/s, None), or (None, why) when an (n/8)^3
  probe says its 1 + repeats n^3 products would take over budget_s: without bfloat16
  instructions a framework may emulate them, and they then run for minutes (PyTorch
  on an AVX2-only CPU: 1.3 GFLOP/s at 256^3, slower at 2048^3). n/8, not a fixed
  size: a GPU runs a 256^3 product in its launch time, which, scaled up to 8192^3,
  overstates the peak's time past the budget. A probe that says skip is taken
  again, best of 3, first: one stalled product of a few milliseconds must not drop
  a framework from the run."""
  seconds_at = lambda flops_per_s: (1 + repeats) * 2 * n**3 / flops_per_s
  m = max(n // 8, 16)
  probe = measure(m, repeats=1, dtype=dtype)
  if seconds_at(probe) > budget_s:
    probe = max(probe, measure(m, repeats=3, dtype=dtype))
  seconds = seconds_at(probe)
  if seconds > budget_s:
    return None, (f"{1 + repeats} {n}^3 {dtype} products would take ~{seconds:.0f} s here "
                  f"({probe / 1e9:.1f} GFLOP/s at {m}^3)")
  return measure(n, repeats=repeats, dtype=dtype), None


def check_flags(parser, args, least=(), outputs=()) -> None:
  """parser.error, before any work, for a flag below its least value (`least`:
  {name: minimum}; a list flag by its smallest; an unset one passes) or an output
  file that cannot be written (files.check_output): a bad value would fail deep in
  a run, or print a wrong table, and a bad output path only after everything was
  measured."""
  for name, minimum in dict(least).items():
    value = getattr(args, name)
    low = min(value) if isinstance(value, list) else value
    if low is not None and low < minimum:
      parser.error(f"--{name} must be at least {minimum}, got {low}")
  for name in outputs:
    if getattr(args, name):
      try:
        files.check_output(getattr(args, name), f"--{name}")
      except ValueError as e:
        parser.error(str(e))
