#!/usr/bin/env bash
# Bitwise fingerprint of a build's numerics, for refactors that must not change a bit: the
# gradient hash of one step of each model family (tests/support/model_grad_hash.c) and 10
# steps of hp-train under llama3 FSDP 2, TP 2, PP 2, CP 2 and qwen3_moe EP 2 (the numeric
# fields of the metrics JSONL and the sha256 of the final weights file). Two builds whose
# fingerprints are equal give bitwise the same results:
#   tools/layout_fingerprint.sh build-old > old.txt; tools/layout_fingerprint.sh build > new.txt
#   diff old.txt new.txt
# Same machine, same thread counts (1 per rank); times and memory are left out.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$(dirname "$0")/.."

gcc -O2 -fopenmp -I include tests/support/model_grad_hash.c -o "$WORK/gh" -L"$BUILD" -lhyperparallel \
    -Wl,-rpath,"$BUILD"
"$WORK/gh"

corpus="$WORK/corpus.txt"
for i in $(seq 1 400); do
  echo "document $i: the quick brown fox $((i * 7 % 13)) jumps over the lazy dog $((i % 5)) times."
  echo "%"
done > "$corpus"
common=(--training.steps=10 --training.seq_len=32 --training.local_batch_size=2 --training.seed=3
        --training.deterministic=true --tokenizer.path=tests/data/tokenizer/ours.json
        --data.path="$corpus" --data.format=text --data.text_separator=percent --validation.enable=false
        --metrics.log_freq=1 --metrics.enable_tensorboard=false --checkpoint.enable=false
        --job.print_config=false --model.n_layers=4)
run() {   # name model nproc overrides...
  local name=$1 model=$2 np=$3
  shift 3
  local out="$WORK/$name"
  "$BUILD/hp-train" --nproc "$np" --config examples/llama3_debug.yaml --model.name="$model" \
      --job.dump_folder="$out" "${common[@]}" "$@" > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
  local f
  for f in "$out"/metrics.jsonl*; do
    sed -E 's/, "(tokens_per_s|tflops|mfu_pct|mfu_sgemm_pct|step_time_s|elapsed_s|eta_s|rss_bytes|peak_rss_bytes)": [^,}]*//g' "$f" |
      sed "s|^|$name $(basename "$f") |"
  done
  echo "$name weights $(sha256sum "$out/weights.safetensors" | cut -c1-64)"
}
run fsdp2 llama3 2 --parallelism.data_parallel_shard_degree=2
run tp2 llama3 2 --parallelism.data_parallel_shard_degree=1 --parallelism.tensor_parallel_degree=2
run pp2 llama3 2 --parallelism.data_parallel_shard_degree=1 --parallelism.pipeline_parallel_degree=2 \
    --parallelism.pipeline_parallel_microbatch_size=1
run cp2 llama3 2 --parallelism.data_parallel_shard_degree=1 --parallelism.context_parallel_degree=2
run ep2 qwen3_moe 2 --parallelism.data_parallel_shard_degree=2 --parallelism.expert_parallel_degree=2
