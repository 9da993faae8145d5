"""What training waits for at a step that decodes and saves: the best
checkpoint's write of the Multi30k recipe's state (8,000 pieces), timed from the
save's start to its end, `--repeats` times (the first also creates the folder).

  python -m benchmarks.best_save [--repeats 7]
"""
import argparse
import statistics
import tempfile
import time

import jax

from transformer import checkpoints, sharding, state as state_lib
from transformer.config import load_file


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args(argv)
  if args.repeats < 2:
    parser.error("--repeats must be >= 2 (the first save is left out of the median)")
  config = load_file("configs/multi30k.py", ["data.text_dir=unused"])
  mesh = sharding.make_mesh(jax.devices()[:1])
  model, tx, _, shardings, _ = state_lib.build(config, 8000, mesh)
  state = state_lib.init_state(model, tx, config, shardings)
  started, whole = [], []
  with tempfile.TemporaryDirectory() as directory:
    best = checkpoints.Checkpointer(directory + "/best", keep=1, best_metric="bleu")
    for i in range(1, args.repeats + 1):
      start = time.perf_counter()
      best.save(i * 100, state, {"index": i}, metrics={"bleu": float(i)})
      started.append(time.perf_counter() - start)
      best.wait()
      whole.append(time.perf_counter() - start)
    best.close()
  print(f"{state_lib.parameter_count(state.params):,} parameters")
  for name, seconds in (("save started", started), ("save written", whole)):
    print(f"{name}: median {statistics.median(seconds[1:]):.3f} s "
          f"({', '.join(f'{s:.3f}' for s in seconds)})")


if __name__ == "__main__":
  main()
