"""Tests for transformer/checkpoints.py's array checksums (the save/restore paths
are tested end to end in test_training.py, test_faults.py and test_evaluate.py)."""

import jax.numpy as jnp
import numpy as np
import pytest

from transformer import checkpoints


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int32, np.uint32, np.int8,
                                   np.bool_])
def test_any_flipped_bit_or_swapped_pair_changes_the_checksum(dtype):
  rng = np.random.default_rng(0)
  x = (rng.random((3, 5)) > 0.5 if dtype == np.bool_
       else (rng.standard_normal((3, 5)) * 50).astype(dtype))
  words = x.view(np.uint8).copy() if dtype != np.bool_ else x.astype(np.uint8)
  base = checkpoints.fingerprints({"x": x})
  assert base == checkpoints.fingerprints({"x": x.copy()}) and list(base) == ["['x']"]
  bits = range(1) if dtype == np.bool_ else range(8)
  for i in range(words.size):
    for bit in bits:
      flipped = words.copy()
      flipped.reshape(-1)[i] ^= 1 << bit
      y = flipped.astype(bool) if dtype == np.bool_ else flipped.view(x.dtype)
      assert checkpoints.fingerprints({"x": y}) != base, (i, bit)
  swapped = x.copy().reshape(-1)
  j = next(j for j in range(1, swapped.size) if swapped[j] != swapped[0])
  swapped[[0, j]] = swapped[[j, 0]]
  assert checkpoints.fingerprints({"x": swapped.reshape(x.shape)}) != base


def test_checksums_name_every_leaf_by_its_path():
  tree = {"params": {"w": np.ones((2, 2), np.float32)}, "step": np.int32(3)}
  assert sorted(checkpoints.fingerprints(tree)) == ["['params']['w']", "['step']"]
