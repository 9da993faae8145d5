"""One way for the commands at the edge (evaluate, translate, average_checkpoints)
to restore what training left in a workdir: config.json, spm.model, checkpoints;
and the check that a resumed training's config fits what the workdir holds.

Checkpoints are chosen by name: 'latest' (default), a step number, 'best' (the
best validation score, see training) or 'averaged' (average_checkpoints).
"""

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import re
import sys
from typing import Any, Optional

from absl import logging
import ml_collections

from transformer import checkpoints, distributed, files, runtime, sharding, state as state_lib
from transformer import config as config_lib
from transformer import saved_config
from transformer import metrics as metrics_lib
from transformer.data import tokenizer as tokenizer_lib

CHECKPOINT_DIRS = {"latest": "checkpoints", "best": "checkpoints_best",
                   "averaged": "checkpoints_averaged"}
AVERAGED_RECORD = "averaged.json"  # In checkpoints_averaged: the steps averaged.


def default_workdir(config_flag: str) -> str:
  """train.py's workdir without --workdir: runs/<config file stem>, plus the config
  argument if any (`configs/multi30k.py:de-en` -> runs/multi30k_de-en), so that
  the two directions never resume each other's run."""
  path, _, argument = config_flag.partition(":")
  stem = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", f"{stem}_{argument}" if argument else stem)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: is {workdir!r} a training workdir?")
  with open(path, encoding="utf-8") as f:
    try:
      values = json.load(f)
    except ValueError as e:  # Not JSON, or not UTF-8: a ValueError that names no file.
      raise ValueError(f"{path} is not valid JSON (damaged or truncated?): {e}") from e
  if not isinstance(values, dict):
    raise ValueError(f"{path} holds a {type(values).__name__}, not a config")
  config_lib.check_sections(values, path)
  # Workdirs written before config.model.attention_bias existed were trained with
  # biased attention projections (Flax's default then).
  values.get("model", {}).setdefault("attention_bias", True)
  config = ml_collections.ConfigDict(values)
  try:  # A hand-edited file: its fields named now, not in a traceback later.
    config_lib.model_config(config)
    saved_config.check_saved(values)
  except (ValueError, TypeError, AttributeError) as e:
    raise ValueError(f"{path}: {e}") from e
  return config


class ConfigMismatchError(runtime.CommandError):
  """A resume whose config changes a field the workdir's checkpoints depend on."""


# What the in-training decode score, which picks the best checkpoint, is measured on.
SCORE_FIELDS = ("train.decode_mode", "train.decode_examples", "data.eval_split",
                "decode.beam_size", "decode.alpha", "decode.max_extra_len",
                "model.max_len")  # Decoding's output limit is within max_len too.
BEAM_SCORE_FIELDS = ("decode.beam_size", "decode.alpha")  # Greedy search reads neither.

# What a trained vocabulary depends on besides its own fields: the text it was
# trained on (the training split of that dataset, both languages).
VOCABULARY_TEXT = ("data.dataset", "data.source_lang", "data.target_lang", "data.train_split")


def _text_moved(workdir: str, saved: dict, config) -> list:
  """data.text_dir, where a 'parallel_text' vocabulary's text was read, now another
  directory, as a change (field, old, new, why): its files may be another corpus.
  (Checkpoints may follow moved text; their data position checks the rows.)
  The place compared is the absolute one VOCABULARY_RECORD holds for this very
  vocabulary; without it (a run killed before writing it, an older workdir),
  config.json's path resolved from the current directory, which cannot tell the
  same relative path given from another directory."""
  new = config.data.get("text_dir")
  if config.data.dataset != "parallel_text" or not new:
    return []
  old = _recorded_text_dir(workdir) or saved.get("data", {}).get("text_dir")
  if not old or os.path.realpath(old) == os.path.realpath(new):  # Same place, spelt otherwise.
    return []
  return [("data.text_dir", old, new, "the vocabulary was trained on the text there")]


def holds_training(workdir: str) -> bool:
  """Whether `workdir` holds what a config.json describes: a vocabulary or checkpoints."""
  return (os.path.isfile(os.path.join(workdir, tokenizer_lib.MODEL_FILENAME))
          or bool(checkpoints.complete_steps(os.path.join(workdir, CHECKPOINT_DIRS["latest"]))))


def check_resume_config(workdir: str, config) -> None:
  """Stops a run on `workdir` whose `config` changes a field its vocabulary or
  checkpoints depend on (saved_config.FIXED_ON_RESUME: shapes, vocabulary, data order),
  naming each such field; logs the fields that may change (num_steps, cadences).
  A workdir without vocabulary or checkpoints yet has nothing to disagree with;
  one with a vocabulary alone (a run that stopped before its first checkpoint)
  only its vocabulary's fields and where its text is. Checkpoints without the config.json or the
  vocabulary they were trained with stop it too."""
  vocabulary = os.path.join(workdir, tokenizer_lib.MODEL_FILENAME)
  checkpoint_dir = os.path.join(workdir, CHECKPOINT_DIRS["latest"])
  has_checkpoints = bool(checkpoints.complete_steps(checkpoint_dir))
  has_vocabulary = os.path.isfile(vocabulary)
  has_config = os.path.exists(os.path.join(workdir, "config.json"))
  if has_checkpoints and not has_config:
    raise ConfigMismatchError(
        f"workdir {workdir} holds checkpoints but no config.json, the config they were "
        "trained with: put it back, or use a new --workdir")
  if has_checkpoints and not has_vocabulary and not config.data.get("vocab_path"):
    raise ConfigMismatchError(
        f"workdir {workdir} holds checkpoints but not the vocabulary they were trained with "
        f"({vocabulary}): put it back, or use a new --workdir (a new one would give other "
        "ids to the pieces)")
  if has_checkpoints:
    check_vocabulary(workdir, config)
  if not (has_checkpoints or has_vocabulary) or not has_config:
    return
  saved = load_config(workdir).to_dict()
  fixed, free = saved_config.resume_changes(
      saved, json.loads(config.to_json_best_effort()))
  if not has_checkpoints:
    fixed = [change for change in fixed
             if change[3] == saved_config.VOCABULARY_REASON or change[0] in VOCABULARY_TEXT]
    fixed += _text_moved(workdir, saved, config)
  if fixed:
    untrained = "" if has_checkpoints else (
        f", or delete {vocabulary} (no checkpoint uses it yet) to train a new vocabulary")
    raise ConfigMismatchError(
        f"workdir {workdir} was trained with another config, and these fields cannot "
        "change on resume: " + "; ".join(f"{f} {o!r} -> {n!r} ({why})" for f, o, n, why in fixed)
        + f". Rerun with the workdir's values (its config.json) or use a new --workdir{untrained}.")
  if free:
    logging.info("Resuming %s with changed fields: %s", workdir,
                 "; ".join(f"{f} {o!r} -> {n!r}" for f, o, n in free))
  greedy = saved.get("train", {}).get("decode_mode") == config.train.decode_mode == "greedy"
  measure = [f for f, _, _ in free if f in SCORE_FIELDS
             and not (greedy and f in BEAM_SCORE_FIELDS)]
  best = os.path.join(workdir, CHECKPOINT_DIRS["best"])
  if measure and checkpoints.complete_steps(best):
    logging.warning("Resuming %s with other decoding settings (%s): the kept best "
                    "checkpoint was scored with the old ones, and new scores are compared "
                    "with it as they stand.", workdir, ", ".join(measure))


def distributed_settings(workdir: str):
  """config.distributed of the workdir's config.json (how long a multi-process
  evaluate or translate waits for its processes); None where there is none."""
  try:
    return load_config(workdir).get("distributed")
  except FileNotFoundError:  # The command itself reports the missing workdir.
    return None


@contextlib.contextmanager
def command(name: str, workdir: str):
  """The set-up of a command on a trained workdir (evaluate, translate,
  average_checkpoints): quiet library logs and the compilation cache; bad input
  stopping it in one line; in a multi-process job, joining the job with the
  workdir's timeouts, every process given the same arguments, a failing
  process exiting at once."""
  runtime.quiet_library_logs()
  runtime.use_compilation_cache()
  with runtime.one_line_errors(name), distributed.exit_at_once_on_error(name):
    distributed.maybe_initialize(distributed_settings(workdir))
    distributed.check_same_arguments(name, sys.argv[1:])
    yield


def vocabulary_path(workdir: str, config) -> str:
  return tokenizer_lib.vocabulary_path(config.data, workdir)


def load_tokenizer(workdir: str, config) -> tokenizer_lib.Tokenizer:
  path = vocabulary_path(workdir, config)
  if not os.path.exists(path):
    raise FileNotFoundError(f"vocabulary {path} not found (training writes it)")
  return tokenizer_lib.Tokenizer.load(path)


# The vocabulary a workdir's checkpoints were trained with: its SHA-256 and
# piece count, recorded by training. Another file in its place (rebuilt, copied
# from another run, a vocab_path whose file changed) restores without an error
# where it has as many pieces, and every id then means another piece.
VOCABULARY_RECORD = "vocabulary.json"


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def record_vocabulary(workdir: str, config, tokenizer) -> None:
  """Writes VOCABULARY_RECORD; for 'parallel_text', with the absolute text_dir
  the vocabulary's text was read from (relative paths depend on the directory)."""
  record = {"sha256": _sha256(vocabulary_path(workdir, config)), "pieces": tokenizer.vocab_size}
  if config.data.dataset == "parallel_text" and config.data.get("text_dir"):
    record["text_dir"] = os.path.abspath(config.data.text_dir)
  files.write_atomic(os.path.join(workdir, VOCABULARY_RECORD), json.dumps(record))


def _recorded_text_dir(workdir: str) -> Optional[str]:
  """The absolute text_dir VOCABULARY_RECORD holds, where it records the
  workdir's present vocabulary; else None (no record, a damaged one, or one left
  by a vocabulary since deleted)."""
  record_path = os.path.join(workdir, VOCABULARY_RECORD)
  record = files.read_json_object(record_path) if os.path.isfile(record_path) else None
  path = os.path.join(workdir, tokenizer_lib.MODEL_FILENAME)
  if not (record and isinstance(record.get("text_dir"), str) and os.path.isfile(path)):
    return None
  return record["text_dir"] if record.get("sha256") == _sha256(path) else None


def check_vocabulary(workdir: str, config) -> None:
  """ConfigMismatchError where the workdir's vocabulary is not the file its
  checkpoints were trained with (VOCABULARY_RECORD); workdirs from before the
  record pass unchecked."""
  record_path = os.path.join(workdir, VOCABULARY_RECORD)
  path = vocabulary_path(workdir, config)
  if not (os.path.exists(record_path) and os.path.exists(path)):
    return
  try:
    with open(record_path) as f:
      record = json.load(f)
    sha, pieces = record["sha256"], int(record["pieces"])
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{record_path} is damaged ({e}): it records the vocabulary "
                     f"{workdir}'s checkpoints were trained with; delete it to go on "
                     "unchecked") from e
  if _sha256(path) != sha:
    now = tokenizer_lib.Tokenizer.load(path).vocab_size
    raise ConfigMismatchError(
        f"vocabulary {path} is not the one {workdir}'s checkpoints were trained with "
        f"({now} pieces, against {pieces} then" + (", and other bytes" if now == pieces else "")
        + f"; {VOCABULARY_RECORD} records it): put the original back, or use a new "
        "--workdir (another vocabulary gives other ids to the pieces)")


def require_directory(workdir: str, what: str = "workdir") -> None:
  """A FileNotFoundError naming `workdir` where it is no directory: missing, or a file."""
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"{what} {workdir!r} " + (
        "is a file, not a directory" if os.path.exists(workdir) else "does not exist"))


def checkpoint_name(checkpoint) -> str:
  """A checkpoint's name as files and tables spell it: a step number in ASCII
  digits without leading zeros ('0010' is '10'; it named its evaluate files
  apart and --collect missed them), or one of CHECKPOINT_DIRS' names."""
  if re.fullmatch(r"[0-9]+", str(checkpoint)):  # Not isdecimal: '١٠' is int() 10 too.
    return str(int(checkpoint))
  if checkpoint not in CHECKPOINT_DIRS:
    raise ValueError(f"checkpoint must be a step number or one of {sorted(CHECKPOINT_DIRS)}, "
                     f"got {checkpoint!r}")
  return checkpoint


def checkpoint_location(workdir: str, checkpoint: str = "latest"):
  """(directory, step or None for the newest) of a checkpoint name."""
  checkpoint = checkpoint_name(checkpoint)
  if checkpoint.isdigit():
    return os.path.join(workdir, CHECKPOINT_DIRS["latest"]), int(checkpoint)
  path = os.path.join(workdir, CHECKPOINT_DIRS[checkpoint])
  if checkpoint == "best":
    # Training moves the kept best aside while it saves a better one of the same
    # step (checkpoints.Checkpointer.save); a reader does not move it back.
    aside = [moved for step, moved in checkpoints.replaced_aside(path)
             if not os.path.isdir(os.path.join(path, str(step)))]
    if aside:
      raise FileNotFoundError(
          f"the best checkpoint in {path} is being replaced ({os.path.basename(aside[0])}): "
          "rerun once training has saved the new one; after a killed run, the next "
          "train.py on this workdir puts the old one back")
  if checkpoint == "averaged" and not os.path.isdir(path):
    # average_checkpoints killed between moving the previous average aside and
    # moving the new one in: the previous one is complete, under another name.
    moved = sorted(glob.glob(glob.escape(path) + ".old*"), key=os.path.getmtime)
    if moved:
      return moved[-1], None
  return path, None


@dataclasses.dataclass
class Opened:
  """A workdir's config and vocabulary, and the model and state shapes they build."""
  workdir: str
  config: ml_collections.ConfigDict
  tokenizer: tokenizer_lib.Tokenizer
  built: state_lib.Built
  mesh: Any

  def checkpoints(self, checkpoint: str = "latest"):
    """(read-only Checkpointer, step or None for its newest) of a checkpoint name."""
    directory, step = checkpoint_location(self.workdir, checkpoint)
    # The best checkpoints are read best first: a better one may have an earlier step.
    metric = metrics_lib.main_metric(self.config.data.dataset) if checkpoint == "best" else None
    return checkpoints.Checkpointer(directory, read_only=True, best_metric=metric), step


REPLACEABLE = ("best", "averaged")  # Checkpoint names that a later save gives to another state.
IDENTITY_KEY = "checkpoint_identity"  # evaluate's record of which one it scored.
CHECKSUMS_KEY = "checkpoint_checksums"  # evaluate's record of the arrays it scored.


def checkpoint_checksums(workdir: str, checkpoint: str, step: int) -> Optional[str]:
  """checkpoints.checksums_digest of `step` under the name `checkpoint`: evaluate
  records it, and results.evaluation skips a JSON of another checkpoint of
  that step (None where there is none to compare: deleted, or older)."""
  try:
    directory, _ = checkpoint_location(workdir, checkpoint)
  except (FileNotFoundError, ValueError):
    return None
  return checkpoints.checksums_digest(directory, step)


def _saved_metrics(directory: str, step: int) -> Optional[dict]:
  """The metrics saved with a best checkpoint (what made it best); None where unreadable."""
  try:
    value = checkpoints.saved_metrics(directory, step)
  except Exception:  # pylint: disable=broad-except  # Orbax's reader: any error is unreadable.
    return None
  return value if isinstance(value, dict) and value else None


def checkpoint_identity(workdir: str, checkpoint: str, metric: str,
                        step: Optional[int] = None) -> Optional[dict]:
  """What tells the `best` or `averaged` checkpoint of `workdir` from another
  that has since taken its name, at any step, its own included (None for other
  names, whose step says it, and where it cannot be read):
    averaged  {"step", "averaged_steps"}: average_checkpoints' averaged.json (an
              average of --last 2 and one of --last 5 share their newest step);
    best      {"step", "metrics"}: the score saved with it (`metric` the one that
              ranks them), which a replacement of the same step beats.
  `step`: the one restored (evaluate), else the one a restore would read first.
  evaluate records it; results.evaluation skips a JSON whose identity is not the
  current checkpoint's."""
  if checkpoint not in REPLACEABLE:
    return None
  try:
    directory, _ = checkpoint_location(workdir, checkpoint)
  except FileNotFoundError:  # A best checkpoint being replaced.
    return None
  if checkpoint == "averaged":
    path = os.path.join(directory, AVERAGED_RECORD)
    recorded = files.read_json_object(path) if os.path.exists(path) else None
    averaged = (recorded or {}).get("averaged_steps")
    if (not isinstance(averaged, list) or not averaged
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in averaged)
        or step not in (None, averaged[-1])
        or averaged[-1] not in checkpoints.complete_steps(directory)):
      return None
    return {"step": averaged[-1], "averaged_steps": averaged}
  steps = checkpoints.complete_steps(directory)
  if step is None and steps:  # The one a restore tries first.
    step = checkpoints.best_first(directory, steps, metric)[0]
  saved = _saved_metrics(directory, step) if step in steps else None
  if saved is None:
    return None
  return {"step": step, "metrics": saved}


def open_workdir(workdir: str, mesh=None) -> Opened:
  files.check_local(workdir)
  config = load_config(workdir)
  check_vocabulary(workdir, config)
  tokenizer = load_tokenizer(workdir, config)
  mesh = mesh or sharding.mesh_for_reading(config.train.get("mesh", sharding.DEFAULT_MESH))
  return Opened(workdir, config, tokenizer,
                state_lib.build(config, tokenizer.vocab_size, mesh), mesh)


@dataclasses.dataclass
class Restored:
  config: ml_collections.ConfigDict
  tokenizer: tokenizer_lib.Tokenizer
  model: Any
  state: state_lib.TrainState
  step: int
  mesh: Any

  @property
  def params(self):
    return self.state.params


def restore(workdir: str, checkpoint: str = "latest", mesh=None) -> Restored:
  """Config, tokenizer, model and the chosen checkpoint's state of a workdir."""
  opened = open_workdir(workdir, mesh)
  checkpointer, step = opened.checkpoints(checkpoint)
  restored = checkpointer.restore(opened.built.abstract, opened.built.shardings, step)
  if restored is None:
    raise FileNotFoundError(f"no checkpoint in {checkpointer.directory}")
  state, _, step = restored
  return Restored(opened.config, opened.tokenizer, opened.built.model, state, step,
                  opened.mesh)
