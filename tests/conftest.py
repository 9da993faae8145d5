"""Test-wide JAX settings, and the `long` marker.

Tests marked `long` (minutes each: further multi-process jobs) run only with
`python -m pytest tests --long`; the fast suite covers the same code paths once.

Implicit rank promotion is an error (it hides shape bugs). Compiled programs are
cached on disk for the session, so the many tiny training runs of the tests
that share shapes compile once.

Compiling is most of the suite's time, and LLVM's optimisations are about half of
each compilation, so the tests' programs (tiny models, run for seconds) compile
without them: XLA_FLAGS gets --xla_backend_optimization_level=0, which the
tests' subprocesses inherit. XLA's optimised HLO is the same (compared for a
training step), and so is what the tests check; LLVM's code rounds floats
differently in the last bits (a float32 training step's parameters: 5e-7) from
the optimised build, which the benchmarks and real runs use. Give another level
in XLA_FLAGS to test at that one.
"""
import os
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("TEST_JAX_CACHE", os.path.join(tempfile.gettempdir(),
                                                                "transformer-test-jax-cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_addoption(parser):
  parser.addoption("--long", action="store_true",
                   help="also run the tests marked long (minutes each)")


def pytest_configure(config):
  config.addinivalue_line("markers", "long: minutes-long end-to-end checks; run with --long")
  # ml_collections loads config files with importlib's deprecated load_module.
  config.addinivalue_line("filterwarnings", "ignore:the load_module:DeprecationWarning")


def pytest_collection_modifyitems(config, items):
  if config.getoption("--long"):
    return
  skip = pytest.mark.skip(reason="long: run with python -m pytest tests --long")
  for item in items:
    if "long" in item.keywords:
      item.add_marker(skip)
