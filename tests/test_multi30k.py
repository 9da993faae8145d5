"""The Multi30k recipe loads the shared corpus, tokenizes it and trains a few steps.

Skipped only when the corpus is absent: it lives beside the checkout in
../shared/data/multi30k (or wherever MULTI30K_DIR points), never in the repo.
"""

import json
import os

import numpy as np
import pytest

from configs import multi30k
from transformer import training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("MULTI30K_DIR", os.path.join(ROOT, "..", "shared", "data", "multi30k"))


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train.en.gz")),
                    reason=f"Multi30k not found at {DATA}")
def test_multi30k_config_trains_a_few_steps(tmp_path):
  config = multi30k.get_config()
  config.data.text_dir = DATA
  config.data.tokens_per_batch = 2048  # Fewer tokens a step: this is a smoke run.
  config.train.num_steps = 3
  config.train.decode_every = 0
  metrics = training.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(metrics["loss"]) and metrics["tokens"] > 10000  # val: ~1k sentences
  assert os.path.getsize(tmp_path / "spm.model") > 0
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["data"]["dataset"] == "parallel_text"
