"""Tests for transformer/evaluate.py: the scores against sacreBLEU and hand counts,
and the command on a tiny trained SCAN workdir (shared with test_translate)."""

import fcntl
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import types

import hypothesis
import jax
from hypothesis import strategies as st
import numpy as np
import pytest
import sacrebleu

from tests.helpers import fake_workdir, tiny_experiment
from transformer import data as data_lib
from transformer import decode, evaluate, inference, metrics, results, runtime, training
from transformer import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trained_workdir(tmp_path_factory):
  """A 20-step tiny SCAN run (checkpoints 10 and 20), trained once per test session:
  it lives in the session's base temp dir, so every module asking gets the same one."""
  base = tmp_path_factory.getbasetemp() / "tiny_trained_workdir"
  done = base / "DONE"
  if not done.exists():
    shutil.rmtree(base, ignore_errors=True)  # A half-built one from a failed attempt.
    config = tiny_experiment(base / "tfds", num_steps=20, eval_every=100, checkpoint_every=10)
    training.train_and_evaluate(config, str(base / "run"))
    done.touch()
  return str(base / "run")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained_workdir(tmp_path_factory)


def rnn_workdir(path, name="rnn", **decode_fields):
  """A workdir holding only the config.json of a tiny RNN run (config.decode
  fields changed as given): what evaluate and translate check before any work."""
  config = tiny_experiment(os.path.join(path, "tfds"))
  config.model.architecture = "rnn"
  config.data.batching = "bucket"
  config.decode.update(decode_fields)
  fake_workdir(os.path.join(path, name), config)
  return os.path.join(path, name)


class Stopped(Exception):
  """Raised where a test stops a command that has started its work."""


def stop_at(monkeypatch, *names):
  """Makes workdir_lib's functions `names` (restore, load_tokenizer: the work)
  raise Stopped."""
  def stopped(*args, **kwargs):
    raise Stopped
  for name in names:
    monkeypatch.setattr(workdir_lib, name, stopped)


# ----------------------------------------------------------------------------
# Scores.

def test_bleu_of_references_against_themselves_is_100():
  refs = ["The cat sat on the mat.", "Hello there, world!", "Ein Haus am See."]
  result = metrics.score(refs, refs, "wmt14_translate/de-en")
  assert result["bleu"] == pytest.approx(100.0)
  assert result["chrf"] == pytest.approx(100.0)


def test_bleu_matches_sacrebleu_and_the_hand_count():
  hyps = ["the cat sat on the mat", "a quick brown fox jumps"]
  refs = ["the cat sat on a mat", "the quick brown fox jumped"]
  result = metrics.score(hyps, refs, "parallel_text")
  assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
  # Matching n-grams 8/11, 5/9, 3/7, 1/5; equal lengths, so no brevity penalty.
  assert result["bleu"] == pytest.approx(100 * (8 / 11 * 5 / 9 * 3 / 7 * 1 / 5) ** 0.25)
  assert result["bleu"] == pytest.approx(43.13894320445206)
  assert result["bleu_precisions"] == pytest.approx([800 / 11, 500 / 9, 300 / 7, 20.0])
  assert result["bleu_signature"] == (
      f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}")


def test_bleu_is_cased():
  result = metrics.score(["The cat sat on the mat."], ["the cat sat on the mat."], "x")
  assert result["bleu"] < 100.0


def test_exact_match_and_token_accuracy_by_hand():
  hyps = ["I_WALK I_JUMP", "I_LOOK", "I_RUN I_RUN I_RUN", "", " I_LOOK  I_LOOK "]
  refs = ["I_WALK I_JUMP", "I_LOOK I_LOOK", "I_RUN I_WALK", "I_JUMP", "I_LOOK I_LOOK"]
  result = metrics.score(hyps, refs, "scan/simple")
  assert result == {"exact_match": pytest.approx(2 / 5),
                    # Position-wise over each reference: 2 + 1 + 1 + 0 + 2 of 9.
                    "token_accuracy": pytest.approx(6 / 9)}


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    pairs=st.lists(st.tuples(st.text(alphabet="ab cdA.", max_size=20),
                             st.text(alphabet="ab cdA.", min_size=1, max_size=20)),
                   min_size=1, max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=4),
    task=st.sampled_from(["scan/simple", "parallel_text"]))
def test_scores_added_chunk_by_chunk_equal_the_corpus_scores(pairs, cuts, task):
  """What evaluate sums chunk by chunk is what sacreBLEU (and the hand count)
  gives for the corpus at once, wherever the chunks are cut."""
  hyps, refs = [h for h, _ in pairs], [r for _, r in pairs]
  scorer = metrics.Scorer(task)
  bounds = sorted({0, len(pairs), *(min(c, len(pairs)) for c in cuts)})
  for a, b in zip(bounds, bounds[1:]):
    scorer.add(hyps[a:b], refs[a:b])
  result = scorer.result()
  assert scorer.count == len(pairs)
  if task == "parallel_text":
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
  else:
    exact = sum(h.split() == r.split() for h, r in zip(hyps, refs)) / len(refs)
    assert result["exact_match"] == pytest.approx(exact)
  assert result == metrics.score(hyps, refs, task)  # Integer counts: summed exactly.


def test_score_rejects_mismatched_or_empty_input():
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    metrics.score(["a", "b"], ["a"], "scan/simple")
  with pytest.raises(ValueError, match="nothing to score"):
    metrics.score([], [], "scan/simple")


def test_result_name_is_filename_safe():
  assert evaluate.result_name("test[:200]", "latest", "beam", 4, 0.6) == (
      "eval_test.to200_latest_beam4-a0.6")
  assert evaluate.result_name("test", 3000, "greedy", 4, 0.6, limit=50) == (
      "eval_test_3000_greedy-n50")
  assert evaluate.result_name("test", "best", "greedy", 4, 0.6, max_extra_len=0) == (
      "eval_test_best_greedy-x0")


def test_result_names_keep_different_splits_apart():
  """Two slices (or other splits) never share a result file: test[:50] and
  test[50:] were both eval_test_50_..., the second evaluation replacing the first."""
  splits = ["test", "test[:50]", "test[50:]", "test[:50%]", "test[-50:]", "test[:-50]",
            "train+test", "train test", "train/test", "train_test", "test[10:20]",
            "test[10]", "test.to50"]
  names = [evaluate.result_name(s, "latest", "greedy", 4, 0.6) for s in splits]
  assert len(set(names)) == len(names), names
  assert evaluate.result_name("test[50:]", "latest", "greedy", 4, 0.6) == (
      "eval_test.50to_latest_greedy")
  for name in names:
    assert re.fullmatch(r"[A-Za-z0-9._+-]+", name), name


def test_another_output_limit_does_not_replace_the_configs_evaluation(workdir):
  """--max_extra_len other than config.decode's writes a file of its own: the
  evaluation at the config's limit, which result tables read, stays."""
  default, default_path = evaluate.run(workdir, split="test[:5]", mode="greedy")
  short, short_path = evaluate.run(workdir, split="test[:5]", mode="greedy", max_extra_len=1)
  assert short_path.endswith("_greedy-x1.json") and short_path != default_path
  with open(default_path) as f:
    assert json.load(f)["max_extra_len"] == default["max_extra_len"] != 1
  assert short["max_extra_len"] == 1
  again, path = evaluate.run(workdir, split="test[:5]", mode="greedy",
                             max_extra_len=default["max_extra_len"])
  assert path == default_path  # The config's own limit, given explicitly: the same name.


# ----------------------------------------------------------------------------
# The command on a trained workdir.

def test_evaluate_writes_json_and_exact_match_matches_its_outputs(workdir):
  # Beam search here; translate's tests cover greedy and sampling.
  result, path = evaluate.run(workdir, split="test[:40]", mode="beam", beam_size=2,
                              limit=30)
  assert os.path.basename(path) == "eval_test.to40_latest_beam2-a0.6-n30.json"
  with open(path) as f:
    saved = json.load(f)
  assert saved == result
  for key in ("step", "split", "checkpoint", "mode", "beam_size", "alpha", "max_extra_len",
              "metrics", "num_sentences", "decode_seconds", "compile_seconds",
              "sentences_per_second", "dataset", "signature", "hypotheses_file",
              "truncated_sources", "truncated_targets"):
    assert key in saved, key
  assert (saved["step"], saved["split"], saved["mode"], saved["num_sentences"]) == (
      20, "test[:40]", "beam", 30)
  # Settings not given come from config.decode.
  assert (saved["beam_size"], saved["alpha"], saved["max_extra_len"]) == (2, 0.6, 50)
  assert set(saved["metrics"]) == {"exact_match", "token_accuracy"}

  with open(saved["hypotheses_file"]) as f:
    hypotheses = f.read().split("\n")[:-1]
  config = workdir_lib.load_config(workdir)
  tokenizer = workdir_lib.load_tokenizer(workdir, config)
  _, pairs, _ = data_lib.get_eval(config.data, tokenizer, "test[:40]")
  references = [t for _, t in pairs[:30]]
  assert len(hypotheses) == 30
  exact = sum(h.split() == r.split() for h, r in zip(hypotheses, references)) / 30
  assert saved["metrics"]["exact_match"] == pytest.approx(exact)
  assert saved["metrics"] == pytest.approx(metrics.score(hypotheses, references, "scan"))
  assert not [n for n in os.listdir(workdir) if ".tmp" in n]  # Temporary files renamed.


def test_evaluating_chunk_by_chunk_gives_the_same_results(workdir):
  """--chunk_lines 7: the same hypotheses, in order, and the same scores and
  perplexity as the split in one chunk; no .partial file is left."""
  whole, path = evaluate.run(workdir, split="test[:40]", mode="greedy")
  with open(whole["hypotheses_file"]) as f:
    hypotheses = f.read()
  chunked, _ = evaluate.run(workdir, split="test[:40]", mode="greedy", chunk_lines=7)
  with open(chunked["hypotheses_file"]) as f:
    assert f.read() == hypotheses
  assert chunked["metrics"] == whole["metrics"]
  assert chunked["num_sentences"] == whole["num_sentences"] == 40
  assert chunked["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)
  assert chunked["batches"] > whole["batches"]
  assert not [n for n in os.listdir(workdir) if n.endswith(".partial")]
  # The first 33 examples, cut inside the fifth chunk.
  limited, _ = evaluate.run(workdir, split="test[:40]", mode="greedy", limit=33,
                            chunk_lines=7)
  with open(limited["hypotheses_file"]) as f:
    assert f.read() == "".join(hypotheses.splitlines(keepends=True)[:33])


def test_a_side_that_encodes_to_nothing_is_scored_not_dropped(workdir, monkeypatch):
  """A source or reference with no ids (empty, or U+2581 alone) stays in the
  evaluation as EOS alone: every reference is scored, and the hypotheses file
  keeps one line per example in order."""
  iter_pairs = data_lib.sources.iter_pairs

  def with_empty_sides(data_config, split, chunk=1000, field=None):
    for pairs in iter_pairs(data_config, split, chunk, field):
      yield [("\u2581", t) if i == 3 else (s, "") if i == 5 else (s, t)
             for i, (s, t) in enumerate(pairs)]

  monkeypatch.setattr(data_lib.sources, "iter_pairs", with_empty_sides)
  result, _ = evaluate.run(workdir, split="test[:12]", mode="greedy")
  assert result["num_sentences"] == 12
  with open(result["hypotheses_file"]) as f:
    assert len(f.read().splitlines()) == 12


def test_a_run_killed_between_chunks_keeps_what_it_wrote(workdir, monkeypatch):
  """Each chunk's hypotheses are flushed before the next chunk is decoded; a
  run that dies part-way leaves them in .txt.partial, and no .txt or .json."""
  decode = inference.decode_examples
  calls = []

  def dies_on_the_third_chunk(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
      raise KeyboardInterrupt  # What a Ctrl-C mid-run raises.
    return decode(*args, **kwargs)

  monkeypatch.setattr(inference, "decode_examples", dies_on_the_third_chunk)
  stem = os.path.join(workdir, evaluate.result_name("test[:30]", "latest", "greedy", 4, 0.6))
  with pytest.raises(KeyboardInterrupt):
    evaluate.run(workdir, split="test[:30]", mode="greedy", chunk_lines=10)
  with open(stem + ".txt.partial") as f:
    assert len(f.read().splitlines()) == 20
  assert not os.path.exists(stem + ".txt") and not os.path.exists(stem + ".json")
  os.remove(stem + ".txt.partial")


def test_a_second_run_of_the_same_evaluation_stops_and_leaves_the_first_alone(workdir):
  """Two runs of one evaluation share its file names: while one writes its
  .txt.partial (and holds its lock), another stops with one line naming the
  file, and neither empties nor writes into it; once the first ends, a rerun
  proceeds."""
  stem = os.path.join(workdir, evaluate.result_name("test[:6]", "latest", "greedy", 4, 0.6))
  with open(stem + ".txt.partial", "w") as first:
    first.write("the first run's line\n")
    first.flush()
    fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(runtime.CommandError,
                       match=rf"^another run is writing {re.escape(stem)}\.txt\.partial: wait"):
      evaluate.run(workdir, split="test[:6]", mode="greedy")
    with open(stem + ".txt.partial") as f:
      assert f.read() == "the first run's line\n"
    assert not os.path.exists(stem + ".txt")
  result, _ = evaluate.run(workdir, split="test[:6]", mode="greedy")
  with open(result["hypotheses_file"]) as f:
    assert len(f.read().splitlines()) == 6
  assert not os.path.exists(stem + ".txt.partial")


def test_decode_ab_compares_compaction_and_refill_with_the_same_outputs(
    workdir, tmp_path, monkeypatch, capsys):
  """benchmarks.decode_ab: config.decode variants on a workdir, interleaved, their
  outputs compared (compaction and refill must not change one), one table row each."""
  from benchmarks import decode_ab  # pylint: disable=import-outside-toplevel
  out = tmp_path / "ab.json"
  monkeypatch.setattr(sys, "argv", [
      "decode_ab", "--workdir", workdir, "--split", "test", "--limit", "24", "--runs", "2",
      "--variant", "compact=0", "--variant", "compact=1,tokens_per_batch=128",
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
  are those without refill."""
  restored, examples = _split_and_model(workdir)
  seen = []
  encode_and_decode = decode.encode_and_decode

  def recording(model, params, inputs_BxS, **kw):
    seen.append((inputs_BxS.shape, kw["refill"]))
    return encode_and_decode(model, params, inputs_BxS, **kw)

  monkeypatch.setattr(decode, "encode_and_decode", recording)

  def run(examples, refill, beam_size=2):
    """(outputs, (batch shape, refill) of each batch traced)."""
    inference._COMPILED.clear()  # pylint: disable=protected-access
    seen.clear()
    outputs = [ids.tolist() for ids in inference.decode_ids(
        restored.model, restored.params, examples, restored.config, restored.mesh,
        mode="beam", beam_size=beam_size, max_extra_len=10, tokens_per_batch=64,
        refill=refill)]
    return outputs, list(seen)

  refilled, batches = run(examples, 4)
  assert refilled == run(examples, 0)[0]
  assert any(n for _, n in batches), batches
  for (rows, width), n in batches:
    full = data_lib.eval_rows(width, 64)
    assert n == (full if rows > full else 0), (rows, width, n)
  small, batches = run(examples[:3], 4)  # One small batch: searched whole.
  assert small == run(examples[:3], 0)[0] and [n for _, n in batches] == [0]
  one_beam, batches = run(examples, 4, beam_size=1)
  assert batches == run(examples, 0, beam_size=1)[1] and not any(n for _, n in batches)
  assert one_beam == run(examples, 0, beam_size=1)[0]


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


def test_perplexity_is_the_one_training_logged(workdir):
  """Per target token, without label smoothing: on training's eval split and last
  checkpoint, evaluate reports the eval/perplexity training logged at its last step."""
  result, _ = evaluate.run(workdir, split="test[:200]", mode="greedy")
  logged = results.last_scalars(workdir, ["eval/perplexity"])["eval/perplexity"]
  assert result["step"] == 20
  assert result["perplexity"] == pytest.approx(logged, rel=1e-5)
  assert result["perplexity"] == pytest.approx(np.exp(result["nll"]), rel=1e-6)


def test_missing_workdir_or_damaged_config_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    evaluate.run(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="config.json not found"):
    evaluate.run(str(tmp_path))
  (tmp_path / "config.json").write_text('{"model": ')  # Truncated.
  with pytest.raises(ValueError, match=r"config.json is not valid JSON .*line 1 column 11"):
    evaluate.run(str(tmp_path))
  (tmp_path / "config.json").write_text('[1, 2]')
  with pytest.raises(ValueError, match=r"config.json holds a list, not a config"):
    evaluate.run(str(tmp_path))
  (tmp_path / "config.json").write_text('{"model": {}, "data": {}}')  # Sections lost.
  with pytest.raises(ValueError, match=r"config.json lacks the config section\(s\) optim, "
                     "train, decode"):
    evaluate.run(str(tmp_path))


def test_a_hand_edited_model_field_of_the_wrong_type_is_named(workdir, tmp_path):
  """A config.json whose model.num_heads is "2" ended evaluate in a TypeError's
  traceback deep in the model's checks; it is now one line naming the file."""
  edited = tmp_path / "w"
  shutil.copytree(workdir, edited)
  config = json.loads((edited / "config.json").read_text())
  for field, value, kind in (("num_heads", "2", "an integer"), ("dropout", "0.1", "a number"),
                             ("share_embeddings", 1, "true or false")):
    wrong = {**config, "model": {**config["model"], field: value}}
    (edited / "config.json").write_text(json.dumps(wrong))
    with pytest.raises(ValueError, match=re.escape(
        f"{edited / 'config.json'}: config.model.{field}={value!r}: must be {kind}")):
      evaluate.run(str(edited))


def test_a_best_checkpoint_being_replaced_is_named(tmp_path):
  best = tmp_path / "checkpoints_best"
  os.makedirs(best / "15.replaced")
  with pytest.raises(FileNotFoundError, match=r"the best checkpoint in .* is being replaced "
                     r"\(15.replaced\): rerun once training has saved the new one"):
    workdir_lib.checkpoint_location(str(tmp_path), "best")
  os.makedirs(best / "15")  # The new one is complete: it is read.
  assert workdir_lib.checkpoint_location(str(tmp_path), "best") == (str(best), None)


def test_an_evaluation_of_an_average_since_replaced_is_not_collected(workdir, tmp_path):
  """average_checkpoints --last 2, evaluate --checkpoint averaged, then --last 1:
  both averages are of step 20. evaluate records the steps it averaged, and the
  sweep's table drops its figures once another average holds the name (the old
  code recorded the step alone, and the table showed the old average's)."""
  from transformer.average_checkpoints import average_checkpoints
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  assert average_checkpoints(copy, last=2) == (20, [10, 20])
  result, _ = evaluate.run(copy, split="test[:5]", checkpoint="averaged", mode="greedy")
  assert result["checkpoint_identity"] == {"step": 20, "averaged_steps": [10, 20]}
  config = workdir_lib.load_config(copy)
  collected = lambda: results.evaluation(copy, config, "test[:5]", "greedy", "averaged", 20)
  assert collected() == result
  assert average_checkpoints(copy, last=1) == (20, [20])
  assert collected() is None


def test_a_vocabulary_other_than_the_checkpoints_is_named_not_used(workdir, tmp_path):
  """Training records its vocabulary's SHA-256 and size (vocabulary.json). A
  spm.model replaced by another of as many pieces restored without a word, and
  every id meant another piece; one of another size failed in Orbax as a damaged
  checkpoint. Both now stop evaluate (and a resume) naming the vocabulary."""
  from transformer.data import tokenizer as tokenizer_lib
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  config = workdir_lib.load_config(copy)
  original = workdir_lib.load_tokenizer(copy, config)
  record = json.loads(open(os.path.join(copy, workdir_lib.VOCABULARY_RECORD)).read())
  assert record["pieces"] == original.vocab_size
  words = [f"w{i}" for i in range(100)]
  for size, other_bytes in ((original.vocab_size, ", and other bytes"), (40, "")):
    tokenizer_lib.train([" ".join(words)], "word", size).save(os.path.join(copy, "spm.model"))
    message = (rf"vocabulary .*spm.model is not the one .*run's checkpoints were trained with "
               rf"\({size} pieces, against {original.vocab_size} then{other_bytes}; "
               r"vocabulary.json records it\): put the original back")
    with pytest.raises(workdir_lib.ConfigMismatchError, match=message):
      evaluate.run(copy, split="test[:5]", mode="greedy")
    with pytest.raises(workdir_lib.ConfigMismatchError, match=message):
      workdir_lib.check_resume_config(copy, config)
  shutil.copy(os.path.join(workdir, "spm.model"), os.path.join(copy, "spm.model"))
  workdir_lib.check_resume_config(copy, config)  # The original passes.
  open(os.path.join(copy, workdir_lib.VOCABULARY_RECORD), "w").write("{")
  with pytest.raises(ValueError, match=r"vocabulary.json is damaged .* delete it to go on"):
    evaluate.run(copy, split="test[:5]", mode="greedy")


def test_unknown_or_absent_checkpoint_is_named(workdir):
  with pytest.raises(ValueError, match="checkpoint must be a step number or one of"):
    evaluate.run(workdir, checkpoint="newest")
  with pytest.raises(FileNotFoundError, match=r"no checkpoints? (at|in) .*checkpoints_best"):
    evaluate.run(workdir, split="test[:5]", checkpoint="best")
  with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 7 .* \[10, 20\]"):
    evaluate.run(workdir, split="test[:5]", checkpoint="7")


def test_unreadable_checkpoints_are_named_in_one_line_and_kept(workdir, tmp_path):
  """A damaged checkpoint (its state's _METADATA gone) asked for by step, then
  every checkpoint damaged: a one-line error naming the directory and the step,
  from the library and from the command (no traceback), and nothing moved."""
  from transformer import checkpoints
  damaged = str(tmp_path / "damaged")
  shutil.copytree(workdir, damaged)
  ckpt = os.path.join(damaged, "checkpoints")
  os.remove(os.path.join(ckpt, "20", "state", "_METADATA"))
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"checkpoint 20 in .*checkpoints is unreadable") as e:
    evaluate.run(damaged, split="test[:5]", checkpoint="20")
  assert "\n" not in str(e.value)
  os.remove(os.path.join(ckpt, "10", "state", "_METADATA"))
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"no readable checkpoint in .*checkpoints .*step 20: .*step 10: "):
    evaluate.run(damaged, split="test[:5]")
  result = subprocess.run(
      [sys.executable, "-m", "transformer.translate", "--workdir", damaged],
      input="walk\n", cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 1 and not result.stdout
  errors = [l for l in result.stderr.splitlines() if l.startswith("translate: error:")]
  assert len(errors) == 1 and "no readable checkpoint" in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert checkpoints.complete_steps(ckpt) == [10, 20]  # Set aside by no one.


def test_unknown_split_and_bad_settings_are_named(workdir):
  with pytest.raises(ValueError, match=r"SCAN has splits 'train' and 'test', not 'dev' "
                     r"\(--split\)"):
    evaluate.run(workdir, split="dev")
  with pytest.raises(ValueError, match="beam_size must be >= 1"):
    evaluate.run(workdir, beam_size=0)
  with pytest.raises(ValueError, match="mode must be one of"):
    evaluate.run(workdir, mode="viterbi")
  with pytest.raises(ValueError, match="limit must be >= 1"):
    evaluate.run(workdir, limit=0)


def test_a_refill_the_rnn_cannot_do_is_refused_before_any_work(tmp_path, monkeypatch):
  """--refill on an RNN workdir was recorded as done where each batch fitted one
  search, and failed at compile time otherwise, naming the items searched at
  once (refill=8 for --refill 2); config.decode.refill is refused for the RNN
  at training, and the flag (or a config.json's field) is now refused alike."""
  stop_at(monkeypatch, "restore", "load_tokenizer")
  workdir = rnn_workdir(tmp_path)
  for kw in ({}, {"tokens_per_batch": 64}):
    with pytest.raises(ValueError, match=re.escape(
        "--refill 2: model.architecture='rnn' cannot refill beam search rows")):
      evaluate.run(workdir, split="test[:40]", mode="beam", refill=2, **kw)
  with pytest.raises(ValueError, match=re.escape(
      "config.decode.refill=3: model.architecture='rnn' cannot refill")):
    evaluate.run(rnn_workdir(tmp_path, "edited", refill=3), mode="beam")
  with pytest.raises(Stopped):  # Off, or greedy search: the RNN decodes.
    evaluate.run(workdir, mode="beam", refill=0)
  with pytest.raises(Stopped):
    evaluate.run(workdir, mode="greedy", refill=2)


def test_compact_and_refill_outside_beam_search_are_warned_of(workdir, monkeypatch, capsys):
  """Greedy search ignored --compact and --refill without a word."""
  stop_at(monkeypatch, "restore")
  for kw in ({"refill": 2}, {"compact": 1}):
    with pytest.raises(Stopped):
      evaluate.run(workdir, split="test[:5]", mode="greedy", **kw)
    assert ("evaluate: warning: --compact and --refill act in --mode beam only; --mode greedy "
            "ignores them") in capsys.readouterr().err
  with pytest.raises(Stopped):
    evaluate.run(workdir, split="test[:5]", mode="beam", refill=2)
  assert "warning" not in capsys.readouterr().err


def test_command_reports_bad_input_without_traceback(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "transformer.evaluate", "--workdir", str(tmp_path / "none")],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 1
  assert "evaluate: error: workdir" in result.stderr and "does not exist" in result.stderr
  assert "Traceback" not in result.stderr
