"""train.py as a real process: a bad value (a config field, a data path, the
workdir) stops it with one line naming the problem, exit status 1, no
traceback and no config dump."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# absl's log lines (I1123 14:00:00.000 ...) and the allocator restart's note are
# the log; everything else on stderr is what the command says to its user.
LOG_LINE = re.compile(r"^([IWEF]\d{4} |\[transformer\] restarted)")


def train(*args, env=None, timeout=120):
  """(exit status, stderr) of `python train.py args`."""
  result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
  return result.returncode, result.stderr


def said(stderr):
  """stderr without the log lines."""
  return [l for l in stderr.splitlines() if l.strip() and not LOG_LINE.match(l)]


def assert_one_line(status, stderr, *fragments):
  assert status == 1, stderr[-3000:]
  lines = said(stderr)
  assert len(lines) == 1 and lines[0].startswith("train: error: "), stderr[-3000:]
  assert "Traceback" not in stderr and "Config:" not in stderr
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("override, fragments", [
    ("--config.model.num_heads=3",
     ["config.model.num_heads=3: d_model=128 must be divisible by the number of heads"]),
    ("--config.train.num_steps=-1", ["config.train.num_steps=-1: must be a positive integer"]),
    ("--config.model.num_heads=two", ["--config.model.num_heads=two", "invalid literal"]),
    ("--config.model.nope=3", ["--config.model.nope: no such field in the config"]),
    ("--config.data.vocab_type=chars", ["config.data.vocab_type='chars': must be one of"]),
])
def test_bad_override_is_one_line(override, fragments, tmp_path):
  # With the allocator restart, as users run it: the error is still the one line.
  assert_one_line(*train("--config", "configs/default.py", override, "--workdir",
                         str(tmp_path / "w")), *fragments)
  assert not os.path.exists(tmp_path / "w")  # Nothing was started.


def test_missing_config_file_or_data_is_one_line(tmp_path):
  fast = {"TRANSFORMER_DEFAULT_MALLOC": "1"}
  assert_one_line(*train("--config", "configs/nowhere.py", env=fast),
                  "configs/nowhere.py", "No such file or directory")
  workdir = str(tmp_path / "w")
  assert_one_line(*train("--config", "configs/default.py", "--workdir", workdir,
                         "--config.data.dataset=parallel_text",
                         f"--config.data.text_dir={tmp_path / 'no_texts'}", env=fast),
                  "no text file for split 'train'", str(tmp_path / "no_texts"))


def test_a_misspelt_field_in_a_config_file_is_one_line(tmp_path):
  config_file = tmp_path / "typo.py"
  config_file.write_text("from configs import default\n\n\ndef get_config():\n"
                         "  config = default.get_config()\n"
                         "  config.data.max_lenght = 16\n  return config\n")
  assert_one_line(*train("--config", str(config_file), "--workdir", str(tmp_path / "w"),
                         env={"TRANSFORMER_DEFAULT_MALLOC": "1"}),
                  "config.data.max_lenght: unknown field",
                  "did you mean config.data.max_length?")
  assert not os.path.exists(tmp_path / "w")


def test_unusable_workdir_is_one_line(tmp_path):
  taken = tmp_path / "a_file"
  taken.write_text("not a directory\n")
  assert_one_line(*train("--config", "configs/default.py", "--workdir", str(taken),
                         env={"TRANSFORMER_DEFAULT_MALLOC": "1"}), str(taken))
  # An empty one (an unset "$WORKDIR") trained, or resumed, in runs/default.
  assert_one_line(*train("--config", "configs/default.py", "--workdir", "",
                         env={"TRANSFORMER_DEFAULT_MALLOC": "1"}),
                  "--workdir is empty (leave the flag out for runs/<config file stem>)")


def test_an_override_the_model_does_not_read_is_warned_of(tmp_path):
  """--config.model.num_heads on the RNN trained the RNN as without it, silently
  (a sweep refuses such a variant); train.py now warns, naming the field, in
  absl's --noconfig.FIELD spelling of a boolean too."""
  status, stderr = train("--config", "configs/rnn_scan.py", "--config.model.num_heads=3",
                         "--config.model.rnn_cell=lstm", "--noconfig.model.attention_bias",
                         "--config.train.num_steps=0",
                         "--workdir", str(tmp_path / "w"),
                         env={"TRANSFORMER_DEFAULT_MALLOC": "1"})
  assert status == 1 and "num_steps" in said(stderr)[-1]  # Stopped before any work.
  warned = [l for l in stderr.splitlines() if "has no effect" in l]
  assert len(warned) == 2 and ("--config.model.num_heads has no effect with "
                               "model.architecture='rnn' (only the transformer reads it)"
                               in warned[0]), stderr[-3000:]
  assert "--config.model.attention_bias has no effect" in warned[1], stderr[-3000:]
