"""Tests for transformer/average_checkpoints.py: the averaged checkpoint holds the
elementwise mean of the parameters and the newest checkpoint's everything else."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import tiny_experiment
from transformer import checkpoints, sharding, state as state_lib, training
from transformer import workdir as workdir_lib
from transformer.average_checkpoints import average_checkpoints, mean_params
from transformer.data import tokenizer as tokenizer_lib

SCAN_WORDS = ["walk left twice", "jump around right", "look after run thrice",
              "I_WALK I_TURN_LEFT", "I_JUMP I_RUN I_LOOK"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A workdir with config, vocabulary and two different states saved at steps 10
  and 20 (no training needed); returns (path, the two states, abstract, shardings)."""
  path = str(tmp_path_factory.mktemp("avg"))
  config = tiny_experiment(os.path.join(path, "tfds"))
  training.save_config(config, path)
  tokenizer = tokenizer_lib.train(SCAN_WORDS, "word", 32)
  tokenizer.save(os.path.join(path, "spm.model"))
  mesh = sharding.make_mesh()
  model, tx, abstract, shardings, _ = state_lib.build(config, tokenizer.vocab_size, mesh)
  states = []
  checkpointer = checkpoints.Checkpointer(os.path.join(path, "checkpoints"))
  for seed, step in ((0, 10), (1, 20)):
    config.seed = seed
    state = state_lib.init_state(model, tx, config, shardings)
    state = state.replace(step=jnp.int32(step))
    checkpointer.save(step, state, {"epoch": 0, "index": step, "num_examples": 5})
    states.append(state)
  checkpointer.close()
  return path, states, abstract, shardings


def test_average_of_two_is_their_elementwise_mean(workdir):
  path, (older, newer), abstract, shardings = workdir
  assert average_checkpoints(path, last=2) == (20, [10, 20])
  restored = workdir_lib.restore(path, "averaged")
  assert restored.step == 20 and int(restored.state.step) == 20
  for avg, a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(older.params),
                       jax.tree.leaves(newer.params)):
    assert avg.dtype == jnp.float32
    np.testing.assert_allclose(avg, (np.asarray(a) + np.asarray(b)) / 2, rtol=1e-6,
                               atol=1e-7)
  assert not np.allclose(older.params["shared_embedding"]["embedding"],
                         newer.params["shared_embedding"]["embedding"])  # Not a trivial mean.
  # Everything but the parameters is the newest checkpoint's.
  for x, y in zip(jax.tree.leaves((restored.state.opt_state, restored.state.rng)),
                  jax.tree.leaves((newer.opt_state, newer.rng))):
    np.testing.assert_array_equal(x, y)
  averaged_dir = os.path.join(path, "checkpoints_averaged")
  _, data_state, _ = checkpoints.Checkpointer(averaged_dir, read_only=True).restore(
      abstract, shardings)
  assert data_state["index"] == 20
  with open(os.path.join(averaged_dir, "averaged.json")) as f:
    assert json.load(f)["averaged_steps"] == [10, 20]


def test_rerun_replaces_the_average_and_leaves_no_debris(workdir):
  path, (_, newer), _, _ = workdir
  average_checkpoints(path, last=2)
  assert average_checkpoints(path, last=1) == (20, [20])
  restored = workdir_lib.restore(path, "averaged")
  for x, y in zip(jax.tree.leaves(restored.params), jax.tree.leaves(newer.params)):
    np.testing.assert_array_equal(x, y)
  assert sorted(n for n in os.listdir(path) if n.startswith("checkpoints")) == [
      "checkpoints", "checkpoints_averaged"]


def test_a_file_or_a_link_where_the_average_goes(workdir, tmp_path):
  """A file named checkpoints_averaged was renamed aside, replaced, and left as
  checkpoints_averaged.old<pid> (rmtree cannot remove a file): it is refused,
  kept as it was. A link to a directory is replaced; the linked directory stays."""
  path = workdir[0]
  final = os.path.join(path, "checkpoints_averaged")
  debris = lambda: sorted(n for n in os.listdir(path) if n.startswith("checkpoints_averaged."))
  average_checkpoints(path, last=1)
  os.rename(final, tmp_path / "elsewhere")
  try:
    with open(final, "w") as f:
      f.write("notes")
    with pytest.raises(ValueError, match="checkpoints_averaged is not a directory"):
      average_checkpoints(path, last=1)
    assert open(final).read() == "notes" and not debris()
    os.remove(final)
    os.symlink(tmp_path / "elsewhere", final)
    assert average_checkpoints(path, last=2) == (20, [10, 20])
    assert os.path.isdir(final) and not os.path.islink(final) and not debris()
    assert "averaged.json" in os.listdir(tmp_path / "elsewhere")  # Untouched.
  finally:
    if os.path.lexists(final) and not os.path.isdir(final) or os.path.islink(final):
      os.remove(final)


def test_too_few_checkpoints_or_no_workdir_is_named(workdir, tmp_path):
  path = workdir[0]
  with pytest.raises(ValueError, match=r"last 3 checkpoints, but .* has 2 \(steps \[10, 20\]\)"):
    average_checkpoints(path, last=3)
  with pytest.raises(ValueError, match="last must be >= 1"):
    average_checkpoints(path, last=0)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    average_checkpoints(str(tmp_path / "nowhere"))
  # By default, the checkpoints training keeps (the paper: 5 for base, 20 for big).
  keep = workdir_lib.load_config(path).train.keep_checkpoints
  assert keep > 2
  with pytest.raises(ValueError, match=rf"last {keep} checkpoints, but .* has 2"):
    average_checkpoints(path)


def test_mean_params_keeps_dtypes_and_sums_in_float32():
  trees = [{"w": jnp.full((3,), v, jnp.bfloat16), "b": jnp.float32(v)} for v in (1.0, 2.0, 4.0)]
  mean = mean_params(iter(trees))
  assert mean["w"].dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(mean["w"], np.float32), 7 / 3, rtol=1e-2)
  assert float(mean["b"]) == pytest.approx(7 / 3)
  with pytest.raises(ValueError, match="nothing to average"):
    mean_params([])
  # Summed in float32: 256 + 1 + 1 in bfloat16 rounds to 256 (8 bits), and the
  # mean would read 85.5 instead of 86.
  exact = mean_params(iter([{"w": jnp.asarray([v], jnp.bfloat16)} for v in (256.0, 1.0, 1.0)]))
  assert float(exact["w"][0]) == 86.0


@pytest.mark.parametrize("where", ["save", "swap"])
def test_a_kill_while_averaging_leaves_the_previous_average(workdir, tmp_path, where):
  """SIGKILL while the new average is being written, or between moving the
  previous one aside and moving the new one in: readers still get the previous
  average, and the next run puts things right and leaves no debris."""
  from tests import process_helpers as ph  # pylint: disable=g-import-not-at-top
  path, (_, newer), _, _ = workdir
  average_checkpoints(path, last=2)
  previous = workdir_lib.restore(path, "averaged").params
  log = str(tmp_path / "log")
  env = ph.command_env(**{"FAULT_SAVE_SECONDS" if where == "save" else "FAULT_SWAP_SECONDS":
                          "60"})
  process = ph.start([os.path.join("tests", "fault_average.py"), "--workdir", path,
                      "--last", "1"], log, env=env)
  ph.wait_for(log, r"^fault: (finalizing .*checkpoints_averaged\.tmp/20|swapping)$"
              if where == "save" else r"^fault: swapping", process)
  ph.kill9(process)
  names = os.listdir(path)
  assert any(n.startswith("checkpoints_averaged.") for n in names), names  # It was mid-way.
  for x, y in zip(jax.tree.leaves(workdir_lib.restore(path, "averaged").params),
                  jax.tree.leaves(previous)):
    np.testing.assert_array_equal(x, y)
  assert average_checkpoints(path, last=1) == (20, [20])
  for x, y in zip(jax.tree.leaves(workdir_lib.restore(path, "averaged").params),
                  jax.tree.leaves(newer.params)):
    np.testing.assert_array_equal(x, y)
  assert sorted(n for n in os.listdir(path) if n.startswith("checkpoints") or n == "LOCK") == [
      "checkpoints", "checkpoints_averaged"]


def test_a_sigterm_while_averaging_is_one_line_and_unlocks_the_workdir(workdir, tmp_path):
  """SIGTERM while the new average is being written: SIGTERM's default action
  ended the command silently, leaving its LOCK for the next run to take over
  with a warning. Now one line, status 143, the workdir unlocked, the previous
  average still the one read (transformer/sigterm.py)."""
  from tests import process_helpers as ph  # pylint: disable=g-import-not-at-top
  path, _, _, _ = workdir
  average_checkpoints(path, last=2)
  previous = workdir_lib.restore(path, "averaged").params
  log = str(tmp_path / "log")
  process = ph.start([os.path.join("tests", "fault_average.py"), "--workdir", path,
                      "--last", "1"], log, env=ph.command_env(FAULT_SAVE_SECONDS="60"))
  text = ph.sigterm_holding_lock(process, log, r"^fault: finalizing .*checkpoints_averaged\.tmp/20",
                                 path)
  assert text.rstrip().splitlines()[-1] == (
      "average_checkpoints: stopped by SIGTERM; an average is used only once complete "
      "(checkpoints_averaged/averaged.json names its steps); rerun the same command"), text
  assert "Traceback" not in text and not os.path.exists(os.path.join(path, "LOCK"))
  for x, y in zip(jax.tree.leaves(workdir_lib.restore(path, "averaged").params),
                  jax.tree.leaves(previous)):
    np.testing.assert_array_equal(x, y)


def test_a_failed_write_of_the_average_is_named_as_such_and_keeps_the_previous(workdir):
  """A full disk while writing the new average: one line that names the steps
  averaged and says the previous average is kept (it spoke of training having
  stopped), and that average still restores."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tests import process_helpers as ph  # pylint: disable=g-import-not-at-top
  path, _, _, _ = workdir
  average_checkpoints(path, last=2)
  previous = workdir_lib.restore(path, "averaged").params
  out = subprocess.run(
      [sys.executable, os.path.join("tests", "fault_average.py"), "--workdir", path,
       "--last", "1"], cwd=ph.ROOT, env=ph.command_env(FAULT_SAVE_ERROR_STEP="20"),
      capture_output=True, text=True, timeout=240)
  assert out.returncode == 1, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("average_checkpoints: error: the average of steps [20] could not be "
                         "written to "), last
  assert "No space left on device" in last and last.endswith("the previous average is kept")
  assert "Training" not in last
  for x, y in zip(jax.tree.leaves(workdir_lib.restore(path, "averaged").params),
                  jax.tree.leaves(previous)):
    np.testing.assert_array_equal(x, y)
