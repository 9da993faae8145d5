"""One workdir, one writer: the lock (transformer/lock.py) against a second real
process, a killed owner and a filesystem without flock; and a resume whose
config would not fit the workdir's checkpoints (workdir.check_resume_config)."""

import errno
import json
import logging
import os
import socket
import subprocess
import sys
import types

import pytest

from tests import process_helpers as ph
from tests.helpers import tiny_experiment
from transformer import checkpoints, files, lock, training
from transformer import workdir as workdir_lib
from transformer.saved_config import resume_changes
from transformer.data import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  return ph.scan_tfds_dir(tmp_path_factory)


def test_second_writer_stops_at_once_naming_the_first(tmp_path, tfds_dir):
  """Two real train.py processes on one workdir, then average_checkpoints: the
  later ones stop with one line naming the first's pid and host; the first is
  unharmed."""
  workdir, log = str(tmp_path / "w"), str(tmp_path / "first.log")
  first = ph.start_train(workdir, tfds_dir, log, "--config.train.num_steps=100000")
  try:
    owner = ph.wait_for_lock(workdir, first)
    assert owner["command"] == "train"
    for argv in (["train.py", "--config", f"{ph.TINY_CONFIG}:{tfds_dir}", "--workdir", workdir],
                 ["-m", "transformer.average_checkpoints", "--workdir", workdir, "--last", "1"]):
      second = subprocess.run([sys.executable, *argv], cwd=ph.ROOT, capture_output=True,
                              text=True, timeout=120, env=ph.command_env())
      assert second.returncode == 1, second.stderr[-3000:]
      last = second.stderr.strip().splitlines()[-1]
      assert "error: workdir" in last and "is being written by train" in last
      assert f"pid {first.pid} on host {owner['host']}" in last
      assert "Traceback" not in second.stderr
    assert first.poll() is None  # Still training.
  finally:
    ph.kill9(first)


def test_stale_lock_of_a_killed_process_is_taken_over_with_a_warning(tmp_path, caplog):
  workdir = str(tmp_path / "w")
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from transformer import lock; "
       "lock.WorkdirLock(sys.argv[1], 'holder').acquire(); print('held', flush=True); "
       "time.sleep(600)", workdir], cwd=ph.ROOT, stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == "held"
  with pytest.raises(lock.WorkdirBusyError, match=f"holder \\(pid {holder.pid} on host"):
    lock.WorkdirLock(workdir, "train").acquire()
  ph.kill9(holder)  # Leaves LOCK behind, naming a dead process.
  assert os.path.exists(os.path.join(workdir, lock.LOCK_NAME))
  with caplog.at_level(logging.WARNING):
    with lock.WorkdirLock(workdir, "train"):
      assert json.loads(open(os.path.join(workdir, lock.LOCK_NAME)).read())["pid"] == os.getpid()
  assert f"from holder (pid {holder.pid}" in caplog.text and "no longer running" in caplog.text
  assert not os.path.exists(os.path.join(workdir, lock.LOCK_NAME))  # A clean exit removes it.


def test_a_workdir_that_is_a_file_is_named_as_one(tmp_path):
  """It said "cannot be used: File exists" (os.makedirs' reason)."""
  (tmp_path / "w").write_text("notes")
  with pytest.raises(lock.runtime.CommandError, match=r"^workdir .*w cannot be used: it is a "
                     r"file, not a directory$"):
    lock.WorkdirLock(str(tmp_path / "w"), "train").acquire()
  assert (tmp_path / "w").read_text() == "notes"


def test_a_lock_that_holds_no_owner_record_is_taken_over(tmp_path):
  """A LOCK file of valid JSON that is not a record (edited by hand, say) reads
  as no owner: it stopped train.py with an AttributeError's traceback."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  for text in ("[1]", "2", '"me"'):
    (workdir / lock.LOCK_NAME).write_text(text)
    with lock.WorkdirLock(str(workdir), "train"):
      assert json.loads((workdir / lock.LOCK_NAME).read_text())["pid"] == os.getpid()


def test_taking_the_lock_removes_only_dead_temporaries_of_this_host(tmp_path):
  """What a killed writer of this host left (NAME.tmp<pid>@<host>, a file or a
  directory) goes when the lock is taken; a live writer's, another host's and
  a user's own NAME.tmp<digits> stay."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  dead = subprocess.Popen([sys.executable, "-c", ""])
  dead.wait()
  host = socket.gethostname()
  gone = [f"config.json.tmp{dead.pid}@{host}", f"checkpoints_best.tmp{dead.pid}@{host}"]
  kept = [f"eval.json.tmp{os.getpid()}@{host}", f"eval.json.tmp{dead.pid}@other-{host}",
          f"notes.tmp{dead.pid}", f"x.tmp{dead.pid}@{host}.bak"]
  for name in gone + kept:
    (workdir / name).mkdir() if "best" in name else (workdir / name).write_text("x")
  assert files.temporary_path(str(workdir / "a")) == str(workdir / f"a.tmp{os.getpid()}@{host}")
  with lock.WorkdirLock(str(workdir), "train"):
    assert sorted(os.listdir(workdir)) == sorted(kept + [lock.LOCK_NAME])


def test_a_url_workdir_is_refused_not_made_a_local_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for primary in (True, False):
    with pytest.raises(ValueError, match=r"workdir 'gs://bucket/run' is a URL; give a local "
                       r"path"):
      lock.hold("gs://bucket/run", "train", primary=primary)
  with pytest.raises(ValueError, match="is a URL"):
    workdir_lib.restore("gs://bucket/run")
  assert not os.listdir(tmp_path)


def test_a_workdir_path_with_brackets_is_refused_before_any_write(tmp_path, monkeypatch):
  """Orbax globs a checkpoint's path to merge its parts: under 'p [1]' it wrote
  checkpoints that no resume, evaluate or translate could read, and training
  ended with status 0. A bracket in a parent folder counts too."""
  (tmp_path / "runs[2]").mkdir()
  monkeypatch.chdir(tmp_path / "runs[2]")
  for workdir in (str(tmp_path / "p [1]"), "w"):
    for primary in (True, False):
      with pytest.raises(ValueError, match=r"has '\[' or '\]' in its path, which Orbax reads "
                         r"as a glob pattern"):
        lock.hold(workdir, "train", primary=primary)
    with pytest.raises(ValueError, match=r"'\[' or '\]'"):
      workdir_lib.restore(workdir)
  assert not os.listdir(tmp_path / "runs[2]") and not os.path.exists(tmp_path / "p [1]")


def test_one_process_cannot_hold_a_workdir_twice_and_release_frees_it(tmp_path):
  workdir = str(tmp_path / "w")
  with lock.WorkdirLock(workdir, "first"):
    with pytest.raises(lock.WorkdirBusyError, match="first"):
      lock.WorkdirLock(workdir, "second").acquire()
  with lock.WorkdirLock(workdir, "second"):
    pass


def test_without_flock_the_recorded_pid_decides(tmp_path, monkeypatch):
  def no_flock(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(lock.fcntl, "flock", no_flock)
  workdir = str(tmp_path / "w")
  held = lock.WorkdirLock(workdir, "live").acquire()  # This live process holds it.
  with pytest.raises(lock.WorkdirBusyError, match=f"live \\(pid {os.getpid()}"):
    lock.WorkdirLock(workdir, "train").acquire()
  held._fd = None  # pylint: disable=protected-access  # Forget it, as a dead process would.
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  record = json.loads(open(os.path.join(workdir, lock.LOCK_NAME)).read())
  with open(os.path.join(workdir, lock.LOCK_NAME), "w") as f:
    json.dump({**record, "pid": int(dead.stdout), "command": "dead"}, f)
  guard = os.path.join(workdir, lock.LOCK_NAME + lock.TAKEOVER_SUFFIX)
  open(guard, "w").close()  # A takeover interrupted (its process died there): named.
  with pytest.raises(lock.WorkdirBusyError, match=r"dead .*\(or remove .*LOCK\.takeover if no "
                     r"process is starting"):
    lock.WorkdirLock(workdir, "train").acquire()
  os.remove(guard)
  with lock.WorkdirLock(workdir, "train"):
    assert json.load(open(os.path.join(workdir, lock.LOCK_NAME)))["command"] == "train"
    assert sorted(os.listdir(workdir)) == [lock.LOCK_NAME]  # No guard left.
  elsewhere = {**record, "host": "another-host", "command": "remote"}
  with open(os.path.join(workdir, lock.LOCK_NAME), "w") as f:
    json.dump(elsewhere, f)  # Another host's lock is never taken over.
  with pytest.raises(lock.WorkdirBusyError, match="remote .*on host another-host"):
    lock.WorkdirLock(workdir, "train").acquire()


def test_without_flock_a_stale_lock_is_taken_over_by_one_process_only(tmp_path, monkeypatch):
  """Two writers find the lock of a dead process; B is held up right after
  reading it, A takes the lock over meanwhile. B, resuming, must not remove A's
  live lock as if it were the stale one: it stops, naming A."""
  import threading  # pylint: disable=g-import-not-at-top
  def no_flock(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(lock.fcntl, "flock", no_flock)
  workdir = str(tmp_path / "w")
  os.makedirs(workdir)
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  with open(os.path.join(workdir, lock.LOCK_NAME), "w") as f:
    json.dump({"host": lock.socket.gethostname(), "pid": int(dead.stdout), "command": "dead",
               "time": 0}, f)
  read_owner, b_read, a_holds = lock._read_owner, threading.Event(), threading.Event()  # pylint: disable=protected-access

  def held_up_after_reading(path):
    owner = read_owner(path)
    if threading.current_thread().name == "B" and not b_read.is_set():
      b_read.set()
      assert a_holds.wait(timeout=60)
    return owner

  monkeypatch.setattr(lock, "_read_owner", held_up_after_reading)
  outcome = {}

  def b():
    try:
      outcome["B"] = lock.WorkdirLock(workdir, "B").acquire()
    except lock.WorkdirBusyError as e:
      outcome["B"] = e

  thread = threading.Thread(target=b, name="B")
  thread.start()
  assert b_read.wait(timeout=60)
  held = lock.WorkdirLock(workdir, "A").acquire()
  a_holds.set()
  thread.join(timeout=60)
  assert isinstance(outcome["B"], lock.WorkdirBusyError), outcome
  assert "is being written by A (pid" in str(outcome["B"])
  assert json.load(open(os.path.join(workdir, lock.LOCK_NAME)))["command"] == "A"
  assert os.listdir(workdir) == [lock.LOCK_NAME]  # Nothing moved aside is left.
  held.release()
  assert not os.listdir(workdir)


# ----------------------------------------------------------------------------
# The config a resume may change.

def test_resume_changes_split_fixed_from_free_fields():
  old = {"seed": 0, "model": {"d_model": 32, "dropout": 0.1, "num_heads": 2},
         "data": {"vocab_size": 32, "text_dir": "a", "tokens_per_batch": 512},
         "optim": {"grad_clip_norm": 0.0, "learning_rate_scale": 1.0},
         "train": {"num_steps": 20, "eval_every": 10, "checkpoint_every": 5}}
  new = json.loads(json.dumps(old))
  new["model"].update(d_model=64, dropout=0.3)
  new["data"].update(vocab_size=64, text_dir="b", tokens_per_batch=1024)
  new["optim"].update(grad_clip_norm=1.0, learning_rate_scale=0.5)
  new["train"].update(num_steps=40, eval_every=20)
  new["seed"] = 1
  fixed, free = resume_changes(old, new)
  assert [f for f, *_ in fixed] == ["data.tokens_per_batch", "data.vocab_size",
                                    "model.d_model", "optim.grad_clip_norm", "seed"]
  assert [f for f, *_ in free] == ["data.text_dir", "model.dropout",
                                   "optim.learning_rate_scale", "train.eval_every",
                                   "train.num_steps"]
  old["optim"]["grad_clip_norm"] = 0.5  # Clipping stays on: only its threshold changes.
  assert "optim.grad_clip_norm" in [f for f, *_ in resume_changes(old, new)[1]]
  # An empty optional path is unset, as None is: "vocab_path None -> '' (changes
  # the vocabulary)" stopped a resume that changed nothing.
  old["data"].update(vocab_path=None, tfds_data_dir="")
  new = json.loads(json.dumps(old))
  new["data"].update(vocab_path="", tfds_data_dir=None)
  assert resume_changes(old, new) == ([], [])


def test_a_model_field_neither_model_reads_may_change_on_resume():
  """An RNN run's --config.model.attention_score (warned of as unread) stopped
  the rerun without it: '(changes the parameters)', which it does not."""
  rnn = {"model": {"architecture": "rnn", "rnn_attention": "bahdanau", "d_model": 32,
                   "attention_score": "additive", "num_heads": 8, "rnn_input_feeding": True}}
  rerun = json.loads(json.dumps(rnn))
  rerun["model"].update(attention_score="scaled_dot", num_heads=4, rnn_input_feeding=False)
  fixed, free = resume_changes(rnn, rerun)
  assert not fixed and [f for f, *_ in free] == [
      "model.attention_score", "model.num_heads", "model.rnn_input_feeding"]
  rerun["model"].update(rnn_attention="luong_general")  # Now input feeding is read.
  assert [f for f, *_ in resume_changes(rnn, rerun)[0]] == ["model.rnn_attention",
                                                            "model.rnn_input_feeding"]
  transformer = {"model": {"architecture": "transformer", "num_heads": 8, "rnn_cell": "gru"}}
  fixed, free = resume_changes(transformer, {"model": {**transformer["model"],
                                                       "rnn_cell": "lstm", "num_heads": 4}})
  assert [f for f, *_ in fixed] == ["model.num_heads"] and [f for f, *_ in free] == [
      "model.rnn_cell"]


def test_what_a_vocabulary_file_or_a_sinusoid_makes_unread_may_change_on_resume():
  """With data.vocab_path the vocabulary is that file: a resume with another
  data.vocab_size was refused as '(changes the vocabulary)', which it does not.
  A sinusoid's table is no parameter: model.max_len was refused as '(changes the
  parameters)'. Learned positions, or a vocabulary trained from vocab_size, stay fixed."""
  def config(vocab_path=None, vocab_size=32, max_len=64, positional="sinusoidal"):
    return {"data": {"vocab_path": vocab_path, "vocab_size": vocab_size, "vocab_type": "bpe"},
            "model": {"architecture": "transformer", "max_len": max_len,
                      "positional": positional}}

  fixed, free = resume_changes(config("v.model"), config("v.model", 500, max_len=80))
  assert not fixed and [f for f, *_ in free] == ["data.vocab_size", "model.max_len"]
  fixed, _ = resume_changes(config("v.model"), config("w.model", 500))
  assert [f for f, *_ in fixed] == ["data.vocab_path"]  # The file is what is fixed.
  fixed, _ = resume_changes(config(), config(vocab_size=500))
  assert [(f, why) for f, _, _, why in fixed] == [("data.vocab_size", "changes the vocabulary")]
  fixed, _ = resume_changes(config(positional="learned"), config(max_len=80, positional="learned"))
  assert [(f, why) for f, _, _, why in fixed] == [("model.max_len", "changes the parameters")]


def _trained_looking_workdir(tmp_path, config, checkpoint=True):
  """config.json, a vocabulary file and (with `checkpoint`) a checkpoint's
  directory: what the check compares against."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  training.save_config(config, str(workdir))
  (workdir / "spm.model").write_bytes(b"stands in for a trained vocabulary")
  if checkpoint:
    (workdir / "checkpoints" / "3").mkdir(parents=True)
  return str(workdir)


def test_a_vocabulary_alone_fixes_only_the_vocabularys_fields(tmp_path):
  """A run that stopped before its first checkpoint (a batch budget too small,
  say) left config.json and the vocabulary: the corrected rerun may change
  anything but what the vocabulary was trained from."""
  config = tiny_experiment(tmp_path / "tfds")
  workdir = _trained_looking_workdir(tmp_path, config, checkpoint=False)
  corrected = tiny_experiment(tmp_path / "tfds")
  corrected.data.tokens_per_batch *= 2
  corrected.model.d_model = 64
  workdir_lib.check_resume_config(workdir, corrected)
  corrected.data.vocab_size = 40
  corrected.data.train_split = "train[:50%]"
  with pytest.raises(workdir_lib.ConfigMismatchError,
                     match=r"cannot change on resume: data.train_split 'train' -> "
                     r"'train\[:50%\]' \(moves the data order .*\); data.vocab_size 32 -> 40 "
                     r"\(changes the vocabulary\)\. Rerun"):
    workdir_lib.check_resume_config(workdir, corrected)


def test_a_vocabulary_alone_fixes_where_its_text_was_read(tmp_path):
  """A vocabulary trained on one directory's text, then a rerun pointed at
  another: the files there may be another corpus, which the vocabulary would
  serve silently. The same directory spelt otherwise passes; with checkpoints
  the text may move (their data position checks the rows)."""
  config = tiny_experiment(tmp_path / "tfds")
  config.data.dataset = "parallel_text"
  (tmp_path / "corpus").mkdir()
  config.data.text_dir = str(tmp_path / "corpus")
  workdir = _trained_looking_workdir(tmp_path, config, checkpoint=False)
  rerun = tiny_experiment(tmp_path / "tfds")
  rerun.data.dataset = "parallel_text"
  rerun.data.text_dir = str(tmp_path / "corpus" / ".." / "corpus") + "/"
  workdir_lib.check_resume_config(workdir, rerun)
  rerun.data.text_dir = str(tmp_path / "other")
  with pytest.raises(workdir_lib.ConfigMismatchError,
                     match=r"data.text_dir '.*corpus' -> '.*other' \(the vocabulary was trained "
                     r"on the text there\)\. Rerun .*, or delete .*spm.model \(no checkpoint "
                     r"uses it yet\) to train a new vocabulary\.$"):
    workdir_lib.check_resume_config(workdir, rerun)
  (tmp_path / "w" / "checkpoints" / "3").mkdir(parents=True)
  workdir_lib.check_resume_config(workdir, rerun)


def test_a_vocabulary_records_its_text_dir_absolute(tmp_path, monkeypatch):
  """config.json keeps text_dir as given: 'corpus' from one directory and
  'corpus' from another are two corpora. The vocabulary's record holds the
  absolute place, so the rerun from elsewhere is refused, and another spelling
  of the same place from there passes."""
  for place in ("a/corpus", "b/corpus"):
    (tmp_path / place).mkdir(parents=True)
  monkeypatch.chdir(tmp_path / "a")
  config = tiny_experiment(tmp_path / "tfds")
  config.data.dataset = "parallel_text"
  config.data.text_dir = "corpus"
  workdir = _trained_looking_workdir(tmp_path, config, checkpoint=False)
  workdir_lib.record_vocabulary(workdir, config, types.SimpleNamespace(vocab_size=32))
  monkeypatch.chdir(tmp_path / "b")
  with pytest.raises(workdir_lib.ConfigMismatchError,
                     match=r"data.text_dir '.*/a/corpus' -> 'corpus' \(the vocabulary was "
                     r"trained on the text there\)"):
    workdir_lib.check_resume_config(workdir, config)
  config.data.text_dir = "../a/corpus"
  workdir_lib.check_resume_config(workdir, config)
  # A record left by a vocabulary since replaced says nothing of the new one: the
  # check falls back to config.json's path, resolved here.
  (tmp_path / "w" / "spm.model").write_bytes(b"another vocabulary")
  config.data.text_dir = "corpus"
  workdir_lib.check_resume_config(workdir, config)


def test_checkpoints_without_their_config_or_vocabulary_stop_the_run(tmp_path):
  """A workdir's checkpoints without its config.json could not be checked
  against the config (and a new config.json would record the wrong one); without
  its spm.model a new vocabulary would be trained, giving the pieces other ids."""
  config = tiny_experiment(tmp_path / "tfds")
  workdir = _trained_looking_workdir(tmp_path, config)
  os.rename(os.path.join(workdir, "spm.model"), os.path.join(workdir, "spm.model.moved"))
  with pytest.raises(workdir_lib.ConfigMismatchError,
                     match=r"holds checkpoints but not the vocabulary they were trained with"):
    workdir_lib.check_resume_config(workdir, config)
  os.rename(os.path.join(workdir, "config.json"), os.path.join(workdir, "config.json.moved"))
  with pytest.raises(workdir_lib.ConfigMismatchError,
                     match=r"holds checkpoints but no config.json, the config they were "
                     "trained with"):
    training.train_and_evaluate(config, workdir)
  assert not os.path.exists(os.path.join(workdir, "config.json"))


def test_a_run_stopped_by_a_bad_value_leaves_the_workdirs_config(tmp_path):
  """config.json is replaced only once the data has passed its checks: a rerun
  with a bad value (here an eval split the dataset lacks) stops and leaves the
  config the checkpoints were trained with."""
  config = tiny_experiment(tmp_path / "tfds")
  workdir = _trained_looking_workdir(tmp_path, config)
  words = [f"w{i}" for i in range(64)]  # A real vocabulary in place of the stand-in.
  tokenizer_lib.train([" ".join(words)] * 4, config.data.vocab_type,
                      config.data.vocab_size).save(os.path.join(workdir, "spm.model"))
  before = open(os.path.join(workdir, "config.json")).read()
  bad = tiny_experiment(tmp_path / "tfds")
  bad.data.eval_split = "validation"  # SCAN has none.
  with pytest.raises(ValueError, match="validation"):
    training.train_and_evaluate(bad, workdir)
  assert open(os.path.join(workdir, "config.json")).read() == before


def test_a_resume_stopped_by_its_checkpoints_leaves_the_workdirs_config(tmp_path):
  """config.json is replaced only once the checkpoints have passed too: a rerun
  with a new num_steps whose checkpoint cannot be read stops and leaves the
  config the checkpoints were trained with (it recorded the rerun's)."""
  config = tiny_experiment(tmp_path / "tfds")
  workdir = _trained_looking_workdir(tmp_path, config)  # Its checkpoint 3 is empty.
  words = [f"w{i}" for i in range(64)]
  tokenizer_lib.train([" ".join(words)] * 4, config.data.vocab_type,
                      config.data.vocab_size).save(os.path.join(workdir, "spm.model"))
  before = open(os.path.join(workdir, "config.json")).read()
  rerun = tiny_experiment(tmp_path / "tfds", num_steps=60)
  with pytest.raises(checkpoints.UnreadableCheckpointError):
    training.train_and_evaluate(rerun, workdir)
  assert open(os.path.join(workdir, "config.json")).read() == before


def test_a_workdir_with_nothing_trained_takes_the_new_runs_config(tmp_path):
  """A first run stopped before its vocabulary left config.json alone; a rerun
  with another vocab_size stopped on a bad eval split and kept the first
  config.json, which then refused the corrected command (data.vocab_size) and
  misrecorded the vocabulary trained next. With nothing trained in the workdir,
  the rerun's config.json replaces it at start (and the bad split is found
  before the vocabulary is trained: none is left)."""
  first = tiny_experiment(tmp_path / "tfds")
  first.data.vocab_size = 40
  workdir = str(tmp_path / "w")
  os.makedirs(workdir)
  training.save_config(first, workdir)  # What the first run left.
  rerun = tiny_experiment(tmp_path / "tfds")
  rerun.data.eval_split = "validation"  # SCAN has none: stops after the vocabulary.
  with pytest.raises(ValueError, match="validation"):
    training.train_and_evaluate(rerun, workdir)
  assert not os.path.exists(os.path.join(workdir, "spm.model"))
  assert workdir_lib.load_config(workdir).data.vocab_size == rerun.data.vocab_size
  workdir_lib.check_resume_config(workdir, tiny_experiment(tmp_path / "tfds"))  # Accepted.


def test_resume_with_another_shape_stops_naming_the_fields(tmp_path, caplog):
  config = tiny_experiment(tmp_path / "tfds")
  workdir = _trained_looking_workdir(tmp_path, config)
  before = open(os.path.join(workdir, "config.json")).read()
  changed = tiny_experiment(tmp_path / "tfds", num_steps=60, eval_every=7)
  changed.model.d_model = 64
  changed.data.vocab_size = 40
  with pytest.raises(workdir_lib.ConfigMismatchError,
                     match=r"data.vocab_size 32 -> 40 \(changes the vocabulary\); "
                     r"model.d_model 32 -> 64 \(changes the parameters\)\. Rerun"):
    training.train_and_evaluate(changed, workdir)
  assert open(os.path.join(workdir, "config.json")).read() == before  # Not overwritten.
  assert not os.path.exists(os.path.join(workdir, lock.LOCK_NAME))  # Released.
  allowed = tiny_experiment(tmp_path / "tfds", num_steps=60, eval_every=7)
  with caplog.at_level(logging.INFO):
    workdir_lib.check_resume_config(workdir, allowed)
  assert "changed fields: train.eval_every 15 -> 7; train.num_steps 30 -> 60" in caplog.text


def test_a_resume_that_changes_how_the_best_is_scored_warns(tmp_path, caplog):
  """The kept best checkpoint's score was measured with the old decoding
  settings; a resume that changes them compares new scores with it as is."""
  config = tiny_experiment(tmp_path / "tfds")
  workdir = _trained_looking_workdir(tmp_path, config)
  changed = tiny_experiment(tmp_path / "tfds", num_steps=60, decode_mode="beam")
  changed.decode.tokens_per_batch = 1024  # Speed only: no warning of its own.
  with caplog.at_level(logging.INFO):
    workdir_lib.check_resume_config(workdir, changed)
  assert "other decoding settings" not in caplog.text  # No best checkpoint yet.
  os.makedirs(os.path.join(workdir, "checkpoints_best", "3"))
  with caplog.at_level(logging.INFO):
    workdir_lib.check_resume_config(workdir, changed)
  assert ("with other decoding settings (train.decode_mode): the kept best checkpoint was "
          "scored with the old ones") in caplog.text
  # The beam's size and length penalty: greedy scores, before and after, read neither.
  greedy = tiny_experiment(tmp_path / "tfds", num_steps=60)
  assert greedy.train.decode_mode == "greedy"
  greedy.decode.beam_size, greedy.decode.alpha = 8, 1.0
  caplog.clear()
  with caplog.at_level(logging.INFO):
    workdir_lib.check_resume_config(workdir, greedy)
  assert "decode.alpha" in caplog.text and "other decoding settings" not in caplog.text
  changed.decode.beam_size = 8
  with caplog.at_level(logging.INFO):
    workdir_lib.check_resume_config(workdir, changed)
  assert "other decoding settings (decode.beam_size, train.decode_mode)" in caplog.text


def test_train_command_names_the_mismatch_in_one_line(tmp_path):
  from configs import default  # pylint: disable=g-import-not-at-top
  workdir = _trained_looking_workdir(tmp_path, default.get_config())
  result = subprocess.run(
      [sys.executable, "train.py", "--config", "configs/default.py", "--workdir", workdir,
       "--config.model.num_layers=3"], cwd=ph.ROOT, capture_output=True, text=True,
      timeout=120, env=ph.command_env(TRANSFORMER_DEFAULT_MALLOC="1"))
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"train: error: workdir {workdir} was trained with another config")
  assert "model.num_layers 2 -> 3 (changes the parameters)" in result.stderr
