#!/usr/bin/env bash
# macos_cross (ctest, label macos-cross): what `cmake --preset macos` builds, minus check-dext (Xcode's
# DriverKit SDK), cross-compiled for macOS with warnings as errors, then the undefined symbols of every
# dylib and tool checked against what macOS provides (check_symbols.py).
#   arm64:  everything (libraries, providers, tools, unit tests linked, not run), MELON_SOFT_DARWIN_BATCH=ON
#   x86-64: the three dylibs, MELON_SOFT_DARWIN_BATCH=OFF, linked without libc++ (a system library on macOS)
# Usage: run.sh <source dir> <work dir> <zig root> <llvm-nm>
set -euo pipefail
src=$1 out=$2 zig=$3 nm=$4
here=$src/tests/macos_cross
[ -x "$zig/zig" ] || { echo "SKIP: no Zig toolchain at $zig (./melon deps installs it)"; exit 77; }
if [ -z "$nm" ] || [ "$nm" = "MELON_LLVM_NM-NOTFOUND" ]; then echo "SKIP: no llvm-nm (apt-get install llvm)"; exit 77; fi
min=12.0  # cmake/toolchains/zig-macos.cmake's MELON_MACOS_MIN
tbd=$zig/lib/libc/darwin/libSystem.${min%%.*}.tbd
check() { python3 "$here/check_symbols.py" --nm "$nm" --tbd "$tbd" --frameworks "$here/apple_frameworks.txt" "$@"; }
t0=$SECONDS
configure() {  # configure <tree> <cmake args...>
  local tree=$out/$1; shift
  cmake -G Ninja -S "$src" -B "$tree" --log-level=WARNING -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchains/zig-macos.cmake" \
        -DMELON_ZIG_ROOT="$zig" -DMELON_MACOS_MIN=$min -DMELON_REQUIRE_MACOS=ON -DMELON_SANITIZE=OFF \
        -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG=-O0 -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
        -DCMAKE_COMPILE_WARNING_AS_ERROR=ON "$@" >/dev/null
}
dylibs() { find "$out/$1/lib" -name '*.dylib' -type f | sort; }

echo "== arm64: configure and build everything"
configure arm64 -DMELON_MACOS_ARCH=aarch64 -DMELON_SOFT_DARWIN_BATCH=ON
cc=$zig-wrap/aarch64-macos.$min/zig-cc  # written by the toolchain file

# First the check itself: a Linux-only call must fail the link, and, linked anyway, the check.
echo "== the check refuses a dylib calling recvmmsg"
fx=$out/fixture && mkdir -p "$fx"
if "$cc" -shared -o "$fx/refused.dylib" "$here/fixture_recvmmsg.c" 2>"$fx/link.log"; then
  echo "FAIL: the Mac link of a recvmmsg call succeeded"; exit 1
fi
grep -q recvmmsg "$fx/link.log" || { echo "FAIL: the refused link does not name recvmmsg:"; cat "$fx/link.log"; exit 1; }
"$cc" -shared -Wl,-undefined,dynamic_lookup -o "$fx/fixture.dylib" "$here/fixture_recvmmsg.c"
if check --arch arm64 "$fx/fixture.dylib" >"$fx/check.log"; then
  echo "FAIL: check_symbols.py passed a dylib calling recvmmsg"; cat "$fx/check.log"; exit 1
fi
grep -q ': recvmmsg: ' "$fx/check.log" || { echo "FAIL: the check did not name recvmmsg:"; cat "$fx/check.log"; exit 1; }
cat "$fx/check.log"

cmake --build "$out/arm64"
echo "== arm64 built in $((SECONDS - t0)) s"
mapfile -t progs < <(find "$out/arm64/tools" "$out/arm64/tests" -type f -perm -u+x ! -name '*.sh' ! -name '*.py' \
                     -exec sh -c 'head -c4 "$1" | od -An -tx1 | grep -q "cf fa ed fe"' _ {} \; -print | sort)
[ ${#progs[@]} -gt 10 ] || { echo "FAIL: only ${#progs[@]} Mach-O programs built under tools/ and tests/"; exit 1; }
echo "== arm64: $(dylibs arm64 | wc -l) dylibs, ${#progs[@]} programs; undefined symbols"
# Apple's leaf name leads to our library (dlopen("librdma.dylib") in MLX's JACCL).
rdma=$out/arm64/lib/librdma.dylib
[ "$(readlink -f "$rdma")" = "$(readlink -f "$out/arm64/lib/libibverbs.1.dylib")" ] ||
  { echo "FAIL: $rdma does not lead to libibverbs.1.dylib"; exit 1; }
"$nm" -g -U -j "$rdma" | grep -qx _ibv_reg_mr_iova2 || { echo "FAIL: librdma.dylib lacks ibv_reg_mr_iova2"; exit 1; }
mapfile -t libs < <(dylibs arm64)
ours=(); for l in "${libs[@]}"; do ours+=(--ours "$l"); done  # programs may link our dylibs
check --arch arm64 "${ours[@]}" "${libs[@]}" "${progs[@]}"

t1=$SECONDS
echo "== x86-64: configure and build the dylibs"
configure x86_64 -DMELON_MACOS_ARCH=x86_64 -DMELON_SOFT_DARWIN_BATCH=OFF -DMELON_MACOS_LINK_CXX=OFF
cmake --build "$out/x86_64" --target melon_verbs_libs
echo "== x86-64 built in $((SECONDS - t1)) s"
mapfile -t libs < <(dylibs x86_64)
check --arch x86_64 --cxx-runtime "${libs[@]}"
echo "macos_cross: passed in $((SECONDS - t0)) s"
