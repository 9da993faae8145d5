"""Transformer big (Table 3), WMT 2014 EN->DE with a shared 37k vocabulary.

  python train.py --config configs/big.py --workdir runs/big
"""

from configs import base


def get_config():
  config = base.get_config()
  config.model.d_model = 1024  # Table 3, big.
  config.model.d_ff = 4096  # Table 3, big.
  config.model.num_heads = 16  # Table 3, big: d_k = 64.
  config.model.dropout = 0.3  # Table 3, big (EN-DE; EN-FR used 0.1).
  config.train.num_steps = 300_000  # Section 5.2.
  # Every 10 minutes at the paper's 1.0 s a big step (5.2), the last 20 averaged (6.1):
  # a checkpoint every 600 steps, 11.4k steps from the first averaged
  # checkpoint to the last (12k counting the interval before the first).
  config.train.checkpoint_every = 600
  config.train.keep_checkpoints = 20
  return config
