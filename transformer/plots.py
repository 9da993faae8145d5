"""Pictures: encoder-decoder attention of one sentence, and the positional encodings.

  python -m transformer.plots positional --d_model 512 --max_len 100 --out pe.png

The attention heatmap is drawn by `python -m transformer.translate ... --plot_attention
OUT.png`, from `cross_attention_weights` and `plot_attention` here.
"""

import functools
import io
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from transformer import attention, files, runtime
from transformer.model import sinusoidal_table


def pyplot():
  """matplotlib.pyplot, drawing to files only (no display needed). Imported at
  the first picture, not with this module: translate imports this module but
  draws only when --plot_attention asks, and pyplot's import is a large part of
  a command's start-up."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def check_layer(layer: int, num_layers: int) -> None:
  """A ValueError for a decoder layer index (Python's: -1 the last) out of range."""
  if not -num_layers <= layer < num_layers:
    raise ValueError(f"layer {layer} out of range for a {num_layers}-layer decoder")


def cross_attention_projections(model, params, inputs_BxS, targets_BxT, layer=-1,
                                names=("query", "key")):
  """{name: [B, len, H, K]} projections of decoder layer `layer`'s encoder-decoder
  attention, captured from a teacher-forced forward pass on (inputs, targets).

  The model does not return attention weights; its query/key projections are
  the same whichever attention implementation runs, so they are captured and
  the weights recomputed (`attention_weights`).
  """
  num_layers = model.config.num_layers
  check_layer(layer, num_layers)
  wanted = ("decoder", f"layer_{layer % num_layers}", "cross_attention")
  paths = {wanted + (name,) for name in names}

  def capture(module, method):
    return method == "__call__" and tuple(module.path) in paths

  # Jitted: one compilation instead of one per operation of an eager forward pass.
  forward = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y, mutable=["intermediates"],
                                                capture_intermediates=capture)[1])
  variables = forward(params, jnp.asarray(inputs_BxS), jnp.asarray(targets_BxT))
  found = variables["intermediates"]["decoder"][wanted[1]]["cross_attention"]
  return {name: found[name]["__call__"][0] for name in names}


def attention_weights(q_BxTxHxK, k_BxSxHxK, inputs_BxS, pad_id=0, score="scaled_dot",
                      score_params=None):
  """[B, H, T, S] softmax(score(Q, K)) over non-padding source positions: the
  weights of transformer.attention.reference_attention, in float32.
  `score_params` are the attention module's parameters (the additive and general
  scores read their matrices there)."""
  return attention.attention_probs(q_BxTxHxK, k_BxSxHxK,
                                   attention.padding_mask(jnp.asarray(inputs_BxS), pad_id),
                                   score=score, score_params=score_params)


def cross_attention_weights(model, params, source_ids, output_ids, layer=-1):
  """[H, T, S] attention of output token t (the step that predicted it) over the
  source tokens of one sentence; ids as 1-D arrays without padding. The rnn has
  one attention (Bahdanau's soft alignment): [1, T, S], whatever `layer`."""
  inputs = np.asarray(source_ids, np.int32)[None]
  targets = np.asarray(output_ids, np.int32)[None]
  if inputs.size == 0 or targets.size == 0:
    raise ValueError("attention needs a non-empty source and output")
  if model.config.architecture == "rnn":  # One attention, no layers or heads: [1, T, S].
    return np.asarray(jax.jit(functools.partial(model.apply, method="attention_weights"))(
        {"params": params}, inputs, targets))
  p = cross_attention_projections(model, params, inputs, targets, layer)
  cfg = model.config
  module_params = params["decoder"][f"layer_{layer % cfg.num_layers}"]["cross_attention"]
  return np.asarray(attention_weights(p["query"], p["key"], inputs, cfg.pad_id,
                                      cfg.attention_score, module_params))[0]


def parse_head(head, num_heads):
  """'all' | 'avg' | a head index in [0, num_heads) -> 'all' | 'avg' | int."""
  if head in ("all", "avg"):
    return head
  try:
    index = int(head)
  except (TypeError, ValueError):
    raise ValueError(f"head must be 'all', 'avg' or a head number, got {head!r}") from None
  if not 0 <= index < num_heads:
    raise ValueError(f"head {index} out of range: the model has {num_heads} heads")
  return index


def figure_format(path, flag="--out") -> str:
  """The image format of `path`'s suffix (PNG without one: a device, a pipe), or
  a ValueError naming `flag` for a suffix matplotlib does not write: checked
  before any work, so that no file gets bytes of another format than its name says."""
  suffix = os.path.splitext(path)[1][1:].lower()
  if not suffix:
    return "png"
  known = pyplot().Figure().canvas.get_supported_filetypes()  # Not kept by pyplot.
  if suffix not in known:
    raise ValueError(f"{flag} {path!r}: matplotlib writes no .{suffix} files; use one of "
                     f"{', '.join('.' + k for k in sorted(known))}")
  return suffix


def save_figure(fig, path):
  """Saves in figure_format(path) (files.write_atomic: a temporary file and a
  rename, through a symlink, straight into a device or pipe, which matplotlib's
  writers cannot seek); closes the figure."""
  try:
    image = io.BytesIO()
    fig.savefig(image, format=figure_format(path), dpi=100, bbox_inches="tight")
    files.write_atomic(path, image.getvalue())
  finally:
    pyplot().close(fig)


def plot_attention(weights_HxTxS, source_tokens, output_tokens, path, head="all",
                   title=None):
  """Heatmap(s) of attention weights: output tokens down, source tokens across;
  one panel per head ('all'), their mean ('avg') or one head (an int)."""
  weights = np.asarray(weights_HxTxS)
  num_heads, t, s = weights.shape
  if (t, s) != (len(output_tokens), len(source_tokens)):
    raise ValueError(f"weights are {t}x{s} but there are {len(output_tokens)} output "
                     f"and {len(source_tokens)} source tokens")
  head = parse_head(head, num_heads)
  if head == "all":
    panels = [(weights[h], f"head {h}") for h in range(num_heads)]
  elif head == "avg":
    panels = [(weights.mean(0), f"mean of {num_heads} heads")]
  else:
    panels = [(weights[head], f"head {head}")]
  cols = min(len(panels), 4)
  rows = -(-len(panels) // cols)
  size = (max(3.0, 0.35 * s + 1.5), max(2.5, 0.3 * t + 1.5))
  fig, axes = pyplot().subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows),
                                squeeze=False, layout="constrained")
  for i, (ax, (matrix, name)) in enumerate(zip(axes.flat, panels)):
    image = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xticks(range(s), source_tokens, rotation=90, fontsize=8)
    # Output tokens on the first column only: the panels' labels would overlap.
    ax.set_yticks(range(t), output_tokens if i % cols == 0 else [], fontsize=8)
    ax.set_title(name, fontsize=9)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
  if title:
    fig.suptitle(title)
  save_figure(fig, path)


# The positional table's size limit: 2**24 values (128 MiB in float64) is far more
# than a 10,000-pixel image shows, and a typo (--max_len 100000 at d_model 4096)
# would otherwise fill the memory before matplotlib is reached.
MAX_CELLS = 2**24


def plot_positional_encoding(d_model, max_len, path):
  """The sinusoidal table (section 3.5) as an image: position down, dimension across."""
  if d_model < 2 or d_model % 2 or max_len < 1:
    raise ValueError(f"need an even d_model >= 2 and max_len >= 1, got d_model={d_model}, "
                     f"max_len={max_len}")
  if d_model * max_len > MAX_CELLS:
    raise ValueError(f"d_model x max_len = {d_model * max_len:,} values: more than the "
                     f"{MAX_CELLS:,} an image can show; draw fewer positions")
  table = sinusoidal_table(max_len, d_model)
  # At most 100 inches (10,000 pixels) tall: an image's rows then hold several positions.
  fig, ax = pyplot().subplots(figsize=(8, min(100.0, max(3.0, 8 * max_len / d_model))))
  image = ax.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto",
                    interpolation="nearest")
  ax.set_xlabel("dimension i (sin on even, cos on odd)")
  ax.set_ylabel("position")
  ax.set_title(f"Sinusoidal positional encoding, d_model={d_model}")
  fig.colorbar(image, ax=ax)
  save_figure(fig, path)


def main(argv):
  if len(argv) != 2 or argv[1] != "positional":
    raise app.UsageError("usage: python -m transformer.plots positional "
                         "[--d_model 512] [--max_len 100] --out pe.png")
  runtime.quiet_library_logs()
  f = flags.FLAGS
  with runtime.one_line_errors("plots"):  # Its stdout's full disk too.
    files.check_output(f.out, "--out")
    figure_format(f.out)
    plot_positional_encoding(f.d_model, f.max_len, f.out)
    print(f"wrote {f.out}")


if __name__ == "__main__":
  flags.DEFINE_integer("d_model", 512, "Model width (even).")
  flags.DEFINE_integer("max_len", 100, "Positions to draw.")
  flags.DEFINE_string("out", None, "Image file to write (.png; .svg, .pdf and the other "
                      "suffixes matplotlib writes).", required=True)
  runtime.run(main, "plots")
