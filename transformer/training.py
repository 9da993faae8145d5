"""Training: the train_and_evaluate loop around steps.py's jitted steps.

  python train.py --config configs/default.py --workdir runs/default
"""

import contextlib
import json
import os
import time

from absl import logging
import jax
import numpy as np

from transformer import checkpoints, data as data_lib, files, inference, lock, steps
from transformer import metrics as metrics_lib
from transformer import distributed, preemption, runtime, sharding, state as state_lib
from transformer import workdir as workdir_lib
from transformer import config as config_lib
from transformer.config import check_config, check_model_axis, resolve_dtype


def load_data(config, workdir, mesh):
  """The training and evaluation data; every host reads its own rows of each
  global batch. Process 0 prepares the dataset and the vocabulary first, so that
  the others load what it wrote instead of writing the same files at once."""
  return distributed.process_0_first(lambda: data_lib.get_train_and_eval(
      config.data, workdir=workdir, seed=config.seed,
      batch_multiple=sharding.data_size(mesh) * config.train.grad_accum_steps,
      shard_index=jax.process_index(), shard_count=jax.process_count()), "load_data")


def save_config(config, workdir) -> None:
  files.write_atomic(os.path.join(workdir, "config.json"),
                     config.to_json_best_effort(indent=2, sort_keys=True))


class _Progress:
  """Training metrics through clu: its writers (TensorBoard on the first host, the
  log everywhere) and ReportProgress (steps/s, ETA, time spent in evaluation);
  tokens/s and the input wait are added here."""

  def __init__(self, workdir, total_steps, start_step, log_every):
    # Imported here: clu's writers pull in TensorFlow, seconds that nothing else needs.
    from clu import metric_writers, periodic_actions  # pylint: disable=g-import-not-at-top
    self.writer = metric_writers.create_default_writer(
        workdir, just_logging=jax.process_index() > 0, asynchronous=False)
    self.report = periodic_actions.ReportProgress(
        num_train_steps=total_steps, writer=self.writer, every_steps=log_every,
        every_secs=None)
    self.report(start_step)  # The first call only starts the clock.
    self.last_time = time.time()
    self.input_wait = 0.0  # Seconds the loop spent getting batches since the last log.
    self.excluded = 0.0  # Seconds of timed() work since the last log.

  @contextlib.contextmanager
  def timed(self, name):
    """clu's timing of `name` (its share of the time in the progress note); that
    time is left out of the next tokens/s and input wait, which are training's."""
    start = time.time()
    with self.report.timed(name, wait_jax_async_dispatch=False):
      yield
    self.excluded += time.time() - start

  def log_train(self, step, metrics_list, learning_rate):
    """Logs the mean of the steps' metrics since the last log, and tokens/s over
    the time since then, less the timed() work: the first step's compilation,
    evaluating, decoding and saving."""
    now = time.time()
    elapsed = max(now - self.last_time - self.excluded, 1e-9)
    merged = {k: float(np.mean([m[k] for m in metrics_list])) for k in metrics_list[0]}
    tokens = float(np.sum([m["tokens"] for m in metrics_list]))
    # The share of wall time the loop waited for the next batch (prefetched in a
    # thread, then placed on the devices): an upper bound on the devices' idle
    # time for want of data, since the dispatched steps run meanwhile.
    merged.update(learning_rate=learning_rate, tokens_per_sec=tokens / elapsed,
                  input_wait_fraction=self.input_wait / elapsed)
    self._write("train", step, merged)
    self.last_time, self.input_wait, self.excluded = now, 0.0, 0.0

  def log_eval(self, step, metrics):
    self._write("eval", step, metrics)

  def log_decode(self, step, metrics, sources, references, hypotheses):
    self._write("decode", step, {k: v for k, v in metrics.items()
                                 if isinstance(v, (int, float))})
    rows = [f"source: {s}  \nreference: {r}  \noutput: {h}"
            for s, r, h in list(zip(sources, references, hypotheses))[:4]]
    self.writer.write_texts(step, {"decode/examples": "\n\n".join(rows)})

  def _write(self, prefix, step, metrics):
    self.writer.write_scalars(step, {f"{prefix}/{k}": v for k, v in metrics.items()})
    self.writer.flush()

  def close(self):
    self.writer.close()


# The loss is computed before a step's update and the norms after it: a finite
# loss alone would let an update that blows the parameters up be saved.
_FINITE_METRICS = ("loss", "grad_norm", "update_norm", "param_norm")


def _check_finite(step, metrics_list, checkpointer):
  for i, m in enumerate(metrics_list):
    bad = [k for k in _FINITE_METRICS if not np.isfinite(m[k])]
    if bad:
      last = checkpointer.latest_step()
      where = (f"The last good checkpoint is step {last} in {checkpointer.directory}"
               if last is not None else
               f"There is no checkpoint yet in {checkpointer.directory}")
      raise FloatingPointError(
          f"training {bad[0].replace('_', ' ')} is {m[bad[0]]} at step "
          f"{step - len(metrics_list) + i + 1}; stopping. {where} (lower "
          "optim.learning_rate_scale, or set optim.grad_clip_norm in a new workdir: "
          "clipping changes the optimizer state).")


def _check_model_axis(config, mesh) -> None:
  """check_model_axis on the mesh's model axis, sized only now where train.mesh
  gives it as -1: a leaf it could not split would stay replicated without a word."""
  check_model_axis(config, mesh.shape[sharding.MODEL_AXIS], f", of {jax.device_count()} devices")


def _close_all(closers, in_flight=None) -> None:
  """Calls each of `closers` (None: not made) in turn, even after one fails, and
  raises the first failure, logging the later ones. (An ExitStack would raise
  the last one.) Where an error is already in flight (`in_flight`, the one that
  stopped the run: earlier, and what the command reports), the closers' are
  logged too; a stop request's (preemption.Preempted) is not an error, and the
  closers' first error, a failed save of the stop's checkpoint, takes its place."""
  first = None
  if in_flight is not None and not isinstance(in_flight, preemption.Preempted):
    first = in_flight
  for close in closers:
    if close is None:
      continue
    try:
      close()
    except BaseException as e:  # pylint: disable=broad-except
      if first is None:
        first = e
      else:
        logging.error("Also failed while closing: %s: %s", type(e).__name__, e)
  if first is not None and first is not in_flight:
    raise first


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint; returns the
  last evaluation metrics. The workdir is locked for the run (one writer,
  transformer/lock.py), and a config that changes what its checkpoints depend on
  stops the run before anything is written (workdir.check_resume_config)."""
  check_config(config)
  distributed.maybe_initialize(config.distributed, stop_at_sync_points=True)
  check_same_config_everywhere(config)
  with lock.hold(workdir, "train", primary=jax.process_index() == 0):
    distributed.check_shared_directory(workdir, "--workdir")
    workdir_lib.check_resume_config(workdir, config)  # Before config.json is replaced.
    # The config.json of a workdir that holds nothing trained yet (neither a
    # vocabulary nor checkpoints) comes first: the vocabulary trained next depends
    # on it. Another is replaced only once the data and the checkpoints have passed
    # their checks, so that a run stopped by a bad value leaves it as it was.
    if jax.process_index() == 0 and not workdir_lib.holds_training(workdir):
      save_config(config, workdir)
    return _train_and_evaluate(config, workdir)


# What each process of a job may set for itself: where its copy of the data is,
# and how far ahead it reads. (Not data.vocab_path: copies of the vocabulary
# could differ unseen before a checkpoint records its bytes.)
PER_PROCESS_FIELDS = ("data.text_dir", "data.tfds_data_dir", "data.prefetch")


def check_same_config_everywhere(config) -> None:
  """Stops every process of a job whose processes run different configs, naming
  the fields: each would otherwise train with its own values (one learning
  rate's updates here, another's there, a mixture saved) or wait forever in
  collectives that no longer match (another num_steps)."""
  values = {field: value for field, value in config_lib.flatten(
      json.loads(config.to_json_best_effort())).items() if field not in PER_PROCESS_FIELDS}
  differences = distributed.differences(values)
  if differences:
    raise distributed.JobError(
        "the job's processes run different configs (every process must give train.py the "
        f"same --config and overrides; only {', '.join(PER_PROCESS_FIELDS)} may differ): "
        + "; ".join(differences))


def _warn_of_idle_fsdp(config, data_devices: int, split_arrays: int) -> None:
  """train.fsdp that splits no parameter (none large enough, or none with an axis
  the data size divides) would leave every parameter on every device silently."""
  if config.train.fsdp and data_devices > 1 and not split_arrays:
    logging.warning("train.fsdp is on, but no parameter is split over the data axis (%d "
                    "devices): FSDP splits arrays of at least %d values along an axis "
                    "that size divides; every device holds every parameter.", data_devices,
                    sharding.FSDP_MIN_SIZE)


def steps_ahead() -> int:
  """How many steps the loop dispatches ahead of the devices' running one.

  A stop signal waits for them. A CPU step takes 0.1 s to seconds, and one step
  queued keeps the cores busy. A GPU or TPU step can take milliseconds, less than
  the host's jitter between steps: four queued keep the device busy through it
  and add four steps' time to a stop (milliseconds there; a second or two for
  the largest models, inside a scheduler's grace period; benchmarks/README.md,
  session 37).
  """
  return 1 if jax.default_backend() == "cpu" else 4


def _train_and_evaluate(config, workdir: str) -> dict:
  mesh = sharding.make_mesh(spec=config.train.mesh)
  logging.info("Devices: %d (%s) over %d host(s); mesh %s; compute dtype %s",
               jax.device_count(), jax.devices()[0].platform, jax.process_count(),
               dict(mesh.shape), resolve_dtype(config.model.dtype))

  _check_model_axis(config, mesh)
  data = load_data(config, workdir, mesh)
  logging.info("Data: %s", json.dumps(data.stats))
  # Logged once the config, the workdir and the data have passed their checks, so
  # that a bad value stops the program with one line rather than after a page.
  logging.info("Config:\n%s", config)
  model, tx, abstract, shardings, schedule = state_lib.build(
      config, data.tokenizer.vocab_size, mesh)
  specs = [tuple(s.spec) for s in jax.tree.leaves(shardings.params)]
  split = lambda axis: sum(axis in spec for spec in specs) if mesh.shape[axis] > 1 else 0
  logging.info("Parameters: %s in %d arrays, %d split over the data axis (FSDP), %d over the "
               "model axis", f"{state_lib.parameter_count(abstract.params):,}",
               len(specs), split(sharding.DATA_AXIS), split(sharding.MODEL_AXIS))
  _warn_of_idle_fsdp(config, mesh.shape[sharding.DATA_AXIS], split(sharding.DATA_AXIS))

  checkpointer = best = progress = signals = None  # Closed at the end, as far as made.
  in_flight = None  # What stopped the run, if anything did.
  try:
    directory = lambda name: os.path.join(workdir, workdir_lib.CHECKPOINT_DIRS[name])
    checkpointer = checkpoints.Checkpointer(directory("latest"),
                                            keep=config.train.keep_checkpoints)
    best_metric = metrics_lib.main_metric(config.data.dataset)
    best = checkpoints.Checkpointer(directory("best"), keep=1, best_metric=best_metric)
    decode_pairs = data.eval_pairs[:config.train.decode_examples or None]
    decode_examples = data.eval_examples[:len(decode_pairs)]
    decode_sources = [s for s, _ in decode_pairs]
    decode_references = [t for _, t in decode_pairs]
    restored = checkpointer.restore(abstract, shardings)
    owed = []  # What a stop skipped at the restored step: run before the next step.
    if restored is None:
      state = state_lib.init_state(model, tx, config, shardings)
    else:
      state, data_state, step = restored
      position, _, owed = checkpoints.stop_marks(data_state)
      if not config.train.decode_every and "decode" in owed:
        owed.remove("decode")  # Decoding is off in this run.
      data.train_batches.set_state(position)  # Checks the batches are the saved ones.
      logging.info("Resumed from step %d%s.", step,
                   f"; running its {' and '.join(owed)} that the stop skipped" if owed else "")
    start = int(state.step)
    if jax.process_index() == 0:  # The checkpoints and the data position are this config's.
      save_config(config, workdir)
      workdir_lib.record_vocabulary(workdir, config, data.tokenizer)
    if start >= config.train.num_steps:
      logging.warning("The checkpoint is at step %d, train.num_steps=%d: nothing to train "
                      "(raise --config.train.num_steps to go on).", start,
                      config.train.num_steps)

    train_fn, eval_fn = steps.compile_steps(model, tx, config, mesh, shardings)
    progress = _Progress(workdir, config.train.num_steps, start, config.train.log_every)
    # pending: the steps' metrics on the devices, fetched and checked whenever
    # the loop logs, saves or decodes; checked: those fetched since the last log.
    pending, checked, eval_metrics = [], [], {}

    def run_eval(step):
      with progress.timed("eval"):
        metrics = steps.evaluate_loss(eval_fn, state.params, data.eval_examples, config, mesh)
      eval_metrics.clear()
      eval_metrics.update(metrics)
      progress.log_eval(step, eval_metrics)

    def run_decode(step):
      """Decodes the eval sources; a better score than the kept best is saved."""
      with progress.timed("decode"):
        decoded, hypotheses = inference.evaluate_examples(
            model, state.params, decode_examples, decode_references,
            data.tokenizer, config, mesh, mode=config.train.decode_mode,
            **inference.decode_settings(config))
      progress.log_decode(step, decoded, decode_sources, decode_references, hypotheses)
      eval_metrics[best_metric] = decoded[best_metric]
      with progress.timed("save"):  # The kept best's value waits for its save in flight.
        previous = best.best_value(best_metric)
        if previous is None or decoded[best_metric] > previous:
          best.save(step, state, data.train_batches.get_state(),
                    metrics={best_metric: float(decoded[best_metric])})

    def check_pending(step, log: bool):
      """Every step since the last check is checked before anything is saved."""
      nonlocal pending, checked
      pending = jax.device_get(pending)
      _check_finite(step, pending, checkpointer)
      checked, pending = checked + pending, []
      if log and checked:
        progress.log_train(step, checked, float(schedule(step - 1)))  # Step's update.
        checked = []

    for work in owed:
      {"eval": run_eval, "decode": run_decode}[work](start)
    runtime.raise_lost_interrupt()  # A Ctrl-C at start-up stops here, if nothing did.
    signals = preemption.StopSignals().install()  # SIGTERM/SIGINT: save, then stop.
    ahead = steps_ahead()
    for step in range(start + 1, config.train.num_steps + 1):
      waited = time.perf_counter()
      batch = sharding.place_batch(next(data.train_batches), mesh)
      progress.input_wait += time.perf_counter() - waited
      # The first call compiles (synchronously, in the call) before it runs.
      with progress.timed("compile") if step == start + 1 else contextlib.nullcontext():
        state, metrics = train_fn(state, batch)
      pending.append(metrics)
      if len(pending) > ahead:
        # Without this wait, dispatch runs ahead to the next log or checkpoint
        # step, and a stop signal would be answered only after every step queued.
        jax.block_until_ready(pending[-ahead - 1])
      last = step == config.train.num_steps
      stopping = signals.stop_after(step) and not last
      saving = step % config.train.checkpoint_every == 0 or last or stopping
      logging_now = step % config.train.log_every == 0 or last or stopping
      # A stop skips this step's evaluation and decoding (a preemption's grace
      # is short); its checkpoint owes them to the resumed run.
      due = [work for work, now in (
          ("eval", step % config.train.eval_every == 0 or last),
          ("decode", config.train.decode_every and (
              step % config.train.decode_every == 0 or last))) if now]
      decoding = "decode" in due and not stopping
      if logging_now or decoding or saving:
        check_pending(step, logging_now)
      progress.report(step)
      # What the stop skips of this step's evaluation and decoding. A process
      # alone stops at this step too where the signal comes before or during
      # them (asked before each and after the last).
      skipped, works = (list(due), []) if stopping else ([], list(due))
      for i, work in enumerate(works + [None] if works else []):
        if not last and signals.stop_now():
          stopping, saving, skipped = True, True, works[i:]
          check_pending(step, log=True)
          break
        if work:
          {"eval": run_eval, "decode": run_decode}[work](step)
      if saving:
        data_state = data.train_batches.get_state()
        if stopping:  # Marked: average_checkpoints names it among regular ones.
          data_state[checkpoints.STOPPED] = True
          if skipped:
            data_state[checkpoints.OWED] = skipped
        with progress.timed("save"):  # Waits for the save before, if still writing.
          if "decode" in due and "decode" not in skipped:
            # A best checkpoint of this step is written first: a kill after
            # the regular one would leave none, and a resume from this step
            # does not decode it again. The regular save before both is
            # waited for first, so that its failure, the older, is reported.
            checkpointer.wait()
            best.wait()
          checkpointer.save(step, state, data_state)
      if stopping:
        raise preemption.Preempted(signals.signum, step, checkpointer.directory)
  except BaseException as e:
    in_flight = e
    raise
  finally:
    # A stop (non-finite values, Ctrl-C, an error) waits for the saves in flight,
    # so that no half-written checkpoint is left behind; each is closed even when
    # one before it failed (a save that failed in the background raises at close).
    _close_all([getattr(signals, "restore", None), getattr(checkpointer, "close", None),
                getattr(best, "close", None), getattr(progress, "close", None),
                getattr(data.train_batches, "close", None)], in_flight=in_flight)
  return eval_metrics
