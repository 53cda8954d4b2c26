#!/usr/bin/env bash
# Runs a test program under a second OpenBLAS kernel family, one that this CPU supports but
# that OpenBLAS would not pick by itself (docs/testing.md, "Portability"):
#   other_blas_core.sh BLAS_CORE_PROGRAM COMMAND [ARGS...]
# Newer families fall back to the previous generation (AVX-512 -> Haswell, AVX2 -> Sandybridge,
# AVX -> Nehalem); OPENBLAS_CORETYPE=name overrides the choice. A library that ignores the
# variable (not DYNAMIC_ARCH) runs the test under its one family, saying so: the entry is also
# the suite's run of that rank count (docs/testing.md), so it must still run.
set -u
probe=$1; shift
default=$(env -u OPENBLAS_CORETYPE "$probe") || { echo "other_blas_core: $probe failed" >&2; exit 1; }
case "${HP_OTHER_BLAS_CORE:-}" in
  "") case "$default" in
        SkylakeX|Cooperlake|SapphireRapids) other=Haswell ;;
        Haswell|Zen|Excavator|Steamroller|Piledriver|Bulldozer) other=Sandybridge ;;
        Sandybridge) other=Nehalem ;;
        Nehalem|Penryn|Core2|Atom|Barcelona|Opteron) other=Prescott ;;
        ARMV8) other=CORTEXA53 ;;
        *) other=ARMV8 ;;
      esac ;;
  *) other=$HP_OTHER_BLAS_CORE ;;
esac
got=$(OPENBLAS_CORETYPE=$other "$probe")
if [ "$got" = "$default" ]; then
  echo "other_blas_core: OpenBLAS keeps kernel family '$default' under OPENBLAS_CORETYPE=$other (not a" \
       "DYNAMIC_ARCH build?); running under '$default' only"
  export OPENBLAS_CORETYPE=$default
  exec "$@"
fi
echo "OpenBLAS kernel family: $got (this machine's default: $default)"
export OPENBLAS_CORETYPE=$other
exec "$@"
