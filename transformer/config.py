"""The model's configuration: a frozen dataclass built once from the ConfigDict.

The ml_collections ConfigDict stops here (house style): the model sees only
`ModelConfig` (a variant is `dataclasses.replace(cfg, ...)`, checked like any).
Every value is checked at start-up, and a bad one names its config field.
"""

import contextlib
import dataclasses
import difflib
import json
import math
import numbers
import re
from typing import Any, Optional
import warnings

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from transformer.sharding import DEFAULT_MESH, parse_mesh

# The ids every vocabulary reserves: the tokenizer trains them in at these places,
# the data pipeline pads with PAD and ends examples with EOS, the decoder starts
# from BOS and stops at EOS.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

# The allowed values of the config's enumerated fields, read by the checks below
# and by the code that implements them.
VOCAB_TYPES = ("bpe", "unigram", "word")  # data.vocab_type: SentencePiece model types.
BATCHING = ("bucket", "pack")  # data.batching
OVERLONG = ("drop", "truncate")  # data.overlong
DECODE_MODES = ("greedy", "beam", "sample")  # Searches; the first two are scored.
SCORED_DECODE_MODES = ("greedy", "beam")  # train.decode_mode, evaluate --mode.
ACTIVATIONS = ("relu", "gelu", "silu")
POSITIONAL = ("sinusoidal", "learned")
NORM_POSITIONS = ("post", "pre")
ATTENTION_SCORES = ("scaled_dot", "dot", "additive", "general")
ATTENTION_IMPLEMENTATIONS = ("fused", "reference")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# model.dtype "auto": bfloat16 where the matrix units run it at full rate, float32 on
# CPUs (bfloat16 pays only on CPUs with AVX-512 BF16 or AMX, runs slower on AVX2-only
# ones, and rounds more: benchmarks/README.md).
AUTO_DTYPE = {"gpu": "bfloat16", "cuda": "bfloat16", "rocm": "bfloat16", "tpu": "bfloat16"}
ARCHITECTURES = ("transformer", "rnn")  # model.architecture; rnn: transformer/rnn.py.
# The model fields that only one architecture reads: set on the other's base,
# they would train that base model under another name (the sweep refuses them).
ARCHITECTURE_ONLY_FIELDS = {
    "transformer": ("num_heads", "d_k", "d_ff", "activation", "norm_position", "positional",
                    "attention_score", "attention_impl", "attention_dropout",
                    "attention_bias"),
    "rnn": ("rnn_cell", "rnn_attention", "rnn_input_feeding"),
}
# The architectures whose decoding restarts rows, which refilling beam search
# needs (decode.restarts_rows of their decoding class; test_decode checks that
# the two agree): named here, below the models, for the checks of settings.
REFILLING_ARCHITECTURES = ("transformer",)
RNN_CELLS = ("gru", "lstm")
RNN_ATTENTIONS = ("bahdanau", "luong_general", "luong_dot")


def unread_model_field(model, name: str) -> Optional[str]:
  """Why `model` (config.model) does not read its field `name`, or None where
  it does: a field of the other architecture, or Luong's input feeding on
  Bahdanau's attention (whose context enters the recurrence itself)."""
  architecture = model.get("architecture", "transformer")
  for other, fields in ARCHITECTURE_ONLY_FIELDS.items():
    if other != architecture and name in fields:
      return f"has no effect with model.architecture={architecture!r} (only the {other} reads it)"
  if (architecture == "rnn" and name == "rnn_input_feeding"
      and model.get("rnn_attention") == "bahdanau"):
    return "has no effect with model.rnn_attention='bahdanau' (only Luong's attentions read it)"
  return None


_OVERRIDE = re.compile(r"--?(?:no)?config\.([A-Za-z_][\w.]*)")  # The field set.


def overridden_fields(argv) -> list:
  """The config fields that command-line arguments set: `--config.FIELD=VALUE`,
  and absl's other spellings (`-config.FIELD`, `--noconfig.FIELD` for False)."""
  return [found.group(1) for found in map(_OVERRIDE.match, argv) if found]


# Fields a vocabulary file given as data.vocab_path takes the place of.
VOCABULARY_TRAINING_FIELDS = ("data.vocab_size", "data.vocab_type")


def unread_field(config, field: str) -> Optional[str]:
  """Why `config` (a ConfigDict or the dict of a saved config.json) does not
  read `field` (e.g. 'model.num_heads'), or None where it does: a model field
  unread_model_field names, or what trains a vocabulary where data.vocab_path
  gives one."""
  section, _, name = field.partition(".")
  if section == "model":
    return unread_model_field(config.get("model", {}), name)
  if field in VOCABULARY_TRAINING_FIELDS and config.get("data", {}).get("vocab_path"):
    return ("has no effect with data.vocab_path set (the vocabulary is that file; "
            "its size is the embeddings')")
  return None


def unread_overrides(config, fields) -> list:
  """(field, why) of each overridden field that the config does not read
  (unread_field): an ablation of it would train the base again."""
  return [(field, why) for field, why in ((f, unread_field(config, f)) for f in fields) if why]


def resolve_dtype(dtype: str, backend: str = "") -> str:
  """model.dtype with "auto" resolved for this backend (or the one named)."""
  if dtype != "auto":
    return dtype
  return AUTO_DTYPE.get(backend or jax.default_backend(), "float32")


def _other_architectures_fields(architecture) -> set:
  """The model fields that `architecture` does not read: warned of as unread, not
  checked, for the run trains as without them (unread_model_field)."""
  return {field for other, fields in ARCHITECTURE_ONLY_FIELDS.items()
          if other != architecture for field in fields}


# What a model field of each type takes (a hand-edited config.json can hold any JSON).
_FIELD_TYPES = {int: ("an integer", lambda x: isinstance(x, numbers.Integral)
                      and not isinstance(x, bool)),
                float: ("a number", lambda x: isinstance(x, numbers.Real)
                        and not isinstance(x, bool)),
                bool: ("true or false", lambda x: isinstance(x, (bool, np.bool_))),
                str: ("a string", lambda x: isinstance(x, str))}


# ModelConfig's fields that come from the vocabulary, not from config.model.
SPECIAL_IDS = {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
NOT_SETTINGS = {
    **dict.fromkeys(("input_vocab_size", "output_vocab_size"),
                    "the vocabulary's size sets it (data.vocab_size, or data.vocab_path's file)"),
    **dict.fromkeys(("pad_id", "bos_id", "eos_id"),
                    "the vocabulary reserves ids 0-3 for PAD, UNK, BOS and EOS, which the "
                    "data pipeline and the searches use"),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of the Transformer; defaults are the paper's base model."""

  input_vocab_size: int = 37000
  output_vocab_size: int = 37000
  share_embeddings: bool = True  # Source and target embeddings are one matrix (3.4).
  tie_output: bool = True  # Pre-softmax projection = target embedding (3.4).
  num_layers: int = 6  # N (3.1); the encoder and decoder each have N layers.
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8  # h; d_k = d_v = d_model / h (3.2.2).
  d_k: int = 0  # Query/key size per head; 0 = d_model / h. Table 3 row (B) sets it alone.
  dropout: float = 0.1  # P_drop (5.4).
  attention_dropout: float = 0.0  # On attention probabilities; not in the paper.
  attention_bias: bool = False  # W^Q, W^K, W^V, W^O are plain matrices (3.2.2).
  activation: str = "relu"  # FFN(x) = max(0, x W1 + b1) W2 + b2 (3.3).
  norm_position: str = "post"  # "post": LayerNorm(x + Sublayer(x)) as the paper.
  positional: str = "sinusoidal"  # Section 3.5; "learned" is Table 3 row (E).
  max_len: int = 256  # Longest position the model can represent.
  attention_score: str = "scaled_dot"  # QK^T / sqrt(d_k) (3.2.1) | dot | additive | general.
  # "fused": jax.nn.dot_product_attention (cuDNN, XLA; on a CPU the reference) | "reference".
  attention_impl: str = "fused"
  dtype: str = "float32"  # Compute dtype (or "auto"); parameters always stay float32.
  # The recurrent encoder-decoders the paper compares against (transformer/rnn.py).
  # They read d_model (embeddings, decoder state; d_model / 2 per encoder direction),
  # num_layers, dropout, share_embeddings, tie_output and max_len, and none of the
  # attention/FFN fields above.
  architecture: str = "transformer"  # transformer | rnn.
  rnn_cell: str = "gru"  # gru | lstm.
  rnn_attention: str = "bahdanau"  # bahdanau (additive) | luong_general | luong_dot.
  rnn_input_feeding: bool = True  # Luong: feed h~_{t-1} with the next input (3.3).
  pad_id: int = PAD_ID
  bos_id: int = BOS_ID  # Fed to the decoder first.
  eos_id: int = EOS_ID  # Ends a decoded sequence.

  def __post_init__(self):
    unread = _other_architectures_fields(self.architecture)

    def check(ok, field, message):
      if not ok and field not in unread:
        raise ValueError(f"config.model.{field}={getattr(self, field)!r}: {message}")

    for field in ("input_vocab_size", "output_vocab_size", "num_layers", "d_model",
                  "d_ff", "num_heads", "max_len"):
      check(getattr(self, field) > 0, field, "must be a positive integer")
    check(self.d_k >= 0, "d_k", "must be >= 0 (0 = d_model / num_heads)")
    check(self.architecture in ARCHITECTURES, "architecture",
          f"must be one of {ARCHITECTURES}")
    if self.architecture == "rnn":
      check(self.rnn_cell in RNN_CELLS, "rnn_cell", f"must be one of {RNN_CELLS}")
      check(self.rnn_attention in RNN_ATTENTIONS, "rnn_attention",
            f"must be one of {RNN_ATTENTIONS}")
      check(self.d_model % 2 == 0, "d_model",
            "must be even for the rnn: each encoder direction has d_model / 2 units")
    else:  # The RNN has no heads.
      check(self.d_model % self.num_heads == 0, "num_heads",
            f"d_model={self.d_model} must be divisible by the number of heads")
    for field in ("dropout", "attention_dropout"):
      check(0.0 <= getattr(self, field) < 1.0, field, "must be in [0, 1)")
    check(self.activation in ACTIVATIONS, "activation", f"must be one of {ACTIVATIONS}")
    check(self.norm_position in NORM_POSITIONS, "norm_position",
          f"must be one of {NORM_POSITIONS}")
    check(self.positional in POSITIONAL, "positional", f"must be one of {POSITIONAL}")
    check(self.attention_score in ATTENTION_SCORES, "attention_score",
          f"must be one of {ATTENTION_SCORES}")
    check(self.attention_impl in ATTENTION_IMPLEMENTATIONS, "attention_impl",
          f"must be one of {ATTENTION_IMPLEMENTATIONS}")
    check(self.dtype in (*DTYPES, "auto"), "dtype", f"must be one of {(*DTYPES, 'auto')}")
    check(not self.share_embeddings or self.input_vocab_size == self.output_vocab_size,
          "share_embeddings", "a shared embedding needs input_vocab_size == "
          f"output_vocab_size (got {self.input_vocab_size} and {self.output_vocab_size})")
    check(self.pad_id != self.bos_id, "bos_id", "must differ from pad_id")
    check(self.eos_id not in (self.pad_id, self.bos_id), "eos_id",
          "must differ from pad_id and bos_id")

  @property
  def head_dim(self) -> int:
    """d_v, each head's value (and output) size: d_model / h."""
    return self.d_model // self.num_heads

  @property
  def key_dim(self) -> int:
    """d_k, each head's query and key size: d_model / h unless d_k is set."""
    return self.d_k or self.head_dim

  @property
  def compute_dtype(self) -> Any:
    return DTYPES[resolve_dtype(self.dtype)]

  @classmethod
  def from_config(cls, model_config, **overrides) -> "ModelConfig":
    """Builds a ModelConfig from `config.model` (a ConfigDict or dict)."""
    values = dict(model_config.to_dict() if hasattr(model_config, "to_dict")
                  else model_config)
    for name, why in NOT_SETTINGS.items():  # The data pipeline and search would not follow.
      if name in values and values[name] != SPECIAL_IDS.get(name):
        raise ValueError(f"config.model.{name}={values[name]!r}: not a setting: {why}")
      # Workdirs trained before the ids left configs/base.py hold them, at these values.
      values.pop(name, None)
    values.update(overrides)
    # Older workdirs' config.json: attention_type, the never-read field this replaced.
    values.setdefault("attention_score", values.pop("attention_type", "scaled_dot"))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"config.model has unknown fields {unknown}; known: {sorted(known)}")
    unread = _other_architectures_fields(values.get("architecture", "transformer"))
    for field in dataclasses.fields(cls):
      kind, ok = _FIELD_TYPES[field.type]
      if field.name not in values or ok(values[field.name]):
        continue
      if field.name in unread:  # Never read: the model is the one without it.
        values[field.name] = field.default
      else:
        raise ValueError(f"config.model.{field.name}={values[field.name]!r}: must be {kind}")
    return cls(**values)


def model_config(config, vocab_size: int = 0, **overrides) -> ModelConfig:
  """The ModelConfig of a full experiment config; the vocabulary size comes from
  the tokenizer when there is one, else from `config.data.vocab_size`."""
  vocab_size = vocab_size or config.data.vocab_size
  return ModelConfig.from_config(config.model, input_vocab_size=vocab_size,
                                 output_vocab_size=vocab_size, **overrides)


SECTIONS = ("model", "data", "optim", "train", "decode")  # Of every config (configs/base.py).


def check_sections(config, where: str) -> None:
  """ValueError naming what `where` lacks of SECTIONS, before any field is read
  from them (which would fail with a KeyError naming the field alone)."""
  missing = [s for s in SECTIONS if not hasattr(config.get(s), "get")]
  if missing:
    raise ValueError(f"{where} lacks the config section(s) {', '.join(missing)}: a config "
                     f"holds {', '.join(SECTIONS)}, as configs/base.py's get_config builds them")


def check_fields(config) -> None:
  """A ValueError naming a field outside config.model that configs/base.py's
  get_config does not have: a misspelt field set in a config file would be kept
  and never read. (config.model's fields are ModelConfig's: model_config.) And
  one naming the fields of base's config that a section lacks: a section
  replaced whole (`--config.model={}`) stopped the checks with a traceback
  naming one field."""
  from configs import base  # pylint: disable=g-import-not-at-top
  known = base.get_config()
  for path, section, names in [("config", known, [k for k in config.keys() if k != "model"])] + [
      (f"config.{s}", known[s], config[s].keys()) for s in config.keys()
      if s != "model" and s in known and hasattr(known[s], "keys")]:
    for name in names:
      if name not in section:
        near = difflib.get_close_matches(name, section.keys(), n=1)
        raise ValueError(f"{path}.{name}: unknown field (configs/base.py's config has no "
                         "such field)" + (f"; did you mean {path}.{near[0]}?" if near else ""))
  for section in SECTIONS:
    missing = [name for name in known[section].keys() if name not in config[section]]
    if missing:
      shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                        else "")
      raise ValueError(f"config.{section} lacks {shown}, which configs/base.py's config has "
                       f"(a section replaced whole, as --config.{section}={{...}} does?)")


def check_config(config, trained: bool = False) -> None:
  """Checks the fields outside `config.model`; raises ValueError naming the field.
  `trained`: a trained workdir's config (saved_config.check_saved), read to
  evaluate, decode or average: the rules for training alone (the languages'
  pairing, packed budgets, positions for max_length, the mesh) are the training
  run's, which may predate them."""
  check_sections(config, "the config")
  if not trained:
    check_fields(config)

  def value(field):
    node = config
    for part in field.split("."):
      node = node.get(part)
    return node

  def check(ok, field, message):
    if not ok:
      raise ValueError(f"config.{field}={value(field)!r}: {message}")

  # Every float is finite: NaN passes no range check by itself only where one is
  # written as a comparison, and an infinite rate or penalty is no setting.
  for field in ("train.label_smoothing", "optim.learning_rate_scale", "optim.adam_b1",
                "optim.adam_b2", "optim.adam_eps", "optim.weight_decay", "optim.grad_clip_norm",
                "decode.alpha", "model.dropout", "model.attention_dropout"):
    if value(field) is not None:
      check(math.isfinite(value(field)), field, "must be a finite number")
  # jax.random.key keeps a seed's low 32 bits: 2**32 would repeat seed 0.
  check(0 <= value("seed") < 2**32, "seed", "must be in [0, 2**32) (jax.random.key "
        "keeps 32 bits)")

  # A command line's values are strings: `--config.data.vocab_path=None` is a path.
  for field in ("data.vocab_path", "data.tfds_data_dir"):
    check(value(field) != "None", field, "is the string 'None', not None (command-line "
          "values are strings): leave the field out to keep it None")
  check(config.data.batching in BATCHING, "data.batching", f"must be one of {BATCHING}")
  # SCAN's pairs are commands and actions, whatever the languages say.
  check(trained or config.data.dataset.startswith("scan/")
        or config.data.target_lang != config.data.source_lang, "data.target_lang",
        "is data.source_lang too: the pairs would be each sentence with itself")
  check(config.data.overlong in OVERLONG, "data.overlong", f"must be one of {OVERLONG}")
  check(config.data.vocab_type in VOCAB_TYPES, "data.vocab_type",
        f"must be one of {VOCAB_TYPES}")
  for field in ("data.vocab_size", "data.max_length", "data.tokens_per_batch",
                "data.pack_length", "optim.warmup_steps", "train.num_steps",
                "train.grad_accum_steps", "train.log_every", "train.eval_every",
                "train.checkpoint_every", "train.keep_checkpoints", "decode.beam_size",
                "distributed.initialization_timeout_s", "distributed.heartbeat_timeout_s",
                "distributed.shutdown_timeout_s"):
    section, name = field.split(".")
    check(config[section][name] > 0, field, "must be a positive integer")
  check(config.data.vocab_size > 4, "data.vocab_size",
        "must be > 4: ids 0-3 are PAD, UNK, BOS and EOS, and the text needs pieces too")
  check(config.data.vocab_size < 2**31, "data.vocab_size",
        "must be < 2**31: SentencePiece's and the batches' ids are 32-bit")
  check(config.data.pack_source_length >= 0, "data.pack_source_length",
        "must be >= 0 (0 = pack_length)")
  check(config.data.max_length >= 2, "data.max_length", "must be >= 2 (one token plus EOS)")
  if config.data.batching == "pack" and not trained:  # Known before the data is read.
    row = max(config.data.pack_length, config.data.pack_source_length)
    least = row * config.train.grad_accum_steps
    check(config.data.tokens_per_batch >= least, "data.tokens_per_batch",
          f"is under one packed row of {row} tokens (data.pack_length, "
          f"data.pack_source_length) for each of the train.grad_accum_steps="
          f"{config.train.grad_accum_steps} micro-batches: must be >= {least}")
  # Batches are as wide as the longest bucket: max_length rounded up to 8.
  check(trained or -(-config.data.max_length // 8) * 8 <= config.model.max_len,
        "data.max_length",
        f"rounded up to a multiple of 8 (the widest batch) must be <= "
        f"model.max_len={config.model.max_len}, the positions the model has")
  check(config.decode.get("tokens_per_batch", 0) >= 0, "decode.tokens_per_batch",
        "must be >= 0 (0 = data.tokens_per_batch)")
  check(config.train.decode_every >= 0, "train.decode_every", "must be >= 0 (0 = off)")
  check(config.train.decode_examples >= 0, "train.decode_examples", "must be >= 0 (0 = all)")
  check(config.train.decode_mode in SCORED_DECODE_MODES, "train.decode_mode",
        f"must be one of {SCORED_DECODE_MODES}")
  check(0.0 <= config.train.label_smoothing < 1.0, "train.label_smoothing",
        "must be in [0, 1)")
  check(config.optim.learning_rate_scale > 0, "optim.learning_rate_scale", "must be > 0")
  check(config.decode.alpha >= 0, "decode.alpha", "must be >= 0")
  check(config.decode.get("max_extra_len", 0) >= 0, "decode.max_extra_len", "must be >= 0")
  check(config.decode.get("compact", 0) >= 0, "decode.compact", "must be >= 0 (0 = off)")
  check(config.decode.get("refill", 0) >= 0, "decode.refill", "must be >= 0 (0 = off)")
  check(not (config.decode.get("refill", 0) and config.decode.get("compact", 0)),
        "decode.refill", f"decode.compact={config.decode.get('compact', 0)!r} is also set, "
        "another way to skip finished sentences; set one of them to 0")
  architecture = config.model.get("architecture", "transformer")
  check(not (config.decode.get("refill", 0) and architecture not in REFILLING_ARCHITECTURES),
        "decode.refill", f"needs a Transformer (model.architecture={architecture!r}: its "
        "decoding cannot restart rows); set it to 0")
  check(config.decode.get("concurrent_batches", 1) >= 1, "decode.concurrent_batches",
        "must be >= 1")
  check(config.data.get("prefetch", 0) >= 0, "data.prefetch", "must be >= 0 (0 = off)")
  for field in ("optim.adam_b1", "optim.adam_b2"):
    check(0.0 <= value(field) < 1.0, field, "must be in [0, 1)")
  check(config.optim.adam_eps > 0, "optim.adam_eps", "must be > 0")
  for field in ("optim.weight_decay", "optim.grad_clip_norm"):
    check(value(field) >= 0, field, "must be >= 0 (0 = off)")
  # Packed rows need segment masks; a recurrence would carry its state across them.
  check(trained or not (config.data.batching == "pack" and architecture == "rnn"),
        "data.batching",
        "config.model.architecture='rnn' does not support packed rows; use 'bucket'")
  mesh = parse_mesh(config.train.get("mesh", DEFAULT_MESH))
  if mesh["model"] != -1 and not trained:  # A -1 axis is sized, and checked, at training.
    check_model_axis(config, mesh["model"])
  model_config(config)  # The model fields check themselves.


def check_model_axis(config, size: int, devices: str = "") -> None:
  """A ValueError naming config.train.mesh unless a model axis of `size` divides
  the Transformer's heads and hidden units, which it splits; the RNN splits
  nothing, so its axis must be 1. `devices` adds to the message where the size
  came from."""
  architecture = config.model.get("architecture", "transformer")
  if architecture != "transformer":
    if size > 1:  # Every device of the axis would do the same work.
      raise ValueError(f"config.train.mesh={config.train.mesh!r}: model.architecture="
                       f"{architecture!r} has no tensor-parallel layers, so the model axis "
                       f"({size}{devices}) must be 1")
    return
  for field in ("num_heads", "d_ff"):
    if config.model[field] % size:
      raise ValueError(f"config.train.mesh={config.train.mesh!r}: the model axis ({size}"
                       f"{devices}) must divide model.{field}={config.model[field]}")


def flatten(tree, prefix=""):
  """{'a.b': value} of nested dicts."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


@contextlib.contextmanager
def quiet_loading():
  """ml_collections loads config files with importlib's deprecated load_module: one
  warning per file loaded, hundreds in a sweep, none of them ours to fix."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "the load_module", DeprecationWarning)
    yield


def config_flag(base: str, overrides=(), flag: str = "config"):
  """(argv, FlagValues) of `train.py --<flag> base --<flag>.<override> ...`: the
  ml_collections config-file flag on a private FlagValues, so nothing global
  changes. Parse them with flag_values(argv) (typed errors) or runtime.parse_flags
  (a command's one-line errors)."""
  argv = ["config", f"--{flag}={base}"] + [f"--{flag}.{o}" for o in overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file(flag, None, "Base config.", flag_values=flag_values,
                                  lock_config=True, sys_argv=argv)
  return argv, flag_values


def load_file(base: str, overrides=()):
  """The ConfigDict of `train.py --config base --config.<override> ...`, parsed by
  the same ml_collections flag."""
  argv, flag_values = config_flag(base, overrides)
  with quiet_loading():
    flag_values(argv)
    config = flag_values.config
  config.to_dict()  # A file that failed to load raises only when the config is used.
  return config


def same_recipe(a: dict, b: dict) -> bool:
  """Whether two recipes ({'base': config file, 'overrides': ['field=value', ...]})
  give the same config: the overrides in another order, a value or the base's
  path spelt otherwise, or a value the base has anyway, are the same recipe.
  One that no longer loads is the same only as itself, written alike."""
  if a.get("base") == b.get("base") and a.get("overrides") == b.get("overrides"):
    return True
  try:
    a, b = [json.loads(load_file(r["base"], r.get("overrides") or []).to_json_best_effort())
            for r in (a, b)]
  except Exception:  # pylint: disable=broad-except
    return False
  return a == b
