#!/usr/bin/env bash
# utf8proc vs ICU on the tokenizer goldens' sample (docs/dependencies.md): builds
# tools/nf_compare.c against both (needs libicu-dev, which the project itself does not) and
# runs it on the sample as it is and decomposed (every mark to recompose).
set -euo pipefail
PY=${PYTHON:-python3}
OUT=${TMPDIR:-/tmp}/hp_nf_compare
mkdir -p "$OUT"
gcc -O2 -o "$OUT/nf_compare" tools/nf_compare.c $(pkg-config --cflags --libs icu-uc) -lutf8proc
"$PY" - "$OUT" <<'PYEOF'
import struct, sys, unicodedata
data = open("tests/data/tokenizer/hf/samples.bin", "rb").read()
n = struct.unpack_from("<I", data, 8)[0]; off = 12; out = []
for _ in range(n):
    l = struct.unpack_from("<I", data, off)[0]; out.append(data[off + 4:off + 4 + l].decode()); off += 4 + l
open(sys.argv[1] + "/sample.txt", "w").write("\0".join(out))
open(sys.argv[1] + "/sample_nfd.txt", "w").write("\0".join(unicodedata.normalize("NFD", s) for s in out))
PYEOF
echo "== the sample as it is"; "$OUT/nf_compare" "$OUT/sample.txt" 20
echo "== the sample in NFD"; "$OUT/nf_compare" "$OUT/sample_nfd.txt" 20
