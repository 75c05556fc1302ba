#!/bin/bash
# ctest oracle_vfio_bringup: rdma-core's mlx5_vfio (Debian's stock libmlx5.so.1) brings up the
# emulated function and tests/vfio/vfio_stock_bringup.c drives it (docs/emulator.md).
prog=$1 run=$2
if [ -z "$prog" ] || [ ! -x "$prog" ]; then
  echo "SKIP: vfio_stock_bringup was not built: it needs Debian's libibverbs-dev (stock libmlx5.so.1," \
       "mlx5dv.h) and linux-headers (mlx5_ifc.h); apt-get install libibverbs-dev linux-headers-amd64"
  exit 77
fi
set -e
# One function, the whole program; then open/close twice in one process (the function is reset by
# each open, as vfio-pci does).
"$run" --devices 0000:6d:00.0 -- "$prog" 0000:6d:00.0
"$run" --devices 0000:6d:00.0 -- "$prog" 0000:6d:00.0 --open-only
# Two functions in one process: the second one found by its own sysfs entry and IOMMU group.
"$run" --devices 0000:6d:00.0,0000:6d:00.1 -- "$prog" 0000:6d:00.1
echo "oracle_vfio_bringup: PASS"
