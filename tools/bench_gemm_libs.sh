#!/usr/bin/env bash
# The GEMM library comparison of docs/dependencies.md ("GEMM library"): bench/gemm_libs.c for
# every library and kernel family this CPU can run, alternated round by round so that all see
# the same machine load. oneDNN (Debian libdnnl2) and BLIS (libblis4) are optional: rows for
# a library that is not installed print SKIP.
#   tools/bench_gemm_libs.sh [BUILD_DIR] [ROUNDS]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
ROUNDS=${2:-3}
export OMP_NUM_THREADS=${THREADS:-2} OMP_WAIT_POLICY=passive
B=$BUILD/bench_gemm_libs
[ -x "$B" ] || { echo "build first: cmake --build $BUILD --target bench_gemm_libs" >&2; exit 1; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
CONFIGS=("openblas|"                                   # the family hyperparallel runs (selected by ISA)
         "openblas|OPENBLAS_CORETYPE=Haswell"           # OpenBLAS's AVX2 kernels
         "openblas|OPENBLAS_CORETYPE=Prescott"          # the SSE3 fallback of an unknown model
         "dnnl|"                                        # oneDNN at the CPU's ISA
         "dnnl|ONEDNN_MAX_CPU_ISA=AVX2"                 # oneDNN capped at AVX2
         "blis|")                                       # BLIS (its own sub-configuration choice)
for r in $(seq 1 "$ROUNDS"); do
    for c in "${CONFIGS[@]}"; do
        lib=${c%%|*} env=${c#*|}
        out=$(env $env "$B" --lib "$lib" --rounds 5 2>&1)
        echo "round $r | $lib ${env:-default} | $(echo "$out" | head -1 | sed 's/^bench_gemm_libs: //') | $(echo "$out" | grep '^RESULT' | cut -d' ' -f3-)"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
