#!/usr/bin/env bash
# `make bench`: every benchmark of docs/performance.md, with the commands recorded there.
# Run on an otherwise idle machine; the numbers are measurements, nothing asserts on them.
set -euo pipefail
BUILD=${1:-build}
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
echo "== collectives (2 and 4 ranks)"
"${MPIRUN[@]}" -np 2 "$BUILD/bench_collectives"
"${MPIRUN[@]}" -np 4 "$BUILD/bench_collectives"
echo "== training step vs PyTorch eager (needs a Python with torch: PYTHON=...)"
if "${PYTHON:-/opt/torchvenv/bin/python}" -c "import torch" 2>/dev/null; then
  tools/bench_train_step.sh "$BUILD"
else
  echo "SKIP: no Python with torch for the PyTorch side; C side alone:"
  OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 "$BUILD/bench_train_step" --batch 8 --seq 256 --threads 2
fi
echo "== FSDP (2 ranks)"
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$BUILD/bench_fsdp" 2 64 5
echo "== tensor parallel (2 ranks)"
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$BUILD/bench_tp" --seq 256 --steps 5
echo "== pipeline schedules (pp 2 on 2 cores; pp 4 oversubscribed on a 2-core machine)"
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$BUILD/bench_pp" --layers 8 --dim 256 --seq 128 --microbatches 8 --steps 5
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 4 "$BUILD/bench_pp" --layers 8 --dim 256 --seq 128 --microbatches 8 --steps 5
echo "== checkpoint"
"$BUILD/bench_checkpoint" --mib 64 --reps 3
"${MPIRUN[@]}" -np 2 "$BUILD/bench_checkpoint" --mib 64 --reps 3
echo "== tokenizer vs HF tokenizers (needs a Python with tokenizers: PYTHON=...)"
PYTHON=${PYTHON:-python3} tools/bench_tokenizer.sh "$BUILD" 5
