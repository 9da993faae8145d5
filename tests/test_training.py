"""Training end to end on tiny SCAN runs: loss falls, checkpoints resume exactly,
sharded equals single-device (train_step on its own: test_train_step.py).

Each run reads its data, traces its programs again (persistent cache or not) and
evaluates at its last step, so the tests share what they can: one prepared SCAN
for the session (process_helpers.scan_tfds_dir), one uninterrupted 20-step run
(`straight`, copied where a test writes into it; its checkpoint 10 is what a run
of 10 steps leaves), one run for the three decoding tests (`decoding_run`), and,
wherever no learning or evaluation value is checked, `experiment`: the first
2000 training pairs (read in a quarter of the time; the same vocabulary and
batch shapes, so the same compiled step) and 3 eval sentences (one batch shape
to evaluate and decode)."""

import contextlib
import glob
import logging
import os
import re
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import process_helpers
from tests.helpers import ADAM_EPS_NOTE, tiny_experiment
from transformer import checkpoints, launch, optim, sharding, state as state_lib, steps, training
from transformer import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The splits of the runs whose learning and evaluation values are not checked:
# 2000 of the 16728 training pairs (more than the 20-step runs read), and 3 eval
# sentences, one batch shape (test[:200] has nine).
SMALL_TRAIN, SMALL_EVAL = "train[:2000]", "test[:3]"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return process_helpers.scan_tfds_dir(tmp_path_factory)  # Prepared once a session.


def experiment(data_dir, **train):
  """tiny_experiment trained on SMALL_TRAIN, evaluated (and decoded) on SMALL_EVAL."""
  config = tiny_experiment(data_dir, **train)
  config.data.train_split, config.data.eval_split = SMALL_TRAIN, SMALL_EVAL
  return config


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_dir):
  """An uninterrupted 20-step run (checkpoints 10 and 20) of experiment(num_steps=20,
  eval_every=100): read by the resume tests, copied by those that write into it."""
  workdir = str(tmp_path_factory.mktemp("straight") / "run")
  training.train_and_evaluate(experiment(data_dir, num_steps=20, eval_every=100), workdir)
  return workdir


def copy_of(workdir, target, up_to=None):
  """A copy of `workdir` at `target`; with `up_to`, without the checkpoints after
  that step: what a run that ended there leaves."""
  shutil.copytree(workdir, target)
  if up_to is not None:
    ckpt = os.path.join(target, "checkpoints")
    for step in checkpoints.complete_steps(ckpt):
      if step > up_to:
        shutil.rmtree(os.path.join(ckpt, str(step)))
  return str(target)


def restore_params(workdir, config, step=None):
  mesh = sharding.make_mesh(jax.devices()[:1])
  from transformer.data import tokenizer
  vocab = tokenizer.Tokenizer.load(os.path.join(workdir, "spm.model")).vocab_size
  _, _, abstract, shardings, _ = state_lib.build(config, vocab, mesh)
  state, data_state, restored_step = checkpoints.Checkpointer(
      os.path.join(workdir, "checkpoints"), read_only=True).restore(abstract, shardings, step)
  return state, checkpoints.stop_marks(data_state)[0], restored_step


def test_short_run_learns_checkpoints_logs_and_resumes(tmp_path, data_dir, caplog,
                                                       monkeypatch):
  # Checkpoints every 7 steps, logs every 5: each log still averages its 5 steps.
  config = tiny_experiment(data_dir, decode_every=30, decode_examples=50, checkpoint_every=7)
  workdir = str(tmp_path / "run")
  log_train, averaged = training._Progress.log_train, []  # pylint: disable=protected-access
  rates = []

  def counted(self, step, metrics_list, learning_rate):
    averaged.append((step, len(metrics_list)))
    rates.append((step, learning_rate))
    return log_train(self, step, metrics_list, learning_rate)

  monkeypatch.setattr(training._Progress, "log_train", counted)  # pylint: disable=protected-access
  with caplog.at_level(logging.INFO):
    first = training.train_and_evaluate(config, workdir)
  assert averaged == [(step, 5) for step in range(5, 31, 5)]
  # The learning rate logged at step s is the one step s's update used: the
  # schedule after s - 1 updates (in warmup here, so each step's differs).
  _, schedule = optim.make_optimizer(config.optim, config.model.d_model)
  assert rates == [(step, pytest.approx(float(schedule(step - 1)))) for step in range(5, 31, 5)]
  assert rates[0][1] != pytest.approx(float(schedule(5)))
  waits = [float(w) for w in re.findall(r"train/input_wait_fraction=([0-9.e-]+)",
                                         caplog.text)]
  assert len(waits) == 30 // 5 and all(0 <= w <= 1 for w in waits)
  assert re.search(r"notes: [0-9.]+ steps/s, 100.0% \(30/30\)", caplog.text)
  # Learning, against thresholds an untrained model misses: after one step it
  # scores 0.10 teacher-forced accuracy and 0.14 position-wise token accuracy of
  # greedy decoding; these 30 steps 0.44 and 0.28 (over seeds 0-9: 0.43-0.64 and
  # 0.28-0.48). Exact match is still 0: SCAN needs ~1000 steps.
  decoded = re.findall(r"\[30\] decode/.*decode/token_accuracy=([0-9.]+)", caplog.text)
  assert first["accuracy"] > 0.4
  assert float(decoded[0]) > 0.2 and first["exact_match"] == 0.0
  assert os.listdir(os.path.join(workdir, "checkpoints_best")) == ["30"]
  assert workdir_lib.restore(workdir, "best").step == 30  # Read best first, by its value.
  # A uniform prediction (where training starts) costs log(vocabulary size).
  assert first["loss"] < 0.75 * np.log(23)
  assert max(map(int, os.listdir(os.path.join(workdir, "checkpoints")))) == 30
  assert glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
  assert os.path.exists(os.path.join(workdir, "config.json"))
  config.train.num_steps = 40
  second = training.train_and_evaluate(config, workdir)  # resumes at 30
  state, data_state, step = restore_params(workdir, config)
  assert step == 40 and int(state.step) == 40
  assert second["loss"] < first["loss"]
  config.train.num_steps = 35  # Below the checkpoint: nothing to train, and it says so.
  caplog.clear()
  with caplog.at_level(logging.INFO):
    training.train_and_evaluate(config, workdir)
  assert ("The checkpoint is at step 40, train.num_steps=35: nothing to train (raise "
          "--config.train.num_steps to go on).") in caplog.text
  assert restore_params(workdir, config)[2] == 40


@pytest.mark.parametrize("ahead", [None, 3])
def test_the_loop_runs_at_most_steps_ahead_of_the_devices(tmp_path, data_dir, monkeypatch,
                                                         ahead):
  """Dispatch is asynchronous: the loop could queue every step up to its next log
  or checkpoint step, and a stop signal was then answered only after all of them
  (25 steps, 14 s, in a default run). With steps made slow on the devices (a
  chain of products in each), each step is dispatched with at most
  `steps_ahead()` before it unfinished: one on a CPU (None: the default here),
  more where it says so (as on a GPU), and then the queue does fill."""
  if ahead is None:
    assert jax.default_backend() == "cpu" and training.steps_ahead() == 1
  else:
    monkeypatch.setattr(training, "steps_ahead", lambda: ahead)
  losses, in_flight = [], []
  compile_steps = steps.compile_steps

  def slowed(*args, **kwargs):
    train_fn, eval_fn = compile_steps(*args, **kwargs)

    @jax.jit
    def slow_step(state, batch):
      state, metrics = train_fn(state, batch)
      x = jax.lax.fori_loop(0, 20, lambda _, x: jnp.tanh(x @ x), jnp.eye(512) * 0.5)
      return state.replace(step=state.step + jnp.isnan(x.sum()).astype(state.step.dtype)), metrics

    def dispatch(state, batch):
      in_flight.append(sum(not loss.is_ready() for loss in losses))
      state, metrics = slow_step(state, batch)
      losses.append(metrics["loss"])
      return state, metrics

    return dispatch, eval_fn

  monkeypatch.setattr(steps, "compile_steps", slowed)
  config = experiment(data_dir, num_steps=8, log_every=8, eval_every=8, checkpoint_every=8)
  training.train_and_evaluate(config, str(tmp_path / "w"))
  assert len(in_flight) == 8, in_flight
  assert max(in_flight) <= 1 if ahead is None else 1 < max(in_flight) <= ahead, in_flight


def test_a_failed_last_save_is_raised_when_called_while_handling_an_error(tmp_path, data_dir,
                                                                         monkeypatch):
  """Training called from an except block (a notebook's retry, a fallback):
  the close took the caller's handled exception for one that stopped the run,
  so a failed save of the last checkpoint was only logged, and the call
  returned as if all were saved."""
  close = checkpoints.Checkpointer.close

  def failing_close(self):
    close(self)
    if os.path.basename(self.directory) == workdir_lib.CHECKPOINT_DIRS["latest"]:
      raise checkpoints.CheckpointSaveError("checkpoint 2 could not be written (stand-in)")

  monkeypatch.setattr(checkpoints.Checkpointer, "close", failing_close)
  config = experiment(data_dir, num_steps=2, eval_every=100)
  try:
    raise KeyError("the caller's own")
  except KeyError:
    with pytest.raises(checkpoints.CheckpointSaveError, match="checkpoint 2 could not be"):
      training.train_and_evaluate(config, str(tmp_path / "w"))


def test_resume_equals_uninterrupted_run(tmp_path, data_dir, straight, monkeypatch):
  """Bitwise: the restart restores exactly the saved arrays and the data iterator
  position, and the same compiled step runs on the same inputs on one CPU. The
  run stops between checkpoints (at step 15; the last save is step 10), so steps
  11-15 and the batches they read are lost and must be redone from the step-10
  position. (A clean stop at the current step, and kills at random moments of
  real processes, are test_faults.py's.)"""
  stopped = str(tmp_path / "stopped")

  place_batch, placed = sharding.place_batch, []

  def stop_before_step_16(batch, mesh):  # The loop places one train batch a step.
    placed.append(1)
    if len(placed) == 16:
      raise KeyboardInterrupt
    return place_batch(batch, mesh)

  monkeypatch.setattr(sharding, "place_batch", stop_before_step_16)
  with pytest.raises(KeyboardInterrupt):
    training.train_and_evaluate(experiment(data_dir, num_steps=20, eval_every=100), stopped)
  monkeypatch.setattr(sharding, "place_batch", place_batch)
  assert os.listdir(os.path.join(stopped, "checkpoints")) == ["10"]
  training.train_and_evaluate(experiment(data_dir, num_steps=20, eval_every=100), stopped)

  config = experiment(data_dir)
  a, data_a, _ = restore_params(straight, config, 20)
  b, data_b, _ = restore_params(stopped, config, 20)
  assert data_a == data_b
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_nan_loss_stops_with_message_and_keeps_last_good_checkpoint(tmp_path, data_dir,
                                                                   straight):
  workdir = copy_of(straight, tmp_path / "nan", up_to=10)  # A 10-step run's.
  config = experiment(data_dir, num_steps=30, eval_every=100, checkpoint_every=5)
  config.optim.learning_rate_scale = 1e30  # Diverges at once.
  with pytest.raises(FloatingPointError, match=r"training (loss|update norm|param norm) is "
                     r"(nan|inf) at step 1[1-5].*last good checkpoint is step 10"):
    training.train_and_evaluate(config, workdir)
  state, _, step = restore_params(workdir, config)
  assert step == 10
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))


def test_axes_this_mesh_cannot_use_stop_before_training():
  """Sizes known only once the mesh is: a model axis of -1 that does not divide
  the heads. (Budgets too small for a data axis' rows serve evaluation and
  decoding anyway: tests/test_data_pipeline.py; an eval split without examples
  stops before the vocabulary: tests/test_data_text.py.)"""
  from configs import default  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.model.num_heads, config.train.mesh = 2, "data=1,model=-1"
  on_8 = types.SimpleNamespace(shape={"data": 1, "model": 8})
  with pytest.raises(ValueError, match=r"config.train.mesh='data=1,model=-1': the model axis "
                     r"\(8, of \d+ devices\) must divide model.num_heads=2"):
    training._check_model_axis(config, on_8)  # pylint: disable=protected-access


def test_fsdp_that_splits_no_parameter_is_warned_of(caplog):
  """train.fsdp on 3 data devices with a small model split nothing, without a word
  (arrays under 2**14 values, or no axis 3 divides, stay whole)."""
  from configs import default  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.train.fsdp = True
  with caplog.at_level(logging.WARNING):
    training._warn_of_idle_fsdp(config, 4, 16)  # pylint: disable=protected-access
    training._warn_of_idle_fsdp(config, 1, 0)  # pylint: disable=protected-access
    assert "train.fsdp" not in caplog.text
    training._warn_of_idle_fsdp(config, 3, 0)  # pylint: disable=protected-access
  assert ("train.fsdp is on, but no parameter is split over the data axis (3 devices): "
          "FSDP splits arrays of at least 16384 values" in caplog.text)
  caplog.clear()
  config.train.fsdp = False
  training._warn_of_idle_fsdp(config, 3, 0)  # pylint: disable=protected-access
  assert "train.fsdp" not in caplog.text


def test_a_stop_on_an_evaluation_step_resumes_to_the_uninterrupted_runs_record(
    tmp_path, data_dir, monkeypatch, caplog):
  """A SIGTERM during step 4, which evaluates and decodes, and one during step 9
  (off every cadence): the stops skip step 4's evaluation and decoding and save
  checkpoints marked as a stop's. Resumed, the run evaluates and decodes step 4
  first (decoding only where this run decodes), keeps the same best checkpoint,
  logs every step's training metrics, and ends in the uninterrupted run's state;
  averaging names a stop's checkpoint among those it averages. A stop on a
  decoding step resumed with decoding off owes only the evaluation (resumed from
  a copy of the workdir the stop at step 4 left)."""
  from transformer import average_checkpoints, preemption  # pylint: disable=g-import-not-at-top
  config = lambda: experiment(data_dir, num_steps=12, eval_every=4, decode_every=4,
                              decode_examples=0, checkpoint_every=6, keep_checkpoints=3,
                              log_every=4)
  logged = []
  write = training._Progress._write  # pylint: disable=protected-access

  def recording(self, prefix, step, metrics):
    logged.append((prefix, step))
    return write(self, prefix, step, metrics)

  monkeypatch.setattr(training._Progress, "_write", recording)  # pylint: disable=protected-access
  straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
  again = str(tmp_path / "again")
  training.train_and_evaluate(config(), straight)
  logged.clear()
  stop_after = preemption.StopSignals.stop_after
  for stop in (4, 9):
    monkeypatch.setattr(preemption.StopSignals, "stop_after",
                        lambda self, step, stop=stop: step == stop or stop_after(self, step))
    with pytest.raises(preemption.Preempted):
      training.train_and_evaluate(config(), stopped)
    monkeypatch.setattr(preemption.StopSignals, "stop_after", stop_after)
    if stop == 4:
      assert checkpoints.complete_steps(os.path.join(stopped, "checkpoints")) == [4]
      shutil.copytree(stopped, again)  # Resumed below with decoding off.
  training.train_and_evaluate(config(), stopped)
  for prefix in ("eval", "decode"):
    assert sorted(s for p, s in logged if p == prefix) == [4, 8, 12], prefix
  assert sorted({s for p, s in logged if p == "train"}) == [4, 8, 9, 12]  # 9: the stop's steps.
  assert (os.listdir(os.path.join(stopped, "checkpoints_best"))
          == os.listdir(os.path.join(straight, "checkpoints_best")))
  # The stops' checkpoints stay until they age out: a kill before the next save
  # resumes from them.
  assert sorted(map(int, os.listdir(os.path.join(stopped, "checkpoints")))) == [6, 9, 12]
  a, data_a, _ = restore_params(straight, config(), 12)
  b, data_b, _ = restore_params(stopped, config(), 12)
  assert data_a == data_b
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with caplog.at_level(logging.WARNING):
    average_checkpoints.average_checkpoints(stopped, last=3)
  assert "Averaged steps [6, 9, 12] include 9, saved by a stop" in caplog.text
  # A stop on a decoding step, resumed with decoding off: only the evaluation is owed.
  logged.clear()
  no_decoding = config()
  no_decoding.train.decode_every, no_decoding.train.num_steps = 0, 5
  training.train_and_evaluate(no_decoding, again)
  assert [(p, s) for p, s in logged if p in ("eval", "decode")] == [("eval", 4), ("eval", 5)]


@pytest.fixture(scope="module")
def decoding_run(tmp_path_factory, data_dir):
  """One 8-step run decoding at steps 2, 4, 6 and 8 with train.decode_examples=0,
  its decodings scored 0.2, 0.5, 0.5, 0.3 (in place of their exact match), that
  records what the three tests below check: the sentences each decoding got,
  and the timed sections open whenever the kept best's value is read."""
  record = types.SimpleNamespace(decoded=[], calls=[],
                                 workdir=str(tmp_path_factory.mktemp("decoding") / "w"))
  inside, scores = [], iter([0.2, 0.5, 0.5, 0.3])
  timed, best_value = training._Progress.timed, checkpoints.Checkpointer.best_value  # pylint: disable=protected-access
  evaluate_examples = training.inference.evaluate_examples

  @contextlib.contextmanager
  def tracked(self, name):
    inside.append(name)
    try:
      with timed(self, name):
        yield
    finally:
      inside.pop()

  def recorded(self, metric):
    record.calls.append(list(inside))
    return best_value(self, metric)

  def scored(model, params, examples, references, *args, **kwargs):
    record.decoded.append((len(examples), len(references)))
    decoded, hypotheses = evaluate_examples(model, params, examples, references, *args,
                                            **kwargs)
    return {**decoded, "exact_match": next(scores)}, hypotheses

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(training._Progress, "timed", tracked)  # pylint: disable=protected-access
    patch.setattr(checkpoints.Checkpointer, "best_value", recorded)
    patch.setattr(training.inference, "evaluate_examples", scored)
    training.train_and_evaluate(experiment(data_dir, num_steps=8, decode_every=2,
                                           decode_examples=0, eval_every=100), record.workdir)
  return record


def test_the_wait_for_the_kept_best_is_timed_as_saving(decoding_run):
  """Reading the kept best's value waits for its save in flight: that time is
  saving's (left out of tokens/s), not training's."""
  assert decoding_run.calls == [["save"]] * 4


def test_the_best_checkpoint_is_the_highest_score_and_a_tie_keeps_the_earlier(decoding_run):
  """Decoding at steps 2, 4, 6, 8 scores 0.2, 0.5, 0.5, 0.3: the kept best is
  step 4's (a higher score replaces it, an equal one does not)."""
  best_dir = os.path.join(decoding_run.workdir, workdir_lib.CHECKPOINT_DIRS["best"])
  assert checkpoints.complete_steps(best_dir) == [4]
  assert checkpoints.metric_value(best_dir, 4, "exact_match") == 0.5


def test_decode_examples_0_decodes_the_whole_eval_split(decoding_run):
  """train.decode_examples = 0 decodes every sentence of the eval split (what the
  table's note calls 'all'), not a prefix of it: the score that picks the best
  checkpoint is of the whole split."""
  assert decoding_run.decoded == [(3, 3)] * 4  # SMALL_EVAL's 3 sentences.


def test_nan_before_any_checkpoint_says_there_is_none():
  class NoCheckpoints:
    directory = "w/checkpoints"

    def latest_step(self):
      return None

  finite = {"loss": 1.0, "grad_norm": 1.0, "update_norm": 1.0, "param_norm": 1.0}
  with pytest.raises(FloatingPointError, match=r"^training loss is nan at step 3; stopping\. "
                     r"There is no checkpoint yet in w/checkpoints \(lower"):
    training._check_finite(3, [finite, finite, {**finite, "loss": float("nan")}],  # pylint: disable=protected-access
                           NoCheckpoints())


def test_update_that_blows_up_parameters_is_never_saved(tmp_path, data_dir, monkeypatch):
  """The loss is computed before a step's update: an update that makes the
  parameters infinite at a checkpoint (and decode) step has a finite loss. The
  guard also checks the norms after the update, so neither the checkpoint nor
  the 'best' checkpoint of that step is written."""
  import optax  # pylint: disable=g-import-not-at-top
  from transformer import optim  # pylint: disable=g-import-not-at-top
  make_optimizer = optim.make_optimizer

  def blowing_up_at_update_8(config, d_model):  # The update of step 8 is scaled by inf.
    tx, schedule = make_optimizer(config, d_model)
    return optax.chain(tx, optax.scale_by_schedule(
        lambda count: jnp.where(count == 7, jnp.inf, 1.0))), schedule

  monkeypatch.setattr(optim, "make_optimizer", blowing_up_at_update_8)
  workdir = str(tmp_path / "blowup")
  config = experiment(data_dir, num_steps=12, eval_every=100, log_every=100,
                      checkpoint_every=4, decode_every=4, decode_examples=0)
  with pytest.raises(FloatingPointError, match=r"training (param|update) norm is (nan|inf) "
                     r"at step 8.*last good checkpoint is step 4"):
    training.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]
  assert os.listdir(os.path.join(workdir, "checkpoints_best")) in (["4"], [])
  state, _, step = restore_params(workdir, config)
  assert step == 4
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))


def test_evaluation_rows_are_split_over_hosts(data_dir, monkeypatch):
  """With H hosts, each places its own 1/H of every evaluation batch's rows: the
  hosts' token counts add up to the single-host count (each host passing the
  whole batch counted every row H times). Two hosts are stood in for by
  evaluating as process 0 and then as process 1 of 2."""
  config = tiny_experiment(data_dir)
  mesh = sharding.make_mesh(jax.devices()[:1])
  model, tx, _, shardings, _ = state_lib.build(config, 23, mesh)
  params = state_lib.init_state(model, tx, config, shardings).params
  _, eval_fn = steps.compile_steps(model, tx, config, mesh, shardings)
  rng = np.random.default_rng(0)
  examples = [(rng.integers(4, 23, size=n).astype(np.int32),
               rng.integers(4, 23, size=n + 2).astype(np.int32)) for n in range(1, 30)]
  whole = steps.evaluate_loss(eval_fn, params, examples, config, mesh)
  assert whole["tokens"] == sum(len(t) for _, t in examples)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  shares = []
  for host in (0, 1):
    monkeypatch.setattr(jax, "process_index", lambda host=host: host)
    shares.append(steps.evaluate_loss(eval_fn, params, examples, config, mesh))
  assert shares[0]["tokens"] + shares[1]["tokens"] == whole["tokens"]
  assert 0 < shares[0]["tokens"] < whole["tokens"]
  nll = sum(m["nll"] * m["tokens"] for m in shares) / whole["tokens"]
  np.testing.assert_allclose(nll, whole["nll"], rtol=1e-5)


def test_sharded_step_equals_single_device():
  # Eight CPU devices, also on a machine with a GPU (which would be the one device).
  env = process_helpers.command_env(**launch.cpu_devices(os.environ, 8))
  out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "sharded_step_check.py")],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert ("sharded == single-device over 4 steps: data=8,model=1 fsdp, "
          "data=2,model=4 fsdp") in out.stdout
  assert ("decoding with FSDP- and tensor-parallel-sharded parameters, two batches at a "
          "time == single-device, one at a time: greedy, beam") in out.stdout
  assert "the RNN: data=8 fsdp == single-device over 4 steps" in out.stdout


def test_unreadable_or_unfinished_checkpoints_fall_back_to_the_last_good_one(tmp_path, data_dir,
                                                                            straight):
  workdir = copy_of(straight, tmp_path / "corrupt")
  config = experiment(data_dir, num_steps=20, eval_every=100)
  ckpt = os.path.join(workdir, "checkpoints")
  shutil.rmtree(os.path.join(ckpt, "20", "state"))  # A damaged newest checkpoint.
  # What a save killed half-way leaves: Orbax's temporary directory, never renamed.
  os.makedirs(os.path.join(ckpt, "30.orbax-checkpoint-tmp-1234", "state"))
  state, data_state, step = restore_params(workdir, config)
  assert step == 10 and int(state.step) == 10
  config.train.num_steps = 12
  training.train_and_evaluate(config, workdir)  # Resumes from 10, not from scratch.
  assert restore_params(workdir, config)[2] == 12
  assert os.path.isdir(os.path.join(ckpt, "20.unreadable"))  # Set aside, not deleted.


def test_resume_on_another_data_parallel_size_reads_the_same_batches(tmp_path, data_dir,
                                                                     straight, monkeypatch):
  """The packed batches of 512 tokens have 8 rows on a data axis of 1 and of 2
  (two devices stood in for on one): a resume on the other size goes on with the
  batches an uninterrupted run reads. Where the rows differ, the pipeline refuses
  (test_data_pipeline). The first 10 steps: the uninterrupted run's checkpoint 10."""
  moved = copy_of(straight, tmp_path / "moved", up_to=10)
  monkeypatch.setattr(sharding, "data_size", lambda mesh: 2)
  training.train_and_evaluate(experiment(data_dir, num_steps=20, eval_every=100), moved)
  config = experiment(data_dir)
  (a, data_a, step_a), (b, data_b, _) = (restore_params(moved, config),
                                         restore_params(straight, config))
  assert step_a == 20 and data_a == data_b
  np.testing.assert_allclose(np.asarray(jax.tree.leaves(a.params)[0]),
                             np.asarray(jax.tree.leaves(b.params)[0]), rtol=1e-5, atol=1e-6)


def test_resume_with_more_gradient_accumulation_steps_goes_on_with_the_same_batches(
    tmp_path, data_dir):
  """A run that no longer fits in memory resumes with train.grad_accum_steps=2:
  the packed batches keep their 8 rows, so it reads the uninterrupted run's
  batches and makes its updates (no dropout: micro-batches draw other masks).
  Where the rows differ, the pipeline refuses (test_data_pipeline). The first 10
  steps: the uninterrupted run's checkpoint 10."""
  def config(num_steps, k=1):
    c = experiment(data_dir, num_steps=num_steps, eval_every=100, grad_accum_steps=k)
    c.model.dropout = 0.0
    c.optim.adam_eps = ADAM_EPS_NOTE
    return c
  straight = str(tmp_path / "straight")
  training.train_and_evaluate(config(20), straight)
  moved = copy_of(straight, tmp_path / "moved", up_to=10)
  training.train_and_evaluate(config(20, k=2), moved)
  (a, data_a, step_a), (b, data_b, _) = (restore_params(moved, config(20)),
                                         restore_params(straight, config(20)))
  assert step_a == 20 and data_a == data_b
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


# Orbax's own restore (no target) reads the shardings from the checkpoint, and says so.
@pytest.mark.filterwarnings("ignore:Sharding info not provided")
def test_a_flipped_bit_in_a_checkpoint_is_caught_by_its_checksums(tmp_path, data_dir, straight):
  """One bit flipped in the newest checkpoint's largest data file: Orbax alone
  restores it without an error, one array changed (zstd decompresses the damage
  into other numbers); the checksums saved with it catch that, and restoring
  falls back to the previous checkpoint. The data iterator's position is
  checked as well. A checkpoint without checksums (as written before they
  existed) restores unchecked."""
  import orbax.checkpoint as ocp
  workdir = copy_of(straight, tmp_path / "flipped")
  config = experiment(data_dir, num_steps=20, eval_every=100)
  ckpt = os.path.join(workdir, "checkpoints")
  clean = jax.tree.leaves(ocp.PyTreeCheckpointer().restore(os.path.join(ckpt, "20", "state")))
  largest = max(glob.glob(os.path.join(ckpt, "20", "state", "**", "d", "*"), recursive=True),
                key=os.path.getsize)
  original = open(largest, "rb").read()
  data = bytearray(original)
  data[len(data) // 2] ^= 0x10
  open(largest, "wb").write(data)
  damaged = jax.tree.leaves(ocp.PyTreeCheckpointer().restore(os.path.join(ckpt, "20", "state")))
  assert sum(not np.array_equal(a, b) for a, b in zip(clean, damaged)) == 1
  assert restore_params(workdir, config)[2] == 10
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"checkpoint 20 .* checksum mismatch in [^,]*\]: its files were changed"):
    restore_params(workdir, config, step=20)
  # The data position is checked too: valid JSON, one number changed.
  open(largest, "wb").write(original)
  position = os.path.join(ckpt, "20", "data", "metadata")
  saved = open(position).read()
  assert '"index": 20' in saved
  open(position, "w").write(saved.replace('"index": 20', '"index": 21'))
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"checksum mismatch in the data position"):
    restore_params(workdir, config, step=20)
  open(position, "w").write(saved)
  assert restore_params(workdir, config, step=20)[1]["index"] == 20
  open(largest, "wb").write(data)
  shutil.rmtree(os.path.join(ckpt, "20", "checksums"))
  assert restore_params(workdir, config, step=20)[2] == 20
