"""Decoding many sentences with a model: batching by length, each host's share of
the rows, one compiled program per batch shape, outputs back in input order.
What in-training decoding, `evaluate` and `translate` share; no flags, no files."""

from concurrent import futures
import time

from absl import logging
import jax
import numpy as np

from transformer import data as data_lib
from transformer import decode, runtime, search, sharding, state as state_lib
from transformer import metrics as metrics_lib

# Compiled decoders by (settings, batch shape, parameter layout). jax.jit would also
# cache, but compiling ahead of time lets us report compile and decode time apart,
# and keeps the training loop's repeated evaluations from compiling again.
_COMPILED = {}
_MAX_COMPILED = 64
# Batches decoded at once where config.decode lacks concurrent_batches (configs
# saved before it existed): outputs do not depend on it.
CONCURRENT_BATCHES = 2


def decode_settings(config, beam_size=None, alpha=None, max_extra_len=None,
                    compact=None, refill=None) -> dict:
  """The search settings given, the experiment's config.decode for those not given."""
  given = dict(beam_size=beam_size, alpha=alpha, max_extra_len=max_extra_len, compact=compact,
               refill=refill)
  # Configs saved before decode.compact or decode.refill existed lack them: off. The
  # other fields are required.
  saved = {"compact": 0, "refill": 0, **config.decode.to_dict()}
  return {k: saved[k] if v is None else v for k, v in given.items()}


def batches_at_once(config, mesh, requested=None) -> int:
  """How many batches decode_ids runs at once, each from its own thread.

  A decoding step is many small operations, and one program alone leaves part
  of a CPU's cores idle; two programs at once fill them (Multi30k beam 4 on a
  2-core CPU: 1.37x the sentences/s, benchmarks/README.md, 'Session 23').
  `requested`, else config.decode.concurrent_batches, else CONCURRENT_BATCHES;
  but one batch at a time in a multi-process job, where every process must
  launch the same programs in the same order for their collectives to pair up,
  and on accelerators: on a GPU, XLA runs a program's steps as CUDA graphs, and
  a second program launched while one is being captured fails (a segfault, or
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; seen on an H200), and on a mesh of
  several, their collectives (NCCL) can deadlock when two programs interleave
  them. Outputs are the same either way.
  """
  n = requested or config.decode.get("concurrent_batches", CONCURRENT_BATCHES)
  if int(n) < 1:
    raise ValueError(f"concurrent_batches must be >= 1, got {n}")
  if mesh.devices.flat[0].platform != "cpu":
    if requested and int(requested) > 1:
      logging.warning("concurrent_batches=%s: decoding one batch at a time on %s "
                      "(concurrent programs fail there)", requested,
                      mesh.devices.flat[0].platform)
    return 1
  return 1 if jax.process_count() > 1 else int(n)


def _compiled(model, params, inputs, rows, rng, mesh, settings):
  layout = (jax.tree.structure(params),
            tuple((x.shape, x.dtype, getattr(x, "sharding", None))
                  for x in jax.tree.leaves(params)))
  key = (model, mesh, settings, inputs.shape, inputs.sharding, layout, rng.dtype)
  if key not in _COMPILED:
    mode, beam_size, alpha, max_extra_len, temperature, top_k, compact, refill = settings

    def run(params, inputs_BxS, rows_B, rng):
      # Sampling: a row key per example, whatever batch or device its row is in.
      return decode.encode_and_decode(
          state_lib.decoding(model), params, inputs_BxS, mode=mode, beam_size=beam_size,
          alpha=alpha, max_extra_len=max_extra_len,
          rng=search.row_keys(rng, rows_B) if mode == "sample" else None,
          temperature=temperature, top_k=top_k, compact=compact, refill=refill)

    if len(_COMPILED) >= _MAX_COMPILED:
      _COMPILED.clear()
    # Replicated output: every host can read every row.
    fn = jax.jit(run, out_shardings=sharding.replicated(mesh))
    _COMPILED[key] = fn.lower(params, inputs, rows, rng).compile()
  return _COMPILED[key]


def decode_ids(model, params, examples, config, mesh, *, mode="greedy", beam_size=4,
               alpha=0.6, max_extra_len=50, rng=None, temperature=1.0, top_k=0,
               tokens_per_batch=None, compact=0, refill=0, concurrent_batches=None,
               timings=None, example_ids=None):
  """Output ids for the sources of `examples` ((src, tgt) id arrays), in their order.

  Each is cut after its first EOS (kept), or has trailing PAD removed if it hit
  the length limit. Batches are grouped by length (eval_batches), split over the
  mesh's data axis, and decoded by one compiled program per batch shape. If
  `timings` is a dict it receives compile_seconds, decode_seconds and batches.
  Batch size (source tokens): `tokens_per_batch`, else config.decode's, else
  config.data's. `compact`, `refill`: see config.decode (beam search only); with
  refill = m a batch holds m times tokens_per_batch, and is searched as many
  sentences at a time as a batch of tokens_per_batch holds.
  `concurrent_batches`: batches decoded at once (see batches_at_once); every
  program is compiled before the first batch runs. Sampling draws example i's
  tokens with the key fold_in(rng, example_ids[i]) (default i), so its output
  depends on neither its batch, nor the devices, nor how the input was chunked.
  """
  # Checked before any work (each decode checks them again).
  decode.check_settings(mode, beam_size, alpha, max_extra_len, compact, temperature, top_k,
                        refill)
  workers = batches_at_once(config, mesh, concurrent_batches)  # A bad value fails first.
  if example_ids is not None and len(example_ids) != len(examples):
    raise ValueError(f"{len(example_ids)} example_ids for {len(examples)} examples")
  rng = jax.random.key(0) if rng is None else rng  # Used by 'sample' only.
  settings = (mode, int(beam_size), float(alpha), int(max_extra_len), float(temperature),
              int(top_k), int(compact) if mode == "beam" else 0)
  refill = int(refill) if mode == "beam" and beam_size > 1 else 0  # Beams to track.
  # Checked here, with the value given: each decode sees the items searched at
  # once, computed from it, and would fail only at compile time.
  if refill:
    decode.check_refill(state_lib.decoding(model), refill)
  # .get: configs saved before the field existed lack it.
  tokens_per_batch = (tokens_per_batch or config.decode.get("tokens_per_batch")
                      or config.data.tokens_per_batch)
  out = [None] * len(examples)
  compile_s = 0.0
  jobs = []
  # Bucketed by source length alone (a one-token dummy target): targets do not
  # enter decoding, and longer widths would cost time and compilations. Sorted
  # by length first, so a batch holds sentences of about the same length: it
  # runs until its longest output is done.
  order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
  sources = [(examples[i][0], examples[i][0][-1:]) for i in order]
  multiple = sharding.row_multiple(mesh)
  # Refill: batches m times as large, through the rows of one.
  for positions, batch in data_lib.eval_batches(sources, tokens_per_batch * (refill or 1),
                                                batch_multiple=multiple,
                                                max_length=config.data.max_length):
    # eval_batches pads the rows to few shapes: few compilations.
    indices = [order[p] for p in positions.tolist()]
    rows = np.zeros(len(batch["inputs"]), np.int32)  # Padding rows: any key.
    rows[:len(indices)] = [i if example_ids is None else example_ids[i] for i in indices]
    placed = sharding.place_batch(sharding.host_rows({"inputs": batch["inputs"], "rows": rows}),
                                  mesh)
    start = time.perf_counter()
    # A refilling batch searches the sentences of a batch of tokens_per_batch at a
    # time; one no larger than that searches them all at once.
    items = refill and data_lib.eval_rows(batch["inputs"].shape[1], tokens_per_batch, multiple)
    items = items if items < len(batch["inputs"]) else 0
    fn = _compiled(model, params, placed["inputs"], placed["rows"], rng, mesh,
                   settings + (items,))
    compile_s += time.perf_counter() - start
    jobs.append((indices, fn, placed))

  def run(job):
    indices, fn, placed = job
    return indices, np.asarray(jax.device_get(fn(params, placed["inputs"], placed["rows"], rng)))

  workers = min(workers, len(jobs))
  start = time.perf_counter()
  # jax.jit's calls release the GIL: the threads' programs run side by side.
  pool = futures.ThreadPoolExecutor(workers) if workers > 1 else None
  try:
    for indices, ids in (pool.map if pool else map)(run, jobs):
      runtime.raise_lost_interrupt()  # A Ctrl-C swallowed meanwhile stops here, not at the end.
      for row, index in enumerate(indices):
        out[index] = _cut(ids[row])
  finally:
    if pool:
      pool.shutdown(cancel_futures=True)  # On an error, the batches not yet started.
  decode_s = time.perf_counter() - start
  batches = len(jobs)
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


def evaluate_examples(model, params, examples, references, tokenizer, config, mesh,
                      **decode_kw):
  """(metrics with timing, hypotheses) of decoding `examples` against `references`."""
  timings = {}
  start = time.perf_counter()
  hypotheses = decode_examples(model, params, examples, tokenizer, config, mesh,
                               timings=timings, **decode_kw)
  metrics = metrics_lib.score(hypotheses, references, config.data.dataset)
  metrics.update(timings, num_sentences=len(hypotheses),
                 wall_seconds=time.perf_counter() - start,
                 sentences_per_second=len(hypotheses) / max(timings["decode_seconds"], 1e-9))
  return metrics, hypotheses
