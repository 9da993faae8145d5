"""Our side: the library's own jitted train step (steps.compile_steps) and KV-cache decoding."""

import contextlib
import functools
import resource
import time

import jax
import jax.numpy as jnp

from benchmarks import common
from transformer import sharding, state as state_lib, steps

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


def matmul_peak(n=2048, repeats=5, dtype="float32"):
  """FLOP/s of the best of `repeats` [n, n] x [n, n] products (2 n^3 FLOPs) in
  `dtype`, accumulated in float32 as the model's products are."""
  a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.float32).astype(dtype)
          for i in (0, 1))
  dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
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
  model, tx, _, shardings, _ = state_lib.build(config, size.vocab_size, mesh)
  state = state_lib.init_state(model, tx, config, shardings)
  step, _ = steps.compile_steps(model, tx, config, mesh, shardings)
  return model, state, step, mesh


class Trainer:
  """Our train step over fixed batches: warm_up() compiles every shape, step(i) times one."""

  def __init__(self, size, batches):
    self.size, self.batches = size, batches
    self.model, self.state, self._step, mesh = setup(size)
    self._placed = [sharding.place_batch(b, mesh) for b in batches]
    self.times, self.cpu, self.losses, self.faults, self.late_compiles = [], [], [], 0, 0
    self.compile = {}

  def _run(self, i):
    self.state, metrics = self._step(self.state, self._placed[i])
    jax.block_until_ready((self.state, metrics))
    return metrics

  def warm_up(self):
    """One step per distinct shape: the compile time of the first and of all shapes."""
    shapes = {}
    with compile_log() as log:
      for i, b in enumerate(self.batches):
        if b["targets"].shape not in shapes:
          self._run(i)
          shapes[b["targets"].shape] = log["seconds"]
    self.compile = {"compile_s_first_shape": next(iter(shapes.values())),
                    "compile_s_all_shapes": log["seconds"],
                    "distinct_shapes_timed": len(shapes),
                    "compiled_shapes_after_warmup": self._step._cache_size()}  # pylint: disable=protected-access

  def untimed_step(self, i):
    self._run(i)

  def step(self, i):
    f0, c0 = page_faults(), time.process_time()
    with compile_log() as log:
      t0 = time.perf_counter()
      metrics = self._run(i)
      self.times.append(time.perf_counter() - t0)
    self.cpu.append(time.process_time() - c0)
    self.faults += page_faults() - f0
    self.late_compiles += log["compiles"]
    self.losses.append(float(metrics["loss"]))

  def figures(self):
    grown = self._step._cache_size() - self.compile["compiled_shapes_after_warmup"]  # pylint: disable=protected-access
    return {**self.compile, "recompiles_after_warmup": self.late_compiles + grown,
            **common.summarize(self.size, self.batches, self.times, self.cpu, self.losses,
                               self.faults)}


def decoder(model, params, sources_BxS, *, mode, beam_size=4, max_extra_len=50):
  """(compile seconds, run) for transformer.decode.encode_and_decode under jit; run()
  decodes the batch once and returns its seconds."""
  from transformer import decode  # pylint: disable=g-import-not-at-top
  from transformer.model import TransformerDecoding  # pylint: disable=g-import-not-at-top
  jitted = jax.jit(functools.partial(decode.encode_and_decode, TransformerDecoding(model),
                                     mode=mode, beam_size=beam_size,
                                     max_extra_len=max_extra_len, eos_id=NO_EOS))
  inputs = jnp.asarray(sources_BxS)

  def run():
    t0 = time.perf_counter()
    out = jitted(params, inputs).block_until_ready()
    assert out.shape[0] == len(sources_BxS)
    return time.perf_counter() - t0

  with compile_log() as log:
    run()
  return log["seconds"], run


def decoders(model, params, sources_BxS, max_extra_len=50):
  """{'greedy': (compile seconds, run), 'beam4': ...}: our two decodings of the
  batch (decoder), as every decoding benchmark runs them."""
  return {name: decoder(model, params, sources_BxS, mode=mode, beam_size=4,
                        max_extra_len=max_extra_len)
          for mode, name in (("greedy", "greedy"), ("beam", "beam4"))}
