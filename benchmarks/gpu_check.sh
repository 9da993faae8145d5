#!/usr/bin/env bash
# The GPU checks, in the order they matter, each under its own time limit, so
# that a short lease still returns the first ones (benchmarks/README.md,
# 'Session 22'): the cuDNN attention tests, cuDNN against the written-out
# attention in the base bfloat16 step, the benchmark against PyTorch and Marian
# on the same GPU, then the model and decoding tests (never yet run on a GPU).
# Logs and JSON go to $OUT (default /tmp/gpu_check).
#   bash benchmarks/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
PYTHON=${PYTHON:-python3}
T0=$(date +%s)
stage() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
stage "cuDNN attention tests"
timeout 90 "$PYTHON" -m pytest -q -p no:cacheprovider -p no:xdist tests/test_attention.py \
    -k "cudnn or fused or chosen or scaled_dot_without" 2>&1 | tee "$OUT/test_attention.log" | tail -5
stage "cuDNN against the reference attention, base bfloat16, packed 25k-token batches"
timeout 150 "$PYTHON" -m benchmarks.profile --size base --dtype bfloat16 --tokens_per_batch 25000 \
    --pack --variants reference_attn --interleave --steps 10 --json "$OUT/attention_ab.json" 2>&1 \
    | tee "$OUT/attention_ab.log" | grep -v "^WARNING" | tail -4
stage "benchmark, base"
timeout 200 "$PYTHON" -m benchmarks.run --sizes base --dtype bfloat16 --tokens_per_batch 25000 \
    --pack --malloc skip --json "$OUT/bench_base.json" > "$OUT/bench_base.log" 2>&1
grep -v "^WARNING" "$OUT/bench_base.log" | tail -40
stage "benchmark, small"
timeout 150 "$PYTHON" -m benchmarks.run --sizes small --dtype bfloat16 --pack --malloc skip \
    --json "$OUT/bench_small.json" > "$OUT/bench_small.log" 2>&1
grep -v "^WARNING" "$OUT/bench_small.log" | tail -40
stage "model, decoding and mixed-precision tests on the GPU (float32 products at full precision, not TF32)"
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 200 "$PYTHON" -m pytest -q -p no:cacheprovider \
    -p no:xdist tests/test_model.py tests/test_decode.py tests/test_mixed_precision.py 2>&1 \
    | tee "$OUT/test_model_decode.log" | tail -8
stage done
