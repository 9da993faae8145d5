"""Attention pooling, the simplest attention: Nadaraya-Watson kernel regression.

  python -m examples.attention_pooling [--out_dir runs/attention_pooling]

The textbook toy problem (Dive into Deep Learning, "Attention Pooling"): 50 noisy
training points of y = 2 sin(x) + x^0.8 on [0, 5]. A query x is answered by pooling
the training targets y_i (values) with weights from its distance to the training
inputs x_i (keys):
  average pooling       f(x) = mean_i y_i (the weights ignore the query);
  Nadaraya-Watson       f(x) = sum_i softmax_i(-(x - x_i)^2 / 2) y_i (a Gaussian kernel);
  parametric            the same with a learned width, softmax_i(-((x - x_i) w)^2 / 2),
                        w fitted with optax by leave-one-out: each training point is a
                        query over the others (with itself as a key, w would grow
                        until every point only copies its own noisy target).
It prints each one's mean squared error against the noiseless curve on held-out
queries and writes the attention weights (queries down, sorted keys across) and the
fitted curves as PNG files.
"""

import os
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")  # Files only; no display needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np
import optax

from transformer import plots


def truth(x):
  return 2 * np.sin(x) + x**0.8


def make_data(seed=0, n_train=50, noise=0.5):
  """(x_train sorted, y_train noisy, x_test on a grid, y_test noiseless)."""
  rng = np.random.default_rng(seed)
  x_train = np.sort(rng.uniform(0, 5, n_train)).astype(np.float32)
  y_train = (truth(x_train) + rng.normal(0, noise, n_train)).astype(np.float32)
  x_test = np.arange(0, 5, 0.1, dtype=np.float32)
  return x_train, y_train, x_test, truth(x_test).astype(np.float32)


def attention_weights(queries_Q, keys_K, w=1.0, mask_QxK=None):
  """[Q, K] softmax over keys of the Gaussian kernel score -((q - k) w)^2 / 2;
  masked-out keys get weight 0."""
  scores_QxK = -((queries_Q[:, None] - keys_K[None, :]) * w) ** 2 / 2
  if mask_QxK is not None:
    scores_QxK = jnp.where(mask_QxK, scores_QxK, -jnp.inf)
  return jax.nn.softmax(scores_QxK, axis=-1)


def average_pooling(queries_Q, values_K):
  return jnp.full(queries_Q.shape, jnp.mean(values_K))


def nadaraya_watson(queries_Q, keys_K, values_K, w=1.0, mask_QxK=None):
  return attention_weights(queries_Q, keys_K, w, mask_QxK) @ values_K


def fit_width(x_train, y_train, steps=200, learning_rate=0.5, seed=0):
  """The kernel width w minimising the leave-one-out squared error (optax SGD)."""
  others_KxK = ~np.eye(len(x_train), dtype=bool)

  def loss(w):
    fitted = nadaraya_watson(x_train, x_train, y_train, w, others_KxK)
    return jnp.mean((fitted - y_train) ** 2) / 2

  w = jax.random.uniform(jax.random.key(seed), ())  # As the textbook: U(0, 1).
  tx = optax.sgd(learning_rate)
  opt_state = tx.init(w)

  @jax.jit
  def step(w, opt_state):
    value, grad = jax.value_and_grad(loss)(w)
    updates, opt_state = tx.update(grad, opt_state)
    return optax.apply_updates(w, updates), opt_state, value

  for _ in range(steps):
    w, opt_state, _ = step(w, opt_state)
  return float(w), float(loss(w))


def run(out_dir, seed=0, steps=200):
  """Fits the three poolings, writes the two pictures; returns {name: held-out MSE}
  and the learned width."""
  x_train, y_train, x_test, y_test = make_data(seed)
  w, _ = fit_width(x_train, y_train, steps, seed=seed)
  fits = {"average pooling": average_pooling(x_test, y_train),
          "Nadaraya-Watson (w = 1)": nadaraya_watson(x_test, x_train, y_train),
          f"parametric (learned w = {w:.2f})": nadaraya_watson(x_test, x_train, y_train, w)}
  mse = {name: float(np.mean((np.asarray(f) - y_test) ** 2)) for name, f in fits.items()}

  os.makedirs(out_dir, exist_ok=True)
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(x_test, y_test, "k-", label="truth")
  ax.plot(x_train, y_train, "o", alpha=0.5, label="training points")
  for name, f in fits.items():
    ax.plot(x_test, f, label=f"{name}: MSE {mse[name]:.3f}")
  ax.set_xlabel("x")
  ax.set_ylabel("y")
  ax.legend(fontsize=8)
  plots.save_figure(fig, os.path.join(out_dir, "attention_pooling_fit.png"))

  panels = [("Nadaraya-Watson, w = 1", attention_weights(x_test, x_train)),
            (f"parametric, w = {w:.2f}", attention_weights(x_test, x_train, w))]
  vmax = max(float(weights.max()) for _, weights in panels)  # One colour scale for both.
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
  for ax, (title, weights) in zip(axes, panels):
    image = ax.imshow(np.asarray(weights), cmap="Reds", vmin=0, vmax=vmax, aspect="auto")
    ax.set_xlabel("training inputs (keys, sorted)")
    ax.set_ylabel("test inputs (queries)")
    ax.set_title(title)
  fig.colorbar(image, ax=list(axes))
  plots.save_figure(fig, os.path.join(out_dir, "attention_pooling_weights.png"))
  return mse, w


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  mse, w = run(f.out_dir, f.seed, f.steps)
  for name, value in mse.items():
    print(f"{name:<36} held-out MSE {value:.4f}")
  print(f"learned kernel width w = {w:.3f}; pictures in {f.out_dir}", file=sys.stderr)


if __name__ == "__main__":
  flags.DEFINE_string("out_dir", "runs/attention_pooling", "Where the PNG files go.")
  flags.DEFINE_integer("seed", 0, "Seeds the data and the initial width.")
  flags.DEFINE_integer("steps", 200, "Full-batch SGD steps fitting the width.")
  app.run(main)
