"""Test-wide JAX settings: implicit rank promotion is an error (it hides shape bugs)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
