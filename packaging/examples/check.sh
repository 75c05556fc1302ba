#!/bin/sh
# Builds the two consumers of an installed MelonDMA and runs them on a soft device (ctest
# install_consumers and the Homebrew formula's test run this; packaging/examples/README.md).
#   check.sh <prefix> <work dir> [<IPv4 address for the soft device, default 127.0.0.1>]
# Environment: CC (default cc), CMAKE (default cmake), PKG_CONFIG (default pkg-config).
set -eu
prefix=$1 work=$2 addr=${3:-127.0.0.1}
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc} cmake=${CMAKE:-cmake} pkgconfig=${PKG_CONFIG:-pkg-config}
pc=$(find "$prefix" -name libibverbs.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || { echo "FAIL: no libibverbs.pc under $prefix"; exit 1; }
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
# Only our soft device, whatever the host has or is configured with.
MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG=/nonexistent MELON_SOFT_DEVICES=hello0=$addr
export MELON_SOFT_AUTO MELON_SOFT_CONFIG MELON_SOFT_DEVICES
mkdir -p "$work"

echo "== pkg-config"
for lib in libibverbs libmlx5 libefa; do
  echo "$lib $("$pkgconfig" --modversion $lib): $("$pkgconfig" --cflags --libs $lib)"
done
"$pkgconfig" --atleast-version=1.14 libibverbs || { echo "FAIL: libibverbs older than rdma-core's 1.14"; exit 1; }
libdir=$("$pkgconfig" --variable=libdir libibverbs)
[ -d "$libdir" ] || { echo "FAIL: libibverbs.pc's libdir $libdir is no directory"; exit 1; }
# shellcheck disable=SC2046  # pkg-config's words are meant to split
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/hello-pkgconfig" "$here/verbs_hello.c" \
      $("$pkgconfig" --cflags --libs libibverbs)
# A library found by -L at link time is found at run time through the loader's path.
LD_LIBRARY_PATH=$libdir DYLD_LIBRARY_PATH=$libdir "$work/hello-pkgconfig" hello0 "$libdir"

echo "== CMake find_package"
"$cmake" -S "$here" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; echo "FAIL: configuring the CMake consumer"; exit 1; }
grep 'verbs_hello: MelonDMA' "$work/cmake.log"
"$cmake" --build "$work/cmake" >"$work/build.log" 2>&1 || { cat "$work/build.log"; echo "FAIL: building it"; exit 1; }
# No library path: CMake's build rpath leads to the install.
"$work/cmake/verbs_hello" hello0 "$libdir"
"$work/cmake/verbs_hello_findlib" hello0 "$libdir"
echo "check.sh: both consumers built and ran against $prefix"
