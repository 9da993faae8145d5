"""Run by tests/test_multiprocess.py as each process of a job: the teacher-forced
loss (steps.evaluate_loss) of a tiny random model over many small batches,
which `evaluate` and training's evaluations run the same way. Each process
prints the figures, to be compared with one process's.

  python tests/multiprocess_eval_check.py BATCHES
"""

import sys

import jax
import numpy as np

sys.path.insert(0, ".")
from tests.helpers import tiny_experiment  # pylint: disable=g-import-not-at-top
from transformer import distributed, sharding, state as state_lib, steps


def main(batches):
  distributed.maybe_initialize({"heartbeat_timeout_s": 10})
  config = tiny_experiment("unused")
  config.data.tokens_per_batch = 64  # 8 rows of 8 tokens: many batches.
  rng = np.random.default_rng(0)
  # Sources and targets of 3-6 tokens (ids 3-19): each batch holds 8 examples.
  examples = [(rng.integers(3, 20, rng.integers(3, 7)).tolist(),
               rng.integers(3, 20, rng.integers(3, 7)).tolist())
              for _ in range(8 * int(batches))]
  mesh = sharding.make_mesh(spec=config.train.mesh)
  model, tx, _, shardings, _ = state_lib.build(config, 20, mesh)
  params = state_lib.init_state(model, tx, config, shardings).params
  _, eval_fn = steps.compile_steps(model, tx, config, mesh, shardings)
  metrics = steps.evaluate_loss(eval_fn, params, examples, config, mesh)
  print(f"process {jax.process_index()} of {jax.process_count()}: "
        f"{', '.join(f'{k}={v:.6f}' for k, v in sorted(metrics.items()))}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
