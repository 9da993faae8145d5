"""Test-wide JAX settings.

Implicit rank promotion is an error (it hides shape bugs). Compiled programs are
cached on disk for the session, so the many tiny training runs of the tests
that share shapes compile once.
"""
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("TEST_JAX_CACHE", os.path.join(tempfile.gettempdir(),
                                                                "transformer-test-jax-cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
