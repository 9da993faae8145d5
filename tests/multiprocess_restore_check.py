"""Run by tests/test_multiprocess.py as each process of a job: saves, or
restores, checkpoints of one array split over every device of the job, so that
each process writes and reads its own part of it.

  python tests/multiprocess_restore_check.py DIRECTORY save|restore
"""

import sys

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
  if phase == "save":
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
