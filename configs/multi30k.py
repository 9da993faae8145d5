"""Multi30k EN->DE (29k training pairs) from local text files, sized for an hour on a CPU.

  python train.py --config configs/multi30k.py [--config.data.text_dir=DIR]
  python -m transformer.evaluate --workdir runs/multi30k --split val --mode beam
  python -m transformer.evaluate --workdir runs/multi30k --split test_2016_flickr --mode beam
DE->EN, the same recipe the other way: --config configs/multi30k.py:de-en (runs/multi30k_de-en).
Measured on a 2-core CPU: 56 min, test_2016_flickr sacreBLEU 37.6 (beam 4); after the
faster step, 40 min and 37.2; DE->EN 38.1 (63 min, partly shared). On an AVX-512 CPU
(session 11): 20 min and 36.6; with --config.train.num_steps=1550 and the average of the
last 5 checkpoints, 24.5 min and 37.5; the same in bfloat16 (--config.model.dtype=bfloat16,
on a CPU with AVX-512 BF16), 17.5 min and 38.6; on an Intel Xeon with AMX (session 12),
24.4 min and 37.8; in float32 on an AVX2-only EPYC (session 13), 50.5 min and 37.6.
DE->EN, 1550 steps in bfloat16 and the average of the last 5 (an AVX-512 BF16 EPYC,
session 14): 33 min, 39.8. EN->DE in bfloat16 after session 15's faster bfloat16 gradients,
on the same CPU model: 26 min, 38.3; with --config.train.num_steps=1450, 23 min and 37.6.
Those runs packed rows of 128 tokens; with rows of 64 (the default since session 45), the
1450-step bfloat16 recipe took 19.6 min on an Intel Xeon with AMX, 38.0. See README.
"""

from configs import base


def get_config(direction="en-de"):
  """`direction` comes after the file name: `--config configs/multi30k.py:de-en`."""
  source_lang, _, target_lang = direction.partition("-")
  if {source_lang, target_lang} != {"en", "de"}:
    raise ValueError(f"multi30k direction must be 'en-de' or 'de-en', got {direction!r}.")
  config = base.get_config()
  # The Flax WMT example's design: 3+3 layers, d_model 256. (4+4 at d_model 128 runs
  # 1.7x more tokens/s here but reached only 10 BLEU (greedy, val) in 1000 steps.)
  config.model.num_layers = 3
  config.model.d_model = 256
  config.model.d_ff = 1024
  config.model.num_heads = 4  # d_k = 64 as in the paper.
  config.model.dropout = 0.2  # ~11 epochs of 29k pairs: more than base's 0.1.
  config.model.max_len = 128

  config.data.dataset = "parallel_text"  # {text_dir}/{split}.{lang}[.gz], one sentence a line.
  config.data.text_dir = "../shared/data/multi30k"  # Where the corpus is; override as needed.
  config.data.source_lang = source_lang  # en | de (the direction argument).
  config.data.target_lang = target_lang
  config.data.train_split = "train"
  config.data.eval_split = "val"  # Model selection on val only.
  config.data.test_split = "test_2016_flickr"  # evaluate's default split, sweep --collect's test column.
  config.data.vocab_type = "bpe"
  config.data.vocab_size = 8000  # Joint EN+DE BPE; small corpus, small vocabulary.
  config.data.max_length = 128
  config.data.batching = "pack"  # Little padding: packed rows with segment masks.
  # Every Multi30k pair fits a row of 64 (the longest: 58 BPE tokens with EOS), and a
  # shorter row attends over fewer positions: 1.06-1.09x the tokens/s of rows of 128
  # (benchmarks/README.md, session 45).
  config.data.pack_length = 64
  config.data.tokens_per_batch = 4096  # Target tokens per update (64 packed rows).

  config.decode.tokens_per_batch = 512  # 32 sentences of <= 16 tokens: beam 4 is fastest here.

  config.optim.warmup_steps = 500  # A short run: reach the peak by a third of it.
  config.optim.learning_rate_scale = 0.7  # Peak lr = 0.7 * 256^-0.5 * 500^-0.5 = 2.0e-3.

  config.train.num_steps = 1300  # ~40 min on the 2-core CPU, evaluations included; ~11 epochs.
  config.train.log_every = 50
  config.train.eval_every = 300
  config.train.decode_every = 300  # Greedy BLEU on the whole val split: the BLEU curve.
  config.train.decode_examples = 0
  config.train.checkpoint_every = 100
  config.train.keep_checkpoints = 5  # The last 5 (400 steps) for averaging (section 6.1).
  return config
