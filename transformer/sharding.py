"""Device mesh and partitioning: the batch over the 'data' axis, the state replicated
or (FSDP-style) split over the same axis.

One rule serves parameters and optimizer state alike: Adam's moments have the
parameters' shapes, so they land where their parameters are.
"""

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def make_mesh(devices=None) -> Mesh:
  """A 1-D mesh over every device of every host."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over the data axis."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def leaf_spec(shape, axis_size: int, fsdp: bool, min_size: int = 2**14) -> P:
  """FSDP: split the largest axis that the data axis divides; small leaves (biases,
  LayerNorm scales) and every leaf without FSDP stay replicated."""
  if not fsdp or int(np.prod(shape, dtype=np.int64)) < min_size:
    return P()
  for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
    if shape[axis] % axis_size == 0:
      spec = [None] * len(shape)
      spec[axis] = DATA_AXIS
      return P(*spec)
  return P()


def state_shardings(abstract_state, mesh: Mesh, fsdp: bool):
  """NamedShardings for every leaf of a (shape-only) state pytree."""
  size = mesh.shape[DATA_AXIS]
  return jax.tree.map(
      lambda x: NamedSharding(mesh, leaf_spec(x.shape, size, fsdp)), abstract_state)


def row_multiple(mesh: Mesh) -> int:
  """What a batch built whole on every host pads its rows to, so that they split
  evenly over the hosts (host_rows) and then over the devices."""
  return math.lcm(mesh.size, jax.process_count())


def host_rows(batch: dict) -> dict:
  """This host's share of a batch that every host built whole (evaluation,
  decoding): host i of n takes rows [i * R/n, (i+1) * R/n), so that
  `place_batch` of every host's share holds each row once."""
  hosts, host = jax.process_count(), jax.process_index()
  rows = len(next(iter(batch.values())))
  if rows % hosts:
    raise ValueError(f"a batch of {rows} rows does not split over {hosts} hosts")
  per_host = rows // hosts
  return {k: np.asarray(v)[host * per_host:(host + 1) * per_host] for k, v in batch.items()}


def place_batch(batch: dict, mesh: Mesh) -> dict:
  """Host-local numpy rows -> one global array per key, split over the data axis.

  Each host passes its own rows; with one host this is the whole batch.
  """
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}
