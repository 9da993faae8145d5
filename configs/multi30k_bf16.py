"""The Multi30k recipe (configs/multi30k.py) with bfloat16 compute: the same model,
data, schedule and steps, for a 2-core CPU where bfloat16 products run faster.

  python train.py --config configs/multi30k_bf16.py [--config.data.text_dir=DIR]
  python -m transformer.evaluate --workdir runs/multi30k_bf16 --split test_2016_flickr --mode beam
DE->EN: --config configs/multi30k_bf16.py:de-en. Measured results: README.

Parameters, softmax, logits and the loss stay float32 (transformer/mixed_precision.py);
the Dense products take bfloat16 inputs and accumulate in float32, which XLA's CPU
backend runs at about twice the float32 rate even without bfloat16 instructions
(benchmarks/README.md, session 5).
"""

from configs import multi30k


def get_config(direction="en-de"):
  config = multi30k.get_config(direction)
  config.model.dtype = "bfloat16"
  return config
