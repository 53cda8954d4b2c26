#!/usr/bin/env bash
# Runs the training-step benchmark of hyperparallel (bench/train_step.c) and the same model and
# step in PyTorch eager (bench/train_step_torch.py) one after the other on the same machine,
# both with 2 threads, and prints them side by side.
#   tools/bench_train_step.sh [BUILD_DIR] [extra args, e.g. --steps 5 --batch 8 --seq 256]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
shift || true
PY=${PYTHON:-/opt/torchvenv/bin/python}
THREADS=${THREADS:-2}
ARGS=(--batch 8 --seq 256 --threads "$THREADS" "$@")
if [ ! -x "$BUILD/bench_train_step" ]; then
    echo "error: $BUILD/bench_train_step not found; build first: cmake --build $BUILD --target bench_train_step" >&2
    exit 1
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
echo "== hyperparallel: $BUILD/bench_train_step ${ARGS[*]}"
HP_OUT=$("$BUILD/bench_train_step" "${ARGS[@]}")
echo "$HP_OUT"
echo "== PyTorch eager: $PY $ROOT/bench/train_step_torch.py ${ARGS[*]}"
PT_OUT=$("$PY" "$ROOT/bench/train_step_torch.py" "${ARGS[@]}")
echo "$PT_OUT"
hp=$(echo "$HP_OUT" | awk '/^RESULT hp/ {print $4, $6, $8, $10, $12}')
pt=$(echo "$PT_OUT" | awk '/^RESULT torch/ {print $4, $6, $8}')
read -r hp_tps hp_gf hp_mfu peak hp_ms <<<"$hp"
read -r pt_tps pt_gf pt_ms <<<"$pt"
echo
printf '%-22s %14s %14s\n' "" "hyperparallel" "PyTorch eager"
printf '%-22s %14s %14s\n' "step time (ms)" "$hp_ms" "$pt_ms"
printf '%-22s %14s %14s\n' "tokens/s" "$hp_tps" "$pt_tps"
printf '%-22s %14s %14s\n' "GFLOP/s" "$hp_gf" "$pt_gf"
printf '%-22s %14s %14s\n' "MFU vs sgemm peak (%)" "$hp_mfu" "$(awk -v g="$pt_gf" -v p="$peak" 'BEGIN{printf "%.1f", 100*g/p}')"
echo "sgemm peak (same run, $THREADS threads): $peak GFLOP/s"
echo "speed-up over PyTorch: $(awk -v a="$hp_tps" -v b="$pt_tps" 'BEGIN{printf "%.2fx", a/b}') (goal >= 3x); MFU goal >= 50%"
