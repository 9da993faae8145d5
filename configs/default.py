"""The embedded offline default: SCAN 'simple' (Lake & Baroni 2018) on a small model.

  python train.py --config configs/default.py
Generates SCAN in code (no download) and trains in minutes on a laptop CPU.
"""

from configs import base


def get_config():
  config = base.get_config()
  config.model.num_layers = 2  # A small model: SCAN needs little capacity.
  config.model.d_model = 128
  config.model.d_ff = 512
  config.model.num_heads = 4  # d_k = 32.
  config.model.dropout = 0.1
  config.model.max_len = 64  # SCAN commands are <= 9 words, actions <= 48 (+eos).

  config.data.dataset = "scan/simple"  # Random 80/20 split of the 20,910 commands.
  config.data.source_lang = "commands"  # SCAN's two sides (ignored by the builder's keys).
  config.data.target_lang = "actions"
  config.data.eval_split = "test"  # SCAN has no validation split.
  config.data.test_split = "test"
  config.data.vocab_type = "word"  # A word-level vocabulary through SentencePiece.
  config.data.vocab_size = 32  # At most; SCAN has 13 command and 6 action words.
  config.data.max_length = 64
  config.data.batching = "pack"  # SCAN sources are short: packing avoids padding them.
  config.data.tokens_per_batch = 4096  # Per update, source and target counted apart.
  config.data.pack_length = 64  # About 4 examples (15 actions on average) a row ...
  config.data.pack_source_length = 40  # ... whose commands average 8 words.

  config.optim.warmup_steps = 400  # Short run, short warmup.
  config.optim.learning_rate_scale = 1.0  # Peak lr = 128^-0.5 * 400^-0.5 = 4.4e-3.

  config.train.num_steps = 3000  # ~15 minutes on 2 CPU cores; 2000 gave 96.8% exact match.
  config.train.log_every = 50
  config.train.eval_every = 500
  config.train.decode_every = 1000  # Exact match of greedy decoding, as well as the loss.
  config.train.decode_examples = 1000
  config.train.checkpoint_every = 250
  config.train.keep_checkpoints = 5  # The last 5 for average_checkpoints --last 5.
  return config
