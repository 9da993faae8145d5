"""Orbax checkpoints of the training state and the data iterator's position.

Orbax writes each step into a temporary directory and renames it when complete,
so a run killed while saving resumes from the last complete checkpoint. A
checkpoint that is present but unreadable is skipped with a warning in favour of
the next older one; a training run then renames it to <step>.unreadable (kept,
not deleted) so that it can save that step again.
"""

import os

from absl import logging
import jax
import orbax.checkpoint as ocp


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


class Checkpointer:
  """Saves and restores {state, data iterator state} under `directory`."""

  def __init__(self, directory: str, keep: int = 5, read_only: bool = False,
               best_metric: str = ""):
    """With `best_metric`, saves carry metrics and only the `keep` checkpoints
    with the highest value of that metric are kept."""
    self.directory = os.path.abspath(directory)
    self._read_only = read_only
    if read_only and not os.path.isdir(self.directory):
      raise FileNotFoundError(f"no checkpoints at {self.directory}")
    best = {}
    if best_metric:
      best = dict(best_fn=lambda metrics: metrics[best_metric], best_mode="max",
                  keep_checkpoints_without_metrics=False)
    # Read-only: no saving interval and nothing to keep, which Orbax would
    # otherwise warn about on every restore.
    # A writer (which holds the workdir's lock) removes the temporary directories
    # of saves that a kill interrupted; a reader leaves them alone.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else keep, save_interval_steps=0 if read_only else 1,
        create=not read_only, read_only=read_only, cleanup_tmp_directories=not read_only,
        **best)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "data"))

  def steps(self):
    return sorted(self._manager.all_steps())

  def latest_step(self):
    return self._manager.latest_step()

  def save(self, step: int, state, data_state: dict, metrics=None) -> None:
    self._manager.save(int(step), metrics=metrics, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)))

  def best_value(self, metric: str):
    """The best saved value of `metric` (None before the first save)."""
    step = self._manager.best_step()
    if step is None:
      return None
    return self._manager.metrics(step)[metric]

  def restore(self, abstract_state, shardings, step=None):
    """(state, data_state, step) of `step`, or of the newest readable checkpoint.

    Returns None when there is no checkpoint at all. `abstract_state` gives the
    tree and dtypes, `shardings` where each leaf goes.
    """
    candidates = [step] if step is not None else self.steps()[::-1]
    if step is not None and step not in self.steps():
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                              f"steps present: {self.steps()}")
    target = _abstract(abstract_state, shardings)
    errors = []
    for candidate in candidates:
      try:
        restored = self._manager.restore(candidate, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
        if errors:
          logging.warning("Restored step %d after skipping unreadable checkpoints: %s",
                          candidate, "; ".join(errors))
          self._set_aside([s for s in candidates if s > candidate])
        return restored.state, restored.data, candidate
      except Exception as e:  # pylint: disable=broad-except
        if step is not None:
          raise RuntimeError(f"checkpoint {candidate} in {self.directory} is unreadable: "
                             f"{e}") from e
        errors.append(f"step {candidate}: {type(e).__name__}: {str(e)[:200]}")
        logging.warning("Checkpoint step %d is unreadable (%s); trying an older one.",
                        candidate, e)
    if errors:
      raise RuntimeError(f"no readable checkpoint in {self.directory}: {'; '.join(errors)}")
    return None

  def _set_aside(self, steps) -> None:
    """Renames unreadable checkpoints to <step>.unreadable (kept for inspection,
    invisible to Orbax), so that training can save those step numbers again."""
    if self._read_only:
      return
    for step in steps:
      path = os.path.join(self.directory, str(step))
      os.rename(path, f"{path}.unreadable")
      logging.warning("Moved unreadable checkpoint %s to %s.unreadable", path, path)
    self._manager.reload()

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
