"""Averages the parameters of the last N checkpoints (section 6.1: base models
average the last 5 checkpoints, big models the last 20).

  python -m transformer.average_checkpoints --workdir DIR [--last N]   # default: train.keep_checkpoints

Writes a full training state to DIR/checkpoints_averaged/<newest step>/: the
averaged parameters with the newest checkpoint's step, optimizer state, rng and
data-iterator state, so `--checkpoint averaged` loads it like any other. The
steps averaged are listed in DIR/checkpoints_averaged/averaged.json. A previous
average is replaced only once the new one is completely written, and a kill at
any moment leaves the previous one readable (see _replace_dir). It holds the
workdir's lock (transformer/lock.py): it does not run beside a training.
"""

if __name__ == "__main__":  # A SIGTERM: one line, the workdir unlocked (sigterm.py).
  from transformer import sigterm
  sigterm.watch("average_checkpoints", "; an average is used only once complete "
                "(checkpoints_averaged/averaged.json names its steps); rerun the same command")

import glob
import json
import os
import shutil

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp

from transformer import checkpoints, distributed, lock, runtime, sigterm
from transformer import workdir as workdir_lib



def mean_params(param_trees):
  """Elementwise mean of an iterable of parameter trees, summed in float32 and cast
  back to each leaf's dtype. Trees are consumed one at a time: two copies in memory
  however many are averaged."""
  total, dtypes, count = None, None, 0
  for tree in param_trees:
    tree32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
    if total is None:
      total, dtypes = tree32, jax.tree.map(lambda x: x.dtype, tree)
    else:
      total = jax.tree.map(jnp.add, total, tree32)
    count += 1
  if not count:
    raise ValueError("nothing to average")
  return jax.tree.map(lambda s, dtype: (s / count).astype(dtype), total, dtypes)


OLD_INFIX = ".old"  # FINAL.old<pid>: the previous average, moved aside by <pid>.


def _replace_dir(new, final):
  """Moves the completed directory `new` to `final`, keeping the old `final` until
  the new one is in place. Two renames, not one: a kill between them leaves no
  `final` but the previous one as FINAL.old<pid>, which readers use
  (workdir.checkpoint_location) and the next run puts back (_recover)."""
  old = f"{final}{OLD_INFIX}{os.getpid()}"
  if os.path.lexists(final):
    os.rename(final, old)
  os.rename(new, final)
  _remove(old)


def _remove(path):
  """Removes a previous average: a directory, or a link to one (only the link: the
  new average is a directory in the workdir, where the link was)."""
  if os.path.islink(path):
    os.remove(path)
  else:
    shutil.rmtree(path, ignore_errors=True)


def _recover(final):
  """Puts back the previous average that a killed run had moved aside and not
  replaced; removes those it had replaced. (Its unfinished new average, in
  FINAL.tmp, goes before the next one is written.)"""
  moved = sorted(glob.glob(glob.escape(final) + OLD_INFIX + "*"),
                 key=lambda path: os.lstat(path).st_mtime)
  if moved and not os.path.lexists(final):
    logging.warning("Restoring the previous average %s from %s (an averaging was killed "
                    "while replacing it).", final, moved[-1])
    os.rename(moved.pop(), final)
  for path in moved:
    _remove(path)


def average_checkpoints(workdir, last=None, mesh=None):
  """Averages the newest `last` checkpoints of workdir/checkpoints into
  workdir/checkpoints_averaged; returns (step written, steps averaged). `last`
  defaults to the checkpoints training keeps (train.keep_checkpoints: 5 for
  base, 20 for big, as the paper averaged)."""
  if last is not None and last < 1:
    raise ValueError(f"last must be >= 1, got {last}")
  workdir_lib.require_directory(workdir)
  if last is None:
    last = workdir_lib.load_config(workdir).train.keep_checkpoints
  # It writes the workdir, so it takes the writer's lock: never beside a training.
  with lock.hold(workdir, "average_checkpoints", primary=jax.process_index() == 0):
    return _average(workdir, last, mesh)


def _average(workdir, last, mesh):
  final = os.path.join(workdir, workdir_lib.CHECKPOINT_DIRS["averaged"])
  if os.path.lexists(final) and not os.path.isdir(final):  # Not ours to replace.
    raise ValueError(f"{final} is not a directory of averaged checkpoints: move it away "
                     "and rerun (nothing was averaged)")
  if jax.process_index() == 0:
    _recover(final)
  opened = workdir_lib.open_workdir(workdir, mesh)
  source, _ = opened.checkpoints("latest")
  steps = source.steps()
  if len(steps) < last:
    raise ValueError(f"asked to average the last {last} checkpoints, but {source.directory} has "
                     f"{len(steps)} (steps {steps})")
  chosen = steps[-last:]
  newest, stops = {}, []

  def restored_params():
    for step in chosen:
      state, data_state, _ = source.restore(opened.built.abstract, opened.built.shardings,
                                            step)
      position, stopped, _ = checkpoints.stop_marks(data_state)
      if stopped:
        stops.append(step)
      newest.update(state=state, data_state=position)
      yield state.params

  params = mean_params(restored_params())
  if stops:  # Off the checkpoint_every cadence: not what an uninterrupted run averages.
    logging.warning("Averaged steps %s include %s, saved by a stop (a preemption or Ctrl-C) "
                    "between regular checkpoints.", chosen,
                    ", ".join(map(str, stops)))
  # The newest checkpoint's step, optimizer state, rng and data position.
  averaged = newest["state"].replace(params=params)

  # One name in every process of a multi-process job: they write one checkpoint.
  # (Not a files.temporary_path: the lock's clean-up never takes it for a dead writer's;
  # process 0 removes a killed run's before anyone writes.)
  staging = f"{final}.tmp"
  if jax.process_index() == 0:
    shutil.rmtree(staging, ignore_errors=True)
  distributed.barrier("average_checkpoints staging")  # Removed before anyone writes.
  writer = checkpoints.Checkpointer(staging, keep=1)
  try:
    try:
      writer.save(chosen[-1], averaged, newest["data_state"])
    finally:
      writer.close()
  except checkpoints.CheckpointSaveError as e:  # Its message speaks of training.
    kept = "the previous average is kept" if os.path.isdir(final) else "there is no average"
    raise checkpoints.CheckpointSaveError(
        f"the average of steps {chosen} could not be written to {staging}: "
        f"{e.reason or e}; {kept}", e.step, e.reason) from e
  # Every process has finished its part (close() checks the staged step) before
  # process 0 renames the staging directory away from a slower one's check.
  distributed.barrier("average_checkpoints written")
  if jax.process_index() == 0:
    with open(os.path.join(staging, workdir_lib.AVERAGED_RECORD), "w") as f:
      json.dump({"step": chosen[-1], "averaged_steps": chosen, "last": last}, f)
    _replace_dir(staging, final)
  return chosen[-1], chosen


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  with workdir_lib.command("average_checkpoints", flags.FLAGS.workdir):
    step, chosen = average_checkpoints(flags.FLAGS.workdir, flags.FLAGS.last)
  sigterm.hand_over()  # Done and unlocked: nothing left for SIGTERM's message to speak of.
  if jax.process_index() == 0:
    with runtime.one_line_errors("average_checkpoints"):  # A full disk under stdout: one line.
      print(f"averaged steps {chosen} into checkpoints_averaged/{step}")


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "Training workdir.", required=True)
  flags.DEFINE_integer("last", None, "How many of the newest checkpoints to average; "
                       "default the workdir's train.keep_checkpoints (the paper: 5 for base, "
                       "20 for big).", lower_bound=1)
  runtime.run(main, "average_checkpoints")
