#!/usr/bin/env bash
# The GPU checks, in the order they matter, each under its own time limit, so
# that a short lease still returns the first ones (benchmarks/README.md,
# sessions 22, 25 and 32). STAGES picks them (comma-separated, in this order):
#   tests   the model, decoding, refill/compaction, search, dropout, mixed-precision
#           and cuDNN attention tests on the GPU (~230 s)
#   recipe  the Multi30k recipe end to end: train.py (bfloat16, 1450 steps, val BLEU
#           curve), average_checkpoints, evaluate beam 4 on val and test (~230 s);
#           needs the corpus in $M30K (default .gpu/multi30k: `cp -r ../shared/data/multi30k
#           .gpu/`, then carry .gpu and .whl to the device); RECIPE_STEPS
#           and RECIPE_FLAGS (more train.py flags) shorten it for a try on a CPU
#   bench   training against PyTorch at base (each side alone, 25k tokens) and the
#           benchmark against PyTorch and Marian at small, bfloat16 (~320 s)
#   profile our base step's kernels by kind, and XLA's attention against cuDNN's (~120 s)
#   decode  decoding 128 sentences a batch, base, against Marian (~80 s)
#   more    the loss, dropout, RNN, optimizer and checkpoint tests (~100 s)
# Default: tests,recipe. All six take ~18 minutes: more than one 15-minute lease.
# Logs and JSON go to $OUT (default /tmp/gpu_check).
#   STAGES=tests,bench bash benchmarks/gpu_check.sh
# It needs JAX with CUDA, PyTorch and transformers (requirements-bench.txt), and
# requirements.txt's pure-Python packages (flax, optax, orbax-checkpoint,
# ml-collections, clu). An image that lacks the latter takes them as wheels in
# .whl/ (`pip download --no-deps -d .whl ...` on a machine with network): they
# are installed into $SITE (default /tmp/site), put first on PYTHONPATH. Without
# TensorFlow, clu's TensorBoard writer is replaced by one that drops summaries
# (benchmarks/gpu_stubs; the log keeps every metric).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
STAGES=",${STAGES:-tests,recipe},"
M30K=${M30K:-.gpu/multi30k}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
PYTHON=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  SITE=${SITE:-/tmp/site}
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" -c "import tensorflow" 2> /dev/null ||
  export PYTHONPATH="$PWD/benchmarks/gpu_stubs:${PYTHONPATH:-$PWD}"
T0=$(date +%s)
stage() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
want() { [[ "$STAGES" == *",$1,"* ]]; }
quiet() { grep -v "^WARNING" "$1" | tail -"$2"; }
# gpu_tests LIMIT_S LOG PYTEST_ARGS...: four test processes share the GPU, so none
# may take most of its memory up front; float32 products run at full precision
# (not TF32), as the CPU's do. -v: what finished shows even if the limit stops it.
gpu_tests() {
  local limit=$1 log=$2; shift 2
  XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest \
    timeout "$limit" "$PYTHON" -m pytest -v -p no:cacheprovider -n 4 --dist loadfile -rfE \
    "$@" > "$log" 2>&1
  echo "pytest exit $?: $(grep -c " PASSED " "$log") passed, $(grep -c " SKIPPED " "$log") skipped"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PYTHON" -c "import jax, flax, optax; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__)"
  lscpu | grep -m1 "Model name"; } 2>&1 | tee "$OUT/env.txt"

if want tests; then
  stage "tests on the GPU: model, decoding, refill, search, dropout, mixed precision, cuDNN attention"
  gpu_tests 240 "$OUT/tests.log" --tb=short tests/test_decode.py tests/test_beam_loops.py \
    tests/test_model.py tests/test_search.py tests/test_dropout.py tests/test_mixed_precision.py \
    tests/test_attention.py
  grep -E "FAILED|ERROR" "$OUT/tests.log" | tail -25
fi

if want recipe; then
  stage "the Multi30k recipe: train.py, bfloat16, ${RECIPE_STEPS:-1450} steps"
  W=/tmp/gpu_check_multi30k
  start=$(date +%s)
  timeout 180 "$PYTHON" train.py --config configs/multi30k.py --workdir $W \
    --config.data.text_dir="$M30K" --config.model.dtype=bfloat16 \
    --config.train.num_steps="${RECIPE_STEPS:-1450}" ${RECIPE_FLAGS:-} > "$OUT/recipe_train.log" 2>&1
  echo "train.py exit $? after $(( $(date +%s) - start )) s"
  grep -E "decode/bleu|Traceback|Error" "$OUT/recipe_train.log" | tail -8
  timeout 30 "$PYTHON" -m transformer.average_checkpoints --workdir $W --last 5 \
    > "$OUT/recipe_average.log" 2>&1 || tail -3 "$OUT/recipe_average.log"
  # Four evaluations at once (separate processes): their compilations overlap.
  for split in val test_2016_flickr; do for checkpoint in latest averaged; do
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 "$PYTHON" -m transformer.evaluate \
      --workdir $W --split $split --mode beam --checkpoint $checkpoint \
      > "$OUT/recipe_eval_${split}_$checkpoint.log" 2>&1 &
  done; done
  wait
  for split in val test_2016_flickr; do for checkpoint in latest averaged; do
    echo "$split, $checkpoint: $(grep -E '"(bleu|chrf|sentences_per_second)"' \
      "$OUT/recipe_eval_${split}_$checkpoint.log" | tr -d '\n ')"
  done; done
fi

if want bench; then
  stage "benchmark, base: each side alone in its own process, 25k tokens"
  timeout 240 "$PYTHON" -m benchmarks.alone --sizes base --dtype bfloat16 --pack \
      --tokens_per_batch 25000 --rounds 2 --json "$OUT/bench_base.json" > "$OUT/bench_base.log" 2>&1
  quiet "$OUT/bench_base.log" 8
  stage "benchmark, small"
  timeout 130 "$PYTHON" -m benchmarks.run --sizes small --dtype bfloat16 --pack --malloc skip \
      --json "$OUT/bench_small.json" > "$OUT/bench_small.log" 2>&1
  quiet "$OUT/bench_small.log" 40
fi

if want profile; then
  stage "where our base step's time goes (kernels by kind), and XLA's attention against cuDNN's"
  timeout 150 "$PYTHON" -m benchmarks.profile --size base --dtype bfloat16 --tokens_per_batch 25000 \
      --pack --variants xla_attn --trace --steps 5 --json "$OUT/profile.json" \
      > "$OUT/profile.log" 2>&1
  quiet "$OUT/profile.log" 45
fi

if want decode; then
  stage "decoding 128 sentences a batch, base, against Marian"
  timeout 80 "$PYTHON" -m benchmarks.run --sizes base --dtype bfloat16 --decode_only \
      --decode_sentences 128 --no_torch --malloc skip > "$OUT/decode128.log" 2>&1
  quiet "$OUT/decode128.log" 20
fi

if want more; then
  stage "tests on the GPU: losses, dropout, RNN baselines, attention pooling, optimizer, checkpoints"
  gpu_tests 100 "$OUT/tests_more.log" --tb=line tests/test_losses.py tests/test_rnn.py \
    tests/test_attention_pooling.py tests/test_optim.py tests/test_checkpoints.py
  grep -E "FAILED|ERROR" "$OUT/tests_more.log" | tail -10
fi
stage done
