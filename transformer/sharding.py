"""Device mesh and partitioning, in one place.

The mesh has two axes (config.train.mesh, e.g. "data=-1,model=1"): the batch is
split over 'data'; parameters are split Megatron-style over 'model' by the rules
below (tensor parallelism), and with config.train.fsdp also over 'data'. One
rule serves parameters and optimizer state alike: Adam's moments have the
parameters' shapes and names, so they land where their parameters are.
"""

import math
import re

from absl import logging
import jax
from jax.experimental import mesh_utils
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)
DEFAULT_MESH = "data=-1,model=1"

# Tensor parallelism (Shoeybi et al. 2019): W_Q, W_K, W_V and the FFN's W_1 are split
# by columns (whole heads, whole hidden units), W_O and W_2 by rows, so that each
# device computes its own heads and hidden units, and only W_O's and W_2's outputs
# are summed across the 'model' axis. A rule is (parameter path regex, the axis
# of the leaf that 'model' splits); every other leaf (embeddings, LayerNorms, the
# RNN) is replicated over 'model'.
TENSOR_PARALLEL_RULES = (
    (r"(^|/)(self|cross)_attention/(query|key|value)/kernel$", 1),  # [D, H, K]: heads.
    (r"(^|/)(self|cross)_attention/(query|key|value)/bias$", 0),  # [H, K]
    (r"(^|/)(self|cross)_attention/out/kernel$", 0),  # [H, K, D]: W_O's rows are the heads.
    # [H, K, K], [H, K]: per-head score matrices.
    (r"(^|/)(self|cross)_attention/score_(w|wq|wk|v)$", 0),
    (r"(^|/)feed_forward/inner/kernel$", 1),  # [D, F]: hidden units.
    (r"(^|/)feed_forward/inner/bias$", 0),  # [F]
    (r"(^|/)feed_forward/outer/kernel$", 0),  # [F, D]
)


def parse_mesh(spec: str) -> dict:
  """"data=2,model=4" -> {"data": 2, "model": 4}; one size may be -1 (the rest of
  the devices). Raises ValueError naming config.train.mesh."""
  def fail(why):
    raise ValueError(f"config.train.mesh={spec!r}: {why} (e.g. {DEFAULT_MESH!r})")

  sizes = {}
  for part in str(spec).replace(" ", "").split(","):
    name, _, size = part.partition("=")
    if name not in MESH_AXES:
      fail(f"unknown axis {name!r}; the axes are {MESH_AXES}")
    if name in sizes:
      fail(f"axis {name!r} given twice")
    try:
      sizes[name] = int(size)
    except ValueError:
      fail(f"the size of {name!r} must be an integer, got {size!r}")
    if sizes[name] == 0 or sizes[name] < -1:
      fail(f"the size of {name!r} must be positive, or -1 for the remaining devices")
  if list(sizes.values()).count(-1) > 1:
    fail("at most one axis may be -1")
  return {axis: sizes.get(axis, 1) for axis in MESH_AXES}


def make_mesh(devices=None, spec: str = DEFAULT_MESH) -> Mesh:
  """A ('data', 'model') mesh over every device of every host (or `devices`)."""
  devices = jax.devices() if devices is None else list(devices)
  sizes = parse_mesh(spec)
  known = math.prod(s for s in sizes.values() if s != -1)
  if len(devices) % known:
    raise ValueError(f"config.train.mesh={spec!r} needs a multiple of {known} devices; "
                     f"this job has {len(devices)}")
  sizes = {a: len(devices) // known if s == -1 else s for a, s in sizes.items()}
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(f"config.train.mesh={spec!r} covers {math.prod(sizes.values())} "
                     f"devices; this job has {len(devices)} (use -1 for one axis)")
  return Mesh(device_grid(devices, sizes[DATA_AXIS], sizes[MODEL_AXIS], spec), MESH_AXES)


def device_grid(devices, data: int, model: int, spec: str = DEFAULT_MESH) -> np.ndarray:
  """`devices` as a [data, model] array, host by host: each host's devices fill
  whole rows of their own, so every host feeds distinct batch rows
  (place_batch), and a 'model' axis stays inside one host. Within a host, JAX's
  mesh_utils orders the devices by their interconnect (a TPU's torus); the
  order of jax.devices() is no guide, as a TPU pod's ids interleave hosts."""
  hosts = sorted({d.process_index for d in devices})
  local = len(devices) // len(hosts)
  if any(sum(d.process_index == h for d in devices) != local for h in hosts):
    raise ValueError(f"config.train.mesh={spec!r}: the hosts of this job have different "
                     "numbers of devices; every host needs the same number")
  if local % model:
    raise ValueError(f"config.train.mesh={spec!r}: the model axis must fit in one "
                     f"host ({local} devices each)")
  try:
    return mesh_utils.create_hybrid_device_mesh(
        (data // len(hosts), model), (len(hosts), 1), devices, process_is_granule=True,
        allow_split_physical_axes=True)
  except (ValueError, AssertionError, NotImplementedError) as e:  # A topology it cannot lay out.
    raise ValueError(f"config.train.mesh={spec!r}: JAX cannot lay out [{data}, {model}] over "
                     f"this job's devices: {e}") from e


def mesh_for_reading(spec: str) -> Mesh:
  """The mesh a trained model is read on (evaluate, translate, averaging): the
  training mesh where this job's devices allow it, else data parallel over all."""
  try:
    return make_mesh(spec=spec)
  except ValueError as e:
    logging.info("%s; reading the checkpoints on %r instead", e, DEFAULT_MESH)
    return make_mesh()


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over the data axis, replicated over 'model'."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def tensor_parallel_axis(path: str):
  """The axis of the leaf at `path` ("encoder/layer_0/.../kernel") that 'model' splits."""
  for pattern, axis in TENSOR_PARALLEL_RULES:
    if re.search(pattern, path):
      return axis
  return None


FSDP_MIN_SIZE = 2**14  # The fewest values of a leaf that FSDP splits.


def leaf_spec(shape, data_axis_size: int, fsdp: bool, path: str = "",
              model_axis_size: int = 1, min_size: int = FSDP_MIN_SIZE) -> P:
  """The leaf's PartitionSpec: its tensor-parallel axis over 'model' (where the
  model axis divides it); then with FSDP the largest other axis that the data
  axis divides over 'data'. Small leaves (biases, LayerNorm scales) are never
  split over 'data'."""
  spec = [None] * len(shape)
  axis = tensor_parallel_axis(path)
  if model_axis_size > 1 and axis is not None and shape[axis] % model_axis_size == 0:
    spec[axis] = MODEL_AXIS
  if fsdp and int(np.prod(shape, dtype=np.int64)) >= min_size:
    for a in sorted(range(len(shape)), key=lambda a: -shape[a]):
      if spec[a] is None and shape[a] % data_axis_size == 0:
        spec[a] = DATA_AXIS
        break
  return P(*spec)


def _path_name(path) -> str:
  """The dict keys of a pytree path, '/'-joined: Flax's parameter names, the same
  under TrainState.params and under each optimizer moment."""
  return "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def state_shardings(abstract_state, mesh: Mesh, fsdp: bool):
  """NamedShardings for every leaf of a (shape-only) state pytree."""
  data, model = data_size(mesh), mesh.shape.get(MODEL_AXIS, 1)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, leaf_spec(x.shape, data, fsdp, _path_name(path),
                                                    model)), abstract_state)


def data_size(mesh: Mesh) -> int:
  """How many ways a batch's rows are split."""
  return mesh.shape[DATA_AXIS]


def row_multiple(mesh: Mesh) -> int:
  """What a batch built whole on every host pads its rows to, so that they split
  evenly over the hosts (host_rows) and then over the data axis."""
  return math.lcm(data_size(mesh), jax.process_count())


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
