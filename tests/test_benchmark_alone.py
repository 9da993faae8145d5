"""benchmarks.alone: each side of a comparison timed in fresh processes of its
own, in alternation, on the same data. Smoke size; no timing is asserted. Without
the peer's packages (requirements-bench.txt), ours runs alone.
"""

import json
import os
import re
import statistics
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import alone, common
from tests.test_benchmark import HAS_MARIAN, HAS_TORCH, ROOT
from transformer import runtime


def _alone(tmp_path, *flags, rounds=2):
  """(benchmarks.alone's JSON results of smoke, its stdout) for `flags`."""
  out = tmp_path / "alone.json"
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.alone", "--sizes", "smoke", "--rounds", str(rounds),
       "--json", str(out), *flags], cwd=ROOT, capture_output=True, text=True,
      timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(out.read_text())["sizes"]["smoke"], result.stdout


@pytest.mark.parametrize("kind", ["train", "decode"])
def test_alone_runs_each_side_in_a_process_of_its_own_in_alternation(kind, tmp_path):
  """benchmarks.alone: each side's timed steps (training, against PyTorch) or
  decoding runs (--decode, against Marian) in a fresh process, the rounds in
  ABBA order; without the peer's packages, ours alone."""
  if kind == "train":
    res, stdout = _alone(tmp_path, "--pack", "--steps", "2", "--tokens_per_batch", "192")
    peer, has_peer, figures = "pytorch", HAS_TORCH, ["target_tokens_per_s"]
  else:
    res, stdout = _alone(tmp_path, "--decode", "--decode_repeats", "2")
    peer, has_peer, figures = "marian", HAS_MARIAN, ["greedy sentences/s", "beam4 sentences/s"]
  order = re.findall(r"smoke round (\d) (\w+):", stdout)
  sides = ["ours", peer] if has_peer else ["ours"]
  assert order == [("1", s) for s in sides] + [("2", s) for s in sides[::-1]]
  for side in sides:
    runs = res["runs"][side]
    assert len(runs) == 2
    assert all(r[k] > 0 for r in runs for k in figures)
    if kind == "train":
      assert all(len(r["step_s_all"]) == 2 and r["tokens_per_batch"] == 192 for r in runs)
    else:  # Each figure the median of its runs' sentences/s.
      assert all(len(r["greedy s all"]) == 2 and len(r["beam4 s all"]) == 2 for r in runs)
    for k in figures:
      assert res["medians"][side][k] == pytest.approx(statistics.median(r[k] for r in runs))
  # Each side under its own allocator: ours the commands' (huge pages here, or
  # tcmalloc where installed), the peer glibc's default.
  if (sys.platform.startswith("linux") and not runtime.accelerator_expected()
      and not os.environ.get("TRANSFORMER_DEFAULT_MALLOC")):
    commands = runtime.fast_malloc_env({})
    assert all(commands["GLIBC_TUNABLES"] in r["allocator"] for r in res["runs"]["ours"])
  if has_peer:
    assert all(r["allocator"] == "glibc malloc, default settings" for r in res["runs"][peer])
    for k in figures:
      assert res[f"ours/{peer}"][k] == pytest.approx(
          res["medians"]["ours"][k] / res["medians"][peer][k])
    assert "each alone, medians of 2 runs" in stdout
  else:
    assert "ours alone" in stdout


@pytest.mark.parametrize("kind", ["train", "decode"])
def test_alone_gives_every_side_process_the_same_text_data(kind, tmp_path):
  """--data_dir: each side's process (one round: ours, and the peer where
  installed) reads the text folder and trains its own SentencePiece model on
  it; each trains on (or decodes) the same ids, the text's as this process
  tokenizes it, not the synthetic ones."""
  rng = np.random.default_rng(0)
  words = ["".join(rng.choice(list("abcdefgh"), rng.integers(2, 6))) for _ in range(40)]
  data = tmp_path / "text"
  data.mkdir()
  for lang in ("en", "de"):
    (data / f"train.{lang}").write_text("\n".join(
        " ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(300)) + "\n")
  flags = ["--pack", "--steps", "1"] if kind == "train" else ["--decode", "--decode_repeats", "1"]
  res, _ = _alone(tmp_path, *flags, "--data_dir", str(data), rounds=1)
  digests = {r["data_sha1"] for runs in res["runs"].values() for r in runs}
  has_peer = HAS_TORCH if kind == "train" else HAS_MARIAN
  assert len(digests) == 1 and len(res["runs"]) == (2 if has_peer else 1)
  smoke = common.SIZES["smoke"]
  for examples, same in ((common.multi30k_examples(smoke, str(data)), True),
                         (common.synthetic_examples(smoke), False)):
    expected = (common.data_sha1(a for pair in examples for a in pair) if kind == "train"
                else common.data_sha1(common.decode_batch(smoke, examples, 50)[0]))
    assert (expected in digests) == same
  assert json.loads((tmp_path / "alone.json").read_text())["meta"]["data"] == str(data)


def test_alone_runs_the_peer_under_its_users_allocator_unless_told():
  """PyTorch's base step ran 1.19x faster under glibc's default malloc than
  under the huge pages our commands use: the peer gets its users' allocator."""
  environ = {"PATH": "/bin"}
  assert alone.side_env("ours", "default", environ) == environ
  assert alone.side_env("pytorch", "default", environ) == {
      "PATH": "/bin", "TRANSFORMER_DEFAULT_MALLOC": "1"}
  assert alone.side_env("marian", "commands", environ) == environ


def test_alone_refuses_flags_of_the_other_kind(capsys):
  for argv, message in ((["--decode", "--pack"], "--pack is for training runs"),
                        (["--decode", "--tokens_per_batch", "9"],
                         "--tokens_per_batch is for training runs"),
                        (["--decode_repeats", "2"], "--decode_repeats is for --decode runs")):
    with pytest.raises(SystemExit):
      alone.main(["--sizes", "smoke", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (requirements-bench.txt)")
def test_the_peer_s_process_never_starts_jax_s_client():
  """PyTorch's process leaves JAX's client unstarted: on a GPU a started one holds
  75% of the memory, and PyTorch ran out of it at base, 100k tokens (benchmarks/
  README.md, 'Session 42'). Its decoder inputs are ours' shift_right all the same."""
  script = (
      "import dataclasses, json\n"
      "from jax._src import xla_bridge\n"
      "from benchmarks import alone, common\n"
      "figures = alone.train_side('pytorch', dataclasses.replace(common.SIZES['smoke'], "
      "train_steps=1), pack=False)\n"
      "print(json.dumps([xla_bridge.backends_are_initialized(), "
      "figures['target_tokens_per_s'] > 0]))\n")
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        cwd=ROOT, check=True, timeout=300)
  assert json.loads(done.stdout.splitlines()[-1]) == [False, True]
  from benchmarks import torch_bench  # pylint: disable=g-import-not-at-top
  from transformer.data.tokenizer import BOS_ID  # pylint: disable=g-import-not-at-top
  from transformer.model import shift_right  # pylint: disable=g-import-not-at-top
  size = common.SIZES["smoke"]
  batch = common.timed_batches(size, common.synthetic_examples(size, count=200), 1)[0]
  _, decoder_inputs, targets = torch_bench._tensors(batch)  # pylint: disable=protected-access
  np.testing.assert_array_equal(decoder_inputs.cpu().numpy(),
                                np.asarray(shift_right(batch["targets"], BOS_ID)))
  np.testing.assert_array_equal(targets.cpu().numpy(), batch["targets"])
