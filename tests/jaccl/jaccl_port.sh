#!/usr/bin/env bash
# MLX's JACCL (ml-explore/mlx, mlx/distributed/jaccl/lib), built on Linux against our headers and run
# over our libibverbs: a verified two-rank all_sum (jaccl_allsum.cpp) at 4 KiB, 1 MiB and 16 MiB,
# soft<->soft and mlx5_0<->soft, with reliable UC (run.sh). JACCL's source is not ours and is not
# in this repository: MELON_JACCL_SRC names an MLX checkout (or its jaccl/lib folder). The port is
# three edits of a copy, made here and nowhere else:
#   1. its CMakeLists builds on Darwin only: the gate is dropped;
#   2. it does dlopen("librdma.dylib"): libibverbs.so.1 instead;
#   3. its larger buffers are behind __builtin_available(macOS 26.3, ...): taken unconditionally.
# Its GID rule (it publishes the first IPv4-mapped GID and connects with sgid_index 1) is left as it
# is: the soft devices run with gid1=ipv4 and mlx5_0 has the wire GID at 0 and 1.
# Usage: jaccl_port.sh <libdir> <melon-emud> [build-cache-dir]. Exit 77 without MELON_JACCL_SRC.
set -u
libdir=$1 emud=$2
here=$(cd "$(dirname "$0")" && pwd)
include=$(cd "$here/../../include" && pwd)
src=${MELON_JACCL_SRC:-}
[ -d "$src/mlx/distributed/jaccl/lib" ] && src=$src/mlx/distributed/jaccl/lib
if [ -z "$src" ] || [ ! -f "$src/jaccl/rdma.cpp" ]; then
  echo "SKIP: MLX's JACCL source is not on this machine; set MELON_JACCL_SRC to an ml-explore/mlx checkout"
  echo "(it comes from GitHub, which CI does not reach; tests/jaccl/uc_allsum.cpp stands in for it there)"
  exit 77
fi
command -v g++ >/dev/null || { echo "SKIP: no g++ (JACCL needs C++20 lambda captures of bindings: g++ 12 or clang 16)"; exit 77; }
[ -f /usr/include/nlohmann/json.hpp ] || { echo "SKIP: no nlohmann/json.hpp (Debian: nlohmann-json3-dev)"; exit 77; }
key=$(cat "$src"/jaccl/*.cpp "$src"/jaccl/*.h "$src/CMakeLists.txt" "$here/jaccl_allsum.cpp" "$0" | sha256sum | cut -c1-16)
cache=${3:-${XDG_CACHE_HOME:-$HOME/.cache}/melondma/jaccl}/$key
if [ ! -x "$cache/jaccl_allsum" ]; then
  rm -rf "$cache" && mkdir -p "$cache/json/single_include/nlohmann" || exit 1
  cp -r "$src" "$cache/src"
  ln -s /usr/include/nlohmann/json.hpp "$cache/json/single_include/nlohmann/json.hpp"
  # shellcheck disable=SC2016  # CMake's ${...}, literally
  sed -i 's|if(NOT ${CMAKE_SYSTEM_NAME} MATCHES "Darwin")|if(FALSE)|' "$cache/src/CMakeLists.txt"
  sed -i 's|dlopen("librdma.dylib"|dlopen("libibverbs.so.1"|' "$cache/src/jaccl/rdma.cpp"
  sed -i 's|if (__builtin_available(macOS 26.3, iOS 26.3, tvOS 26.3, visionOS 26.3, \*)) {|if (true) {|' \
    "$cache/src/jaccl/rdma.h"
  for f in CMakeLists.txt jaccl/rdma.cpp jaccl/rdma.h; do
    cmp -s "$src/$f" "$cache/src/$f" && { echo "FAIL: the port's edit of $f no longer applies"; exit 1; }
  done
  # -include cstring: JACCL calls std::memcpy relying on a header macOS's libc++ includes for it.
  if ! { cmake -S "$cache/src" -B "$cache/build" -G Ninja -DCMAKE_CXX_COMPILER=g++ -DMACOS_SDK_VERSION=26.3 \
           -DFETCHCONTENT_SOURCE_DIR_JSON="$cache/json" -DCMAKE_CXX_FLAGS="-I$include -include cstring" &&
         cmake --build "$cache/build" &&
         g++ -std=c++20 -O2 -I"$include" -I"$cache/src" "$here/jaccl_allsum.cpp" "$cache/build/libjaccl.a" \
           -ldl -lpthread -o "$cache/jaccl_allsum"; } > "$cache/build.log" 2>&1; then
    echo "FAIL: JACCL did not build"; tail -20 "$cache/build.log"; rm -f "$cache/jaccl_allsum"; exit 1
  fi
fi
rc=0
for pairing in soft mlx5; do
  "$here/run.sh" "$libdir" "$cache/jaccl_allsum" "$emud" "$pairing" reliable 4096 1048576 16777216 || rc=1
done
exit $rc
