#!/usr/bin/env bash
# Debian's STOCK ibverbs-utils and perftest on mlx5_0, the emulated ConnectX-4 Lx behind melon-emud
# (docs/mlx5-provider.md), loaded with our libibverbs.so.1 through LD_LIBRARY_PATH.
# Usage: mlx5_stock.sh <libdir> <melon-emud> <test-name>[@opt@opt...]
#
# Each test starts its own daemons (the fixture): "A" on socket $dir/a.sock with its wire on
# 127.0.0.14, and for tests with mlx5_0 on both sides "B" on $dir/b.sock, wire 127.0.0.15. Each
# process finds its daemon through MELON_EMUD_SOCKET. The soft peer is soft0 on 127.0.0.12 (an
# address no other test binds, so a concurrent run of tests/stock/stock_tools.sh cannot take its
# port 4791). At the end every daemon is stopped with SIGTERM and must exit 0: the core found
# nothing leaked.
#
# With MELON_WIRE_CHECK_LIB (ctest sets it) each daemon runs with the datagram oracle preloaded
# (tests/common/wire_check_preload.cpp): every datagram its wire hands the kernel, the pieces of a
# UDP GSO send included, must be one RoCE packet with the ICRC for the header the kernel writes.
#
# Test names: <tool>_<server>_<client>, server and client one of mlx5 (daemon A), mlx5b (daemon B)
# or soft; and ibv_devinfo, ibv_devices, ibv_devices_no_daemon.
set -u
libdir=$1
emud=$2
name=${3%%@*}
opts=""
[ "$name" != "$3" ] && opts=$(echo "${3#*@}" | tr '@' ' ')
export LD_LIBRARY_PATH=$libdir
export MELON_SOFT_AUTO=0
dir=$(mktemp -d)
out=$dir/out
out2=$dir/out2
cat > "$dir/soft.cfg" <<CFG
device soft0 127.0.0.12
CFG
export MELON_SOFT_CONFIG=$dir/soft.cfg
pids=()

# On failure the daemons are stopped first, so their logs end with their counters.
fail() { echo "FAIL: $*"; echo "---- output ----"; cat "$out" 2>/dev/null; for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; pids=(); for l in "$dir"/*.log; do [ -f "$l" ] && { echo "---- $l ----"; tail -${MELON_TAIL:-20} "$l"; }; done; cleanup; exit 1; }
# shellcheck source=tests/stock/stock_lib.sh
. "$(dirname "$0")/stock_lib.sh"
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}
# stop_daemons: SIGTERM, and each must exit 0 (everything released, nothing leaked).
stop_daemons() {
  local p rc
  for p in "${pids[@]}"; do
    kill -TERM "$p"
    wait "$p"; rc=$?
    [ $rc -eq 0 ] || { pids=(); fail "melon-emud $p exited $rc after SIGTERM"; }
  done
  pids=()
  # Every datagram a daemon received had a right ICRC (its stop line counts those that did not:
  # a GRO buffer cut apart wrongly would show here).
  local bad; bad=$(grep -h 'bad ICRC on the wire' "$dir"/*.log 2>/dev/null | grep -v '; 0 bad ICRC' || true)
  [ -z "$bad" ] || fail "melon-emud dropped datagrams with a bad ICRC: $bad"
  wire_checked
}
# wire_checked: the oracle's verdict from each daemon's log (written at exit); a test that moved
# RoCE traffic through a daemon (<tool>_<server>_<client>) must show datagrams counted.
wire_checked() {
  [ -n "${MELON_WIRE_CHECK_LIB:-}" ] || return 0
  local log; log=$(cat "$dir"/wire-*.log 2>/dev/null)
  [ -z "$log" ] || echo "$log"
  grep -q "bad datagram" <<<"$log" && fail "melon-emud sent datagrams that are not one RoCE packet: $(grep -m3 'bad datagram' <<<"$log")"
  case $name in
    *_mlx5_*|*_mlx5|*_mlx5b*) grep -q "datagrams [1-9][0-9]* gso_sends [0-9]* bad 0$" <<<"$log" ||
      fail "wire check: no count from a daemon that carried the test's traffic" ;;
  esac
  rm -f "$dir"/wire-*.log
}
trap cleanup EXIT
# start_daemon <tag> <wire>: melon-emud on $dir/<tag>.sock; waits until it accepts.
start_daemon() {
  if [ -n "${MELON_WIRE_CHECK_LIB:-}" ]; then
    LD_PRELOAD=$MELON_WIRE_CHECK_LIB MELON_WIRE_CHECK_LOG=$dir/wire-$1.log \
      "$emud" --socket "$dir/$1.sock" --wire "$2" > "$dir/$1.log" 2>&1 &
  else
    "$emud" --socket "$dir/$1.sock" --wire "$2" > "$dir/$1.log" 2>&1 &
  fi
  pids+=($!)
  local deadline=$(( SECONDS + 20 ))
  until [ -S "$dir/$1.sock" ]; do
    [ $SECONDS -lt $deadline ] || fail "melon-emud $1 did not come up"
    kill -0 "${pids[-1]}" 2>/dev/null || fail "melon-emud $1 exited"
    sleep 0.05
  done
}
# side <role>: the device name and the environment of one side.
dev_of() { case $1 in mlx5|mlx5b) echo mlx5_0 ;; soft) echo soft0 ;; esac; }
sock_of() { case $1 in mlx5) echo "$dir/a.sock" ;; mlx5b) echo "$dir/b.sock" ;; *) echo "$dir/none.sock" ;; esac; }

need "$emud"
case $name in
ibv_devinfo)
  need ibv_devinfo
  start_daemon a 127.0.0.14
  MELON_EMUD_SOCKET=$dir/a.sock ibv_devinfo -d mlx5_0 > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  loader_clean
  expect $'^hca_id:\tmlx5_0$'
  expect $'fw_ver:\t+14\\.32\\.1010'
  expect $'vendor_id:\t+0x02c9'
  expect $'vendor_part_id:\t+4117'
  expect $'board_id:\t+MELON_MLX5'
  expect $'phys_port_cnt:\t+1'
  expect $'state:\t+PORT_ACTIVE \\(4\\)'
  expect $'link_layer:\t+Ethernet'
  stop_daemons
  ;;
ibv_devices)
  # mlx5_0 next to the soft devices, with its node GUID (asked at discovery).
  need ibv_devices
  start_daemon a 127.0.0.14
  MELON_EMUD_SOCKET=$dir/a.sock ibv_devices > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  loader_clean
  expect "^[[:space:]]+soft0[[:space:]]+024d4c4e[0-9a-f]{8}$"
  expect "^[[:space:]]+mlx5_0[[:space:]]+[0-9a-f]{16}$"
  reject "mlx5_0[[:space:]]+0{16}$"
  stop_daemons
  ;;
ibv_devices_no_daemon)
  # No daemon on the socket: no mlx5_0, and the soft devices as always.
  need ibv_devices
  MELON_EMUD_SOCKET=$dir/nobody.sock ibv_devices > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  expect "^[[:space:]]+soft0[[:space:]]"
  reject "mlx5_0"
  ;;
ibv_*_pingpong_*|ib_*)
  # <tool>_<server>_<client>
  rest=${name}
  client=${rest##*_}; rest=${rest%_*}
  server=${rest##*_}; tool=${rest%_*}
  need "$tool"
  case "$server $client" in *mlx5b*) start_daemon a 127.0.0.14; start_daemon b 127.0.0.15 ;;
                            *mlx5*) start_daemon a 127.0.0.14 ;; esac
  port=$(free_port)
  case $tool in
    ibv_*) common="-g 0 -p $port -n 100 $opts" ;;
    *) common="-x 0 -F -u 18 -p $port -n 200 $opts" ;;  # 1 s ACK timeout, as in stock_tools.sh
  esac
  MELON_EMUD_SOCKET=$(sock_of "$server") timeout 100 "$tool" -d "$(dev_of "$server")" $common > "$out2" 2>&1 & spid=$!
  wait_listen $port $spid
  MELON_EMUD_SOCKET=$(sock_of "$client") timeout 100 "$tool" -d "$(dev_of "$client")" $common 127.0.0.1 > "$out" 2>&1; crc=$?
  wait $spid; src=$?
  cat "$out2" >> "$out"
  loader_clean
  reject "Couldn't|No IB devices|Segmentation fault|Failed status|Completion with error|error status"
  [ $crc -eq 0 ] && [ $src -eq 0 ] || fail "exit codes client=$crc server=$src (expected 0, 0)"
  case $tool in
    ibv_*)
      [ "$(grep -c "bytes in .* seconds = .* Mbit/sec" "$out")" -eq 2 ] || fail "expected both sides' result"
      [ "$(grep -c "iters in .* seconds = .* usec/iter" "$out")" -eq 2 ] || fail "expected both sides' latency"
      ;;
    *)
      rows=$(awk '/^ *#bytes/{t=1; next} t && /^ *[0-9]+ +[0-9]+ /{print}' "$out")
      [ -n "$rows" ] || fail "no result rows"
      check_figures "$tool" "$rows"
      echo "$rows"
      ;;
  esac
  stop_daemons
  ;;
*)
  echo "unknown test $name"; exit 2 ;;
esac
echo "PASS: $name"
