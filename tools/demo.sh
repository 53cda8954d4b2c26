#!/usr/bin/env bash
# `make demo`: a short distributed example on 4 MPI ranks. Until the trainer lands this shows
# a 2x2 device mesh and DTensor redistributes (examples/mesh_redistribute.c).
set -euo pipefail
BUILD=${1:-build}
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
"${MPIRUN[@]}" -np 4 "$BUILD/example_mesh_redistribute"
