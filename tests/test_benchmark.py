"""The benchmark's smoke mode: every figure is in the table and the JSON, and finite.

No timing is asserted. The PyTorch half needs torch (requirements-bench.txt),
the Marian decoding peer torch and transformers; without them the run covers
our half and only their checks are skipped.
"""
import contextlib
import dataclasses
import importlib.util
import io
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import allocators, common, report, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MARIAN = HAS_TORCH and importlib.util.find_spec("transformers") is not None
needs_marian = pytest.mark.skipif(not HAS_MARIAN,
                                  reason="torch or transformers not installed (requirements-bench.txt)")

OURS = [
    "data padding (target) %", "data padding (source+target) %", "data shapes per epoch",
    "train compile s (first shape)", "train compile s (all shapes)",
    "train compiled shapes after warm-up", "train recompiles after warm-up",
    "train step s (median)", "train target tokens/s", "train source+target tokens/s",
    "train GFLOP per step", "train GFLOP/s", "train MFU (padded) %",
    "train MFU (real tokens) %", "train page faults per step",
    "greedy compile s", "greedy sentences/s", "greedy tokens/s",
    "beam4 compile s", "beam4 sentences/s", "beam4 tokens/s",
]
PYTORCH = [
    "train step s (median)", "train target tokens/s", "train source+target tokens/s",
    "train GFLOP/s", "train MFU (padded) %", "train page faults per step",
    "greedy sentences/s", "greedy tokens/s",
]
MARIAN = ["greedy sentences/s", "greedy tokens/s", "beam4 sentences/s", "beam4 tokens/s"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench") / "bench.json"
  argv = (["--smoke", "--json", str(out)] + ([] if HAS_TORCH else ["--no_torch"])
          + ([] if HAS_MARIAN else ["--no_marian"]))
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    run.main(argv)
  return json.loads(out.read_text()), printed.getvalue()


def _check(figures, keys, table):
  for key in keys:
    assert key in figures, key
    assert math.isfinite(figures[key]) and figures[key] >= 0, (key, figures[key])
    assert f"smoke: {key}" in table, key


def test_our_half(smoke):
  results, table = smoke
  ours = results["sizes"]["smoke"]["ours"]
  _check(ours, OURS, table)
  assert ours["train target tokens/s"] > 0 and ours["greedy tokens/s"] > 0
  assert ours["train recompiles after warm-up"] == 0
  assert ours["train compiled shapes after warm-up"] >= 1
  assert 0 <= ours["data padding (target) %"] < 100
  assert results["matmul_peak_gflops"]["ours"] > 0
  # MFU on real tokens: the timed batches' own padding, not the epoch's.
  assert ours["train MFU (real tokens) %"] == pytest.approx(
      ours["train MFU (padded) %"] * (1 - ours["train padding (source+target) %"] / 100))
  for malloc in ("default malloc", "hugetlb=1"):
    probe = results["malloc"][malloc]
    assert math.isfinite(probe["step_s_median"]) and probe["step_s_median"] > 0
    assert probe["page_faults_per_step"] >= 0
    assert math.isfinite(probe["paused_step_s_median"]) and probe["paused_step_s_median"] > 0
  assert "hugetlb" in table
  # Where a peer shares the process, the table says its ratios are skewed.
  assert ("python -m benchmarks.alone runs each side in its own" in table) == HAS_TORCH


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (requirements-bench.txt)")
def test_pytorch_half(smoke):
  results, table = smoke
  res = results["sizes"]["smoke"]
  _check(res["pytorch"], PYTORCH, table)
  assert results["matmul_peak_gflops"]["pytorch"] > 0
  assert any(line.startswith("target [smoke] training") for line in results["targets"])
  # Same batches on both sides: the analytic FLOPs per step agree.
  assert res["pytorch"]["train GFLOP per step"] == res["ours"]["train GFLOP per step"]


@needs_marian
def test_marian_peer_decodes_every_row_to_the_forced_length(smoke):
  results, table = smoke
  res = results["sizes"]["smoke"]
  _check(res["marian"], MARIAN, table)
  assert all(res["marian"][key] > 0 for key in MARIAN)
  assert "ours/Marian" in table
  for key in MARIAN:  # Marian's value and ours/Marian in the row, past ours and PyTorch's.
    row = next(line for line in table.splitlines() if line.startswith(f"smoke: {key} "))
    assert row.split()[-2:] != ["-", "-"], row
  # generate() ran the batch to its longest row limit, as our search does: no row stopped early.
  assert res["marian"]["greedy steps run"] == res["marian"]["beam4 steps run"] == max(
      res["decode_limits"])
  assert res["ours"]["decode sentences x steps"].endswith(f" x {max(res['decode_limits'])}")
  assert results["meta"]["transformers"]
  for mode in ("greedy", "beam-4"):
    assert any(line.startswith(f"target [smoke] {mode} decoding sentences/s >= 2x Marian")
               for line in results["targets"])


@needs_marian
def test_marian_cached_greedy_equals_uncached():
  """The peer's KV cache is a pure speed-up: the same ids as re-running the whole prefix."""
  import torch  # pylint: disable=g-import-not-at-top
  from benchmarks import marian_bench  # pylint: disable=g-import-not-at-top
  size = common.SIZES["smoke"]
  model = marian_bench.build(size, max_len=64)
  assert model.lm_head.weight is model.model.shared.weight  # Tied, as ours.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)  # Tiny ops: other load on the cores costs threads most.
  try:
    src = torch.from_numpy(np.array([[5, 6, 7, 8, 3, 0], [9, 10, 11, 12, 13, 3]], np.int64))
    cached = marian_bench.generate(model, src, 12, use_cache=True)
    uncached = marian_bench.generate(model, src, 12, use_cache=False)
  finally:
    torch.set_num_threads(threads)
  assert cached.shape == (2, 13) and marian_bench.steps_run(cached) == 12
  assert torch.equal(cached, uncached)


def test_bfloat16_packed_smoke_runs_both_sides_in_bfloat16_ours_packed(tmp_path):
  """--dtype bfloat16 --pack --epoch_mix (one run for all, to keep the suite
  short): both sides compute in bfloat16; ours trains on packed rows, PyTorch on
  bucketed ones, and each side's padding and MFU come from its own batches; each
  side times every shape of its epoch, and its epoch tokens/s is the epoch's
  real target tokens over those step times weighted by the shapes' batch counts.
  --tokens_per_batch sets both sides' batch size."""
  out = tmp_path / "bench.json"
  argv = (["--smoke", "--dtype", "bfloat16", "--pack", "--epoch_mix", "--malloc", "skip",
           "--tokens_per_batch", "128", "--json", str(out)]
          + ([] if HAS_TORCH else ["--no_torch"]) + ([] if HAS_MARIAN else ["--no_marian"]))
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    run.main(argv)
  results = json.loads(out.read_text())
  assert results["meta"]["sizes"]["smoke"]["dtype"] == "bfloat16"
  assert results["meta"]["batching"] == {"ours": "pack", "pytorch": "bucket"}
  res = results["sizes"]["smoke"]
  size = dataclasses.replace(common.SIZES["smoke"], tokens_per_batch=128)
  bucketed = common.epoch_stats(size, common.synthetic_examples(size), "bucket")
  assert res["ours"]["data shapes per epoch"] == 1  # Rows of max_length slots.
  assert res["ours"]["data padding (target) %"] < 100 * bucketed["padding_target"]
  assert {tuple(s) for s in res["batch_shapes"]["ours"]} == {(8, 16)}  # 128 slots.
  assert all(b * t <= 128 for b, t in res["batch_shapes"]["pytorch"])
  if HAS_TORCH:
    assert res["pytorch"]["data padding (target) %"] == pytest.approx(
        100 * bucketed["padding_target"])
  _check(res["ours"], ["train target tokens/s", "greedy tokens/s"], printed.getvalue())
  if HAS_TORCH:
    _check(res["pytorch"], ["train target tokens/s", "greedy tokens/s"], printed.getvalue())
  if HAS_MARIAN:  # generate() under torch.autocast to bfloat16.
    _check(res["marian"], ["greedy tokens/s", "beam4 tokens/s"], printed.getvalue())
  examples = common.synthetic_examples(size)
  for side, batching in (("ours", "pack"), ("pytorch", "bucket"))[:1 + HAS_TORCH]:
    stats = common.epoch_stats(size, examples, batching)
    times = res["epoch_mix_step_s"][side]
    assert set(times) == {"x".join(map(str, shape)) for shape in stats["full_shape_counts"]}
    assert {len(ts) for ts in times.values()} == {run.MIX_ROUNDS}  # Each side alike.
    assert res[side]["train shapes timed (epoch mix)"] == len(times)
    epoch_s = sum(n * float(np.median(times["x".join(map(str, shape))]))
                  for shape, n in stats["full_shape_counts"].items())
    assert res[side]["train target tokens/s (epoch mix)"] == pytest.approx(
        stats["full_real_target"] / epoch_s)
    _check(res[side], ["train target tokens/s (epoch mix)"], printed.getvalue())
  if HAS_TORCH:
    assert len(res["epoch_mix_step_s"]["pytorch"]) == len(bucketed["full_shape_counts"]) > 1
    assert "training target tokens/s over an epoch's shapes >= 1.25x PyTorch" in (
        printed.getvalue())


def test_timed_batches_are_full_ones_not_a_bucket_s_last_topped_up_with_pad_rows(capsys):
  """At 25k tokens the first four bucketed batches of 20,000 synthetic
  sentences held one 96% padding (the GPU runs of sessions 25-33 timed PyTorch
  on it); the timed batches are the epoch's full ones, and the default corpus
  grows with the batch."""
  size = dataclasses.replace(common.SIZES["base"], tokens_per_batch=25000)
  for examples in (common.synthetic_examples(size, count=20000),
                   common.synthetic_examples(size)):
    for batching in ("bucket", "pack"):
      batches = common.timed_batches(size, examples, 4, batching=batching)
      assert len(batches) == 4 and not any(map(common.topped_up, batches)), batching
  assert len(common.synthetic_examples(size)) == 100000
  assert len(common.synthetic_examples(common.SIZES["base"])) == 20000  # 4,096 tokens.
  # A corpus with too few full batches: topped-up ones make up the count.
  few = common.synthetic_examples(size, count=3000)
  batches = common.timed_batches(size, few, 6)
  assert len(batches) == 6 and any(map(common.topped_up, batches))
  assert "an epoch of 3000 examples has" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (requirements-bench.txt)")
def test_pytorch_warms_up_on_every_batch_shape_as_ours_compiles_each(monkeypatch):
  from benchmarks import torch_bench  # pylint: disable=g-import-not-at-top
  size = common.SIZES["small"]  # Its first 10 batches have 3 shapes; no step runs here.
  batches = common.timed_batches(size, common.synthetic_examples(size), 10)
  shapes = {(b["inputs"].shape, b["targets"].shape) for b in batches}
  assert len(shapes) > 1
  trainer = torch_bench.Trainer(size, batches)
  ran = []
  monkeypatch.setattr(trainer, "_run", ran.append)
  trainer.warm_up()
  assert [(batches[i]["inputs"].shape, batches[i]["targets"].shape) for i in ran] == list(
      dict.fromkeys((b["inputs"].shape, b["targets"].shape) for b in batches))


def test_profile_interleaves_a_variant_over_the_baseline_s_dtype_batch_and_packing():
  """benchmarks.profile with the flags of the GPU check (benchmarks/gpu_check.sh):
  a packed bfloat16 baseline of --tokens_per_batch slots against reference attention."""
  from benchmarks import profile  # pylint: disable=g-import-not-at-top
  results = profile.main(["--size", "smoke", "--dtype", "bfloat16", "--tokens_per_batch", "128",
                          "--pack", "--variants", "reference_attn", "--interleave",
                          "--steps", "1"])
  assert results["size"]["dtype"] == "bfloat16" and results["size"]["tokens_per_batch"] == 128
  assert results["batch_shape"] == [8, 16]  # Packed rows of max_length 16, 128 slots.
  assert set(results["interleaved"]) == {"baseline", "reference_attn"}
  for r in results["interleaved"].values():
    assert r["step"] > 0 and r["target_tokens_per_s"] > 0


def test_profile_traces_the_cpu_s_thunks():
  """--trace on a CPU: XLA's thunks on the client's threads, grouped by kind."""
  from benchmarks import profile  # pylint: disable=g-import-not-at-top
  results = profile.main(["--size", "smoke", "--variants", "none", "--trace", "--steps", "1"])
  assert results["busy"] is None and results["top_ops"] and results["top_kinds"]
  assert all(ms > 0 for _, ms, _ in results["top_ops"])
  assert {n.split(".")[0] for n, _, _ in results["top_ops"]} <= {
      n for n, _, _ in results["top_kinds"]}


def test_profile_reads_a_gpu_s_kernels_from_its_streams_by_kind():
  """On a GPU the kernels on the device's stream lines count (not the host's threads
  or the device's per-op summary lines), named by kind, with the share of the span
  the device was busy. Kernel names from a trace on an H200 (benchmarks/README.md,
  'Session 42')."""
  from types import SimpleNamespace as NS  # pylint: disable=g-import-not-at-top
  from benchmarks import profile  # pylint: disable=g-import-not-at-top
  names = {
      "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_"
      "cga1x1x1_kernel0_0": "attention (cuDNN)",
      "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*)":
          "attention (cuDNN)",
      "nvjet_sm90_tss_128x128_64x6_1x2_h_bz_NTT": "matmul",
      "gemm_fusion_dot_101": "matmul",
      "input_reduce_fusion_27": "reduction",
      "loop_xor_fusion_1": "random bits",
      "memcpy32_post": "copy",
      "loop_convert_fusion_1": "elementwise fusion",
  }
  kernels = [NS(name=n, start_ns=1000 * i, duration_ns=500) for i, n in enumerate(names)]
  planes = [NS(name="/host:CPU", lines=[NS(name="PjRtCpuClient", events=[
                NS(name="host_only", start_ns=0, duration_ns=10 ** 9)])]),
            NS(name="/device:GPU:0", lines=[
                NS(name="XLA Ops", events=[NS(name="fusion.1", start_ns=0, duration_ns=10 ** 9)]),
                NS(name="Stream #14(Compute,Memset)", events=kernels)])]
  total, kinds, busy = profile.op_times(planes, steps=2)
  assert set(total) == set(names) and all(ms == 500 / 1e6 / 2 for ms in total.values())
  assert {k: round(v * 4e3) for k, v in kinds.items()} == {
      "attention (cuDNN)": 2, "matmul": 2, "reduction": 1, "random bits": 1, "copy": 1,
      "elementwise fusion": 1}
  assert busy == pytest.approx(8 * 500 / (7 * 1000 + 500))  # 8 kernels over 7.5 us.


@pytest.mark.parametrize("argv,message", [
    (["--size", "bogus"], "argument --size: invalid choice: 'bogus'"),
    (["--variants", "rbg,dropuot=0"], "--variants: no variant 'dropuot=0' (variants: "
     "dropout=0, rbg, reference_attn, xla_attn, bfloat16, pack; or all, or none)"),
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--tokens_per_batch", "0"], "--tokens_per_batch must be at least 1, got 0"),
    (["--json", "/nonexistent/p.json"],
     "--json '/nonexistent/p.json': its folder '/nonexistent' does not exist"),
    (["--json", "."], "--json '.': is a directory; give a file name"),
])
def test_profile_refuses_a_bad_flag_by_name_before_any_work(argv, message, capsys, monkeypatch):
  """A misspelt variant re-timed the baseline under its name, --tokens_per_batch 0
  stood for the default, and a bad --json path failed after the timing."""
  from benchmarks import profile  # pylint: disable=g-import-not-at-top

  def no_work(*args, **kwargs):
    raise AssertionError("work started despite a bad flag")
  monkeypatch.setattr(common, "synthetic_examples", no_work)
  with pytest.raises(SystemExit) as stopped:
    profile.main(["--size", "smoke"] + argv)
  assert stopped.value.code == 2
  err = capsys.readouterr().err.splitlines()[-1]
  assert err.partition(": error: ")[2].startswith(message), err


def test_config_sizes_are_the_paper_model_s_or_refused():
  """--config runs configs/base.py's model at a config's sizes: a config that also
  sets other model fields (the RNN) would be benchmarked as something else."""
  size = common.size_from_config("configs/multi30k.py:de-en")
  assert (size.name, size.num_layers, size.d_model, size.num_heads) == ("multi30k_de-en", 3, 256, 4)
  with pytest.raises(ValueError, match=r"also sets model.architecture='rnn'"):
    common.size_from_config("configs/rnn_scan.py")


def test_timed_batches_padding_counts_both_sides():
  batch = {"inputs": np.array([[5, 6, 0, 0]]), "targets": np.array([[5, 0]])}
  figures = common.summarize(common.SIZES["smoke"], [batch], [1.0], [1.0], [1.0], 0)
  assert figures["padding_source_target"] == pytest.approx(1 - 3 / 6)


def test_mfu_is_against_the_best_product_of_either_framework():
  """MFU was against our own product alone, 1.25x slower than PyTorch's on an
  H200: both sides' MFU came out high by as much."""
  side = lambda gflops: {"train GFLOP/s": gflops, "train padding (source+target) %": 20.0}
  results = {"sizes": {"base": {"ours": side(300.0), "pytorch": side(200.0), "marian": {}}}}
  report.set_mfu(results, {"ours": [800e9, 900e9], "pytorch": [1000e9]})
  assert results["matmul_peak_used"] == {"gflops": 1000.0, "of": "pytorch"}
  res = results["sizes"]["base"]
  assert res["ours"]["train MFU (padded) %"] == pytest.approx(30.0)
  assert res["pytorch"]["train MFU (padded) %"] == pytest.approx(20.0)
  assert res["ours"]["train MFU (real tokens) %"] == pytest.approx(24.0)
  report.set_mfu(results, {"ours": [1200e9], "pytorch": []})  # PyTorch not run.
  assert results["matmul_peak_used"]["of"] == "ours"
  assert res["ours"]["train MFU (padded) %"] == pytest.approx(25.0)


def test_the_epoch_mix_counts_full_batches_only():
  """An epoch's topped-up batches (one per bucket) counted in the epoch mix
  charged the bucketed side ~4% more than a long corpus costs it."""
  size = dataclasses.replace(common.SIZES["base"], tokens_per_batch=25000)
  stats = common.epoch_stats(size, common.synthetic_examples(size, count=20000), "bucket")
  short = stats["batches"] - sum(stats["full_shape_counts"].values())
  assert short >= len(stats["full_shape_counts"]) > 1  # A bucket ends in one.
  assert stats["full_real_target"] < stats["real_target"]
  assert set(stats["first_of_shape"]) == set(stats["full_shape_counts"])
  assert not any(map(common.topped_up, stats["first_of_shape"].values()))


def test_epoch_tokens_per_s_weights_each_shape_by_its_batches():
  stats = {"full_real_target": 900, "full_shape_counts": {(8, 16): 3, (4, 32): 1}}
  assert common.epoch_tokens_per_s(stats, {(8, 16): 2.0, (4, 32): 3.0}) == 900 / 9.0


def test_cpu_description_reads_model_and_matmul_flags(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\n"
                     "model name\t: AMD EPYC 9R14\n"
                     "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 sha_ni\n"
                     "processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n"
                     "model name\t: AMD EPYC 9R15\nflags\t\t: fpu\n")
  assert common.cpu_description(str(cpuinfo)) == {
      "cpu_model": "AMD EPYC 9R14 (family 25, model 17)",
      "cpu_flags": ["fma", "avx2", "avx512f", "avx512_bf16"]}
  cpuinfo.write_text("model name\t: Some CPU\nflags\t\t: avx2\n")  # No numbers (not x86).
  assert common.cpu_description(str(cpuinfo)) == {"cpu_model": "Some CPU",
                                                  "cpu_flags": ["avx2"]}
  assert common.cpu_description(str(tmp_path / "missing")) == {"cpu_model": "",
                                                                 "cpu_flags": []}


def test_a_product_that_would_not_finish_is_skipped_after_a_small_probe():
  """A fake framework doing 0.01 GFLOP/s (emulated bfloat16): the 256^3 probe
  says the peak's six 2048^3 products would take ~10,300 s, so none is started;
  at 1.3 GFLOP/s (PyTorch's bfloat16 on an AVX2-only CPU) they would take ~79 s,
  over the 30 s budget, though one alone would fit."""
  calls = []

  def measure(n, repeats=5, dtype="float32"):
    calls.append(n)
    return 1e7

  flops, why = common.probed_peak(measure, 2048, "bfloat16")
  assert flops is None and calls == [256, 256]  # Probed again before skipping.
  assert "6 2048^3 bfloat16 products would take ~10308 s" in why
  flops, why = common.probed_peak(lambda n, repeats=5, dtype=None: 1.3e9, 2048, "bfloat16")
  assert flops is None and "would take ~79 s" in why
  flops, why = common.probed_peak(lambda n, repeats=5, dtype=None: 1e11, 2048, "float32")
  assert flops == 1e11 and why is None
  # A GPU's peak takes 8192^3 products, probed at 1024^3 (a 256^3 one takes its launch time).
  calls.clear()
  flops, why = common.probed_peak(measure, 8192, "bfloat16")
  assert flops is None and calls == [1024, 1024] and "at 1024^3" in why


def test_one_stalled_probe_product_does_not_skip_a_framework():
  """Seen once: PyTorch's float32 256^3 probe at 2.8 GFLOP/s on a CPU doing 200
  (one stalled product); the probe taken again decides."""
  rates = iter([2.8e9, 1.5e11, 2.0e11])
  calls = []

  def measure(n, repeats=5, dtype="float32"):
    calls.append((n, repeats))
    return next(rates)

  flops, why = common.probed_peak(measure, 2048, "float32")
  assert (flops, why) == (2.0e11, None)
  assert calls == [(256, 1), (256, 3), (2048, 5)]


def test_pytorch_training_is_left_out_where_one_step_would_not_finish(capsys):
  """Where the probe scales a 4-row step to more than the budget (PyTorch's
  bfloat16 backward on an AVX2-only CPU: ~70 s a small step), PyTorch's training
  leaves the run with a message naming the size and the estimate; within it, it stays."""
  size = common.SIZES["small"]
  batch = {"targets": np.zeros((256, 16), np.int32)}
  assert not run.torch_trains(size, batch, step_seconds=lambda size, batch, rows: 70.4)
  assert "PyTorch training skipped at small: one float32 step would take ~70 s" in (
      capsys.readouterr().out)
  assert run.torch_trains(size, batch, step_seconds=lambda size, batch, rows: 1.5)
  assert capsys.readouterr().out == ""



def test_allocator_comparison_names_a_missing_tcmalloc_before_starting_a_child(
    monkeypatch, capsys):
  monkeypatch.setenv("TRANSFORMER_TCMALLOC", "/nonexistent/libtcmalloc.so")
  with pytest.raises(SystemExit):
    allocators.main(["--size", "smoke"])
  assert "TRANSFORMER_TCMALLOC='/nonexistent/libtcmalloc.so': no such file" in (
      capsys.readouterr().err)


def test_decode_only_times_decoding_alone_and_reports_each_interleaved_ratio(tmp_path):
  """--decode_only: no training and no allocator runs, the decoding figures as
  in a full run; with a peer, ours/peer of every interleaved repeat is printed
  and in the JSON, each from the two decodes of that round."""
  out = tmp_path / "bench.json"
  argv = (["--smoke", "--decode_only", "--decode_repeats", "3", "--json", str(out)]
          + ([] if HAS_TORCH else ["--no_torch"]) + ([] if HAS_MARIAN else ["--no_marian"]))
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    run.main(argv)
  table = printed.getvalue()
  results = json.loads(out.read_text())
  res = results["sizes"]["smoke"]
  assert "malloc" not in results
  assert not any(key.startswith("train ") for key in res["ours"]), res["ours"]
  assert not any(key.startswith("train ") for key in res["pytorch"]), res["pytorch"]
  _check(res["ours"], ["greedy sentences/s", "beam4 sentences/s"], table)
  assert all(len(times) == 3 for times in res["decode_s_all"].values())
  peers = {"torch greedy": HAS_TORCH, "marian greedy": HAS_MARIAN, "marian beam4": HAS_MARIAN}
  assert set(res["decode_ratio_per_run"]) == {name for name, ran in peers.items() if ran}
  for name, ratios in res["decode_ratio_per_run"].items():
    ours = res["decode_s_all"][name.split()[1]]
    assert ratios == pytest.approx([t / o for t, o in zip(res["decode_s_all"][name], ours)])
    assert f"in each of 3 interleaved runs: {', '.join(f'{r:.2f}' for r in ratios)}" in table


@pytest.mark.parametrize("flag", ["--decode_repeats", "--steps", "--decode_sentences",
                                  "--tokens_per_batch"])
def test_a_count_below_one_is_refused_by_name(flag, capsys):
  with pytest.raises(SystemExit):
    run.main(["--smoke", flag, "0"])
  assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


def test_a_json_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys):
  """benchmarks.run opened --json only after every measurement: a missing folder
  threw the whole run away, as table1, profile and decode_ab already refuse."""
  with pytest.raises(SystemExit):
    run.main(["--smoke", "--json", str(tmp_path / "none" / "r.json")])
  assert re.search(r"--json '.*r\.json': its folder '.*none' does not exist",
                   capsys.readouterr().err)


def test_gpu_check_stands_in_for_clu_s_tensorboard_writer_without_tensorflow(tmp_path):
  """gpu_check.sh runs train.py on GPU images without TensorFlow: clu's writers then
  import benchmarks/gpu_stubs' SummaryWriter, and the log writer still works."""
  stubs = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "gpu_stubs")
  code = ("import sys; sys.modules['tensorflow'] = None\n"
          f"sys.path.insert(0, {stubs!r}); import sitecustomize\n"
          "import logging; logging.basicConfig(level=logging.INFO)\n"
          "from clu import metric_writers\n"
          f"w = metric_writers.create_default_writer({str(tmp_path)!r}, asynchronous=False)\n"
          "w.write_scalars(3, {'loss': 1.5}); w.write_texts(3, {'t': 'x'}); w.flush(); w.close()\n"
          "print('ok')\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "ok" in out.stdout and "loss=1.5" in out.stderr
  assert not list(tmp_path.iterdir())  # No TensorBoard files: summaries are dropped.


def test_out_of_memory_in_a_size_names_the_batch_and_what_to_change(monkeypatch):
  """On a GPU, PyTorch ran out of memory beside JAX's buffers at 100k-token
  batches (session 33): the run stops with one message naming the size, the
  batch and the flags to change, not a traceback from inside PyTorch."""
  class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name.
    pass

  def oom(size, *args, **kwargs):
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 13.78 GiB.\nmore")

  monkeypatch.setattr(run, "bench_size", oom)
  with pytest.raises(SystemExit) as stop:
    run.main(["--smoke", "--no_torch", "--no_marian", "--malloc", "skip",
              "--tokens_per_batch", "512"])
  assert str(stop.value) == (
      "benchmarks.run: smoke: out of memory at --tokens_per_batch 512. Run with a smaller "
      "--tokens_per_batch. (OutOfMemoryError: CUDA out of memory. Tried to allocate 13.78 GiB.)")
  assert "share the device" in run.out_of_memory_message(
      common.SIZES["base"], run.argparse.Namespace(tokens_per_batch=None), True,
      RuntimeError("RESOURCE_EXHAUSTED: Out of memory"))
  assert run.out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying"))
  assert not run.out_of_memory(ValueError("a shape mismatch"))


# benchmarks/decode_ab.py: flags and variants checked before any decoding, every
# user error one line, and every timed run after an untimed warm-up.


@pytest.fixture(scope="module")
def decode_workdir(tmp_path_factory):
  from tests.workdirs import trained_workdir  # pylint: disable=g-import-not-at-top
  return trained_workdir(tmp_path_factory)


def _decode_ab(monkeypatch, *argv):
  """decode_ab's main on `argv`, read from sys.argv as the command reads it."""
  from benchmarks import decode_ab  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, "argv", ["decode_ab", *argv])
  return decode_ab.main()


def _no_decoding(monkeypatch):
  from transformer import inference  # pylint: disable=g-import-not-at-top

  def decoded(*args, **kwargs):
    raise AssertionError("decoded despite a bad flag")
  monkeypatch.setattr(inference, "decode_ids", decoded)


@pytest.mark.parametrize("argv,message", [
    (["--runs", "0"], "--runs must be at least 1, got 0"),
    (["--limit", "-5"], "--limit must be at least 1, got -5"),  # It sliced off the last 5.
    (["--json", "/nonexistent/ab.json"],
     "--json '/nonexistent/ab.json': its folder '/nonexistent' does not exist"),
    (["--json", "."], "--json '.': is a directory; give a file name"),
])
def test_decode_ab_refuses_a_bad_flag_by_name_before_any_work(argv, message, decode_workdir,
                                                              monkeypatch, capsys):
  _no_decoding(monkeypatch)
  with pytest.raises(SystemExit) as stopped:
    _decode_ab(monkeypatch, "--workdir", decode_workdir, "--variant", "compact=0", *argv)
  assert stopped.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(f": error: {message}")


def test_decode_ab_takes_a_workdir_holding_a_decode_field_since_removed():
  """config.decode.min_cache_len was a field for a while: an old workdir's
  config.json holding it is decoded, and a value out of range is still named."""
  from benchmarks import decode_ab  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.decode.min_cache_len = 8
  decode_ab.check_variant(config, "beam", "compact=1")
  config.decode.concurrent_batches = 0
  with pytest.raises(ValueError, match=r"--variant 'x': config.decode.concurrent_batches=0"):
    decode_ab.check_variant(config, "beam", "x")


@pytest.mark.parametrize("argv,message", [
    (["--workdir", "{tmp}/none"], "{tmp}/none/config.json not found: is '{tmp}/none' a "
     "training workdir?"),
    (["--split", "nosuch"], "SCAN has splits 'train' and 'test', not 'nosuch' (--split)"),
    (["--checkpoint", "999"], "no checkpoint for step 999 in {workdir}/checkpoints"),
    (["--checkpoint", "newest"], "checkpoint must be a step number or one of "),
    (["--variant", "compact"], "--variant 'compact': 'compact' is not name=value"),
    # A typo was decoded as the unchanged config and reported as a variant.
    (["--variant", "compcat=2"], "--variant 'compcat=2': config.decode has no field 'compcat' "
     "(fields: alpha, beam_size, compact, concurrent_batches, max_extra_len, refill, "
     "tokens_per_batch)"),
    (["--variant", "compact=two"], "--variant 'compact=two': compact='two': Could not "
     "override field 'compact'"),
    # Refused before the first variant decodes, not after.
    (["--variant", "compact=-3"], "--variant 'compact=-3': compact must be >= 0, got -3"),
    (["--variant", "concurrent_batches=0"], "--variant 'concurrent_batches=0': "
     "config.decode.concurrent_batches=0: must be >= 1"),
])
def test_decode_ab_stops_on_a_user_error_in_one_line_before_decoding(
    argv, message, decode_workdir, tmp_path, monkeypatch):
  _no_decoding(monkeypatch)
  flags = {"--workdir": decode_workdir, "--variant": "compact=0", "--limit": "20"}
  flags.update(zip(argv[::2], argv[1::2]))
  variants = ["--variant", "compact=0"] if "--variant" in argv else []
  fill = lambda s: s.format(tmp=tmp_path, workdir=decode_workdir)
  with pytest.raises(SystemExit) as stopped:
    _decode_ab(monkeypatch, *variants, *[fill(a) for kv in flags.items() for a in kv])
  assert str(stopped.value.code).startswith(f"decode_ab: error: {fill(message)}"), (
      stopped.value.code)


def test_decode_ab_accepts_a_current_decode_field_an_old_workdir_lacks():
  """decode.compact came after some workdirs were trained: their config.json lacks
  it, and an A/B of it on such a run is what the field exists for."""
  from benchmarks import decode_ab  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  del config.decode["compact"]
  varied = decode_ab.with_decode(config, {"compact": 2}, "compact=2")
  assert varied.decode.compact == 2 and "compact" not in config.decode
  with pytest.raises(ValueError, match="--variant 'compcat=2': config.decode has no field"):
    decode_ab.with_decode(config, {"compcat": 2}, "compcat=2")


def test_decode_ab_times_every_run_after_an_untimed_warm_up(decode_workdir, tmp_path,
                                                            monkeypatch, capsys):
  """The first decode of each variant is cold (the first variant's also compiles
  what later ones reuse): it is a warm-up, reported apart, not one of the runs.
  Each decode here reports 1 + its call number seconds, so which ones count shows."""
  from transformer import inference  # pylint: disable=g-import-not-at-top
  real, calls = inference.decode_ids, []

  def numbered(*args, timings, **kwargs):
    out = real(*args, timings=timings, **kwargs)
    calls.append(len(calls))
    timings["decode_seconds"] = float(len(calls))
    timings["compile_seconds"] = 100.0 + len(calls)
    return out
  monkeypatch.setattr(inference, "decode_ids", numbered)
  out = tmp_path / "ab.json"
  _decode_ab(monkeypatch, "--workdir", decode_workdir, "--variant", "compact=0",
             "--variant", "compact=0,compact=0", "--runs", "2", "--limit", "10",
             "--json", str(out))
  assert len(calls) == 6  # 2 warm-ups, then 2 runs of 2 variants.
  rows = json.loads(out.read_text())["rows"]
  n = 10
  assert [r["sentences_per_second"] for r in rows] == [[n / 3, n / 5], [n / 4, n / 6]]
  assert [r["warmup_sentences_per_second"] for r in rows] == [n / 1, n / 2]
  assert [r["compile_seconds"] for r in rows] == [101.0, 102.0]
  table = capsys.readouterr().out
  assert "2 runs timed after a warm-up decode of each variant; outputs identical" in table


def test_best_save_times_the_recipes_best_checkpoint_write(capsys):
  """benchmarks.best_save: the Multi30k state saved as a best checkpoint, each
  write timed to its end (its figure is in benchmarks/README.md)."""
  from benchmarks import best_save  # pylint: disable=import-outside-toplevel
  best_save.main(["--repeats", "2"])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == "7,568,384 parameters" and lines[2].startswith("save written: median ")
  with pytest.raises(SystemExit):
    best_save.main(["--repeats", "1"])
