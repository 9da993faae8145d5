"""Multi-process jobs on this machine: 2 processes of 2 CPU devices each, talking
over 127.0.0.1 (transformer/launch.py), against 1 process of 4 devices.

Every job is a real set of subprocesses with a time limit (the launcher's
--timeout_s, and subprocess's timeout above it), so that a hang fails the test.

Tolerance: the two jobs run the same partitioned program on the same 4-device
mesh; only the gradients' all-reduce runs elsewhere (gloo between the processes
instead of within one), which adds in another order: after 6 steps the
parameters differed by at most 1.2e-7 (no leaf bitwise equal). They are compared
to 1e-5 absolute; one padding row in place of a real one, at one step of six,
moved every leaf by 4e-4 or more (at most 5e-3).
"""

import collections
import fcntl
import io
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import jax
import numpy as np
import pytest

from tests.multiprocess_config import get_config
from tests.test_training import restore_params
from transformer import checkpoints, distributed, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_TIMEOUT_S = 240
ATOL = 1e-5


def job_env(devices):
  """This environment without any job variables, with `devices` CPU devices and the
  tests' compilation cache."""
  env = {k: v for k, v in os.environ.items()
         if k not in (distributed.ADDRESS, distributed.COUNT, distributed.INDEX)}
  env.update(launch.cpu_devices(os.environ, devices),
             TRANSFORMER_COMPILATION_CACHE=jax.config.jax_compilation_cache_dir or "0")
  return env


def launch_command(args, processes=2, devices=2):
  if processes == 1:
    return [sys.executable] + args, job_env(devices)
  return ([sys.executable, "-m", "transformer.launch", f"--processes={processes}",
           f"--devices_per_process={devices}", f"--timeout_s={JOB_TIMEOUT_S}", "--"] + args,
          job_env(devices))


def run_job(args, processes=2, devices=2):
  """Runs `args` (after `python`) as a job; its output. A failure shows the output's end."""
  command, env = launch_command(args, processes, devices)
  out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=JOB_TIMEOUT_S + 60)
  output = out.stdout + out.stderr
  assert out.returncode == 0, f"{command} failed:\n{output[-5000:]}"
  return output


def train(data_dir, workdir, processes, *overrides):
  return run_job(["train.py", f"--config=tests/multiprocess_config.py:{data_dir}",
                  f"--workdir={workdir}", *overrides],
                 processes=processes, devices=4 // processes)


def assert_params_close(a, b):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a.params),
                          jax.tree.leaves(b.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=ATOL, rtol=0,
                               err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.mark.long
def test_global_batches_hold_every_example_once_as_in_one_process(data_dir, tmp_path):
  """The first process to touch the (fresh) data dir prepares SCAN and trains the
  vocabulary while the other waits; then every global batch of an epoch, gathered
  from both processes, equals the 1-process batch, and the epoch holds every
  training example exactly once."""
  two, one = str(tmp_path / "two.npz"), str(tmp_path / "one.npz")
  check = "tests/multiprocess_data_check.py"
  output = run_job([check, data_dir, str(tmp_path / "w2"), two])
  assert re.search(r"\[p1\] process 1 of 2: \d+ batches", output)
  prepared = re.findall(r"^\[(p\d)\] Downloading and preparing dataset", output, re.M)
  assert prepared == ["p0"], output[-5000:]  # TFDS's note: process 0 alone prepared SCAN.
  run_job([check, data_dir, str(tmp_path / "w1"), one], processes=1, devices=4)
  two, one = np.load(two), np.load(one)
  assert sorted(two.files) == sorted(one.files)
  for key in two.files:
    np.testing.assert_array_equal(two[key], one[key], err_msg=key)

  seen = collections.Counter()
  batches = {key.split("/")[0] for key in two.files if "/" in key}
  for b in batches:
    inputs, targets = two[f"{b}/inputs"], two[f"{b}/targets"]
    assert inputs.shape[0] % 4 == 0  # Rows split evenly over the 4 devices.
    segments_in, segments_out = two[f"{b}/inputs_segmentation"], two[f"{b}/targets_segmentation"]
    for row in range(inputs.shape[0]):
      for s in range(1, segments_in[row].max() + 1):
        seen[f"{inputs[row][segments_in[row] == s].tolist()}|"
             f"{targets[row][segments_out[row] == s].tolist()}"] += 1
  expected = collections.Counter(two["examples"].tolist())
  assert len(expected) == 2000 and max(expected.values()) == 1
  assert seen == expected  # Every example once: none twice, none dropped.


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
  """Workdirs: `one`, 1 process x 4 devices, 12 steps with a checkpoint at each;
  `two`, 2 processes x 2 devices stopped by a SIGTERM to process 1 once it has
  logged step 3 (`stop`: the launcher's output and exit status)."""
  base = tmp_path_factory.mktemp("runs")
  one, two = str(base / "one"), str(base / "two")
  train(data_dir, one, 1, "--config.train.num_steps=12", "--config.train.checkpoint_every=1",
        "--config.train.keep_checkpoints=12")
  output, _, code = stop_process_1_mid_training(data_dir, two, signal.SIGTERM, grace_s=60)
  return {"one": one, "two": two, "stop": (output, code),
          "events": glob.glob(os.path.join(two, "events.out.*"))}


def test_two_processes_train_as_one(data_dir, runs):
  """train.py in 2 processes x 2 devices: at the step where it stopped, the
  parameters and the iterator position of 1 process x 4 devices; one events file."""
  config = get_config(data_dir)
  a, data_a, step = restore_params(runs["two"], config)
  b, data_b, _ = restore_params(runs["one"], config, step)
  assert data_a == data_b
  assert_params_close(a, b)
  assert len(runs["events"]) == 1  # TensorBoard: process 0 alone writes events.


def test_sigterm_to_one_process_stops_the_job_after_one_step_with_a_checkpoint(
    data_dir, runs, tmp_path):
  """A scheduler's SIGTERM reaching process 1 alone: JAX's preemption service tells
  process 0, both save the same step's checkpoint and exit 143; the checkpoint of
  2 processes, resumed in one process of 4 devices, ends where the uninterrupted
  run does."""
  output, code = runs["stop"]
  assert code == 128 + signal.SIGTERM, output[-5000:]
  stops = dict(re.findall(r"\[(p\d)\] .*stopped by SIGTERM after step (\d+), saved", output))
  assert sorted(stops) == ["p0", "p1"] and stops["p0"] == stops["p1"], output[-5000:]
  for p in ("0", "1"):
    assert f"[launch] process {p}: exited with status 143\n" in output, output[-5000:]
  step = int(stops["p0"])
  assert step < 12, f"stopped at {step}: past the 12-step run compared with"
  resumed = str(tmp_path / "resumed")
  shutil.copytree(runs["two"], resumed)
  output = train(data_dir, resumed, 1, "--config.train.num_steps=12")
  assert f"Resumed from step {step}." in output
  config = get_config(data_dir)
  a, data_a, last = restore_params(resumed, config)
  b, data_b, _ = restore_params(runs["one"], config, 12)
  assert last == 12 and data_a == data_b
  assert_params_close(a, b)


@pytest.mark.long
def test_two_processes_train_as_one_with_fsdp(data_dir, tmp_path):
  """The same with parameters and optimizer state split over the 4 devices."""
  config = get_config(data_dir)
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  train(data_dir, one, 1, "--config.train.fsdp=True")
  output = train(data_dir, two, 2, "--config.train.fsdp=True")
  a, data_a, _ = restore_params(two, config)
  b, data_b, _ = restore_params(one, config)
  assert data_a == data_b
  assert_params_close(a, b)
  # The run really split parameters over the data axis (in each process).
  split = re.findall(r"\[p\d\] .*Parameters: [\d,]+ in \d+ arrays, (\d+) split over the data "
                     r"axis", output)
  assert len(split) == 2 and all(int(n) > 0 for n in split), output[-5000:]


@pytest.fixture(scope="module")
def saved_both(tmp_path_factory):
  """Steps 1 and 2 of one array split over the job's 4 devices, each saved as a
  regular and a best checkpoint at once by a 2-process job, process 1 a second
  behind (tests/multiprocess_restore_check.py both): (the job's output, the
  regular checkpoints' directory, which its `save` phase would write alike)."""
  directory = str(tmp_path_factory.mktemp("both") / "checkpoints")
  output = run_job(["tests/multiprocess_restore_check.py", directory, "both"])
  return output, directory


def test_a_checkpoint_one_process_cannot_read_is_skipped_by_all(saved_both, tmp_path):
  """Each process reads only its own part of a split array: where process 1's
  part of the newest checkpoint is damaged, process 0 reads its part fine. Both
  still take the next older checkpoint together (apart, they would meet in
  different collectives and hang or compute garbage), and process 0 names
  process 1's error. (The checkpoints are a copy of the regular ones of
  `saved_both`: a 2-process save of steps 1 and 2.)"""
  directory = str(tmp_path / "checkpoints")
  check = "tests/multiprocess_restore_check.py"
  shutil.copytree(saved_both[1], directory)
  parts = glob.glob(os.path.join(directory, "2", "state", "ocdbt.process_1", "d", "*"))
  assert parts, os.listdir(os.path.join(directory, "2", "state"))
  for part in parts:
    os.truncate(part, 1000)
  output = run_job([check, directory, "restore"])
  for p in ("0", "1"):
    assert f"[p{p}] process {p} restored step 1, data {{'step': 1}}, its shards as saved" \
        in output, output[-5000:]
  assert re.search(r"\[p0\] .*Checkpoint step 2 is unreadable \(process 1 could not read "
                   r"its part: ", output), output[-5000:]
  assert sorted(os.listdir(directory)) == ["1", "2.unreadable"]


def test_a_regular_and_a_best_checkpoint_of_one_step_save_together(saved_both):
  """Training saves a step's best checkpoint and then its regular one, both in
  the background. Orbax named both saves' barriers by the step alone, so a
  process that reached the second while the first still waited for another
  process failed the job ("Barrier _async_write_complete.1 is already ongoing").
  Here process 1 starts each step's saves a second late (`saved_both`)."""
  output, directory = saved_both
  for p in ("0", "1"):
    assert f"[p{p}] process {p} saved both" in output, output[-5000:]
  assert checkpoints.complete_steps(directory) == [1, 2]
  assert checkpoints.complete_steps(directory + "_best") == [1, 2]


def test_bad_input_stops_a_two_process_command_in_one_line_each(tmp_path):
  """A workdir that does not exist, given to evaluate in a 2-process job: each
  process says so in one line, as one process does, with no traceback."""
  missing = str(tmp_path / "nosuch")
  command, env = launch_command(["-m", "transformer.evaluate", f"--workdir={missing}"])
  out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=JOB_TIMEOUT_S + 60)
  output = out.stdout + out.stderr
  assert out.returncode == 1, output[-5000:]
  assert "Traceback" not in output, output[-5000:]
  assert re.search(rf"\[p[01]\] evaluate: error \(process [01] of 2\): .*{missing}", output), (
      output[-5000:])


# A command (train.py, or a module) with each process's own extra arguments,
# from $EXTRA_<process index>.
PER_PROCESS = (
    "import os, runpy, shlex, sys; target = sys.argv.pop(1); "
    "sys.argv = [target] + sys.argv[1:] + "
    "shlex.split(os.environ['EXTRA_' + os.environ['JAX_PROCESS_ID']]); "
    "(runpy.run_path if target.endswith('.py') else runpy.run_module)(target, run_name='__main__')")


@pytest.mark.parametrize("command,extra,error", [
    ("train", {"EXTRA_0": "--config.train.num_steps=6", "EXTRA_1": "--config.train.num_steps=12 "
               "--config.optim.learning_rate_scale=4.0 --config.data.prefetch=3"},
     r"the job's processes run different configs \(every process must give train.py the "
     r"same --config and overrides; only data.text_dir, data.tfds_data_dir, data.prefetch "
     r"may differ\): process 1: optim.learning_rate_scale=4.0 \(process 0: 1.0\), "
     r"train.num_steps=12 \(process 0: 6\)$"),
    ("train", {"EXTRA_0": "--workdir={tmp}/node0", "EXTRA_1": "--workdir={tmp}/node1"},
     r"--workdir .*node[01] is not one directory shared by the job's processes: process 1 did "
     r"not see the file process 0 wrote there \(.shared_by_the_job\); give every process "
     r"the same path on a shared filesystem, not node-local storage$"),
    ("evaluate", {"EXTRA_0": "--beam_size=2", "EXTRA_1": "--beam_size=3"},
     r"the job's processes were started with different arguments \(every process of the job "
     r"takes the same evaluate arguments\): process 1: arguments='--workdir=.*/w "
     r"--beam_size=3' \(process 0: '--workdir=.*/w --beam_size=2'\)$")])
def test_processes_given_other_arguments_or_workdirs_stop_before_any_work(
    data_dir, tmp_path, command, extra, error):
  """Processes given other overrides trained on each with its own (its learning
  rate's updates, a mixture saved) and exited 0, or hung for good in collectives
  that no longer matched (another num_steps); processes given node-local
  workdirs trained, then hung at the first checkpoint for Orbax's ten minutes;
  evaluate's processes given other beam sizes would decode other shapes. Each
  process now stops before any work, naming what differs."""
  target, args = {"train": ("train.py", [f"--config=tests/multiprocess_config.py:{data_dir}"]),
                  "evaluate": ("transformer.evaluate", [])}[command]
  workdir = [] if "workdir" in extra["EXTRA_0"] else [f"--workdir={tmp_path / 'w'}"]
  command_line, env = launch_command([sys.executable, "-c", PER_PROCESS, target, *args,
                                      *workdir])
  env.update({k: v.format(tmp=tmp_path) for k, v in extra.items()})
  out = subprocess.run(command_line, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=JOB_TIMEOUT_S + 60)
  output = out.stdout + out.stderr
  assert out.returncode == 1, output[-5000:]
  for index in (0, 1):
    lines = [l for l in output.splitlines()
             if l.startswith(f"[p{index}] {command}: error (process {index} of 2): ")]
    assert len(lines) == 1 and re.search(error, lines[0]), output[-5000:]
  assert not glob.glob(str(tmp_path / "*" / "checkpoints" / "*")), output[-5000:]


def test_average_checkpoints_in_two_processes_with_one_a_little_late(runs, tmp_path):
  """average_checkpoints in 2 processes, process 1 finishing its save 2 s after
  process 0: process 0 renamed the staged average away before process 1 checked
  it, and process 1 failed the job (CheckpointSaveError) after a correct average."""
  workdir = str(tmp_path / "average")
  shutil.copytree(runs["one"], workdir)
  output = run_job(["tests/multiprocess_average_check.py", f"--workdir={workdir}", "--last=3"])
  assert "[p0] averaged steps [10, 11, 12] into checkpoints_averaged/12" in output, (
      output[-5000:])
  assert checkpoints.complete_steps(os.path.join(workdir, "checkpoints_averaged")) == [12]
  assert not glob.glob(os.path.join(workdir, "checkpoints_averaged.*"))


def test_the_loss_over_many_batches_in_two_processes_equals_one_process():
  """The teacher-forced loss (evaluate's and training's evaluations) over 300
  batches, 2 processes of 2 devices against 1 process of 4: the same figures.
  The batches' programs are independent, and a CPU client ran several at once,
  so their all-reduces met across processes out of order: the job hung."""
  figures = {}
  for processes in (1, 2):
    output = run_job(["tests/multiprocess_eval_check.py", "300"], processes=processes,
                     devices=4 // processes)
    found = re.findall(r"process (\d) of \d: (.*)", output)
    assert len(found) == processes, output[-5000:]
    assert len({line for _, line in found}) == 1, found  # The processes agree.
    figures[processes] = found[0][1]
  assert figures[1] == figures[2]


@pytest.mark.long
def test_tensor_parallel_within_each_process_trains_as_one_process(data_dir, tmp_path):
  """--config.train.mesh=data=2,model=2 in 2 processes of 2 devices (each host
  holds one data row of the mesh, its heads split over its own 2 devices): the
  parameters of the same mesh in 1 process of 4 devices."""
  config = get_config(data_dir)
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  mesh = "--config.train.mesh=data=2,model=2"
  train(data_dir, one, 1, mesh)
  output = train(data_dir, two, 2, mesh)
  assert "mesh {'data': 2, 'model': 2}" in output
  a, data_a, _ = restore_params(two, config)
  b, data_b, _ = restore_params(one, config)
  assert data_a == data_b
  assert_params_close(a, b)


@pytest.mark.long
def test_evaluate_in_two_processes_scores_each_sentence_once(runs, tmp_path):
  """python -m transformer.evaluate in 2 processes: one JSON and one hypotheses
  file, written and announced by process 0, with the 1-process numbers, batches
  and hypotheses."""
  workdir = str(tmp_path / "eval")
  shutil.copytree(runs["two"], workdir)
  command = ["-m", "transformer.evaluate", f"--workdir={workdir}", "--mode=greedy",
             "--limit=40"]
  results = []
  for processes in (1, 2):
    output = run_job(command, processes=processes, devices=4 // processes)
    written = glob.glob(os.path.join(workdir, "eval_*"))
    assert sorted(os.path.basename(p) for p in written) == [
        "eval_test_latest_greedy-n40.json", "eval_test_latest_greedy-n40.txt"]
    assert len(re.findall(r"wrote \S+\.json", output)) == 1  # Process 0 alone.
    with open(next(p for p in written if p.endswith(".json"))) as f:
      results.append(json.load(f))
    with open(next(p for p in written if p.endswith(".txt"))) as f:
      results[-1]["hypotheses"] = f.read()
    for path in written:
      os.remove(path)
  one, two = results
  assert two["num_sentences"] == one["num_sentences"] == 40
  assert two["batches"] == one["batches"] and two["metrics"] == one["metrics"]
  assert two["perplexity"] == pytest.approx(one["perplexity"], rel=1e-5)  # Sums over hosts.
  assert two["hypotheses"] == one["hypotheses"] and two["hypotheses"].count("\n") == 40


def test_an_output_another_run_is_writing_stops_both_processes_at_once(runs, tmp_path):
  """A 2-process evaluate whose hypotheses file another run holds stops in both
  processes: process 0 on the BusyError, process 1 quoting it (not after the
  heartbeat timeout, waiting for process 0 in a collective); nothing is written."""
  workdir = str(tmp_path / "busy")
  shutil.copytree(runs["two"], workdir)
  partial = os.path.join(workdir, "eval_test_latest_greedy-n40.txt.partial")
  with open(partial, "a", encoding="utf-8") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    command, env = launch_command(["-m", "transformer.evaluate", f"--workdir={workdir}",
                                   "--mode=greedy", "--limit=40"])
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=JOB_TIMEOUT_S + 60)
  output = out.stdout + out.stderr
  assert out.returncode != 0, output[-3000:]
  assert f"another run is writing {partial}" in output, output[-3000:]
  assert ("opening the hypotheses file failed in process 0: BusyError: another run is "
          "writing") in output, output[-3000:]
  assert not glob.glob(os.path.join(workdir, "eval_*.json"))


def test_sigterm_ends_a_joined_process_that_is_not_training_at_once(monkeypatch):
  """evaluate, translate and average_checkpoints join a job without JAX's
  preemption service, which catches SIGTERM and, outside training's step sync
  points, drops it: the launcher's SIGTERM at its time limit ends them, where
  they ran on to its SIGKILL after the stop grace. The launcher's clock jumps
  to the time limit once both processes have joined (not 20 s of waiting)."""
  timeout_s, shift = 20, [0.0]

  class Output(io.StringIO):
    def write(self, text):
      written = super().write(text)
      if self.getvalue().count("] joined\n") == 2:
        shift[0] = timeout_s  # From now on the launcher's time is past its limit.
      return written

  monkeypatch.setattr(launch, "time", types.SimpleNamespace(
      monotonic=lambda: time.monotonic() + shift[0], sleep=time.sleep))
  out = Output()
  joined = ("from transformer import distributed; distributed.maybe_initialize(); "
            "print('joined', flush=True); import time; time.sleep(300)")
  code = launch.launch([sys.executable, "-c", joined], 2, timeout_s=timeout_s, stop_grace_s=60,
                       out=out, environ=dict(job_env(1), PYTHONPATH=ROOT))
  text = out.getvalue()
  assert code == 124 and text.count("] joined\n") == 2, text
  assert text.count("killed by SIGTERM (by the launcher)") == 2, text


def stop_process_1_mid_training(data_dir, workdir, sig, grace_s):
  """Starts a long 2-process training, sends `sig` to process 1 once it has logged
  step 3; (the launcher's output, seconds from the signal to the line saying that
  process 0 ended, the launcher's exit status)."""
  command, env = launch_command(["train.py", f"--config=tests/multiprocess_config.py:{data_dir}",
                                 f"--workdir={workdir}", "--config.train.num_steps=100000"])
  command.insert(command.index("--"), f"--grace_s={grace_s}")
  job = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
  watchdog = threading.Timer(JOB_TIMEOUT_S + 60, job.kill)  # Should the launcher hang.
  watchdog.start()
  lines, pids, sent_at, ended_after = [], {}, None, None
  try:
    for line in job.stdout:
      lines.append(line)
      found = re.match(r"\[launch\] process (\d+): pid (\d+)", line)
      if found:
        pids[int(found[1])] = int(found[2])
      if sent_at is None and re.match(r"\[p1\] .*\] \[3\] train/", line):
        os.kill(pids[1], sig)
        sent_at = time.monotonic()
      if (sent_at is not None and ended_after is None
          and re.match(r"\[launch\] process 0: |\[launch\] process 0 (exited|killed)", line)):
        ended_after = time.monotonic() - sent_at
    job.wait(timeout=60)
  finally:
    watchdog.cancel()
    if job.poll() is None:  # The launcher hung: its processes are ended here.
      job.kill()
      for pid in pids.values():
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
  output = "".join(lines)
  assert sent_at is not None and ended_after is not None, output[-5000:]
  return output, ended_after, job.returncode


def test_a_killed_process_ends_the_job_promptly(data_dir, tmp_path):
  """kill -9 of process 1 mid-training: process 0's next collective with it fails,
  and process 0 exits non-zero by itself, well within the launcher's grace
  period; the launcher names process 1 as the first failure."""
  output, ended_after, code = stop_process_1_mid_training(
      data_dir, tmp_path / "killed", signal.SIGKILL, grace_s=60)
  assert code == 128 + signal.SIGKILL, output[-5000:]
  assert "[launch] process 1: killed by SIGKILL\n" in output
  assert re.search(r"\[launch\] process 0: (exited with status [1-9]|killed by SIG\w+)\n",
                   output), output[-5000:]  # By itself: not "(by the launcher)".
  assert "[launch] failed: process 1 killed by SIGKILL first" in output
  heartbeat = get_config(data_dir).distributed.heartbeat_timeout_s
  assert ended_after < heartbeat + 20, ended_after


@pytest.mark.long
def test_a_hung_process_ends_the_job_within_the_heartbeat_timeout(data_dir, tmp_path):
  """A process that stops (SIGSTOP: alive, sockets open, silent) leaves process 0
  waiting in a collective; JAX's coordination service misses its heartbeats for
  config.distributed.heartbeat_timeout_s and ends process 0 (SIGABRT); the
  launcher then ends the stopped one."""
  output, ended_after, code = stop_process_1_mid_training(
      data_dir, tmp_path / "hung", signal.SIGSTOP, grace_s=1)
  heartbeat = get_config(data_dir).distributed.heartbeat_timeout_s
  assert "stopped sending heartbeats" in output, output[-5000:]
  assert "[launch] process 0: killed by SIGABRT\n" in output, output[-5000:]
  assert ("[launch] process 1 is stopped (SIGSTOP or a debugger): process 0 may have "
          "failed waiting for it\n") in output, output[-5000:]
  # Continued and told to end (SIGTERM), it may first take the service's error
  # (SIGABRT), or fail on its own with process 0 gone (status 1, seen under load).
  assert re.search(r"\[launch\] process 1: (killed by SIG\w+|exited with status [1-9]\d*) "
                   r"\(by the launcher\)", output), output[-5000:]
  assert code == 128 + signal.SIGABRT
  # Heartbeats go out every few seconds: the last one came up to that long before the stop.
  assert ended_after < heartbeat + 20, ended_after
