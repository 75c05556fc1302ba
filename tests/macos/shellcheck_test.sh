#!/bin/bash
# Usage: shellcheck_test.sh <repo>. Checks that every shell script under scripts/ (and the test kit in tests/macos)
# passes shellcheck, following sourced files. A script is a *.sh file or a file whose first line
# names bash or sh. Exit 77 (skip) when shellcheck is not installed.
set -u
top=$1
command -v shellcheck >/dev/null || {
  echo "SKIP: shellcheck is not installed"
  exit 77
}
n=0
bad=0
for f in $(find "$top/scripts" "$top/tests/macos" -type f | sort); do
  case $f in
    *.sh) ;;
    *) head -n 1 "$f" | grep -q -E '^#!.*\b(ba)?sh\b' || continue ;;
  esac
  n=$((n + 1))
  (cd "$(dirname "$f")" && shellcheck -x "$(basename "$f")") || bad=$((bad + 1))
done
echo "shellcheck: $n scripts, $bad with findings"
[ "$n" -gt 0 ] && [ "$bad" -eq 0 ]
