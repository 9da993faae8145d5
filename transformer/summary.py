"""Parameter table of a config's model, or of a trained workdir's.

  python -m transformer.summary --config configs/base.py
  python -m transformer.summary --workdir runs/default

Prints a first line saying which vocabulary the embeddings are counted at, one
row per module (path, parameter shapes, count) and, last, the line `Total
parameters: N`. A config counts its data.vocab_size, which a trained word
vocabulary can fall short of (SCAN's has 23 of the 32 asked for), or the size of
data.vocab_path's vocabulary where it names one; a workdir counts its trained
vocabulary. Shapes come from jax.eval_shape: nothing is
allocated.
"""

import collections
import sys

from absl import flags
import jax
from ml_collections import config_flags

from transformer import runtime
from transformer import workdir as workdir_lib
from transformer.config import check_config, model_config, overridden_fields, unread_overrides
from transformer.data import tokenizer as tokenizer_lib
from transformer.state import parameter_shapes


def parameter_rows(params, depth: int = 3):
  """[(module path, [leaf shapes], count)] grouped by the first `depth` path parts."""
  rows = collections.OrderedDict()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = [p.key for p in path]
    module = "/".join(names[:-1][:depth])
    shapes, count = rows.get(module, ([], 0))
    rows[module] = (shapes + [tuple(leaf.shape)], count + leaf.size)
  return [(module, shapes, count) for module, (shapes, count) in rows.items()]


def format_table(rows) -> str:
  width = max(len(module) for module, _, _ in rows)
  lines = [f"{'module':<{width}}  {'parameters':>12}  shapes"]
  for module, shapes, count in rows:
    shown = " ".join("x".join(map(str, s)) for s in shapes)
    lines.append(f"{module:<{width}}  {count:>12,}  {shown}")
  total = sum(count for _, _, count in rows)
  lines.append(f"Total parameters: {total:,}")
  return "\n".join(lines)


def main(argv):
  del argv
  runtime.quiet_library_logs()
  with runtime.one_line_errors("summary"):  # A bad model field: one line naming it.
    workdir = flags.FLAGS.workdir
    config = flags.FLAGS.config
    if workdir == "":  # Was a traceback, or with --config that count, silently.
      raise ValueError("--workdir is empty; give a training workdir")
    if (config is None) == (workdir is None):
      raise ValueError("give --config or --workdir (one of them)")
    if workdir:
      config = workdir_lib.load_config(workdir)
      vocab_size = workdir_lib.load_tokenizer(workdir, config).vocab_size
      print(f"Embeddings at the trained vocabulary of {workdir}: {vocab_size} ids")
    else:
      check_config(config)  # As train.py does: a field named as given, not as derived.
      for field, why in unread_overrides(config, overridden_fields(sys.argv[1:])):
        print(f"summary: warning: --config.{field} {why}: the count is the model's "
              "without it", file=sys.stderr)
      vocab_size = tokenizer_lib.given_vocab_size(config.data) or 0
      if vocab_size:
        print(f"Embeddings at the vocabulary of data.vocab_path={config.data.vocab_path}: "
              f"{vocab_size} ids")
      elif config.data.get("vocab_path"):  # Training would stop on it, naming the field.
        print(f"Embeddings at data.vocab_size={config.data.vocab_size}: data.vocab_path="
              f"{config.data.vocab_path} is no readable vocabulary")
      else:
        print(f"Embeddings at data.vocab_size={config.data.vocab_size} (a trained word "
              "vocabulary can hold fewer: --workdir counts a trained model)")
    print(format_table(parameter_rows(parameter_shapes(model_config(config, vocab_size)))))


if __name__ == "__main__":
  # Defined here, not at import: a command that imports this module may have a
  # --config and a --workdir of its own.
  config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "A training workdir, instead of --config: its config "
                      "and trained vocabulary.")
  runtime.run(main, "summary")
