"""The checksums a checkpoint holds of its own arrays and data position.

Damaged bytes in a checkpoint's data file that still decompress (as zstd does,
into different numbers) restore without an error from Orbax; training would go
on from them. So a save records a checksum of every array of the state
(`fingerprints`, computed where the arrays are) and a CRC-32 of the data
iterator's position, and a restore compares (`check`). The checksums record the
algorithm that made them, so checkpoints of an older algorithm are checked with
that one.
"""

import json
import zlib

import jax
import jax.numpy as jnp

from transformer import runtime

# What a save records beside its checksums: the algorithm that computed them.
# Checksums without it were computed by algorithm 1.
ALGORITHM = 2


class NewerCheckpointError(runtime.CommandError):
  """A checkpoint written by a newer version of this code (a checksum algorithm
  it does not know): not damaged, so never set aside for an older one."""


def _words(x):
  """An array's bits as a flat uint32 vector: its 32-bit (or narrower,
  zero-extended) words; an 8-byte value gives two."""
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  else:
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    words = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)  # 8 bytes: [..., 2].
  return words.reshape(-1)


def _fmix32(h):
  """MurmurHash3's finalizer: a bijection of uint32 in which every output bit
  depends on every input bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _checksum(x, algorithm=ALGORITHM):
  """A uint32 checksum of an array's words w_i, summed mod 2^32.

  Algorithm 2: sum_i fmix32(w_i + i * G), G odd. For each i the term is a
  bijection of w_i, so a change to any one word always changes the sum. Any
  other change (two values swapped, two signs flipped, many words) changes it
  except with a probability of about 2^-32: the terms are hashes of the word and
  its index, and a swap can never just exchange two terms (that needs indices
  2^31 words apart).

  Algorithm 1 (checkpoints written before algorithm 2): sum_i w_i * (2i+1) * G.
  A change to one word always shows, but the terms are linear in the words, so
  some swaps and pairs of sign flips cancel out; it is kept to check those
  checkpoints."""
  words = _words(x)
  index = jnp.arange(words.size, dtype=jnp.uint32)
  golden = jnp.uint32(0x9E3779B1)
  if algorithm == 1:
    return jnp.sum(words * ((index * 2 + 1) * golden), dtype=jnp.uint32)
  if algorithm == 2:
    return jnp.sum(_fmix32(words + index * golden), dtype=jnp.uint32)
  raise ValueError(f"unknown checksum algorithm {algorithm!r} (this code knows 1 and "
                   f"{ALGORITHM})")


_checksum_all = jax.jit(lambda leaves, algorithm: [_checksum(x, algorithm) for x in leaves],
                        static_argnums=1)


def fingerprints(tree, algorithm=ALGORITHM) -> dict:
  """{key path: checksum} of every array in `tree`, computed where the arrays are."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  sums = jax.device_get(_checksum_all([x for _, x in leaves], algorithm))
  return {jax.tree_util.keystr(path): int(v) for (path, _), v in zip(leaves, sums)}


def compute(state, data_state, algorithm=ALGORITHM) -> dict:
  """What a checkpoint stores to check itself by: the state's fingerprints (and
  the algorithm that made them) and a CRC-32 of the data iterator's position
  (JSON, read back as written)."""
  return {"algorithm": algorithm, "state": fingerprints(state, algorithm),
          "data": zlib.crc32(json.dumps(data_state, sort_keys=True).encode())}


def check(state, data_state, saved: dict) -> None:
  """ValueError naming what differs from the checksums saved with a checkpoint."""
  algorithm = saved.get("algorithm", 1)
  if algorithm > ALGORITHM:
    raise NewerCheckpointError(
        f"its checksums are of algorithm {algorithm}, and this code knows algorithms 1 to "
        f"{ALGORITHM}: it was written by a newer version of this code; update it "
        "(nothing was changed there)")
  got = compute(state, data_state, algorithm)
  bad = [k for k in sorted(set(got["state"]) | set(saved["state"]))
         if got["state"].get(k) != saved["state"].get(k)]
  if got["data"] != saved["data"]:
    bad.append("the data position")
  if bad:
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    raise ValueError(f"checksum mismatch in {', '.join(bad[:3])}{more}: its files were "
                     "changed after they were written")
