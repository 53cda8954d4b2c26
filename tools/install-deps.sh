#!/usr/bin/env bash
# Installs the Debian packages HyperParallel-C needs, only those missing; quiet when all are
# present. Each package and why it is needed: docs/dependencies.md.
set -euo pipefail
PKGS=(gcc make cmake pkg-config
      openmpi-bin libopenmpi-dev      # the distributed engine (MPI)
      libopenblas-dev                 # BLAS for every GEMM
      libyaml-dev                     # YAML configs
      libpcre2-dev                    # tokenizer pre-tokenizer regexes
      libutf8proc-dev                 # tokenizer NFC / NFKC normalizers
      libjson-c-dev                   # tokenizer.json, safetensors headers, checkpoint metadata
      libxxhash-dev                   # XXH3 checksums of checkpoint tensors
      libdnnl2                        # oneDNN: bf16 GEMMs on AMX CPUs (dlopen; the tests run both paths)
      fortunes)                       # the bundled English demo corpus
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing missing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
