"""Where our training step's time goes: a per-op profile, and the step with one thing changed.

  python -m benchmarks.profile --size small --variants all --json prof.json
  python -m benchmarks.profile --size base --dtype bfloat16 --tokens_per_batch 25000 \
      --pack --variants reference_attn --interleave --steps 10   # cuDNN's gain on a GPU

Every variant is the library's own train step (steps.compile_steps) on the
same pipeline batch (the baseline's dtype, batch size and batching set by
--dtype, --tokens_per_batch and --pack), timed as the median of --steps steps
after warm-up; its ratio is variant / baseline step time. Variants change one thing, traced in
from here (no library file is edited):
  dropout=0          no dropout at all: an upper bound on what dropout costs
  rbg                jax_default_prng_impl=unsafe_rbg (XLA RngBitGenerator) for
                     the dropout masks instead of threefry
  reference_attn     attention_impl="reference" instead of "fused" (the same program
                     on a CPU, where "fused" runs the reference)
  xla_attn           jax.nn.dot_product_attention's XLA form for "fused" attention
                     whatever the backend (the CPU's choice before session 20)
  bfloat16           compute dtype bfloat16 (parameters stay float32)
  pack               a packed batch (data.batching="pack", pack_length = max_length)
                     instead of a bucketed one: compare target tokens/s, not time
Parts: forward only (the eval loss) and forward + backward (gradients, dropout
on) time the step without the optimizer. --trace adds the top XLA ops of a
jax.profiler trace: on a CPU the thunks on the client's threads, on a GPU the
kernels on its streams, by kind (products, attention, reductions, ...) and with
the share of the steps' span the device was busy.
"""

import argparse
import collections
import contextlib
import dataclasses
import functools
import glob
import json
import os
import statistics
import tempfile
import time
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top

from benchmarks import common
from transformer import attention, runtime, sharding, state as state_lib, steps as steps_lib

VARIANTS = ("dropout=0", "rbg", "reference_attn", "xla_attn", "bfloat16", "pack")


@contextlib.contextmanager
def variant(name):
  """Traces the step (and builds the state) with one change in force."""
  with contextlib.ExitStack() as stack:
    if name == "rbg":
      old = jax.config.jax_default_prng_impl
      jax.config.update("jax_default_prng_impl", "unsafe_rbg")
      stack.callback(jax.config.update, "jax_default_prng_impl", old)
    if name == "xla_attn":  # Read when the step is traced.
      stack.enter_context(mock.patch.object(attention, "fused_implementation",
                                            lambda *a, **k: "xla"))
    yield


def _config(size, name):
  config = common.experiment_config(size)
  if name == "dropout=0":
    config.model.dropout = 0.0
  if name == "reference_attn":
    config.model.attention_impl = "reference"
  if name == "bfloat16":
    config.model.dtype = "bfloat16"
  return config


def _median_time(fn, steps):
  fn()
  fn()  # Compile, then one more for the allocator to settle.
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _setup(size, batch, name):
  """(model, state, jitted step, placed batch) of a variant, built under it."""
  with variant(name):
    config = _config(size, name)
    mesh = sharding.make_mesh()
    model, tx, _, shardings, _ = state_lib.build(config, size.vocab_size, mesh)
    state = state_lib.init_state(model, tx, config, shardings)
    step, _ = steps_lib.compile_steps(model, tx, config, mesh, shardings)
    return model, state, step, sharding.place_batch(batch, mesh)


def _stepper(name, state, step, placed):
  """run() does one train step of the variant; holder[0] is the current state."""
  holder = [state]

  def run():
    with variant(name):
      holder[0], metrics = step(holder[0], placed)
      jax.block_until_ready((holder[0], metrics))

  return run, holder


def time_variant(size, batch, name, steps, parts=False):
  """Median seconds of the train step (and with parts, of forward and forward+backward)."""
  model, state, step, placed = _setup(size, batch, name)
  out = {}
  if parts:
    loss_fn = functools.partial(steps_lib.loss_sums, model=model, label_smoothing=0.1)
    fwd = jax.jit(lambda p, b: loss_fn(p, b)["loss"])
    grad = jax.jit(jax.grad(lambda p, b, r: loss_fn(p, b, rng=r)["loss"]))
    rng = jax.random.key(1)
    out["forward"] = _median_time(lambda: fwd(state.params, placed).block_until_ready(), steps)
    out["forward+backward"] = _median_time(
        lambda: jax.block_until_ready(grad(state.params, placed, rng)), steps)
  run, holder = _stepper(name, state, step, placed)
  out["step"] = _median_time(run, steps)
  return out, (step, holder)


def interleave(size, batch, names, steps, packed=None):
  """Baseline and variants alternating step by step in one process, so that drifting
  load from other processes hits all alike: median wall and CPU seconds per step."""
  runs = {}
  for name in ("baseline",) + tuple(names):
    b = packed if name == "pack" else batch
    runs[name] = _stepper(name, *_setup(size, b, name)[1:])[0]
    runs[name]()
    runs[name]()  # Compile, then one more for the allocator to settle.
  wall, cpu = ({n: [] for n in runs} for _ in range(2))
  for _ in range(steps):
    for name, run in runs.items():
      c0, t0 = time.process_time(), time.perf_counter()
      run()
      wall[name].append(time.perf_counter() - t0)
      cpu[name].append(time.process_time() - c0)
  return {n: {"step": statistics.median(wall[n]), "cpu": statistics.median(cpu[n]),
              "step_all": wall[n]} for n in runs}


# GPU kernels by what they compute, the first match of a lowercased kernel name
# (cuBLAS's `nvjet_*`, XLA's Triton `gemm_fusion_dot.*`, cuDNN's flash attention
# `*_sdpa_*` and its helpers `cudnn::*`, XLA's fusions named by their root op).
GPU_KINDS = (("attention (cuDNN)", ("sdpa", "flash", "cudnn")),
             ("matmul", ("nvjet", "gemm", "cutlass", "cublas")),
             ("copy", ("memcpy", "memset")),
             ("random bits", ("xor", "threefry")),
             ("reduction", ("reduce",)))


def kernel_kind(name):
  lower = name.lower()
  return next((kind for kind, marks in GPU_KINDS if any(m in lower for m in marks)),
              "elementwise fusion")


def op_times(planes, steps):
  """({op: ms per step}, {kind: ms per step}, the kernels' share of the traced span or
  None) of a jax.profiler trace's planes. A GPU's kernels come from its device
  plane's stream lines; a CPU's ops are the XLA thunks on the client's threads,
  grouped by name ('ynn_fusion.382' -> 'ynn_fusion', YNNPACK's products). A TPU's
  planes are not read."""
  planes = [(plane.name, list(plane.lines)) for plane in planes]  # Iterators, read once.
  streams = [line for name, lines in planes if name.startswith("/device:")
             and not name.startswith("/device:CPU") for line in lines
             if line.name.startswith("Stream")]
  total, kinds, spans = collections.Counter(), collections.Counter(), []
  for line in streams or [line for _, lines in planes for line in lines
                          if "PjRtCpuClient" in line.name or "XLAEigen" in line.name]:
    for e in line.events:
      if e.name.startswith(("ThreadpoolListener", "ThunkExecutor", "SlinkyThreadPool",
                            "end: ")):
        continue
      ms = e.duration_ns / 1e6 / steps
      total[e.name] += ms
      kinds[kernel_kind(e.name) if streams else e.name.split(".")[0]] += ms
      spans.append((e.start_ns, e.start_ns + e.duration_ns))
  busy = None
  if streams and spans:  # The device idles between steps while the host dispatches.
    busy = sum(b - a for a, b in spans) / (max(b for _, b in spans) - min(a for a, _ in spans))
  return total, kinds, busy


def top_ops(step, holder, placed, steps=2, top=15):
  """([(op, ms per step, share)], the same by kind, ms per step in all, the kernels'
  share of the traced span (a GPU's; None on a CPU)) from a jax.profiler trace of
  `steps` steps."""
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      for _ in range(steps):
        holder[0], m = step(holder[0], placed)
        jax.block_until_ready((holder[0], m))
    path = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)[0]
    data = jax.profiler.ProfileData.from_file(path)
  total, kinds, busy = op_times(data.planes, steps)
  whole = sum(total.values()) or 1.0
  return ([(n, ms, ms / whole) for n, ms in total.most_common(top)],
          [(n, ms, ms / whole) for n, ms in kinds.most_common(top)], whole, busy)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="small", choices=tuple(common.SIZES))
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--variants", default="all", help=f"comma-separated of {VARIANTS}, or none")
  p.add_argument("--trace", action="store_true", help="per-op profile of the baseline step")
  p.add_argument("--interleave", action="store_true",
                 help="only: baseline and --variants alternating step by step (wall and CPU s)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="the baseline's compute dtype")
  p.add_argument("--tokens_per_batch", type=int, help="default: the size's, 4096")
  p.add_argument("--pack", action="store_true", help="the baseline trains on a packed batch")
  p.add_argument("--json")
  args = p.parse_args(argv)
  # Checked before any work: a count below 1 has no median, or (--tokens_per_batch 0)
  # stood for the default; a misspelt variant re-timed the baseline under its name;
  # a bad --json path failed only after everything was timed.
  common.check_flags(p, args, least=dict.fromkeys(("steps", "tokens_per_batch"), 1),
                     outputs=("json",))
  names = (VARIANTS if args.variants == "all" else
           [] if args.variants == "none" else list(filter(None, args.variants.split(","))))
  unknown = [name for name in names if name not in VARIANTS]
  if unknown:
    p.error(f"--variants: no variant {unknown[0]!r} (variants: {', '.join(VARIANTS)}; "
            "or all, or none)")
  size = dataclasses.replace(common.SIZES[args.size], dtype=args.dtype,
                             tokens_per_batch=args.tokens_per_batch
                             or common.SIZES[args.size].tokens_per_batch)
  examples = common.synthetic_examples(size)
  packed = common.timed_batches(size, examples, 1, batching="pack")[0]
  batch = packed if args.pack else common.timed_batches(size, examples, 1)[0]
  print(f"size {size.name}, batch {batch['targets'].shape}, "
        f"{common.batch_flops(size, batch) / 1e9:.1f} GFLOP a step", flush=True)
  results = {"batch_shape": list(batch["targets"].shape), "size": dataclasses.asdict(size)}
  if args.interleave:
    results["interleaved"] = out = interleave(size, batch, names, args.steps, packed)
    for name, r in out.items():
      r["target_tokens_per_s"] = common.token_counts(
          packed if name == "pack" else batch)[0] / r["step"]
      print(f"  {name:<18} {r['step']:8.3f} s wall  {r['cpu']:8.3f} s CPU  "
            f"x{r['step'] / out['baseline']['step']:.3f} wall  "
            f"x{r['cpu'] / out['baseline']['cpu']:.3f} CPU of baseline  "
            f"{r['target_tokens_per_s']:,.0f} target tokens/s", flush=True)
  else:
    base, (step, holder) = time_variant(size, batch, "baseline", args.steps, parts=True)
    for part, seconds in base.items():
      print(f"  {part:<18} {seconds:8.3f} s  {seconds / base['step']:6.1%} of the step",
            flush=True)
    base["target_tokens_per_s"] = common.token_counts(batch)[0] / base["step"]
    results["baseline"] = base
    if args.trace:
      ops, kinds, whole, busy = top_ops(step, holder,
                                        sharding.place_batch(batch, sharding.make_mesh()))
      results["top_ops"], results["top_kinds"], results["busy"] = ops, kinds, busy
      what = "XLA thunks" if busy is None else (
          f"Device kernels (busy {busy:.0%} of the traced steps' span)")
      print(f"{what} by kind, then the top ones ({whole:.0f} ms a step in all):")
      for name, ms, share in kinds + [("", 0, 0)] + ops:
        print(f"  {name[:60]:<60} {ms:9.1f} ms {share:6.1%}" if name else "")
    del step, holder
    print(f"  baseline: {base['target_tokens_per_s']:,.0f} target tokens/s")
    for name in names:
      b = packed if name == "pack" else batch
      out, _ = time_variant(size, b, name, args.steps)
      out["target_tokens_per_s"] = common.token_counts(b)[0] / out["step"]
      results[name] = out
      print(f"  {name:<18} {out['step']:8.3f} s  x{out['step'] / base['step']:.3f} of baseline, "
            f"{out['target_tokens_per_s']:,.0f} target tokens/s "
            f"(x{out['target_tokens_per_s'] / base['target_tokens_per_s']:.3f})", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == "__main__":
  runtime.use_fast_malloc()  # The allocator the commands use (transformer/runtime.py).
  main()
