#!/usr/bin/env bash
# `make demo`: train TorchTitan's llama3 debugmodel on the bundled English corpus (Debian's
# fortunes) with FSDP (fully_shard) on 2 MPI ranks, then sample text from the trained weights.
# The tokenizer is trained from the same corpus on first run and cached in outputs/.
set -euo pipefail
BUILD=${1:-build}
NPROC=${HP_DEMO_NPROC:-2}
STEPS=${HP_DEMO_STEPS:-300}
OUT=outputs/demo
CORPUS=/usr/share/games/fortunes
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1

if [ ! -s "$OUT/tokenizer.json" ]; then
  echo "== training a 2048-token byte-level BPE tokenizer on $CORPUS (cached in $OUT/tokenizer.json)"
  files=$(find "$CORPUS" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  "$BUILD/hp-tokenizer" train --vocab-size 2048 --output "$OUT/tokenizer.json" \
      --special "<|begin_of_text|>,<|end_of_text|>" --separator % --quiet $files
fi

echo "== DTensor at a glance: a 2x2 mesh and redistributes on 4 ranks"
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
"${MPIRUN[@]}" -np 4 "$BUILD/example_mesh_redistribute" | head -40

echo "== hp-train: llama3 debugmodel, FSDP over $NPROC ranks, $STEPS steps"
"$BUILD/hp-train" --nproc "$NPROC" --config examples/llama3_debug.yaml \
    --job.dump_folder="$OUT" --job.print_config=false \
    --tokenizer.path="$OUT/tokenizer.json" \
    --training.steps="$STEPS" --training.local_batch_size=4 \
    --parallelism.data_parallel_replicate_degree=1 --parallelism.data_parallel_shard_degree="$NPROC" \
    --validation.freq=50 --metrics.log_freq=20

echo "== hp-generate: a sample from the trained model"
for prompt in "The computer" "Love is"; do
  echo "--- prompt: \"$prompt\""
  "$BUILD/hp-generate" --weights "$OUT/weights.safetensors" --tokenizer "$OUT/tokenizer.json" \
      --prompt "$prompt" --max-new-tokens 48 --temperature 0.8 --top-k 40 --seed 7
done
