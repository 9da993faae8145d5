"""The training state and how it is built: what training, inference and restoring a
workdir share (config -> model -> state; nothing here knows of data, and of decoding
only which contract each architecture's model implements: `decoding`)."""

from typing import Callable, NamedTuple

import flax
import jax
import jax.numpy as jnp
import optax

from transformer import optim, sharding
from transformer.config import model_config
from transformer.model import Transformer, TransformerDecoding
from transformer.rnn import RNNDecoding, RNNEncoderDecoder

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  step: Array  # int32 scalar: updates applied so far.
  params: dict
  opt_state: optax.OptState
  rng: Array  # uint32 key data; the dropout key of a step is fold_in(rng, step).


_INIT_IDS = (1, 8)  # The ids that init traces: any shape builds the same parameters.


def create_state(model, tx, rng) -> TrainState:
  ids = jnp.ones(_INIT_IDS, jnp.int32)
  init_rng, train_rng = jax.random.split(rng)
  params = model.init(init_rng, ids, ids)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=tx.init(params), rng=jax.random.key_data(train_rng))


# config.model.architecture -> (the model, its decoding contract).
ARCHITECTURES = {"transformer": (Transformer, TransformerDecoding),
                 "rnn": (RNNEncoderDecoder, RNNDecoding)}


def make_model(cfg):
  """The model of a ModelConfig, by its architecture."""
  return ARCHITECTURES[cfg.architecture][0](cfg)


def parameter_shapes(cfg):
  """The parameter tree of a ModelConfig's model as ShapeDtypeStructs: nothing is allocated."""
  ids = jnp.ones(_INIT_IDS, jnp.int32)
  return jax.eval_shape(make_model(cfg).init, jax.random.key(0), ids, ids)["params"]


def parameter_count(params) -> int:
  """The values in a parameter tree (arrays or shapes)."""
  return sum(x.size for x in jax.tree.leaves(params))


def decoding(model):
  """The decoding contract (decode.DecodingModel) of a model made here."""
  return ARCHITECTURES[model.config.architecture][1](model)


class Built(NamedTuple):
  """What a config builds before any data is seen."""
  model: flax.linen.Module  # Transformer or RNNEncoderDecoder (make_model).
  tx: optax.GradientTransformation
  abstract: TrainState  # Shapes and dtypes only (jax.ShapeDtypeStruct leaves).
  shardings: TrainState  # Where each leaf lives on the mesh.
  schedule: Callable  # Learning rate of the update after `count` updates.


def build(config, vocab_size, mesh) -> Built:
  cfg = model_config(config, vocab_size)
  model = make_model(cfg)
  tx, schedule = optim.make_optimizer(config.optim, cfg.d_model)
  abstract = jax.eval_shape(lambda: create_state(model, tx, jax.random.key(config.seed)))
  shardings = sharding.state_shardings(abstract, mesh, config.train.fsdp)
  return Built(model, tx, abstract, shardings, schedule)


def init_state(model, tx, config, shardings):
  """Initialises the state directly into its shardings (no host copy)."""
  return jax.jit(lambda: create_state(model, tx, jax.random.key(config.seed)),
                 out_shardings=shardings)()
