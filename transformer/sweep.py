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
the field and the reason, before anything runs and again in the closing
summary, and the valid ones still run.

Each variant trains in <workdir>/<variant>/, an ordinary training workdir, in a
subprocess of train.py (transformer/sweep_run.py): a crash or a leak in one variant cannot take the sweep
down, and what runs is exactly the command `--emit commands` prints. A variant
is finished when its sweep_status.json says so and it trained with the config
the rerun resolves to (its config.json; the --sets in another order are the
same); a rerun skips it, and restarts any other (train.py resumes from its latest
checkpoint) unless its checkpoints were trained with other settings than
sweep_run.CONTINUABLE ones (num_steps, cadences, the mesh, data paths, speed-only fields),
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

import copy
import dataclasses
import importlib.util
import itertools
import json
import os
import re
import reprlib
import shlex
import signal
import sys
from typing import Optional

from absl import app
from absl import flags

from transformer import results, runtime, sweep_run
from transformer import workdir as workdir_lib
from transformer.config import check_config, config_flag, load_file, quiet_loading, unread_overrides

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
  unread = unread_overrides(config, [o.partition("=")[0] for o in overrides])
  if unread:
    field, why = unread[0]
    raise ValueError(f"config.{field}: {why}")


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


def _load_base(base: str, where: str):
  """The base config file's ConfigDict, loaded as train.py loads its --config (by
  runtime.parse_flags, on a private flag named as `where` gave it: --base, else
  --config, as the sweep file's BASE is train.py's): a file that does not load or
  builds no config is a ValueError of one line, not ml_collections' traceback."""
  flag, prefix = ("base", "") if where == "--base" else ("config", f"{where}: ")
  argv, flag_values = config_flag(base, flag=flag)
  try:
    with quiet_loading():
      runtime.parse_flags(argv, "sweep", config_flag=flag, flag_values=flag_values)
  except SystemExit as e:  # parse_flags stops a command; the sweep's caller reports it.
    raise ValueError(prefix + str(e.code).removeprefix("sweep: error: ")) from None
  return flag_values[flag].value


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
  plain = _load_base(base, where)

  def field_of(name):  # `config.field`, spelt as train.py's --config.field, is the field's.
    return name[len("config."):] if name.startswith("config.") and "config" not in plain else name

  sets = [field_of(s) for s in sets]
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
    fields = [field_of(k) for k in overrides]
    variant = Variant(name, [f"{k}={v}" for k, v in zip(fields, overrides.values())])
    try:  # Its values reach train.py's command line as strings (True -> "True").
      if len(set(fields)) < len(fields):
        raise ValueError(f"a field is given twice (with and without 'config.'): "
                         f"{sorted(overrides)}")
      none = [k for k, v in overrides.items() if v is None]
      if none:
        raise ValueError(f"config.{field_of(none[0])}: None cannot reach train.py's command "
                         "line (it would be the string 'None'); leave the field out")
      overrides = dict(zip(fields, overrides.values()))
      for field in overrides:
        if _unknown_field(base_config, field):
          raise ValueError(f"config.{field}: unknown field (not in {base})")
      variant.config = load_file(base, sweep.overrides(variant))
      check_config(variant.config)
      # Its own fields only: a --set that the base reads (checked above) may go
      # unread by a variant of another architecture, which warns of it as train.py does.
      _check_architecture_fields(variant.config, variant.overrides)
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


def commands(sweep: Sweep, workdir: str, train_py: str = "train.py") -> list:
  """One shell line per valid variant, to run from the repository root (or from
  anywhere, with `train_py` an absolute path)."""
  return [shlex.join(["python", train_py] + sweep_run.train_argv(sweep, v, workdir))
          for v in sweep.valid]


def slurm_script(sweep: Sweep, workdir: str, name: str) -> str:
  """A SLURM job array with one task per valid variant: task i runs line i of
  `commands`, with train.py's absolute path, from the directory the script was
  made in. Resources (--gres, --time, ...) go on the sbatch command line."""
  lines = commands(sweep, workdir, os.path.join(ROOT, "train.py"))
  for what, path in (("--workdir", workdir), ("the current directory", os.getcwd())):
    if "\n" in path:  # Its #SBATCH line would end there, and the rest run as a command.
      raise ValueError(f"{what} {path!r} holds a line break, which a SLURM script cannot hold")
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


def twins(sweep: Sweep) -> dict:
  """{name: the earlier variant's name} of each valid variant whose resolved
  config is an earlier one's (a value that is the base's own, a d_k of d_model
  / h): it would train the same model again."""
  first, found = {}, {}
  for v in sweep.valid:
    values = json.loads(v.config.to_json_best_effort())
    model = values["model"]
    if model.get("d_k") and model["d_k"] * model.get("num_heads", 0) == model.get("d_model"):
      model["d_k"] = 0  # d_model / h spelt out: the default's value.
    key = json.dumps(values, sort_keys=True)
    if key in first:
      found[v.name] = first[key]
    else:
      first[key] = v.name
  return found


def describe(sweep: Sweep) -> str:
  """The --list table: variants, parameters (results.count_parameters) and overrides,
  twins named; invalid variants with their reason."""
  lines = [f"{sweep.path} on {sweep.base}: {len(sweep.valid)} valid variants of "
           f"{len(sweep.variants)}" + (f"; every variant: {' '.join(sweep.sets)}"
                                        if sweep.sets else "")]
  width = max(len(v.name) for v in sweep.variants)
  lines.append(f"{'variant':<{width}}  {'parameters':>12}  overrides")
  same = twins(sweep)
  for v in sweep.valid:
    lines.append(f"{v.name:<{width}}  {results.count_parameters(v.config):>12,}  "
                 f"{' '.join(v.overrides)}"
                 + (f"  (the same config as {same[v.name]})" if v.name in same else ""))
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


def outcomes(sweep, done: dict) -> list:
  """`name: status` of each variant run_local reached, and `name: invalid, not
  run (reason)` of each invalid one, in the sweep's order: the invalid ones
  were named before hours of training, and a summary without them reads as if
  every variant ran."""
  return [f"{v.name}: {done[v.name]}" if v.name in done else
          f"{v.name}: invalid, not run ({v.error})"
          for v in sweep.variants if v.name in done or v.error]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  runtime.quiet_library_logs()
  f = flags.FLAGS
  modes = [name for name, on in (("--list", f.list), ("--emit", f.emit), ("--collect", f.collect))
           if on]
  if len(modes) > 1:  # One would win silently.
    sys.exit(f"sweep: error: {' and '.join(modes)}: give one of them")
  for name, unset in (("workdir", "runs/<sweep>_<base>"), ("base", "the sweep file's BASE"),
                      ("only", "every variant")):
    if f[name].present and not f[name].value:  # Was the default, silently.
      sys.exit(f"sweep: error: --{name} is empty; leave the flag out for {unset}")
  if f["checkpoint"].present and not f.collect:
    sys.exit("sweep: error: --checkpoint says whose results --collect reads: give it with "
             "--collect")
  try:
    sweep = resolve(f.sweep, f.base, f.set)
    if f.only and not f.collect:
      sweep = select(sweep, f.only)
  except (OSError, ValueError, TypeError, flags.Error) as e:  # The message, not a traceback.
    sys.exit(f"sweep: error: {e}")
  workdir = f.workdir or default_workdir(f.sweep, f.base)
  if not f.list and os.path.exists(workdir) and not os.path.isdir(workdir):
    sys.exit(f"sweep: error: --workdir {workdir} is a file, not a directory")
  for v in sweep.variants:
    if v.error and not (f.list or f.collect):  # --list and the table show it.
      print(f"sweep: {v.name} is invalid, not run: {v.error}", file=sys.stderr)
  if not (f.list or f.collect):
    for name, earlier in twins(sweep).items():
      print(f"sweep: warning: {name} resolves to the same config as {earlier}: it trains "
            "the same model again", file=sys.stderr)
  if f.list or f.emit or f.collect:
    with runtime.one_line_errors("sweep"):  # A full disk under stdout, say: one line.
      _print(f, sweep, workdir)
  else:
    signals = sweep_run.ForwardedSignals()
    done = sweep_run.run_local(sweep, workdir, signals=signals)
    print("\n".join(outcomes(sweep, done)))
    if signals.received:
      stopped = [name for name, status in done.items() if status == "stopped"]
      sys.stderr.write(f"sweep: stopped by {signal.Signals(signals.received).name}; rerun "
                       "the same command to " + (f"resume {stopped[0]} and run the rest\n"
                                                 if stopped else "run the rest\n"))
      sys.exit(128 + signals.received)
    if {"failed", "stale"} & set(done.values()):
      sys.exit(1)


def _print(f, sweep, workdir) -> None:
  """What --list, --emit and --collect print."""
  if f.list:
    print(describe(sweep))
  elif f.emit == "commands":
    print("\n".join(commands(sweep, workdir)))
  elif f.emit == "slurm":
    try:
      os.makedirs(workdir, exist_ok=True)  # SLURM writes the tasks' output there.
    except OSError as e:
      sys.exit(f"sweep: error: --workdir {workdir}: {e}")
    print(slurm_script(sweep, workdir, os.path.basename(workdir)), end="")
  else:  # Its OSError or ValueError is one_line_errors' line.
    statuses = results.read_statuses(workdir)  # Once: a damaged one is named once.
    print(results.collect(as_run(sweep, workdir, statuses) if not f.set else sweep, workdir,
                          f.checkpoint, statuses), end="")
    print(f"wrote {' and '.join(os.path.join(workdir, n) for n in results.TABLE_FILES)}",
          file=sys.stderr)


if __name__ == "__main__":
  define_flags()
  runtime.run(main, "sweep")
