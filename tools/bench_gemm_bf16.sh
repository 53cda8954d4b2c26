#!/usr/bin/env bash
# bf16 GEMMs vs f32 sgemm at the llama3 debugmodel step's shapes (B 8 x T 256 = 2048 rows), all
# configurations alternated round by round in one run, each in its own process (docs/performance.md
# "bf16 GEMM"): OpenBLAS sgemm (f32), hyperparallel's hp_gemm_bf16 on oneDNN (AMX, and capped at
# AVX512_BF16 with ONEDNN_MAX_CPU_ISA), its f32 path, OpenBLAS sbgemm (SKIP where not exported),
# and PyTorch's bf16 / f32 matmul (bench/gemm_bf16_torch.py; PYTHON names a python with torch).
#   PYTHON=/path/to/python tools/bench_gemm_bf16.sh [build] [rounds]
# Prints every RESULT and the median (min-max) GFLOP per CPU-second of each configuration.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
ROUNDS=${2:-3}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2
unset OPENBLAS_CORETYPE HP_GEMM_BF16 HP_NN_ISA ONEDNN_MAX_CPU_ISA
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); flags: $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq "$ROUNDS"); do
  "$BUILD/bench_gemm_bf16" --impl sgemm --rounds 3 | tee -a "$OUT" | grep -v '^step'
  "$BUILD/bench_gemm_bf16" --impl onednn --rounds 3 | tee -a "$OUT" | grep -v '^step'
  ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 "$BUILD/bench_gemm_bf16" --impl onednn --rounds 3 |
    sed 's/impl onednn/impl onednn_avx512bf16/' | tee -a "$OUT" | grep -v '^step'
  "$BUILD/bench_gemm_bf16" --impl f32 --rounds 3 | tee -a "$OUT" | grep -v '^step'
  "$BUILD/bench_gemm_bf16" --impl sbgemm --rounds 3 | tee -a "$OUT" | grep -v '^step'
  if "$PY" -c 'import torch' 2>/dev/null; then
    "$PY" bench/gemm_bf16_torch.py --dtype bfloat16 --rounds 3 | tee -a "$OUT"
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 "$PY" bench/gemm_bf16_torch.py --dtype bfloat16 --rounds 3 |
      sed 's/impl torch_bfloat16/impl torch_bfloat16_avx512bf16/' | tee -a "$OUT"
    "$PY" bench/gemm_bf16_torch.py --dtype float32 --rounds 3 | tee -a "$OUT"
  else
    echo "SKIP: no torch in $PY (set PYTHON)"
  fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "median (min-max) of $ROUNDS rounds, GFLOP per CPU-second | wall GFLOP/s (2 threads):"
awk '/^RESULT gemm_bf16/ { c[$4] = c[$4] " " $8; w[$4] = w[$4] " " $6 }
     END { for (k in c) { print k, c[k], "|", w[k] } }' "$OUT" |
  python3 -c '
import sys, statistics
for line in sys.stdin:
    k, rest = line.split(None, 1)
    cpu, wall = rest.split("|")
    c = [float(x) for x in cpu.split()]; w = [float(x) for x in wall.split()]
    print(f"  {k:32s} {statistics.median(c):7.1f} ({min(c):.1f}-{max(c):.1f}) | {statistics.median(w):7.1f}")'
