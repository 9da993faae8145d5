"""The paper's Table 1, measured: time and maximum path length of four layer types.

  python -m benchmarks.table1 --json table1.json --plot table1.png
  python -m benchmarks.table1 --lengths 64,256,1024 --dims 512 --batch 8
  python -m benchmarks.table1 --smoke                        # tiny, seconds (CI)

Table 1 gives, per layer of width d on n positions: self-attention O(n^2 d)
work, O(1) sequential operations, O(1) maximum path length; recurrent
O(n d^2), O(n), O(n); convolutional (kernel width k) O(k n d^2), O(1),
O(log_k(n)) (dilated kernels; section 4: O(n/k) for contiguous ones);
self-attention restricted to a neighbourhood of size r O(r n d), O(1), O(n/r).

The layers here, [B, n, d] -> [B, n, d], float32, on the default JAX device:
  self-attention  multi-head (d/64 heads, as the paper's d_k = 64), with its
                  Q, K, V and output projections: 4 n d^2 more than Table 1's
                  n^2 d, which counts the scores and the weighted sum only;
                  the attention itself is attention.reference_attention.
  recurrent       nn.RNN(nn.GRUCell): the gated cell of transformer/rnn.py's
                  recurrent baselines; any cell costs O(n d^2) and n steps.
  convolutional   nn.Conv, kernel k (default 3), contiguous and causal: output
                  t reads inputs t-k+1..t, so a stack reaches k-1 positions
                  further back per layer (a centred kernel: (k-1)/2 each way).
  restricted      the same self-attention where position i attends to j only
                  if |i - j| <= r, computed blockwise (`local_attention`): each
                  block of r queries against its own and both neighbouring
                  blocks, 3r keys, so its work is O(r n d), not the dense n^2.
Time: the median of --repeats runs of the compiled forward pass, and of the
forward and backward pass (jax.vjp: gradients of parameters and inputs), each
after a compile and warm-up run. Path length (`path_length`): layers with fresh
parameters are stacked until output n-1 depends on input 0; for the recurrent
layer (one layer suffices) also the cell steps between them (`recurrent_steps`).
"""

import argparse
import json
import math
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import flax.linen as nn  # pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp

from benchmarks import common
from transformer import attention, runtime

PAPER = {  # Table 1: complexity per layer, sequential operations, maximum path length.
    "self-attention": ("O(n^2 d)", "O(1)", "O(1)"),
    "recurrent": ("O(n d^2)", "O(n)", "O(n)"),
    "convolutional": ("O(k n d^2)", "O(1)", "O(log_k(n)); contiguous O(n/k)"),
    "restricted self-attention": ("O(r n d)", "O(1)", "O(n/r)"),
}
EXACT = {  # The path lengths of these layers, from input 0 to output n-1.
    "self-attention": "1 layer",
    "recurrent": "1 layer, n-1 steps",
    "convolutional": "ceil((n-1)/(k-1)) layers",
    "restricted self-attention": "ceil((n-1)/r) layers",
}


def local_attention(q_BxNxHxK, k_BxNxHxK, v_BxNxHxK, r):
  """attention.reference_attention with |i - j| <= r, in 3r scores a query: blocks of r queries
  (the sequence zero-padded to whole blocks) against blocks b-1, b and b+1."""
  b, n, h, dk = q_BxNxHxK.shape
  nb = -(-n // r)
  blocks = lambda x, before: jnp.pad(
      x, ((0, 0), (before, nb * r - n + before), (0, 0), (0, 0))).reshape(b, -1, r, h, dk)
  q = blocks(q_BxNxHxK, 0)  # [B, nb, r, H, K]

  def windows(x):  # [B, nb, 3r, H, K]: keys (values) of blocks b-1, b, b+1.
    x = blocks(x, r)
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)

  i, j = jnp.arange(r)[:, None], jnp.arange(3 * r)[None, :]
  key_pos = jnp.arange(nb)[:, None, None] * r + j[None] - r  # [nb, 1, 3r]
  mask = (jnp.abs(i - j + r) <= r)[None] & (key_pos >= 0) & (key_pos < n)  # [nb, r, 3r]
  scores = jnp.einsum("bnqhk,bnshk->bnhqs", q, windows(k_BxNxHxK)) / math.sqrt(dk)
  scores = jnp.where(mask[None, :, None], scores, jnp.finfo(scores.dtype).min)
  out = jnp.einsum("bnhqs,bnshk->bnqhk", jax.nn.softmax(scores), windows(v_BxNxHxK))
  return out.reshape(b, nb * r, h, dk)[:, :n]


class SelfAttention(nn.Module):
  """Multi-head self-attention with its projections; restricted to |i - j| <= r if r."""
  heads: int
  r: int = 0

  @nn.compact
  def __call__(self, x_BxNxD):
    d = x_BxNxD.shape[-1]
    proj = lambda name: nn.DenseGeneral((self.heads, d // self.heads), name=name)(x_BxNxD)
    q, k, v = proj("query"), proj("key"), proj("value")
    out = (local_attention(q, k, v, self.r) if self.r
           else attention.reference_attention(q, k, v, None))
    return nn.DenseGeneral(d, axis=(-2, -1), name="out")(out)


def layers(k, r):
  """name -> (d -> the layer module), in Table 1's order."""
  heads = lambda d: max(1, d // 64)
  return {
      "self-attention": lambda d: SelfAttention(heads(d)),
      "recurrent": lambda d: nn.RNN(nn.GRUCell(d)),
      "convolutional": lambda d: nn.Conv(d, (k,), padding="CAUSAL"),
      "restricted self-attention": lambda d: SelfAttention(heads(d), r=r),
  }


def median_seconds(fn, repeats):
  """(median, all) wall seconds of fn() to block_until_ready, after one warm-up call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times), times


def time_layer(layer, params, n, d, batch, repeats, seed=0):
  """{'forward_s', 'forward_backward_s', and all their runs} of one layer on [batch, n, d]
  (its parameters do not depend on n: one set serves every length)."""
  kx, kc = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (batch, n, d))
  cotangent = jax.random.normal(kc, (batch, n, d))
  forward = jax.jit(layer.apply)
  backward = jax.jit(lambda p, x, c: jax.vjp(layer.apply, p, x)[1](c))
  f, f_all = median_seconds(lambda: forward(params, x), repeats)
  fb, fb_all = median_seconds(lambda: backward(params, x, cotangent), repeats)
  return {"forward_s": f, "forward_backward_s": fb, "forward_s_all": f_all,
          "forward_backward_s_all": fb_all}


def path_length(make, n, d, bound, seed=0):
  """Fewest stacked layers (fresh parameters each) after which output n-1 depends on
  input 0, or None past `bound`: the derivative along a random direction of input 0
  is carried forward one layer at a time (jax.jvp, so each further layer costs one
  application) and checked for a nonzero at position n-1; zeros are exact here
  (masked scores get a zero weight, taps outside a kernel a zero product)."""
  layer, key = make(d), jax.random.key(seed)
  x = jax.random.normal(key, (1, n, d))
  dx = jnp.zeros_like(x).at[0, 0].set(jax.random.normal(jax.random.fold_in(key, 1), (d,)))

  @jax.jit
  def step(key, x, dx):  # One more layer; whether position n-1 is reached.
    params = layer.init(key, x)
    x, dx = jax.jvp(lambda x: layer.apply(params, x), (x,), (dx,))
    # Rescaled, its zeros stay where they are and the rest stays clear of underflow.
    scale = jnp.max(jnp.abs(dx))
    return x, dx / jnp.where(scale > 0, scale, 1.0), jnp.any(dx[0, n - 1] != 0)

  for depth in range(1, bound + 1):
    x, dx, reached = step(jax.random.fold_in(key, depth + 1), x, dx)
    if reached:
      return depth
  return None


def recurrent_steps(n, d, seed=0):
  """Cell steps from input 0 to output n-1 in one recurrent layer: the n-1 after the
  one that reads input 0 if the carry depends on input 0 after every step, else None.
  The GRU cell runs over the n positions (lax.scan), the derivative of input 0
  riding in its carry (jax.jvp)."""
  cell, key = nn.GRUCell(d), jax.random.key(seed)
  xs = jax.random.normal(key, (n, 1, d))
  dxs = jnp.zeros_like(xs).at[0].set(jax.random.normal(jax.random.fold_in(key, 1), (1, d)))

  @jax.jit
  def carries_input_0(xs, dxs):  # [n]: the carry after step t depends on input 0.
    h = jnp.zeros((1, d))
    params = cell.init(jax.random.fold_in(key, 2), h, xs[0])

    def body(carry, x_dx):
      h, dh = jax.jvp(lambda h, x: cell.apply(params, h, x)[0], (carry[0], x_dx[0]),
                      (carry[1], x_dx[1]))
      return (h, dh), jnp.any(dh != 0)

    return jax.lax.scan(body, (h, h), (xs, dxs))[1]

  alive = carries_input_0(xs, dxs)
  return n - 1 if bool(jnp.all(alive)) else None


def measured_paths(n, d, k, r):
  """{layer name: {'layers': L, and 'steps' for the recurrent layer}} at length n."""
  out = {name: {"layers": path_length(make, n, d, bound=n)}
         for name, make in layers(k, r).items()}
  out["recurrent"]["steps"] = recurrent_steps(n, d)
  return out


def print_tables(results):
  a, meta = results["args"], results["meta"]
  print(f"device: {meta['device']}; CPU: {meta['cpu_model'] or 'unknown'} "
        f"({' '.join(meta['cpu_flags']) or 'no flags read'}), {meta['cpu_count']} cores; "
        f"k={a['k']}, r={a['r']}, batch {a['batch']}, median of {a['repeats']}")
  lengths = list(results["paths"])
  print("\n| layer | complexity per layer | sequential operations | maximum path length "
        "(paper) | path of this layer | " + " | ".join(f"measured, n={n}" for n in lengths)
        + " |\n|" + "---|" * (5 + len(lengths)))
  for name, paper in PAPER.items():
    cells = []
    for n in lengths:
      p = results["paths"][n][name]
      text = f"{p['layers']} layer{'s' * (p['layers'] != 1)}" if p["layers"] else "not reached"
      if "steps" in p:
        text += f", {p['steps']} steps" if p["steps"] else ", dependence lost"
      cells.append(text)
    print(f"| {name} | {' | '.join(paper)} | {EXACT[name]} | {' | '.join(cells)} |")
  ns = sorted({t["n"] for t in results["times"]})
  print("\nms per layer, forward / forward+backward:\n\n| layer | d | "
        + " | ".join(f"n={n}" for n in ns) + " |\n|" + "---|" * (2 + len(ns)))
  for name in PAPER:
    for d in sorted({t["d"] for t in results["times"]}):
      row = {t["n"]: t for t in results["times"] if t["layer"] == name and t["d"] == d}
      cells = [f"{1e3 * row[n]['forward_s']:.3g} / {1e3 * row[n]['forward_backward_s']:.3g}"
               for n in ns]
      print(f"| {name} | {d} | {' | '.join(cells)} |")


def plot(results, path):
  """Log-log time against n, one line per layer type, one panel per d."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  dims = sorted({t["d"] for t in results["times"]})
  fig, axes = plt.subplots(1, len(dims), figsize=(5 * len(dims), 4), squeeze=False)
  for ax, d in zip(axes[0], dims):
    for i, name in enumerate(PAPER):
      rows = sorted((t["n"], t) for t in results["times"] if t["layer"] == name and t["d"] == d)
      ns = [n for n, _ in rows]
      ax.loglog(ns, [t["forward_s"] for _, t in rows], "o-", color=f"C{i}", label=name)
      ax.loglog(ns, [t["forward_backward_s"] for _, t in rows], "s--", color=f"C{i}",
                label=f"{name}, fwd+bwd")
    ax.set(title=f"d = {d}", xlabel="sequence length n", ylabel="seconds per layer")
    ax.grid(True, which="both", alpha=0.3)
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def ints(text):
  """'16,32' -> [16, 32] (argparse names the function in its error)."""
  return [int(v) for v in text.split(",")]


# The least value of each flag: a layer needs a position, a width and a batch row;
# a median at least one run; a kernel of width 1 reaches no earlier position, and
# a neighbourhood of 0 is no restriction (the layer then runs unrestricted); a
# path from input 0 to output n-1 needs two positions.
LEAST = {"lengths": 1, "dims": 1, "batch": 1, "repeats": 1, "k": 2, "r": 1, "path_lengths": 2}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--lengths", type=ints, default=[16, 32, 64, 128, 256, 512, 1024])
  p.add_argument("--dims", type=ints, default=[256, 512])
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--k", type=int, default=3, help="convolution kernel width, >= 2")
  p.add_argument("--r", type=int, default=8, help="restricted self-attention neighbourhood, >= 1")
  p.add_argument("--path_lengths", type=ints, default=[16, 64],
                 help="n of the path measurement (at the smallest of --dims)")
  p.add_argument("--smoke", action="store_true", help="n 16 and 32, d 32, 1 repeat (CI)")
  p.add_argument("--json", help="write the results here")
  p.add_argument("--plot", help="write the time plot here (PNG)")
  args = p.parse_args(argv)
  if args.smoke:
    args.lengths, args.dims, args.repeats, args.path_lengths = [16, 32], [32], 1, [16]
  # Checked before any work: a bad value fails in JAX, or prints a wrong table, and
  # a bad output path would fail only after everything was measured.
  common.check_flags(p, args, least=LEAST, outputs=("json", "plot"))

  results = {"args": vars(args), "meta": {
      "device": str(jax.devices()[0]), "platform": platform.platform(),
      "cpu_count": os.cpu_count(), **common.cpu_description(),
      "load_average_start": os.getloadavg(), "jax": jax.__version__,
      **{k: os.environ.get(k, "")  # The allocator (runtime.use_fast_malloc).
         for k in ("GLIBC_TUNABLES", "LD_PRELOAD", *runtime.TCMALLOC_ENV)}}}
  results["paths"] = {n: measured_paths(n, min(args.dims), args.k, args.r)
                      for n in args.path_lengths}
  results["times"] = []
  for d in args.dims:
    for name, make in layers(args.k, args.r).items():
      layer = make(d)
      params = jax.jit(layer.init)(jax.random.key(1), jnp.zeros((1, min(args.lengths), d)))
      for n in args.lengths:
        results["times"].append({"layer": name, "d": d, "n": n,
                                 **time_layer(layer, params, n, d, args.batch, args.repeats)})
      print(f"[{name}, d={d} timed]", flush=True)
  results["meta"]["load_average_end"] = os.getloadavg()
  print_tables(results)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  if args.plot:
    plot(results, args.plot)
  return results


if __name__ == "__main__":
  runtime.use_fast_malloc()  # The allocator the commands use (transformer/runtime.py).
  main()
