#!/usr/bin/env bash
# The README's static link from an install prefix (test_pkgconfig_static):
#   pkgconfig_static.sh BUILD_DIR [CMAKE]
# installs the library, headers and hyperparallel.pc (component dev) into a temporary prefix,
# then builds tests/support/pkgconfig_app.c against libhyperparallel.a with the flags of
# `pkg-config --static --libs hyperparallel` alone and runs it. A library missing from the
# .pc fails the link with an undefined reference.
set -euo pipefail
build=$(cd "$1" && pwd)
cmake=${2:-cmake}
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v pkg-config > /dev/null || { echo "SKIP: pkg-config not found"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$cmake" --install "$build" --prefix "$tmp/prefix" --component dev > "$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
set -x
"${CC:-cc}" "$src/tests/support/pkgconfig_app.c" -o "$tmp/app" $(pkg-config --cflags hyperparallel) \
    "$(pkg-config --variable=staticlib hyperparallel)" $(pkg-config --static --libs hyperparallel)
"$tmp/app"
