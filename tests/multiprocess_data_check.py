"""Run by tests/test_multiprocess.py, alone or as each process of a job: builds the
training data as train_and_evaluate does (training.load_data), places every batch of
the first epoch on the mesh (each process its own rows), gathers the global arrays
the train step sees, and (process 0) writes them to an .npz file, with the training
examples tokenized anew as what they must hold.

  python tests/multiprocess_data_check.py DATA_DIR WORKDIR OUT.npz
"""

import sys

import jax
from jax.experimental import multihost_utils
import numpy as np

sys.path.insert(0, ".")
from tests.multiprocess_config import get_config  # pylint: disable=g-import-not-at-top
from transformer import data as data_lib, distributed, sharding, training


def main(data_dir, workdir, out):
  config = get_config(data_dir)
  distributed.maybe_initialize(config.distributed)
  mesh = sharding.make_mesh()
  data = training.load_data(config, workdir, mesh)
  arrays = {}
  for i in range(10**6):
    batch = next(data.train_batches)
    if data.train_batches.get_state()["epoch"] > 0:  # The first batch of epoch 1.
      break
    placed = sharding.place_batch(batch, mesh)
    for key, value in placed.items():
      arrays[f"{i}/{key}"] = multihost_utils.process_allgather(value, tiled=True)
  data.train_batches.close()
  pairs = data_lib.load_pairs(config.data, config.data.train_split)
  examples, _ = data_lib.tokenize_pairs(pairs, data.tokenizer, config.data.max_length,
                                        config.data.overlong)
  if jax.process_index() == 0:
    np.savez(out, **arrays,
             examples=np.array([f"{s.tolist()}|{t.tolist()}" for s, t in examples]))
  print(f"process {jax.process_index()} of {jax.process_count()}: {i} batches")


if __name__ == "__main__":
  main(*sys.argv[1:])
