#!/usr/bin/env bash
# The interop gate (docs/peer.md): stock rdma-core tools on the host, loaded with OUR libibverbs and soft
# provider on 10.77.0.1, against Linux Soft-RoCE (rxe) in a qemu guest (10.77.0.2), both directions.
# Usage: gate.sh <dir with our libibverbs.so.1>. Exit 77 (skipped) where guests cannot run.
# PEER_GATE_MTU=4200 runs it at path MTU 4096.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
libdir=${1:?usage: gate.sh <libdir>}

if ! why=$(peer_check); then
  echo "SKIPPED: $why"
  exit 77
fi
[ -e "$libdir/libibverbs.so.1" ] || { echo "FAIL: no $libdir/libibverbs.so.1 (build the ibverbs target)"; exit 1; }

mtu=${PEER_GATE_MTU:-1500}
case $mtu in 1500) pmtu=1024 ;; 4200) pmtu=4096 ;; *) echo "PEER_GATE_MTU is 1500 or 4200"; exit 2 ;; esac

failures=0
check() {
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
has() { grep -Eq -- "$2" <<<"$1"; }

t0=$SECONDS
peer_image || { echo "FAIL: cannot build the guest image"; exit 1; }
peer_up 1 "$mtu" || { echo "FAIL: guest did not boot"; exit 1; }

cfg=$PEER_RUN/soft.conf
echo "device soft0 $PEER_HOST_ADDR" > "$cfg"
# soft CMD...: a stock tool on the host side of the namespace, with our libibverbs and one soft device.
soft() {
  peer_host env LD_LIBRARY_PATH="$libdir" MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG="$cfg" \
    timeout 90 "$@"
}
host_listening() {  # until something on the host side listens on TCP 18515
  local k
  for ((k = 0; k < 100; k++)); do
    [ -n "$(peer_host ss -Hltn 'sport = :18515')" ] && return 0
    sleep 0.1
  done
  return 1
}
rcvd() { peer_counter 1 rcvd_pkts; }

info=$(soft ibv_devinfo -d soft0 2>&1)
check "soft0 on 10.77.0.1 is PORT_ACTIVE" has "$info" 'state:[[:space:]]+PORT_ACTIVE'
check "soft0 active_mtu $pmtu (from br0's MTU $mtu)" has "$info" "active_mtu:[[:space:]]+$pmtu"

# Each pair: the server starts first; the client follows once the server's TCP port is open.
# pair <name> <guest-server|host-server> <tool args, without the address> ; checks in the caller.
pair() {
  local how=$1 guest_args=$2 host_args=$3
  local r0; r0=$(rcvd)
  if [ "$how" = guest-server ]; then
    local id; id=$(peer_spawn 1 "$guest_args")
    peer_wait_listen 1 18515 || echo "warning: guest server not listening"
    # shellcheck disable=SC2086
    host_out=$(soft $host_args 10.77.0.2 2>&1); host_rc=$?
    guest_out=$(peer_wait 1 "$id" 2>&1); guest_rc=$?
  else
    local out=$PEER_RUN/host-server.out
    # shellcheck disable=SC2086
    soft $host_args >"$out" 2>&1 & local hp=$!
    host_listening || echo "warning: host server not listening"
    guest_out=$(peer_run 1 "$guest_args 10.77.0.1" 2>&1); guest_rc=$?
    wait "$hp"; host_rc=$?
    host_out=$(cat "$out")
  fi
  rcvd_delta=$(( $(rcvd) - r0 ))
  echo "--- host (MelonDMA soft):"; echo "$host_out"; echo "--- guest (rxe):"; echo "$guest_out"
  echo "rxe rcvd_pkts +$rcvd_delta"
}

pingpong() {  # pingpong <guest-server|host-server>
  local t=$SECONDS
  pair "$1" "ibv_rc_pingpong -d rxe0 -g 1 -n 50 -m $pmtu" "ibv_rc_pingpong -d soft0 -g 0 -n 50 -m $pmtu"
  check "rc_pingpong ($1): host exit 0" [ "$host_rc" = 0 ]
  check "rc_pingpong ($1): guest exit 0" [ "$guest_rc" = 0 ]
  check "rc_pingpong ($1): host did 50 iters" has "$host_out" '^50 iters in'
  check "rc_pingpong ($1): guest did 50 iters" has "$guest_out" '^50 iters in'
  check "rc_pingpong ($1): rxe accepted our packets (good ICRC)" [ "$rcvd_delta" -ge 50 ]
  echo "rc_pingpong ($1): $((SECONDS - t)) s"
}

perf() {  # perf <tool> <guest-server|host-server>
  local tool=$1 how=$2 t=$SECONDS
  pair "$how" "$tool -d rxe0 -x 1 -F -n 100 -s 65536 -m $pmtu" "$tool -d soft0 -x 0 -F -n 100 -s 65536 -m $pmtu"
  check "$tool ($how): host exit 0" [ "$host_rc" = 0 ]
  check "$tool ($how): guest exit 0" [ "$guest_rc" = 0 ]
  local row='^ *65536 +100 +[0-9.]+ +[0-9.]*[1-9][0-9.]* '
  check "$tool ($how): result row" has "$host_out$guest_out" "$row"
  check "$tool ($how): rxe accepted our packets" [ "$rcvd_delta" -ge 1 ]
  echo "$tool ($how): $((SECONDS - t)) s"
}

pingpong guest-server
pingpong host-server
perf ib_write_bw guest-server
perf ib_write_bw host-server
perf ib_read_bw guest-server
perf ib_send_bw guest-server

peer_down
echo "gate: $((SECONDS - t0)) s in all, $failures failure(s)"
[ "$failures" -eq 0 ] && exit 0
exit 1
