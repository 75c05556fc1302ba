#!/usr/bin/env bash
# Stock rxe in a guest talking to two processes behind one address (docs/verbs.md, "One address,
# many processes"): two stock ib_write_bw servers with OUR libibverbs on soft0 = 10.77.0.1, at
# once, and two stock ib_write_bw clients on rxe0 in guest 1, at once. The datagrams rxe sends to
# 10.77.0.1:4791 reach the right process only if the address's sharing is right. Both ways of
# sharing, one after the other in the same guest: reuseport (the kernel steers by QPN; Linux's
# default) and forward (the first process receives for both and forwards through shared-memory
# rings: macOS's way), where the owner's rx_forwarded counter must show the other's packets.
# Usage: share.sh <libdir>. Exit 0 passed, 1 failed, 77 skipped (this machine cannot run guests).
# Namespace shr-<pid> (PEER_NS overrides).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
libdir=${1:-}
if ! why=$(peer_check); then
  echo "SKIPPED: $why"
  exit 77
fi
[ -e "$libdir/libibverbs.so.1" ] || { echo "FAIL: no $libdir/libibverbs.so.1"; exit 1; }
export PEER_NS=${PEER_NS:-shr-$$}
peer_up 1 1500 || { echo "FAIL: the guest did not boot"; exit 1; }
cfg=$PEER_RUN/soft.conf
echo "device soft0 $PEER_HOST_ADDR" > "$cfg"
args="-F -s 65536 -n 300 -m 1024"
row='^[[:space:]]*65536[[:space:]]+300[[:space:]]+[0-9.]+[[:space:]]+[0-9.]*[1-9]'
fails=0
# one_mode <MELON_SOFT_SHARE value> <port> <port>: two servers here, two rxe clients at once.
one_mode() {
  local mode=$1 pids=() src=0 p guest fwd
  shift
  local ports=("$@") stats=$PEER_RUN/stats-$mode
  mkdir -p "$stats"
  local env_ours=(LD_LIBRARY_PATH="$libdir" MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG="$cfg" MELON_STATS_DIR="$stats"
    MELON_SOFT_SHARE="$mode" MELON_SOFT_STATS=1)
  for p in "${ports[@]}"; do
    peer_host env "${env_ours[@]}" timeout 200 ib_write_bw -d soft0 -x 0 $args -p "$p" > "$PEER_RUN/srv$p.log" 2>&1 &
    pids+=($!)
  done
  for p in "${ports[@]}"; do
    for ((k = 0; k < 200; k++)); do peer_host ss -Hltn "sport = :$p" | grep -q . && break; sleep 0.1; done
  done
  guest=$(PEER_JOB_TIMEOUT=200 peer_run 1 "ib_write_bw -d rxe0 -x 1 $args -p ${ports[0]} $PEER_HOST_ADDR > /tmp/c1 2>&1 & a=\$!
ib_write_bw -d rxe0 -x 1 $args -p ${ports[1]} $PEER_HOST_ADDR > /tmp/c2 2>&1 & b=\$!
wait \$a; ra=\$?; wait \$b; rb=\$?; cat /tmp/c1 /tmp/c2; echo rc \$ra \$rb")
  for p in "${pids[@]}"; do wait "$p" || src=$?; done
  echo "--- $mode"
  echo "$guest"
  for p in "${ports[@]}"; do cat "$PEER_RUN/srv$p.log"; done
  grep -q "^rc 0 0$" <<<"$guest" || { echo "FAIL: $mode: a guest client failed"; fails=1; }
  [ $src -eq 0 ] || { echo "FAIL: $mode: a server on 10.77.0.1 exited with $src"; fails=1; }
  [ "$(grep -Ec "$row" <<<"$guest")" -eq 2 ] || { echo "FAIL: $mode: expected two client result rows"; fails=1; }
  for p in "${ports[@]}"; do
    grep -Eq "$row" "$PEER_RUN/srv$p.log" || { echo "FAIL: $mode: no result row from the server on port $p"; fails=1; }
  done
  # rx_forwarded: packets the owner handed to the other process's ring (0 in reuseport mode).
  fwd=$(cat "$PEER_RUN"/srv"${ports[0]}".log "$PEER_RUN"/srv"${ports[1]}".log |
    awk '{for (i = 1; i < NF; i++) if ($i == "rx_forwarded") s += $(i + 1)} END {print s + 0}')
  echo "$mode: rx_forwarded $fwd"
  if [ "$mode" = forward ] && [ "$fwd" -eq 0 ]; then echo "FAIL: forward: no packet was forwarded"; fails=1; fi
  if [ "$mode" = reuseport ] && [ "$fwd" -ne 0 ]; then echo "FAIL: reuseport: $fwd packets forwarded"; fails=1; fi
}
one_mode reuseport 18601 18602
one_mode forward 18603 18604
[ $fails -eq 0 ] && echo "PASS: two processes on 10.77.0.1, two rxe clients, reuseport and forward"
exit $fails
