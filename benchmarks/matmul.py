"""Float32 matmul GFLOP/s at the shapes of a training step: jnp.dot vs torch.mm.

  python -m benchmarks.matmul [--size base|small]      # XLA's default CPU dots (YNNPACK)
  XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python -m benchmarks.matmul   # Eigen
  XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true \
    --xla_cpu_experimental_onednn_fusion_type=dot" python -m benchmarks.matmul  # oneDNN

M = 4096 tokens; best of --repeats runs each. The training step is ~all
matmuls, so its MFU is bounded by how fast these run.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

from benchmarks import common
from transformer import runtime


def step_shapes(size, tokens=4096):
  """(name, m, k, n) of [m, k] x [k, n]: the GEMMs of a training step of `size`
  (benchmarks.common.SIZES), `tokens` rows a side, with a 2048^3 reference."""
  d, f, v = size.d_model, size.d_ff, size.vocab_size
  return (
      ("square 2048", 2048, 2048, 2048),
      (f"Q/K/V/O {tokens}x{d}x{d}", tokens, d, d),
      (f"FFN in {tokens}x{d}x{f}", tokens, d, f),
      (f"FFN out {tokens}x{f}x{d}", tokens, f, d),
      (f"logits {tokens}x{d}x{v}", tokens, d, v),
      (f"embedding grad {v}x{tokens}x{d}", v, tokens, d),
      (f"beam logits 256x{d}x{v}", 256, d, v),  # One beam-4 step of 64 sentences.
  )


def best_seconds(fn, repeats):
  fn()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--size", default="base", choices=("small", "base"))
  p.add_argument("--no_torch", action="store_true")
  args = p.parse_args(argv)
  torch = None
  if not args.no_torch:
    try:
      import torch  # pylint: disable=g-import-not-at-top
      torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
      pass
  dot = jax.jit(jnp.dot)
  print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  print(f"{'shape':<32} {'jnp.dot GFLOP/s':>16} {'torch.mm GFLOP/s':>17} {'ratio':>6}")
  rows = []
  cpu = jax.devices("cpu")[0]  # torch.mm runs on the CPU here: so does jnp.dot, on any host.
  for name, m, k, n in step_shapes(common.SIZES[args.size]):
    a = jax.device_put(jax.random.normal(jax.random.key(0), (m, k), jnp.float32), cpu)
    b = jax.device_put(jax.random.normal(jax.random.key(1), (k, n), jnp.float32), cpu)
    ours = 2 * m * k * n / best_seconds(lambda: dot(a, b).block_until_ready(), args.repeats)
    theirs = None
    if torch is not None:
      ta, tb = torch.randn(m, k), torch.randn(k, n)
      theirs = 2 * m * k * n / best_seconds(lambda: torch.mm(ta, tb), args.repeats)
    rows.append((name, ours / 1e9, theirs and theirs / 1e9))
    print(f"{name:<32} {ours / 1e9:>16.1f} "
          + (f"{theirs / 1e9:>17.1f} {ours / theirs:>6.2f}" if theirs else ""), flush=True)
  return rows


if __name__ == "__main__":
  runtime.use_fast_malloc()  # The allocator the commands use (transformer/runtime.py).
  main()
