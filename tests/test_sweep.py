"""Tests for transformer/sweep.py: resolving variants (products, lists, invalid
ones named), emitted commands that parse back into the same configs
(tests/test_sweep_run.py: running them; tests/test_results.py: the collected
table)."""

import os
import shlex
import subprocess
import sys

import pytest

from tests import helpers, process_helpers
from tests.helpers import DEFAULT, MULTI30K, ROOT
from transformer import config as config_lib, results, sweep as sweep_lib


SWEEP_FILE = '''
from transformer.sweep import each, product

BASE = {base!r}


def get_sweep(base):
  return [
      *each("h{{}}", "model.num_heads", [1, 3, base.model.num_heads * 2]),
      *product("drop{{}}-ls{{}}", {{"model.dropout": [0.0, 0.3],
                                  "train.label_smoothing": [0.0, 0.2]}}),
      ("pre", {{"model.norm_position": "pre", "model.attention_bias": True}}),
      ("typo", {{"model.dropuot": 0.1}}),
      ("bad-type", {{"model.num_layers": 2.5}}),
      ("bad-value", {{"model.activation": "tanh"}}),
  ]
'''


def write_sweep(tmp_path, text=SWEEP_FILE, **kw):
  return helpers.write_sweep(tmp_path, text, **kw)


def flat(config):
  out = {}
  for key, value in config.items():
    if hasattr(value, "items"):
      out.update({f"{key}.{k}": v for k, v in flat(value).items()})
    else:
      out[key] = value
  return out


def changed(config, base):
  a, b = flat(config), flat(base)
  return {k: a[k] for k in a if a[k] != b[k]}


# ----------------------------------------------------------------------------
# Resolution.

def test_products_lists_and_invalid_variants_named(tmp_path):
  sweep = sweep_lib.resolve(write_sweep(tmp_path))
  names = [v.name for v in sweep.variants]
  assert names == ["base", "h1", "h3", "h8", "drop0.0-ls0.0", "drop0.0-ls0.2",
                   "drop0.3-ls0.0", "drop0.3-ls0.2", "pre", "typo", "bad-type", "bad-value"]
  errors = {v.name: v.error for v in sweep.variants if v.error}
  assert set(errors) == {"h3", "typo", "bad-type", "bad-value"}
  assert errors["h3"].startswith("config.model.num_heads=3: d_model=128 must be divisible")
  assert errors["typo"] == "config.model.dropuot: unknown field (not in " + DEFAULT + ")"
  assert "--config.model.num_layers=2.5" in errors["bad-type"]
  assert errors["bad-value"].startswith("config.model.activation='tanh': must be one of")
  # The valid ones resolve to the base with exactly their fields changed, typed
  # as the base's fields (0 -> 0.0 for a float, "True" -> True for a bool).
  base = sweep.variants[0].config
  resolved = {v.name: changed(v.config, base) for v in sweep.valid}
  assert resolved == {
      "base": {}, "h1": {"model.num_heads": 1}, "h8": {"model.num_heads": 8},
      "drop0.0-ls0.0": {"model.dropout": 0.0, "train.label_smoothing": 0.0},
      "drop0.0-ls0.2": {"model.dropout": 0.0, "train.label_smoothing": 0.2},
      "drop0.3-ls0.0": {"model.dropout": 0.3, "train.label_smoothing": 0.0},
      "drop0.3-ls0.2": {"model.dropout": 0.3, "train.label_smoothing": 0.2},
      "pre": {"model.norm_position": "pre", "model.attention_bias": True}}
  assert type(sweep.valid[1].config.model.num_heads) is int
  assert sweep.variants[8].overrides == ["model.norm_position=pre", "model.attention_bias=True"]


def test_variants_that_resolve_to_an_earlier_config_are_named(tmp_path):
  """A value that is the base's own, or d_k = d_model / h, trains the base again:
  --list says so (it was silent)."""
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return ["
                     "('drop', {{'model.dropout': base.model.dropout}}), "
                     "('dk', {{'model.d_k': base.model.d_model // base.model.num_heads}}), "
                     "('h1', {{'model.num_heads': 1}}), ('h1-again', {{'model.num_heads': 1}})]\n")
  sweep = sweep_lib.resolve(path)
  assert sweep_lib.twins(sweep) == {"drop": "base", "dk": "base", "h1-again": "h1"}
  rows = sweep_lib.describe(sweep).splitlines()[2:]
  assert [r.split()[0] for r in rows] == ["base", "drop", "dk", "h1", "h1-again"]
  assert [r.endswith("(the same config as base)") for r in rows] == [
      False, True, True, False, False]
  assert rows[3].endswith("model.num_heads=1") and rows[4].endswith("(the same config as h1)")


def test_set_changes_the_base_and_a_variants_own_value_wins(tmp_path):
  sweep = sweep_lib.resolve(write_sweep(tmp_path), sets=["train.num_steps=7",
                                                         "train.label_smoothing=0.05",
                                                         "model.num_heads=2"])
  assert {v.config.train.num_steps for v in sweep.valid} == {7}
  configs = {v.name: v.config for v in sweep.valid}
  assert configs["base"].train.label_smoothing == configs["h1"].train.label_smoothing == 0.05
  assert configs["drop0.3-ls0.2"].train.label_smoothing == 0.2
  # get_sweep sees the base with --set applied: "h{2h}" is h4 now.
  assert [v.name for v in sweep.valid][1:4] == ["h1", "h4", "drop0.0-ls0.0"]
  assert sweep.overrides(sweep.variants[1]) == ["train.num_steps=7",
                                                "train.label_smoothing=0.05",
                                                "model.num_heads=1"]
  with pytest.raises(ValueError, match=r"--set config.train.num_stpes: unknown field"):
    sweep_lib.resolve(write_sweep(tmp_path), sets=["train.num_stpes=7"])


def test_a_set_spelt_with_the_config_prefix_is_the_fields(tmp_path):
  """`--set config.train.num_steps=3` (as train.py's --config.train.num_steps)
  was 'config.config.train.num_steps: unknown field'."""
  sweep = sweep_lib.resolve(write_sweep(tmp_path), sets=["config.train.num_steps=3"])
  assert sweep.sets == ["train.num_steps=3"]
  assert {v.config.train.num_steps for v in sweep.valid} == {3}
  with pytest.raises(ValueError, match=r"^--set config.train.nope: unknown field"):
    sweep_lib.resolve(write_sweep(tmp_path), sets=["config.train.nope=3"])


def test_base_argument_and_bad_names(tmp_path):
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=MULTI30K + ":de-en")
  assert sweep_lib.resolve(path).variants[0].config.data.source_lang == "de"
  assert sweep_lib.resolve(path, base=DEFAULT).variants[0].config.data.dataset == "scan/simple"
  for bad in ("('base', {{}})", "('a/b', {{}})", "('x', {{}}), ('x', {{}})"):
    path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return [" + bad
                       + "]\n", name="bad.py")
    with pytest.raises(ValueError, match="variant name"):
      sweep_lib.resolve(path)


@pytest.mark.parametrize("text, error", [
    ("def get_sweep(base):\n  return []\n", "no BASE = 'config file' (or give --base)"),
    ("BASE = {base!r}\n", "no get_sweep(base) function returning the variants"),
    ("BASE = 'nowhere.py'\ndef get_sweep(base):\n  return []\n",
     "BASE 'nowhere.py': no such file"),
    ("BASE = {base!r}\ndef get_sweep(base)\n  return []\n",
     "does not load: SyntaxError: expected ':'"),
    ("BASE = {base!r}\ndef get_sweep(base):\n  return {{'a': {{}}}}\n",
     "get_sweep returned {{'a': {{}}}}, not a list of (name, {{field: value}}) pairs"),
    ("BASE = {base!r}\ndef get_sweep(base):\n  return None\n",
     "get_sweep returned None, not a list of (name, {{field: value}}) pairs"),
    ("BASE = {base!r}\ndef get_sweep(base):\n  return ['a']\n",
     "get_sweep's 'a' is not a (name, {{field: value}}) pair"),
    ("BASE = {base!r}\ndef get_sweep(base):\n  return [(1, {{'model.dropout': 0.0}})]\n",
     "variant name 1 is not a string"),
    ("BASE = {base!r}\ndef get_sweep(base):\n  return [('c', [('model.dropout', 0.1)])]\n",
     "variant 'c': overrides [('model.dropout', 0.1)] are not a dict of {{'field': value}}"),
    ("BASE = {base!r}\ndef get_sweep(base):\n  return [('c', {{'x': base.model.nope}})]\n",
     "get_sweep raised AttributeError: "),
])
def test_a_malformed_sweep_file_is_named_with_what_is_wrong(tmp_path, text, error):
  """Each was a traceback (AttributeError) or a message naming neither the file
  nor the variant ('not enough values to unpack', "'NoneType' object is not
  iterable", 'expected string or bytes-like object')."""
  path = write_sweep(tmp_path, text)
  with pytest.raises(ValueError) as raised:
    sweep_lib.resolve(path)
  assert str(raised.value).startswith(f"{path}: {error.format()}"), str(raised.value)


def test_a_base_that_does_not_load_is_one_line_as_train_py_reports_it(tmp_path):
  """A bad config argument in the base printed 'flag --config=...: Error whilst
  parsing config file:' and ml_collections' ten-line traceback; it is train.py's
  one line (runtime.parse_flags), naming --base or the sweep file's BASE."""
  base = os.path.join(ROOT, "configs", "multi30k_rnn.py") + ":luong"
  _, error = helpers.train_flags(base)
  error = error.removeprefix("train: error: ")
  assert error.startswith(f"flag --config={base}: Error whilst parsing config file: ValueError: "
                          "multi30k_rnn attention must be one of ("), error
  with pytest.raises(ValueError) as raised:
    sweep_lib.resolve(write_sweep(tmp_path), base=base)
  assert str(raised.value) == error.replace("--config=", "--base=", 1)
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n  return []\n",
                     base=base, name="bad_base.py")
  with pytest.raises(ValueError) as raised:
    sweep_lib.resolve(path)
  assert str(raised.value) == f"{path}: BASE: {error}"
  out = subprocess.run([sys.executable, "-m", "transformer.sweep", "--sweep", path, "--list"],
                       cwd=ROOT, capture_output=True, text=True, env=process_helpers.command_env())
  assert out.returncode == 1 and out.stdout == ""
  assert out.stderr.strip().splitlines()[-1] == f"sweep: error: {path}: BASE: {error}"
  assert "Traceback" not in out.stderr, out.stderr


def test_table3_scales_with_its_base():
  path = os.path.join(ROOT, "configs", "sweeps", "table3.py")
  sweep = sweep_lib.resolve(path)
  overrides = {v.name: v.overrides for v in sweep.variants}
  assert overrides == {
      "base": [], "A-h1": ["model.num_heads=1"], "A-h2": ["model.num_heads=2"],
      "A-h8": ["model.num_heads=8"], "A-h16": ["model.num_heads=16"],
      "B-dk16": ["model.d_k=16"], "B-dk32": ["model.d_k=32"],
      "C-N1": ["model.num_layers=1"], "C-N2": ["model.num_layers=2"],
      "C-N4": ["model.num_layers=4"], "C-dmodel128": ["model.d_model=128"],
      "C-dmodel512": ["model.d_model=512"], "C-dff512": ["model.d_ff=512"],
      "C-dff2048": ["model.d_ff=2048"], "D-drop0": ["model.dropout=0.0"],
      "D-drop0.4": ["model.dropout=0.4"], "D-ls0": ["train.label_smoothing=0.0"],
      "D-ls0.2": ["train.label_smoothing=0.2"], "E-learned": ["model.positional=learned"],
      "big": ["model.d_model=512", "model.d_ff=2048", "model.num_heads=8", "model.dropout=0.6",
              "train.num_steps=3900"],
      "score-dot": ["model.attention_score=dot"],
      "score-additive": ["model.attention_score=additive"],
      "score-general": ["model.attention_score=general"]}
  # On the paper's base the rows are the paper's: h = 1, 4, 16, 32, N = 2, 4, 8, ...
  on_base = sweep_lib.resolve(path, base=os.path.join(ROOT, "configs", "base.py"))
  paper = {v.name for v in on_base.variants}
  big = next(v for v in on_base.variants if v.name == "big")  # configs/big.py's model and steps.
  big_py = changed(config_lib.load_file(os.path.join(ROOT, "configs", "big.py")),
                   on_base.variants[0].config)
  assert changed(big.config, on_base.variants[0].config) == {
      k: v for k, v in big_py.items() if k not in ("train.checkpoint_every", "train.keep_checkpoints")}
  assert {"A-h1", "A-h4", "A-h16", "A-h32", "B-dk16", "B-dk32", "C-N2", "C-N4", "C-N8", "C-dmodel256",
          "C-dmodel1024", "C-dff1024", "C-dff4096", "D-drop0", "D-drop0.2", "D-ls0",
          "D-ls0.2", "E-learned"} < paper
  # An h that does not divide d_model is reported, the others kept.
  small = sweep_lib.resolve(path, sets=["model.d_model=20"])
  errors = {v.name: v.error for v in small.variants if v.error}
  assert errors["A-h8"].startswith("config.model.num_heads=8: d_model=20 must be divisible")
  assert set(errors) == {"A-h8", "A-h16", "C-dmodel10"}
  # On the RNN, the rows of fields it does not read are invalid, not its base again.
  rnn = sweep_lib.resolve(path, base=os.path.join(ROOT, "configs", "rnn_scan.py"))
  assert [v.name for v in rnn.valid] == ["base", "C-dmodel64", "C-dmodel256", "D-drop0",
                                         "D-drop0.2", "D-ls0", "D-ls0.2"]
  assert {v.name: v.error for v in rnn.variants}["E-learned"] == (
      "config.model.positional: has no effect with model.architecture='rnn' "
      "(only the transformer reads it)")
  # The CPU subset names rows of its own base; on another base they are named, not dropped.
  cpu = os.path.join(ROOT, "configs", "sweeps", "table3_cpu.py")
  assert len(sweep_lib.resolve(cpu).variants) == 12
  with pytest.raises(ValueError, match=r"rows C-N2, C-dff2048 are not variants of table3 on "
                     r"this base \(its rows of those groups here: C-N1, C-N3, .*, C-dff1024\)"):
    sweep_lib.resolve(cpu, base=DEFAULT)


# Table 3's parameter counts, in millions (Vaswani et al., 2017), of base and of
# its rows B and C.
TABLE3_MILLIONS = {"base": 65, "B-dk16": 58, "B-dk32": 60, "C-N2": 36, "C-N4": 50, "C-N8": 80,
                   "C-dmodel256": 28, "C-dmodel1024": 168, "C-dff1024": 53, "C-dff4096": 90}


def test_table3_rows_have_the_papers_parameter_counts():
  """The paper gives its vocabulary as "about 37000 tokens". At 41,100 ids
  (any size from about 41,010 to 41,200 does), base and every row of B and C
  round to the paper's counts: the rows change the layers as the paper did. (At
  37,000 the d_model rows are 1-2M off, their embeddings scaling with the
  vocabulary; big needs about 36k ids.)"""
  sweep = sweep_lib.resolve(os.path.join(ROOT, "configs", "sweeps", "table3.py"),
                            base=os.path.join(ROOT, "configs", "base.py"),
                            sets=["data.vocab_size=41100"])
  counts = {v.name: results.count_parameters(v.config) for v in sweep.variants
            if v.name in TABLE3_MILLIONS}
  assert set(counts) == set(TABLE3_MILLIONS)
  for name, millions in TABLE3_MILLIONS.items():
    assert abs(counts[name] / 1e6 - millions) <= 0.5, (name, counts[name])


# ----------------------------------------------------------------------------
# Emitting.

def test_emitted_commands_parse_back_into_the_variants(tmp_path):
  sweep = sweep_lib.resolve(write_sweep(tmp_path), sets=["train.num_steps=7",
                                                         "data.eval_split=test[:20]"])
  lines = sweep_lib.commands(sweep, "runs/demo sweep")
  assert len(lines) == len(sweep.valid) == 8
  for line, variant in zip(lines, sweep.valid):
    argv = shlex.split(line)
    assert argv[:4] == ["python", "train.py", "--config", DEFAULT]
    assert argv[-2:] == ["--workdir", os.path.join("runs/demo sweep", variant.name)]
    overrides = [a[len("--config."):] for a in argv[4:-2]]
    assert all(a.startswith("--config.") for a in argv[4:-2])
    assert config_lib.load_file(argv[3], overrides).to_dict() == variant.config.to_dict()

  script = sweep_lib.slurm_script(sweep, "runs/demo sweep", "demo")
  assert "#SBATCH --array=0-7\n" in script
  runnable = script.replace('eval "${commands[$SLURM_ARRAY_TASK_ID]}"', "")
  for i in (0, 7):  # The task's echo line is its command.
    out = subprocess.run(["bash", "-c", runnable], env={"SLURM_ARRAY_TASK_ID": str(i)},
                         capture_output=True, text=True, check=True).stdout
    assert out == sweep_lib.commands(sweep, "runs/demo sweep",
                                     os.path.join(ROOT, "train.py"))[i] + "\n"
  assert lines == [line.replace(f"python {os.path.join(ROOT, 'train.py')} ", "python train.py ")
                   for line in sweep_lib.commands(sweep, "runs/demo sweep",
                                                  os.path.join(ROOT, "train.py"))]


def test_command_only_names_a_missing_variant_in_one_line(tmp_path):
  out = subprocess.run([sys.executable, "-m", "transformer.sweep", "--sweep",
                        write_sweep(tmp_path), "--emit", "commands", "--only", "pre,h5"],
                       cwd=ROOT, capture_output=True, text=True, env=process_helpers.command_env())
  assert out.returncode == 1 and out.stdout == ""
  assert out.stderr.strip().splitlines()[-1].startswith(
      "sweep: error: --only: no variant 'h5' in "), out.stderr[-2000:]


def test_conflicting_modes_and_a_workdir_that_is_a_file_are_one_line(tmp_path):
  """--emit or --list beside --collect won silently (no table written, status
  0), --checkpoint without --collect was ignored, and a --workdir that is a
  file ended in a NotADirectoryError's traceback."""
  sweep = write_sweep(tmp_path)
  (tmp_path / "afile").write_text("")
  for args, error in (
      (["--emit", "commands", "--collect"], "--emit and --collect: give one of them"),
      (["--list", "--collect"], "--list and --collect: give one of them"),
      (["--list", "--checkpoint", "best"],
       "--checkpoint says whose results --collect reads: give it with --collect"),
      (["--workdir", str(tmp_path / "afile"), "--only", "pre"],
       f"--workdir {tmp_path / 'afile'} is a file, not a directory"),
      (["--workdir", str(tmp_path / "afile" / "sub"), "--emit", "slurm"],
       f"--workdir {tmp_path / 'afile' / 'sub'}: [Errno 20] Not a directory: "
       f"'{tmp_path / 'afile' / 'sub'}'"),
      # Empty, each was its default, silently (--base and --only the same way).
      (["--workdir", "", "--emit", "commands"],
       "--workdir is empty; leave the flag out for runs/<sweep>_<base>"),
      (["--only", "", "--emit", "commands"], "--only is empty; leave the flag out for every "
       "variant")):
    out = subprocess.run([sys.executable, "-m", "transformer.sweep", "--sweep", sweep, *args],
                         cwd=ROOT, capture_output=True, text=True,
                         env=process_helpers.command_env())
    assert out.returncode == 1 and out.stdout == "", (args, out)
    assert out.stderr.strip().splitlines()[-1] == f"sweep: error: {error}", (args, out.stderr)
  assert os.path.getsize(tmp_path / "afile") == 0


def test_a_slurm_script_refuses_a_workdir_with_a_line_break(tmp_path):
  """The #SBATCH lines took the workdir unquoted: its text after a line break
  became a command of the script (and SLURM stopped reading #SBATCH lines)."""
  sweep = sweep_lib.resolve(write_sweep(tmp_path))
  with pytest.raises(ValueError, match=r"^--workdir 'runs\\necho INJECTED' holds a line "
                     "break, which a SLURM script cannot hold$"):
    sweep_lib.slurm_script(sweep, "runs\necho INJECTED", "demo")


def test_the_closing_summary_names_the_invalid_variants_too(tmp_path):
  """The summary after the runs named only the variants run: an invalid one,
  reported hours before, was missing from it. Here the valid variant fails at
  once (its workdir is a file), so nothing trains."""
  workdir = tmp_path / "runs"
  workdir.mkdir()
  (workdir / "pre").write_text("")
  out = subprocess.run([sys.executable, "-m", "transformer.sweep", "--sweep",
                        write_sweep(tmp_path), "--workdir", str(workdir),
                        "--only", "typo,pre,bad-value"],
                       cwd=ROOT, capture_output=True, text=True, env=process_helpers.command_env())
  assert out.returncode == 1, out.stderr[-2000:]  # pre failed.
  lines = out.stdout.splitlines()
  assert [line.split(":")[0] for line in lines] == ["pre", "typo", "bad-value"], out.stdout
  assert lines[0] == "pre: failed"
  assert lines[1] == f"typo: invalid, not run (config.model.dropuot: unknown field (not in {DEFAULT}))"
  assert lines[2].startswith("bad-value: invalid, not run (")
  assert os.path.getsize(workdir / "pre") == 0


def test_only_invalid_variants_is_an_error_not_an_empty_run(tmp_path):
  """--only naming invalid variants alone ran nothing and exited 0 (and an
  emitted job array read --array=0--1); with a valid one beside them it runs."""
  sweep = sweep_lib.resolve(write_sweep(tmp_path))
  with pytest.raises(ValueError, match=r"^--only: nothing to run: typo is invalid \(config"
                     r".*; bad-value is invalid \(config"):
    sweep_lib.select(sweep, ["typo", "bad-value"])
  assert [v.name for v in sweep_lib.select(sweep, ["typo", "pre"]).valid] == ["pre"]


def test_a_variant_named_like_a_table_file_is_refused(tmp_path):
  path = write_sweep(tmp_path, "BASE = {base!r}\ndef get_sweep(base):\n"
                     "  return [('results.md', {{'model.dropout': 0.2}})]\n")
  with pytest.raises(ValueError, match=r"variant name 'results.md' is the name of a table "
                     "file --collect writes"):
    sweep_lib.resolve(path)


def test_a_set_the_bases_architecture_does_not_read_stops_the_sweep(tmp_path):
  with pytest.raises(ValueError, match=r"config.model.rnn_cell: has no effect with "
                     r"model.architecture='transformer' \(only the rnn reads it\)"):
    sweep_lib.resolve(write_sweep(tmp_path), sets=["model.rnn_cell=lstm"])
  # Bahdanau's attention has no input feeding (configs/rnn_scan.py is Bahdanau's);
  # on Luong's it is a real variant.
  rnn = os.path.join(ROOT, "configs", "rnn_scan.py")
  with pytest.raises(ValueError, match=r"config.model.rnn_input_feeding: has no effect with "
                     r"model.rnn_attention='bahdanau' \(only Luong's attentions read it\)"):
    sweep_lib.resolve(write_sweep(tmp_path), base=rnn, sets=["model.rnn_input_feeding=False"])
  sweep_lib.resolve(write_sweep(tmp_path), base=rnn, sets=[
      "model.rnn_attention=luong_general", "model.rnn_input_feeding=False"])


def test_a_set_only_the_base_reads_leaves_a_variant_of_the_other_architecture_valid(tmp_path):
  """A Transformer-against-RNN sweep with the Transformer shrunk by --set: the
  RNN variant was refused as if it had set d_ff itself ('has no effect with
  model.architecture='rnn''), though it only goes without it, as train.py warns."""
  path = write_sweep(tmp_path, text='BASE = {base!r}\ndef get_sweep(base):\n  return [("rnn", '
                     '{{"model.architecture": "rnn", "data.batching": "bucket"}}), '
                     '("rnn-ff", {{"model.architecture": "rnn", "data.batching": "bucket", '
                     '"model.d_ff": 64}})]\n')
  sweep = sweep_lib.resolve(path, sets=["model.d_ff=64", "model.num_heads=2"])
  assert [v.name for v in sweep.valid] == ["base", "rnn"]
  assert sweep.valid[1].config.model.d_ff == 64  # Unread, as the --set gave it.
  # A variant's own override of a field its model does not read stays invalid.
  assert "config.model.d_ff: has no effect with model.architecture='rnn'" in \
      sweep.variants[2].error


def test_a_variant_field_spelt_with_the_config_prefix_is_the_fields(tmp_path):
  """As `--set config.field=value`: it was 'config.config.model.dropout: unknown field'."""
  path = write_sweep(tmp_path, text='BASE = {base!r}\ndef get_sweep(base):\n  return [("d", '
                     '{{"config.model.dropout": 0.3}})]\n')
  sweep = sweep_lib.resolve(path)
  assert sweep.variants[1].error is None and sweep.variants[1].overrides == ["model.dropout=0.3"]
  assert sweep.variants[1].config.model.dropout == 0.3
  twice = write_sweep(tmp_path, text='BASE = {base!r}\ndef get_sweep(base):\n  return [("d", '
                      '{{"config.model.dropout": 0.3, "model.dropout": 0.2}})]\n')
  assert sweep_lib.resolve(twice).variants[1].error.startswith("a field is given twice")


def test_a_none_in_a_sweep_file_is_an_invalid_variant_not_a_path_named_none(tmp_path):
  """A variant's values reach train.py's command line as strings: None became the
  vocabulary path 'None', valid at --list and failing when run."""
  path = write_sweep(tmp_path, text='BASE = {base!r}\ndef get_sweep(base):\n  return [("v", '
                     '{{"data.vocab_path": None}}), ("t", {{"data.test_split": None}})]\n')
  sweep = sweep_lib.resolve(path)
  for variant, field in zip(sweep.variants[1:], ("data.vocab_path", "data.test_split")):
    assert variant.error == (f"config.{field}: None cannot reach train.py's command line (it "
                             "would be the string 'None'); leave the field out"), variant


def test_the_default_workdir_keeps_a_sweep_on_another_base_apart():
  """Without --workdir a sweep trains in runs/<sweep stem>; with --base, in
  runs/<sweep stem>_<base stem> (with the base's argument), so that the same
  sweep run on two bases never resumes, or labels, the other's variants."""
  table3 = os.path.join("configs", "sweeps", "table3.py")
  assert sweep_lib.default_workdir(table3, None) == os.path.join("runs", "table3")
  assert sweep_lib.default_workdir(table3, "configs/multi30k.py:de-en") == os.path.join(
      "runs", "table3_multi30k_de-en")
  assert len({sweep_lib.default_workdir(table3, base) for base in (
      None, "configs/default.py", "configs/multi30k.py", "configs/multi30k.py:de-en")}) == 4
