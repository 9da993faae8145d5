"""The reduced Table 3 run on the 2-core CPU (README, "Sweeps"): one
or two rows of each of the paper's groups, and the three other attention scores.

  python -m transformer.sweep --sweep configs/sweeps/table3_cpu.py --workdir runs/table3_cpu \
      --set train.num_steps=200 --set optim.warmup_steps=100 \
      --set optim.learning_rate_scale=0.32
  python -m transformer.sweep --sweep configs/sweeps/table3_cpu.py --workdir runs/table3_cpu \
      --collect

The budget is the same for every row: 200 steps of 4,096 target tokens (~1 epoch
of Multi30k), warmup 100 with the peak learning rate of configs/multi30k.py
(0.32 * 256^-0.5 * 100^-0.5 = 2.0e-3).
"""

from configs.sweeps import table3

BASE = table3.BASE
ROWS = ("A-h1", "A-h16", "B-dk16", "C-N2", "C-dff2048", "D-drop0", "D-ls0", "E-learned",
        "score-dot", "score-additive", "score-general")


def get_sweep(base):
  made = table3.get_sweep(base)
  variants = [(name, overrides) for name, overrides in made if name in ROWS]
  missing = sorted(set(ROWS) - {name for name, _ in variants})
  if missing:  # table3 names rows after the values they run with, which scale with the base.
    group = lambda name: name.split("-")[0]
    here = [name for name, _ in made if group(name) in {group(m) for m in missing}]
    raise ValueError(f"rows {', '.join(missing)} are not variants of table3 on this base "
                     f"(its rows of {'those groups' if len(missing) > 1 else 'that group'} "
                     f"here: {', '.join(here) or 'none'}); edit ROWS in "
                     "configs/sweeps/table3_cpu.py for it")
  return variants
