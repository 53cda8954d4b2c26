#!/usr/bin/env bash
# TorchTitan (PyPI, unmodified, run through titan_peer/titan_cpu_run.py) vs hp-train on the same
# data, tokenizer, shapes, optimizer and schedule, on the CPU: 1 rank x 2 threads and FSDP over
# 2 ranks x 1 thread, TorchTitan eager and torch.compile; for the MoE models hp-train also runs
# FSDP 2 with expert parallel 2 (job hp_fsdp2ep2). TorchTitan cannot run EP on the CPU: its
# token dispatch calls all_to_all_single with uneven splits, which gloo refuses
# ("ProcessGroupGloo::alltoall: invalid tensor size at index 1 (expected (1378, 256), got (1694,
# 256))"), so its 2-rank MoE layout is FSDP 2 (the experts sharded like every parameter).
# MODEL picks the model:
#   llama3       TorchTitan's llama3 debugmodel (dim 256, 6 layers, 16 heads, vocab 2048);
#   deepseek_v3  TorchTitan's deepseek_v3 debugmodel (MLA, 8 experts top-3 + 2 shared; hp-train's
#                deepseek_v3/debugmodel flavor has the same sizes);
#   qwen3_moe    TorchTitan 0.3.0's qwen3 debugmodel_moe (8 MoE layers, dim 256, 16 / 8 heads of
#                128, 64 experts of hidden 768, top-8, softmax + route_norm); hp-train's
#                qwen3_moe/debugmodel with the model.* keys set to those sizes (its own flavor is
#                TorchTitan's earlier, smaller debug MoE).
# seq 128, local batch 8, AdamW, float32 (TorchTitan's GroupedExperts computes the expert GEMMs
# in bfloat16 whatever training.dtype says: models/common/moe.py GroupedExperts.forward).
#
#   tools/titan_peer.sh BUILD_DIR WORK_DIR   (from the project root)
#
# Adapted from the lead's peer harness ../shared/peer/titan_cpu.sh (llama3 only, outside the
# repository); the Python helpers beside it are copied into tools/titan_peer/ (the config
# module extended to the MoE models). Tests do not use it; it needs PyPI's torch and torchtitan.
#
# BUILD_DIR holds hp-train and hp-tokenizer; the example config is taken from the source tree
# recorded in BUILD_DIR/CMakeCache.txt (override: SRC=...). Needs python3 with torch (CPU use
# is enough), gcc for torch.compile, mpirun for hp-train --nproc 2, PyPI for torchtitan.
# Env: MODEL (llama3), ROUNDS (4), STEPS (30), SKIP (5: steps <= SKIP are warm-up), COMPILE (1),
#      PY (python3), TITAN_VERSION (0.3.0), CORPUS (/usr/share/games/fortunes),
#      QUIET_WAIT (600 s), QUIET_MAX (5.0) (machine-load handling, below).
# Runs alternate within each round (hp, TorchTitan eager, TorchTitan compiled; reversed in
# even rounds) so all see the same machine load. Logs: WORK_DIR/logs; table: titan_summary.py.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR WORK_DIR" >&2; exit 2; }
BUILD=$(cd "$1" && pwd)
mkdir -p "$2"
WORK=$(cd "$2" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/titan_peer
SRC=${SRC:-$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)}
CONFIG=$SRC/examples/llama3_debug.yaml
CORPUS=${CORPUS:-/usr/share/games/fortunes}
ROUNDS=${ROUNDS:-4} STEPS=${STEPS:-30} SKIP=${SKIP:-5} COMPILE=${COMPILE:-1} MODEL=${MODEL:-llama3}
PY=${PY:-python3} TITAN_VERSION=${TITAN_VERSION:-0.3.0}
for f in "$BUILD/hp-train" "$BUILD/hp-tokenizer" "$CONFIG" "$CORPUS"; do
    [ -e "$f" ] || { echo "titan_peer.sh: missing $f" >&2; exit 2; }
done
"$PY" -c 'import torch' || { echo "titan_peer.sh: $PY has no torch" >&2; exit 2; }
case $MODEL in
    llama3) HP_MODEL=(); TT_CONFIG=llama3_debugmodel_cpu; HP_LAYOUT2=(); TT_LAYOUT2=() ;;
    deepseek_v3) HP_MODEL=(--model.name=deepseek_v3); TT_CONFIG=deepseek_v3_debugmodel_cpu ;;
    qwen3_moe) HP_MODEL=(--model.name=qwen3_moe --model.n_layers=8 --model.head_dim=128 --model.moe_num_experts=64
                         --model.moe_top_k=8 --model.moe_hidden_dim=768 --model.moe_n_dense_layers=0)
               TT_CONFIG=qwen3_moe_debug_cpu ;;
    *) echo "titan_peer.sh: MODEL=$MODEL, expected llama3, deepseek_v3 or qwen3_moe" >&2; exit 2 ;;
esac
HP_EP=0
[ "$MODEL" != llama3 ] && HP_EP=1   # hp-train only: FSDP 2 x EP 2 (job hp_fsdp2ep2)

# 1. TorchTitan in a venv that reuses the interpreter's torch
VENV=$WORK/venv
if "$PY" -c 'import torchtitan' 2>/dev/null; then   # PY's environment has it already
    VPY=$PY
else
    if ! "$VENV/bin/python" -c 'import torchtitan' 2>/dev/null; then
        "$PY" -m venv --system-site-packages "$VENV"
        "$VENV/bin/pip" install -q "torchtitan==$TITAN_VERSION"
    fi
    VPY=$VENV/bin/python
fi
"$VPY" -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "torchtitan", m.version("torchtitan"))'

# 2. one tokenizer (BOS/EOS, 2048) from the corpus hp-train reads, and a JSONL of its documents
mapfile -t FILES < <(find "$CORPUS" -maxdepth 1 -type f ! -name '*.dat' ! -name '.*' | LC_ALL=C sort)
"$BUILD/hp-tokenizer" train --vocab-size 2048 --output "$WORK/tok.json" --separator % \
    --special "<|begin_of_text|>,<|end_of_text|>" --quiet "${FILES[@]}"
"$PY" "$HERE/titan_prep_data.py" "$CORPUS" "$WORK/tok.json" "$WORK/assets"

# 3. the runs
LOGS=$WORK/logs_$MODEL
mkdir -p "$LOGS"
HP_ARGS=(--config "$CONFIG" "${HP_MODEL[@]}" --tokenizer.path="$WORK/tok.json" --training.steps="$STEPS"
         --training.mixed_precision_param=float32 --training.mixed_precision_reduce=float32
         --metrics.log_freq=1 --metrics.enable_tensorboard=false --validation.enable=false)
# TorchTitan: same data, tokenizer, shapes, optimizer and schedule as the example config;
# its own defaults otherwise (fused QKV, chunked loss, fused AdamW), AC off as in the example.
TT_ARGS=(--module titan_cpu_cfg --config "$TT_CONFIG"
         --hf-assets-path "$WORK/assets/tokenizer"
         --dataloader.dataset c4_test --dataloader.dataset-path "$WORK/assets/fortunes_ds"
         --training.seq-len 128 --training.local-batch-size 8 --training.steps "$STEPS"
         --training.max-norm 1.0 --training.dtype float32
         --training.mixed-precision-param float32 --training.mixed-precision-reduce float32
         --training.disable-cuda-graphs
         --optimizer.param-groups.0.optimizer-kwargs.lr 0.002
         --optimizer.param-groups.0.optimizer-kwargs.betas 0.9 0.95
         --optimizer.param-groups.0.optimizer-kwargs.eps 1e-8
         --optimizer.param-groups.0.optimizer-kwargs.weight-decay 0.1
         --lr-scheduler.warmup-steps 20 --lr-scheduler.decay-ratio 0.8
         --lr-scheduler.decay-type cosine --lr-scheduler.min-lr-factor 0.1
         --metrics.log-freq 1 --checkpoint.no-enable --validator.no-enable --debug.seed 0)
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor_cache

# Shared machine: before each run wait (up to QUIET_WAIT s) until the CPUs have been at
# most 10% busy (/proc/stat) in each of 5 seconds in a row; during the run sample
# /proc/stat procs_running once a second (the run adds about its thread count). The summary
# prints the mean per run and medians over all runs and over the runs whose mean is
# <= QUIET_MAX.
QUIET_WAIT=${QUIET_WAIT:-600}
procs_running() { awk '/^procs_running/ {print $2}' /proc/stat; }
cpu_jiffies() { awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
wait_quiet() {
    local t=0 q=0 b0 t0 b1 t1
    read -r b0 t0 < <(cpu_jiffies)
    while [ "$t" -lt "$QUIET_WAIT" ] && [ "$q" -lt 5 ]; do
        sleep 1; t=$((t + 1))
        read -r b1 t1 < <(cpu_jiffies)
        if [ $(((b1 - b0) * 10)) -le $((t1 - t0)) ]; then q=$((q + 1)); else q=0; fi
        b0=$b1; t0=$t1
    done
    [ "$q" -ge 5 ] || echo "   machine not quiet after ${QUIET_WAIT}s; running anyway"
}
sample_load() { while :; do echo "load_sample $(procs_running)"; sleep 1; done; }
with_load() {   # log cmd...: run cmd with stdout+stderr to log, load samples appended
    local log=$1; shift
    wait_quiet
    sample_load > "$log.load" & local sp=$!
    "$@" > "$log" 2>&1 || echo "   FAILED (see $log)"
    kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null || true
    cat "$log.load" >> "$log"; rm -f "$log.load"
}

run_hp() {   # name nproc threads round [ep2]
    local out=$WORK/out/$1_r$4 extra=()
    rm -rf "$out"
    [ "${5:-0}" = 1 ] && extra=(--parallelism.expert_parallel_degree=2)
    echo "== $MODEL $1 round $4: hp-train --nproc $2, OMP_NUM_THREADS=$3 ${extra[*]}"
    OMP_NUM_THREADS=$3 OPENBLAS_NUM_THREADS=$3 with_load "$LOGS/$1_r$4.log" \
        "$BUILD/hp-train" --nproc "$2" "${HP_ARGS[@]}" "${extra[@]}" --job.dump_folder="$out"
}
run_tt() {   # name nproc threads round compile(0|1)
    local out=$WORK/out/$1_r$4 extra=()
    rm -rf "$out"
    [ "$5" = 1 ] && extra=(--compile.enable)
    echo "== $MODEL $1 round $4: TorchTitan nproc_per_node $2, OMP_NUM_THREADS=$3, compile=$5 ${extra[*]}"
    OMP_NUM_THREADS=$3 with_load "$LOGS/$1_r$4.log" \
        "$VPY" -m torch.distributed.run --standalone --nproc_per_node "$2" \
        --local-ranks-filter 0 --role rank --tee 3 "$HERE/titan_cpu_run.py" "${TT_ARGS[@]}" \
        "${extra[@]}" --dump-folder "$out" activation-checkpoint:none
}
for r in $(seq 1 "$ROUNDS"); do
    jobs=("hp 1rank 1 2" "tt_eager 1rank 1 2" "hp fsdp2 2 1" "tt_eager fsdp2 2 1")
    [ "$COMPILE" = 1 ] && jobs=("hp 1rank 1 2" "tt_eager 1rank 1 2" "tt_compile 1rank 1 2"
                                "hp fsdp2 2 1" "tt_eager fsdp2 2 1" "tt_compile fsdp2 2 1")
    [ "$HP_EP" = 1 ] && jobs+=("hp_ep fsdp2ep2 2 1")
    if [ $((r % 2)) = 0 ]; then   # reverse order in even rounds
        rev=(); for ((i = ${#jobs[@]} - 1; i >= 0; i--)); do rev+=("${jobs[i]}"); done; jobs=("${rev[@]}")
    fi
    for j in "${jobs[@]}"; do
        read -r kind lay np th <<< "$j"
        case $kind in
            hp) run_hp "hp_$lay" "$np" "$th" "$r" ;;
            hp_ep) run_hp "hp_$lay" "$np" "$th" "$r" 1 ;;
            tt_eager) run_tt "tt_eager_$lay" "$np" "$th" "$r" 0 ;;
            tt_compile) run_tt "tt_compile_$lay" "$np" "$th" "$r" 1 ;;
        esac
    done
done
"$PY" "$HERE/titan_summary.py" "$LOGS" "$SKIP" "${QUIET_MAX:-5.0}" | tee "$WORK/summary_$MODEL.txt"
