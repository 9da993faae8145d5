#!/usr/bin/env bash
# The GPU checks, in the order they matter, each under its own time limit, so
# that a short lease still returns the first ones (benchmarks/README.md,
# 'Session 22' and 'Session 25'): the model, decoding, search, mixed-precision
# and cuDNN attention tests on the GPU, then the benchmark against PyTorch and
# Marian on the same GPU at base and small, decoding a larger batch, and last the
# loss, dropout, RNN, optimizer and checkpoint tests (those that need TFDS fail
# on an image without it). About 9 minutes in all on one H200.
# Logs and JSON go to $OUT (default /tmp/gpu_check).
#   bash benchmarks/gpu_check.sh
# It needs JAX with CUDA, PyTorch and transformers (requirements-bench.txt), and
# requirements.txt's pure-Python packages (flax, optax, orbax-checkpoint,
# ml-collections, clu). An image that lacks the latter takes them as wheels in
# .whl/ (`pip download --no-deps -d .whl ...` on a machine with network): they
# are installed into $SITE (default /tmp/site), put first on PYTHONPATH.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
PYTHON=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  SITE=${SITE:-/tmp/site}
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
T0=$(date +%s)
stage() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
quiet() { grep -v "^WARNING" "$1" | tail -"$2"; }
# gpu_tests LIMIT_S LOG PYTEST_ARGS...: four test processes share the GPU, so none
# may take most of its memory up front; float32 products run at full precision
# (not TF32), as the CPU's do.
gpu_tests() {
  local limit=$1 log=$2; shift 2
  XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest \
    timeout "$limit" "$PYTHON" -m pytest -q -p no:cacheprovider -n 4 --dist loadfile -rfE \
    "$@" > "$log" 2>&1
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PYTHON" -c "import jax, flax, optax; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__)"
  lscpu | grep -m1 "Model name"; } 2>&1 | tee "$OUT/env.txt"

stage "tests on the GPU: model, decoding, search, mixed precision, cuDNN attention"
gpu_tests 200 "$OUT/tests.log" --tb=short --junitxml "$OUT/tests.xml" tests/test_model.py \
  tests/test_decode.py tests/test_search.py tests/test_mixed_precision.py tests/test_attention.py
tail -25 "$OUT/tests.log"

stage "benchmark, base"
timeout 190 "$PYTHON" -m benchmarks.run --sizes base --dtype bfloat16 --tokens_per_batch 25000 \
    --pack --malloc skip --json "$OUT/bench_base.json" > "$OUT/bench_base.log" 2>&1
quiet "$OUT/bench_base.log" 40
stage "benchmark, small"
timeout 130 "$PYTHON" -m benchmarks.run --sizes small --dtype bfloat16 --pack --malloc skip \
    --json "$OUT/bench_small.json" > "$OUT/bench_small.log" 2>&1
quiet "$OUT/bench_small.log" 40
stage "decoding 128 sentences a batch, base, against Marian"
timeout 80 "$PYTHON" -m benchmarks.run --sizes base --dtype bfloat16 --decode_only \
    --decode_sentences 128 --no_torch --malloc skip > "$OUT/decode128.log" 2>&1
quiet "$OUT/decode128.log" 20
stage "tests on the GPU: losses, dropout, RNN baselines, attention pooling, optimizer, checkpoints"
gpu_tests 100 "$OUT/tests_more.log" --tb=line tests/test_losses.py tests/test_dropout.py \
  tests/test_rnn.py tests/test_attention_pooling.py tests/test_optim.py tests/test_checkpoints.py
tail -8 "$OUT/tests_more.log"
stage done
