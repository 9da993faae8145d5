"""Run by tests/test_multiprocess.py as each process of a job: saves, or
restores, checkpoints of one array split over every device of the job, so that
each process writes and reads its own part of it; or (`both`) saves each step
as a regular and a best checkpoint at once, as training does where a better
decode score falls on a checkpoint step, process 1 a second behind.

  python tests/multiprocess_restore_check.py DIRECTORY save|restore|both
"""

import sys
import time

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

sys.path.insert(0, ".")
from transformer import checkpoints, distributed  # pylint: disable=g-import-not-at-top


def values(step):
  """Step `step`'s array: random, so that its files do not compress to nothing."""
  return np.random.default_rng(step).normal(size=(8, 4096)).astype(np.float32)


def main(directory, phase):
  distributed.maybe_initialize({"heartbeat_timeout_s": 10})
  sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
  state = lambda step: {"w": jax.make_array_from_callback(
      (8, 4096), sharding, lambda index: values(step)[index])}
  checkpointer = checkpoints.Checkpointer(directory, keep=5)
  if phase == "both":
    best = checkpoints.Checkpointer(directory + "_best", keep=5, best_metric="score")
    for step in (1, 2):
      if jax.process_index() == 1:
        time.sleep(1)  # Process 0 meanwhile waits on both saves' barriers.
      best.save(step, state(step), {"step": step}, metrics={"score": float(step)})
      checkpointer.save(step, state(step), {"step": step})
    best.close()
    print(f"process {jax.process_index()} saved both", flush=True)
  elif phase == "save":
    for step in (1, 2):
      checkpointer.save(step, state(step), {"step": step})
  else:
    restored, data_state, step = checkpointer.restore(state(0), {"w": sharding})
    for shard in restored["w"].addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), values(step)[shard.index])
    print(f"process {jax.process_index()} restored step {step}, data {data_state}, "
          "its shards as saved", flush=True)
  checkpointer.close()


if __name__ == "__main__":
  main(*sys.argv[1:])
