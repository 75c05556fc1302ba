#!/usr/bin/env bash
# The soft path's goal table (docs/performance.md, "Soft path"): every soft RoCE figure beside the
# kernel baseline it is judged against, both measured in this run, so the ratio holds on a loaded
# machine where absolute numbers do not.
#
#   veth MTU 1500   ib_write_bw 64 KiB            vs iperf3 TCP, 1 stream     goal >= 0.5
#   loopback        ib_write_bw 64 KiB            vs iperf3 TCP, 1 stream     goal >= 1.0
#   message rate    ib_write_bw 8 B, -t 128       vs 1 M msg/s                goal >= 1.0
#   multi-QP        ib_write_bw 64 KiB -q 4       vs the same with -q 1       goal >= 1.6
#   latency         ib_send_lat 8 B (busy-poll)   vs sockperf UDP ping-pong   goal <= 1.3
#                                                    (busy-poll, 14 B); a row of medians
#                                                    (t_typical, p50) and one of averages
#   wake-up         completion channel, blocked   vs a thread blocked in      goal <= 1.3
#                   (tools/bench_soft_wake p50)      recv() (same tool, p50)
#   mlx5_0          ib_write_bw 64 KiB from mlx5_0 vs the same from a soft     goal >= 0.5
#   (melon-emud)    ib_send_lat 8 B from mlx5_0    device, same server    goal <= 2.0
#                   melon-emud's CPU with an idle  vs one core            goal <= 0.01
#                   context open (5 s)
# Beside each row: receive-buffer drops / retransmissions / refused sends counted by the soft
# processes of that row (MELON_SOFT_STATS=1); loss we cause ourselves, 0 on an idle loopback.
#
# As root, each case runs in network namespaces it creates and removes (loopback cases in a private
# namespace so other runs on 127.0.0.x cannot clash; the veth case in two namespaces joined by a veth
# pair). Without root the veth case is skipped (with the reason) and loopback runs on 127.0.0.2/.3.
# Usage: scripts/bench.sh [build-dir]   (default build/release; ./melon bench builds it first)
# Only the sections named in MELON_BENCH (default "veth lo rate multi lat wake emud") run.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build/release}
sections=${MELON_BENCH:-veth lo rate multi lat wake emud}
# MELON_SOFT_STATS=1: each soft process prints its transport counters at exit (rx_buffer_drops,
# retransmits, tx_errors: loss we cause ourselves, which should be 0 on loopback).
export LD_LIBRARY_PATH=$build/lib MELON_SOFT_AUTO=0 MELON_SOFT_STATS=1
for t in ib_write_bw ib_send_lat iperf3 sockperf; do
  command -v $t > /dev/null || { echo "bench: $t is not installed (./melon deps)"; exit 1; }
done
tmp=$(mktemp -d)
namespaces=()
cleanup() {
  local j
  for j in $(jobs -p); do kill "$j" 2> /dev/null || true; done
  pkill -f "$tmp/" 2> /dev/null || true # children of those jobs (ip netns exec) that name this run's files
  for n in "${namespaces[@]}"; do ip netns del "$n" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

root=0
if [ "$(id -u)" = 0 ] && ip netns add "melonbench-probe-$$" 2> /dev/null; then
  ip netns del "melonbench-probe-$$"
  root=1
fi

# Two endpoints: namespace (or "-" for this one) and address of each. Set by setup_lo/setup_veth.
nsA=- nsB=- addrA='' addrB=''
in_ns() {  # in_ns <ns|-> <cmd...>
  local n=$1; shift
  if [ "$n" = - ]; then "$@"; else ip netns exec "$n" "$@"; fi
}
# For a background server: `(in_ns_exec ns cmd...) &` makes $! the server itself, so killing $!
# ends it (with in_ns, $! is a subshell whose child would outlive the kill, still spinning).
in_ns_exec() {
  local n=$1; shift
  if [ "$n" = - ]; then exec "$@"; else exec ip netns exec "$n" "$@"; fi
}
setup_lo() {
  if [ $root = 1 ]; then
    local n=melonbench-lo-$$
    if ! ip netns list | grep -q "^$n"; then
      ip netns add $n && namespaces+=("$n")
      ip -n $n link set lo up
    fi
    nsA=$n nsB=$n
  else
    nsA=- nsB=-
  fi
  addrA=127.0.0.2 addrB=127.0.0.3
}
setup_veth() {  # setup_veth <mtu>
  local a=melonbench-a-$$ b=melonbench-b-$$
  ip netns add $a && namespaces+=("$a")
  ip netns add $b && namespaces+=("$b")
  ip link add mba$$ netns $a type veth peer name mbb$$ netns $b
  ip -n $a addr add 10.231.0.1/24 dev mba$$
  ip -n $b addr add 10.231.0.2/24 dev mbb$$
  ip -n $a link set mba$$ mtu "$1" up
  ip -n $b link set mbb$$ mtu "$1" up
  ip -n $a link set lo up
  ip -n $b link set lo up
  nsA=$a nsB=$b addrA=10.231.0.1 addrB=10.231.0.2
}

# The client's device: bench1 (soft, at B) unless a case sets client_dev (mlx5_0 on melon-emud).
client_dev=bench1
pair() {  # pair <tool> <args...>: perftest server at A, client at B; prints the client's output
  local tool=$1; shift
  local port=$((20000 + RANDOM % 20000))
  MELON_SOFT_DEVICES=bench0=$addrA in_ns $nsA timeout 90 "$tool" -d bench0 -F -p $port "$@" > "$tmp/server" 2>&1 &
  local spid=$!
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.5
    MELON_SOFT_DEVICES=bench1=$addrB in_ns $nsB timeout 90 "$tool" -d $client_dev -F -p $port "$@" $addrA > "$tmp/client" 2>&1 || true
    grep -q "Couldn't connect" "$tmp/client" || break
  done
  wait $spid || true
  grep -h 'melondma soft: .* counters:' "$tmp/server" "$tmp/client" >> "$tmp/stats" || true
  cat "$tmp/client"
}
write_bw() {  # write_bw <args...>: average MB/s of ib_write_bw
  pair ib_write_bw "$@" | awk '$1 ~ /^[0-9]+$/ && NF >= 5 {v=$4} END {print v+0}'
}
write_rate() {  # write_rate <args...>: message rate in M msg/s
  pair ib_write_bw "$@" | awk '$1 ~ /^[0-9]+$/ && NF >= 5 {v=$5} END {print v+0}'
}
tcp_bw() {  # MB/s of one iperf3 TCP stream B -> A
  local port=$((5200 + RANDOM % 100))
  in_ns $nsA iperf3 -s -B $addrA -p $port -1 > /dev/null 2>&1 &
  sleep 0.5
  in_ns $nsB iperf3 -c $addrA -p $port -t 5 -J |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8 / 1e6)'
  wait || true
}

rows=()
notes=()
# A goal the table misses is met or explained: where docs/performance.md measures what stands
# between us and it (profile, locks and syscalls per operation), by the case's first words.
declare -A account=(
  ["loopback: write_bw 64K -q 4"]='"Where issue 14 stands": -q 4 >= 1.6 (both perftest ends share the 2 cores)'
  ["loopback: send_lat 8 B"]='"Where issue 14 stands" and "Fourth part (lat)": the work between a receive and the next send'
  ["loopback: comp-channel wake"]='"Where issue 14 stands" and "Fourth part (wake)": the waiter'"'"'s receive after its poll'
  ["mlx5_0:"]='"melon-emud'"'"'s data path, fifth pass": the hand-offs between the client, the daemon and the peer on 2 cores'
)
explain() {  # explain <case>: the account of a missed goal, if there is one
  local k
  for k in "${!account[@]}"; do
    case "$1" in "$k"*) notes+=("$(printf '%-46s not met; docs/performance.md, %s' "$1" "${account[$k]}")"); return ;; esac
  done
}
row() {  # row <case> <soft> <baseline> <unit> <goal-op> <goal> [zero-ok]
  local ratio ok loss
  # Receive-buffer drops / retransmissions / refused sends of the soft runs behind this row.
  loss=$(awk '{ for (i = 1; i < NF; i++) { if ($i == "rx_buffer_drops") d += $(i + 1)
    if ($i == "retransmits") r += $(i + 1); if ($i == "tx_errors") e += $(i + 1) } }
    END { printf "%d/%d/%d", d, r, e }' "$tmp/stats" 2> /dev/null || echo "-")
  rm -f "$tmp/stats"
  if python3 -c "import sys; sys.exit(0 if float('$2') > 0 or '${7:-}' == 'zero-ok' else 1)"; then :; else
    rows+=("$(printf '%-46s no result from the soft RoCE run (timed out or failed)' "$1")")
    return
  fi
  ratio=$(python3 -c "print(f'{$2 / $3:.3f}' if $3 else 'n/a')")
  ok=$(python3 -c "print(('yes' if $2 / $3 $5 $6 else 'no') if $3 else 'n/a')")
  rows+=("$(printf '%-46s %11.2f %11.2f %-5s %7s  %s %-4s %-4s %s' "$1" "$2" "$3" "$4" "$ratio" "$5" "$6" "$ok" "$loss")")
  [ "$ok" = no ] && explain "$1"
  return 0
}
skip() { rows+=("$(printf '%-46s skipped: %s' "$1" "$2")"); }

for s in $sections; do
  case $s in
    veth)
      if [ $root = 1 ]; then
        setup_veth 1500
        r=$(write_bw -s 65536 -D 5)
        t=$(tcp_bw)
        row "veth MTU 1500: write_bw 64K vs iperf3 TCP" "$r" "$t" MB/s ">=" 0.5
      else
        skip "veth MTU 1500: write_bw 64K vs iperf3 TCP" "needs root to create network namespaces"
      fi
      ;;
    lo)
      setup_lo
      r=$(write_bw -s 65536 -D 5)
      t=$(tcp_bw)
      row "loopback: write_bw 64K vs iperf3 TCP" "$r" "$t" MB/s ">=" 1.0
      ;;
    rate)
      setup_lo
      r=$(write_rate -s 8 -t 128 -D 5)
      row "loopback: WRITE 8 B -t 128 vs 1 M msg/s" "$r" 1 Mmsg ">=" 1.0
      ;;
    multi)
      setup_lo
      r1=$(write_bw -s 65536 -D 5 -q 1)
      r4=$(write_bw -s 65536 -D 5 -q 4)
      row "loopback: write_bw 64K -q 4 vs -q 1" "$r4" "$r1" MB/s ">=" 1.6
      ;;
    lat)
      setup_lo
      # perftest's t_typical (its median) and t_avg, half a round trip each.
      lat=$(pair ib_send_lat -s 8 -n 5000 | awk '$1 == 8 {print $5, $6}')
      echo "U:$addrA:11111" > "$tmp/feed" # -F (busy recvfrom on a non-blocking socket) needs a feed file
      (in_ns_exec $nsA sockperf server -f "$tmp/feed" -F r --nonblocked > /dev/null 2>&1) &
      sockperf_pid=$!
      sleep 0.5
      # sockperf's smallest message is 14 bytes (its own header); it too reports half a round trip.
      in_ns $nsB sockperf ping-pong -f "$tmp/feed" -m 14 -t 5 -F r --nonblocked 2>&1 |
        sed 's/\x1b\[[0-9;]*m//g' > "$tmp/sockperf" || true
      u_avg=$(awk -F'avg-latency=' '/avg-latency=/{split($2, a, " "); print a[1]}' "$tmp/sockperf")
      u_med=$(awk '/percentile 50.000 =/{print $NF}' "$tmp/sockperf")
      # A busy-polling server left behind would take a core from every later run: stop it by pid
      # and, should anything have forked, by this run's feed file.
      kill "$sockperf_pid" 2> /dev/null || true
      pkill -f "sockperf server -f $tmp/feed" 2> /dev/null || true
      wait "$sockperf_pid" 2> /dev/null || true
      # Medians first (what a loaded machine moves least), then the averages.
      row "loopback: send_lat 8 B vs sockperf (busy), p50" "$(echo "$lat" | awk '{print $1+0}')" "${u_med:-0}" us "<=" 1.3
      row "loopback: send_lat 8 B vs sockperf (busy), avg" "$(echo "$lat" | awk '{print $2+0}')" "${u_avg:-0}" us "<=" 1.3
      ;;
    wake)
      setup_lo
      # Medians of the time from a SEND's post to the return of a thread blocked on the completion
      # channel, and from sendto() to the return of a thread blocked in recv(), interleaved rounds.
      in_ns $nsA timeout 90 "$build/tools/bench_soft_wake" 10 200 300 > "$tmp/wake" 2> "$tmp/wake.err" || true
      grep -h 'melondma soft: .* counters:' "$tmp/wake.err" >> "$tmp/stats" || true
      r=$(awk '$1 == "soft:" {for (i = 1; i < NF; i++) if ($i == "p50") print $(i + 1)}' "$tmp/wake")
      u=$(awk '$1 == "udp:" {for (i = 1; i < NF; i++) if ($i == "p50") print $(i + 1)}' "$tmp/wake")
      row "loopback: comp-channel wake vs blocked recv()" "${r:-0}" "${u:-0}" us "<=" 1.3
      ;;
    emud)
      setup_lo
      emud=$build/src/dext/emuhost/melon-emud
      if [ ! -x "$emud" ]; then skip "mlx5_0 (melon-emud)" "$emud is not built"; continue; fi
      # The emulated ConnectX-4 Lx's wire on 127.0.0.4, beside the soft devices on .2 and .3. The
      # same server (bench0) and message sizes for both clients, one right after the other.
      (in_ns_exec $nsA "$emud" --socket "$tmp/emud.sock" --wire 127.0.0.4 > "$tmp/emud.log" 2>&1) &
      emud_pid=$!
      for _ in $(seq 200); do [ -S "$tmp/emud.sock" ] && break; sleep 0.05; done
      export MELON_EMUD_SOCKET=$tmp/emud.sock
      s_bw=$(write_bw -s 65536 -D 5 -x 0)
      s_lat=$(pair ib_send_lat -s 8 -n 5000 -x 0 | awk '$1 == 8 {print $5}')
      client_dev=mlx5_0
      m_bw=$(write_bw -s 65536 -D 5 -x 0)
      m_lat=$(pair ib_send_lat -s 8 -n 5000 -x 0 | awk '$1 == 8 {print $5}')
      client_dev=bench1
      row "mlx5_0: write_bw 64K vs soft -> soft" "$m_bw" "$s_bw" MB/s ">=" 0.5
      row "mlx5_0: send_lat 8 B p50 vs soft -> soft" "${m_lat:-0}" "${s_lat:-0}" us "<=" 2.0
      # Idle: a context with a QP and posted receives open on mlx5_0 (ibv_rc_pingpong waiting for
      # its peer), melon-emud's user + system time over 5 s (clock ticks, /proc/<pid>/stat).
      (in_ns_exec $nsA ibv_rc_pingpong -d mlx5_0 -g 0 -p $((20000 + RANDOM % 20000)) > /dev/null 2>&1) &
      idle_pid=$!
      sleep 1
      kill -0 "$idle_pid" 2> /dev/null || echo "bench: the idle ibv_rc_pingpong on mlx5_0 did not stay up; idle means no context"
      ticks() { awk '{print $14 + $15}' "/proc/$emud_pid/stat"; }
      t0=$(ticks); sleep 5; t1=$(ticks)
      kill "$idle_pid" 2> /dev/null || true; wait "$idle_pid" 2> /dev/null || true
      cpu=$(python3 -c "print(($t1 - $t0) / $(getconf CLK_TCK))")
      row "mlx5_0: idle melon-emud CPU s in 5 s vs 5 s" "$cpu" 5 s "<=" 0.01 zero-ok
      kill "$emud_pid" 2> /dev/null || true; wait "$emud_pid" 2> /dev/null || true
      unset MELON_EMUD_SOCKET
      ;;
  esac
done

printf '%-46s %11s %11s %-5s %7s  %-13s %s\n' "case" "soft RoCE" "baseline" "unit" "ratio" "goal met" "drops/retx/txerr"
for r in "${rows[@]}"; do echo "$r"; done
[ ${#notes[@]} -eq 0 ] || { echo; for r in "${notes[@]}"; do echo "$r"; done; }
echo "rerun: ./melon bench   (machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "load $(cut -d' ' -f1-3 /proc/loadavg))"
