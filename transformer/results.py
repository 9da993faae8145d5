"""What a sweep's training workdirs hold, as one table: results.md and results.csv.

For each variant, from <sweep workdir>/<variant>/:
  config.json, spm.model  the parameter count (shapes only, jax.eval_shape), at the
                          trained vocabulary's size; without one, at data.vocab_size,
                          and a note over the table names those rows
  sweep_status.json       status, wall time and steps (written by the sweep's local mode;
                          'running' without a live sweep holding .sweep: 'interrupted')
  checkpoints/            the steps reached, where no status says
  events.out.tfevents.*   eval/perplexity and decode/<metric> at the last step
  eval_*.json             transformer.evaluate's scores of the chosen checkpoint:
                          dev = data.eval_split, test = data.test_split, greedy and
                          beam (config.decode's beam size and alpha), whole splits only;
                          of a best or averaged checkpoint, only those that record it
                          as it is now (checkpoint_identity), not one it replaced;
                          of any, only those that scored the arrays of the checkpoint
                          of their step now (checkpoint_checksums)
A figure that is not there is left blank. Dev perplexity is per target token
without label smoothing (Table 3's "PPL (dev)"): evaluate's for the checkpoint,
else training's last evaluation when the checkpoint is 'latest'.
"""

import csv
import dataclasses
import glob
import io
import json
import math
import os
import re
from typing import Optional

from absl import logging

from transformer import checkpoints, files, lock, metrics as metrics_lib, state as state_lib
from transformer import workdir as workdir_lib
from transformer.config import model_config, same_recipe
from transformer.data import tokenizer as tokenizer_lib

STATUS_FILE = "sweep_status.json"
# Held in <variant dir>/.sweep while a sweep decides on a variant and trains it:
# another sweep on the same workdir then finds the variant busy, also in the
# seconds between this one writing 'running' and its train.py taking the
# workdir's own lock; a 'running' status without it is a sweep that died.
SWEEP_LOCK_DIR = ".sweep"
_TEXT_COLUMNS = ("variant", "changes", "status")
_LINE_END = re.compile(r"\r\n?|\n")  # Markdown's line ends.
_METRIC_NAMES = {"bleu": ("BLEU", 1.0), "exact_match": ("exact match %", 100.0)}


def count_parameters(config, vocab_size: int = 0) -> int:
  """Parameters of the config's model (unless `vocab_size` is given, at the size of
  data.vocab_path's vocabulary where it names one, else at data.vocab_size), from
  shapes alone: nothing is allocated."""
  vocab_size = vocab_size or tokenizer_lib.given_vocab_size(config.data) or 0
  return state_lib.parameter_count(state_lib.parameter_shapes(model_config(config, vocab_size)))


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value) -> bool:
  return isinstance(value, str)


def _texts(value) -> bool:
  return isinstance(value, list) and all(isinstance(v, str) for v in value)


# What the fields a table or a sweep reads must hold, by file: {field: (test, kind)}.
_STATUS_FIELDS = {
    "status": (_text, "a text"), "base": (_text, "a text"),
    "overrides": (_texts, "a list of texts"), "sets": (_texts, "a list of texts"),
    "wall_seconds": (_number, "a number of seconds"),
    "steps": (lambda v: v is None or (_number(v) and v == int(v)), "a step number")}
_EVALUATION_FIELDS = {
    "metrics": (lambda v: v is None or isinstance(v, dict), "an object of figures"),
    "perplexity": (lambda v: v is None or _number(v), "a number"),
    "step": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
             "a step number")}


def _well_formed(path: str, value: Optional[dict], fields: dict) -> Optional[dict]:
  """`value` (a file's JSON object), or None, with a warning naming the file and
  the field, where a field it has is not of its kind (a hand edit): a table
  leaves that file's figures blank, where one figure of the wrong type stopped
  it with a traceback, and no table was written."""
  for name, (ok, kind) in fields.items():
    if value is not None and name in value and not ok(value[name]):
      logging.warning("Skipping %s: its %s is %r, not %s.", path, name, value[name], kind)
      return None
  return value


def read_status(variant_dir: str) -> Optional[dict]:
  path = os.path.join(variant_dir, STATUS_FILE)
  return (_well_formed(path, files.read_json_object(path), _STATUS_FIELDS)
          if os.path.exists(path) else None)


def holds_variant(variant_dir: str) -> bool:
  """Whether a variant's workdir holds a training: a config.json or a status."""
  return any(os.path.exists(os.path.join(variant_dir, f)) for f in (STATUS_FILE, "config.json"))


def own_overrides(status: dict) -> str:
  """A status's overrides without the leading --set ones it records: the
  variant's own, as the table's changes column shows them."""
  trained, sets = status.get("overrides") or [], status.get("sets") or []
  first = next((i for i, o in enumerate(trained) if o not in sets), len(trained))
  return " ".join(trained[first:])


def _trained_with(status: dict) -> str:
  trained = status.get("overrides")
  return (f"`{' '.join(trained) or '(no overrides)'}`" if trained is not None
          else "the settings of its config.json (no sweep status)")


def read_statuses(workdir: str) -> dict:
  """{name: status} of the variant workdirs in a sweep's workdir: its folders
  that hold a config.json or a status (a damaged status read as {}), whatever
  the sweep resolves to now."""
  found = {}
  for name in sorted(os.listdir(workdir)) if os.path.isdir(workdir) else ():
    variant_dir = os.path.join(workdir, name)
    if not name.startswith(".") and holds_variant(variant_dir):
      found[name] = read_status(variant_dir) or {}
  return found


def recorded_sets(sweep, statuses: dict) -> Optional[list]:
  """The --set the variants were trained with, as their statuses say (the
  base's first, then the others'): a status's 'sets', or the base's
  'overrides' (its own are none); None where no status says."""
  base = sweep.variants[0].name
  for name in [base] + [n for n in statuses if n != base]:
    status = statuses.get(name) or {}
    if "sets" in status:
      return status["sets"]
    if name == base and "overrides" in status:
      return status["overrides"]
  return None


def write_status(variant_dir: str, status: dict) -> None:
  files.write_atomic(os.path.join(variant_dir, STATUS_FILE),
                     json.dumps(status, indent=2, sort_keys=True) + "\n")


def latest_step(variant_dir: str) -> Optional[int]:
  """The newest checkpoint's step: how far training got."""
  directory = os.path.join(variant_dir, workdir_lib.CHECKPOINT_DIRS["latest"])
  steps = checkpoints.complete_steps(directory)
  return steps[-1] if steps else None


def last_scalars(variant_dir: str, tags) -> dict:
  """{tag: value at the tag's last step} from the workdir's TensorBoard events
  (resumed runs add files; a step written twice keeps its last value)."""
  return {tag: value for tag, (_, value) in last_scalar_steps(variant_dir, tags).items()}


def last_scalar_steps(variant_dir: str, tags) -> dict:
  """{tag: (its last step, the value there)}, as last_scalars reads them."""
  if not glob.glob(os.path.join(variant_dir, "events.out.tfevents.*")):
    return {}
  # Imported here: the reader loads TensorFlow, seconds that only a workdir with
  # events needs.
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tb_logging, tensor_util  # pylint: disable=g-import-not-at-top
  tb_logging.get_logger().setLevel("WARNING")  # Not a line per events file read.
  accumulator = event_accumulator.EventAccumulator(
      variant_dir, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0})
  accumulator.Reload()
  available = accumulator.Tags()
  values = {}
  for tag in tags:
    if tag in available["tensors"]:
      events = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item())
                for e in accumulator.Tensors(tag)]
    elif tag in available["scalars"]:
      events = [(e.step, e.value) for e in accumulator.Scalars(tag)]
    else:
      continue
    if events:  # Of a step written twice (a resumed run redoing it), the last.
      last = max(step for step, _ in events)
      values[tag] = (last, [v for step, v in events if step == last][-1])
  return values


TABLE_FILES = ("results.md", "results.csv")  # Beside the variants' workdirs.


def evaluation(variant_dir: str, config, split: str, mode: str, checkpoint: str,
               steps: Optional[int]) -> Optional[dict]:
  """The newest evaluate JSON of the whole `split` with `mode` for `checkpoint`
  (at config.decode's output length limit; beam at its beam size and alpha); a
  'latest' one made before the last step, or one of a 'best' or 'averaged'
  checkpoint since replaced (its checkpoint_identity not the current one's), is
  stale and ignored. So is one of a 'best' or 'averaged' that records no
  identity (evaluate before it recorded one): which average or best it scored
  is unknown, and a warning names it; and one whose recorded checksums are not
  those of the checkpoint of its step now (a workdir trained again after its
  checkpoints were deleted), with a warning."""
  found = []
  replaceable = checkpoint in workdir_lib.REPLACEABLE
  metric = metrics_lib.main_metric(config.data.dataset)
  current = workdir_lib.checkpoint_identity(variant_dir, checkpoint, metric)
  for path in glob.glob(os.path.join(variant_dir, "eval_*.json")):
    result = _well_formed(path, files.read_json_object(path), _EVALUATION_FIELDS)
    if result is None:
      continue
    score = (result.get("metrics") or {}).get(metric)
    if score is not None and not _number(score):
      logging.warning("Skipping %s: its metrics' %s is %r, not a number.", path, metric, score)
      continue
    if (result.get("split") != split or result.get("mode") != mode or result.get("limit")
        or result.get("checkpoint") != checkpoint):
      continue
    if result.get("max_extra_len", config.decode.max_extra_len) != config.decode.max_extra_len:
      continue
    if mode == "beam" and (result.get("beam_size"), result.get("alpha")) != (
        config.decode.beam_size, config.decode.alpha):
      continue
    if checkpoint == "latest" and steps is not None and result.get("step") != steps:
      continue
    if replaceable and workdir_lib.IDENTITY_KEY not in result:
      logging.warning("Skipping %s: it does not record which %s checkpoint it scored (an "
                      "older evaluate); rerun evaluate to fill its figure.", path, checkpoint)
      continue
    if replaceable and (current is None or result[workdir_lib.IDENTITY_KEY] != current):
      continue  # Of a best or average that a later one has replaced.
    scored, step = result.get(workdir_lib.CHECKSUMS_KEY), result.get("step")
    if scored and isinstance(step, int) and workdir_lib.checkpoint_checksums(
        variant_dir, checkpoint, step) not in (None, scored):
      logging.warning("Skipping %s: it scored a checkpoint %d other than the one %s holds "
                      "now (trained again since); rerun evaluate to fill its figure.", path,
                      step, variant_dir)
      continue
    found.append((os.path.getmtime(path), path, result))
  return max(found)[2] if found else None


def variant_row(variant, variant_dir: str, checkpoint: str = "latest",
                recipe: Optional[dict] = None, status: Optional[dict] = None) -> dict:
  """One table row: figures of a variant (a sweep.Variant) that its workdir holds.
  `recipe`: {'base', 'overrides'}, all of the variant's overrides that the
  table's notes state; where its status recorded others (that resolve to
  another config), the row's note names what it trained with. `status`: its
  sweep status as read_statuses read it, else read here."""
  row = {"variant": variant.name, "changes": " ".join(variant.overrides)}
  if variant.error and not holds_variant(variant_dir):
    return {**row, "status": "invalid", "error": variant.error}
  if not os.path.isdir(variant_dir):
    return {**row, "status": "not run"}
  status = (read_status(variant_dir) if status is None else status) or {}
  trained = status.get("overrides")
  if variant.error:  # Trained before the sweep file or the base changed: never left out.
    row["note"] = (f"invalid as the sweep resolves it now ({variant.error}); listed as its "
                   "workdir holds it, trained with " + _trained_with(status))
    row["changes"] = own_overrides(status) if trained is not None else row["changes"]
  # The checkpoints first: a variant continued outside the sweep (its emitted
  # command writes no status) has trained past the status's steps.
  steps = latest_step(variant_dir) or status.get("steps")
  row.update(status=status.get("status"), error=status.get("error"), steps=steps,
             wall_seconds=status.get("wall_seconds"))
  if row["status"] == "running" and not lock.held(os.path.join(variant_dir, SWEEP_LOCK_DIR)):
    row.update(status="interrupted", error="the sweep training it is gone (killed?), so it "
               "is not running: rerun the sweep to resume it")
  if recipe is not None and trained is not None and not same_recipe(
      {"base": status.get("base", recipe["base"]), "overrides": trained}, recipe):
    # The changes column says what it trained with, not what the sweep says now.
    row["changes"] = own_overrides(status)
    row["note"] = (f"trained with `{' '.join(trained) or '(no overrides)'}`, not "
                   f"`{' '.join(recipe['overrides']) or '(no overrides)'}` as the notes "
                   "above say")
  if not os.path.exists(os.path.join(variant_dir, "config.json")):
    return row
  config = workdir_lib.load_config(variant_dir)
  metric = metrics_lib.main_metric(config.data.dataset)
  # At the trained vocabulary's size, as the model has it; where the workdir
  # holds none, at data.vocab_size (the table's notes name those rows).
  has_vocabulary = os.path.exists(workdir_lib.vocabulary_path(variant_dir, config))
  vocab_size = workdir_lib.load_tokenizer(variant_dir, config).vocab_size if (
      has_vocabulary) else 0
  row["parameters"] = count_parameters(config, vocab_size)
  row["parameters_at_vocab_size"] = not has_vocabulary
  logged = last_scalar_steps(variant_dir, ["eval/perplexity", f"decode/{metric}"])
  scalars = {tag: value for tag, (_, value) in logged.items()}
  row[f"dev_{metric}_training"] = scalars.get(f"decode/{metric}")
  for name, split in (("dev", config.data.eval_split), ("test", config.data.test_split)):
    for mode in ("greedy", "beam"):
      result = evaluation(variant_dir, config, split, mode, checkpoint, steps)
      if result:
        row[f"{name}_{metric}_{mode}"] = (result.get("metrics") or {}).get(metric)
        if name == "dev" and result.get("perplexity") is not None:
          row["dev_perplexity"] = result["perplexity"]
  used = [f"decode/{metric}"]
  if row.get("dev_perplexity") is None and checkpoint == "latest":
    row["dev_perplexity"] = scalars.get("eval/perplexity")
    used.append("eval/perplexity")
  # A run stopped between evaluations: its last one is of an earlier step.
  earlier = [f"{_LOGGED_FIGURES[tag.split('/')[0]]} is of step {logged[tag][0]}"
             for tag in used if tag in logged and logged[tag][0] != steps]
  if earlier and steps is not None:
    row["note"] = "; ".join(filter(None, [row.get("note"), (
        f"{', '.join(earlier)}: the last logged; the latest checkpoint is at step {steps}")]))
  return row


_LOGGED_FIGURES = {"eval": "training's dev PPL", "decode": "its dev score (training)"}


def columns(metric: str) -> list:
  """(csv name, markdown header, markdown format) of each column."""
  label, scale = _METRIC_NAMES.get(metric, (metric, 1.0))
  score = lambda v: f"{v * scale:.2f}"
  return [
      ("variant", "variant", str), ("changes", "changes", str),
      ("parameters", "params", "{:,}".format), ("steps", "steps", str),
      ("wall_seconds", "train time", lambda s: f"{int(s) // 3600}:{int(s) // 60 % 60:02d}:"
                                               f"{int(s) % 60:02d}"),
      ("dev_perplexity", "dev PPL", "{:.2f}".format),
      (f"dev_{metric}_training", f"dev {label} (training)", score),
      (f"dev_{metric}_greedy", f"dev {label} greedy", score),
      (f"dev_{metric}_beam", f"dev {label} beam", score),
      (f"test_{metric}_greedy", f"test {label} greedy", score),
      (f"test_{metric}_beam", f"test {label} beam", score),
      ("status", "status", str)]


def to_csv(rows, metric: str) -> str:
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  # parameters_at_vocab_size: the markdown's params note, a column here (the
  # count is at data.vocab_size: the workdir holds no trained vocabulary).
  names = [c[0] for c in columns(metric)] + ["parameters_at_vocab_size", "error", "note"]
  writer.writerow(names)
  for row in rows:
    writer.writerow(["" if row.get(n) is None else row[n] for n in names])
  return out.getvalue()


def to_markdown(rows, metric: str, title: str, notes=()) -> str:
  cols = columns(metric)
  lines = [f"# {title}", ""] + [line for note in notes for line in (note, "")] + [
      "| " + " | ".join(c[1] for c in cols) + " |",
      "|" + "|".join("---" if c[0] in _TEXT_COLUMNS else "---:" for c in cols) + "|"]
  for row in rows:
    cells = ["" if row.get(n) is None else fmt(row[n]) for n, _, fmt in cols]
    # A line end (in an override's value, say) would end the table's row.
    lines.append("| " + " | ".join(_LINE_END.sub(" ", c.replace("|", "\\|")) for c in cells)
                 + " |")
  errors = [f"- {row['variant']}" + (f" ({row['status']})" if row.get("status") else "")
            + ": " + _LINE_END.sub("\n  ", str(row[key]))
            for row in rows for key in ("error", "note") if row.get(key)]
  lines += ["", *errors] if errors else []
  return "\n".join(lines) + "\n"


def _estimated_note(rows) -> Optional[str]:
  """The note naming the rows whose params are counted at data.vocab_size (no
  trained vocabulary in the workdir), where there are such rows."""
  counted = [row for row in rows if row.get("parameters") is not None]
  estimated = [row["variant"] for row in counted if row.get("parameters_at_vocab_size")]
  if not estimated:
    return None
  if len(estimated) == len(counted):
    return "params: at data.vocab_size (no workdir holds its trained vocabulary)."
  return (f"params of {', '.join(estimated)}: at data.vocab_size (no trained vocabulary in "
          "the workdir); the others' at their trained vocabulary's size.")


def collect(sweep, workdir: str, checkpoint: str = "latest", statuses: Optional[dict] = None):
  """Writes results.md and results.csv into `workdir`; returns the markdown.
  `statuses`: read_statuses(workdir), where the caller has read them (each
  file read once: a damaged one is warned of once).

  The notes over the table describe the base as its workdir trained it (its
  config.json) and the --set its variants' statuses record (recorded_sets), not
  as this collect's --set would resolve them: a collect without the run's --set
  still labels the run's table. A workdir of no variant as `sweep` resolves
  them gets a row too, with a note: no trained variant is left out.
  """
  # evaluate's check of the name (a ValueError naming the names), before
  # anything is read or written: a bad one would make a table of blanks.
  checkpoint = workdir_lib.checkpoint_name(checkpoint)
  workdir_lib.require_directory(workdir, "--collect: sweep workdir")
  base_dir = os.path.join(workdir, sweep.variants[0].name)
  base = (workdir_lib.load_config(base_dir) if os.path.exists(
      os.path.join(base_dir, "config.json")) else sweep.variants[0].config)
  statuses = read_statuses(workdir) if statuses is None else statuses
  sets = recorded_sets(sweep, statuses)
  sets = sweep.sets if sets is None else sets
  as_run = dataclasses.replace(sweep, sets=sets)
  rows = [variant_row(v, os.path.join(workdir, v.name), checkpoint,
                      None if v.error else {"base": sweep.base, "overrides": as_run.overrides(v)},
                      statuses.get(v.name, {}))
          for v in sweep.variants]
  # Workdirs of no variant as resolved here (one that scales with a base whose
  # --set no status records): listed as found, never left out.
  for name in sorted(set(statuses) - {v.name for v in sweep.variants}):
    row = variant_row(dataclasses.replace(sweep.variants[0], name=name, overrides=[]),
                      os.path.join(workdir, name), checkpoint, None, statuses[name])
    row["changes"] = own_overrides(statuses[name])
    row["note"] = "; ".join(filter(None, [
        f"no variant of {sweep.path}" + (f" with `{' '.join(sets)}`" if sets else "")
        + "; listed as its workdir holds it, trained with " + _trained_with(statuses[name]),
        row.get("note")]))
    rows.append(row)
  metric = metrics_lib.main_metric(base.data.dataset)
  notes = [f"On every variant (--set): `{' '.join(sets)}`." if sets else None,
           f"dev = {base.data.eval_split}, test = {base.data.test_split}; checkpoint "
           f"{checkpoint}; beam {base.decode.beam_size}, alpha {base.decode.alpha}. "
           "dev PPL: per target token, without label smoothing." + (
               " (training): the decode during training at its last step "
               f"({base.train.decode_mode}, {base.train.decode_examples or 'all'} sentences)."
               if base.train.decode_every else ""),
           _estimated_note(rows),
           "A blank is a figure the workdir does not hold."]
  markdown = to_markdown(rows, metric, f"{sweep.path} on {sweep.base}",
                         [n for n in notes if n])
  files.write_atomic(os.path.join(workdir, TABLE_FILES[0]), markdown)
  files.write_atomic(os.path.join(workdir, TABLE_FILES[1]), to_csv(rows, metric))
  return markdown
