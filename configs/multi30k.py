"""Multi30k EN->DE (29k training pairs) from local text files, sized for an hour on a CPU.

  python train.py --config configs/multi30k.py --config.data.text_dir=../shared/data/multi30k
  python -m transformer.evaluate --workdir runs/multi30k --split test_2016_flickr
DE->EN: add --config.data.source_lang=de --config.data.target_lang=en.
"""

from configs import base


def get_config():
  config = base.get_config()
  config.model.num_layers = 3  # 3+3 layers of d_model 256: small data, small model.
  config.model.d_model = 256
  config.model.d_ff = 1024
  config.model.num_heads = 4  # d_k = 64 as in the paper.
  config.model.dropout = 0.3  # 29k pairs overfit quickly: the big model's P_drop.
  config.model.max_len = 128

  config.data.dataset = "parallel_text"  # {text_dir}/{split}.{lang}[.gz], one sentence a line.
  config.data.text_dir = "../shared/data/multi30k"  # Where the corpus is; override as needed.
  config.data.source_lang = "en"
  config.data.target_lang = "de"
  config.data.train_split = "train"
  config.data.eval_split = "val"  # Model selection on val only.
  config.data.test_split = "test_2016_flickr"  # Reported once at the end.
  config.data.vocab_type = "bpe"
  config.data.vocab_size = 8000  # Joint EN+DE BPE; small corpus, small vocabulary.
  config.data.max_length = 128
  config.data.batching = "pack"  # Little padding: packed rows with segment masks.
  config.data.pack_length = 128
  config.data.tokens_per_batch = 8192  # Target tokens per update (packed rows).

  config.optim.warmup_steps = 1000
  config.optim.learning_rate_scale = 1.0

  config.train.num_steps = 6000
  config.train.log_every = 100
  config.train.eval_every = 1000
  config.train.checkpoint_every = 500
  config.train.keep_checkpoints = 5  # The last 5 for averaging (section 6.1).
  return config
