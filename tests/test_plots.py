"""Tests for transformer/plots.py: recomputed attention weights are the model's,
and the pictures are written as PNG files."""

import math
import os
import re
import stat
import subprocess
import sys

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest

from tests.helpers import random_tokens, tiny_config
from transformer import attention, files, plots
from transformer.model import Transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
  with open(path, "rb") as f:
    assert f.read(8) == PNG_MAGIC
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and min(image.shape[:2]) > 50


@pytest.fixture(scope="module")
def tiny():
  cfg = tiny_config(num_layers=2)
  rng = np.random.default_rng(0)
  inputs = random_tokens(rng, [7, 4], 8)
  targets = random_tokens(rng, [5, 3], 6)
  model = Transformer(cfg)
  # Jitted: an eager init compiles each operation on its own, which is slow.
  params = jax.jit(model.init)(jax.random.key(0), inputs, targets)["params"]
  return model, params, inputs, targets


def test_weights_are_distributions_over_the_real_source(tiny):
  model, params, inputs, targets = tiny
  p = plots.cross_attention_projections(model, params, inputs, targets, layer=0)
  weights = np.asarray(plots.attention_weights(p["query"], p["key"], inputs))
  assert weights.shape == (2, 4, 6, 8)  # [B, H, T, S]
  assert (weights >= 0).all()
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  # Row 1 has 4 real source tokens: padding gets no attention.
  np.testing.assert_array_equal(weights[1, :, :, 4:], 0.0)


def test_weights_reproduce_the_models_cross_attention(tiny):
  # softmax(QK^T/sqrt(d_k)) V through the output projection must give exactly what
  # the model's cross-attention module returned in the same forward pass. Layer -1
  # must be the last one (layer_1).
  model, params, inputs, targets = tiny
  layer = 1
  p = plots.cross_attention_projections(model, params, inputs, targets, -1,
                                        names=("query", "key", "value"))
  weights = plots.attention_weights(p["query"], p["key"], inputs)
  mixed = jnp.einsum("bhts,bshk->bthk", weights, p["value"])
  expected = attention.reference_attention(p["query"], p["key"], p["value"],
                                           attention.padding_mask(jnp.asarray(inputs)))
  np.testing.assert_allclose(mixed, expected, atol=1e-6)

  wanted = ("decoder", f"layer_{layer}", "cross_attention")
  state = jax.jit(lambda p: model.apply(
      {"params": p}, inputs, targets, mutable=["intermediates"],
      capture_intermediates=lambda m, meth: m.path == wanted)[1])(params)
  module_out = state["intermediates"]["decoder"][f"layer_{layer}"]["cross_attention"][
      "__call__"][0]
  out = params["decoder"][f"layer_{layer}"]["cross_attention"]["out"]
  assert "bias" not in out  # W^O is a plain matrix (3.2.2).
  projected = jnp.einsum("bthk,hkd->btd", mixed, out["kernel"])
  np.testing.assert_allclose(projected, module_out, atol=1e-5)
  # And by hand for one entry: the 1/sqrt(d_k) of one head.
  q, k = np.asarray(p["query"]), np.asarray(p["key"])
  scores = q[0, 2, 1] @ k[0, :7, 1].T / math.sqrt(q.shape[-1])
  np.testing.assert_allclose(weights[0, 1, 2, :7], np.exp(scores) / np.exp(scores).sum(),
                             rtol=1e-5)


@pytest.mark.parametrize("score", ["additive", "general"])
def test_sentence_weights_follow_the_attention_score(score):
  # The weights drawn for a model with another score, through V and W^O, give
  # what its cross-attention module returned, in each layer (each with its own
  # score parameters).
  model = Transformer(tiny_config(num_layers=2, attention_score=score))
  inputs, targets = np.asarray([[5, 6, 7, 8]]), np.asarray([[9, 10, 11]])
  params = model.init(jax.random.key(0), inputs, targets)["params"]
  for layer in (0, 1):
    weights_HxTxS = plots.cross_attention_weights(model, params, inputs[0], targets[0], layer)
    wanted = ("decoder", f"layer_{layer}", "cross_attention")
    state = jax.jit(lambda p, wanted=wanted: model.apply(
        {"params": p}, inputs, targets, mutable=["intermediates"],
        capture_intermediates=lambda m, _: m.path in (wanted, wanted + ("value",)))[1])(params)
    found = state["intermediates"]["decoder"][f"layer_{layer}"]["cross_attention"]
    mixed = jnp.einsum("hts,shk->thk", weights_HxTxS, found["value"]["__call__"][0][0])
    out = params["decoder"][f"layer_{layer}"]["cross_attention"]["out"]["kernel"]
    np.testing.assert_allclose(jnp.einsum("thk,hkd->td", mixed, out),
                               found["__call__"][0][0], atol=1e-5)


def test_single_sentence_weights_and_bad_layer(tiny):
  model, params, inputs, targets = tiny
  w = plots.cross_attention_weights(model, params, inputs[1, :4], targets[1, :3])
  assert w.shape == (4, 3, 4)
  with pytest.raises(ValueError, match="layer 2 out of range"):
    plots.cross_attention_weights(model, params, inputs[1, :4], targets[1, :3], layer=2)


@pytest.mark.parametrize("head", ["all", "avg", "1"])
def test_attention_plot_is_a_png(tmp_path, head):
  weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(4, 3))
  path = str(tmp_path / "attention.png")
  plots.plot_attention(weights, list("abcde"), ["x", "y", "</s>"], path, head=head)
  assert_png(path)
  assert os.listdir(tmp_path) == ["attention.png"]  # No temporary file left.


@pytest.mark.parametrize("head,panels", [("all", [0, 1, 2, 3]), ("avg", ["mean"]), ("1", [1])])
def test_attention_plot_draws_each_heads_weights_output_down_source_across(
    monkeypatch, head, panels):
  """What the figure holds, not only that a PNG is written: each panel is its
  head's [output, source] matrix (or their mean), the source tokens across and
  the output tokens down."""
  weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(4, 3))
  drawn = []
  monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
  plots.plot_attention(weights, list("abcde"), ["x", "y", "</s>"], "unused.png", head=head)
  axes = [ax for ax in drawn[0].axes if ax.images]
  assert len(axes) == len(panels)
  for ax, panel in zip(axes, panels):
    want = weights.mean(0) if panel == "mean" else weights[panel]
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), want)
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
  assert [t.get_text() for t in axes[0].get_yticklabels()] == ["x", "y", "</s>"]


def test_bad_head_and_shape_are_named():
  weights = np.full((2, 1, 2), 0.5)
  with pytest.raises(ValueError, match="head 2 out of range"):
    plots.plot_attention(weights, ["a", "b"], ["x"], "unused.png", head="2")
  with pytest.raises(ValueError, match="head must be"):
    plots.plot_attention(weights, ["a", "b"], ["x"], "unused.png", head="max")
  with pytest.raises(ValueError, match="2 source tokens"):
    plots.plot_attention(weights[:, :, :1], ["a", "b"], ["x"], "unused.png")


def test_positional_command_writes_png(tmp_path):
  out = str(tmp_path / "pe.png")
  result = subprocess.run(
      [sys.executable, "-m", "transformer.plots", "positional", "--d_model", "16",
       "--max_len", "10", "--out", out], cwd=ROOT, capture_output=True, text=True,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=120)
  assert result.returncode == 0, result.stderr
  assert_png(out)
  with open("/dev/full", "w") as full:  # Its stdout's full disk was a traceback, status 120.
    result = subprocess.run(
        [sys.executable, "-m", "transformer.plots", "positional", "--d_model", "16",
         "--max_len", "10", "--out", out], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=120)
  assert result.returncode == 1 and re.fullmatch(
      r"plots: error: \[Errno 28\] No space left on device: '<stdout>'\n",
      result.stderr), result.stderr
  assert_png(out)
  with pytest.raises(ValueError, match="even d_model"):
    plots.plot_positional_encoding(15, 10, out)
  missing = str(tmp_path / "none" / "pe.png")
  result = subprocess.run(
      [sys.executable, "-m", "transformer.plots", "positional", "--out", missing], cwd=ROOT,
      capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
      timeout=120)
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"plots: error: --out {missing!r}: its folder "
      f"{os.path.dirname(missing)!r} does not exist")


def test_positional_command_names_a_directory_out_and_an_oversized_table(tmp_path):
  """--out naming a folder was refused with the temporary file's path; a table of
  4096 x 100,000 values filled 24 GB before matplotlib was reached."""
  result = subprocess.run(
      [sys.executable, "-m", "transformer.plots", "positional", "--out", str(tmp_path)],
      cwd=ROOT, capture_output=True, text=True,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=120)
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"plots: error: --out {str(tmp_path)!r}: is a directory; give a file name")
  assert os.listdir(tmp_path) == []
  # An empty --out or one ending in '/' passed the check (abspath made them the
  # current folder and the folder itself) and failed at the rename, naming a
  # temporary file.
  with pytest.raises(ValueError, match=r"^--out is empty; give a file name$"):
    files.check_output("", "--out")
  with pytest.raises(ValueError, match=r"^--out '.*none/': ends in '/', a folder; give a file"):
    files.check_output(str(tmp_path / "none") + "/", "--out")
  with pytest.raises(ValueError, match="d_model x max_len = 409,600,000 values"):
    plots.plot_positional_encoding(4096, 100_000, str(tmp_path / "pe.png"))
  assert os.listdir(tmp_path) == []


def test_a_plot_written_to_a_link_or_a_pipe_goes_through_it(tmp_path):
  """plots and translate --plot_attention renamed their PNG over the path: a
  symlink became a file (its target untouched), a device or pipe a file too."""
  import threading  # pylint: disable=g-import-not-at-top
  target = tmp_path / "real.png"
  target.write_text("keep")
  link = tmp_path / "link.png"
  link.symlink_to(target)
  fig = plots.pyplot().figure()
  plots.save_figure(fig, str(link))
  assert link.is_symlink() and target.read_bytes().startswith(b"\x89PNG")
  pipe = tmp_path / "pipe"
  os.mkfifo(pipe)
  got = []
  reader = threading.Thread(target=lambda: got.append(open(pipe, "rb").read()))
  reader.start()
  plots.save_figure(plots.pyplot().figure(), str(pipe))
  reader.join(timeout=30)
  assert got and got[0].startswith(b"\x89PNG") and stat.S_ISFIFO(os.stat(pipe).st_mode)


def test_the_image_format_follows_the_suffix_and_an_unknown_one_is_refused(tmp_path):
  """--out pe.svg was written as PNG bytes under an .svg name."""
  from transformer import translate  # pylint: disable=g-import-not-at-top
  svg = tmp_path / "pe.svg"
  plots.plot_positional_encoding(8, 4, str(svg))
  assert svg.read_bytes().startswith(b"<?xml")
  assert plots.figure_format(str(tmp_path / "no_suffix")) == "png"
  with pytest.raises(ValueError, match=r"--out '.*pe\.xyz': matplotlib writes no \.xyz files; "
                     r"use one of .*\.png"):
    plots.figure_format(str(tmp_path / "pe.xyz"))
  source = tmp_path / "in.txt"
  source.write_text("walk\n")
  with pytest.raises(ValueError, match=r"--plot_attention '.*att\.xyz': matplotlib writes no"):
    translate.check_paths(str(source), "-", str(tmp_path / "att.xyz"))
