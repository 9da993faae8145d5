"""benchmarks/table1.py in its smoke mode: the four layer types timed, and their
measured path lengths equal to what each layer's structure gives.

No timing is asserted beyond finite and positive.
"""
import contextlib
import io
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import table1
from transformer import attention

N, K, R = 16, 3, 3  # The smoke run's path length n; r = 3 leaves a partial last block.


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("table1")
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    table1.main(["--smoke", "--r", str(R), "--json", str(out / "t.json"),
                 "--plot", str(out / "t.png")])
  return json.loads((out / "t.json").read_text()), printed.getvalue(), out / "t.png"


def test_every_layer_type_is_timed_at_every_length(smoke):
  results, table, plot = smoke
  names = list(table1.PAPER)
  assert len(names) == 4
  for name in names:
    assert f"| {name} |" in table, name
    for n in (16, 32):
      [row] = [t for t in results["times"] if t["layer"] == name and t["n"] == n and t["d"] == 32]
      for key in ("forward_s", "forward_backward_s"):
        assert math.isfinite(row[key]) and row[key] > 0, (name, n, key, row[key])
  assert results["meta"]["device"] and "cpu_model" in results["meta"]
  assert plot.stat().st_size > 0


def test_measured_path_lengths_follow_each_layers_structure(smoke):
  results, table, _ = smoke
  paths = results["paths"][str(N)]
  assert paths["self-attention"] == {"layers": 1}
  assert paths["recurrent"] == {"layers": 1, "steps": N - 1}
  assert paths["convolutional"]["layers"] == math.ceil((N - 1) / (K - 1)) == 8
  assert paths["restricted self-attention"]["layers"] == math.ceil((N - 1) / R) == 5
  assert "| 5 layers |" in table and "1 layer, 15 steps" in table


@pytest.mark.parametrize("n,r", [(10, 3), (5, 8)])  # A partial last block; r > n.
def test_blocked_local_attention_is_the_band_masked_dense_one(n, r):
  q, k, v = jax.random.normal(jax.random.key(0), (3, 2, n, 2, 4))
  band = jnp.abs(jnp.arange(n)[:, None] - jnp.arange(n)[None, :]) <= r
  local, banded, dense = jax.jit(lambda q, k, v: (
      table1.local_attention(q, k, v, r),
      attention.reference_attention(q, k, v, band[None, None]),
      attention.reference_attention(q, k, v, None)))(q, k, v)
  np.testing.assert_allclose(local, banded, rtol=1e-5, atol=1e-6)
  # Where the band leaves keys out, it matters: the unmasked result differs.
  assert np.allclose(local, dense) == (r >= n - 1)


@pytest.mark.parametrize("argv,message", [
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--lengths", "16,0"], "--lengths must be at least 1, got 0"),
    (["--dims", "0"], "--dims must be at least 1, got 0"),
    (["--batch", "0"], "--batch must be at least 1, got 0"),
    (["--k", "1"], "--k must be at least 2, got 1"),
    (["--r", "0"], "--r must be at least 1, got 0"),
    (["--r", "-2"], "--r must be at least 1, got -2"),
    (["--path_lengths", "1"], "--path_lengths must be at least 2, got 1"),
    (["--json", "/nonexistent/t.json"],
     "--json '/nonexistent/t.json': its folder '/nonexistent' does not exist"),
    (["--plot", "/nonexistent/t.png"],
     "--plot '/nonexistent/t.png': its folder '/nonexistent' does not exist"),
])
def test_bad_flags_are_refused_by_name_before_any_measurement(argv, message, capsys, monkeypatch):
  monkeypatch.setattr(table1, "measured_paths", _no_work)
  monkeypatch.setattr(table1, "time_layer", _no_work)
  with pytest.raises(SystemExit) as stopped:
    table1.main(argv)
  assert stopped.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(f": error: {message}")


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_an_output_path_that_is_a_directory_is_refused_before_any_measurement(
    flag, tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(table1, "measured_paths", _no_work)
  monkeypatch.setattr(table1, "time_layer", _no_work)
  with pytest.raises(SystemExit):
    table1.main(["--smoke", flag, str(tmp_path)])
  assert capsys.readouterr().err.splitlines()[-1].endswith(
      f": error: {flag} {str(tmp_path)!r}: is a directory; give a file name")


def _no_work(*args, **kwargs):
  raise AssertionError("measured despite a bad flag")
