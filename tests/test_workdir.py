"""Tests for transformer/workdir.py as the commands meet it: a missing or
damaged config.json, a vocabulary other than the checkpoints', checkpoint names
and unreadable checkpoints, each named in one line (through evaluate, and
translate's command line), on the tiny trained SCAN workdir."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.workdirs import trained_workdir
from transformer import checkpoint_reads, evaluate, results, training
from transformer import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained_workdir(tmp_path_factory)


def test_missing_workdir_or_damaged_config_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    evaluate.run(str(tmp_path / "nowhere"))
  (tmp_path / "a_file").write_text("")  # Was 'does not exist'.
  with pytest.raises(FileNotFoundError, match=r"workdir '.*a_file' is a file, not a directory"):
    evaluate.run(str(tmp_path / "a_file"))
  with pytest.raises(ValueError, match=r"^--split is empty \(leave the flag out for "
                     r"config.data.test_split\)$"):  # Was the default split, silently.
    evaluate.run(str(tmp_path), split="")
  with pytest.raises(ValueError, match="checkpoint must be a step number or one of"):
    evaluate.run(str(tmp_path), checkpoint="\u00b2")  # isdigit, and int() refused it.
  with pytest.raises(ValueError, match="checkpoint must be a step number or one of"):
    evaluate.run(str(tmp_path), checkpoint="\u0661\u0660")  # Arabic-Indic 10: a file name apart.
  assert [workdir_lib.checkpoint_name(c) for c in ("0010", "10", "best")] == ["10", "10", "best"]
  with pytest.raises(FileNotFoundError, match="config.json not found"):
    evaluate.run(str(tmp_path))
  (tmp_path / "config.json").write_text('{"model": ')  # Truncated.
  with pytest.raises(ValueError, match=r"config.json is not valid JSON .*line 1 column 11"):
    evaluate.run(str(tmp_path))
  (tmp_path / "config.json").write_bytes(b'{"model": "\xfa"}')  # Was: no file named.
  with pytest.raises(ValueError, match=r"config.json is not valid JSON .*can't decode byte 0xfa"):
    evaluate.run(str(tmp_path))
  (tmp_path / "config.json").write_text('[1, 2]')
  with pytest.raises(ValueError, match=r"config.json holds a list, not a config"):
    evaluate.run(str(tmp_path))
  (tmp_path / "config.json").write_text('{"model": {}, "data": {}}')  # Sections lost.
  with pytest.raises(ValueError, match=r"config.json lacks the config section\(s\) optim, "
                     "train, decode"):
    evaluate.run(str(tmp_path))


def test_a_hand_edited_config_outside_the_model_is_named_with_its_field(tmp_path):
  """Only config.model's fields were checked: data.max_length='abc' was translate's
  TypeError traceback, data.test_split=5 evaluate's AttributeError, and
  train.keep_checkpoints=0 had average_checkpoints average every step. A field
  configs/base.py no longer has (an old workdir's) is left unread, not refused."""
  from tests.helpers import tiny_experiment  # pylint: disable=import-outside-toplevel
  from transformer import training  # pylint: disable=import-outside-toplevel
  training.save_config(tiny_experiment(str(tmp_path / "tfds")), str(tmp_path))
  saved = json.loads((tmp_path / "config.json").read_text())
  path = tmp_path / "config.json"
  for section, field, value, error in (
      ("data", "max_length", "abc", "config.data.max_length='abc': must be of type int"),
      ("data", "test_split", 5, "config.data.test_split=5: must be of type str"),
      ("train", "keep_checkpoints", 0, "config.train.keep_checkpoints=0: must be a positive "
       "integer"),
      ("decode", "beam_size", "four", "config.decode.beam_size='four': must be of type int"),
      ("data", "max_length", -1, "config.data.max_length=-1: must be a positive integer"),
      ("data", "test_split", None, "config.data.test_split=None: must be of type str")):
    edited = json.loads(json.dumps(saved))
    edited[section][field] = value
    path.write_text(json.dumps(edited))
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: {error}")):
      workdir_lib.load_config(str(tmp_path))
  saved["decode"]["min_cache_len"] = 8  # A field since removed.
  # Rules for training alone, which a run may have trained before: its workdir
  # still evaluates, and resumes where the rule's field may change.
  saved["model"]["architecture"], saved["data"]["batching"] = "rnn", "bucket"
  saved["train"]["mesh"] = "data=1,model=2"
  saved["data"]["target_lang"] = saved["data"]["source_lang"] = "en"
  path.write_text(json.dumps(saved))
  assert workdir_lib.load_config(str(tmp_path)).decode.min_cache_len == 8


def test_a_workdir_from_before_attention_bias_loads_with_biased_projections(tmp_path):
  """A config.json written before model.attention_bias existed was trained with
  biased attention projections (Flax's default then): it loads with the field
  True, so its checkpoints' parameters are the model's; one that records the
  field keeps its value."""
  from tests.helpers import tiny_experiment  # pylint: disable=import-outside-toplevel
  from transformer import training  # pylint: disable=import-outside-toplevel
  config = tiny_experiment(str(tmp_path / "tfds"))
  config.model.attention_bias = False
  training.save_config(config, str(tmp_path))
  assert workdir_lib.load_config(str(tmp_path)).model.attention_bias is False
  values = json.loads((tmp_path / "config.json").read_text())
  del values["model"]["attention_bias"]
  (tmp_path / "config.json").write_text(json.dumps(values))
  assert workdir_lib.load_config(str(tmp_path)).model.attention_bias is True


def test_a_hand_edited_model_field_of_the_wrong_type_is_named(workdir, tmp_path):
  """A config.json whose model.num_heads is "2" ended evaluate in a TypeError's
  traceback deep in the model's checks; it is now one line naming the file."""
  edited = tmp_path / "w"
  shutil.copytree(workdir, edited)
  config = json.loads((edited / "config.json").read_text())
  for field, value, kind in (("num_heads", "2", "an integer"), ("dropout", "0.1", "a number"),
                             ("share_embeddings", 1, "true or false")):
    wrong = {**config, "model": {**config["model"], field: value}}
    (edited / "config.json").write_text(json.dumps(wrong))
    with pytest.raises(ValueError, match=re.escape(
        f"{edited / 'config.json'}: config.model.{field}={value!r}: must be {kind}")):
      evaluate.run(str(edited))


def test_a_best_checkpoint_being_replaced_is_named(tmp_path):
  best = tmp_path / "checkpoints_best"
  os.makedirs(best / "15.replaced")
  with pytest.raises(FileNotFoundError, match=r"the best checkpoint in .* is being replaced "
                     r"\(15.replaced\): rerun once training has saved the new one"):
    workdir_lib.checkpoint_location(str(tmp_path), "best")
  os.makedirs(best / "15")  # The new one is complete: it is read.
  assert workdir_lib.checkpoint_location(str(tmp_path), "best") == (str(best), None)


def test_an_evaluation_of_an_average_since_replaced_is_not_collected(workdir, tmp_path):
  """average_checkpoints --last 2, evaluate --checkpoint averaged, then --last 1:
  both averages are of step 20. evaluate records the steps it averaged, and the
  sweep's table drops its figures once another average holds the name (the old
  code recorded the step alone, and the table showed the old average's)."""
  from transformer.average_checkpoints import average_checkpoints
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  assert average_checkpoints(copy, last=2) == (20, [10, 20])
  result, _ = evaluate.run(copy, split="test[:5]", checkpoint="averaged", mode="greedy")
  assert result["checkpoint_identity"] == {"step": 20, "averaged_steps": [10, 20]}
  config = workdir_lib.load_config(copy)
  collected = lambda: results.evaluation(copy, config, "test[:5]", "greedy", "averaged", 20)
  assert collected() == result
  assert average_checkpoints(copy, last=1) == (20, [20])
  assert collected() is None


def test_an_evaluation_of_a_checkpoint_trained_again_is_not_collected(workdir, tmp_path, caplog):
  """A workdir whose checkpoints were deleted and trained again under other
  settings holds a new checkpoint of the old step: the old evaluate JSON
  matched it by step, and the table showed the old run's scores under the new
  run's label. evaluate records the checksums of the arrays it scored, and the
  table skips a JSON of other checksums, naming it; a JSON from before the
  record is read as before."""
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  result, path = evaluate.run(copy, split="test[:5]", mode="greedy")
  assert result[workdir_lib.CHECKSUMS_KEY]
  config = workdir_lib.load_config(copy)
  collected = lambda: results.evaluation(copy, config, "test[:5]", "greedy", "latest", 20)
  assert collected() == result
  # Another checkpoint 20: its arrays' checksums (what a save records) differ.
  metadata = os.path.join(copy, "checkpoints", "20", "checksums", "metadata")
  saved = json.loads(open(metadata).read())
  first = sorted(saved["state"])[0]
  saved["state"][first] += 1
  open(metadata, "w").write(json.dumps(saved))
  assert collected() is None
  assert (f"Skipping {path}: it scored a checkpoint 20 other than the one {copy} holds now"
          in caplog.text)
  del result[workdir_lib.CHECKSUMS_KEY]
  open(path, "w").write(json.dumps(result))
  assert collected() == result


def _mismatch_stops_evaluate_and_resume(copy, message):
  """`copy`'s checkpoints do not fit its model: evaluate and a resumed training
  both stop with MismatchedCheckpointError matching `message`, and every
  checkpoint stays where it was."""
  from transformer import checkpoints  # pylint: disable=g-import-not-at-top
  with pytest.raises(checkpoint_reads.MismatchedCheckpointError, match=message):
    evaluate.run(copy, split="test[:5]", mode="greedy")
  config = workdir_lib.load_config(copy)
  config.train.num_steps = 30
  with pytest.raises(checkpoint_reads.MismatchedCheckpointError, match=message):
    training.train_and_evaluate(config, copy)
  assert checkpoints.complete_steps(os.path.join(copy, "checkpoints")) == [10, 20]
  assert not [n for n in os.listdir(os.path.join(copy, "checkpoints")) if "." in n]


def test_a_config_json_edited_to_another_tree_is_named_not_called_damaged(workdir, tmp_path):
  """config.json's num_layers edited by hand: Orbax's tree mismatch was "no
  readable checkpoint (damaged or incomplete files)". It is named as the arrays
  only one side has, at the newest checkpoint, and nothing is moved."""
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  path = os.path.join(copy, "config.json")
  values = json.loads(open(path).read())
  values["model"]["num_layers"] += 1
  open(path, "w").write(json.dumps(values))
  message = (r"checkpoint 20 in .*checkpoints does not fit the model built to restore it: "
             r"its arrays are not the model's: params/decoder/layer_\d+ \(only in the model\), "
             r"params/encoder/layer_\d+ \(only in the model\), .*config\.model changed")
  _mismatch_stops_evaluate_and_resume(copy, message)


def test_a_vocabulary_other_than_the_checkpoints_is_named_not_used(workdir, tmp_path):
  """Training records its vocabulary's SHA-256 and size (vocabulary.json). A
  spm.model replaced by another of as many pieces restored without a word, and
  every id meant another piece; one of another size failed in Orbax as a damaged
  checkpoint. Both now stop evaluate (and a resume) naming the vocabulary."""
  from transformer.data import tokenizer as tokenizer_lib
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  config = workdir_lib.load_config(copy)
  original = workdir_lib.load_tokenizer(copy, config)
  record = json.loads(open(os.path.join(copy, workdir_lib.VOCABULARY_RECORD)).read())
  assert record["pieces"] == original.vocab_size
  words = [f"w{i}" for i in range(100)]
  for size, other_bytes in ((original.vocab_size, ", and other bytes"), (40, "")):
    tokenizer_lib.train([" ".join(words)], "word", size).save(os.path.join(copy, "spm.model"))
    message = (rf"vocabulary .*spm.model is not the one .*run's checkpoints were trained with "
               rf"\({size} pieces, against {original.vocab_size} then{other_bytes}; "
               r"vocabulary.json records it\): put the original back")
    with pytest.raises(workdir_lib.ConfigMismatchError, match=message):
      evaluate.run(copy, split="test[:5]", mode="greedy")
    with pytest.raises(workdir_lib.ConfigMismatchError, match=message):
      workdir_lib.check_resume_config(copy, config)
  # Without the record (a workdir from before it, or one deleted), another size
  # was "no readable checkpoint ... (damaged or incomplete files)": it is named
  # as the model's shapes, at the newest checkpoint, and nothing is moved.
  os.rename(os.path.join(copy, workdir_lib.VOCABULARY_RECORD), str(tmp_path / "record"))
  _mismatch_stops_evaluate_and_resume(copy, (
      r"checkpoint 20 in .*checkpoints does not fit the model built to restore it: "
      rf"it stores \({original.vocab_size}, \d+\) where the model has \(40, \d+\) "
      r"\(params/shared_embedding/embedding\)\. The vocabulary .* changed"))
  os.rename(str(tmp_path / "record"), os.path.join(copy, workdir_lib.VOCABULARY_RECORD))
  shutil.copy(os.path.join(workdir, "spm.model"), os.path.join(copy, "spm.model"))
  workdir_lib.check_resume_config(copy, config)  # The original passes.
  open(os.path.join(copy, workdir_lib.VOCABULARY_RECORD), "w").write("{")
  with pytest.raises(ValueError, match=r"vocabulary.json is damaged .* delete it to go on"):
    evaluate.run(copy, split="test[:5]", mode="greedy")


def test_unknown_or_absent_checkpoint_is_named(workdir):
  with pytest.raises(ValueError, match="checkpoint must be a step number or one of"):
    evaluate.run(workdir, checkpoint="newest")
  with pytest.raises(FileNotFoundError, match=r"no checkpoints? (at|in) .*checkpoints_best"):
    evaluate.run(workdir, split="test[:5]", checkpoint="best")
  with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 7 .* \[10, 20\]"):
    evaluate.run(workdir, split="test[:5]", checkpoint="7")


def test_unreadable_checkpoints_are_named_in_one_line_and_kept(workdir, tmp_path):
  """A damaged checkpoint (its state's _METADATA gone) asked for by step, then
  every checkpoint damaged: a one-line error naming the directory and the step,
  from the library and from the command (no traceback), and nothing moved."""
  from transformer import checkpoints
  damaged = str(tmp_path / "damaged")
  shutil.copytree(workdir, damaged)
  ckpt = os.path.join(damaged, "checkpoints")
  os.remove(os.path.join(ckpt, "20", "state", "_METADATA"))
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"checkpoint 20 in .*checkpoints is unreadable") as e:
    evaluate.run(damaged, split="test[:5]", checkpoint="20")
  assert "\n" not in str(e.value)
  os.remove(os.path.join(ckpt, "10", "state", "_METADATA"))
  with pytest.raises(checkpoints.UnreadableCheckpointError,
                     match=r"no readable checkpoint in .*checkpoints .*step 20: .*step 10: "):
    evaluate.run(damaged, split="test[:5]")
  result = subprocess.run(
      [sys.executable, "-m", "transformer.translate", "--workdir", damaged],
      input="walk\n", cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 1 and not result.stdout
  errors = [l for l in result.stderr.splitlines() if l.startswith("translate: error:")]
  assert len(errors) == 1 and "no readable checkpoint" in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert checkpoints.complete_steps(ckpt) == [10, 20]  # Set aside by no one.
