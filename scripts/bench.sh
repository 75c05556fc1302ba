#!/usr/bin/env bash
# Soft RoCE against the kernel's own loopback paths, side by side in one run:
#   ib_write_bw 64 KiB (stock perftest over our libibverbs)  vs  iperf3 TCP
#   ib_send_lat 8 B                                          vs  sockperf UDP ping-pong
# Prints each figure and the ratio. Usage: scripts/bench.sh [build-dir]   (default build/release)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build/release}
export LD_LIBRARY_PATH=$build/lib MELON_SOFT_AUTO=0 MELON_SOFT_DEVICES=bench0=127.0.0.2,bench1=127.0.0.3
for t in ib_write_bw ib_send_lat iperf3 sockperf; do
  command -v $t >/dev/null || { echo "bench: $t is not installed (./melon deps)"; exit 1; }
done
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT

pair() {  # pair <tool> <args...>: server on bench0, client on bench1; prints the client's output
  local tool=$1; shift
  local port=$(( 20000 + RANDOM % 20000 ))
  $tool -d bench0 -F -p $port "$@" > "$tmp/server" 2>&1 &
  local spid=$!
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.5
    $tool -d bench1 -F -p $port "$@" 127.0.0.1 > "$tmp/client" 2>&1 || true
    grep -q "Couldn't connect" "$tmp/client" || break
  done
  wait $spid || true
  cat "$tmp/client"
}

# --- bandwidth: 64 KiB RDMA WRITE vs TCP ---
rdma_bw=$(pair ib_write_bw -s 65536 -n 20000 | awk '/^ *65536 /{print $4}')
iperf3 -s -B 127.0.0.1 -p 5299 -1 > /dev/null 2>&1 &
sleep 0.5
tcp_bw=$(iperf3 -c 127.0.0.1 -p 5299 -t 5 -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8 / 1e6)')

# --- latency: 8-byte SEND ping-pong vs UDP ping-pong ---
rdma_lat=$(pair ib_send_lat -s 8 -n 20000 | awk '/^ *8 /{print $6}')   # t_avg [usec], half a round trip
sockperf server -i 127.0.0.1 -p 11111 > /dev/null 2>&1 &
sleep 0.5
# sockperf's smallest message is 14 bytes (its own header); it also reports half a round trip.
udp_lat=$(sockperf ping-pong -i 127.0.0.1 -p 11111 -m 14 -t 5 2>&1 | sed 's/\x1b\[[0-9;]*m//g' |
          awk -F'avg-latency=' '/avg-latency=/{split($2, a, " "); print a[1]}')

printf '%-44s %12s %12s %8s\n' "comparison" "soft RoCE" "kernel" "ratio"
printf '%-44s %9.1f MB/s %9.1f MB/s %8.3f\n' "ib_write_bw 64 KiB vs iperf3 TCP (MB/s)" "$rdma_bw" "$tcp_bw" \
  "$(python3 -c "print($rdma_bw / $tcp_bw)")"
printf '%-44s %10.2f us %10.2f us %8.3f\n' "ib_send_lat 8 B vs sockperf UDP 14 B (us)" "$rdma_lat" "$udp_lat" \
  "$(python3 -c "print($rdma_lat / $udp_lat)")"
echo "rerun: ./melon bench   (machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
