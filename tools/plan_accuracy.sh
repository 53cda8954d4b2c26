#!/usr/bin/env bash
# Predicted vs measured step time of a few layouts (docs/planner.md, docs/performance.md):
#   tools/plan_accuracy.sh BUILD CALIBRATION TOKENIZER
# For each (world, layout pattern) hp-plan predicts every layout of the llama3 debugmodel at
# seq 128, local batch 2, global batch 2 x world; the first row matching the pattern is run with
# hp-train for 8 steps (metrics every step), PLAN_ROUNDS times (default 2) interleaved with the
# other layouts, and the median step_time_s over steps 3-8 of every round is printed
# beside the prediction. OMP_NUM_THREADS=1 per rank (as the calibration).
set -euo pipefail
BUILD=${1:?build dir}; CAL=${2:?calibration}; TOK=${3:?tokenizer.json}
OUT=${PLAN_OUT:-/tmp/hp_plan_accuracy}; mkdir -p "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
COMMON=(--config examples/llama3_debug.yaml --tokenizer.path="$TOK" --training.seq_len=128
        --training.local_batch_size=2 --job.dump_folder= --training.deterministic=false)
CORPUS=/usr/share/games/fortunes
files=$(find "$CORPUS" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort | head -1)
# rows: world | a regular expression over hp-plan's overrides column
ROWS=${PLAN_ROWS:-"1|pipeline_parallel_degree=1 --activation_checkpoint.mode=none
2|replicate_degree=1 --parallelism.data_parallel_shard_degree=2 .*pipeline_parallel_degree=1 --activation_checkpoint.mode=none
2|replicate_degree=2 .*pipeline_parallel_degree=1 --activation_checkpoint.mode=none
2|tensor_parallel_degree=2 .*sequence_parallel=true --activation_checkpoint.mode=none
2|pipeline_parallel_degree=2 --parallelism.pipeline_parallel_schedule=1F1B --parallelism.pipeline_parallel_microbatch_size=1 --activation_checkpoint.mode=none
2|replicate_degree=1 --parallelism.data_parallel_shard_degree=2 .*pipeline_parallel_degree=1 --activation_checkpoint.mode=full
4|replicate_degree=1 --parallelism.data_parallel_shard_degree=4 .*pipeline_parallel_degree=1 --activation_checkpoint.mode=none
4|replicate_degree=1 --parallelism.data_parallel_shard_degree=2 --parallelism.tensor_parallel_degree=2 .*sequence_parallel=true --activation_checkpoint.mode=none"}
ROUNDS=${PLAN_ROUNDS:-2}   # each layout runs ROUNDS times, interleaved with the others
printf "%-6s %10s %10s %8s  %s\n" world pred_ms meas_ms err layout
for round in $(seq "$ROUNDS"); do
while IFS='|' read -r W PAT; do
  G=$((2 * W))
  line=$("$BUILD/hp-plan" "${COMMON[@]}" --training.global_batch_size=$G --world "$W" --calibration "$CAL" --top 100000 \
         | grep -E -- "$PAT" | head -1 || true)
  [ -z "$line" ] && { echo "$W no layout matches: $PAT"; continue; }
  pred=$(echo "$line" | awk '{print $2}')
  ov=$(echo "$line" | sed -E 's/^ *[0-9]+ +([0-9.]+ +){6} *//')
  j="$OUT/w${W}_$(echo "$ov" | md5sum | cut -c1-8).r$round.jsonl"; rm -f "$j"
  # shellcheck disable=SC2086
  "${MPIRUN[@]}" -np "$W" "$BUILD/hp-train" "${COMMON[@]}" --training.global_batch_size=$G $ov \
      --data.path="$files" --data.format=text --data.text_separator=percent --validation.enable=false \
      --training.steps=8 --metrics.log_freq=1 --metrics.jsonl_file="$j" --metrics.peak_flops=-1 --metrics.enable_tensorboard=false \
      --training.memory_limit_gib=-1 </dev/null >"$j.log" 2>&1 || { echo "$W run failed: $ov (see $j.log)"; continue; }
  [ "$round" -lt "$ROUNDS" ] && continue
  meas=$(cat "${j%.r*.jsonl}".r*.jsonl | grep '"step_time_s"' | python3 -c '
import json,sys,statistics
v=[json.loads(l) for l in sys.stdin]
t=[x["step_time_s"] for x in v if x.get("step",0)>=3 and "step_time_s" in x]
print("%.2f"%(1e3*statistics.median(t)))')
  err=$(python3 -c "print('%+.0f%%'%(100*($pred-$meas)/$meas))")
  printf "%-6s %10s %10s %8s  %s\n" "$W" "$pred" "$meas" "$err" "$ov"
done <<< "$ROWS"
done
