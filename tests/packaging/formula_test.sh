#!/bin/sh
# homebrew_formula (ctest): packaging/homebrew/melondma.rb is valid Ruby, and, loaded with a stand-in
# for Homebrew's DSL (formula_stub.rb), its install builds a target this tree has and installs, and
# its test block runs the installed packaging/examples/check.sh on the keg, which is what ctest
# install_consumers runs. Homebrew itself cannot run here (docs/install.md).
#   formula_test.sh <source dir> <build dir> <work dir>
set -eu
src=$1 build=$2 work=$3
formula=$src/packaging/homebrew/melondma.rb
command -v ruby >/dev/null || { echo "SKIP: no ruby (apt-get install ruby)"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
ruby -c "$formula"

judge() {  # judge <formula>: the stand-in's record of it must show the install and test steps
  ruby "$src/tests/packaging/formula_stub.rb" "$1" >"$work/calls" || return 1
  cat "$work/calls"
  target=$(sed -n 's/^system cmake --build build --target \([A-Za-z0-9_]*\)$/\1/p' "$work/calls")
  [ -n "$target" ] || { echo "no 'cmake --build build --target <t>' in install"; return 1; }
  ninja -C "$build" -t targets all | grep -q "^$target:" || { echo "no target $target in $build"; return 1; }
  grep -qx 'system cmake --install build' "$work/calls" || { echo "install does not run cmake --install"; return 1; }
  sed -n '/^-- test$/,$p' "$work/calls" | grep -Eqx \
    'system sh PREFIX/share/melondma/examples/check\.sh PREFIX TESTPATH/[^ ]+ 127\.0\.0\.1' ||
    { echo "the test block does not run check.sh from the keg on the keg"; return 1; }
  for dep in 'cmake.*:test' 'pkgconf.*:test'; do  # what check.sh runs
    grep -Eq "^depends_on .*$dep" "$work/calls" || { echo "no test dependency matching $dep"; return 1; }
  done
}
judge "$formula" || { echo "FAIL: $formula"; exit 1; }
# ... and the check.sh it names is where this tree installs it.
cmake --install "$build" --prefix "$work/prefix" >/dev/null
[ -x "$work/prefix/share/melondma/examples/check.sh" ] || { echo "FAIL: the install has no check.sh there"; exit 1; }

# The judge itself: a formula whose test block runs nothing must fail it.
sed '/check\.sh/d' "$formula" >"$work/no_test.rb"
if judge "$work/no_test.rb" >"$work/mutant.log" 2>&1; then
  echo "FAIL: a formula with an empty test block passed"; exit 1
fi
echo "homebrew_formula: passed (and an empty test block is refused)"
