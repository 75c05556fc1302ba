#!/usr/bin/env bash
# Two STOCK ib_write_bw servers on one soft address (127.0.0.46) and their two clients on another
# (127.0.0.47), all four at once: processes share an address through its registry
# (src/providers/soft/addr_registry.h). Usage: share_stock.sh <libdir> [perftest options]
set -u
libdir=$1
shift
opts="$*"
export LD_LIBRARY_PATH=$libdir MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG=/nonexistent
stats=$(mktemp -d)
export MELON_STATS_DIR=$stats
out=$(mktemp)
out2=$(mktemp)
logs=()
trap 'rm -rf "$stats" "$out" "$out2" "${logs[@]}"' EXIT
fail() { echo "FAIL: $*"; for f in "${logs[@]}"; do echo "---- $f"; cat "$f"; done; exit 1; }
# shellcheck source=tests/stock/stock_lib.sh
. "$(dirname "$0")/stock_lib.sh"
need ib_write_bw

spids=() ports=()
for i in 1 2; do
  port=$(free_port)
  while [ "${ports[0]:-}" = "$port" ]; do port=$(free_port); done
  ports+=("$port")
  log=$(mktemp); logs+=("$log")
  MELON_SOFT_DEVICES=srv=127.0.0.46 timeout 100 ib_write_bw -d srv -F -p "$port" $opts > "$log" 2>&1 &
  spids+=($!)
done
# Both servers hold their QPs on 127.0.0.46 before they listen (perftest creates them first).
for i in 0 1; do out2=${logs[$i]} wait_listen "${ports[$i]}" "${spids[$i]}"; done
cpids=()
for i in 0 1; do
  log=$(mktemp); logs+=("$log")
  MELON_SOFT_DEVICES=cli=127.0.0.47 timeout 100 ib_write_bw -d cli -F -p "${ports[$i]}" $opts 127.0.0.1 > "$log" 2>&1 &
  cpids+=($!)
done
rc=0
for p in "${cpids[@]}" "${spids[@]}"; do wait "$p" || rc=$?; done
[ $rc -eq 0 ] || fail "a server or client exited with $rc"
for f in "${logs[@]}"; do
  out=$f
  loader_clean
  reject "Completion with error|error status|Address already in use|Couldn't"
  rows=$(awk '/^ *#bytes/{t=1; next} t && /^ *[0-9]+ +[0-9]+ /{print}' "$f")
  [ -n "$rows" ] || fail "no result rows in $f"
  check_figures ib_write_bw "$rows"
  echo "$rows"
done
echo PASS
