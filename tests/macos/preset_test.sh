#!/bin/bash
# Usage: preset_test.sh <repo>. `cmake --preset macos` on a machine that is not a Mac must fail at once
# with the message that says what the preset is for and what to run instead (docs/macos.md); the build
# directory goes to a temporary place, not the source tree's build/macos.
set -u
top=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [ "$(uname -s)" = Darwin ]; then
  echo "SKIP: on macOS the preset configures"
  exit 77
fi
out=$(cd "$top" && cmake --preset macos -B "$dir/build" 2>&1)
rc=$?
fail=0
if [ "$rc" -eq 0 ]; then
  echo "FAIL: cmake --preset macos succeeded on $(uname -s)"
  fail=1
fi
for want in "The macos preset builds MelonDMA for macOS" "needs a Mac with Xcode" "cmake --preset debug" \
  "ctest -L driverkit"; do
  if ! printf '%s\n' "$out" | tr -s ' \n' ' ' | grep -q -F "$want"; then
    echo "FAIL: the refusal does not say: $want"
    fail=1
  fi
done
if [ "$fail" -ne 0 ]; then
  printf '%s\n' "$out" | tail -n 20
  exit 1
fi
echo "PASS: the macos preset refuses $(uname -s) with the expected message"
