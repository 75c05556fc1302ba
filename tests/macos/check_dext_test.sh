#!/bin/bash
# Usage: check_dext_test.sh <repo>. Generates the macOS side of the build on Linux (APPLE forced, a
# stub xcrun naming a DriverKit SDK) and checks the commands check-dext and dext would run, without
# running them: iig over both .iig files, every DEXT source compiled for arm64e (a plain arm64 dext
# panics the kernel on spawn) freestanding, the link naming DriverKit and PCIDriverKit, and signing
# through sign.cmake. What the commands do against the real SDK is only known on a Mac.
set -u
top=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
if ! PATH="$here/stub-xcrun:$PATH" cmake -S "$top" -B "$dir" -G Ninja -DAPPLE=ON -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ >"$dir.log" 2>&1; then
  tail -n 20 "$dir.log"
  rm -f "$dir.log"
  echo "FAIL: configure with APPLE=ON"
  exit 1
fi
rm -f "$dir.log"
check=$(ninja -C "$dir" -t commands check-dext)
dext=$(ninja -C "$dir" -t commands dext)
fail=0
expect() {  # expect <what> <text> <fixed string>
  if ! printf '%s\n' "$2" | grep -q -F -e "$3"; then
    echo "FAIL: $1"
    fail=1
  fi
}
for iig in MlxPCIDriver MlxUserClient; do
  expect "iig over $iig.iig" "$check" "/nonexistent/iig --def $top/src/dext/driverkit/$iig.iig"
done
for src in pci_hal queue_memory MlxPCIDriver MlxUserClient dext_device; do
  expect "check-dext compiles $src.cpp" "$check" "-fsyntax-only $top/src/dext/driverkit/$src.cpp"
done
for src in hca_init uapi_backend; do
  expect "check-dext compiles the core's $src.cpp" "$check" "-fsyntax-only $top/src/mlx5/core/$src.cpp"
done
expect "check-dext compiles src/uapi/server.cpp" "$check" "-fsyntax-only $top/src/uapi/server.cpp"
n_syntax=$(printf '%s\n' "$check" | grep -c -e '-fsyntax-only')
n_arm64e=$(printf '%s\n' "$check" | grep -e '-fsyntax-only' | grep -c -e '-target arm64e-apple-driverkit')
n_free=$(printf '%s\n' "$check" | grep -e '-fsyntax-only' | grep -c -e '-nostdinc++')
if [ "$n_syntax" -lt 10 ] || [ "$n_arm64e" -ne "$n_syntax" ] || [ "$n_free" -ne "$n_syntax" ]; then
  echo "FAIL: $n_syntax syntax checks, $n_arm64e for arm64e, $n_free freestanding"
  fail=1
fi
expect "the dext links DriverKit and PCIDriverKit for arm64e" "$dext" \
  "-target arm64e-apple-driverkit$(tr -d '\n\t ' < "$top/src/dext/driverkit/Info.plist" | sed -n 's|.*<key>com.apple.DriverKit</key><string>\([0-9.]*\)</string>.*|\1|p') -isysroot /nonexistent/DriverKit.sdk"
expect "the dext links PCIDriverKit" "$dext" "-framework DriverKit -framework PCIDriverKit"
expect "the executable is MlxRDMA in org.melondma.rdma.dext.dext" "$dext" "org.melondma.rdma.dext.dext/MlxRDMA"
expect "the dext is signed by sign.cmake with the driver's entitlements" "$dext" \
  "-DENTITLEMENTS=$top/src/dext/driverkit/MlxRDMA.entitlements -P $top/src/dext/driverkit/sign.cmake"
if printf '%s\n' "$check$dext" | grep -q -E -e '-target arm64-'; then
  echo "FAIL: something is built for plain arm64"
  fail=1
fi
[ "$fail" -eq 0 ] || exit 1
echo "PASS: check-dext runs iig and $n_syntax arm64e syntax checks; dext links and signs"
