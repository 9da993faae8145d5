"""Tests for transformer/translate.py: order and line count survive batching by
length, empty/over-long/unknown input never crashes, files and plots are written."""

import io
import os
import re
import subprocess
import sys
import time

from hypothesis import HealthCheck, given, settings, strategies as st
import numpy as np
import pytest

from tests import process_helpers
from tests.workdirs import Stopped, rnn_workdir, stop_at, trained_workdir
from tests.test_plots import assert_png
from transformer import decode, inference, plots, translate
from transformer import workdir as workdir_lib
from transformer.data import tokenizer as tokenizer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERLONG = " ".join(["walk", "left"] * 40)  # 80 words > the 64-token source limit.
LINES = ["walk twice", "", "jump left after look right thrice", "   ", "run ☃ opposite left",
         OVERLONG, "look"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained_workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def restored(workdir):
  return workdir_lib.restore(workdir)


def _translate(restored, lines, **kw):
  return translate.translate_lines(restored.model, restored.params, restored.tokenizer,
                                   restored.config, restored.mesh, lines, **kw)


def test_outputs_follow_the_inputs_through_length_batching(restored, monkeypatch, capsys):
  # An echoing "model" (output = its own source) makes any mix-up of rows visible:
  # the lines fall in three length buckets and come back in input order.
  monkeypatch.setattr(inference, "_COMPILED", {})
  monkeypatch.setattr(decode, "encode_and_decode", lambda model, params, inputs, **kw: inputs)
  outputs = _translate(restored, LINES, mode="greedy")
  assert len(outputs) == len(LINES)
  assert outputs[:2] == ["walk twice", ""] and outputs[3] == ""
  assert outputs[2] == "jump left after look right thrice" and outputs[6] == "look"
  assert outputs[4].split()[0] == "run" and "⁇" in outputs[4]  # The snowman is UNK.
  limit = translate.source_limit(restored.config)
  assert outputs[5].split() == OVERLONG.split()[:limit - 1]
  assert "line 6 has 80 tokens; keeping the first 63" in capsys.readouterr().err


def test_real_model_keeps_count_empties_and_order(restored, capsys):
  outputs = _translate(restored, LINES, mode="greedy")
  assert len(outputs) == len(LINES) and outputs[1] == outputs[3] == ""
  assert "line 6 has 80 tokens" in capsys.readouterr().err
  # The same sentences in reverse order give the same translations, reversed.
  assert _translate(restored, LINES[::-1], mode="greedy") == outputs[::-1]


def test_only_empty_input(restored):
  assert _translate(restored, ["", "  "], mode="greedy") == ["", ""]
  assert _translate(restored, [], mode="greedy") == []


def test_iter_lines_keeps_count_and_survives_bad_bytes(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"walk\r\n\nlook \xff left\nx\xe2\x80\xa8y\n")
  bad_bytes = translate.LineWarnings("were not valid UTF-8")
  assert list(translate.iter_lines(str(path), bad_bytes)) == [
      "walk", "", "look \ufffd left", "x\u2028y"]
  assert (bad_bytes.count, bad_bytes.first) == (1, 3)  # Counted, not silent.
  # A byte-order mark opening the file is dropped, as the training reader drops it.
  path.write_bytes("\ufeffwalk\n\ufeffwalk\n".encode())
  assert list(translate.iter_lines(str(path))) == ["walk", "\ufeffwalk"]


def test_run_samples_into_a_file_and_plots_attention(workdir, tmp_path):
  src, out, png = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "att.png"
  src.write_text("\n".join(LINES[:5]) + "\n")
  out.write_text("old\n")
  outputs = translate.run(workdir, str(src), str(out), mode="sample", seed=3,
                          plot_attention=str(png), head="avg")
  assert out.read_text() == "".join(o + "\n" for o in outputs)
  assert len(outputs) == 5 and outputs[1] == outputs[3] == ""
  assert_png(str(png))
  assert sorted(os.listdir(tmp_path)) == ["att.png", "in.txt", "out.txt"]


def test_the_plot_is_of_the_layer_asked_for_the_first_translation(workdir, tmp_path,
                                                                   monkeypatch):
  """--layer 0 draws the cross-attention weights of decoder layer 0 (as
  plots.cross_attention_weights gives them, tested in test_plots) over the first
  line and its output, titled with that layer."""
  computed, drawn = [], []
  weights_of = plots.cross_attention_weights

  def recorded(model, params, source_ids, output_ids, *layer):
    computed.append((source_ids, output_ids, layer))
    return weights_of(model, params, source_ids, output_ids, *layer)

  monkeypatch.setattr(plots, "cross_attention_weights", recorded)
  monkeypatch.setattr(plots, "plot_attention",
                      lambda weights, source, output, path, head, title: drawn.append(
                          (np.asarray(weights), source, output, title)))
  src = tmp_path / "in.txt"
  src.write_text(LINES[0] + "\n" + LINES[2] + "\n")
  (first, _) = translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="greedy",
                             plot_attention=str(tmp_path / "a.png"), layer=0)
  (source_ids, output_ids, layer), = computed
  (weights, source, output, title), = drawn
  assert layer == (0,) and title.endswith("decoder layer 0")
  assert weights.shape[1:] == (len(output), len(source)) == (len(output_ids), len(source_ids))
  tokenizer = workdir_lib.restore(workdir).tokenizer
  assert (tokenizer.decode(list(source_ids)), tokenizer.decode(list(output_ids))) == (
      LINES[0], first)


def test_flags_for_another_mode_or_no_plot_are_warned_of_and_blank_lines_plot_nothing(
    workdir, tmp_path, capsys):
  src = tmp_path / "in.txt"
  src.write_text(LINES[0] + "\n")
  translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="greedy", seed=5)
  assert ("--seed and --temperature act in --mode sample only; --mode greedy ignores them"
          in capsys.readouterr().err)
  translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="greedy", layer=0, head="3")
  assert "--layer and --head choose what --plot_attention draws" in capsys.readouterr().err
  src.write_text(" \n\t\n")
  with pytest.raises(ValueError, match="every input line is empty or encodes to no tokens"):
    translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="greedy",
                  plot_attention=str(tmp_path / "a.png"))


def test_compact_and_refill_outside_beam_search_are_warned_of(workdir, tmp_path, monkeypatch,
                                                              capsys):
  """Greedy search and sampling ignored --compact and --refill without a word; the
  warning comes before any work, beside --seed's, as do the search settings' errors."""
  stop_at(monkeypatch, "restore")
  src = tmp_path / "in.txt"
  src.write_text(LINES[0] + "\n")
  for mode, kw in (("greedy", {"refill": 2}), ("sample", {"compact": 1})):
    with pytest.raises(Stopped):
      translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode=mode, **kw)
    assert (f"translate: warning: --compact and --refill act in --mode beam only; --mode {mode} "
            "ignores them") in capsys.readouterr().err
  with pytest.raises(Stopped):
    translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="beam", refill=2)
  assert "warning" not in capsys.readouterr().err
  with pytest.raises(ValueError, match=r"compact \(1\) and refill \(2\)"):
    translate.run(workdir, str(src), str(tmp_path / "out.txt"), compact=1, refill=2)


def test_the_rnn_refuses_refill_before_any_work(tmp_path, monkeypatch):
  """On an RNN workdir --refill failed at compile time naming the items searched at
  once (refill=8 for --refill 3); it is refused first, naming model.architecture."""
  stop_at(monkeypatch, "restore")
  workdir = rnn_workdir(tmp_path)
  src, out = tmp_path / "in.txt", tmp_path / "out.txt"
  src.write_text("walk twice\n")
  with pytest.raises(ValueError, match=re.escape(
      "--refill 3: model.architecture='rnn' cannot refill beam search rows")):
    translate.run(workdir, str(src), str(out), refill=3, tokens_per_batch=64)
  with pytest.raises(Stopped):  # Greedy search ignores it.
    translate.run(workdir, str(src), str(out), mode="greedy", refill=3)
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "rnn"]


def test_the_rnn_refuses_a_layer_to_plot_before_any_work(tmp_path, monkeypatch):
  """--layer 7 on an RNN workdir was ignored (the plot drawn): the RNN has one
  attention. It is refused first, naming model.architecture."""
  stop_at(monkeypatch, "restore")
  workdir = rnn_workdir(tmp_path)
  src, out = tmp_path / "in.txt", tmp_path / "out.txt"
  src.write_text("walk twice\n")
  for layer in (7, 0):
    with pytest.raises(ValueError, match=re.escape(
        f"--layer {layer}: model.architecture='rnn' has one attention")):
      translate.run(workdir, str(src), str(out), plot_attention=str(tmp_path / "a.png"),
                    layer=layer)
  with pytest.raises(Stopped):  # The default layer.
    translate.run(workdir, str(src), str(out), mode="greedy",
                  plot_attention=str(tmp_path / "a.png"))
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "rnn"]


def test_run_reads_stdin_and_writes_stdout(workdir, monkeypatch, capsys):
  stdin = io.TextIOWrapper(io.BytesIO("walk twice\n\njump\nlook left\nrun\n".encode()))
  monkeypatch.setattr(sys, "stdin", stdin)
  outputs = translate.run(workdir, "-", "-", mode="greedy")
  assert capsys.readouterr().out == "".join(o + "\n" for o in outputs)
  assert len(outputs) == 5 and outputs[1] == ""
  assert all(w.startswith("I_") for w in " ".join(outputs).split())


def test_stdout_is_written_in_utf8_whatever_the_locale_s_encoding(workdir, monkeypatch):
  """Input is read as UTF-8 and --output files are UTF-8; so is stdout, also where the
  locale's encoding (here Latin-1) lacks a character of the translation."""
  decode = tokenizer_lib.Tokenizer.decode
  monkeypatch.setattr(tokenizer_lib.Tokenizer, "decode",
                      lambda self, ids: decode(self, ids) + " €☃")
  raw = io.BytesIO()
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"walk twice\njump\n")))
  monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="latin-1"))
  outputs = translate.run(workdir, "-", "-", mode="greedy")
  sys.stdout.flush()
  assert raw.getvalue().decode("utf-8") == "".join(o + "\n" for o in outputs)
  assert len(outputs) == 2 and all(o.endswith(" €☃") for o in outputs)
  monkeypatch.setattr(sys, "stdout", io.StringIO())  # No encoding: written as it is.
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"walk twice\n")))
  assert translate.run(workdir, "-", "-", mode="greedy")[0] + "\n" == sys.stdout.getvalue()


def test_bad_arguments_fail_before_any_work(workdir, tmp_path, monkeypatch):
  out = tmp_path / "out.txt"
  out.write_text("keep me\n")
  with pytest.raises(ValueError, match="head 5 out of range"):
    translate.run(workdir, "-", str(out), plot_attention=str(tmp_path / "a.png"), head="5")
  with pytest.raises(ValueError, match="layer 3 out of range"):
    translate.run(workdir, "-", str(out), plot_attention=str(tmp_path / "a.png"), layer=3)
  with pytest.raises(ValueError, match="checkpoint must be"):
    translate.run(workdir, "-", str(out), checkpoint="newest")
  with pytest.raises(ValueError, match=r"--plot_attention '.*': is a directory"):
    translate.run(workdir, "-", str(out), plot_attention=str(tmp_path))
  with pytest.raises(ValueError, match=r"--plot_attention '.*': its folder '.*none' does not "
                     "exist"):
    translate.run(workdir, "-", str(out), plot_attention=str(tmp_path / "none" / "a.png"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    translate.run(str(tmp_path / "none"), "-", str(out))
  with monkeypatch.context() as patch, pytest.raises(ValueError, match=(
      r"^--input -: stdin is closed; give the sentences on stdin or a file as --input$")):
    patch.setattr(sys, "stdin", None)  # As Python has it where descriptor 0 is closed.
    translate.run(workdir, "-", str(out))  # Was an AttributeError's traceback.
  with pytest.raises(ValueError, match="'.*out.txt' is the input: writing it would empty"):
    translate.run(workdir, str(out), os.path.join(str(tmp_path), ".", "out.txt"))
  # The input as the output's .partial, through a symlink, or on stdin.
  partial = tmp_path / "new.txt.partial"
  partial.write_text("keep me too\n")
  with pytest.raises(ValueError, match=r"--output '.*new.txt.partial' is the input"):
    translate.run(workdir, str(partial), str(tmp_path / "new.txt"))
  (tmp_path / "link.txt").symlink_to(out)
  with open(out, encoding="utf-8") as stdin, monkeypatch.context() as patch:
    patch.setattr(sys, "stdin", stdin)
    with pytest.raises(ValueError, match=r"--output '.*link.txt' is the input \(stdin\)"):
      translate.run(workdir, "-", str(tmp_path / "link.txt"))
  with pytest.raises(ValueError, match=r"--plot_attention '.*out.txt' is the --output file"):
    translate.run(workdir, "-", str(out), plot_attention=str(out))
  with pytest.raises(ValueError, match=r"--output '.*x.txt': its folder '.*none' does not exist"):
    translate.run(workdir, "-", str(tmp_path / "none" / "x.txt"))
  # Both were found out after the whole input: the output's rename failed (leaving
  # '.partial' in the current folder), and no plot was drawn, silently.
  with pytest.raises(ValueError, match=r"^--output is empty; give a file name$"):
    translate.run(workdir, "-", "")
  with pytest.raises(ValueError, match=r"^--plot_attention is empty; give an image file"):
    translate.run(workdir, "-", str(out), plot_attention="")
  with monkeypatch.context() as patch:  # stdin reaches process 0 alone.
    patch.setattr(translate.jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="--input -: every process of a multi-process job"):
      translate.run(workdir, "-", str(out))
  for temperature in (-1.0, float("nan"), float("inf")):
    with pytest.raises(ValueError,
                       match=r"temperature must be a finite number >= 0 \(0 = greedy\)"):
      translate.run(workdir, "-", str(out), mode="sample", temperature=temperature)
  with pytest.raises(ValueError, match=r"seed must be in \[0, 2\^32\)"):
    translate.run(workdir, "-", str(out), mode="sample", seed=2**32)
  # Huge sizes failed deep inside: an OverflowError's traceback, an islice error.
  with pytest.raises(ValueError, match=r"^beam_size must be < 2\^31, got 2147483648$"):
    translate.run(workdir, "-", str(out), beam_size=2**31)
  with pytest.raises(ValueError, match=r"^chunk_lines must be in \[1, 2\^31\), got 0$"):
    translate.run(workdir, "-", str(out), chunk_lines=0)
  with pytest.raises(ValueError, match=r"^chunk_lines must be in \[1, 2\^31\), got 10{20}$"):
    translate.run(workdir, "-", str(out), chunk_lines=10**20)
  assert out.read_text() == "keep me\n" and partial.read_text() == "keep me too\n"


def test_an_existing_output_is_replaced_only_by_a_complete_translation(workdir, tmp_path,
                                                                       monkeypatch):
  """The output is written as OUTPUT.partial and renamed once every line is
  translated: a run that fails (an input that is a directory; a failure
  mid-stream) leaves an existing output file as it was, and what it wrote in
  the .partial file."""
  out = tmp_path / "out.txt"
  out.write_text("keep me\n")
  with pytest.raises(IsADirectoryError):
    translate.run(workdir, str(tmp_path), str(out), mode="greedy")
  assert out.read_text() == "keep me\n"
  assert not (tmp_path / "out.txt.partial").exists()  # Nothing was written.
  src = tmp_path / "in.txt"
  src.write_text("walk twice\njump\nlook left\n")
  translate_ids = translate.translate_ids
  calls = []

  def fails_on_the_second_chunk(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return translate_ids(*args, **kwargs)

  monkeypatch.setattr(translate, "translate_ids", fails_on_the_second_chunk)
  with pytest.raises(KeyboardInterrupt):
    translate.run(workdir, str(src), str(out), mode="greedy", chunk_lines=2)
  assert out.read_text() == "keep me\n"
  assert len((tmp_path / "out.txt.partial").read_text().splitlines()) == 2
  monkeypatch.setattr(translate, "translate_ids", translate_ids)
  outputs = translate.run(workdir, str(src), str(out), mode="greedy", chunk_lines=2)
  assert out.read_text() == "".join(o + "\n" for o in outputs) and len(outputs) == 3
  assert not (tmp_path / "out.txt.partial").exists()
  # A symlink (or a device, a pipe) is written through, not renamed over.
  link = tmp_path / "link.txt"
  link.symlink_to(tmp_path / "target.txt")
  translate.run(workdir, str(src), str(link), mode="greedy")
  assert link.is_symlink() and (tmp_path / "target.txt").read_text() == out.read_text()


def test_command_reports_bad_input_without_traceback(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "transformer.translate", "--workdir", str(tmp_path / "none"),
       "--head", "avg", "--layer", "0", "--plot_attention", "x.png", "--seed", "1",
       "--temperature", "0.5", "--input", "-", "--output", "-"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 1
  assert "translate: error: workdir" in result.stderr and "does not exist" in result.stderr
  assert "Traceback" not in result.stderr


def test_command_keeps_library_info_off_stderr(workdir):
  """A filter's stderr is for its warnings: Orbax logs a dozen INFO lines per restore."""
  result = subprocess.run(
      [sys.executable, "-m", "transformer.translate", "--workdir", workdir, "--mode", "greedy"],
      input="walk twice\n\njump\n", cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 0, result.stderr[-3000:]
  assert len(result.stdout.splitlines()) == 3
  assert not [l for l in result.stderr.splitlines() if l.startswith("I")], result.stderr


def test_chunks_keep_count_order_and_line_numbers(workdir, tmp_path, capsys):
  """Translated 2 lines at a time (--chunk_lines 2): the same outputs as in one
  chunk, in order, and the overlong line's warning still names line 6."""
  src = tmp_path / "in.txt"
  src.write_text("\n".join(LINES) + "\n")
  whole = translate.run(workdir, str(src), str(tmp_path / "whole.txt"), mode="greedy")
  capsys.readouterr()
  chunked = translate.run(workdir, str(src), str(tmp_path / "chunked.txt"), mode="greedy",
                          chunk_lines=2)
  assert chunked == whole and len(whole) == len(LINES)
  assert (tmp_path / "chunked.txt").read_text() == "".join(o + "\n" for o in whole)
  assert "line 6 has 80 tokens" in capsys.readouterr().err
  assert translate.run(workdir, str(src), str(tmp_path / "n.txt"), mode="greedy",
                       chunk_lines=3, collect=False) == len(LINES)


def test_samples_depend_on_the_seed_and_the_line_not_on_chunks_or_batches(workdir, tmp_path):
  """--mode sample draws each line with a key of its own (the seed's, folded with
  the line number), so chunking the input, smaller batches or one batch at a
  time give the same samples (as other device counts do: tests/sharded_step_check.py);
  another seed gives others."""
  src = tmp_path / "in.txt"
  src.write_text("\n".join(LINES * 3) + "\n")
  run = lambda name, **kw: translate.run(workdir, str(src), str(tmp_path / name),
                                         mode="sample", temperature=3.0, **kw)
  whole = run("whole.txt", seed=4)
  assert run("chunked.txt", seed=4, chunk_lines=2) == whole
  assert run("small.txt", seed=4, tokens_per_batch=8, concurrent_batches=1) == whole
  other = run("other.txt", seed=5)
  assert other != whole and len(other) == len(whole)
  # Repeats of a line are drawn apart.
  n = len(LINES)
  assert any(len(set(whole[i::n])) > 1 for i in range(n) if whole[i])
  # Temperature 0 is the argmax: greedy search's translations.
  assert (translate.run(workdir, str(src), str(tmp_path / "t0.txt"), mode="sample",
                        temperature=0.0)
          == translate.run(workdir, str(src), str(tmp_path / "g.txt"), mode="greedy"))


def test_command_streams_each_line_as_it_arrives(workdir):
  """With --chunk_lines 1 the answer to a line comes out (flushed) before the
  next line is even sent: one output line per input line, in order."""
  import select  # pylint: disable=g-import-not-at-top
  process = subprocess.Popen(
      [sys.executable, "-m", "transformer.translate", "--workdir", workdir, "--mode", "greedy",
       "--chunk_lines", "1"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  try:
    answers = []
    for line in ("walk twice", "", "jump left"):
      process.stdin.write(line + "\n")
      process.stdin.flush()
      ready, _, _ = select.select([process.stdout], [], [], 240)
      assert ready, "no output line before the next input line"
      answers.append(process.stdout.readline())
    process.stdin.close()
    assert process.wait(timeout=60) == 0, process.stderr.read()[-3000:]
    assert process.stdout.read() == ""
  finally:
    process.kill()
  assert answers[1] == "\n" and all(a.endswith("\n") and a.strip() for a in answers[::2])


def test_a_sigterm_between_lines_is_one_line_and_keeps_what_was_written(workdir, tmp_path):
  """SIGTERM while translate waits for its next input line: it ended silently by
  SIGTERM's default action. Now one line naming what is kept, status 143; the
  translation already written stays in --output's .partial file."""
  import signal  # pylint: disable=g-import-not-at-top
  out = tmp_path / "out.txt"
  process = subprocess.Popen(
      [sys.executable, "-m", "transformer.translate", "--workdir", workdir, "--mode", "greedy",
       "--chunk_lines", "1", "--output", str(out)], cwd=ROOT, stdin=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  try:
    process.stdin.write("walk twice\n")
    process.stdin.flush()
    partial = tmp_path / "out.txt.partial"
    deadline = time.monotonic() + 240
    while not (partial.exists() and partial.read_text().endswith("\n")):
      assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
      time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    stderr = process.stderr.read()
  finally:
    process.kill()
  assert stderr.splitlines()[-1] == (
      "translate: stopped by SIGTERM; the chunks translated before it were written (a "
      "regular --output file keeps them as FILE.partial)"), stderr
  assert "Traceback" not in stderr and not out.exists()
  assert len(partial.read_text().splitlines()) == 1 and partial.read_text().strip()


def test_a_reader_that_leaves_ends_the_command_by_sigpipe_without_a_word(workdir, tmp_path):
  """`translate | head -1`: the write after head has gone raised BrokenPipeError,
  reported as `translate: error: [Errno 32] Broken pipe`, status 1. A filter
  whose reader leaves ends by SIGPIPE, silently, as a C filter does."""
  import signal  # pylint: disable=g-import-not-at-top
  src = tmp_path / "in.txt"
  src.write_text("walk twice\n" * 400)
  process = subprocess.Popen(
      [sys.executable, "-m", "transformer.translate", "--workdir", workdir, "--mode", "greedy",
       "--chunk_lines", "5", "--input", str(src)], cwd=ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  try:
    assert process.stdout.readline().strip()
    process.stdout.close()  # The reader leaves, as head does.
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == -signal.SIGPIPE
  finally:
    process.kill()
  assert not [l for l in stderr.splitlines() if "error" in l.lower() or "Traceback" in l
              or "Exception" in l], stderr


@pytest.mark.parametrize("closed,status", [(">&-", 1), ("2>&-", 0)])
def test_a_closed_stdout_is_named_and_a_closed_stderr_changes_nothing(workdir, tmp_path,
                                                                     closed, status):
  """Started with stdout closed (`>&-`; Python's sys.stdout is then None), every
  command that restarts itself for the allocator stopped with an AttributeError's
  traceback; so did one with stderr closed (`2>&-`), in the restart's note.
  translate now names a closed stdout as a bad --output, and with stderr closed
  translates as usual."""
  src = tmp_path / "in.txt"
  src.write_text("walk twice\n")
  out = subprocess.run(
      process_helpers.closed_descriptor(closed, "-m", "transformer.translate", "--workdir",
                                        workdir, "--mode", "greedy", "--input", str(src)),
      cwd=ROOT, capture_output=True, text=True, timeout=240,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert out.returncode == status, out.stderr[-3000:]
  if closed == ">&-":
    assert out.stderr.splitlines()[-1] == (
        "translate: error: --output -: stdout is closed; give a file as --output")
    assert "Traceback" not in out.stderr
  else:
    assert len(out.stdout.splitlines()) == 1 and out.stdout.strip()


def test_an_unbuffered_stdout_whose_reader_leaves_mid_write_is_a_broken_pipe(monkeypatch):
  """Under `python -u` (PYTHONUNBUFFERED=1) stdout's text layer handed a chunk of
  translations larger than a pipe holds to one write of the descriptor, and
  dropped what that write did not take: with the reader gone mid-write,
  translate ended with status 0 and no error. With stdout set up as every
  command sets it up (streams.whole_writes), the write after the reader left
  raises BrokenPipeError (a SIGPIPE end, as above)."""
  import threading  # pylint: disable=g-import-not-at-top
  from transformer import files, streams  # pylint: disable=g-import-not-at-top
  read_fd, write_fd = os.pipe()
  out = io.TextIOWrapper(io.FileIO(write_fd, "w"), encoding="utf-8", write_through=True)
  assert isinstance(out.buffer, io.RawIOBase)  # As sys.stdout is under python -u.
  monkeypatch.setattr(sys, "stdout", out)
  streams.whole_writes()
  assert sys.stdout is not out

  def read_a_little_and_leave():
    with open(read_fd, "rb", buffering=0) as reader:
      reader.read(100)

  reader = threading.Thread(target=read_a_little_and_leave)
  reader.start()
  try:
    with pytest.raises(BrokenPipeError):  # 2 MB: far more than a pipe holds.
      files.write_lines(sys.stdout, ["I_WALK I_WALK I_JUMP"] * 100_000)
  finally:
    reader.join(timeout=30)
    for stream in (sys.stdout, out):
      try:
        stream.close()
      except BrokenPipeError:
        pass


def test_line_ends_in_cr_alone_are_refused_and_bad_bytes_warned_of(workdir, tmp_path, capsys):
  """CR line ends made the whole file one line (one output for three inputs),
  which the training data's reader refuses; bad UTF-8 bytes were replaced
  without a word. An existing output stays as it was."""
  src, out = tmp_path / "in.txt", tmp_path / "out.txt"
  out.write_text("keep me\n")
  for text in (b"jump twice\rwalk left\rrun\r", b"jump twice\rwalk left\rrun\n"):
    src.write_bytes(text)  # The second with a final LF, as editors add.
    with pytest.raises(ValueError, match=r"in\.txt:1: lines end in a carriage return \(CR\) "
                       "alone; they must end in LF or CRLF"):
      translate.run(workdir, str(src), str(out), mode="greedy")
    assert out.read_text() == "keep me\n"
  src.write_bytes(b"walk \xff left\r\nrun\nlook\xe2\x80\n")
  assert len(translate.run(workdir, str(src), str(out), mode="greedy")) == 3
  err = capsys.readouterr().err
  assert "warning: line 1 is not valid UTF-8 (invalid start byte at byte 5)" in err
  assert "warning: line 3 is not valid UTF-8 (unexpected end of data at byte 4)" in err
  assert ("warning: 2 of 3 lines were not valid UTF-8 (their bad bytes read as unknown "
          "characters); the first is line 1") in err


def test_many_overlong_lines_are_named_ten_times_then_counted_once(workdir, tmp_path, capsys):
  src = tmp_path / "in.txt"
  src.write_text("look\n" + "".join(OVERLONG + "\n" for _ in range(25)) + "walk\n")
  outputs = translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="greedy",
                          chunk_lines=7)
  assert len(outputs) == 27
  err = capsys.readouterr().err
  named = [int(n) for n in re.findall(r"warning: line (\d+) has 80 tokens", err)]
  assert named == list(range(2, 12))  # The first ten, across chunks of 7.
  assert ("warning: 25 of 27 lines were longer than the source limit of 64 tokens (EOS "
          "included) and were truncated; the first is line 2") in err
  # A budget under one row of the widest batch (64 tokens): one row a batch there.
  assert translate.run(workdir, str(src), str(tmp_path / "small.txt"), mode="greedy",
                       chunk_lines=7, tokens_per_batch=8) == outputs


# Lines as a file can hold them: any Unicode but the line end, control characters,
# right-to-left text and emoji included, short and over-long.
LINE = st.one_of(
    st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)),
            max_size=30),
    st.lists(st.sampled_from(["walk", "left", "שלום", "🙂", "\u202e", "\x00", "\r", "twice"]),
             min_size=60, max_size=90).map(" ".join))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, max_size=12))
def test_arbitrary_unicode_gives_one_line_per_line_and_counts_the_overlong(restored, lines):
  """With an echoing model (its output is its source), over any lines: one output
  per input line, none holding a line end; a blank line gives ''; the lines over
  the source limit are exactly those the warning counts."""
  limit = translate.source_limit(restored.config)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(inference, "_COMPILED", {})
    patch.setattr(decode, "encode_and_decode", lambda model, params, inputs, **kw: inputs)
    overlong = translate.Overlong(limit)
    outputs = _translate(restored, lines, mode="greedy", overlong=overlong)
  assert len(outputs) == len(lines)
  for line, out in zip(lines, outputs):
    assert "\n" not in out and (out == "" if not line.strip() else True)
  tokens = restored.tokenizer.encode_batch([line.strip() for line in lines])
  assert overlong.count == sum(len(ids) + 1 > limit for ids in tokens)


def test_help_lists_the_decoding_flags_translate_shares_with_evaluate():
  """--help listed translate's own flags alone: --workdir, --mode, --checkpoint
  and the other decoding flags showed only under --helpfull. Starting translate
  does not import matplotlib (plots.pyplot: a large part of the start-up)."""
  out = subprocess.run([sys.executable, "-X", "importtime", "-m", "transformer.translate",
                        "--help"], cwd=ROOT, capture_output=True, text=True)
  listed = set(re.findall(r"^\s+--(\w+):", out.stdout + out.stderr, re.M))
  assert {"workdir", "checkpoint", "mode", "beam_size", "alpha", "max_extra_len",
          "tokens_per_batch", "chunk_lines", "compact", "refill", "input", "output",
          "temperature", "seed"} <= listed, out.stdout[-3000:]
  imported = re.findall(r"^import time: .*\| +(\S+)$", out.stderr, re.M)
  assert "jax" in imported and "matplotlib" not in imported


def test_the_plot_is_of_the_first_non_empty_line_whatever_the_chunks(workdir, tmp_path,
                                                                     monkeypatch):
  """--plot_attention draws the first non-empty line of the input, also where the
  input is read in chunks (--chunk_lines 1: a blank line, then one chunk a line)."""
  computed = []
  monkeypatch.setattr(plots, "cross_attention_weights",
                      lambda model, params, source_ids, output_ids, *layer: computed.append(
                          source_ids) or np.ones((1, len(output_ids), len(source_ids))))
  monkeypatch.setattr(plots, "plot_attention", lambda *args, **kwargs: None)
  src = tmp_path / "in.txt"
  src.write_text("\n" + LINES[0] + "\n" + LINES[2] + "\n" + LINES[6] + "\n")
  translate.run(workdir, str(src), str(tmp_path / "out.txt"), mode="greedy",
                plot_attention=str(tmp_path / "a.png"), chunk_lines=1)
  (source_ids,) = computed
  tokenizer = workdir_lib.restore(workdir).tokenizer
  assert tokenizer.decode(list(source_ids)) == LINES[0]


@pytest.mark.parametrize("field", ["model.max_len", "data.max_length"])
def test_sources_are_cut_to_the_smaller_of_the_positions_and_the_training_length(
    restored, monkeypatch, capsys, field):
  """The source limit is the smaller of model.max_len (positions must exist) and
  data.max_length (the longest source training saw): an over-long line is cut to
  it whichever of the two is smaller. An echoing model shows the source decoded."""
  import copy  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(inference, "_COMPILED", {})
  monkeypatch.setattr(decode, "encode_and_decode", lambda model, params, inputs, **kw: inputs)
  config = copy.deepcopy(restored.config)
  section, name = field.split(".")
  config[section][name] = 16  # The other stays 64.
  (out,) = translate.translate_lines(restored.model, restored.params, restored.tokenizer,
                                     config, restored.mesh, [OVERLONG], mode="greedy")
  assert out.split() == OVERLONG.split()[:15]
  assert "line 1 has 80 tokens; keeping the first 15" in capsys.readouterr().err
