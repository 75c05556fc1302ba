#!/bin/sh
# install_consumers (ctest): install the build tree into a temp prefix, check what landed where, and
# run packaging/examples/check.sh from the install against it.
#   run.sh <build dir> <work dir> <libdir> <includedir> <source dir> <C compiler> <soft device address>
set -eu
build=$1 work=$2 libdir=$3 includedir=$4 src=$5
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log"

# Every public header, unchanged; each library with its .pc file, whose Version is the library's.
for h in "$src"/include/infiniband/*.h; do
  cmp "$h" "$prefix/$includedir/infiniband/$(basename "$h")" || { echo "FAIL: $h not installed"; exit 1; }
done
for lib in ibverbs mlx5 efa; do
  pc=$prefix/$libdir/pkgconfig/lib$lib.pc
  [ -f "$pc" ] || { echo "FAIL: no $pc"; exit 1; }
  version=$(sed -n 's/^Version: //p' "$pc")
  real=$(ls "$prefix/$libdir/lib$lib".so.1.* "$prefix/$libdir/lib$lib".1.*.dylib 2>/dev/null || true)
  case $real in
    */lib$lib.so.$version | */lib$lib.$version.dylib) ;;
    *) echo "FAIL: lib$lib.pc says $version, the library is ${real:-missing}"; exit 1 ;;
  esac
  [ -e "$prefix/$libdir/lib$lib.so" ] || [ -e "$prefix/$libdir/lib$lib.dylib" ] ||
    { echo "FAIL: no link-time name for lib$lib"; exit 1; }
done
for f in MelonDMAConfig.cmake MelonDMAConfigVersion.cmake MelonDMATargets.cmake; do
  [ -f "$prefix/$libdir/cmake/MelonDMA/$f" ] || { echo "FAIL: no $libdir/cmake/MelonDMA/$f"; exit 1; }
done
echo "install_consumers: layout of $prefix checked ($libdir, $includedir)"

# The soft device listens on UDP 4791 there.
CC=$6 sh "$prefix/share/melondma/examples/check.sh" "$prefix" "$work/consumers" "$7"
