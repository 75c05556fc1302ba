#!/usr/bin/env bash
# macos_cross (ctest, label macos-cross): what `cmake --preset macos` builds, minus check-dext (Xcode's
# DriverKit SDK), cross-compiled for macOS with warnings as errors, then the undefined symbols of every
# dylib and tool checked against what macOS provides (check_symbols.py).
#   arm64:  everything (libraries, providers, tools, unit tests linked, not run), MELON_SOFT_DARWIN_BATCH=ON
#   x86-64: the three dylibs, MELON_SOFT_DARWIN_BATCH=OFF, linked without libc++ (a system library on macOS)
# Usage: run.sh <source dir> <work dir> <zig root> <llvm-nm> <llvm-objdump> <ld64.lld> <rdma-core libdir>
set -euo pipefail
src=$1 out=$2 zig=$3 nm=$4 objdump=$5 ld64=$6 rdma_core=$7
here=$src/tests/macos_cross
[ -x "$zig/zig" ] || { echo "SKIP: no Zig toolchain at $zig (./melon deps installs it)"; exit 77; }
case "$nm $objdump" in *NOTFOUND*|" "*|*" ") echo "SKIP: no llvm-nm or llvm-objdump (apt-get install llvm)"; exit 77;; esac
case $ld64 in *NOTFOUND*|"") echo "SKIP: no ld64.lld (apt-get install lld)"; exit 77;; esac
min=12.0  # cmake/toolchains/zig-macos.cmake's MELON_MACOS_MIN
tbd=$zig/lib/libc/darwin/libSystem.${min%%.*}.tbd
lld=("$ld64" -arch arm64 -platform_version macos "$min" "$min" "$tbd")  # as the toolchain file links librdma
check() { python3 "$here/check_symbols.py" --nm "$nm" --tbd "$tbd" --frameworks "$here/apple_frameworks.txt" "$@"; }
t0=$SECONDS
configure() {  # configure <tree> <cmake args...>
  local tree=$out/$1; shift
  # CMake keeps a tree's compiler: a tree made with another revision of the toolchain's wrappers
  # (see $cc below) starts afresh.
  grep -qsF "$zig-wrap/2/" "$tree"/CMakeFiles/*/CMakeCCompiler.cmake || rm -rf "$tree"
  cmake -G Ninja -S "$src" -B "$tree" --log-level=WARNING -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchains/zig-macos.cmake" \
        -DMELON_ZIG_ROOT="$zig" -DMELON_MACOS_MIN=$min -DMELON_REQUIRE_MACOS=ON -DMELON_SANITIZE=OFF \
        -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG=-O0 -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
        -DCMAKE_COMPILE_WARNING_AS_ERROR=ON "$@" >/dev/null
}
dylibs() { find "$out/$1/lib" -name '*.dylib' -type f | sort; }

echo "== arm64: configure and build everything"
configure arm64 -DMELON_MACOS_ARCH=aarch64 -DMELON_SOFT_DARWIN_BATCH=ON
cc=$zig-wrap/2/aarch64-macos.$min/zig-cc  # written by the toolchain file (its revision 2)

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
mapfile -t libs < <(dylibs arm64)
ours=(); for l in "${libs[@]}"; do ours+=(--ours "$l"); done  # programs may link our dylibs
check --arch arm64 "${ours[@]}" "${libs[@]}" "${progs[@]}"

echo "== arm64: cmake --install, the Mac layout, install names and versions"
prefix=$out/prefix && rm -rf "$prefix"
cmake --install "$out/arm64" --prefix "$prefix" >/dev/null
for f in lib/libibverbs.dylib lib/libmlx5.dylib lib/libefa.dylib lib/librdma.dylib include/infiniband/verbs.h \
         lib/pkgconfig/libibverbs.pc lib/pkgconfig/libmlx5.pc lib/pkgconfig/libefa.pc lib/cmake/MelonDMA/MelonDMAConfig.cmake; do
  [ -e "$prefix/$f" ] || { echo "FAIL: the install has no $f"; exit 1; }
done
python3 "$here/check_macho_names.py" --objdump "$objdump" --rdma-core "$rdma_core" "$prefix/lib"
# The pkg-config consumer of packaging/examples, built for the Mac against the install.
# shellcheck disable=SC2046  # pkg-config's words are meant to split
"$cc" -std=c11 -Wall -Wextra -Werror -o "$fx/hello-pkgconfig" "$src/packaging/examples/verbs_hello.c" \
      $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs libibverbs)
"$objdump" --macho --dylibs-used "$fx/hello-pkgconfig" | grep -q '^\s*@rpath/libibverbs\.1\.dylib ' ||
  { echo "FAIL: the pkg-config consumer does not load @rpath/libibverbs.1.dylib"; exit 1; }

# Weak-linked to librdma as llama.cpp's ggml-rpc is: every verb must bind through librdma's re-export
# (ld64.lld resolves it as Apple's ld does; Zig's linker does not read a dylib's re-exports).
echo "== a program weak-linked to librdma binds every verb through it"
"$cc" -std=c11 -Wall -Wextra -Werror -I "$prefix/include" -c -o "$fx/hello.o" "$src/packaging/examples/verbs_hello.c"
weak_link() {  # weak_link <lib dir> <output>
  "${lld[@]}" -o "$2" "$fx/hello.o" -L "$1" -weak-lrdma -rpath @executable_path/../lib
}
weak_link "$prefix/lib" "$fx/hello-weak"
"$objdump" --macho --dylibs-used "$fx/hello-weak" | grep -q '^\s*@rpath/librdma\.dylib .*weak' ||
  { echo "FAIL: hello-weak does not weak-load @rpath/librdma.dylib"; exit 1; }
binds=$("$objdump" --macho --bind --lazy-bind "$fx/hello-weak" | awk 'NF > 1 && ($NF ~ /^_ibv_/ || $(NF-1) ~ /^_ibv_/)')
[ -n "$binds" ] || { echo "FAIL: hello-weak binds no ibv_ symbol"; exit 1; }
if grep -v ' librdma ' <<<"$binds"; then echo "FAIL: the verbs above do not bind to librdma"; exit 1; fi
echo "$(wc -l <<<"$binds") ibv_ bindings, all to librdma"
# ... and without the re-export the same link fails: the check can fail.
mkdir -p "$fx/norexport" && "$cc" -shared -o "$fx/norexport/librdma.dylib" "$src/src/verbs/librdma.c"
if weak_link "$fx/norexport" "$fx/hello-refused" 2>"$fx/norexport.log"; then
  echo "FAIL: a librdma without the re-export linked"; exit 1
fi
grep -q '_ibv_' "$fx/norexport.log" || { echo "FAIL: that refusal names no verb:"; cat "$fx/norexport.log"; exit 1; }

t1=$SECONDS
echo "== x86-64: configure and build the dylibs"
configure x86_64 -DMELON_MACOS_ARCH=x86_64 -DMELON_SOFT_DARWIN_BATCH=OFF -DMELON_MACOS_LINK_CXX=OFF
cmake --build "$out/x86_64" --target melon_verbs_libs
echo "== x86-64 built in $((SECONDS - t1)) s"
mapfile -t libs < <(dylibs x86_64)
ours=(); for l in "${libs[@]}"; do ours+=(--ours "$l"); done  # librdmacm links libibverbs
check --arch x86_64 --cxx-runtime "${ours[@]}" "${libs[@]}"
python3 "$here/check_macho_names.py" --objdump "$objdump" --rdma-core "$rdma_core" "$out/x86_64/lib"
echo "macos_cross: passed in $((SECONDS - t0)) s"
