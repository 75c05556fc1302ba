#!/usr/bin/env bash
# Debian's UCX (ucx-utils, libucx0) on our soft devices, unmodified, across two network namespaces
# this test creates (veth, 10.224.0.1 and .2, soft0 on each):
#   1. UCX lists an IB memory domain only for a device whose /dev/infiniband/<dev_name> is a
#      character device it can open read-write (uct_ib_device_is_accessible). Without one: no
#      soft0 domain (the control). With one (here a /dev/null-like node, major 1 minor 3, in a /dev
#      of this test's own mount namespace): rc_verbs and ud_verbs on soft0:1.
#   2. ucx_perftest, server in one namespace and client in the other, over rc_verbs (UCP with
#      ud_verbs for wire-up, and UCT directly) and ud_verbs: tag-matching latency and bandwidth,
#      put and get bandwidth, fetch-and-add and compare-and-swap, active messages. Each run must
#      finish every iteration on both ends, and the soft devices' own counters (MELON_SOFT_STATS)
#      must show the RoCEv2 packets: at least one per iteration each way, none dropped or bad.
#   3. The same over mlx5_0 (a melon-emud in the first namespace, wire 10.224.0.3): ucx_info lists
#      both transports on mlx5_0:1, and UCP runs with the server on mlx5_0 and the client on soft0,
#      every frame the client sent received by the daemon and the other way round.
#   4. With "sockaddr": UCX's client/server connection through our librdmacm instead (below).
#   usage: ucx_test.sh <our library directory> <melon-emud> [sockaddr]
# Needs root (namespaces, mknod, mounts) and ucx-utils; otherwise SKIP (exit 77), saying why.
set -u
libdir=$(realpath "$1")
emud=$(realpath "$2")
skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}

if [ "${MELON_UCX_INNER:-}" != 1 ]; then
  [ "$(id -u)" -eq 0 ] || skip "needs root (network and mount namespaces, mknod)"
  for t in ucx_info ucx_perftest ip unshare mknod; do
    command -v "$t" > /dev/null || skip "$t not installed (ucx-utils, iproute2, util-linux)"
  done
  grep -qw overlay /proc/filesystems || modprobe overlay 2> /dev/null
  grep -qw overlay /proc/filesystems || skip "no overlay file system (a /dev of our own is built on it)"
  MELON_UCX_INNER=1 exec unshare --mount --propagation private "$0" "$@"
fi

# ---- inside our own mount namespace ------------------------------------------------------------

work=$(mktemp -d)
ns_a=melonucx-a-$$
ns_b=melonucx-b-$$
cleanup() {
  [ -n "${emud_pid:-}" ] && kill "$emud_pid" 2> /dev/null
  ip netns del "$ns_a" 2> /dev/null
  ip netns del "$ns_b" 2> /dev/null
  umount -l "$work" 2> /dev/null
  rmdir "$work" 2> /dev/null
}
trap cleanup EXIT

ip netns add "$ns_a" || skip "cannot create a network namespace"
ip netns add "$ns_b" || fail "second network namespace"
ip link add "ua$$" type veth peer name "ub$$" || skip "cannot create a veth pair"
{ ip link set "ua$$" netns "$ns_a" && ip link set "ub$$" netns "$ns_b"; } || fail "veth into the namespaces"
{ ip -n "$ns_a" addr add 10.224.0.1/24 dev "ua$$" && ip -n "$ns_a" addr add 10.224.0.3/24 dev "ua$$" &&
  ip -n "$ns_b" addr add 10.224.0.2/24 dev "ub$$"; } || fail "addresses"
for pair in "$ns_a:ua$$" "$ns_b:ub$$"; do
  { ip -n "${pair%%:*}" link set "${pair#*:}" up && ip -n "${pair%%:*}" link set lo up; } || fail "links up"
done

# Runs a command in namespace $1 with soft0 on address $2, our libraries first.
in_ns() {
  local ns=$1 addr=$2
  shift 2
  ip netns exec "$ns" env LD_LIBRARY_PATH="$libdir" MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG=/nonexistent \
    MELON_SOFT_DEVICES="soft0=$addr" MELON_STATS_DIR="$work" MELON_EMUD_SOCKET="$work/emud.sock" "$@"
}

# 1a. The control: the device is there, but UCX has no node for it.
if [ ! -e /dev/infiniband/uverbs0 ] && [ "${3:-}" != sockaddr ]; then
  in_ns "$ns_a" 10.224.0.1 ucx_info -d > "$work/info0" 2>&1 || fail "ucx_info -d exited $? without the node"
  ! grep -q "Memory domain: soft0" "$work/info0" || fail "UCX took soft0 without /dev/infiniband/uverbs0"
fi

# A /dev for this namespace only, with /dev/infiniband/uverbs0..3 (ucx_lib.sh).
# shellcheck source=ucx_lib.sh
. "$(dirname "$0")/ucx_lib.sh"
mkdir -p "$work" || fail "scratch"
why=$(uverbs_dev "$work"); rc=$?
[ $rc = 2 ] && skip "$why"
[ $rc = 0 ] || fail "$why"
mkdir "$work/stats" || fail "stats"
work=$work/stats

# sockaddr mode: UCX's client/server API (ucp_listener, an endpoint made from the server's IP
# address) with its connection established by our librdmacm (UCX_SOCKADDR_TLS_PRIORITY=rdmacm).
# ucx_perftest 1.13 exchanges worker addresses over a TCP socket of its own and never takes this
# path; io_demo (the same ucx-utils package) does: the client reads and writes random-sized
# buffers, -q checks every byte and sequence number on both ends (a mismatch aborts). Each way
# round: the server in one namespace, the client in the other; the CM's REQ/REP/RTU, DREQ/DREP
# (MELON_CM_DEBUG) prove rdma_cm carried the connection, not UCX's TCP sockcm.
if [ "${3:-}" = sockaddr ]; then
  command -v io_demo > /dev/null || skip "io_demo not installed (ucx-utils)"
  port=13600
  # ab, ba: soft0 at both ends. mlx5: the server on mlx5_0 (a melon-emud in the first namespace,
  # wire 10.224.0.3), the client on soft0. Its SRQ receives are UCX's buffers whose ends lie over
  # the next buffer's header: the device must write a message's bytes and no others (docs/rdmacm.md).
  dirs="ab ba mlx5"
  ip netns exec "$ns_a" "$emud" --socket "$work/emud.sock" --wire 10.224.0.3 > "$work/emud.log" 2>&1 &
  emud_pid=$!
  for _ in $(seq 100); do [ -S "$work/emud.sock" ] && break; sleep 0.05; done
  [ -S "$work/emud.sock" ] || fail "melon-emud did not come up: $(cat "$work/emud.log")"
  for dir in $dirs; do
    # S: the server's namespace and soft0 address, C: the client's; at: where the client connects.
    sdev=soft0
    case $dir in
      ab) S=("$ns_a" 10.224.0.1) C=("$ns_b" 10.224.0.2) at=10.224.0.1 ;;
      ba) S=("$ns_b" 10.224.0.2) C=("$ns_a" 10.224.0.1) at=10.224.0.2 ;;
      mlx5) S=("$ns_a" 10.224.0.1) C=("$ns_b" 10.224.0.2) at=10.224.0.3 sdev=mlx5_0 ;;
    esac
    port=$((port + 1))
    env=(UCX_SOCKADDR_TLS_PRIORITY=rdmacm "UCX_TLS=rc_verbs,ud_verbs" MELON_CM_DEBUG=1)
    in_ns "${S[@]}" env "${env[@]}" UCX_NET_DEVICES=$sdev:1 timeout 40 io_demo -p "$port" -q -o read,write -d 1024:65536 \
      > "$work/$dir-server" 2>&1 &
    server=$!
    for _ in $(seq 100); do grep -q "started listener" "$work/$dir-server" && break; sleep 0.1; done
    grep -q "started listener" "$work/$dir-server" || { cat "$work/$dir-server"; fail "$dir: io_demo server did not listen"; }
    in_ns "${C[@]}" env "${env[@]}" UCX_NET_DEVICES=soft0:1 timeout 30 io_demo -p "$port" -q -o read,write -d 1024:65536 -i 200 "$at" \
      > "$work/$dir-client" 2>&1
    crc=$?
    sleep 0.3
    alive=0
    pgrep -P "$server" > /dev/null && alive=1
    # $server is the subshell of in_ns; its child is timeout, which passes the signal on to io_demo.
    # Waiting for the subshell waits for them: the next server's end needs this one's QP1.
    pkill -TERM -P "$server" 2> /dev/null
    wait "$server" 2> /dev/null
    show() {
      echo "--- client:"
      cat "$work/$dir-client"
      echo "--- server:"
      grep -v "active: 0/0" "$work/$dir-server"
    }
    { [ $crc = 0 ] && grep -q "Client exit with status 'OK'" "$work/$dir-client"; } || { show; fail "$dir: io_demo client exit $crc"; }
    [ $alive = 1 ] || { show; fail "$dir: io_demo server died"; }
    ! grep -q "ERROR\|Assertion" "$work/$dir-client" "$work/$dir-server" || { show; fail "$dir: an error above"; }
    # The reports count the operations of their interval: 200 in all, reads and writes among them.
    sums=$(io_demo_totals "$(cat "$work/$dir-client")")
    read -r ops reads writes <<< "$sums"
    { [ "${ops:-0}" = 200 ] && [ "${reads:-0}" -gt 0 ] && [ "${writes:-0}" -gt 0 ] &&
      [ $((reads + writes)) = 200 ]; } || { show; fail "$dir: not 200 verified reads and writes: $sums"; }
    for m in "MAD out: req" "MAD in: rep" "MAD out: rtu"; do
      grep -q "$m" "$work/$dir-client" || { show; fail "$dir: client: no '$m' (was rdma_cm used?)"; }
    done
    for m in "MAD in: req" "MAD out: rep" "MAD in: rtu"; do
      grep -q "$m" "$work/$dir-server" || { show; fail "$dir: server: no '$m'"; }
    done
    echo "ok: $dir: io_demo over rdmacm sockaddr: $reads reads and $writes writes of 1-64 KiB, verified"
  done
  echo "PASS"
  exit 0
fi

# 1b. Now UCX lists both verbs transports on soft0.
in_ns "$ns_a" 10.224.0.1 ucx_info -d > "$work/info" 2>&1 || fail "ucx_info -d exited $?"
for tl in rc_verbs ud_verbs; do
  awk -v tl="$tl" '/Memory domain:/ {md=$NF} /Transport:/ {t=$NF} /Device:/ && md=="soft0" && t==tl && $NF=="soft0:1" {ok=1} END {exit !ok}' \
    "$work/info" || {
    cat "$work/info"
    fail "ucx_info -d lists no $tl on soft0:1"
  }
done
echo "ok: ucx_info -d lists rc_verbs and ud_verbs on soft0:1"


# 2. ucx_perftest. One row per run: the server's device, transports (UCX_TLS, "-" for the UCT
# layer's -x), arguments. The client is always on soft0.
port=13400
iters=1000
runs=(
  "soft0|rc_verbs,ud_verbs|-t tag_lat"
  "soft0|rc_verbs,ud_verbs|-t tag_bw -s 65536 -n 200"
  "soft0|rc_verbs,ud_verbs|-t ucp_put_bw -s 65536 -n 200"
  "soft0|rc_verbs,ud_verbs|-t ucp_get -s 65536 -n 200"
  "soft0|rc_verbs,ud_verbs|-t ucp_fadd"
  "soft0|rc_verbs,ud_verbs|-t ucp_cswap"
  "soft0|rc_verbs,ud_verbs|-t ucp_am_lat"
  "soft0|-|-x rc_verbs -d soft0:1 -t am_lat"
  "soft0|-|-x rc_verbs -d soft0:1 -t put_bw -D zcopy -s 65536 -n 200"
  "soft0|-|-x rc_verbs -d soft0:1 -t get -D zcopy -s 65536 -n 200"
  "soft0|-|-x rc_verbs -d soft0:1 -t fadd"
  "soft0|-|-x rc_verbs -d soft0:1 -t cswap"
  "soft0|ud_verbs|-t tag_lat"
  "soft0|ud_verbs|-t ucp_am_lat"
  "soft0|-|-x ud_verbs -d soft0:1 -t am_lat"
  "mlx5_0|rc_verbs,ud_verbs|-t tag_lat -n 200"
  "mlx5_0|rc_verbs,ud_verbs|-t ucp_put_bw -s 4096 -n 100"
  "mlx5_0|rc_verbs,ud_verbs|-t ucp_get -s 4096 -n 100"
  "mlx5_0|rc_verbs,ud_verbs|-t ucp_fadd -n 200"
  "mlx5_0|rc_verbs,ud_verbs|-t ucp_am_lat -n 200"
  "mlx5_0|ud_verbs|-t tag_lat -n 200"
)

# The last counters line a side printed: value of counter $2 in file $1.
counter() { grep "melondma soft: soft0 counters:" "$1" | tail -1 | sed -n "s/.* $2 \([0-9]*\).*/\1/p"; }

# mlx5_0 for the rows that name it: its daemon in the server's namespace.
ip netns exec "$ns_a" "$emud" --socket "$work/emud.sock" --wire 10.224.0.3 > "$work/emud.log" 2>&1 &
emud_pid=$!
for _ in $(seq 100); do [ -S "$work/emud.sock" ] && break; sleep 0.05; done
[ -S "$work/emud.sock" ] || fail "melon-emud did not come up: $(cat "$work/emud.log")"
in_ns "$ns_a" 10.224.0.1 ucx_info -d > "$work/info" 2>&1 || fail "ucx_info -d exited $? with mlx5_0"
for tl in rc_verbs ud_verbs; do
  awk -v tl="$tl" '/Memory domain:/ {md=$NF} /Transport:/ {t=$NF} /Device:/ && md=="mlx5_0" && t==tl && $NF=="mlx5_0:1" {ok=1} END {exit !ok}' \
    "$work/info" || fail "ucx_info -d lists no $tl on mlx5_0:1"
done
echo "ok: ucx_info -d lists rc_verbs and ud_verbs on mlx5_0:1"
mlx5_tx=0 mlx5_rx=0 mlx5_rows=0

# For a look at one failure: MELON_UCX_ROWS (a regex on "<device>|<transports>|<arguments>") runs
# only the rows it matches; MELON_UCX_PCAP=<dir> keeps each row's RoCEv2 packets on the veth as
# <dir>/row-<port>.pcap (for ../shared/tools/icrc_check.py or tshark).
for row in "${runs[@]}"; do
  [[ $row =~ ${MELON_UCX_ROWS:-.} ]] || continue
  sdev=${row%%|*}
  row=${row#*|}
  tls=${row%%|*}
  args=${row#*|}
  n=$iters
  case $args in *"-n "*) n=$(sed -n 's/.*-n \([0-9]*\).*/\1/p' <<< "$args") ;; esac
  [ "$args" = "${args/-n /}" ] && args="$args -n $iters"
  env=(MELON_SOFT_STATS=1 UCX_NET_DEVICES=soft0:1)
  [ "$tls" != - ] && env+=("UCX_TLS=$tls")
  port=$((port + 1))
  cap=
  if [ -n "${MELON_UCX_PCAP:-}" ]; then
    ip netns exec "$ns_a" tcpdump -q -n -i "ua$$" -s 0 -U -w "$MELON_UCX_PCAP/row-$port.pcap" udp port 4791 2> /dev/null &
    cap=$!
    sleep 0.5
  fi
  in_ns "$ns_a" 10.224.0.1 env "${env[@]}" UCX_NET_DEVICES="$sdev:1" timeout 30 ucx_perftest -p "$port" > "$work/server" 2>&1 &
  server=$!
  # The client retries until the server listens (it exits at once on a refused connection).
  ok=0
  for _ in $(seq 50); do
    # shellcheck disable=SC2086 # $args is a list of options
    in_ns "$ns_b" 10.224.0.2 env "${env[@]}" timeout 30 ucx_perftest 10.224.0.1 -p "$port" -w 10 $args \
      > "$work/client" 2>&1 && {
      ok=1
      break
    }
    grep -q "Connection refused\|connect() failed" "$work/client" || break
    sleep 0.1
  done
  wait "$server"
  src=$?
  if [ -n "$cap" ]; then sleep 0.2; kill "$cap"; wait "$cap" 2> /dev/null; fi
  label="$sdev<-soft0 ${tls/-/uct} $args"
  if [ $ok != 1 ] || [ $src != 0 ]; then
    echo "--- client:"
    cat "$work/client"
    echo "--- server:"
    cat "$work/server"
    fail "$label: client ok=$ok, server exit $src"
  fi
  grep -Eq "^Final: +$n " "$work/client" || {
    cat "$work/client"
    fail "$label: no final line with $n iterations"
  }
  # Every iteration moves at least one packet; what one side sent, the other received (veth
  # loses nothing: a few may still be on the way when a side stops and counts).
  declare -A c=()
  sides="client server"
  [ "$sdev" = mlx5_0 ] && sides=client  # the daemon counts mlx5_0's frames (below)
  for side in $sides; do
    for k in rx_packets tx_packets rx_bad_icrc rx_malformed rx_buffer_drops tx_errors; do
      c[$side.$k]=$(counter "$work/$side" $k)
      [ -n "${c[$side.$k]}" ] || fail "$label: $side printed no soft0 counter $k"
    done
    bad=$((c[$side.rx_bad_icrc] + c[$side.rx_malformed] + c[$side.rx_buffer_drops] + c[$side.tx_errors]))
    [ "$bad" -eq 0 ] || fail "$label: $side dropped or refused packets ($bad): $(grep "melondma soft: soft0 counters:" "$work/$side" | tail -1)"
  done
  if [ "$sdev" = mlx5_0 ]; then
    mlx5_tx=$((mlx5_tx + ${c[client.tx_packets]}))
    mlx5_rx=$((mlx5_rx + ${c[client.rx_packets]}))
    mlx5_rows=$((mlx5_rows + 1))
    { [ "${c[client.tx_packets]}" -ge "$n" ] && [ "${c[client.rx_packets]}" -ge 1 ]; } ||
      fail "$label: soft0 sent ${c[client.tx_packets]} and received ${c[client.rx_packets]} packets for $n iterations"
    final=$(grep -E "^Final:" "$work/client")
    echo "ok: $label: packets soft0->mlx5_0 ${c[client.tx_packets]}, mlx5_0->soft0 ${c[client.rx_packets]} |${final#Final:}"
    continue
  fi
  total=$((${c[client.tx_packets]} + ${c[server.tx_packets]}))
  [ "$total" -ge "$n" ] || fail "$label: fewer RoCEv2 packets ($total) than iterations"
  for pair in client:server server:client; do
    from=${pair%%:*} to=${pair#*:}
    d=$((c[$from.tx_packets] - c[$to.rx_packets]))
    { [ "$d" -ge 0 ] && [ "$d" -le 8 ] && [ "${c[$from.tx_packets]}" -ge 1 ]; } ||
      fail "$label: $from sent ${c[$from.tx_packets]} packets, $to received ${c[$to.rx_packets]}"
  done
  final=$(grep -E "^Final:" "$work/client")
  echo "ok: $label: packets client->server ${c[client.tx_packets]}, server->client ${c[server.tx_packets]} |${final#Final:}"
done
# The daemon's own count: every frame soft0 sent it arrived, and what it sent soft0 received (a
# few may still have been on the way when a client stopped and counted).
kill "$emud_pid"
wait "$emud_pid"
est=$?
emud_pid=
[ $est = 0 ] || fail "melon-emud exit $est: $(tail -3 "$work/emud.log")"
line=$(grep "device: frames" "$work/emud.log")
sent=$(sed -n 's/.*frames \([0-9]*\) sent.*/\1/p' <<< "$line")
recv=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' <<< "$line")
grep -q " 0 dropped;.* 0 bad ICRC" <<< "$line" || fail "melon-emud dropped frames: $line"
slack=$((8 * mlx5_rows))
{ [ "$recv" -le "$mlx5_tx" ] && [ "$recv" -ge $((mlx5_tx - slack)) ] && [ "$sent" -ge "$mlx5_rx" ] && [ "$sent" -le $((mlx5_rx + slack)) ]; } ||
  fail "mlx5_0 frames: sent $sent received $recv; soft0 sent it $mlx5_tx and received $mlx5_rx"
echo "ok: mlx5_0: $recv frames received of $mlx5_tx soft0 sent, $sent sent ($mlx5_rx received by soft0)"
echo "PASS"
