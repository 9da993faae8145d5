"""Tests for transformer/evaluate.py: the scores against sacreBLEU and hand counts,
and the command on the tiny trained SCAN workdir (tests/workdirs.py)."""

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import sacrebleu

from tests import process_helpers
from tests.workdirs import Stopped, rnn_workdir, stop_at, trained_workdir
from transformer import data as data_lib
from transformer import evaluate, inference, metrics, results, runtime
from transformer import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained_workdir(tmp_path_factory)


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


def test_a_json_that_cannot_be_written_keeps_the_previous_evaluation_whole(workdir,
                                                                          monkeypatch):
  """The hypotheses took their name before the JSON was written: where the JSON
  could not be (a file the disk would not replace), the new hypotheses stood
  beside the old JSON, which named them as its own. And a directory in the
  JSON's place was found only after the whole decoding."""
  _, path = evaluate.run(workdir, split="test[:3]", mode="greedy", limit=3)
  stem = path[:-len(".json")]
  with open(stem + ".txt", "w") as f:
    f.write("the previous hypotheses\n")
  before = open(path).read()
  write_atomic = evaluate.files.write_atomic

  def refused(target, data):
    if target.endswith(".json"):
      raise PermissionError(1, "Operation not permitted", target)
    return write_atomic(target, data)

  monkeypatch.setattr(evaluate.files, "write_atomic", refused)
  with pytest.raises(PermissionError):
    evaluate.run(workdir, split="test[:3]", mode="greedy", limit=3)
  assert open(stem + ".txt").read() == "the previous hypotheses\n"
  assert open(path).read() == before
  assert not os.path.exists(stem + ".txt.previous")
  assert len(open(stem + ".txt.partial").read().splitlines()) == 3  # The new ones, kept.
  os.remove(stem + ".txt.partial")
  monkeypatch.undo()

  def full(out, target):  # The hypotheses' last flush fails: no rename, no JSON.
    raise OSError(28, "No space left on device", target)

  monkeypatch.setattr(evaluate.files, "commit_partial", full)
  with pytest.raises(OSError, match="No space left"):
    evaluate.run(workdir, split="test[:3]", mode="greedy", limit=3)
  assert open(stem + ".txt").read() == "the previous hypotheses\n"
  assert open(path).read() == before and not os.path.exists(stem + ".txt.previous")
  os.remove(stem + ".txt.partial")  # Its flush failed: kept as a stopped run leaves it.
  monkeypatch.undo()
  os.remove(path)
  os.mkdir(path)
  stop_at(monkeypatch, "restore")
  try:
    with pytest.raises(ValueError, match=re.escape(
        f"{path} is a directory, where evaluate writes its results: move it")):
      evaluate.run(workdir, split="test[:3]", mode="greedy", limit=3)  # Before the restore.
  finally:
    os.rmdir(path)


def test_another_output_limit_does_not_replace_the_configs_evaluation(workdir):
  """--max_extra_len other than config.decode's writes a file of its own: the
  evaluation at the config's limit, which result tables read, stays. (Three
  sentences: one batch, whose programs at the config's limit the test above has
  compiled.)"""
  default, default_path = evaluate.run(workdir, split="test[:3]", mode="greedy")
  short, short_path = evaluate.run(workdir, split="test[:3]", mode="greedy", max_extra_len=1)
  assert short_path.endswith("_greedy-x1.json") and short_path != default_path
  with open(default_path) as f:
    assert json.load(f)["max_extra_len"] == default["max_extra_len"] != 1
  assert short["max_extra_len"] == 1
  again, path = evaluate.run(workdir, split="test[:3]", mode="greedy",
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
  """--chunk_lines 10 over 30 sentences (three chunks; the killed run's test
  decodes the same batches, and the perplexity's test evaluates them): the same
  hypotheses, in order, and the same scores and perplexity as the 30 in one
  chunk; no .partial file is left."""
  whole, path = evaluate.run(workdir, split="test[:40]", mode="greedy", limit=30)
  with open(whole["hypotheses_file"]) as f:
    hypotheses = f.read()
  chunked, _ = evaluate.run(workdir, split="test[:40]", mode="greedy", limit=30,
                            chunk_lines=10)
  with open(chunked["hypotheses_file"]) as f:
    assert f.read() == hypotheses
  assert chunked["metrics"] == whole["metrics"]
  assert chunked["num_sentences"] == whole["num_sentences"] == 30
  assert chunked["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)
  assert chunked["batches"] > whole["batches"]
  assert not [n for n in os.listdir(workdir) if n.endswith(".partial")]
  # The first 25 examples, cut inside the third chunk.
  limited, _ = evaluate.run(workdir, split="test[:40]", mode="greedy", limit=25,
                            chunk_lines=10)
  with open(limited["hypotheses_file"]) as f:
    assert f.read() == "".join(hypotheses.splitlines(keepends=True)[:25])


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


def test_perplexity_is_the_one_training_logged(workdir, monkeypatch):
  """Per target token, without label smoothing: on training's eval split and last
  checkpoint, evaluate reports the eval/perplexity training logged at its last step.
  (The perplexity is the teacher-forced loss's: decoding, whose programs for the
  200 sentences no other test needs, is stood in for by empty hypotheses.)"""
  monkeypatch.setattr(inference, "decode_examples",
                      lambda model, params, examples, *args, **kwargs: [""] * len(examples))
  result, _ = evaluate.run(workdir, split="test[:200]", mode="greedy")
  assert result["num_sentences"] == 200
  logged = results.last_scalars(workdir, ["eval/perplexity"])["eval/perplexity"]
  assert result["step"] == 20
  assert result["perplexity"] == pytest.approx(logged, rel=1e-5)
  assert result["perplexity"] == pytest.approx(np.exp(result["nll"]), rel=1e-6)


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
  edited = rnn_workdir(tmp_path, "edited", refill=3)  # Its config.json names the field.
  with pytest.raises(ValueError, match=re.escape(
      f"{edited}/config.json: config.decode.refill=3: needs a Transformer "
      "(model.architecture='rnn': its decoding cannot restart rows)")):
    evaluate.run(edited, mode="beam")
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


def test_a_flag_at_odds_with_the_workdirs_compact_or_refill_names_where_each_is(
    tmp_path, monkeypatch):
  """--refill 4 on a workdir trained with decode.compact=2 said 'compact (2) and
  refill (4) are two ways...', not where the 2 came from."""
  stop_at(monkeypatch, "restore", "load_tokenizer")
  workdir = rnn_workdir(tmp_path, "compact", compact=2)
  with pytest.raises(ValueError, match=re.escape(
      "--refill 4, and the workdir's config.decode.compact is 2: two ways to spend fewer "
      "steps on finished sentences; add --compact 0")):
    evaluate.run(workdir, mode="beam", refill=4)
  with pytest.raises(ValueError, match=re.escape("compact (2) and refill (4) are two ways")):
    evaluate.run(workdir, mode="beam", refill=4, compact=2)  # Both given: as given.
  with pytest.raises(Stopped):
    evaluate.run(workdir, mode="beam", compact=1)


def test_command_reports_bad_input_without_traceback(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "transformer.evaluate", "--workdir", str(tmp_path / "none")],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 1
  assert "evaluate: error: workdir" in result.stderr and "does not exist" in result.stderr
  assert "Traceback" not in result.stderr


def test_a_full_disk_under_stdout_is_one_line_and_the_results_are_kept(workdir, tmp_path):
  """The results' print came after the command's one-line errors: on a full
  disk under stdout, a traceback, Python's note at exit and status 120."""
  copy = shutil.copytree(workdir, tmp_path / "w")
  with open("/dev/full", "w") as full:
    result = subprocess.run(
        [sys.executable, "-m", "transformer.evaluate", "--workdir", str(copy), "--mode",
         "greedy", "--limit", "2"], cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True,
        timeout=300, env=process_helpers.command_env())
  assert result.returncode == 1 and re.search(
      r"\nevaluate: error: \[Errno 28\] No space left on device: '<stdout>'\n$",
      "\n" + result.stderr), result.stderr[-3000:]
  assert (copy / "eval_test_latest_greedy-n2.json").exists()


def test_the_perplexity_counts_every_batch_of_the_split(workdir):
  """steps.evaluate_loss (training's eval/perplexity, evaluate's perplexity)
  sums over every batch: a split cut into many small batches counts every target
  token, and has the perplexity of the split in one batch. (evaluate's own loss
  program, on 30 sentences: batches of 64 tokens have the shapes of the chunk
  test's batches, which evaluate has compiled.)"""
  import copy  # pylint: disable=import-outside-toplevel
  import functools  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from transformer import steps  # pylint: disable=import-outside-toplevel
  restored = workdir_lib.restore(workdir)
  examples = next(data_lib.iter_eval(restored.config.data, restored.tokenizer, "test[:30]",
                                     10**6))[0]
  eval_fn = jax.jit(functools.partial(steps.eval_step, model=restored.model,
                                      label_smoothing=restored.config.train.label_smoothing))

  def loss(tokens_per_batch):
    config = copy.deepcopy(restored.config)
    config.data.tokens_per_batch = tokens_per_batch
    return steps.evaluate_loss(eval_fn, restored.params, examples, config, restored.mesh)

  small, whole = loss(64), loss(10**5)
  count = lambda tokens: len(list(data_lib.eval_batches(
      examples, tokens, max_length=restored.config.data.max_length)))
  assert count(64) > 2 * count(10**5)  # Many small batches (11), against 5.
  assert small["tokens"] == whole["tokens"] == sum(len(t) for _, t in examples)
  assert small["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)
