"""Runs a sweep's variants on this machine, one after another, each in a
subprocess of train.py (transformer/sweep.py says what a sweep is and decides
nothing here): which to skip, resume or leave alone, their sweep_status.json,
and the signals that stop them."""

import contextlib
import functools
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

from absl import logging

from transformer import launch, lock, preemption, results
from transformer import workdir as workdir_lib
from transformer.config import load_file
from transformer.saved_config import resume_changes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_argv(sweep, variant, workdir: str) -> list:
  """train.py's arguments for a variant (after `python train.py`)."""
  return (["--config", sweep.base]
          + [f"--config.{o}" for o in sweep.overrides(variant)]
          + ["--workdir", os.path.join(workdir, variant.name)])



class ForwardedSignals:
  """SIGTERM and SIGINT to a running sweep (`received`: the first one's number):
  the sweep starts nothing more, and passes each one on to the variant in
  training, whose train.py saves a checkpoint on the first and stops at once on
  a second (transformer/preemption.py), as if it had been sent to train.py."""

  def __init__(self):
    self.received = None
    self._child, self._previous = None, {}

  def __enter__(self) -> "ForwardedSignals":
    if threading.current_thread() is threading.main_thread():  # Python's rule.
      self._previous = {s: signal.signal(s, self._handle) for s in preemption.SIGNALS}
    return self

  def __exit__(self, *exc_info):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    self.received = self.received or signum
    if self._child is not None:
      self._child.send_signal(signum)

  @contextlib.contextmanager
  def forwarding(self, child: subprocess.Popen):
    self._child = child
    try:
      if self.received:  # One that came while it started.
        child.send_signal(self.received)
      yield
    finally:
      self._child = None


# A line that says why train.py failed: its one-line error, or a traceback's
# exception (after which a note can follow: JAX adds one to every exception).
_WHY = re.compile(r"train: (error|stopped)|[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def train_subprocess(argv: list, variant_dir: str,
                     signals: Optional[ForwardedSignals] = None) -> None:
  """Runs `python train.py argv`, each line of its output shown and appended to
  train.log as it comes (a sweep killed mid-run keeps every line before);
  raises RuntimeError with the line that says why (_WHY; else the output's last
  line) if it fails. train.py runs in
  a session of its own, so that a terminal's Ctrl-C reaches the sweep alone,
  which passes it on once (`signals`), and gets SIGTERM should the sweep die
  (launch's PR_SET_PDEATHSIG): it is never left training unattended."""
  last = why = ""
  command = launch.child_command([os.path.join(ROOT, "train.py")] + argv)
  with open(os.path.join(variant_dir, "train.log"), "a", buffering=1) as log, \
      subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, bufsize=1,
                       start_new_session=True) as process, \
      signals.forwarding(process) if signals else contextlib.nullcontext():
    for line in process.stdout:
      sys.stderr.write(line)
      log.write(line)
      last = line.strip() or last
      why = last if _WHY.match(last) else why
  if process.returncode:
    raise RuntimeError(f"train.py {launch.how_it_ended(process.returncode)}: {why or last}")


# Fields a rerun may change and still continue a variant's checkpoints: how long
# it trains, how often it logs, evaluates, decodes and saves, where the data
# lives, and how fast it runs. Any other change would label steps trained under
# the old settings with the new ones.
CONTINUABLE = ("train.num_steps", "train.log_every", "train.eval_every",
               "train.checkpoint_every", "train.keep_checkpoints", "train.decode_every",
               "train.decode_examples", "train.mesh", "train.fsdp", "data.text_dir",
               "data.tfds_data_dir", "data.prefetch", "model.attention_impl",
               "decode.tokens_per_batch", "decode.concurrent_batches", "decode.compact",
               "decode.refill")


def config_changes(previous: dict, recipe: dict, variant_dir: Optional[str] = None) -> list:
  """(field, old, new) of every field whose value differs between what a
  variant trained with and `recipe`'s ({'base', 'overrides'}) config: compared
  as resolved configs, so a value spelt otherwise, or given where it is the
  base's own, is no change. What it trained with is `variant_dir`'s
  config.json (train.py's, written once a run is past its data checks), else
  its recorded recipe ({'base', 'overrides'}) as the base file resolves it now.
  Raises where neither loads."""
  has_config = variant_dir and os.path.exists(os.path.join(variant_dir, "config.json"))
  old = (workdir_lib.load_config(variant_dir) if has_config
         else load_file(previous.get("base"), previous.get("overrides") or []))
  new = load_file(recipe["base"], recipe["overrides"])
  fixed, free = resume_changes(json.loads(old.to_json_best_effort()),
                               json.loads(new.to_json_best_effort()))
  return [(f, o, n) for f, o, n, _ in fixed] + free


def recipe_changes(previous: dict, recipe: dict, variant_dir: Optional[str] = None) -> list:
  """config_changes that a variant's checkpoints cannot continue under, as
  'field: old -> new'."""
  try:
    changed = config_changes(previous, recipe, variant_dir)
  except Exception as e:  # pylint: disable=broad-except
    return [f"the recorded settings no longer load ({e})"]
  return [f"{f}: {o!r} -> {n!r}" for f, o, n in changed
          if f not in CONTINUABLE and not f.startswith("distributed.")]


def _finished_as(previous: dict, recipe: dict, variant_dir: str) -> bool:
  """Whether the variant finished training with `recipe`'s config (however spelt)."""
  if previous.get("status") != "finished":
    return False
  try:
    return not config_changes(previous, recipe, variant_dir)
  except Exception:  # pylint: disable=broad-except
    return False  # Settings that no longer load: the checks below decide.


def _results_held(previous: dict, variant_dir: str) -> Optional[str]:
  """What a variant without checkpoints (deleted to free the disk, say) still
  holds of a finished training, as '... were'; None where nothing. Training it
  again in place with other settings would overwrite its status and label its
  evaluate results with the new settings."""
  if previous.get("status") == "finished":
    return "its finished run's results were"
  if glob.glob(os.path.join(variant_dir, "eval_*.json")):
    return "its evaluate results were"
  return None


def run_local(sweep, workdir: str, train: Optional[Callable[[list, str], None]] = None,
              signals: Optional[ForwardedSignals] = None) -> dict:
  """Trains the valid variants one after another; returns {name: status}
  ('finished', 'failed', 'skipped', 'stale': checkpoints of another recipe,
  'busy': another process, another sweep or its training say, holds its
  workdir, or 'stopped': a SIGTERM or SIGINT to the sweep stopped its training,
  after which the sweep starts no other; `signals.received` says which)."""
  signals = signals or ForwardedSignals()
  train = train or functools.partial(train_subprocess, signals=signals)
  with signals:
    return _run_all(sweep, workdir, train, signals)


def _run_all(sweep, workdir: str, train, signals: ForwardedSignals) -> dict:
  done = {}
  for variant in sweep.valid:
    if signals.received:
      break
    variant_dir = os.path.join(workdir, variant.name)
    try:
      os.makedirs(variant_dir, exist_ok=True)
    except OSError as e:  # A file in its place, say: the variant fails, the others run.
      logging.error("%s: not run: %s", variant.name,
                    f"{variant_dir} is a file, not a directory"
                    if isinstance(e, FileExistsError) else e)
      done[variant.name] = "failed"
      continue
    with contextlib.ExitStack() as held:
      try:  # A variant another process trains (another sweep's) is left to it.
        held.enter_context(lock.hold(os.path.join(variant_dir, results.SWEEP_LOCK_DIR), "sweep"))
        with lock.hold(variant_dir, "sweep"):  # A train.py run outside any sweep.
          pass
      except lock.WorkdirBusyError as e:
        logging.warning("%s: not run: %s", variant.name, e)
        done[variant.name] = "busy"
        continue
      status = _run_variant(sweep, variant, workdir, train, signals)
      if status:
        done[variant.name] = status
  return done


def _run_variant(sweep, variant, workdir: str, train,
                 signals: ForwardedSignals) -> Optional[str]:
  """run_local's decision and training for one variant; its status (None:
  not started, the sweep being stopped)."""
  variant_dir = os.path.join(workdir, variant.name)
  recipe = {"base": sweep.base, "overrides": sweep.overrides(variant)}
  previous = results.read_status(variant_dir) or {}
  if _finished_as(previous, recipe, variant_dir):
    logging.info("%s: finished before, skipped.", variant.name)
    return "skipped"
  trained = previous or os.path.exists(os.path.join(variant_dir, "config.json"))
  changes = recipe_changes(previous, recipe, variant_dir) if trained else []
  reached = results.latest_step(variant_dir)
  held = ("its checkpoints were" if reached is not None
          else _results_held(previous, variant_dir))
  if changes and held:
    logging.error("%s: not run: %s trained with other settings (%s); use another "
                  "--workdir, or remove %s to train it again.",
                  variant.name, held, "; ".join(changes), variant_dir)
    return "stale"
  if reached is not None and reached > variant.config.train.num_steps:
    logging.warning("%s: trained to step %d already, past train.num_steps=%d: skipped, "
                    "its status and config.json kept.", variant.name, reached,
                    variant.config.train.num_steps)
    return "skipped"
  if signals.received:
    return None
  argv = train_argv(sweep, variant, workdir)
  # A killed attempt records no time of its own; the earlier attempts' stays.
  # "sets": the run's --set, from which --collect resolves the variants that
  # scale with the base, even where the base itself has no status.
  status = {**recipe, "sets": sweep.sets, "status": "running",
            "attempts": previous.get("attempts", 0) + 1,
            "command": shlex.join(["python", "train.py"] + argv), "started": time.time(),
            "wall_seconds": previous.get("wall_seconds", 0.0)}
  results.write_status(variant_dir, status)
  logging.info("%s: training (%s).", variant.name, " ".join(variant.overrides) or "the base")
  start = time.time()
  try:
    train(argv, variant_dir)
    status.update(status="finished", error=None)
  except Exception as e:  # pylint: disable=broad-except
    if signals.received:  # A rerun resumes it, as it does a failed one.
      status.update(status="stopped", error=str(e))
      logging.warning("%s stopped: %s", variant.name, e)
    else:
      status.update(status="failed", error=str(e))
      logging.error("%s failed: %s", variant.name, e)
  # This attempt's time plus the earlier attempts' that ended (a killed one has none).
  status.update(wall_seconds=status["wall_seconds"] + time.time() - start,
                steps=results.latest_step(variant_dir))
  results.write_status(variant_dir, status)
  return status["status"]
