#!/usr/bin/env bash
# Stock rxe in a guest talking to two processes behind one address (docs/verbs.md, "One address,
# many processes"): two stock ib_write_bw servers with OUR libibverbs on soft0 = 10.77.0.1, at
# once, and two stock ib_write_bw clients on rxe0 in guest 1, at once. The datagrams rxe sends to
# 10.77.0.1:4791 reach the right process only if the address's steering is right.
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
mkdir -p "$PEER_RUN/stats"
env_ours=(LD_LIBRARY_PATH="$libdir" MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG="$cfg" MELON_STATS_DIR="$PEER_RUN/stats")
args="-F -s 65536 -n 300 -m 1024"
pids=() ports=(18601 18602)
for p in "${ports[@]}"; do
  peer_host env "${env_ours[@]}" timeout 200 ib_write_bw -d soft0 -x 0 $args -p "$p" > "$PEER_RUN/srv$p.log" 2>&1 &
  pids+=($!)
done
for p in "${ports[@]}"; do
  for ((k = 0; k < 200; k++)); do peer_host ss -Hltn "sport = :$p" | grep -q . && break; sleep 0.1; done
done
PEER_JOB_TIMEOUT=200 guest=$(peer_run 1 "ib_write_bw -d rxe0 -x 1 $args -p ${ports[0]} $PEER_HOST_ADDR > /tmp/c1 2>&1 & a=\$!
ib_write_bw -d rxe0 -x 1 $args -p ${ports[1]} $PEER_HOST_ADDR > /tmp/c2 2>&1 & b=\$!
wait \$a; ra=\$?; wait \$b; rb=\$?; cat /tmp/c1 /tmp/c2; echo rc \$ra \$rb")
src=0
for p in "${pids[@]}"; do wait "$p" || src=$?; done
echo "$guest"
cat "$PEER_RUN"/srv*.log
row='^[[:space:]]*65536[[:space:]]+300[[:space:]]+[0-9.]+[[:space:]]+[0-9.]*[1-9]'
fails=0
grep -q "^rc 0 0$" <<<"$guest" || { echo "FAIL: a guest client failed"; fails=1; }
[ $src -eq 0 ] || { echo "FAIL: a server on 10.77.0.1 exited with $src"; fails=1; }
[ "$(grep -Ec "$row" <<<"$guest")" -eq 2 ] || { echo "FAIL: expected two client result rows"; fails=1; }
for p in "${ports[@]}"; do grep -Eq "$row" "$PEER_RUN/srv$p.log" || { echo "FAIL: no result row from the server on port $p"; fails=1; }; done
[ $fails -eq 0 ] && echo "PASS: two processes on 10.77.0.1, two rxe clients"
exit $fails
