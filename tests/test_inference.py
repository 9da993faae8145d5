"""Tests for transformer/inference.py's decode_ids on the tiny trained SCAN
workdir: refill and concurrent batches give the outputs of one plain batch at a
time, a failing batch or a Ctrl-C stops them; and benchmarks.decode_ab, which
compares such settings."""

import itertools
import json
import sys
import threading
import types

import jax
import numpy as np
import pytest

from tests.helpers import tiny_experiment
from tests.workdirs import trained_workdir
from transformer import data as data_lib
from transformer import decode, inference, runtime
from transformer import workdir as workdir_lib


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained_workdir(tmp_path_factory)


def test_decode_ab_compares_compaction_and_refill_with_the_same_outputs(
    workdir, tmp_path, monkeypatch, capsys):
  """benchmarks.decode_ab: config.decode variants on a workdir, interleaved, their
  outputs compared (compaction and refill must not change one), one table row each."""
  from benchmarks import decode_ab  # pylint: disable=import-outside-toplevel
  out = tmp_path / "ab.json"
  monkeypatch.setattr(sys, "argv", [
      "decode_ab", "--workdir", workdir, "--split", "test", "--limit", "24", "--runs", "2",
      "--variant", "compact=0", "--variant", "compact=1",
      "--variant", "refill=3", "--json", str(out)])
  decode_ab.main()
  printed = capsys.readouterr().out
  assert "outputs identical" in printed
  table = [line for line in printed.splitlines() if line.startswith(("| compact", "| refill"))]
  assert len(table) == 3 and table[0].split("|")[4].strip() == "1.00x"
  rows = json.loads(out.read_text())["rows"]
  assert [len(r["sentences_per_second"]) for r in rows] == [2, 2, 2]
  assert [r["changed_outputs"] for r in rows] == [0, 0, 0]
  assert decode_ab.parse_variant("compact=2,x=a") == {"compact": 2, "x": "a"}
  with pytest.raises(ValueError, match="not name=value"):
    decode_ab.parse_variant("compact")


def _split_and_model(workdir, limit=40):
  restored = workdir_lib.restore(workdir)
  examples = next(data_lib.iter_eval(restored.config.data, restored.tokenizer, "test", 10**6,
                                     limit))[0]
  return restored, examples


def test_refill_searches_a_normal_batch_of_sentences_at_a_time(workdir, monkeypatch):
  """decode_ids with refill = 4: batches of 4 x tokens_per_batch, each searched as
  many sentences at a time as a batch of tokens_per_batch holds (eval_rows), so a
  small batch is not searched a few sentences at a time; a batch no larger than
  that, and beam size 1, search the whole batch as without refill. The outputs
  are those without refill. Each batch's (shape, refill) is recorded as its
  program is fetched; the first run compiles afresh and records what reached
  encode_and_decode too, which must be the same."""
  restored, examples = _split_and_model(workdir)
  fetched, traced = [], []
  compiled, encode_and_decode = inference._compiled, decode.encode_and_decode  # pylint: disable=protected-access

  def fetching(model, params, inputs, rows, rng, mesh, settings):
    fetched.append((inputs.shape, settings[-1]))
    return compiled(model, params, inputs, rows, rng, mesh, settings)

  def tracing(model, params, inputs_BxS, **kw):
    traced.append((inputs_BxS.shape, kw["refill"]))
    return encode_and_decode(model, params, inputs_BxS, **kw)

  monkeypatch.setattr(inference, "_compiled", fetching)
  monkeypatch.setattr(decode, "encode_and_decode", tracing)

  def run(examples, refill, beam_size=2):
    """(outputs, (batch shape, refill) of each batch)."""
    fetched.clear()
    outputs = [ids.tolist() for ids in inference.decode_ids(
        restored.model, restored.params, examples, restored.config, restored.mesh,
        mode="beam", beam_size=beam_size, max_extra_len=10, tokens_per_batch=64,
        refill=refill)]
    return outputs, list(fetched)

  inference._COMPILED.clear()  # pylint: disable=protected-access
  refilled, batches = run(examples, 4)
  assert traced == batches
  assert refilled == run(examples, 0)[0]
  assert any(n for _, n in batches), batches
  for (rows, width), n in batches:
    full = data_lib.eval_rows(width, 64)
    assert n == (full if rows > full else 0), (rows, width, n)
  small, batches = run(examples[:3], 4)  # One small batch: searched whole.
  assert small == run(examples[:3], 0)[0] and [n for _, n in batches] == [0]
  one_beam, batches = run(examples, 4, beam_size=1)
  assert (one_beam, batches) == run(examples, 0, beam_size=1)
  assert not any(n for _, n in batches)


def test_concurrent_batches_run_at_once_and_give_the_outputs_of_one_at_a_time(
    workdir, monkeypatch):
  """decode_ids with 3 batches at once: each batch's program is entered from its
  own thread while another is in flight (a barrier that two must reach
  together), and greedy and beam outputs equal those of one batch at a time."""
  restored, examples = _split_and_model(workdir)
  kw = dict(tokens_per_batch=64, beam_size=2, max_extra_len=10)
  decode = lambda mode, n, timings=None: [ids.tolist() for ids in inference.decode_ids(
      restored.model, restored.params, examples, restored.config, restored.mesh, mode=mode,
      concurrent_batches=n, timings=timings, **kw)]
  serial = {mode: decode(mode, 1) for mode in ("greedy", "beam")}
  compiled = inference._compiled  # pylint: disable=protected-access
  together, calls, threads = threading.Barrier(2, timeout=30), itertools.count(), set()

  def meeting(*args):
    fn = compiled(*args)

    def run(*inputs):
      threads.add(threading.get_ident())
      if next(calls) < 2:  # The first two batches wait for each other: one at a time fails.
        together.wait()
      return fn(*inputs)
    return run

  monkeypatch.setattr(inference, "_compiled", meeting)
  timings = {}
  assert decode("greedy", 3, timings) == serial["greedy"]
  assert timings["batches"] >= 4 and len(threads) >= 2
  monkeypatch.setattr(inference, "_compiled", compiled)
  assert decode("beam", 3) == serial["beam"]


def test_a_failing_batch_stops_concurrent_decoding_with_its_error(workdir, monkeypatch):
  restored, examples = _split_and_model(workdir)
  compiled, calls = inference._compiled, []  # pylint: disable=protected-access

  def fails_second(*args):
    fn = compiled(*args)
    calls.append(1)
    if len(calls) == 2:
      def fail(*_):
        raise RuntimeError("batch 2 failed")
      return fail
    return fn

  monkeypatch.setattr(inference, "_compiled", fails_second)
  with pytest.raises(RuntimeError, match="batch 2 failed"):
    inference.decode_ids(restored.model, restored.params, examples, restored.config,
                         restored.mesh, tokens_per_batch=64, concurrent_batches=2)


def test_a_swallowed_ctrl_c_stops_decoding_at_the_next_batch(workdir, monkeypatch):
  """A Ctrl-C whose KeyboardInterrupt a callback swallowed (runtime.catch_interrupts
  remembers it) stops decode_ids once the batch in flight is done, not after the
  split's last batch."""
  restored, examples = _split_and_model(workdir)
  compiled, calls = inference._compiled, []  # pylint: disable=protected-access
  monkeypatch.setattr(runtime, "_interrupted", [])

  def interrupted_in_first(*args):
    fn = compiled(*args)

    def run(*inputs):
      calls.append(1)
      runtime._interrupted.append(True)  # pylint: disable=protected-access
      return fn(*inputs)
    return run

  monkeypatch.setattr(inference, "_compiled", interrupted_in_first)
  with pytest.raises(KeyboardInterrupt):
    inference.decode_ids(restored.model, restored.params, examples, restored.config,
                         restored.mesh, tokens_per_batch=64, concurrent_batches=1)
  assert len(calls) == 1


def test_batches_at_once_is_one_where_concurrent_programs_could_fail(monkeypatch):
  """config.decode.concurrent_batches (2 where a saved config lacks it), a
  request over it; but one batch at a time in a multi-process job and on any
  accelerator (on a GPU, concurrent programs crashed: a segfault in training's
  decode, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED in evaluate)."""
  config = tiny_experiment("unused")
  mesh = lambda platform, n: types.SimpleNamespace(
      size=n, devices=np.array([types.SimpleNamespace(platform=platform)] * n))
  config.decode.concurrent_batches = 3
  assert inference.batches_at_once(config, mesh("cpu", 1)) == 3
  assert inference.batches_at_once(config, mesh("cpu", 8)) == 3
  assert inference.batches_at_once(config, mesh("gpu", 1)) == 1
  assert inference.batches_at_once(config, mesh("gpu", 1), requested=4) == 1
  assert inference.batches_at_once(config, mesh("gpu", 2)) == 1
  assert inference.batches_at_once(config, mesh("tpu", 1)) == 1
  del config.decode["concurrent_batches"]
  assert inference.batches_at_once(config, mesh("cpu", 1)) == inference.CONCURRENT_BATCHES == 2
  with pytest.raises(ValueError, match="concurrent_batches must be >= 1"):
    inference.batches_at_once(config, mesh("cpu", 1), requested=-1)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  assert inference.batches_at_once(config, mesh("cpu", 1)) == 1


def test_outputs_are_cut_after_their_eos_which_they_keep():
  """decode_ids's outputs end with their EOS (the attention plots' last row);
  one that never ended loses only its padding."""
  cut = lambda ids: inference._cut(np.array(ids)).tolist()  # pylint: disable=protected-access
  eos = data_lib.EOS_ID
  assert cut([5, eos, 0, 0]) == [5, eos] and cut([5, 6, eos, 7]) == [5, 6, eos]
  assert cut([5, 6, 0, 0]) == [5, 6]


def test_the_decode_score_is_sacrebleu_of_the_outputs_against_the_references(
    workdir, monkeypatch):
  """evaluate_examples (training's decode, whose score picks the best checkpoint)
  scores the outputs as sacreBLEU's hypotheses and the references as its
  references: corpus BLEU and chrF are not symmetric (the brevity penalty), so a
  swap would change every score. An echoing model (output = its own source) gives
  outputs that are shorter prefixes of the references here."""
  import copy  # pylint: disable=import-outside-toplevel
  import sacrebleu  # pylint: disable=import-outside-toplevel
  restored, examples = _split_and_model(workdir, limit=6)
  monkeypatch.setattr(inference, "_COMPILED", {})
  monkeypatch.setattr(decode, "encode_and_decode", lambda model, params, inputs, **kw: inputs)
  config = copy.deepcopy(restored.config)
  config.data.dataset = "multi30k"  # Scored with BLEU, not SCAN's exact match.
  sources = [restored.tokenizer.decode(src) for src, _ in examples]
  references = [f"{s} and then some more words" for s in sources]
  scores, hypotheses = inference.evaluate_examples(
      restored.model, restored.params, examples, references, restored.tokenizer, config,
      restored.mesh, mode="greedy")
  assert hypotheses == sources
  bleu = sacrebleu.corpus_bleu(hypotheses, [references])
  assert bleu.score != pytest.approx(sacrebleu.corpus_bleu(references, [hypotheses]).score)
  assert scores["bleu"] == pytest.approx(bleu.score)
  assert scores["bleu_brevity_penalty"] == pytest.approx(bleu.bp) and bleu.bp < 1
  assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
  assert scores["num_sentences"] == len(examples)
