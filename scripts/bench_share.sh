#!/usr/bin/env bash
# The cost of sharing one soft address among processes (docs/performance.md, "One address, many
# processes"), in one run, rounds interleaved:
#   alone      one ib_write_bw pair: server on 127.0.0.48, client on 127.0.0.49
#   idle3      the same pair while three more processes hold QPs on 127.0.0.48 (idle servers)
#   four       four pairs at once, all servers on 127.0.0.48 and all clients on 127.0.0.49 (sum)
#   lat alone / lat idle3   ib_send_lat -s 8 t_typical, alone and beside the three idle members
# Each round runs every mode in $MODES (MELON_SOFT_SHARE, docs/verbs.md; default "reuseport
# reuseport1 forward"; reuseport1 is reuseport with MELON_SOFT_LANES=1, the one lane forward mode
# runs): in forward mode the first process on an address owns its port, so "alone" measures the
# owner and "idle3" a member whose datagrams the first idle server forwards through its ring.
# Usage: [MODES="reuseport reuseport1 forward"] scripts/bench_share.sh [builddir=build/release] [rounds=3]
set -u
build=${1:-build/release}
rounds=${2:-3}
modes=${MODES:-reuseport reuseport1 forward}
export LD_LIBRARY_PATH=$build/lib MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG=/nonexistent MELON_SOFT_STATS=1
tmp=$(mktemp -d)
export MELON_STATS_DIR=$tmp/stats
mkdir -p "$MELON_STATS_DIR"
trap 'kill $(jobs -p) 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$tmp"; echo "$tmp"' EXIT
port=$((30000 + RANDOM % 20000))
next_port() { port=$((port + 1)); P=$port; }  # sets P (not in a subshell: port must advance)
listening() { for _ in $(seq 200); do ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.05; done; return 1; }
srv() { MELON_SOFT_DEVICES=s=127.0.0.48 timeout 60 "$@" -d s -F -p "$P" > "$tmp/s$P" 2>&1 & }
cli() { MELON_SOFT_DEVICES=c=127.0.0.49 timeout 60 "$@" -d c -F -p "$P" 127.0.0.1 > "$tmp/c$P" 2>&1; }
bw_of() { awk '/^ *#bytes/{t=1; next} t && /^ *[0-9]+ +[0-9]+ /{print $4; exit}' "$1"; }
lat_of() { awk '/^ *#bytes/{t=1; next} t && /^ *[0-9]+ +[0-9]+ /{print $5; exit}' "$1"; }
idle_up() {  # three servers on 127.0.0.48 that hold a QP and wait for a client that never comes
  idle=()
  for _ in 1 2 3; do
    next_port; srv ib_write_bw; idle+=($!); listening "$P"
  done
}
idle_down() { kill "${idle[@]}" 2>/dev/null; wait "${idle[@]}" 2>/dev/null; }
pair() {  # pair <tool> <args...>: one server and client; OUT = the client's output file
  local tool=$1; shift
  next_port; srv "$tool" "$@"; local s=$!; listening "$P"; cli "$tool" "$@"; wait $s; OUT=$tmp/c$P
}
bwargs=(-s 65536 -D 3)
latargs=(-s 8 -n 5000)
printf '%-6s %-10s %12s %12s %34s %14s %14s\n' round mode "alone MB/s" "idle3 MB/s" "four MB/s (sum: each)" "lat alone us" "lat idle3 us"
for r in $(seq "$rounds"); do
for mode in $modes; do
  export MELON_SOFT_SHARE=${mode%1}
  if [ "$mode" = reuseport1 ]; then export MELON_SOFT_LANES=1; else unset MELON_SOFT_LANES; fi
  pair ib_write_bw "${bwargs[@]}"; a=$(bw_of "$OUT")
  pair ib_send_lat "${latargs[@]}"; la=$(lat_of "$OUT")
  idle_up
  pair ib_write_bw "${bwargs[@]}"; b=$(bw_of "$OUT")
  pair ib_send_lat "${latargs[@]}"; lb=$(lat_of "$OUT")
  idle_down
  ports=() spids=() cpids=()
  for _ in 1 2 3 4; do next_port; ports+=("$P"); srv ib_write_bw "${bwargs[@]}"; spids+=($!); done
  for p in "${ports[@]}"; do listening "$p"; done
  for p in "${ports[@]}"; do P=$p cli ib_write_bw "${bwargs[@]}" & cpids+=($!); done
  wait "${cpids[@]}" "${spids[@]}"
  each=() sum=0
  for p in "${ports[@]}"; do v=$(bw_of "$tmp/c$p"); each+=("${v:-0}"); sum=$(awk -v a="$sum" -v b="${v:-0}" 'BEGIN{print a+b}'); done
  printf '%-6s %-10s %12s %12s %34s %14s %14s\n' "$r" "$mode" "${a:-?}" "${b:-?}" "$sum: $(IFS=/; echo "${each[*]}")" "${la:-?}" "${lb:-?}"
done
done
# Packets that reached a process that does not own their QPN (expected 0: nobody died).
grep -ho 'rx_unknown_qpn [0-9]*' "$tmp"/s* "$tmp"/c* 2>/dev/null | awk '{n += $2} END {print "rx_unknown_qpn total " n + 0}'
grep -ho 'retransmits [0-9]*' "$tmp"/s* "$tmp"/c* 2>/dev/null | awk '{n += $2} END {print "retransmits total " n + 0}'
for c in rx_forwarded rx_ring_drops rx_ring_bad; do
  grep -ho "$c [0-9]*" "$tmp"/s* "$tmp"/c* 2>/dev/null | awk -v c="$c" '{n += $2} END {print c " total " n + 0}'
done
