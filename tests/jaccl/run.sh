#!/usr/bin/env bash
# Two ranks of uc_allsum (JACCL's verbs usage, uc_allsum.cpp) in two network namespaces this script
# creates and removes, joined by a veth pair (10.231.<n>.1 and .2): one all_sum per size, every
# element verified. Rank 0 on soft or on mlx5_0 (a melon-emud of its own in namespace a), rank 1
# on soft. Reliable UC on both sides (MELON_UC_RELIABLE=1) unless MODE is spec.
# Usage: [ROUNDS=k] run.sh <libdir> <uc_allsum> <melon-emud> <soft|mlx5> <spec|reliable> <bytes>...
# Exit 0 all verified, 1 a failure, 77 no namespaces here (needs root and iproute2).
set -u
libdir=$1 prog=$2 emud=$3 pairing=$4 mode=$5
shift 5
if ! command -v ip >/dev/null || [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: needs root and ip(8) for network namespaces"; exit 77
fi
n=$(( $$ % 200 + 20 ))  # a subnet per run: concurrent runs do not meet
a=melonj-$$-a b=melonj-$$-b dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
# On failure melon-emud is stopped first, so its log ends with its counters.
fail() { echo "FAIL: $*"; for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; pids=(); for f in "$dir"/*.log; do [ -f "$f" ] && { echo "---- $f"; tail -20 "$f"; }; done
  for ns in "$a" "$b"; do echo "---- UDP counters in $ns"; ip netns exec "$ns" grep Udp: /proc/net/snmp; done; exit 1; }
if ! ip netns add "$a" || ! ip netns add "$b"; then echo "SKIP: cannot create network namespaces"; exit 77; fi
ip link add "vj$$a" netns "$a" type veth peer name "vj$$b" netns "$b" || fail "veth"
for s in a b; do
  ns=${!s}; addr=10.231.$n.$([ $s = a ] && echo 1 || echo 2)
  ip -n "$ns" link set lo up || fail "lo"
  ip -n "$ns" addr add "$addr/24" dev "vj$$$s" || fail "address"
  ip -n "$ns" link set "vj$$$s" up || fail "link up"
done
export LD_LIBRARY_PATH=$libdir MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG=/nonexistent
export MELON_UC_RELIABLE=0
[ "$mode" = reliable ] && MELON_UC_RELIABLE=1
dev0=soft0
if [ "$pairing" = mlx5 ]; then
  ip netns exec "$a" "$emud" --socket "$dir/emud.sock" --wire "10.231.$n.1" > "$dir/emud.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 400); do [ -S "$dir/emud.sock" ] && break; sleep 0.05; done
  [ -S "$dir/emud.sock" ] || fail "melon-emud did not come up"
  dev0=mlx5_0
fi
# MELON_JACCL_PCAP=file: a capture of namespace b's side of the link, for a look at the exchange.
if [ -n "${MELON_JACCL_PCAP:-}" ]; then
  ip netns exec "$b" tcpdump -i "vj$$b" -s 128 -w "$MELON_JACCL_PCAP" udp port 4791 2>/dev/null &
  pids+=($!)
  sleep 0.5
fi
rc=0
# MLX's own JACCL (jaccl_allsum, built by jaccl_port.sh): both ranks, every size in one group.
if [ "$(basename "$prog")" = jaccl_allsum ]; then
  printf '[[null, "%s"], ["soft1", null]]\n' "$dev0" > "$dir/devices.json"
  export JACCL_IBV_DEVICES=$dir/devices.json JACCL_COORDINATOR=10.231.$n.1:18516
  ip netns exec "$a" env JACCL_RANK=0 MELON_SOFT_DEVICES="soft0=10.231.$n.1/gid1=ipv4" \
    MELON_EMUD_SOCKET="$dir/emud.sock" timeout 120 "$prog" "$@" > "$dir/rank0.log" 2>&1 &
  r0=$!
  ip netns exec "$b" env JACCL_RANK=1 MELON_SOFT_DEVICES="soft1=10.231.$n.2/gid1=ipv4" \
    timeout 120 "$prog" "$@" > "$dir/rank1.log" 2>&1
  s1=$?
  wait $r0; s0=$?
  echo "JACCL $pairing/$mode: rank 0 exit $s0, rank 1 exit $s1"
  cat "$dir/rank0.log" "$dir/rank1.log"
  if [ $s0 -ne 0 ] || [ $s1 -ne 0 ]; then fail "JACCL's all_sum was not verified"; fi
  echo PASS
  exit 0
fi
for bytes in "$@"; do
  ip netns exec "$a" env MELON_SOFT_DEVICES="soft0=10.231.$n.1/gid1=ipv4" MELON_EMUD_SOCKET="$dir/emud.sock" \
    "$prog" --rank 0 --dev "$dev0" --addr "10.231.$n.1:18515" --bytes "$bytes" --rounds "${ROUNDS:-3}" > "$dir/rank0.log" 2>&1 &
  r0=$!
  ip netns exec "$b" env MELON_SOFT_DEVICES="soft1=10.231.$n.2/gid1=ipv4" \
    "$prog" --rank 1 --dev soft1 --addr "10.231.$n.1:18515" --bytes "$bytes" --rounds "${ROUNDS:-3}" > "$dir/rank1.log" 2>&1
  s1=$?
  wait $r0; s0=$?
  echo "$pairing/$mode $bytes bytes: rank 0 exit $s0, rank 1 exit $s1"
  cat "$dir/rank0.log" "$dir/rank1.log"
  [ $s0 -eq 0 ] && [ $s1 -eq 0 ] || rc=1
done
[ $rc -eq 0 ] || fail "an all_sum was not verified"
echo PASS
