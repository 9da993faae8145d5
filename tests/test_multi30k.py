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
@pytest.mark.long  # Trains the 8k vocabulary and scores all of val: ~40 s.
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


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train.en.gz")),
                    reason=f"Multi30k not found at {DATA}")
def test_every_reference_survives_encode_and_decode():
  """What BLEU compares: the references as written and the model's detokenized
  output. Every val and test reference (EN, DE and FR, which the vocabulary never
  saw) must come back from decode(encode(reference)) unchanged, up to runs of
  spaces (which sacreBLEU's tokenizer ignores)."""
  from transformer.data import parallel_text, tokenizer  # pylint: disable=g-import-not-at-top
  train = parallel_text.load_split(DATA, "train", "en", "de")[:3000]
  tok = tokenizer.train([t for pair in train for t in pair], "bpe", 2000)
  checked = 0
  for split in ("val", "test_2016_flickr"):
    for pair in parallel_text.load_split(DATA, split, "en", "fr")[:500]:
      for reference in pair:
        assert tok.decode(tok.encode(reference)) == " ".join(reference.split()), reference
        checked += 1
  assert checked == 2 * 2 * 500


def test_direction_argument_flips_the_pair_and_rejects_others():
  ende, deen = multi30k.get_config(), multi30k.get_config("de-en")
  assert (ende.data.source_lang, ende.data.target_lang) == ("en", "de")
  assert (deen.data.source_lang, deen.data.target_lang) == ("de", "en")
  # Everything but the direction is the same recipe.
  deen.data.source_lang, deen.data.target_lang = "en", "de"
  assert deen.to_dict() == ende.to_dict()
  with pytest.raises(ValueError, match="direction"):
    multi30k.get_config("en-fr")


def test_direction_argument_reaches_the_config_flag():
  from absl import flags
  from ml_collections import config_flags
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values)
  flag_values(["prog", f"--config={ROOT}/configs/multi30k.py:de-en"])
  assert flag_values.config.data.source_lang == "de"


def test_each_direction_has_its_own_default_workdir():
  from transformer.workdir import default_workdir
  assert default_workdir("configs/multi30k.py") == os.path.join("runs", "multi30k")
  assert default_workdir("configs/multi30k.py:de-en") == os.path.join("runs", "multi30k_de-en")
