"""The mesh spec and the partition rules (the 8-device equality checks are in
tests/sharded_step_check.py, run by test_training.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from transformer import sharding


def test_mesh_spec_parses_and_fills_in_the_minus_one_axis():
  assert sharding.parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
  assert sharding.parse_mesh("model=2, data=-1") == {"data": -1, "model": 2}
  assert sharding.parse_mesh("data=-1") == {"data": -1, "model": 1}
  mesh = sharding.make_mesh(spec="data=-1,model=1")
  assert dict(mesh.shape) == {"data": jax.device_count(), "model": 1}


@pytest.mark.parametrize("spec,message", [
    ("data=2,batch=4", "unknown axis 'batch'"), ("data=two", "must be an integer"),
    ("data=-1,model=-1", "at most one axis may be -1"), ("data=0", "must be positive"),
    ("data=1,data=2", "given twice")])
def test_a_bad_mesh_spec_is_refused_naming_the_field(spec, message):
  with pytest.raises(ValueError, match=rf"config.train.mesh='{spec}': .*{message}"):
    sharding.parse_mesh(spec)


def test_a_mesh_larger_than_the_job_is_refused():
  with pytest.raises(ValueError, match=r"config.train.mesh='data=1,model=64' needs a multiple of 64 devices; this job has 1"):
    sharding.make_mesh(spec="data=1,model=64")


class FakeDevice:
  """What the mesh layout reads of a device."""

  def __init__(self, id, process_index):  # pylint: disable=redefined-builtin
    self.id, self.process_index = id, process_index
    self.platform = self.device_kind = "cpu"

  def __repr__(self):
    return f"d{self.id}@p{self.process_index}"


def test_the_mesh_is_laid_out_host_by_host_whatever_the_device_ids():
  """A TPU pod's device ids interleave its hosts (host 0 holds 0, 1, 4, 5):
  each host's devices still fill whole rows of their own, hosts in order, so
  that each host's batch rows are its own and the model axis stays in a host."""
  hosts = [0, 0, 1, 1, 0, 0, 1, 1]
  devices = [FakeDevice(i, p) for i, p in enumerate(hosts)]
  for data, model in ((8, 1), (4, 2), (2, 4)):
    grid = sharding.device_grid(devices, data, model)
    assert grid.shape == (data, model)
    row_hosts = [{d.process_index for d in row} for row in grid]
    assert all(len(h) == 1 for h in row_hosts), grid
    assert [h.pop() for h in row_hosts] == sorted(hosts)[::model], grid
    assert sorted(d.id for d in grid.flat) == list(range(8))
  with pytest.raises(ValueError, match="the model axis must fit in one host"):
    sharding.device_grid(devices, 1, 8)
  with pytest.raises(ValueError, match="different numbers of devices"):
    sharding.device_grid(devices[:7], 7, 1)


def test_a_layout_jax_cannot_make_is_a_value_error_naming_the_mesh(monkeypatch):
  """mesh_utils raises AssertionError for some TPU topologies: it becomes the
  ValueError that names config.train.mesh (and that mesh_for_reading falls back on)."""
  def cannot(*args, **kwargs):
    raise AssertionError("no such torus")
  monkeypatch.setattr(sharding.mesh_utils, "create_hybrid_device_mesh", cannot)
  with pytest.raises(ValueError, match=r"config.train.mesh='data=-1,model=1': JAX cannot lay "
                     r"out \[\d+, 1\] over this job's devices: no such torus"):
    sharding.make_mesh()


def test_mesh_for_reading_falls_back_to_data_parallel():
  assert dict(sharding.mesh_for_reading("data=1,model=64").shape) == {
      "data": jax.device_count(), "model": 1}


@pytest.mark.parametrize("path,shape,spec", [
    ("encoder/layer_0/self_attention/query/kernel", (128, 4, 32), P("data", "model", None)),
    ("decoder/layer_1/cross_attention/out/kernel", (4, 32, 128), P("model", None, "data")),
    ("encoder/layer_0/feed_forward/inner/kernel", (128, 256), P("data", "model")),
    ("encoder/layer_0/feed_forward/inner/bias", (256,), P("model")),
    ("encoder/layer_0/feed_forward/outer/kernel", (256, 128), P("model", "data")),
    ("encoder/layer_0/self_attention/score_v", (4, 32), P("model", None)),
    ("shared_embedding/embedding", (1024, 128), P("data", None)),  # Not tensor parallel.
    ("encoder/layer_0/feed_forward_norm/scale", (128,), P(None)),
    # The RNN's attention has no heads: replicated over 'model', as its cells are.
    ("decoder/cell/query/kernel", (128, 128), P("data", None)),
    ("decoder/cell/score_v", (1024,), P("data")),
])
def test_tensor_parallel_rules_split_heads_and_hidden_units(path, shape, spec):
  assert sharding.leaf_spec(shape, 2, True, path, 4, min_size=1000) == spec


def test_a_model_axis_that_does_not_divide_a_leaf_leaves_it_replicated():
  assert sharding.leaf_spec((128, 6, 32), 1, False, "x/self_attention/query/kernel",
                            4) == P(None, None, None)


def test_fsdp_splits_the_largest_axis_the_data_axis_divides_from_the_least_size():
  """FSDP over 'data': the largest axis that the data size divides (the next one
  where it does not divide the largest), from FSDP_MIN_SIZE values on."""
  assert sharding.leaf_spec((1000, 128), 2, True, min_size=1000) == P("data", None)
  assert sharding.leaf_spec((1001, 128), 2, True, min_size=1000) == P(None, "data")
  assert sharding.leaf_spec((1001, 127), 2, True, min_size=1000) == P(None, None)
  assert sharding.leaf_spec((10, 100), 2, True, min_size=1000) == P(None, "data")  # 1000 values.
  assert sharding.leaf_spec((10, 99), 2, True, min_size=1000) == P(None, None)  # 990 values.


def test_optimizer_moments_are_named_and_split_as_their_parameters():
  params = {"decoder": {"feed_forward": {"inner": {"kernel": jnp.zeros((8, 16))}}}}
  state = (params, optax.adam(1e-3).init(params))  # Params, then Adam's mu and nu.
  names = jax.tree.leaves(jax.tree_util.tree_map_with_path(
      lambda p, _: sharding._path_name(p), state))
  assert names == ["decoder/feed_forward/inner/kernel", ""] + [
      "decoder/feed_forward/inner/kernel"] * 2  # "": Adam's step count.
  assert [sharding.tensor_parallel_axis(n) for n in names] == [1, None, 1, 1]


def test_host_rows_give_each_row_to_one_host(monkeypatch):
  batch = {"inputs": np.arange(12).reshape(6, 2), "targets": np.arange(6)}
  monkeypatch.setattr(jax, "process_count", lambda: 3)
  seen = []
  for host in range(3):
    monkeypatch.setattr(jax, "process_index", lambda host=host: host)
    share = sharding.host_rows(batch)
    np.testing.assert_array_equal(share["inputs"][:, 0] // 2, share["targets"])
    seen += share["targets"].tolist()
  assert seen == list(range(6))
  with pytest.raises(ValueError, match="7 rows does not split over 3 hosts"):
    sharding.host_rows({"inputs": np.zeros((7, 2))})
