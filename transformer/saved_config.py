"""The rules for a saved config.json: what a workdir's config must hold to load
(check_saved), and which fields a resumed run may change (resume_changes).

workdir.load_config and check_resume_config apply them; sweep_run asks them
whether a variant's rerun continues its workdir.
"""

from transformer.config import check_config, flatten, unread_field

# What a resumed run may change. Its checkpoints hold parameters, optimizer
# state and a position in the data order, so the fields that shape those must
# keep the workdir's values: a changed one would fail deep inside Orbax, or
# silently read other batches than the run being continued. Every other field
# (num_steps, the eval/decode/log/checkpoint cadence, decoding, the learning rate
# scale, where the data lives) may change, and the change is logged. The mesh and
# train.grad_accum_steps may change too: they set the rows of a batch (a multiple
# of the data axis times the steps), and the data position, which records the
# rows, refuses other rows mid-epoch itself (pipeline.TrainBatches.set_state).
_PARAMETERS = "changes the parameters"
VOCABULARY_REASON = "changes the vocabulary"
_DATA_ORDER = "moves the data order the saved position points into"
# Model fields that act at run time only; every other model field is fixed.
RESUMABLE_MODEL_FIELDS = ("dropout", "attention_dropout", "attention_impl", "dtype")
# Optional paths whose empty string means unset, as None does (what reads them).
UNSET_WHEN_EMPTY = ("data.vocab_path", "data.tfds_data_dir")
FIXED_ON_RESUME = {
    "seed": _DATA_ORDER,
    **{f"data.{name}": VOCABULARY_REASON for name in ("vocab_size", "vocab_type", "vocab_path")},
    **{f"data.{name}": _DATA_ORDER for name in (
        "dataset", "source_lang", "target_lang", "train_split", "max_length", "overlong",
        "batching", "tokens_per_batch", "pack_length", "pack_source_length")},
}


def check_saved(values: dict) -> None:
  """check_config(trained=True) of a saved config.json's values (`values`, nested
  dicts), each put in configs/base.py's config in place of its default: a
  hand-edited file's value of the wrong type (ConfigDict refuses it; a None where
  base has a value) or out of range is named now, not in a traceback later. A
  field base lacks (one since removed) goes unread."""
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  for field, value in flatten(values).items():
    *parents, name = field.split(".")
    node = config
    for part in parents:
      node = node.get(part) if hasattr(node, "get") else None
    if not hasattr(node, "keys") or name not in node.keys() or hasattr(node[name], "keys"):
      continue
    try:
      if value is None and node[name] is not None:  # ConfigDict takes None anywhere.
        raise TypeError
      node[name] = value
    except TypeError:
      raise ValueError(f"config.{field}={value!r}: must be of type "
                       f"{type(node[name]).__name__}") from None
  check_config(config, trained=True)


def resume_changes(saved: dict, current: dict):
  """(fixed, free): the fields whose values differ between the config a workdir
  was trained with and the current one (nested dicts of JSON values), as
  (field, old, new, why it cannot change) and (field, old, new). Fields only
  one of them has (workdirs older than a field) are not compared."""
  old, new = flatten(saved), flatten(current)
  fixed, free = [], []
  for field in sorted(set(old) & set(new)):
    if old[field] == new[field] or (field in UNSET_WHEN_EMPTY and not old[field]
                                    and not new[field]):
      continue
    section, _, name = field.partition(".")
    reason = FIXED_ON_RESUME.get(field)
    if section == "model" and name not in RESUMABLE_MODEL_FIELDS:
      reason = _PARAMETERS
    if name == "max_len" and not {saved["model"].get("positional"),
                                  current["model"].get("positional")} & {"learned"}:
      reason = None  # A sinusoid's table, computed at any length, is no parameter.
    if unread_field(saved, field) and unread_field(current, field):
      # Neither the saved nor the current config reads it (the Transformer's heads
      # on the RNN, a vocabulary size beside data.vocab_path): it shapes nothing.
      reason = None
    if field == "optim.grad_clip_norm" and (old[field] > 0) != (new[field] > 0):
      reason = "adds or removes the optimizer's clipping state"
    if reason:
      fixed.append((field, old[field], new[field], reason))
    else:
      free.append((field, old[field], new[field]))
  return fixed, free
