"""Tests for transformer/results.py: the rows and tables --collect builds from
variants' workdirs (faked: config, status, checkpoints, scalars, evaluations),
with blanks, notes and errors where a workdir holds no figure or a damaged one."""

import csv
import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.helpers import MULTI30K, ROOT, fake_workdir, write_sweep
from transformer import lock, results, sweep as sweep_lib, sweep_run
from transformer import workdir as workdir_lib


def test_a_damaged_status_or_evaluation_file_is_named_and_left_blank(tmp_path, caplog):
  """A truncated sweep_status.json and an eval JSON that is not an object: the
  row keeps what the rest of the workdir holds (steps from the checkpoints, the
  other evaluation), and a warning names each file."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=300"])
  variant_dir = str(tmp_path / "runs" / "base")
  fake_workdir(variant_dir, sweep.variants[0].config, checkpoints=[100, 300], evaluations=[
      {"split": "val", "mode": "greedy", "step": 300, "metrics": {"bleu": 21.25}}])
  with open(os.path.join(variant_dir, results.STATUS_FILE), "w") as f:
    f.write('{"status": "fini')
  with open(os.path.join(variant_dir, "eval_9.json"), "w") as f:
    f.write("[1, 2]")
  with caplog.at_level(logging.WARNING):
    row = results.variant_row(sweep.variants[0], variant_dir)
  assert (row["status"], row["steps"], row["dev_bleu_greedy"]) == (None, 300, 21.25)
  assert f"Skipping {variant_dir}/{results.STATUS_FILE}: not valid JSON" in caplog.text
  assert f"Skipping {variant_dir}/eval_9.json: a list, not a JSON object" in caplog.text


@pytest.mark.parametrize("status, evaluation, warned", [
    ({"status": "finished", "wall_seconds": "abc"}, {"metrics": {"bleu": "x"}},
     ["sweep_status.json: its wall_seconds is 'abc', not a number of seconds",
      "eval_9.json: its metrics' bleu is 'x', not a number"]),
    ({"status": "finished", "overrides": 5}, {"metrics": [1]},
     ["sweep_status.json: its overrides is 5, not a list of texts",
      "eval_9.json: its metrics is [1], not an object of figures"]),
    ({"status": "finished", "wall_seconds": float("nan")}, {"perplexity": "low"},
     ["sweep_status.json: its wall_seconds is nan, not a number of seconds",
      "eval_9.json: its perplexity is 'low', not a number"]),
])
def test_a_figure_of_the_wrong_kind_is_named_and_left_blank(status, evaluation, warned,
                                                             tmp_path, caplog):
  """A hand-edited status or evaluate JSON with a field of the wrong kind stopped
  --collect, and no table was written: a traceback (a text score multiplied, a
  list's .get, a number of overrides iterated), or a line naming no file."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=300"])
  variant_dir = str(tmp_path / "runs" / "base")
  fake_workdir(variant_dir, sweep.variants[0].config, checkpoints=[300], evaluations=[
      {"split": "val", "mode": "greedy", "step": 300, "metrics": {"bleu": 21.25}}])
  with open(os.path.join(variant_dir, results.STATUS_FILE), "w") as f:
    json.dump(status, f)
  with open(os.path.join(variant_dir, "eval_9.json"), "w") as f:
    json.dump({"split": "test_2016_flickr", "mode": "greedy", "step": 300, **evaluation}, f)
  with caplog.at_level(logging.WARNING):
    assert results.read_statuses(str(tmp_path / "runs")) == {"base": {}}
    row = results.variant_row(sweep.variants[0], variant_dir)
  assert (row["status"], row["wall_seconds"], row["dev_bleu_greedy"], row.get(
      "test_bleu_greedy")) == (None, None, 21.25, None)
  for line in warned:
    assert f"Skipping {variant_dir}/{line}" in caplog.text, caplog.text
  results.to_markdown([row], "bleu", "t")  # Formats, as it did not.


def _save_best(variant_dir, step, metrics):
  """A kept best checkpoint as results reads it: its step's folder and the
  metrics saved with it (Orbax's <step>/metrics/metrics)."""
  folder = os.path.join(variant_dir, "checkpoints_best", str(step), "metrics")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "metrics"), "w") as f:
    json.dump(metrics, f)


def _save_average(variant_dir, averaged_steps):
  """A kept average as average_checkpoints leaves it: its newest step's folder
  and averaged.json."""
  folder = os.path.join(variant_dir, "checkpoints_averaged")
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(os.path.join(folder, str(averaged_steps[-1])))
  with open(os.path.join(folder, "averaged.json"), "w") as f:
    json.dump({"step": averaged_steps[-1], "averaged_steps": averaged_steps,
               "last": len(averaged_steps)}, f)


def test_evaluations_of_a_replaced_best_or_without_metrics_are_left_blank(tmp_path):
  """An evaluation of `best` when it was step 300, now that the kept best is
  600, is stale and left out, as one of `latest` at an older step is; an
  evaluation without metrics (an older format) leaves its figure blank instead
  of stopping the table."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=600"])
  variant_dir = str(tmp_path / "runs" / "base")
  fake_workdir(variant_dir, sweep.variants[0].config, checkpoints=[600], evaluations=[
      {"split": "val", "mode": "greedy", "step": 300, "checkpoint": "best",
       "checkpoint_identity": {"step": 300, "metrics": {"bleu": 11.5}},
       "metrics": {"bleu": 11.0}},
      {"split": "test_2016_flickr", "mode": "greedy", "step": 600, "checkpoint": "best",
       "checkpoint_identity": {"step": 600, "metrics": {"bleu": 12.5}}}])
  _save_best(variant_dir, 600, {"bleu": 12.5})
  row = results.variant_row(sweep.variants[0], variant_dir, checkpoint="best")
  assert row.get("dev_bleu_greedy") is None and row.get("test_bleu_greedy") is None
  shutil.rmtree(os.path.join(variant_dir, "checkpoints_best", "600"))
  _save_best(variant_dir, 300, {"bleu": 11.5})
  assert results.variant_row(sweep.variants[0], variant_dir,
                             checkpoint="best")["dev_bleu_greedy"] == 11.0


def test_an_evaluation_of_an_average_or_best_replaced_at_its_own_step_is_left_blank(
    tmp_path, caplog):
  """average_checkpoints --last 2, evaluate, then --last 5: the new average has
  the old one's newest step (10), and the old code, which judged by the step
  alone, showed the old average's dev PPL beside it. The evaluation records
  which average it scored (the steps averaged); a best checkpoint replaced at
  its own step (a run resumed from before it) is told apart by the score saved
  with it. An evaluation that records neither (an older evaluate) cannot be
  placed: left blank, with a warning naming it."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=10"])
  variant_dir = str(tmp_path / "runs" / "base")
  of_two = {"step": 10, "averaged_steps": [8, 10]}
  fake_workdir(variant_dir, sweep.variants[0].config, checkpoints=[2, 4, 6, 8, 10],
               evaluations=[{"split": "val", "mode": "greedy", "step": 10,
                             "checkpoint": "averaged", "checkpoint_identity": of_two,
                             "perplexity": 6.13, "metrics": {"bleu": 9.5}}])
  _save_average(variant_dir, [2, 4, 6, 8, 10])
  row = results.variant_row(sweep.variants[0], variant_dir, checkpoint="averaged")
  assert row.get("dev_perplexity") is None and row.get("dev_bleu_greedy") is None
  _save_average(variant_dir, [8, 10])  # The average it scored: its figures.
  row = results.variant_row(sweep.variants[0], variant_dir, checkpoint="averaged")
  assert (row["dev_perplexity"], row["dev_bleu_greedy"]) == (6.13, 9.5)
  assert workdir_lib.checkpoint_identity(variant_dir, "averaged", "bleu") == of_two

  # An evaluation of the best checkpoint of step 10 whose score was 12.0; the
  # kept best of step 10 now is a better one.
  with open(os.path.join(variant_dir, "eval_best.json"), "w") as f:
    json.dump({"split": "val", "mode": "greedy", "step": 10, "checkpoint": "best",
               "limit": None, "checkpoint_identity": {"step": 10, "metrics": {"bleu": 12.0}},
               "metrics": {"bleu": 12.0}}, f)
  _save_best(variant_dir, 10, {"bleu": 13.0})
  assert results.variant_row(sweep.variants[0], variant_dir,
                             checkpoint="best").get("dev_bleu_greedy") is None
  _save_best(variant_dir, 10, {"bleu": 12.0})
  assert results.variant_row(sweep.variants[0], variant_dir,
                             checkpoint="best")["dev_bleu_greedy"] == 12.0

  old = os.path.join(variant_dir, "eval_0.json")  # As evaluate wrote it before the identity.
  with open(old) as f:
    result = json.load(f)
  del result["checkpoint_identity"]
  with open(old, "w") as f:
    json.dump(result, f)
  with caplog.at_level(logging.WARNING):
    row = results.variant_row(sweep.variants[0], variant_dir, checkpoint="averaged")
  assert row.get("dev_perplexity") is None and row.get("dev_bleu_greedy") is None
  assert (f"Skipping {old}: it does not record which averaged checkpoint it scored"
          in caplog.text)


def test_a_variant_continued_outside_the_sweep_shows_its_newest_step(tmp_path):
  """The sweep finished the variant at 300 steps; its emitted command (which
  writes no status) continued it to 600, and evaluate ran there: the row shows
  step 600 and its evaluation, not the status's 300 beside none."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=300"])
  variant_dir = str(tmp_path / "runs" / "base")
  fake_workdir(variant_dir, sweep.variants[0].config,
               {"status": "finished", "steps": 300}, checkpoints=[300, 600], evaluations=[
                   {"split": "val", "mode": "greedy", "step": 600, "metrics": {"bleu": 12.5}}])
  row = results.variant_row(sweep.variants[0], variant_dir)
  assert (row["steps"], row["dev_bleu_greedy"]) == (600, 12.5)


def test_a_running_status_whose_sweep_is_gone_reads_interrupted(tmp_path):
  """A sweep killed with SIGKILL leaves its variant's status 'running': the
  table showed it running for good. It is 'interrupted' unless a live sweep
  holds the variant's .sweep lock (a killed one's lock file stays behind)."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n")
  sweep = sweep_lib.resolve(path)
  variant_dir = str(tmp_path / "runs" / "base")
  fake_workdir(variant_dir, sweep.variants[0].config, {"status": "running", "attempts": 1})
  row = lambda: results.variant_row(sweep.variants[0], variant_dir)
  assert row()["status"] == "interrupted" and "rerun the sweep" in row()["error"]
  sweep_lock = os.path.join(variant_dir, results.SWEEP_LOCK_DIR)
  with lock.hold(sweep_lock, "sweep"):
    assert row()["status"] == "running" and row()["error"] is None
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(sweep_lock, lock.LOCK_NAME), "w") as f:  # Left by a killed sweep.
    json.dump({"host": socket.gethostname(), "pid": int(dead), "command": "sweep"}, f)
  assert row()["status"] == "interrupted"
  with open(os.path.join(sweep_lock, lock.LOCK_NAME), "w") as f:  # Another host's: unknown.
    json.dump({"host": "elsewhere", "pid": os.getpid(), "command": "sweep"}, f)
  assert row()["status"] == "running"


def test_figures_of_an_earlier_step_than_the_checkpoint_are_noted(tmp_path):
  """A run stopped between evaluations (SIGTERM at step 59, evaluating every 2):
  the row's dev PPL is training's at step 58, beside 59 in its steps column; the
  note says so. At the checkpoint's step there is no note."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path)
  variant_dir = str(tmp_path / "runs" / "base")
  fake_workdir(variant_dir, sweep.variants[0].config, {"status": "stopped", "steps": 59},
               checkpoints=[59], scalars=[("eval/perplexity", 56, 4.5),
                                          ("eval/perplexity", 58, 4.0),
                                          ("decode/bleu", 50, 0.25)])
  row = results.variant_row(sweep.variants[0], variant_dir)
  assert (row["steps"], row["dev_perplexity"], row["dev_bleu_training"]) == (59, 4.0, 0.25)
  assert row["note"] == ("its dev score (training) is of step 50, training's dev PPL is of "
                         "step 58: the last logged; the latest checkpoint is at step 59")
  # A workdir of no variant keeps the note beside its own.
  shutil.copytree(variant_dir, str(tmp_path / "runs" / "gone"))
  notes = results.collect(sweep, str(tmp_path / "runs")).split("\n- ")
  assert notes[-1].startswith("gone (stopped): no variant of ") and notes[-1].endswith(
      "training's dev PPL is of step 58: the last logged; the latest checkpoint is at "
      "step 59\n")
  shutil.rmtree(str(tmp_path / "runs" / "gone"))
  os.makedirs(os.path.join(variant_dir, "checkpoints", "58"))
  shutil.rmtree(os.path.join(variant_dir, "checkpoints", "59"))
  assert results.variant_row(sweep.variants[0], variant_dir)["note"] == (
      "its dev score (training) is of step 50: the last logged; the latest checkpoint is at "
      "step 58")


def test_collect_writes_the_table_with_blanks_where_figures_are_missing(tmp_path):
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return [\n"
                     "    ('A-h1', {{'model.num_heads': 1}}),\n"
                     "    ('A-h2', {{'model.num_heads': 2}}),\n"
                     "    ('D-ls0', {{'train.label_smoothing': 0.0}}),\n"
                     "    ('score-bogus', {{'model.attention_scoring': 'dot'}})]\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=300"])
  base, h1, h2, ls0, _ = sweep.variants
  workdir = str(tmp_path / "runs")
  finished = {"status": "finished", "steps": 300, "wall_seconds": 3725.5, "error": None}
  fake_workdir(
      os.path.join(workdir, "base"), base.config, finished,
      scalars=[("eval/perplexity", 100, 9.5), ("eval/perplexity", 300, 4.75),
               ("decode/bleu", 300, 20.5), ("train/loss", 300, 2.0)],
      evaluations=[
          {"split": "val", "mode": "greedy", "step": 300, "perplexity": 4.5,
           "metrics": {"bleu": 21.25}},
          {"split": "val", "mode": "beam", "beam_size": 4, "alpha": 0.6, "step": 300,
           "perplexity": 4.5, "metrics": {"bleu": 22.0}},
          {"split": "test_2016_flickr", "mode": "beam", "beam_size": 4, "alpha": 0.6,
           "step": 300, "metrics": {"bleu": 23.5}},
          # Not the table's: beam 8, another length limit, a partial split, a stale
          # 'latest', another checkpoint.
          {"split": "val", "mode": "beam", "beam_size": 8, "alpha": 0.6, "step": 300,
           "metrics": {"bleu": 99.0}},
          {"split": "test_2016_flickr", "mode": "greedy", "max_extra_len": 10, "step": 300,
           "metrics": {"bleu": 99.0}},
          {"split": "test_2016_flickr", "mode": "greedy", "limit": 50, "step": 300,
           "metrics": {"bleu": 99.0}},
          {"split": "test_2016_flickr", "mode": "greedy", "step": 200,
           "metrics": {"bleu": 99.0}},
          {"split": "val", "mode": "greedy", "checkpoint": "averaged", "step": 300,
           "metrics": {"bleu": 99.0}}])
  fake_workdir(os.path.join(workdir, "A-h1"), h1.config,
               {"status": "failed", "steps": 100, "wall_seconds": 59.0,
                "error": "train.py exited with status 1: FloatingPointError: nan | stop"})
  # Trained elsewhere (an emitted command): no status, checkpoints and events only.
  fake_workdir(os.path.join(workdir, "D-ls0"), ls0.config, checkpoints=[100, 200],
               scalars=[("eval/perplexity", 200, 6.0)])
  del h2  # Never run: no workdir.

  markdown = results.collect(sweep, workdir)
  base_params = "7,568,384"  # As `--list` prints for configs/multi30k.py.
  h1_params = f"{results.count_parameters(h1.config):,}"
  table = [line for line in markdown.splitlines() if line.startswith("|")]
  assert table == [
      "| variant | changes | params | steps | train time | dev PPL | dev BLEU (training) "
      "| dev BLEU greedy | dev BLEU beam | test BLEU greedy | test BLEU beam | status |",
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
      f"| base |  | {base_params} | 300 | 1:02:05 | 4.50 | 20.50 | 21.25 | 22.00 |  | 23.50 "
      "| finished |",
      f"| A-h1 | model.num_heads=1 | {h1_params} | 100 | 0:00:59 |  |  |  |  |  |  | failed |",
      "| A-h2 | model.num_heads=2 |  |  |  |  |  |  |  |  |  | not run |",
      f"| D-ls0 | train.label_smoothing=0.0 | {base_params} | 200 |  | 6.00 |  |  |  |  |  |  |",
      "| score-bogus | model.attention_scoring=dot |  |  |  |  |  |  |  |  |  | invalid |"]
  assert markdown.startswith(f"# {path} on {MULTI30K}\n\nOn every variant (--set): `train.num_steps=300`.")
  assert markdown.endswith(
      "- A-h1 (failed): train.py exited with status 1: FloatingPointError: nan | stop\n"
      f"- score-bogus (invalid): config.model.attention_scoring: unknown field (not in "
      f"{MULTI30K})\n")
  with open(os.path.join(workdir, "results.md")) as f:
    assert f.read() == markdown
  with open(os.path.join(workdir, "results.csv")) as f:
    csv_lines = f.read().splitlines()
  assert csv_lines[0] == ("variant,changes,parameters,steps,wall_seconds,dev_perplexity,"
                          "dev_bleu_training,dev_bleu_greedy,dev_bleu_beam,test_bleu_greedy,"
                          "test_bleu_beam,status,parameters_at_vocab_size,error,note")
  assert csv_lines[1:] == [
      f"base,,{base_params.replace(',', '')},300,3725.5,4.5,20.5,21.25,22.0,,23.5,finished,"
      "True,,",
      f"A-h1,model.num_heads=1,{h1_params.replace(',', '')},100,59.0,,,,,,,failed,True,"
      "train.py exited with status 1: FloatingPointError: nan | stop,",
      "A-h2,model.num_heads=2,,,,,,,,,,not run,,,",
      f"D-ls0,train.label_smoothing=0.0,{base_params.replace(',', '')},200,,6.0,,,,,,,True,,",
      "score-bogus,model.attention_scoring=dot,,,,,,,,,,invalid,,"
      f"config.model.attention_scoring: unknown field (not in {MULTI30K}),"]


def test_collect_labels_the_table_with_what_the_workdirs_trained(tmp_path):
  """A collect without the run's --set still describes the run: the notes come
  from the base's config.json and recorded overrides, and a row trained without
  them says so."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('ls0', {{'train.label_smoothing': 0.0}}),\n"
                     "          ('ls2', {{'train.label_smoothing': 0.2}})]\n", base=MULTI30K)
  run = sweep_lib.resolve(path, sets=["data.eval_split=test_2016_flickr",
                                      "train.decode_every=0"])
  base, ls0, ls2 = run.variants
  workdir = str(tmp_path / "runs")
  # ls0's overrides are spelt otherwise (no note); ls2 ran without the --set.
  ls0_trained = [o.replace("=0.0", "=0.") for o in reversed(run.overrides(ls0))]
  for variant, trained in ((base, run.overrides(base)), (ls0, ls0_trained),
                           (ls2, ls2.overrides)):
    fake_workdir(os.path.join(workdir, variant.name), variant.config,
                 {"status": "finished", "steps": 300, "overrides": trained})
  markdown = results.collect(sweep_lib.resolve(path), workdir)  # No --set.
  assert ("On every variant (--set): `data.eval_split=test_2016_flickr "
          "train.decode_every=0`.") in markdown
  assert "dev = test_2016_flickr, test = test_2016_flickr;" in markdown
  assert "(training):" not in markdown  # No decoding during training.
  notes = [line for line in markdown.splitlines() if line.startswith("- ")]
  assert notes == ["- ls2 (finished): trained with `train.label_smoothing=0.2`, not "
                   "`data.eval_split=test_2016_flickr train.decode_every=0 "
                   "train.label_smoothing=0.2` as the notes above say"]
  with pytest.raises(FileNotFoundError, match="sweep workdir .* does not exist"):
    results.collect(run, str(tmp_path / "none"))


def test_rows_show_what_their_workdirs_trained_when_the_sweep_file_changed(tmp_path):
  """The sweep file edited after training: a variant now invalid vanished from
  the table, its figures with it; one whose value changed showed the new value
  in its changes column beside the old run's figures; a removed one had a blank
  changes column, as if it were a second base. Each row now shows what its
  workdir trained, the note saying how the sweep differs now."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('h', {{'model.num_heads': 3}}),\n"
                     "          ('seed', {{'seed': 5}})]\n", base=MULTI30K)
  sets = ["train.num_steps=300"]
  sweep = sweep_lib.resolve(path, sets=sets)
  assert sweep.variants[1].error  # 3 heads do not divide d_model.
  workdir = tmp_path / "runs"
  trained = {"h": "model.num_heads=2", "seed": "seed=1", "gone": "model.dropout=0.3"}
  for name, override in trained.items():
    fake_workdir(str(workdir / name), sweep.variants[0].config,
                 {"status": "finished", "steps": 300, "sets": sets,
                  "overrides": sets + [override]},
                 scalars=[("eval/perplexity", 300, 5.0)])
  rows = {line.split(" | ")[0][2:]: line for line in
          results.collect(sweep, str(workdir)).splitlines() if line.startswith("| ")}
  assert rows["h"].startswith("| h | model.num_heads=2 |") and " 5.00 | " in rows["h"]
  assert rows["h"].endswith(" | finished |")
  assert rows["seed"].startswith("| seed | seed=1 |") and " 5.00 | " in rows["seed"]
  assert rows["gone"].startswith("| gone | model.dropout=0.3 |")
  notes = results.collect(sweep, str(workdir)).split("\n- ")[1:]
  assert notes[0].startswith("h (finished): invalid as the sweep resolves it now (config."
                             "model.num_heads") and notes[0].endswith(
      "listed as its workdir holds it, trained with `train.num_steps=300 model.num_heads=2`")
  assert notes[1].startswith("seed (finished): trained with `train.num_steps=300 seed=1`, "
                             "not `train.num_steps=300 seed=5`")


def test_a_newline_in_a_cell_or_an_error_keeps_the_markdown_table_whole():
  rows = [{"variant": "v", "changes": "data.text_dir=a\nb\rc\r\nd", "status": "failed",
           "error": "line 1\r\nline 2"}]
  markdown = results.to_markdown(rows, "bleu", "title")
  lines = markdown.split("\n")
  table = [line for line in lines if line.startswith("|")]
  assert len(table) == 3 and "data.text_dir=a b c d" in table[2] and "\r" not in markdown
  assert lines[-3:] == ["- v (failed): line 1", "  line 2", ""]


def test_collect_without_set_resolves_variants_that_scale_with_the_base_as_run(tmp_path):
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('h{{}}'.format(base.model.num_heads * 2),\n"
                     "           {{'model.num_heads': base.model.num_heads * 2}})]\n")
  run = sweep_lib.resolve(path, sets=["model.num_heads=1"])
  assert [v.name for v in run.variants] == ["base", "h2"]
  workdir = str(tmp_path / "runs")
  for variant in run.variants:
    fake_workdir(os.path.join(workdir, variant.name), variant.config,
                 {"status": "finished", "steps": 300, "overrides": run.overrides(variant)})
  plain = sweep_lib.resolve(path)
  assert [v.name for v in plain.variants] == ["base", "h8"]
  assert [v.name for v in sweep_lib.as_run(plain, workdir).variants] == ["base", "h2"]


SCALED = ("BASE = {base!r}\ndef get_sweep(base):\n"
          "  return [('h{{}}'.format(base.model.num_heads * 2),\n"
          "           {{'model.num_heads': base.model.num_heads * 2}}),\n"
          "          ('drop0', {{'model.dropout': 0.0}})]\n")


def test_collect_without_set_finds_every_trained_variant_without_a_base_status(tmp_path):
  """`--only h2,drop0` with --set model.num_heads=1 leaves no base status, from
  which collect took the run's --set: the table had h8 'not run' and no h2 row.
  The other variants' statuses record the --set; a workdir that no status
  places (statuses written before they did, or an emitted command's) is listed
  with a note, not left out."""
  from tests.test_sweep_run import FakeTrainer  # pylint: disable=g-import-not-at-top
  path = write_sweep(tmp_path, SCALED)
  sets = ["model.num_heads=1", "train.num_steps=3"]
  run = sweep_lib.resolve(path, sets=sets)
  workdir = str(tmp_path / "runs")
  assert sweep_run.run_local(sweep_lib.select(run, ["h2", "drop0"]), workdir, FakeTrainer()) == {
      "h2": "finished", "drop0": "finished"}
  plain = sweep_lib.resolve(path)  # --collect without --set.
  markdown = results.collect(sweep_lib.as_run(plain, workdir), workdir)
  rows = {line.split(" | ")[0][2:]: line for line in markdown.splitlines()
          if line.startswith("| ") and not line.startswith("| variant")}
  assert list(rows) == ["base", "h2", "drop0"]
  assert rows["h2"].endswith(" | finished |") and rows["base"].endswith(" | not run |")
  assert "On every variant (--set): `model.num_heads=1 train.num_steps=3`." in markdown
  assert not [line for line in markdown.splitlines() if line.startswith("- ")]

  for name in ("h2", "drop0"):  # As a status written before 'sets' was.
    status = results.read_status(os.path.join(workdir, name))
    del status["sets"]
    results.write_status(os.path.join(workdir, name), status)
  fake_workdir(os.path.join(workdir, "h4"), run.variants[1].config)  # An emitted command's.
  markdown = results.collect(sweep_lib.as_run(plain, workdir), workdir)
  assert [line.split(" | ")[0][2:] for line in markdown.splitlines() if line.startswith("| ")
          ][1:] == ["base", "h8", "drop0", "h2", "h4"]
  notes = [line for line in markdown.splitlines() if line.startswith("- ")]
  assert notes == [
      "- drop0 (finished): trained with `model.num_heads=1 train.num_steps=3 model.dropout=0.0`, "
      "not `model.dropout=0.0` as the notes above say",
      f"- h2 (finished): no variant of {path}; listed as its workdir holds it, trained with "
      "`train.num_steps=3 model.num_heads=2`",
      f"- h4: no variant of {path}; listed as its workdir holds it, trained with the settings "
      "of its config.json (no sweep status)"]


def test_a_damaged_base_status_is_named_once_and_the_notes_stay_true(tmp_path):
  """`--collect` with the base's sweep_status.json truncated: the old code named
  it three times, left the --set out of the notes and said under ls0's row that
  it trained with other overrides than the notes say (it trained with the
  --set, as every variant did)."""
  from tests import process_helpers  # pylint: disable=g-import-not-at-top
  from tests.test_sweep_run import FakeTrainer  # pylint: disable=g-import-not-at-top
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('ls0', {{'train.label_smoothing': 0.0}})]\n")
  workdir = str(tmp_path / "runs")
  run = sweep_lib.resolve(path, sets=["train.num_steps=3"])
  assert sweep_run.run_local(run, workdir, FakeTrainer()) == {
      "base": "finished", "ls0": "finished"}
  damaged = os.path.join(workdir, "base", results.STATUS_FILE)
  with open(damaged, "w") as f:
    f.write('{"status": "fini')
  out = subprocess.run([sys.executable, "-m", "transformer.sweep", "--sweep", path,
                        "--workdir", workdir, "--collect"], cwd=ROOT, capture_output=True,
                       text=True, env=process_helpers.command_env())
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stderr.count("Skipping") == 1 and f"Skipping {damaged}: not valid JSON" in out.stderr
  assert "On every variant (--set): `train.num_steps=3`." in out.stdout
  assert not [line for line in out.stdout.splitlines() if line.startswith("- ")], out.stdout


def test_collect_with_an_unknown_checkpoint_name_stops_before_writing(tmp_path):
  """`--collect --checkpoint bogus` exited 0 and replaced results.md and
  results.csv with an all-blank table of 'checkpoint bogus'; it stops in one
  line, as evaluate does, and the tables stay as they were."""
  from tests import process_helpers  # pylint: disable=g-import-not-at-top
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n")
  sweep = sweep_lib.resolve(path)
  workdir = str(tmp_path / "runs")
  fake_workdir(os.path.join(workdir, "base"), sweep.variants[0].config,
               {"status": "finished", "steps": 3})
  results.collect(sweep, workdir)
  before = {}
  for name in results.TABLE_FILES:
    with open(os.path.join(workdir, name)) as f:
      before[name] = f.read()
  with pytest.raises(ValueError, match=r"checkpoint must be a step number or one of "
                     r"\['averaged', 'best', 'latest'\], got 'bogus'"):
    results.collect(sweep, workdir, "bogus")
  out = subprocess.run([sys.executable, "-m", "transformer.sweep", "--sweep", path,
                        "--workdir", workdir, "--collect", "--checkpoint", "bogus"], cwd=ROOT,
                       capture_output=True, text=True, env=process_helpers.command_env())
  assert out.returncode == 1 and not out.stdout, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == (
      "sweep: error: checkpoint must be a step number or one of ['averaged', 'best', "
      "'latest'], got 'bogus'"), out.stderr[-2000:]
  for name in results.TABLE_FILES:
    with open(os.path.join(workdir, name)) as f:
      assert f.read() == before[name], name


def test_collect_names_the_rows_whose_params_are_counted_at_data_vocab_size(tmp_path):
  """A row whose workdir holds its trained vocabulary counts the embeddings at
  that vocabulary's size (SCAN words: fewer than data.vocab_size = 32); one
  without (an emitted command's copied workdir, say) at data.vocab_size. The
  old table set them side by side without a word; a note names the latter."""
  from transformer.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('ls0', {{'train.label_smoothing': 0.0}})]\n")
  sweep = sweep_lib.resolve(path)
  workdir = str(tmp_path / "runs")
  for variant in sweep.variants:
    fake_workdir(os.path.join(workdir, variant.name), variant.config,
                 {"status": "finished", "steps": 3})
  tokenizer = tokenizer_lib.train(["walk left twice", "jump around right", "I_WALK I_JUMP"],
                                  "word", 32)
  tokenizer.save(os.path.join(workdir, "base", "spm.model"))
  assert tokenizer.vocab_size < sweep.variants[0].config.data.vocab_size
  rows = [results.variant_row(v, os.path.join(workdir, v.name)) for v in sweep.variants]
  assert [row["parameters"] for row in rows] == [
      results.count_parameters(v.config, size)
      for v, size in zip(sweep.variants, (tokenizer.vocab_size, 0))]
  markdown = results.collect(sweep, workdir)
  assert ("params of ls0: at data.vocab_size (no trained vocabulary in the workdir); the "
          "others' at their trained vocabulary's size.") in markdown.split("\n\n")
  with open(os.path.join(workdir, "results.csv")) as f:
    table = {row["variant"]: row for row in csv.DictReader(f)}
  assert [table[v]["parameters_at_vocab_size"] for v in ("base", "ls0")] == ["False", "True"]
  os.remove(os.path.join(workdir, "base", "spm.model"))
  markdown = results.collect(sweep, workdir)
  assert ("params: at data.vocab_size (no workdir holds its trained vocabulary)."
          in markdown.split("\n\n"))


def _one_variant(tmp_path):
  """The base variant of a sweep of none on Multi30k, and its workdir's path."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K)
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=300"])
  return sweep.variants[0], str(tmp_path / "runs" / "base")


def test_a_step_logged_twice_shows_its_last_value(tmp_path):
  """A step written again (a workdir trained again from an earlier checkpoint, its
  events appended) reads as its last value, the one of the training it holds now."""
  variant, variant_dir = _one_variant(tmp_path)
  fake_workdir(variant_dir, variant.config, {"status": "finished", "steps": 300},
               checkpoints=[300], scalars=[("eval/perplexity", 300, 9.0),
                                           ("decode/bleu", 300, 0.10),
                                           ("eval/perplexity", 300, 4.0),
                                           ("decode/bleu", 300, 0.25)])
  row = results.variant_row(variant, variant_dir)
  assert (row["dev_perplexity"], row["dev_bleu_training"]) == (4.0, 0.25)


def test_of_two_evaluations_of_the_same_figure_the_newest_is_shown(tmp_path):
  """Two evaluate JSONs of the same split, search and checkpoint (one written under
  an older file name, say): the table shows the newer one's figure, whatever the
  names' order."""
  variant, variant_dir = _one_variant(tmp_path)
  fake_workdir(variant_dir, variant.config, {"status": "finished", "steps": 300},
               checkpoints=[300], evaluations=[
                   {"split": "val", "mode": "greedy", "step": 300, "metrics": {"bleu": 12.0}},
                   {"split": "val", "mode": "greedy", "step": 300, "metrics": {"bleu": 10.0}}])
  newer, older = (os.path.join(variant_dir, f"eval_{i}.json") for i in (0, 1))
  os.utime(older, (1_000_000_000, 1_000_000_000))
  os.utime(newer, (1_000_000_100, 1_000_000_100))
  assert results.variant_row(variant, variant_dir)["dev_bleu_greedy"] == 12.0


def test_dev_perplexity_is_the_dev_splits_of_the_checkpoint_chosen(tmp_path):
  """The dev PPL column holds the dev split's perplexity: a test split's
  evaluation, which records one too, never fills it; and of a checkpoint other
  than the latest, training's last logged one (the latest's) does not either."""
  variant, variant_dir = _one_variant(tmp_path)
  fake_workdir(variant_dir, variant.config, {"status": "finished", "steps": 300},
               checkpoints=[300], scalars=[("eval/perplexity", 300, 6.0)], evaluations=[
                   {"split": "val", "mode": "greedy", "step": 300, "perplexity": 4.5,
                    "metrics": {"bleu": 21.0}},
                   {"split": "test_2016_flickr", "mode": "greedy", "step": 300,
                    "perplexity": 9.5, "metrics": {"bleu": 20.0}}])
  row = results.variant_row(variant, variant_dir)
  assert (row["dev_perplexity"], row["test_bleu_greedy"]) == (4.5, 20.0)
  os.remove(os.path.join(variant_dir, "eval_0.json"))  # No dev evaluation: training's.
  assert results.variant_row(variant, variant_dir)["dev_perplexity"] == 6.0
  for checkpoint in ("best", "300"):  # Training logged the latest's, not these.
    assert results.variant_row(variant, variant_dir, checkpoint).get("dev_perplexity") is None
