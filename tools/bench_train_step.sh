#!/usr/bin/env bash
# Runs the training-step benchmark of hyperparallel (bench/train_step.c) and the same model and
# step in PyTorch eager (bench/train_step_torch.py) on the same machine, both with 2 threads,
# alternating for ROUNDS rounds (default 2), and prints them side by side: the median step of
# the last round, and the best step over all rounds (least disturbed by other load). Then, when
# BUILD_DIR has libhyperparallel.so, one more run in a single Python process that alternates a
# hyperparallel step (through ctypes) with a PyTorch step, so both see the same load.
# With BASE_BUILD set to the build directory of another commit (e.g. the previous one), each
# round also runs that build's bench_train_step, so a change is measured against its parent
# and PyTorch in one run under the same load.
# Each round also runs PyTorch with torch.compile (inductor) as a second peer, and the
# interleaved run is repeated against it (COMPILE=0 skips both; the compilation happens in
# untimed warm-up steps). SEQ=1024 / SEQ=2048 (and BATCH) run a
# longer sequence, where attention dominates. The header lines name the CPU, hyperparallel's ISA
# path, the GEMM kernels (OpenBLAS family against the CPU's ISA; a WARNING when below) and
# ATen's CPU capability; to reproduce the AVX2 configuration on an AVX-512 machine:
# HP_NN_ISA=avx2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2.
# MFU is shown against two peaks measured by bench_train_step in the same run: the cores' f32
# FMA peak (hp_cpu_fma_peak_flops: the hardware, whatever kernels a library picked) and the
# sgemm peak (what OpenBLAS's cblas_sgemm reaches on squares).
# Each round also runs the bfloat16 pair (BF16=0 skips it): hyperparallel with --dtype bfloat16
# (training.dtype=bfloat16: the linears' GEMMs in bf16) against PyTorch eager under CPU autocast
# bf16 (--autocast), and one interleaved run alternates the two steps in one process.
#   tools/bench_train_step.sh [BUILD_DIR] [extra args, e.g. --steps 5 --batch 8 --seq 256]
#   SEQ=2048 ROUNDS=1 tools/bench_train_step.sh build
#   BASE_BUILD=/path/to/base/build tools/bench_train_step.sh build
#   IL_STEPS=30 ROUNDS=0 tools/bench_train_step.sh build   # only the interleaved runs, 30 step pairs
# (on a shared machine the interleaved runs' step-level pairing, "paired steps: ... median",
# is the comparison least disturbed by other load)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
shift || true
PY=${PYTHON:-/opt/torchvenv/bin/python}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-2}
COMPILE=${COMPILE:-1}
BF16=${BF16:-1}
ARGS=(--batch "${BATCH:-8}" --seq "${SEQ:-256}" --threads "$THREADS" "$@")
if [ ! -x "$BUILD/bench_train_step" ]; then
    echo "error: $BUILD/bench_train_step not found; build first: cmake --build $BUILD --target bench_train_step" >&2
    exit 1
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "environment: HP_NN_ISA=${HP_NN_ISA:-auto} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-default}"
HP_ALL="" PT_ALL=""
for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r/$ROUNDS hyperparallel: $BUILD/bench_train_step ${ARGS[*]}"
    HP_OUT=$("$BUILD/bench_train_step" "${ARGS[@]}")
    echo "$HP_OUT"
    HP_ALL="$HP_ALL"$'\n'"$(echo "$HP_OUT" | grep '^RESULT hp')"
    PK_ALL="${PK_ALL:-}"$'\n'"$(echo "$HP_OUT" | grep '^RESULT peaks' || true)"
    echo "== round $r/$ROUNDS PyTorch eager: $PY $ROOT/bench/train_step_torch.py ${ARGS[*]}"
    PT_OUT=$("$PY" "$ROOT/bench/train_step_torch.py" "${ARGS[@]}")
    echo "$PT_OUT"
    PT_ALL="$PT_ALL"$'\n'"$(echo "$PT_OUT" | grep '^RESULT torch')"
    if [ "$COMPILE" != 0 ]; then
        echo "== round $r/$ROUNDS PyTorch torch.compile: $PY $ROOT/bench/train_step_torch.py ${ARGS[*]} --compile"
        PC_OUT=$("$PY" "$ROOT/bench/train_step_torch.py" "${ARGS[@]}" --compile)
        echo "$PC_OUT"
        PC_ALL="${PC_ALL:-}"$'\n'"$(echo "$PC_OUT" | grep '^RESULT torch_compile')"
    fi
    if [ "$BF16" != 0 ]; then
        echo "== round $r/$ROUNDS hyperparallel bf16: $BUILD/bench_train_step ${ARGS[*]} --dtype bfloat16"
        HB_OUT=$("$BUILD/bench_train_step" "${ARGS[@]}" --dtype bfloat16)
        echo "$HB_OUT" | grep -E '^RESULT hp|step time|dtype|loss' || true
        HB_ALL="${HB_ALL:-}"$'\n'"$(echo "$HB_OUT" | grep '^RESULT hp')"
        echo "== round $r/$ROUNDS PyTorch autocast bf16: $PY $ROOT/bench/train_step_torch.py ${ARGS[*]} --autocast"
        PA_OUT=$("$PY" "$ROOT/bench/train_step_torch.py" "${ARGS[@]}" --autocast)
        echo "$PA_OUT"
        PA_ALL="${PA_ALL:-}"$'\n'"$(echo "$PA_OUT" | grep '^RESULT torch_autocast')"
    fi
    if [ -n "${BASE_BUILD:-}" ]; then
        echo "== round $r/$ROUNDS base build: $BASE_BUILD/bench_train_step ${ARGS[*]}"
        BASE_OUT=$("$BASE_BUILD/bench_train_step" "${ARGS[@]}")
        echo "$BASE_OUT" | grep -E '^RESULT hp|step' | head -20
        BASE_ALL="${BASE_ALL:-}"$'\n'"$(echo "$BASE_OUT" | grep '^RESULT hp')"
    fi
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$ROUNDS" -gt 0 ]; then   # ROUNDS=0: only the interleaved runs below
# last round's medians; best steps over all rounds; the highest sgemm peak seen
read -r hp_tps hp_gf peak hp_ms <<<"$(echo "$HP_ALL" | awk '/RESULT/ {t=$4; g=$6; m=$12} /RESULT/ && $10>p {p=$10} END {print t, g, p, m}')"
fma=$(echo "$HP_ALL" | awk '/RESULT/ && $20>p {p=$20} END {print p+0}')
read -r hp_btps hp_bgf hp_bms <<<"$(echo "$HP_ALL" | awk '/RESULT/ && (b=="" || $18<b) {b=$18; t=$14; g=$16} END {print t, g, b}')"
read -r pt_tps pt_gf pt_ms <<<"$(echo "$PT_ALL" | awk '/RESULT/ {t=$4; g=$6; m=$8} END {print t, g, m}')"
read -r pt_btps pt_bgf pt_bms <<<"$(echo "$PT_ALL" | awk '/RESULT/ && (b=="" || $14<b) {b=$14; t=$10; g=$12} END {print t, g, b}')"
if [ "$COMPILE" != 0 ]; then
    read -r pc_tps pc_gf pc_ms <<<"$(echo "$PC_ALL" | awk '/RESULT/ {t=$4; g=$6; m=$8} END {print t, g, m}')"
    read -r pc_btps pc_bgf pc_bms <<<"$(echo "$PC_ALL" | awk '/RESULT/ && (b=="" || $14<b) {b=$14; t=$10; g=$12} END {print t, g, b}')"
else
    pc_tps=- pc_gf=- pc_ms=- pc_btps=- pc_bgf=- pc_bms=-
fi
pt_peak=$(echo "$PT_ALL" | awk '/RESULT/ && $16>p {p=$16} END {print p}')
pct() { [ "$1" = - ] && { echo -; return; }; awk -v g="$1" -v p="$peak" 'BEGIN{printf "%.1f", 100*g/p}'; }
pctf() { { [ "$1" = - ] || [ "$fma" = 0 ]; } && { echo -; return; }; awk -v g="$1" -v p="$fma" 'BEGIN{printf "%.1f", 100*g/p}'; }
echo
printf '%-30s %14s %14s %14s\n' "" "hyperparallel" "PyTorch eager" "torch.compile"
printf '%-30s %14s %14s %14s\n' "median step, last round (ms)" "$hp_ms" "$pt_ms" "$pc_ms"
printf '%-30s %14s %14s %14s\n' "  tokens/s" "$hp_tps" "$pt_tps" "$pc_tps"
printf '%-30s %14s %14s %14s\n' "  GFLOP/s" "$hp_gf" "$pt_gf" "$pc_gf"
printf '%-30s %14s %14s %14s\n' "  MFU vs sgemm peak (%)" "$(pct "$hp_gf")" "$(pct "$pt_gf")" "$(pct "$pc_gf")"
printf '%-30s %14s %14s %14s\n' "  MFU vs f32 FMA peak (%)" "$(pctf "$hp_gf")" "$(pctf "$pt_gf")" "$(pctf "$pc_gf")"
printf '%-30s %14s %14s %14s\n' "best step, all rounds (ms)" "$hp_bms" "$pt_bms" "$pc_bms"
printf '%-30s %14s %14s %14s\n' "  tokens/s" "$hp_btps" "$pt_btps" "$pc_btps"
printf '%-30s %14s %14s %14s\n' "  GFLOP/s" "$hp_bgf" "$pt_bgf" "$pc_bgf"
printf '%-30s %14s %14s %14s\n' "  MFU vs sgemm peak (%)" "$(pct "$hp_bgf")" "$(pct "$pt_bgf")" "$(pct "$pc_bgf")"
printf '%-30s %14s %14s %14s\n' "  MFU vs f32 FMA peak (%)" "$(pctf "$hp_bgf")" "$(pctf "$pt_bgf")" "$(pctf "$pc_bgf")"
# bfloat16: hyperparallel --dtype bfloat16 against PyTorch eager under CPU autocast bf16 (last
# round's medians, best steps over all rounds)
if [ "$BF16" != 0 ]; then
    read -r hb_tps hb_ms <<<"$(echo "$HB_ALL" | awk '/RESULT/ {t=$4; m=$12} END {print t, m}')"
    read -r hb_btps hb_bms <<<"$(echo "$HB_ALL" | awk '/RESULT/ && (b=="" || $18<b) {b=$18; t=$14} END {print t, b}')"
    read -r pa_tps pa_ms <<<"$(echo "$PA_ALL" | awk '/RESULT/ {t=$4; m=$8} END {print t, m}')"
    read -r pa_btps pa_bms <<<"$(echo "$PA_ALL" | awk '/RESULT/ && (b=="" || $14<b) {b=$14; t=$10} END {print t, b}')"
    printf '%-30s %14s %14s\n' "bf16" "hp bfloat16" "torch autocast"
    printf '%-30s %14s %14s\n' "  median step, last round (ms)" "$hb_ms" "$pa_ms"
    printf '%-30s %14s %14s\n' "  tokens/s" "$hb_tps" "$pa_tps"
    printf '%-30s %14s %14s\n' "  best step (ms)" "$hb_bms" "$pa_bms"
    printf '%-30s %14s %14s\n' "  tokens/s" "$hb_btps" "$pa_btps"
    echo "bf16 speed-up over PyTorch autocast: median $(awk -v a="$hb_tps" -v b="$pa_tps" 'BEGIN{printf "%.2fx", a/b}'), best $(awk -v a="$hb_btps" -v b="$pa_btps" 'BEGIN{printf "%.2fx", a/b}'); hyperparallel bf16 / its f32: median $(awk -v a="$hb_tps" -v b="$hp_tps" 'BEGIN{printf "%.2fx", a/b}')"
else
    printf '%-30s %14s %14s %14s\n' "bf16 (autocast) step" "not run" "not run" "not run"
fi
if [ -n "${BASE_BUILD:-}" ]; then
    read -r b_tps b_ms <<<"$(echo "$BASE_ALL" | awk '/RESULT/ {t=$4; m=$12} END {print t, m}')"
    read -r b_btps b_bms <<<"$(echo "$BASE_ALL" | awk '/RESULT/ && (b=="" || $18<b) {b=$18; t=$14} END {print t, b}')"
    printf '%-30s %14s %14s\n' "base build ($BASE_BUILD)" "median (ms)" "best (ms)"
    printf '%-30s %14s %14s\n' "  step" "$b_ms" "$b_bms"
    printf '%-30s %14s %14s\n' "  tokens/s" "$b_tps" "$b_btps"
    echo "this build vs the base build: median $(awk -v a="$hp_tps" -v b="$b_tps" 'BEGIN{printf "%.3fx", a/b}'), best $(awk -v a="$hp_btps" -v b="$b_btps" 'BEGIN{printf "%.3fx", a/b}')"
fi
echo "sgemm peak (OpenBLAS cblas_sgemm, $THREADS threads, best seen in the rounds): $peak GFLOP/s; PyTorch's own torch.mm peak: $pt_peak GFLOP/s"
echo "f32 FMA peak (hp_cpu_fma_peak_flops, $THREADS threads, best seen in the rounds): $fma GFLOP/s (the sgemm peak is $(awk -v a="$peak" -v b="$fma" 'BEGIN{if (b>0) printf "%.1f%%", 100*a/b; else printf "-"}') of it)"
echo "speed-up over PyTorch eager: median $(awk -v a="$hp_tps" -v b="$pt_tps" 'BEGIN{printf "%.2fx", a/b}'), best $(awk -v a="$hp_btps" -v b="$pt_btps" 'BEGIN{printf "%.2fx", a/b}') (issue 27 goal >= 1.3x; MFU goal >= 75% of the sgemm peak)"
# paired ratios: round r's hyperparallel run against round r's PyTorch runs (adjacent in time,
# so they saw similar load); median and range over the rounds, of the median steps and of the
# best steps
paired() {   # label A_LINES B_LINES field: ratio of field $4 (tokens/s, median step) and $10 / $14
    paste -d' ' <(echo "$2" | awk '/RESULT/ {print $4, ($1=="RESULT" && $2=="hp") ? $14 : $10}') \
                <(echo "$3" | awk '/RESULT/ {print $4, $10}') |
        awk -v label="$1" '{m[NR]=$1/$3; b[NR]=$2/$4} END {
            n=NR; if (n == 0) exit;
            for (i=1;i<=n;i++) for (j=i+1;j<=n;j++) { if (m[j]<m[i]) {t=m[i];m[i]=m[j];m[j]=t} if (b[j]<b[i]) {t=b[i];b[i]=b[j];b[j]=t} }
            med=(n%2)?m[(n+1)/2]:(m[n/2]+m[n/2+1])/2; bmed=(n%2)?b[(n+1)/2]:(b[n/2]+b[n/2+1])/2;
            printf "paired over %d rounds, hyperparallel / %s: median steps %.2fx (%.2f-%.2f), best steps %.2fx (%.2f-%.2f)\n",
                   n, label, med, m[1], m[n], bmed, b[1], b[n] }'
}
paired "PyTorch eager" "$HP_ALL" "$PT_ALL"
[ "$COMPILE" != 0 ] && paired "torch.compile" "$HP_ALL" "$PC_ALL"
[ "$BF16" != 0 ] && paired "PyTorch autocast bf16 (both bf16)" "$HB_ALL" "$PA_ALL"
if [ "$COMPILE" != 0 ]; then
    echo "speed-up over torch.compile: median $(awk -v a="$hp_tps" -v b="$pc_tps" 'BEGIN{printf "%.2fx", a/b}'), best $(awk -v a="$hp_btps" -v b="$pc_btps" 'BEGIN{printf "%.2fx", a/b}')"
fi
# what 3x PyTorch's best step would need, against the highest register peaks seen
read -r pk_f32 pk_bf16 mfpt <<<"$(echo "$PK_ALL" | awk '/RESULT peaks/ {if ($4>f) f=$4; if ($6>b) b=$6; m=$8} END {print f+0, b+0, m+0}')"
if awk -v b="$pk_bf16" 'BEGIN{exit !(b > 0)}'; then
    need=$(awk -v t="$pt_btps" -v m="$mfpt" 'BEGIN{printf "%.1f", 3*t*m/1e3}')
    echo "3x PyTorch's best step = $(awk -v t="$pt_btps" 'BEGIN{printf "%.0f", 3*t}') tokens/s = $need GFLOP/s at $mfpt MFLOP/token:" \
         "$(awk -v n="$need" -v p="$peak" 'BEGIN{printf "%.0f%%", 100*n/p}') of the sgemm peak," \
         "$(awk -v n="$need" -v p="$pk_f32" 'BEGIN{printf "%.0f%%", 100*n/p}') of the f32 FMA register peak ($pk_f32)," \
         "$(awk -v n="$need" -v p="$pk_bf16" 'BEGIN{printf "%.0f%%", 100*n/p}') of the bf16 dot-product register peak ($pk_bf16 GFLOP/s)"
fi

fi   # ROUNDS > 0

if [ -f "$BUILD/libhyperparallel.so" ]; then
    echo
    echo "== interleaved (one process, alternating steps): $PY $ROOT/bench/train_step_torch.py ${ARGS[*]} --interleave $BUILD/libhyperparallel.so"
    IL_OUT=$("$PY" "$ROOT/bench/train_step_torch.py" "${ARGS[@]}" ${IL_STEPS:+--steps "$IL_STEPS"} --interleave "$BUILD/libhyperparallel.so")
    echo "$IL_OUT"
    read -r i_hp_tps i_hp_gf i_hp_ms i_hp_btps i_hp_bgf i_hp_bms <<<"$(echo "$IL_OUT" | awk '/^RESULT hp_interleaved/ {print $4, $6, $8, $10, $12, $14}')"
    read -r i_pt_tps i_pt_gf i_pt_ms i_pt_btps i_pt_bgf i_pt_bms <<<"$(echo "$IL_OUT" | awk '/^RESULT torch/ {print $4, $6, $8, $10, $12, $14}')"
    printf '%-30s %14s %14s\n' "interleaved" "hyperparallel" "PyTorch eager"
    printf '%-30s %14s %14s\n' "median step (ms)" "$i_hp_ms" "$i_pt_ms"
    printf '%-30s %14s %14s\n' "  tokens/s" "$i_hp_tps" "$i_pt_tps"
    printf '%-30s %14s %14s\n' "  MFU vs sgemm peak (%)" "$(pct "$i_hp_gf")" "$(pct "$i_pt_gf")"
    printf '%-30s %14s %14s\n' "  MFU vs f32 FMA peak (%)" "$(pctf "$i_hp_gf")" "$(pctf "$i_pt_gf")"
    printf '%-30s %14s %14s\n' "best step (ms)" "$i_hp_bms" "$i_pt_bms"
    printf '%-30s %14s %14s\n' "  tokens/s" "$i_hp_btps" "$i_pt_btps"
    printf '%-30s %14s %14s\n' "  MFU vs sgemm peak (%)" "$(pct "$i_hp_bgf")" "$(pct "$i_pt_bgf")"
    echo "speed-up over PyTorch (interleaved): median $(awk -v a="$i_hp_tps" -v b="$i_pt_tps" 'BEGIN{printf "%.2fx", a/b}'), best $(awk -v a="$i_hp_btps" -v b="$i_pt_btps" 'BEGIN{printf "%.2fx", a/b}')"
    echo "$IL_OUT" | grep '^paired steps' || true
    if [ "$COMPILE" != 0 ]; then
        echo
        echo "== interleaved with torch.compile: $PY $ROOT/bench/train_step_torch.py ${ARGS[*]} --interleave $BUILD/libhyperparallel.so --compile"
        IC_OUT=$("$PY" "$ROOT/bench/train_step_torch.py" "${ARGS[@]}" ${IL_STEPS:+--steps "$IL_STEPS"} --interleave "$BUILD/libhyperparallel.so" --compile)
        echo "$IC_OUT"
        read -r c_hp_tps c_hp_btps <<<"$(echo "$IC_OUT" | awk '/^RESULT hp_interleaved/ {print $4, $10}')"
        read -r c_pt_tps c_pt_btps <<<"$(echo "$IC_OUT" | awk '/^RESULT torch_compile/ {print $4, $10}')"
        echo "speed-up over torch.compile (interleaved): median $(awk -v a="$c_hp_tps" -v b="$c_pt_tps" 'BEGIN{printf "%.2fx", a/b}'), best $(awk -v a="$c_hp_btps" -v b="$c_pt_btps" 'BEGIN{printf "%.2fx", a/b}')"
        echo "$IC_OUT" | grep '^paired steps' || true
    fi
    if [ "$BF16" != 0 ]; then
        echo
        echo "== interleaved bf16: $PY $ROOT/bench/train_step_torch.py ${ARGS[*]} --interleave $BUILD/libhyperparallel.so --autocast"
        IB_OUT=$("$PY" "$ROOT/bench/train_step_torch.py" "${ARGS[@]}" ${IL_STEPS:+--steps "$IL_STEPS"} --interleave "$BUILD/libhyperparallel.so" --autocast)
        echo "$IB_OUT"
        read -r b_hp_tps b_hp_btps <<<"$(echo "$IB_OUT" | awk '/^RESULT hp_interleaved/ {print $4, $10}')"
        read -r b_pt_tps b_pt_btps <<<"$(echo "$IB_OUT" | awk '/^RESULT torch_autocast/ {print $4, $10}')"
        echo "bf16 speed-up over PyTorch autocast (interleaved): median $(awk -v a="$b_hp_tps" -v b="$b_pt_tps" 'BEGIN{printf "%.2fx", a/b}'), best $(awk -v a="$b_hp_btps" -v b="$b_pt_btps" 'BEGIN{printf "%.2fx", a/b}')"
        echo "$IB_OUT" | grep '^paired steps' || true
    fi
    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
