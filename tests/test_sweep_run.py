"""Tests for transformer/sweep_run.py: running a sweep's variants here, the
skip/resume/stale/failure rules, the wall time kept over attempts, a real
sweep of tiny variants, and the signals passed on to train.py."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests import process_helpers
from tests.helpers import DEFAULT, ROOT, fake_workdir
from tests.test_sweep import write_sweep
from transformer import config as config_lib, results, sweep as sweep_lib, sweep_run, training


# ----------------------------------------------------------------------------
# Running: skip finished, rerun interrupted or failed, go on after a failure.

class FakeTrainer:
  """Records calls; fails the variants named in `fail`; leaves config.json and a
  checkpoint at train.num_steps as training would."""

  def __init__(self, fail=()):
    self.calls, self.fail = [], set(fail)

  def __call__(self, argv, variant_dir):
    name = os.path.basename(variant_dir)
    self.calls.append(name)
    if name in self.fail:
      raise RuntimeError(f"train.py exited with status 1: ValueError: {name} broke")
    config = config_lib.load_file(argv[argv.index("--config") + 1],
                                  [a[len("--config."):] for a in argv if a.startswith("--config.")])
    training.save_config(config, variant_dir)
    os.makedirs(os.path.join(variant_dir, "checkpoints", str(config.train.num_steps)),
                exist_ok=True)


def test_a_failure_is_recorded_with_the_line_that_says_why(tmp_path, monkeypatch):
  """A variant's recorded error was train.log's last line, which after a traceback
  was JAX's note on the frames it hides ("For simplicity, JAX has removed ..."),
  not the exception."""
  script = ("import sys\n"
            "print('I1128 training.py] Parameters: 1,000')\n"
            "print('Traceback (most recent call last):\\n  File \"x.py\", line 1')\n"
            "print('TypeError: unsupported operand type(s)')\n"
            "print('--------------------\\nFor simplicity, JAX has removed its internal frames')\n"
            "sys.exit(1)\n")
  monkeypatch.setattr(sweep_run.launch, "child_command",
                      lambda argv: [sys.executable, "-c", script])
  with pytest.raises(RuntimeError, match=r"^train\.py exited with status 1: TypeError: "
                     r"unsupported operand type\(s\)$"):
    sweep_run.train_subprocess([], str(tmp_path))
  assert "For simplicity" in (tmp_path / "train.log").read_text()  # The log keeps every line.


def test_run_skips_finished_resumes_others_and_records_failures(tmp_path):
  sweep = sweep_lib.resolve(write_sweep(tmp_path), sets=["train.num_steps=5"])
  workdir = str(tmp_path / "runs")
  trainer = FakeTrainer(fail={"h1"})
  done = sweep_run.run_local(sweep, workdir, trainer)
  names = [v.name for v in sweep.valid]
  assert trainer.calls == names  # The failure of h1 does not stop the others.
  assert done == {n: "failed" if n == "h1" else "finished" for n in names}
  failed = results.read_status(os.path.join(workdir, "h1"))
  assert failed["status"] == "failed"
  assert failed["error"] == "train.py exited with status 1: ValueError: h1 broke"
  ok = results.read_status(os.path.join(workdir, "h8"))
  assert (ok["status"], ok["steps"], ok["error"], ok["attempts"]) == ("finished", 5, None, 1)
  assert ok["overrides"] == ["train.num_steps=5", "model.num_heads=8"]
  assert ok["command"] == sweep_lib.commands(sweep, workdir)[2]
  assert ok["wall_seconds"] >= 0

  # An interrupted variant (killed while running) is left 'running'.
  status = results.read_status(os.path.join(workdir, "pre"))
  results.write_status(os.path.join(workdir, "pre"), {**status, "status": "running"})
  trainer = FakeTrainer()
  done = sweep_run.run_local(sweep, workdir, trainer)
  assert trainer.calls == ["h1", "pre"]  # Finished ones are skipped.
  assert done["base"] == "skipped" and done["h1"] == done["pre"] == "finished"
  assert results.read_status(os.path.join(workdir, "h1"))["attempts"] == 2

  # --only: the named variants alone, in the sweep's order; an unknown name is an error.
  seven = sweep_lib.resolve(write_sweep(tmp_path), sets=["train.num_steps=7"])
  only = sweep_lib.select(seven, ["pre", "base"])
  trainer = FakeTrainer()
  assert sweep_run.run_local(only, workdir, trainer) == {"base": "finished", "pre": "finished"}
  assert trainer.calls == ["base", "pre"]
  assert sweep_lib.commands(only, workdir) == [sweep_lib.commands(seven, workdir)[i]
                                               for i in (0, names.index("pre"))]
  with pytest.raises(ValueError, match=r"--only: no variant 'h5' in .*\(its variants: base, "):
    sweep_lib.select(seven, ["h5"])

  # A longer budget reruns every variant (train.py resumes from its checkpoint).
  longer = sweep_lib.resolve(write_sweep(tmp_path), sets=["train.num_steps=9"])
  trainer = FakeTrainer()
  sweep_run.run_local(longer, workdir, trainer)
  assert trainer.calls == names
  assert results.read_status(os.path.join(workdir, "base"))["steps"] == 9


def _base_finished_ls0_failed(tmp_path):
  """A sweep of the base and ls0 run once at 5 steps, ls0 failing: (sweep file,
  workdir, sweep)."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('ls0', {{'train.label_smoothing': 0.0}})]\n")
  workdir = str(tmp_path / "runs")
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=5"])
  assert sweep_run.run_local(sweep, workdir, FakeTrainer(fail={"ls0"})) == {
      "base": "finished", "ls0": "failed"}
  return path, workdir, sweep


def test_a_rerun_with_other_settings_leaves_trained_variants_as_they_are(tmp_path):
  """Checkpoints trained under one recipe are not continued, or relabelled, under
  another: the variant is 'stale' and its status stays; a longer num_steps (or a
  variant with no checkpoint yet) still runs."""
  path, workdir, sweep = _base_finished_ls0_failed(tmp_path)
  before = results.read_status(os.path.join(workdir, "base"))
  other = sweep_lib.resolve(path, sets=["train.num_steps=5", "optim.learning_rate_scale=0.5"])
  trainer = FakeTrainer()
  assert sweep_run.run_local(other, workdir, trainer) == {"base": "stale", "ls0": "finished"}
  assert trainer.calls == ["ls0"]  # Its failed attempt left no checkpoint.
  assert results.read_status(os.path.join(workdir, "base")) == before
  changes = lambda *overrides: sweep_run.recipe_changes(
      before, {"base": sweep.base, "overrides": list(overrides)})
  assert changes("train.num_steps=9", "model.dropout=0.3") == ["model.dropout: 0.1 -> 0.3"]
  # Compared as resolved configs: the base's own value, another spelling, and
  # cadences or the mesh are no change.
  assert changes("train.num_steps=5", "seed=0", "model.dropout=.1") == []
  assert changes("train.decode_every=100", "train.mesh=data=-1,model=1") == []
  longer = sweep_lib.resolve(path, sets=["train.num_steps=9"])
  assert sweep_run.run_local(longer, workdir, FakeTrainer()) == {
      "base": "finished", "ls0": "stale"}


def test_a_finished_variant_without_checkpoints_is_not_trained_again_in_place(tmp_path):
  """Checkpoints deleted to free the disk: the rerun with other settings trained
  the finished variant again in its workdir, overwrote its status and
  config.json, and its evaluate results were then labelled with the new
  settings. It is 'stale' like one with checkpoints; so is one holding evaluate
  results alone; a failed attempt that left nothing runs again."""
  path, workdir, sweep = _base_finished_ls0_failed(tmp_path)
  for name in ("base", "ls0"):
    shutil.rmtree(os.path.join(workdir, name, "checkpoints"), ignore_errors=True)
  before = results.read_status(os.path.join(workdir, "base"))
  config_json = open(os.path.join(workdir, "base", "config.json")).read()
  other = sweep_lib.resolve(path, sets=["train.num_steps=5", "model.dropout=0.0"])
  trainer = FakeTrainer()
  assert sweep_run.run_local(other, workdir, trainer) == {"base": "stale", "ls0": "finished"}
  assert trainer.calls == ["ls0"]
  assert results.read_status(os.path.join(workdir, "base")) == before
  assert open(os.path.join(workdir, "base", "config.json")).read() == config_json
  # Evaluate results alone (a status lost or never written) are kept alike.
  os.remove(os.path.join(workdir, "base", results.STATUS_FILE))
  open(os.path.join(workdir, "base", "eval_test_greedy.json"), "w").write("{}")
  assert sweep_run.run_local(other, workdir, FakeTrainer())["base"] == "stale"


def test_a_variant_whose_workdir_is_a_file_fails_and_the_others_run(tmp_path):
  """A file where a variant's workdir goes ended the sweep in a FileExistsError's
  traceback, and the variants after it never ran."""
  sweep = sweep_lib.resolve(write_sweep(tmp_path), sets=["train.num_steps=5"])
  workdir = tmp_path / "runs"
  workdir.mkdir()
  (workdir / "h1").write_text("not a directory")
  trainer = FakeTrainer()
  done = sweep_run.run_local(sweep, str(workdir), trainer)
  assert done["h1"] == "failed" and trainer.calls == [v.name for v in sweep.valid if v.name != "h1"]
  assert (workdir / "h1").read_text() == "not a directory"
  with pytest.raises(FileNotFoundError, match=r"sweep workdir .*h1' is a file, not a directory"):
    results.collect(sweep, str(workdir / "h1"))


def test_a_rerun_spelling_the_same_recipe_otherwise_skips_finished_variants(tmp_path):
  """The --set in another order, the base's path spelt otherwise, or a value
  the base has anyway resolve to the same configs: finished variants are
  skipped, not trained again."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('ls0', {{'train.label_smoothing': 0.0}})]\n")
  workdir = str(tmp_path / "runs")
  sets = ["train.num_steps=5", "train.log_every=1"]
  assert sweep_run.run_local(sweep_lib.resolve(path, sets=sets), workdir, FakeTrainer()) == {
      "base": "finished", "ls0": "finished"}
  seed = sweep_lib.resolve(path).variants[0].config.seed
  respelt = DEFAULT.replace(os.sep + "configs" + os.sep, f"{os.sep}configs{os.sep}..{os.sep}"
                            f"configs{os.sep}")
  for base, again in ((None, sets[::-1]), (respelt, sets + [f"seed={seed}"])):
    trainer = FakeTrainer()
    assert sweep_run.run_local(sweep_lib.resolve(path, base, again), workdir, trainer) == {
        "base": "skipped", "ls0": "skipped"}, (base, again)
    assert trainer.calls == []
  # A base file edited since: the same --set no longer gives the config trained.
  base = tmp_path / "base.py"
  base.write_text("from configs import default\n\ndef get_config():\n"
                  "  config = default.get_config()\n  config.train.num_steps = 5\n"
                  "  return config\n")
  edited = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                       base=str(base), name="edited.py")
  assert sweep_run.run_local(sweep_lib.resolve(edited), str(tmp_path / "e"), FakeTrainer()) == {
      "base": "finished"}
  base.write_text(base.read_text().replace("= 5", "= 9"))
  trainer = FakeTrainer()
  assert sweep_run.run_local(sweep_lib.resolve(edited, sets=["train.num_steps=9"]),
                             str(tmp_path / "e"), trainer) == {"base": "finished"}
  assert trainer.calls == ["base"]
  # An edited value its checkpoints cannot continue under: stale, as its config.json says.
  base.write_text(base.read_text().replace("  return config", "  config.model.dropout = 0.3\n"
                                           "  return config"))
  assert sweep_run.run_local(sweep_lib.resolve(edited, sets=["train.num_steps=9"]),
                             str(tmp_path / "e"), FakeTrainer()) == {"base": "stale"}
  assert config_lib.same_recipe({"base": DEFAULT, "overrides": ["model.dropout=.1"]},
                                {"base": respelt, "overrides": []})
  assert not config_lib.same_recipe({"base": DEFAULT, "overrides": ["model.dropout=0.2"]},
                                    {"base": DEFAULT, "overrides": []})
  assert not config_lib.same_recipe({"base": "gone.py", "overrides": []},
                                    {"base": DEFAULT, "overrides": []})


def test_a_rerun_with_fewer_steps_keeps_variants_trained_past_them(tmp_path):
  """Trained to 9 steps, rerun with train.num_steps=5: the old code ran train.py,
  which trained nothing, and recorded the variant finished under num_steps=5
  (its config.json too), so the table said --set train.num_steps=5 over rows
  of 9 steps. Now it is skipped, its status kept, and the table says 9."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('ls0', {{'train.label_smoothing': 0.0}})]\n")
  workdir = str(tmp_path / "runs")
  assert sweep_run.run_local(sweep_lib.resolve(path, sets=["train.num_steps=9"]), workdir,
                             FakeTrainer()) == {"base": "finished", "ls0": "finished"}
  before = {n: results.read_status(os.path.join(workdir, n)) for n in ("base", "ls0")}
  fewer = sweep_lib.resolve(path, sets=["train.num_steps=5"])
  trainer = FakeTrainer()
  assert sweep_run.run_local(fewer, workdir, trainer) == {"base": "skipped", "ls0": "skipped"}
  assert trainer.calls == []
  assert {n: results.read_status(os.path.join(workdir, n)) for n in before} == before
  markdown = results.collect(fewer, workdir)  # As `--collect --set train.num_steps=5`.
  assert "On every variant (--set): `train.num_steps=9`." in markdown
  assert [line.split("|")[4].strip() for line in markdown.splitlines()
          if line.startswith("|")][2:] == ["9", "9"]  # The steps column.
  assert not [line for line in markdown.splitlines() if line.startswith("- ")]


def test_a_variant_trained_without_a_status_is_checked_against_its_config(tmp_path):
  """A variant trained by its emitted command (no status file) or whose status
  is damaged: its config.json says what its checkpoints were trained with, so a
  rerun under other settings reports it stale instead of continuing it."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n")
  workdir = str(tmp_path / "runs")
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=5"])
  fake_workdir(os.path.join(workdir, "base"), sweep.variants[0].config, checkpoints=[5])
  other = sweep_lib.resolve(path, sets=["train.num_steps=5", "optim.learning_rate_scale=0.5"])
  trainer = FakeTrainer()
  assert sweep_run.run_local(other, workdir, trainer) == {"base": "stale"}
  assert trainer.calls == []
  longer = sweep_lib.resolve(path, sets=["train.num_steps=9"])  # Continuable: it runs.
  assert sweep_run.run_local(longer, workdir, trainer) == {"base": "finished"}


def test_a_variant_another_process_trains_is_left_to_it(tmp_path):
  """Two sweeps on one workdir: while one holds a variant (its .sweep lock) or
  its training holds the variant's lock, the other reports it busy and leaves its status alone (it took the live 'running'
  status for an interrupted run, launched, failed on the lock and wrote
  'failed' over it)."""
  from transformer import lock  # pylint: disable=g-import-not-at-top
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n")
  workdir = str(tmp_path / "runs")
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=5"])
  variant_dir = os.path.join(workdir, "base")
  os.makedirs(variant_dir)
  results.write_status(variant_dir, {"status": "running", "attempts": 1})
  trainer = FakeTrainer()
  with lock.hold(variant_dir, "train"):
    assert sweep_run.run_local(sweep, workdir, trainer) == {"base": "busy"}
  # The other sweep itself, deciding or between its 'running' and its train.py's lock.
  with lock.hold(os.path.join(variant_dir, results.SWEEP_LOCK_DIR), "sweep"):
    assert sweep_run.run_local(sweep, workdir, trainer) == {"base": "busy"}
  assert trainer.calls == [] and results.read_status(variant_dir) == {
      "status": "running", "attempts": 1}
  assert sweep_run.run_local(sweep, workdir, trainer) == {"base": "finished"}


def test_the_wall_time_of_earlier_attempts_survives_a_killed_one(tmp_path, monkeypatch):
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n")
  sweep = sweep_lib.resolve(path, sets=["train.num_steps=5"])
  workdir = str(tmp_path / "runs")
  now = [1000.0]
  monkeypatch.setattr(sweep_run.time, "time", lambda: now[0])

  def takes_10_s(trainer):
    def train(argv, variant_dir):
      now[0] += 10
      trainer(argv, variant_dir)
    return train

  sweep_run.run_local(sweep, workdir, takes_10_s(FakeTrainer(fail={"base"})))

  def killed(argv, variant_dir):
    raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    sweep_run.run_local(sweep, workdir, takes_10_s(killed))
  status = results.read_status(os.path.join(workdir, "base"))
  assert (status["status"], status["attempts"], status["wall_seconds"]) == ("running", 2, 10.0)
  sweep_run.run_local(sweep, workdir, takes_10_s(FakeTrainer()))
  status = results.read_status(os.path.join(workdir, "base"))
  assert (status["status"], status["attempts"], status["wall_seconds"]) == ("finished", 3, 20.0)


TINY = ["model.num_layers=1", "model.d_model=32", "model.d_ff=64", "model.num_heads=2",
        "data.eval_split=test[:50]", "data.tokens_per_batch=512", "optim.warmup_steps=20",
        "train.num_steps=2", "train.log_every=1", "train.eval_every=2",
        "train.checkpoint_every=2", "train.decode_every=0"]


def test_real_sweep_of_two_tiny_variants(tmp_path, tmp_path_factory, monkeypatch):
  """train.py in a subprocess, twice (the variants differ in their seed only, so
  the second reuses the compiled programs), after a variant that fails at once;
  a rerun trains nothing but the failed one (its trainer a FakeTrainer that fails
  it again: the decisions to skip rest on what the real runs left)."""
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("TRANSFORMER_COMPILATION_CACHE", jax.config.jax_compilation_cache_dir)
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('bogus', {{'data.dataset': 'scan/bogus'}}),\n"
                     "          ('seed1', {{'seed': 1}})]\n")
  tfds_dir = process_helpers.scan_tfds_dir(tmp_path_factory)  # Prepared once a session.
  sweep = sweep_lib.resolve(path, sets=TINY + [f"data.tfds_data_dir={tfds_dir}"])
  workdir = str(tmp_path / "runs")
  assert sweep_run.run_local(sweep, workdir) == {
      "base": "finished", "bogus": "failed", "seed1": "finished"}
  assert results.read_status(os.path.join(workdir, "bogus"))["error"] == (
      "train.py exited with status 1: train: error: unknown SCAN split 'scan/bogus'; "
      "use scan/simple or scan/length")
  rerun = FakeTrainer(fail={"bogus"})
  assert sweep_run.run_local(sweep, workdir, rerun) == {
      "base": "skipped", "bogus": "failed", "seed1": "skipped"}
  assert rerun.calls == ["bogus"]
  del sweep.variants[1]
  rows = [results.variant_row(v, os.path.join(workdir, v.name)) for v in sweep.variants]
  for row in rows:
    assert (row["status"], row["steps"]) == ("finished", 2)
    assert 1.0 < row["dev_perplexity"] < 40.0  # Near the untrained ~23 (the vocabulary).
  assert rows[0]["dev_perplexity"] != rows[1]["dev_perplexity"]  # Other seeds.
  assert rows[0]["parameters"] == results.count_parameters(
      sweep.variants[0].config, vocab_size=23)
  with open(os.path.join(workdir, "base", "train.log")) as f:
    assert "(2/2)" in f.read()  # clu's progress note at the last step.



def _processes_naming(text) -> list:
  """Pids of the processes whose command line holds `text`."""
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if text.encode() in f.read():
          pids.append(int(pid))
    except OSError:  # Gone meanwhile.
      pass
  return pids


def test_a_signal_to_the_sweep_stops_its_training_and_is_recorded(tmp_path, tmp_path_factory):
  """A SIGTERM to the sweep alone (the audit's: it died, its train.py trained on
  unattended and train.log lost the attempt's buffered lines), then a Ctrl-C to
  its process group, as a terminal sends (a KeyboardInterrupt traceback and a
  status left 'running'): each time train.py gets the signal once, saves and
  exits, its last lines reach train.log, the attempt is recorded as stopped
  with its time, and the sweep exits 128 + the signal with one line."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('seed1', {{'seed': 1}})]\n")
  tfds_dir = process_helpers.scan_tfds_dir(tmp_path_factory)
  workdir = str(tmp_path / "runs")
  long = ["train.num_steps=100000", "train.eval_every=100000", "train.checkpoint_every=100000"]
  sets = [s for s in TINY if s.partition("=")[0] not in {o.partition("=")[0] for o in long}
          ] + long + [f"data.tfds_data_dir={tfds_dir}"]
  command = [sys.executable, "-m", "transformer.sweep", "--sweep", path, "--workdir", workdir,
             *[a for s in sets for a in ("--set", s)]]
  variant_dir = os.path.join(workdir, "base")
  walls = [0.0]
  for attempt, (signum, to_group) in enumerate(((signal.SIGTERM, False),
                                                (signal.SIGINT, True)), start=1):
    log_path = str(tmp_path / f"sweep{attempt}.log")
    with open(log_path, "ab") as log:
      sweep = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               env=process_helpers.command_env(), start_new_session=True)
    try:
      start = len(process_helpers.read(log_path))
      process_helpers.wait_for(log_path, r"\] \[\d+\] train/", sweep)
      if to_group:
        os.killpg(sweep.pid, signum)
      else:
        sweep.send_signal(signum)
      assert sweep.wait(timeout=120) == 128 + signum
    finally:
      for pid in [sweep.pid] + _processes_naming(variant_dir):  # The old code's orphans.
        with contextlib.suppress(ProcessLookupError):
          os.kill(pid, signal.SIGKILL)
    output = process_helpers.read(log_path)[start:]
    name = signal.Signals(signum).name
    assert "Traceback" not in output and output.rstrip().splitlines()[-1] == (
        f"sweep: stopped by {name}; rerun the same command to resume base and run the "
        "rest"), output[-3000:]
    with open(os.path.join(variant_dir, "train.log")) as f:
      assert f"train: stopped by {name} after step" in f.read().splitlines()[-1]
    status = results.read_status(variant_dir)
    assert (status["status"], status["attempts"]) == ("stopped", attempt)
    assert status["error"].startswith(f"train.py exited with status {128 + signum}: "
                                      f"train: stopped by {name} after step ")
    assert status["wall_seconds"] > walls[-1] + 1.0
    walls.append(status["wall_seconds"])
    assert status["steps"] == results.latest_step(variant_dir) > 0
  assert not os.path.exists(os.path.join(workdir, "seed1"))  # Stopped before it started.


def test_a_signal_that_comes_while_training_starts_is_passed_on_to_it():
  """A SIGTERM to the sweep after it has started train.py but before it forwards
  signals to it (train.py's start-up, seconds long) still reaches train.py, once
  forwarding begins: otherwise that training would run to its end unattended."""
  with sweep_run.ForwardedSignals() as signals:
    os.kill(os.getpid(), signal.SIGTERM)  # Caught by the sweep's handler: no child yet.
    for _ in range(100):
      if signals.received:
        break
      time.sleep(0.01)
    assert signals.received == signal.SIGTERM
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
      with signals.forwarding(child):
        code = child.wait(timeout=10)
    finally:
      if child.poll() is None:
        child.kill()
  assert code == -signal.SIGTERM
