"""Joining a multi-process job: several hosts, or several processes on one.

Who the processes are comes from the environment, not from the config: the
config is saved in the workdir and read by every process and by later
`evaluate` runs, while the topology belongs to one launch.

  JAX_COORDINATOR_ADDRESS=host:port  process 0's address, reachable from every process
  JAX_NUM_PROCESSES=N                the number of processes in the job
  JAX_PROCESS_ID=i                   this process, 0 <= i < N

(JAX reads the address itself; the other two are this project's, named like
it.) Without them, a job that SLURM (srun, more than one task), Open MPI
(mpirun, more than one rank) or a Cloud TPU VM describes is joined through
JAX's own detection of it; anything else runs as one process. How long to wait
for the other processes is config.distributed (configs/base.py).
"""

import contextlib
import dataclasses
import errno
import json
import os
import secrets
import shlex
import socket
import sys
import traceback
from typing import Optional

from absl import logging
import jax
import numpy as np

from transformer import preemption, runtime, sigterm

ADDRESS, COUNT, INDEX = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
# JAX's own defaults; a config (or a workdir's config.json) without the section gets them.
DEFAULT_TIMEOUTS = {"initialization_timeout_s": 300, "heartbeat_timeout_s": 100,
                    "shutdown_timeout_s": 300}


@dataclasses.dataclass(frozen=True)
class Job:
  """A multi-process job; a None field is left to JAX's detection of the scheduler."""
  coordinator_address: Optional[str]
  num_processes: Optional[int]
  process_id: Optional[int]
  described_by: str  # environment (the variables above) | slurm | ompi | tpu


class JoinError(runtime.CommandError):
  """The job the environment describes could not be joined (one line: the cause
  is in the environment or the network, not in the code)."""


def _int(environ, name):
  value = environ.get(name)
  if value in (None, ""):
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"{name}={value!r} must be an integer") from None


def _on_cloud_tpu_vm() -> bool:
  # Set by JAX at import on a TPU VM with libtpu; no public API says so.
  from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
  return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def scheduler(environ) -> Optional[str]:
  """The scheduler that describes a multi-process job here, if any: JAX reads the
  process count, id and coordinator from it (JAX's cluster names). SLURM's is a
  job step (srun) of more than one task: an sbatch script itself (its
  SLURM_NTASKS the allocation's, no SLURM_STEP_NODELIST, which JAX reads the
  coordinator from) runs its commands as one process."""
  tasks = _int(environ, "SLURM_STEP_NUM_TASKS") or _int(environ, "SLURM_NTASKS") or 1
  if tasks > 1 and "SLURM_PROCID" in environ and "SLURM_STEP_NODELIST" in environ:
    return "slurm"
  if (_int(environ, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return "ompi"
  if environ is os.environ and _on_cloud_tpu_vm():
    return "tpu"
  return None


def _tasks_per_node(value: str) -> list:
  """SLURM's tasks-per-node list, "8(x2),4" -> [8, 8, 4]."""
  counts = []
  for part in value.split(","):
    count, _, times = part.partition("(x")
    counts += [int(count)] * int(times.rstrip(")") or 1)
  return counts


def slurm_idle_gpus(environ) -> Optional[str]:
  """A warning where a SLURM job step runs fewer tasks on this node than the
  node has GPUs: JAX gives each task one GPU (SLURM_LOCALID's), so the others
  would sit idle without a word. None where that is not the case or unknown."""
  try:
    gpus = int(environ["SLURM_GPUS_ON_NODE"])
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ["SLURM_TASKS_PER_NODE"]
    counts = set(_tasks_per_node(per_node))
  except (KeyError, ValueError):
    return None
  if len(counts) != 1:  # Which entry is this node's is not known here: no guess.
    return None
  tasks = counts.pop()
  if tasks >= gpus:
    return None
  return (f"this node has {gpus} GPUs and runs {tasks} task(s) of the job step; JAX "
          f"gives each task one GPU, so {gpus - tasks} will be idle: run one task per "
          f"GPU (srun --ntasks-per-node={gpus})")


def job_from_env(environ=None) -> Optional[Job]:
  """The job the environment describes, or None for a single process; a bad or
  incomplete setting is a ValueError naming the variable."""
  environ = os.environ if environ is None else environ
  address = environ.get(ADDRESS) or None
  count, index = _int(environ, COUNT), _int(environ, INDEX)
  managed = scheduler(environ)
  if address is not None:
    host, _, port = address.rpartition(":")
    ipv6_unbracketed = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or ipv6_unbracketed:
      raise ValueError(f"{ADDRESS}={address!r} must be host:port, the address of process 0 "
                       "(an IPv6 host in brackets: [::1]:1234)")
  if count is not None and count < 1:
    raise ValueError(f"{COUNT}={count} must be >= 1")
  if index is not None and index < 0:
    raise ValueError(f"{INDEX}={index} must be >= 0")
  if address is None and (count is not None or index is not None):
    raise ValueError(f"{COUNT if count is not None else INDEX} is set but {ADDRESS} is "
                     "not: every process needs host:port of process 0")
  if count is not None and index is not None and index >= count:
    raise ValueError(f"{INDEX}={index} is out of range for {COUNT}={count} "
                     f"(ids are 0 to {count - 1})")
  if address is not None and managed is None:
    for name, value in ((COUNT, count), (INDEX, index)):
      if value is None:
        raise ValueError(f"{ADDRESS} is set but {name} is not (and no SLURM, Open MPI "
                         "or TPU environment gives it)")
  if (address is None and managed is None) or count == 1:
    return None
  return Job(address, count, index, "environment" if managed is None else managed)


def check_coordinator_port(job: Job) -> None:
  """JoinError where this process starts the coordinator (process 0 of a job
  whose address is given) and its port is taken on this host: JAX's gRPC
  server then fails to bind and the process dies of a segmentation fault."""
  if job.coordinator_address is None or job.process_id != 0:
    return
  port = int(job.coordinator_address.rpartition(":")[2])
  if port_in_use(port):
    raise JoinError(f"{ADDRESS}={job.coordinator_address}: port {port} is in use on this "
                    "host, where process 0 starts the job's coordinator; choose a free port")


def port_in_use(port: int) -> bool:
  """Whether binding `port` as JAX's coordinator binds it ('[::]', all
  interfaces; IPv4 where IPv6 is off) fails because it is taken."""
  for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
    try:
      probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      continue
    with probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        probe.bind((host, port))
      except OSError as e:
        if e.errno == errno.EADDRINUSE:
          return True
        continue
      return False
  return False


def timeouts(settings=None) -> dict:
  """config.distributed's timeouts in seconds, JAX's defaults for any missing
  (`settings`: a ConfigDict, a dict or None)."""
  settings = dict(settings or {})
  return {k: int(settings.get(k, v)) for k, v in DEFAULT_TIMEOUTS.items()}


def maybe_initialize(settings=None, stop_at_sync_points: bool = False) -> Optional[Job]:
  """Joins the job the environment describes (see above) before JAX starts its
  backends; returns it, or None for one process. `settings`: config.distributed.

  With `stop_at_sync_points` (training), JAX's preemption service takes SIGTERM
  and stops every process at a step they all reach (transformer/preemption.py).
  Without it, a command that reaches no such point (evaluate, translate,
  average_checkpoints) keeps SIGTERM's default action: the service would catch
  the signal and drop it, so scancel, timeout or the launcher could not stop it."""
  job = job_from_env()
  if job is None or jax.distributed.is_initialized():
    return job
  jax.config.update("jax_enable_preemption_service", stop_at_sync_points)
  check_coordinator_port(job)
  wait = timeouts(settings)
  # Cross-process collectives on the CPU backend need an implementation: gloo is
  # JAX's default in the version pinned here, none in older ones. It changes
  # nothing on accelerators (their collectives are their own), so any platform
  # gets it where none was chosen (JAX_CPU_COLLECTIVES_IMPLEMENTATION=mpi is kept).
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  detection = job.described_by if job.described_by in ("slurm", "ompi") else None
  where = (f"{job.described_by}: coordinator {job.coordinator_address or 'detected'}, "
           f"process {'detected' if job.process_id is None else job.process_id} of "
           f"{job.num_processes or 'detected'}")
  # Said first: when the others never come, JAX aborts the process (DEADLINE_EXCEEDED
  # in RegisterTask) after initialization_timeout_s, raising nothing to add this to.
  logging.info("Joining a multi-process job (%s); waiting up to "
               "config.distributed.initialization_timeout_s=%d s for all.",
               where, wait["initialization_timeout_s"])
  try:
    jax.distributed.initialize(
        job.coordinator_address, job.num_processes, job.process_id,
        cluster_detection_method=detection,
        initialization_timeout=wait["initialization_timeout_s"],
        heartbeat_timeout_seconds=wait["heartbeat_timeout_s"],
        shutdown_timeout_seconds=wait["shutdown_timeout_s"])
  except Exception as e:  # pylint: disable=broad-except
    raise JoinError(f"could not join the multi-process job ({where}): "
                    f"{type(e).__name__}: {runtime.first_line(e)}") from e
  logging.info("Process %d of %d joined.", jax.process_index(), jax.process_count())
  if stop_at_sync_points:  # JAX's notifier has SIGTERM now (transformer/preemption.py).
    sigterm.hand_over(restore_default=False)
  if job.described_by == "slurm" and (idle := slurm_idle_gpus(os.environ)):
    logging.warning("SLURM: %s.", idle)
  return job


def barrier(name: str) -> None:
  """Returns once every process has called it with this `name`; nothing to wait
  for with one process."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def gather_messages(message: str, limit: int = 400) -> list:
  """Every process's `message` (its first `limit` bytes), in process order: one
  collective that every process calls, so that what one process alone saw (a
  file it could not read, say) becomes what all of them act on, instead of each
  going its own way into the next collective."""
  if jax.process_count() == 1:
    return [message]
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = np.frombuffer(message.encode()[:limit].ljust(limit, b"\0"), np.uint8)
  rows = multihost_utils.process_allgather(data)
  return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in np.asarray(rows)]


class JobError(runtime.CommandError):
  """Bad input that every process of a job found together, through a collective,
  and raises at the same point: each says so before any exits
  (exit_at_once_on_error), where the first to exit would take the others down
  before they had."""


def differences(values: dict) -> list:
  """Where the job's processes' `values` (a flat dict of JSON values, each
  process its own) differ from process 0's, one 'process i: field=value
  (process 0: value)' a process, five fields at most; [] in one process. Every
  process calls it (two collectives) and gets the same list."""
  if jax.process_count() == 1:
    return []
  text = json.dumps(values, sort_keys=True)
  size = max(int(n) for n in gather_messages(str(len(text.encode()))))
  everyone = [json.loads(t) for t in gather_messages(text, limit=size)]
  found = []
  for index, theirs in enumerate(everyone[1:], 1):
    fields = sorted(f for f in set(everyone[0]) | set(theirs)
                    if everyone[0].get(f) != theirs.get(f))
    if fields:
      found.append(f"process {index}: " + ", ".join(
          f"{f}={theirs.get(f)!r} (process 0: {everyone[0].get(f)!r})" for f in fields[:5])
          + (f" and {len(fields) - 5} more" if len(fields) > 5 else ""))
  return found


def check_same_arguments(command: str, argv) -> None:
  """Stops every process of a `command` job whose processes were given other
  arguments (another --beam_size decodes other shapes, and the collectives
  that no longer match wait forever)."""
  found = differences({"arguments": shlex.join(argv)})
  if found:
    raise JobError(f"the job's processes were started with different arguments (every "
                   f"process of the job takes the same {command} arguments): "
                   + "; ".join(found))


SHARED_CHECK = ".shared_by_the_job"  # Written by process 0, read by the others, removed.


def check_shared_directory(directory: str, what: str) -> None:
  """Stops every process of a job whose processes do not see one `directory`
  (node-local storage given as the workdir, say), naming those that do not:
  process 0 writes a random token there and the others read it back. Without
  the check each process trained on as if alone, and the first checkpoint
  waited for the others' files until Orbax's ten-minute timeout, then hung."""
  if jax.process_count() == 1:
    return
  path = os.path.join(directory, SHARED_CHECK)
  token, problem = "", ""
  if jax.process_index() == 0:
    token = secrets.token_hex(16)
    try:
      with open(path, "w") as f:
        f.write(token)
    except OSError as e:
      token, problem = "", f"cannot write {path}: {e}"
  token = gather_messages(token)[0]
  if jax.process_index() != 0 and token:
    try:
      with open(path) as f:
        seen = f.read()
    except OSError:
      seen = None
    if seen != token:
      problem = "does not see it"
  problems = gather_messages(problem)  # The others have read it: process 0 may remove it.
  if jax.process_index() == 0 and token:
    with contextlib.suppress(OSError):
      os.remove(path)
  blind = [i for i, p in enumerate(problems) if p == "does not see it"]
  if blind:
    raise JobError(
        f"{what} {directory} is not one directory shared by the job's processes: process"
        f"{'es' if len(blind) > 1 else ''} {', '.join(map(str, blind))} did not see the file "
        f"process 0 wrote there ({SHARED_CHECK}); give every process the same path on a "
        "shared filesystem, not node-local storage")
  if problems[0]:
    raise JobError(f"process 0: {problems[0]}")


def process_0_only(fn, what: str):
  """fn() in process 0, None in the others; where it raises, every process
  raises: process 0 its error, the others a CommandError quoting it. One
  process's failure (opening an output that another run is writing, say) then
  ends the job at once, not after the others' heartbeat timeout while they
  wait for it in the next collective."""
  if jax.process_count() == 1:
    return fn()
  result, error = None, None
  if jax.process_index() == 0:
    try:
      result = fn()
    except Exception as e:  # pylint: disable=broad-except
      error = e
  message = gather_messages("" if error is None else f"{type(error).__name__}: {error}")[0]
  if error is not None:
    raise error
  if message:
    raise runtime.CommandError(f"{what} failed in process 0: {message}")
  return result


def process_0_first(fn, name: str):
  """fn() in process 0, then in the others once process 0 has returned: what
  process 0 prepares and writes into a shared directory (a TFDS dataset, the
  vocabulary), the others load instead of preparing it at the same time."""
  if jax.process_index() == 0:
    result = fn()
    barrier(name)
    return result
  barrier(name)
  return fn()


@contextlib.contextmanager
def exit_at_once_on_error(command: str, one_line=()):
  """In a multi-process job, a process that fails prints the error and exits at
  once, status 1: a normal exit would first wait for the others at JAX's
  shutdown barrier (up to shutdown_timeout_s), while they wait for it in a
  collective. Its death then ends them within heartbeat_timeout_s. Bad input
  (runtime.ONE_LINE_ERRORS and `one_line`) prints one line, as runtime.one_line_errors
  does in one process; anything else its traceback. A preemption stop is no
  failure: every process stops after the same step, and they exit together."""
  try:
    yield
  except preemption.Preempted:
    raise
  except (Exception, KeyboardInterrupt) as e:  # pylint: disable=broad-except
    if not jax.distributed.is_initialized() or jax.process_count() == 1:
      raise
    where = f"process {jax.process_index()} of {jax.process_count()}"
    if isinstance(e, runtime.ONE_LINE_ERRORS + tuple(one_line)):
      logging.debug("%s stopped on", command, exc_info=True)
      sys.stderr.write(f"{command}: error ({where}): {e}\n")
    else:
      sys.stderr.write(f"{where} failed:\n" + traceback.format_exc())
    sys.stderr.flush()
    sys.stdout.flush()
    if isinstance(e, JobError):  # Every process raised it: each has said so before any exits.
      with contextlib.suppress(Exception):
        barrier(f"{command}: error said")
    os._exit(1)  # pylint: disable=protected-access
