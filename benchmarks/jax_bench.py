"""Our side: the library's own jitted train step (training.compile_steps) and KV-cache decoding."""

import contextlib
import functools
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from transformer import sharding, training

# Decoding runs every row to its length limit: an EOS id no token has, so both
# frameworks do the same, fixed work (a random-weight model's EOS is arbitrary).
NO_EOS = -1


@contextlib.contextmanager
def compile_log():
  """Counts XLA compilations and sums trace + lowering + compile seconds inside the block."""
  log = {"compiles": 0, "seconds": 0.0}
  events = ("/jax/core/compile/jaxpr_trace_duration",
            "/jax/core/compile/jaxpr_to_mlir_module_duration",
            "/jax/core/compile/backend_compile_duration")

  def listen(event, duration, **_):
    if event in events:
      log["seconds"] += duration
      log["compiles"] += event == events[-1]

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield log
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


def page_faults():
  """Minor page faults of this process so far (glibc malloc returning memory shows here)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def matmul_peak(n=2048, repeats=5):
  """FLOP/s of the best of `repeats` float32 [n, n] x [n, n] products (2 n^3 FLOPs)."""
  a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.float32) for i in (0, 1))
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def setup(size):
  """(model, train state, jitted train step, mesh) exactly as train_and_evaluate builds them."""
  config = common.experiment_config(size)
  mesh = sharding.make_mesh()
  model, tx, _, shardings = training.build(config, size.vocab_size, mesh)
  state = training.init_state(model, tx, config, shardings)
  step, _ = training.compile_steps(model, tx, config, mesh, shardings)
  return model, state, step, mesh


def train(size, batches, setup_result=None):
  """Warm-up (one step per distinct shape in `batches`), then every batch timed once.

  Returns the figures and the final state (for decoding with trained-a-bit weights).
  """
  model, state, step, mesh = setup_result or setup(size)
  placed = [sharding.place_batch(b, mesh) for b in batches]
  first = {}
  with compile_log() as log:
    for b, p in zip(batches, placed):
      shape = b["targets"].shape
      if shape not in first:
        t0 = time.perf_counter()
        state, metrics = step(state, p)
        jax.block_until_ready((state, metrics))
        first[shape] = (time.perf_counter() - t0, log["seconds"])
  warm_cache = step._cache_size()  # pylint: disable=protected-access
  first_shape_compile = next(iter(first.values()))[1]
  times, losses = [], []
  faults = page_faults()
  with compile_log() as late:
    for p in placed:
      t0 = time.perf_counter()
      state, metrics = step(state, p)
      jax.block_until_ready((state, metrics))
      times.append(time.perf_counter() - t0)
      losses.append(float(metrics["loss"]))
  faults = (page_faults() - faults) / len(batches)
  tgt, both = map(sum, zip(*map(common.token_counts, batches)))
  flops = sum(common.batch_flops(size, b) for b in batches)
  return {
      "page_faults_per_step": faults,
      "compile_s_first_shape": first_shape_compile,
      "compile_s_all_shapes": log["seconds"],
      "compiled_shapes_after_warmup": warm_cache,
      "distinct_shapes_timed": len(first),
      "recompiles_after_warmup": late["compiles"] + step._cache_size() - warm_cache,  # pylint: disable=protected-access
      "step_s_median": statistics.median(times),
      "step_s_all": times,
      "target_tokens_per_s": tgt / sum(times),
      "tokens_per_s": both / sum(times),
      "flops_per_step": flops / len(batches),
      "flops_per_s": flops / sum(times),
      "loss_first": losses[0], "loss_last": losses[-1],
  }, model, state


def generated_tokens(sources_BxS, max_extra_len, max_len):
  """Tokens the search emits with no EOS: min(len_b + max_extra_len, L) per row."""
  L = min(sources_BxS.shape[1] + max_extra_len, max_len)
  return np.minimum(np.count_nonzero(sources_BxS, axis=1) + max_extra_len, L)


def decoding(model, params, sources_BxS, *, mode, beam_size=4, max_extra_len=50, repeats=3):
  """Sentences/s and tokens/s of transformer.decode.encode_and_decode under jit."""
  from transformer import decode  # pylint: disable=g-import-not-at-top
  run = jax.jit(functools.partial(decode.encode_and_decode, model, mode=mode,
                                  beam_size=beam_size, max_extra_len=max_extra_len,
                                  eos_id=NO_EOS))
  inputs = jnp.asarray(sources_BxS)
  t0 = time.perf_counter()
  out = run(params, inputs).block_until_ready()
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = run(params, inputs).block_until_ready()
    times.append(time.perf_counter() - t0)
  t = statistics.median(times)
  tokens = int(generated_tokens(sources_BxS, max_extra_len, model.config.max_len).sum())
  assert out.shape[0] == len(sources_BxS)
  return {"sentences_per_s": len(sources_BxS) / t, "tokens_per_s": tokens / t,
          "decode_s_median": t, "compile_s": first - t, "tokens": tokens}
