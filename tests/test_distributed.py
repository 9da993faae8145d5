"""The job's topology read from the environment, with named errors; timeouts from
config.distributed. (Jobs of real processes: tests/test_multiprocess.py.)"""

import socket

import pytest

from transformer import distributed
from transformer.distributed import ADDRESS, COUNT, INDEX, Job, job_from_env

EXPLICIT = {ADDRESS: "127.0.0.1:1234", COUNT: "4", INDEX: "3"}


def test_no_variables_is_one_process():
  assert job_from_env({}) is None
  assert job_from_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
  assert job_from_env({**EXPLICIT, COUNT: "1", INDEX: "0"}) is None  # Nothing to join.


def test_explicit_variables_describe_the_job():
  assert job_from_env(EXPLICIT) == Job("127.0.0.1:1234", 4, 3, "environment")


def test_schedulers_are_left_to_jax_detection():
  slurm = {"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_STEP_NODELIST": "node[1-2]"}
  assert job_from_env(slurm) == Job(None, None, None, "slurm")
  # An sbatch script's own commands (no job step) and a one-task step are one process.
  batch_script = {k: v for k, v in slurm.items() if k != "SLURM_STEP_NODELIST"}
  assert job_from_env(batch_script) is None
  assert job_from_env({**slurm, "SLURM_STEP_NUM_TASKS": "1"}) is None
  assert job_from_env({"OMPI_COMM_WORLD_SIZE": "2"}) == Job(None, None, None, "ompi")
  # An explicit address (e.g. a chosen port) with the scheduler's count and id.
  assert job_from_env({**slurm, ADDRESS: "node1:5555"}) == Job("node1:5555", None, None,
                                                              "slurm")


def test_a_slurm_step_with_fewer_tasks_than_gpus_on_a_node_is_warned_of():
  """JAX gives each SLURM task the one GPU of its SLURM_LOCALID: one task on a
  node of 8 GPUs would use 1 of them."""
  node = {"SLURM_GPUS_ON_NODE": "8", "SLURM_NODEID": "1"}
  assert "8 GPUs and runs 1 task(s)" in distributed.slurm_idle_gpus(
      {**node, "SLURM_STEP_TASKS_PER_NODE": "1,1"})
  assert "7 will be idle" in distributed.slurm_idle_gpus(
      {**node, "SLURM_TASKS_PER_NODE": "1(x2)"})
  assert distributed.slurm_idle_gpus({**node, "SLURM_STEP_TASKS_PER_NODE": "8(x2)"}) is None
  # Uneven tasks per node: which entry is this node's is unknown, so no warning.
  assert distributed.slurm_idle_gpus({**node, "SLURM_TASKS_PER_NODE": "1,8"}) is None
  assert distributed.slurm_idle_gpus({"SLURM_TASKS_PER_NODE": "1(x2)"}) is None  # No GPUs.


@pytest.mark.parametrize("environ,message", [
    ({**EXPLICIT, INDEX: "4"}, "JAX_PROCESS_ID=4 is out of range for JAX_NUM_PROCESSES=4"),
    ({**EXPLICIT, INDEX: "-1"}, "JAX_PROCESS_ID=-1 must be >= 0"),
    ({**EXPLICIT, COUNT: "two"}, "JAX_NUM_PROCESSES='two' must be an integer"),
    ({**EXPLICIT, COUNT: "0"}, "JAX_NUM_PROCESSES=0 must be >= 1"),
    ({COUNT: "2", INDEX: "0"}, "JAX_NUM_PROCESSES is set but JAX_COORDINATOR_ADDRESS is not"),
    ({INDEX: "1"}, "JAX_PROCESS_ID is set but JAX_COORDINATOR_ADDRESS is not"),
    ({ADDRESS: "127.0.0.1:1234"}, "JAX_COORDINATOR_ADDRESS is set but JAX_NUM_PROCESSES"),
    ({ADDRESS: "127.0.0.1:1234", COUNT: "2"}, "but JAX_PROCESS_ID is not"),
    ({**EXPLICIT, ADDRESS: "127.0.0.1"}, "JAX_COORDINATOR_ADDRESS='127.0.0.1' must be host:port"),
    ({**EXPLICIT, ADDRESS: "::1:1234"}, r"'::1:1234' must be host:port.*IPv6 host in brackets"),
    ({**EXPLICIT, ADDRESS: "fe80::1"}, r"'fe80::1' must be host:port"),
    ({"SLURM_NTASKS": "many", "SLURM_PROCID": "0"}, "SLURM_NTASKS='many' must be an integer"),
])
def test_bad_settings_name_the_variable(environ, message):
  with pytest.raises(ValueError, match=message):
    job_from_env(environ)


def test_an_ipv6_coordinator_in_brackets_is_accepted():
  assert job_from_env({**EXPLICIT, ADDRESS: "[::1]:1234"}).coordinator_address == "[::1]:1234"


def test_timeouts_default_to_jax_for_configs_without_them():
  assert distributed.timeouts(None) == distributed.DEFAULT_TIMEOUTS
  assert distributed.timeouts({"heartbeat_timeout_s": 5})["heartbeat_timeout_s"] == 5


def test_one_process_runs_first_and_barriers_at_once():
  calls = []
  assert distributed.process_0_first(lambda: calls.append(1) or "done", "x") == "done"
  distributed.barrier("nothing to wait for")
  assert calls == [1]


def test_a_coordinator_port_in_use_is_one_line_not_a_crash(monkeypatch):
  """Process 0 starts the coordinator at the given port; a port another program
  holds crashed JAX (SIGSEGV) before this check. Other processes only connect."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    environ = {ADDRESS: f"127.0.0.1:{port}", COUNT: "2", INDEX: "0"}
    monkeypatch.setattr(distributed, "job_from_env", lambda: job_from_env(environ))
    with pytest.raises(distributed.JoinError,
                       match=rf"^JAX_COORDINATOR_ADDRESS=127.0.0.1:{port}: port {port} is in "
                       "use on this host, where process 0 starts the job's coordinator"):
      distributed.maybe_initialize()
    distributed.check_coordinator_port(job_from_env({**environ, INDEX: "1"}))
  distributed.check_coordinator_port(job_from_env(environ))  # Free again.


def test_a_job_that_cannot_be_joined_is_one_line(monkeypatch):
  """JAX's own failure (here a SLURM variable it lacks) becomes a CommandError,
  which the commands report in one line naming the job."""
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(distributed, "job_from_env", lambda: Job(None, None, None, "slurm"))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)

  def fails(*args, **kwargs):
    raise KeyError("SLURM_STEP_NODELIST")

  monkeypatch.setattr(jax.distributed, "initialize", fails)
  with pytest.raises(distributed.runtime.CommandError,
                     match=r"^could not join the multi-process job \(slurm: coordinator "
                     r"detected, process detected of detected\): KeyError: 'SLURM_STEP_NODELIST'"):
    distributed.maybe_initialize()
