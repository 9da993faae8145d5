"""Configs: paper values, parameter counts, and named errors for bad values."""

import re
import subprocess
import sys

import pytest

from configs import base, big, default, multi30k
from transformer.config import ModelConfig, check_config, model_config, overridden_fields
from transformer.state import parameter_shapes
from transformer.summary import format_table, parameter_rows
from tests.helpers import DEFAULT, train_flags


def count(config):
  return sum(c for _, _, c in parameter_rows(parameter_shapes(model_config(config))))


def expected_count(config):
  """The paper's architecture counted by hand: the embedding V*D once (shared, tied,
  no output bias); 4 D^2 per attention (W^Q, W^K, W^V, W^O, no biases: 3.2.2);
  2 D d_ff + d_ff + D per FFN; 2 D per LayerNorm; encoder layers hold one
  attention and two LayerNorms, decoder layers two and three."""
  m, V = config.model, config.data.vocab_size
  D, F, N = m.d_model, m.d_ff, m.num_layers
  attention = 4 * D * D + (4 * D if m.attention_bias else 0)
  ffn = 2 * D * F + F + D
  return V * D + N * (attention + ffn + 2 * 2 * D) + N * (2 * attention + ffn + 3 * 2 * D)


def test_base_and_big_parameter_counts_match_the_paper():
  # Table 3: base 65M, big 213M with the shared ~37k vocabulary.
  n_base, n_big = count(base.get_config()), count(big.get_config())
  assert n_base == expected_count(base.get_config()) == 63_045_632
  assert n_big == expected_count(big.get_config()) == 214_171_648
  # The paper gives its vocabulary as "about 37000 tokens": at 37,000 ids base is
  # 3.0% below its 65M and big 0.6% above its 213M. No one size fits both (base
  # needs ~41k ids, big ~36k); at 41,100 ids Table 3's rows B and C have the
  # paper's counts (tests/test_sweep.py, test_table3_rows_have_the_papers_parameter_counts).
  assert abs(n_base - 65e6) / 65e6 <= 0.031
  assert abs(n_big - 213e6) / 213e6 <= 0.006
  biased = base.get_config()
  biased.model.attention_bias = True  # 4 D more per attention, 18 attentions.
  assert count(biased) == expected_count(biased) == 63_045_632 + 18 * 4 * 512


def test_base_and_big_hold_the_papers_values():
  """The values the paper gives (sections 3, 5, 6 and Table 3), each of which a
  config edit could change without changing a parameter count: the
  regularisers, the optimizer and schedule, the data and the search."""
  paper = {
      "model.num_layers": 6, "model.d_model": 512, "model.d_ff": 2048, "model.num_heads": 8,
      "model.d_k": 0, "model.dropout": 0.1, "model.attention_dropout": 0.0,
      "model.attention_bias": False, "model.activation": "relu", "model.norm_position": "post",
      "model.positional": "sinusoidal", "model.attention_score": "scaled_dot",
      "model.share_embeddings": True, "model.tie_output": True,
      "train.label_smoothing": 0.1, "train.num_steps": 100_000,
      "optim.warmup_steps": 4000, "optim.adam_b1": 0.9, "optim.adam_b2": 0.98,
      "optim.adam_eps": 1e-9, "optim.learning_rate_scale": 1.0, "optim.weight_decay": 0.0,
      "optim.grad_clip_norm": 0.0, "data.vocab_size": 37000, "data.tokens_per_batch": 25000,
      "data.batching": "bucket", "decode.beam_size": 4, "decode.alpha": 0.6,
      "decode.max_extra_len": 50}
  big_paper = {**paper, "model.d_model": 1024, "model.d_ff": 4096, "model.num_heads": 16,
               "model.dropout": 0.3, "train.num_steps": 300_000}
  for config, values in ((base.get_config(), paper), (big.get_config(), big_paper)):
    got = {field: config[field.split(".")[0]][field.split(".")[1]] for field in values}
    assert got == values


@pytest.mark.parametrize("get_config,seconds_per_step,averaged", [
    (base.get_config, 0.4, 5), (big.get_config, 1.0, 20)])
def test_checkpoint_cadence_is_the_papers(get_config, seconds_per_step, averaged):
  """Section 6.1: checkpoints every 10 minutes, the last 5 (base) / 20 (big) averaged;
  section 5.2: 0.4 s (base) / 1.0 s (big) a step."""
  config = get_config()
  assert config.train.checkpoint_every * seconds_per_step == pytest.approx(600, rel=0.01)
  assert config.train.keep_checkpoints == averaged


def test_summary_command_prints_total_last():
  out = subprocess.run([sys.executable, "-m", "transformer.summary", "--config",
                        "configs/base.py"], capture_output=True, text=True, check=True)
  last = out.stdout.strip().splitlines()[-1]
  assert re.fullmatch(r"Total parameters: [\d,]+", last)
  assert int(last.split(":")[1].replace(",", "")) == 63_045_632
  assert "encoder/layer_0/self_attention" in out.stdout
  bad = subprocess.run([sys.executable, "-m", "transformer.summary", "--config",
                        "configs/base.py", "--config.model.num_heads=7"],
                       capture_output=True, text=True)
  assert bad.returncode == 1 and "Traceback" not in bad.stderr
  assert bad.stderr.strip().splitlines()[-1].startswith(
      "summary: error: config.model.num_heads=7: d_model=512 must be divisible")
  # Checked as train.py checks it: the field given, not the one derived from it
  # (model.input_vocab_size), and a value training refuses is not counted.
  bad = subprocess.run([sys.executable, "-m", "transformer.summary", "--config",
                        "configs/base.py", "--config.data.vocab_size=3"],
                       capture_output=True, text=True)
  assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith(
      "summary: error: config.data.vocab_size=3: must be > 4"), bad.stderr[-2000:]
  # A size too large for memory (the positions' table here) was a MemoryError's traceback.
  bad = subprocess.run([sys.executable, "-m", "transformer.summary", "--config",
                        "configs/default.py", "--config.model.max_len=1000000000000"],
                       capture_output=True, text=True)
  assert bad.returncode == 1 and re.fullmatch(
      r"summary: error: out of memory: Unable to allocate [\d.]+ TiB for an array with shape "
      r"\(1000000000000,\) and data type float64\n", bad.stderr), bad.stderr[-2000:]


def test_importing_the_library_defines_no_command_line_flags():
  """Commands define their flags when run: a module that defines one at import
  (summary's --config, through results) breaks every command importing it with
  a flag of that name (train.py, with a config that imports test helpers)."""
  ours = subprocess.run([sys.executable, "-c", "from absl import flags; import transformer.results, "
                         "transformer.sweep, transformer.evaluate, transformer.translate, "
                         "transformer.summary, transformer.training; print(sorted(n for n in "
                         "flags.FLAGS if flags.FLAGS.find_module_defining_flag(n).startswith("
                         "'transformer')))"], capture_output=True, text=True, check=True)
  assert ours.stdout.strip() == "[]"


def test_summary_warns_of_an_override_the_model_does_not_read():
  """summary counted --config.model.num_heads=16 on the RNN as the RNN without
  it, silently, where train.py warns: a researcher sizing an ablation read the
  base's count. Every spelling of an override counts (--noconfig.FIELD too)."""
  out = subprocess.run([sys.executable, "-m", "transformer.summary", "--config",
                        "configs/rnn_scan.py", "--config.model.num_heads=16",
                        "--noconfig.model.attention_bias"], capture_output=True, text=True)
  assert out.returncode == 0 and "Total parameters:" in out.stdout, out.stderr[-3000:]
  warned = [l for l in out.stderr.splitlines() if l.startswith("summary: warning:")]
  assert warned == [
      "summary: warning: --config.model.num_heads has no effect with model.architecture='rnn' "
      "(only the transformer reads it): the count is the model's without it",
      "summary: warning: --config.model.attention_bias has no effect with "
      "model.architecture='rnn' (only the transformer reads it): the count is the model's "
      "without it"], out.stderr[-3000:]
  assert overridden_fields(["--config", "c.py", "--config.a.b=1", "-config.c=2",
                            "--noconfig.d.e", "--configx.f=3", "--workdir=--config.g"]) == [
                                "a.b", "c", "d.e"]


def test_summary_of_a_workdir_counts_its_trained_vocabulary(tmp_path):
  """configs/default.py asks for 32 word pieces; SCAN's text has 19 words, so
  the trained vocabulary holds 23 ids and the model 925,568 parameters (the
  README's figure), not the 926,720 that data.vocab_size gives."""
  from transformer import training  # pylint: disable=g-import-not-at-top
  from transformer.data import tokenizer  # pylint: disable=g-import-not-at-top
  training.save_config(default.get_config(), str(tmp_path))
  words = " ".join(f"w{i}" for i in range(19))
  tokenizer.train([words], "word", 32).save(str(tmp_path / "spm.model"))
  out = subprocess.run([sys.executable, "-m", "transformer.summary", "--workdir",
                        str(tmp_path)], capture_output=True, text=True, check=True)
  lines = out.stdout.strip().splitlines()
  assert lines[0] == f"Embeddings at the trained vocabulary of {tmp_path}: 23 ids"
  assert lines[-1] == "Total parameters: 925,568"


def test_a_config_with_a_vocabulary_file_counts_at_its_size_and_warns_of_vocab_size(tmp_path):
  """data.vocab_path's vocabulary is the model's: summary and sweep --list counted
  at data.vocab_size=1000 (1,050,624 parameters), and train.py read the
  override of it silently. A string 'None' is no file (a command line's None)."""
  from transformer import results  # pylint: disable=g-import-not-at-top
  from transformer.data import tokenizer  # pylint: disable=g-import-not-at-top
  vocab = str(tmp_path / "v.model")
  tokenizer.train([" ".join(f"w{i}" for i in range(19))], "word", 32).save(vocab)
  out = subprocess.run([sys.executable, "-m", "transformer.summary", "--config",
                        DEFAULT, f"--config.data.vocab_path={vocab}",
                        "--config.data.vocab_size=1000"], capture_output=True, text=True)
  lines = out.stdout.strip().splitlines()
  assert lines[0] == f"Embeddings at the vocabulary of data.vocab_path={vocab}: 23 ids"
  assert lines[-1] == "Total parameters: 925,568", out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == (
      "summary: warning: --config.data.vocab_size has no effect with data.vocab_path set "
      "(the vocabulary is that file; its size is the embeddings'): the count is the model's "
      "without it")
  config = default.get_config()
  config.data.vocab_path = vocab
  assert results.count_parameters(config) == 925_568
  config.data.vocab_path = "None"
  with pytest.raises(ValueError, match=r"^config.data.vocab_path='None': is the string 'None'"):
    check_config(config)


def test_summary_of_an_empty_workdir_flag_is_one_line():
  """`--workdir ""` passed the check for one of --config and --workdir, then
  reached the config's checks as None: a traceback (with --config as well, the
  config's count, silently)."""
  for extra in ([], ["--config", "configs/default.py"]):
    out = subprocess.run([sys.executable, "-m", "transformer.summary", "--workdir", "", *extra],
                         capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (
        1, "", "summary: error: --workdir is empty; give a training workdir\n"), out.stderr


def test_summary_rows_are_modules_not_their_parameters():
  """A row is a module (up to 3 path parts) with the shapes of its parameters: the
  shared embedding is one row named by its module, a layer norm's scale and bias
  one row, never a row per parameter named by the parameter."""
  config = default.get_config()
  rows = {module: (shapes, count)
          for module, shapes, count in parameter_rows(parameter_shapes(model_config(config)))}
  d = config.model.d_model
  (vocab, width), = rows["shared_embedding"][0]
  assert width == d and rows["shared_embedding"][1] == vocab * d
  assert not [m for m in rows if m.split("/")[-1] in ("embedding", "kernel", "bias", "scale")]
  norms = [shapes for m, (shapes, _) in rows.items() if m.endswith("norm")]
  assert norms and all(shapes == [(d,), (d,)] for shapes in norms), rows.keys()


def test_summary_table_rows_add_up():
  rows = parameter_rows(parameter_shapes(model_config(default.get_config())))
  table = format_table(rows)
  assert table.splitlines()[-1] == f"Total parameters: {sum(c for _, _, c in rows):,}"


@pytest.mark.parametrize("field,value,message", [
    ("num_heads", 7, "config.model.num_heads=7"),
    ("dropout", -0.1, "config.model.dropout=-0.1"),
    ("activation", "swish2", "config.model.activation='swish2'"),
    ("norm_position", "middle", "config.model.norm_position"),
    ("dtype", "float16", "config.model.dtype"),
    ("attention_score", "cosine", "config.model.attention_score='cosine'"),
    ("eos_id", 0, "config.model.eos_id=0: not a setting"),  # The vocabulary's (below).
])
def test_bad_model_values_name_the_field(field, value, message):
  config = base.get_config()
  config.model[field] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    model_config(config)


@pytest.mark.parametrize("field,value", [
    ("data.batching", "random"), ("data.tokens_per_batch", 0),
    ("train.label_smoothing", 1.5), ("data.max_length", 1000),
    ("decode.tokens_per_batch", -1), ("distributed.heartbeat_timeout_s", 0),
    ("distributed.initialization_timeout_s", -5), ("decode.concurrent_batches", 0),
    ("data.vocab_size", 4),  # The special ids alone.
    ("data.vocab_size", 2**31),  # Was SentencePiece's "cannot parse ... as int", no field.
    ("decode.refill", -1),
    ("data.max_length", 1),  # One token plus EOS at least (it was named without its field).
])
def test_bad_other_values_name_the_field(field, value):
  config = default.get_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ValueError, match=re.escape(f"config.{field}=")):
    check_config(config)


def test_refill_is_refused_with_compact_and_for_the_rnn():
  """Refilling beam search replaces compaction rather than adds to it, and needs a
  model whose decoding rows can restart (the Transformer's)."""
  config = default.get_config()
  config.decode.refill = 8
  check_config(config)
  config.decode.compact = 2
  with pytest.raises(ValueError, match=re.escape("config.decode.refill=8: decode.compact=2 is "
                                                 "also set")):
    check_config(config)
  config.decode.compact = 0
  config.model.architecture = "rnn"
  with pytest.raises(ValueError, match=re.escape("config.decode.refill=8: needs a Transformer")):
    check_config(config)


def test_the_widest_batch_has_positions():
  """Batches are max_length rounded up to 8 wide: beyond model.max_len the
  positions would not exist."""
  config = default.get_config()
  config.model.max_len = config.data.max_length = 60
  with pytest.raises(ValueError, match=r"config.data.max_length=60: rounded up to a multiple of "
                     r"8 \(the widest batch\) must be <= model.max_len=60"):
    check_config(config)
  config.model.max_len = 64
  check_config(config)


def test_seed_fits_jax_random_key():
  config = default.get_config()
  config.seed = 2**32 - 1
  check_config(config)
  config.seed = 2**32  # jax.random.key would give seed 0's key.
  with pytest.raises(ValueError, match=re.escape("config.seed=4294967296: must be in")):
    check_config(config)


@pytest.mark.parametrize("field, near", [("data.max_lenght", "data.max_length"),
                                         ("train.num_step", "train.num_steps"),
                                         ("decode.beam", "decode.beam_size"),
                                         ("sed", "seed"), ("optim.zzz", None)])
def test_a_field_set_in_a_config_file_that_no_code_reads_is_an_error(field, near):
  """A config file that sets a misspelt field (ConfigDicts take new keys) would
  train with the default it meant to change: the field is named, with the field
  it is closest to."""
  config = default.get_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = 16
  hint = f"; did you mean config.{near}?" if near else ""
  with pytest.raises(ValueError, match=re.escape(f"config.{field}: unknown field") + ".*"
                     + re.escape(hint) + "$"):
    check_config(config)


def test_a_language_pair_of_one_language_is_refused_except_for_scan():
  """Each sentence paired with itself trains a copying model without a word."""
  config = multi30k.get_config()
  config.data.target_lang = config.data.source_lang
  with pytest.raises(ValueError, match=re.escape("config.data.target_lang='en': is "
                                                 "data.source_lang too")):
    check_config(config)
  config = default.get_config()  # SCAN, whose languages are not read.
  config.data.target_lang = config.data.source_lang
  check_config(config)


def test_a_packed_batch_under_one_row_per_micro_batch_is_refused_before_the_data():
  config = default.get_config()  # Packed rows of 64 tokens.
  config.train.grad_accum_steps = 2
  config.data.tokens_per_batch = 128
  check_config(config)
  config.data.pack_source_length = 80  # The longer row is the source's.
  with pytest.raises(ValueError, match=re.escape(
      "config.data.tokens_per_batch=128: is under one packed row of 80 tokens") + ".*"
      "must be >= 160"):
    check_config(config)


def test_unknown_model_field_is_an_error():
  with pytest.raises(ValueError, match="unknown fields"):
    ModelConfig.from_config({"d_model": 8, "num_hedas": 2})


def test_the_vocabulary_s_ids_and_size_are_no_model_settings():
  """config.model.pad_id=4 in a config file passed the checks while the data
  padded with 0 and the searches banned 0: an RNN then counted padding as words
  (its logits moved 0.2 with six PAD columns). A vocabulary size there was
  overwritten without a word."""
  for name, value in (("pad_id", 4), ("bos_id", 1), ("eos_id", 2), ("input_vocab_size", 40),
                      ("output_vocab_size", 40)):
    config = default.get_config()
    config.model[name] = value
    with pytest.raises(ValueError, match=rf"config.model.{name}={value}: not a setting"):
      check_config(config)
  assert ModelConfig.from_config({}, input_vocab_size=40, output_vocab_size=40).input_vocab_size == 40  # The code sets them.


def test_old_attention_type_key_still_loads():
  # config.json of workdirs written before attention_score replaced attention_type,
  # and the special ids left configs/base.py (they held the vocabulary's values).
  old = ModelConfig.from_config({"attention_type": "scaled_dot", "pad_id": 0, "bos_id": 2,
                                 "eos_id": 3})
  assert old == ModelConfig() and old.attention_score == "scaled_dot"


def test_all_configs_check():
  for module in (base, big, default):
    check_config(module.get_config())


CONFIG_FILE_MISTAKES = [
    # (the body of get_config, what the one line says)
    ("c = default.get_config()\n  c.model.dmodel\n  return c",
     'bad.py:5: AttributeError: \'dmodel\' Did you mean "d_model" instead of "dmodel"?'),
    ("return {}['missing']", "bad.py:4: KeyError: missing"),
    ("return undefined_name", "bad.py:4: NameError: name 'undefined_name' is not defined"),
    ("return 3", "bad.py: get_config() returned an object of type 'int', not an "
     "ml_collections.ConfigDict"),
    ("c = default.get_config()\n  del c['decode']\n  return c",
     "bad.py lacks the config section(s) decode: a config holds model, data, optim, train, "
     "decode"),
]


@pytest.mark.parametrize("body, said", CONFIG_FILE_MISTAKES)
def test_a_mistake_in_a_config_file_is_named_where_it_is(body, said, tmp_path):
  """A mistake inside a config file was reported as a command-line field ("\\'dmodel\\'
  \\nDid you mean ...: no such field in the config"), or as a traceback from the
  first field read; now the file and line, or what the file built, are named."""
  path = tmp_path / "bad.py"
  path.write_text(f"from configs import default\n\ndef get_config():\n  {body}\n")
  config, error = train_flags(str(path))
  assert config is None and error.startswith("train: error: ") and "\n" not in error, error
  assert said in error, error


@pytest.mark.parametrize("text, said", [
    ("def get_config(:\n", "bad.py:1: SyntaxError: invalid syntax"),
    ("def get_config():\n  return 1\n    x = 2\n",
     "bad.py:3: IndentationError: unexpected indent"),
    ("x = 1\x00\n", "--config {path}: SyntaxError: source code string cannot contain null bytes"),
    ("x = 1\n", "--config {path}: the file defines no get_config()"),
])
def test_a_config_file_that_does_not_compile_or_builds_nothing_is_one_line(text, said, tmp_path,
                                                                          monkeypatch):
  """A config file that does not compile was a traceback through absl, and one
  without get_config "module 'config_config' has no attribute 'get_config: no
  such field in the config" (blaming a field): now the file (and line) and the
  reason."""
  # ml_collections loads each file into sys.modules' one 'config_config', keeping
  # what an earlier test's file defined there (a command loads one file).
  monkeypatch.delitem(sys.modules, "config_config", raising=False)
  path = tmp_path / "bad.py"
  path.write_text(text)
  config, error = train_flags(str(path))
  assert config is None and error.startswith("train: error: ") and "\n" not in error, error
  assert error.endswith(said.format(path=path)), error


def test_a_section_replaced_whole_names_the_fields_it_lacks():
  """`--config.model={}` (or a sweep's --set model={...}) passed ml_collections,
  and the checks stopped on the first field read, a KeyError's traceback."""
  config = train_flags(DEFAULT, '--config.data={"dataset": "scan/simple"}')[0]
  with pytest.raises(ValueError, match=r"^config\.data lacks batching, eval_split, max_length, "
                     r"overlong and \d+ more, which configs/base\.py's config has \(a section "
                     r"replaced whole, as --config\.data=\{\.\.\.\} does\?\)$"):
    check_config(config)


def test_a_field_the_config_lacks_is_named_with_ml_collections_suggestion():
  assert train_flags(DEFAULT, "--config.model.dmodel=3")[1] == (
      'train: error: --config.model.dmodel: no such field in the config (Did you mean '
      '"d_model" instead of "dmodel"?)')
  assert train_flags(DEFAULT, "--config.bogus=1")[1] == (
      "train: error: --config.bogus: no such field in the config")
