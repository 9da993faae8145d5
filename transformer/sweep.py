"""Sweeps: one base config and named variants of it, listed, run, emitted or collected.

  python -m transformer.sweep --sweep configs/sweeps/table3.py --list
  python -m transformer.sweep --sweep configs/sweeps/table3.py --workdir runs/table3 \
      --set train.num_steps=300          # trains every variant, one after another
  python -m transformer.sweep --sweep configs/sweeps/table3.py --workdir runs/table3 \
      --set train.num_steps=300 --only A-h1,B-dk16   # those variants only
  python -m transformer.sweep --sweep configs/sweeps/table3.py --emit slurm > table3.sbatch
  python -m transformer.sweep --sweep configs/sweeps/table3.py --workdir runs/table3 --collect

A sweep file (configs/sweeps/*.py) names its base config and returns its variants,
each a name and a dict of overrides spelt like `--config.field=value`:

  from transformer.sweep import each, product

  BASE = "configs/default.py"  # Any config file, with its argument (`x.py:arg`).

  def get_sweep(base):  # `base`: the base ConfigDict, so variants can scale with it.
    return [("pre-ln", {"model.norm_position": "pre"}),
            *each("h{}", "model.num_heads", [1, base.model.num_heads * 2]),
            *product("drop{}-ls{}", {"model.dropout": [0.0, 0.3],
                                     "train.label_smoothing": [0.0, 0.2]})]

The base itself is always the first variant, 'base': the row the others are
read against. `--base FILE` replaces BASE. `--set field=value` (repeatable;
`config.field=value` too) changes the base, e.g. a smaller budget, before
get_sweep sees it (so scaled variants follow it) and so every variant; a
variant's own value of that field wins. Overrides are parsed by ml_collections' config flags exactly as train.py
parses `--config.field=value` (types from the base's fields), and each variant
is checked with check_config: one that is invalid for its base is reported, with
the field and the reason, before anything runs, and the valid ones still run.

Each variant trains in <workdir>/<variant>/, an ordinary training workdir, in a
subprocess of train.py: a crash or a leak in one variant cannot take the sweep
down, and what runs is exactly the command `--emit commands` prints. A variant
is finished when its sweep_status.json says so and it trained with the config
the rerun resolves to (its config.json; the --sets in another order are the
same); a rerun skips it, and restarts any other (train.py resumes from its latest
checkpoint) unless its checkpoints were trained with other settings than
CONTINUABLE ones (num_steps, cadences, the mesh, data paths, speed-only fields),
compared on the resolved configs: such a variant is reported 'stale' and left
as it is, so that no row is labelled with settings it did not train under; for
the same reason a variant whose checkpoints are past the rerun's
train.num_steps is skipped (train.py would not train it back, only relabel it),
its status and config.json kept, and --collect's table still says the steps it
trained. A variant that fails is recorded as failed, with its error, and the
sweep goes on. A SIGTERM or a Ctrl-C to the sweep is passed on to the variant
training (train.py saves a checkpoint and stops), whose train.log keeps every
line; the attempt is recorded as stopped, with its time, and the sweep exits
with 128 + the signal's number, as train.py does; a rerun resumes it. `--collect`
writes results.md and results.csv (transformer/results.py).
"""

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import itertools
import json
import os
import re
import reprlib
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

from absl import app
from absl import flags
from absl import logging

from transformer import launch, lock, preemption, results
from transformer import workdir as workdir_lib
from transformer.config import check_config, load_file, resume_changes, unread_model_field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def each(name: str, field: str, values) -> list:
  """One variant per value of one field; `name` is formatted with the value."""
  return product(name, {field: values})


def product(name: str, axes: dict) -> list:
  """One variant per combination of the fields' values (itertools.product order);
  `name` is formatted with the values in the order of `axes`."""
  return [(name.format(*values), dict(zip(axes, values)))
          for values in itertools.product(*axes.values())]


@dataclasses.dataclass
class Variant:
  name: str
  overrides: list  # ["field=value", ...]: the variant's own, as given on a command line.
  config: object = None  # The resolved ConfigDict; None when invalid.
  error: Optional[str] = None  # Why it is invalid.


@dataclasses.dataclass
class Sweep:
  path: str
  base: str  # The base config file as train.py's --config takes it.
  sets: list  # ["field=value", ...] applied to the base, so to every variant.
  variants: list  # [Variant], 'base' first.

  @property
  def valid(self):
    return [v for v in self.variants if v.error is None]

  def overrides(self, variant) -> list:
    """All of a variant's overrides: the --set ones it does not set itself, then its own."""
    own = {o.partition("=")[0] for o in variant.overrides}
    return [s for s in self.sets if s.partition("=")[0] not in own] + variant.overrides


def _unknown_field(config, field: str) -> bool:
  node = config
  for part in field.split("."):
    if not hasattr(node, "keys") or part not in node.keys():
      return True
    node = node[part]
  return False


def _check_architecture_fields(config, overrides) -> None:
  """A ValueError for an override of a model field that the config's model does
  not read (a Table 3 row on the RNN would be its base again)."""
  for override in overrides:
    section, _, name = override.partition("=")[0].partition(".")
    why = unread_model_field(config.model, name) if section == "model" else None
    if why:
      raise ValueError(f"config.model.{name}: {why}")


def _load(path: str):
  """The sweep file's module, a new one each time (ml_collections' loader runs a
  file in the module the previous one left in sys.modules, whose get_sweep a
  file without one would use); a ValueError naming the file where it has no
  get_sweep or does not load."""
  spec = importlib.util.spec_from_file_location("sweep_file", path)
  if not os.path.isfile(path) or spec is None:
    raise ValueError(f"--sweep {path}: no such Python file")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{path}: does not load: {type(e).__name__}: {e}") from e
  if not callable(getattr(module, "get_sweep", None)):
    raise ValueError(f"{path}: no get_sweep(base) function returning the variants")
  return module


def _variants(path: str, module, base_config) -> list:
  """get_sweep's (name, {field: value}) pairs, each checked: a ValueError naming
  the file, the variant and what is wrong (instead of one from deep in resolve)."""
  try:
    entries = module.get_sweep(copy.deepcopy(base_config))
  except ValueError as e:  # The sweep file's own message.
    raise ValueError(f"{path}: {e}") from e
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{path}: get_sweep raised {type(e).__name__}: {e}") from e
  if isinstance(entries, (str, bytes, dict)) or not hasattr(entries, "__iter__"):
    raise ValueError(f"{path}: get_sweep returned {reprlib.repr(entries)}, not a list of "
                     "(name, {field: value}) pairs")
  pairs = []
  for entry in entries:
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
      raise ValueError(f"{path}: get_sweep's {reprlib.repr(entry)} is not a (name, "
                       "{field: value}) pair")
    name, overrides = entry
    if not isinstance(name, str):
      raise ValueError(f"{path}: variant name {name!r} is not a string")
    if not isinstance(overrides, dict) or not all(isinstance(k, str) for k in overrides):
      raise ValueError(f"{path}: variant {name!r}: overrides {reprlib.repr(overrides)} are "
                       "not a dict of {'field': value}")
    pairs.append((name, overrides))
  return pairs


def resolve(path: str, base: Optional[str] = None, sets=()) -> Sweep:
  """Loads a sweep file and resolves its variants against the base config."""
  module = _load(path)
  where = "--base" if base else f"{path}: BASE"
  base, sets = base or getattr(module, "BASE", None), list(sets)
  if not isinstance(base, str) or not base:
    raise ValueError(f"{path}: no BASE = 'config file' (or give --base)")
  if not os.path.isfile(base.partition(":")[0]):
    raise ValueError(f"{where} {base!r}: no such file")
  plain = load_file(base)
  # `--set config.field=value`, spelt as train.py's --config.field=value, is the field's.
  sets = [s[len("config."):] if s.startswith("config.") and "config" not in plain else s
          for s in sets]
  for field in [s.partition("=")[0] for s in sets]:  # A bad --set stops the sweep here.
    if _unknown_field(plain, field):
      raise ValueError(f"--set config.{field}: unknown field (not in {base})")
  base_config = load_file(base, sets)
  check_config(base_config)
  _check_architecture_fields(base_config, sets)  # A --set the base cannot use stops here.
  entries = [("base", {})] + _variants(path, module, base_config)
  sweep = Sweep(path, base, sets, [])
  names = set()
  for name, overrides in entries:
    why = ("taken" if name in names else "the name of a table file --collect writes"
           if name in results.TABLE_FILES else None if _NAME.fullmatch(name)
           else "not a plain directory name")
    if why:
      raise ValueError(f"{path}: variant name {name!r} is {why}")
    names.add(name)
    variant = Variant(name, [f"{k}={v}" for k, v in overrides.items()])  # True -> "True".
    try:
      for field in overrides:
        if _unknown_field(base_config, field):
          raise ValueError(f"config.{field}: unknown field (not in {base})")
      variant.config = load_file(base, sweep.overrides(variant))
      check_config(variant.config)
      _check_architecture_fields(variant.config, sweep.overrides(variant))
    except (ValueError, TypeError, flags.Error) as e:
      variant.config, variant.error = None, str(e)
    sweep.variants.append(variant)
  return sweep


def select(sweep: Sweep, names) -> Sweep:
  """The sweep restricted to the named variants (--only), in the sweep's order:
  one row run again by itself, or a slow one in a job of its own."""
  known = [v.name for v in sweep.variants]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(f"--only: no variant {', '.join(map(repr, unknown))} in {sweep.path} "
                     f"(its variants: {', '.join(known)})")
  chosen = [v for v in sweep.variants if v.name in names]
  if all(v.error for v in chosen):  # Nothing would run (and a job array would be empty).
    raise ValueError("--only: nothing to run: " + "; ".join(
        f"{v.name} is invalid ({v.error})" for v in chosen))
  return dataclasses.replace(sweep, variants=chosen)


def train_argv(sweep: Sweep, variant: Variant, workdir: str) -> list:
  """train.py's arguments for a variant (after `python train.py`)."""
  return (["--config", sweep.base]
          + [f"--config.{o}" for o in sweep.overrides(variant)]
          + ["--workdir", os.path.join(workdir, variant.name)])


def commands(sweep: Sweep, workdir: str, train_py: str = "train.py") -> list:
  """One shell line per valid variant, to run from the repository root (or from
  anywhere, with `train_py` an absolute path)."""
  return [shlex.join(["python", train_py] + train_argv(sweep, v, workdir))
          for v in sweep.valid]


def slurm_script(sweep: Sweep, workdir: str, name: str) -> str:
  """A SLURM job array with one task per valid variant: task i runs line i of
  `commands`, with train.py's absolute path, from the directory the script was
  made in. Resources (--gres, --time, ...) go on the sbatch command line."""
  lines = commands(sweep, workdir, os.path.join(ROOT, "train.py"))
  return "\n".join([
      "#!/bin/bash",
      f"# {len(lines)} variants of {sweep.path} on {sweep.base}; one per array task.",
      "#   sbatch [--gres=gpu:1 --time=...] THIS_FILE",
      f"#SBATCH --job-name={name}",
      f"#SBATCH --array=0-{len(lines) - 1}",
      f"#SBATCH --chdir={os.getcwd()}",  # Where the commands' relative paths start.
      f"#SBATCH --output={os.path.join(workdir, 'slurm-%A_%a.out')}",
      "set -euo pipefail",
      "commands=(",
      *[f"  {shlex.quote(line)}" for line in lines],
      ")",
      'echo "${commands[$SLURM_ARRAY_TASK_ID]}"',
      'eval "${commands[$SLURM_ARRAY_TASK_ID]}"',
      ""])


class StopSignals:
  """SIGTERM and SIGINT to a running sweep (`received`: the first one's number):
  the sweep starts nothing more, and passes each one on to the variant in
  training, whose train.py saves a checkpoint on the first and stops at once on
  a second (transformer/preemption.py), as if it had been sent to train.py."""

  def __init__(self):
    self.received = None
    self._child, self._previous = None, {}

  def __enter__(self) -> "StopSignals":
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


def train_subprocess(argv: list, variant_dir: str,
                     signals: Optional[StopSignals] = None) -> None:
  """Runs `python train.py argv`, each line of its output shown and appended to
  train.log as it comes (a sweep killed mid-run keeps every line before);
  raises RuntimeError with the output's last line if it fails. train.py runs in
  a session of its own, so that a terminal's Ctrl-C reaches the sweep alone,
  which passes it on once (`signals`), and gets SIGTERM should the sweep die
  (launch's PR_SET_PDEATHSIG): it is never left training unattended."""
  last = ""
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
  if process.returncode:
    raise RuntimeError(f"train.py {launch.how_it_ended(process.returncode)}: {last}")


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


# Held in <variant dir>/.sweep while a sweep decides on a variant and trains it:
# another sweep on the same workdir then finds the variant busy, also in the
# seconds between this one writing 'running' and its train.py taking the
# workdir's own lock.
SWEEP_LOCK_DIR = ".sweep"


def run_local(sweep: Sweep, workdir: str, train: Optional[Callable[[list, str], None]] = None,
              signals: Optional[StopSignals] = None) -> dict:
  """Trains the valid variants one after another; returns {name: status}
  ('finished', 'failed', 'skipped', 'stale': checkpoints of another recipe,
  'busy': another process, another sweep or its training say, holds its
  workdir, or 'stopped': a SIGTERM or SIGINT to the sweep stopped its training,
  after which the sweep starts no other; `signals.received` says which)."""
  signals = signals or StopSignals()
  train = train or functools.partial(train_subprocess, signals=signals)
  with signals:
    return _run_all(sweep, workdir, train, signals)


def _run_all(sweep: Sweep, workdir: str, train, signals: StopSignals) -> dict:
  done = {}
  for variant in sweep.valid:
    if signals.received:
      break
    variant_dir = os.path.join(workdir, variant.name)
    os.makedirs(variant_dir, exist_ok=True)
    with contextlib.ExitStack() as held:
      try:  # A variant another process trains (another sweep's) is left to it.
        held.enter_context(lock.hold(os.path.join(variant_dir, SWEEP_LOCK_DIR), "sweep"))
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


def _run_variant(sweep: Sweep, variant: Variant, workdir: str, train,
                 signals: StopSignals) -> Optional[str]:
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
  if changes and results.latest_step(variant_dir) is not None:
    logging.error("%s: not run: its checkpoints were trained with other settings (%s); "
                  "use another --workdir, or remove %s to train it again.",
                  variant.name, "; ".join(changes), variant_dir)
    return "stale"
  reached = results.latest_step(variant_dir)
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


def as_run(sweep: Sweep, workdir: str, statuses: Optional[dict] = None) -> Sweep:
  """The sweep resolved with the --set its variants were trained with (their
  sweep_status.json, results.recorded_sets; `statuses`: read_statuses'), where
  that differs: variants that scale with the base have the names and overrides
  of the run."""
  statuses = results.read_statuses(workdir) if statuses is None else statuses
  recorded = results.recorded_sets(sweep, statuses)
  if recorded is None or recorded == sweep.sets:
    return sweep
  return resolve(sweep.path, sweep.base, recorded)


def describe(sweep: Sweep) -> str:
  """The --list table: variants, parameters (at data.vocab_size) and overrides;
  invalid variants with their reason."""
  lines = [f"{sweep.path} on {sweep.base}: {len(sweep.valid)} valid variants of "
           f"{len(sweep.variants)}" + (f"; every variant: {' '.join(sweep.sets)}"
                                        if sweep.sets else "")]
  width = max(len(v.name) for v in sweep.variants)
  lines.append(f"{'variant':<{width}}  {'parameters':>12}  overrides")
  for v in sweep.valid:
    lines.append(f"{v.name:<{width}}  {results.count_parameters(v.config):>12,}  "
                 f"{' '.join(v.overrides)}")
  invalid = [v for v in sweep.variants if v.error]
  if invalid:
    lines.append("invalid (not run):")
    lines += [f"{v.name:<{width}}  {v.error}" for v in invalid]
  return "\n".join(lines)


def default_workdir(sweep_path: str, base: Optional[str]) -> str:
  """runs/<sweep file stem>, plus _<base stem> for a --base, so that the same
  sweep on two bases never resumes the other's runs."""
  stem = os.path.splitext(os.path.basename(sweep_path))[0]
  if base:
    stem += "_" + os.path.basename(workdir_lib.default_workdir(base))
  return os.path.join("runs", stem)


def define_flags():
  """Defined on demand (as evaluate's) so that importing this module defines nothing."""
  flags.DEFINE_string("sweep", None, "Sweep file (configs/sweeps/*.py).", required=True)
  flags.DEFINE_string("base", None, "Base config file[:argument]; default the sweep's BASE.")
  flags.DEFINE_string("workdir", None, "Sweep workdir; variant v trains in <workdir>/v. "
                      "Default runs/<sweep stem> (+ _<base stem> with --base).")
  flags.DEFINE_multi_string("set", [], "field=value applied to every variant, as "
                            "--config.field=value would be; repeatable.")
  flags.DEFINE_bool("list", False, "Print the variants, their parameters and overrides; "
                    "train nothing.")
  flags.DEFINE_enum("emit", None, ["commands", "slurm"], "Print one train.py command per "
                    "variant, or a SLURM job-array script running them; train nothing.")
  flags.DEFINE_bool("collect", False, "Write <workdir>/results.md and results.csv from the "
                    "variants' workdirs; train nothing.")
  flags.DEFINE_string("checkpoint", "latest", "--collect: whose evaluate results to read "
                      "(latest, best, averaged or a step).")
  flags.DEFINE_list("only", None, "Variants to list, run or emit (names, comma-separated); "
                    "default all. --collect always reads them all.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  try:
    sweep = resolve(f.sweep, f.base, f.set)
    if f.only and not f.collect:
      sweep = select(sweep, f.only)
  except (OSError, ValueError, TypeError, flags.Error) as e:  # The message, not a traceback.
    sys.exit(f"sweep: error: {e}")
  workdir = f.workdir or default_workdir(f.sweep, f.base)
  for v in sweep.variants:
    if v.error and not f.list:
      print(f"sweep: {v.name} is invalid, not run: {v.error}", file=sys.stderr)
  if f.list:
    print(describe(sweep))
  elif f.emit == "commands":
    print("\n".join(commands(sweep, workdir)))
  elif f.emit == "slurm":
    os.makedirs(workdir, exist_ok=True)  # SLURM writes the tasks' output there.
    print(slurm_script(sweep, workdir, os.path.basename(workdir)), end="")
  elif f.collect:
    try:
      statuses = results.read_statuses(workdir)  # Once: a damaged one is named once.
      print(results.collect(as_run(sweep, workdir, statuses) if not f.set else sweep, workdir,
                            f.checkpoint, statuses), end="")
    except (OSError, ValueError) as e:
      sys.exit(f"sweep: error: {e}")
    print(f"wrote {' and '.join(os.path.join(workdir, n) for n in results.TABLE_FILES)}",
          file=sys.stderr)
  else:
    signals = StopSignals()
    done = run_local(sweep, workdir, signals=signals)
    print("\n".join(f"{name}: {status}" for name, status in done.items()))
    if signals.received:
      stopped = [name for name, status in done.items() if status == "stopped"]
      sys.stderr.write(f"sweep: stopped by {signal.Signals(signals.received).name}; rerun "
                       "the same command to " + (f"resume {stopped[0]} and run the rest\n"
                                                 if stopped else "run the rest\n"))
      sys.exit(128 + signals.received)
    if {"failed", "stale"} & set(done.values()):
      sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
