"""Test-wide JAX settings, and the `long` marker.

Tests marked `long` (minutes each: further multi-process jobs) run only with
`python -m pytest tests --long`; the fast suite covers the same code paths once.

Implicit rank promotion is an error (it hides shape bugs). Compiled programs are
cached on disk for the session, so the many tiny training runs of the tests
that share shapes compile once.

Compiling is much of the suite's time, so the tests' programs (tiny models, run
for seconds) compile the cheap way, with flags that real runs and the benchmarks
do not set. XLA_FLAGS gets, unless it already names them (give other values
there to test at those):
- --xla_backend_optimization_level=0: no LLVM optimisations, about half of
  each compilation. XLA's optimised HLO is the same (compared for a training
  step); LLVM's code rounds floats differently in the last bits (a float32
  training step's parameters: 5e-7).
- --xla_cpu_use_fusion_emitters=false: XLA CPU's older code generator for
  fusions, which compiles the tests' programs about 2x faster than the newer one
  (benchmarks/README.md). The same operations, grouped into fewer fusions
  (reductions join their element-wise neighbours); a training step's metrics
  came out bit for bit the same.
- --xla_cpu_parallel_codegen_split_count=1: each program's code is generated in
  one piece, not split into parts for threads (the two test workers already keep
  both cores busy): about a tenth off each compilation.
The tests' subprocesses inherit them.
"""
import os
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
_CHEAP_COMPILATION = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                      "--xla_cpu_parallel_codegen_split_count=1")
_given = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(filter(None, [_given] + [
    flag for flag in _CHEAP_COMPILATION if flag.split("=")[0] not in _given]))

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
