#!/usr/bin/env bash
# Benchmark (not a test; docs/performance.md): stock perftest with mlx5_0 (melon-emud, wire
# 127.0.0.14) as the client of soft0, against soft1 as the client of soft0, in the same run.
# Usage: tests/stock/mlx5_vs_soft_bench.sh [build dir, default build/release]
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$root/build/release}
export LD_LIBRARY_PATH=$B/lib MELON_SOFT_AUTO=0
d=$(mktemp -d); printf 'device soft0 127.0.0.2\ndevice soft1 127.0.0.3\n' > $d/soft.cfg
export MELON_SOFT_CONFIG=$d/soft.cfg MELON_EMUD_SOCKET=$d/a.sock
$B/src/dext/emuhost/melon-emud --socket $d/a.sock --wire 127.0.0.14 > $d/emud.log 2>&1 & e=$!
while [ ! -S $d/a.sock ]; do sleep 0.05; done
for tool in "ib_write_bw -s 65536 -n 5000" "ib_write_bw -s 64 -n 20000" "ib_send_lat -s 2 -n 5000"; do
  for client in soft1 mlx5_0; do
    $tool -d soft0 -x 0 -F -p 18600 > $d/srv 2>&1 & s=$!; sleep 0.5
    $tool -d $client -x 0 -F -p 18600 127.0.0.1 > $d/cli 2>&1; wait $s
    echo "$tool  $client -> soft0: $(awk '/^ *#bytes/{t=1; next} t && /^ *[0-9]+ +[0-9]+ /{print; exit}' $d/cli)"
  done
done
kill $e; wait $e; rm -rf $d
