#!/usr/bin/env bash
# Tokenizer encode speed against HF `tokenizers` in the same run (docs/performance.md): the
# goldens' multilingual sample through each family's tokenizer.json, one thread on both sides.
#   tools/bench_tokenizer.sh [build] [reps]      PYTHON=... a Python with `tokenizers`
set -euo pipefail
BUILD=${1:-build}
REPS=${2:-5}
PY=${PYTHON:-python3}
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== HyperParallel-C ($BUILD/bench_tokenizer, one thread)"
"$BUILD/bench_tokenizer" --reps "$REPS" | tee /tmp/hp_bench_tok_c.txt
echo "== HF tokenizers (bench/tokenizer_hf.py, RAYON_NUM_THREADS=1)"
if "$PY" -c "import tokenizers" 2>/dev/null; then
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$PY" bench/tokenizer_hf.py --reps "$REPS" | tee /tmp/hp_bench_tok_hf.txt
  echo "== speed-up (ours / HF's best of batch and loop for samples; documents / documents)"
  "$PY" - <<'PYEOF'
c, h = {}, {}
for line in open("/tmp/hp_bench_tok_c.txt"):
    f = line.split()
    if len(f) == 5 and f[1] in ("samples", "documents"):
        c[(f[0], f[1])] = float(f[2])
for line in open("/tmp/hp_bench_tok_hf.txt"):
    f = line.split()
    if len(f) >= 4 and f[1] in ("samples", "documents"):
        key = (f[0], f[1])
        h[key] = max(h.get(key, 0.0), float(f[-2]))
print(f"{'family':12s} {'mode':10s} {'ours MB/s':>10s} {'HF MB/s':>8s} {'x':>6s}")
worst = None
for k in c:
    if k in h:
        r = c[k] / h[k]
        worst = r if worst is None else min(worst, r)
        print(f"{k[0]:12s} {k[1]:10s} {c[k]:10.2f} {h[k]:8.2f} {r:6.1f}")
print(f"lowest speed-up: {worst:.1f}x")
PYEOF
else
  echo "SKIP: no Python with tokenizers (pip install tokenizers==0.23.3; PYTHON=...)"
fi
