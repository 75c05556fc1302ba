#!/usr/bin/env bash
# Runs Debian's STOCK rdma-core tools (ibverbs-utils, perftest) against our libibverbs.so.1 and
# checks what they print. Usage: stock_tools.sh <libdir> <test-name>
# Every test runs with soft devices "soft0" on 127.0.0.2 (servers), "soft1" on 127.0.0.3 (clients)
# and "soft6" on ::1, with interface auto-discovery off, so the output does not depend on the machine.
# A name may carry options after '@' (perftest_ib_write_bw@-a, ibv_rc_pingpong@-s@1@-e).
set -u
libdir=$1
name=${2%%@*}
opts=""
[ "$name" != "$2" ] && opts=$(echo "${2#*@}" | tr '@' ' ')
export LD_LIBRARY_PATH=$libdir
export MELON_SOFT_AUTO=0
cfg=$(mktemp)
trap 'rm -f "$cfg" "$out" "$out2"' EXIT
out=$(mktemp)
out2=$(mktemp)
cat > "$cfg" <<CFG
# test configuration (docs/verbs.md)
device soft0 127.0.0.2
device soft1 127.0.0.3
device soft6 ::1 mtu=1500
CFG
export MELON_SOFT_CONFIG=$cfg

fail() { echo "FAIL: $*"; echo "---- output ----"; cat "$out"; exit 1; }
# The tools that send RoCE run with the datagram oracle preloaded (tests/common/wire_check_preload.cpp):
# each process logs how many datagrams it sent and how many were not exactly one RoCE packet with a
# right ICRC; wire_check fails the test on any such datagram (issue 19).
wire_log=''
wire_check_on() {
  [ -n "${MELON_WIRE_CHECK_LIB:-}" ] || return 0
  wire_log=$(mktemp)
  export LD_PRELOAD=$MELON_WIRE_CHECK_LIB MELON_WIRE_CHECK_LOG=$wire_log
}
wire_check() {
  [ -n "$wire_log" ] || return 0
  unset LD_PRELOAD
  local log; log=$(cat "$wire_log"); rm -f "$wire_log"
  echo "$log"
  grep -q "bad datagram" <<<"$log" && fail "datagrams that are not one RoCE packet: $(grep -m3 'bad datagram' <<<"$log")"
  [ "$(grep -c "datagrams [1-9][0-9]* gso_sends [0-9]* bad 0$" <<<"$log")" -ge 2 ] ||
    fail "wire check: expected both processes' counts, each with datagrams sent and none bad"
}
# shellcheck source=tests/stock/stock_lib.sh
. "$(dirname "$0")/stock_lib.sh"

case $name in
ibv_devices)
  need ibv_devices
  ibv_devices > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  loader_clean
  expect "^[[:space:]]+soft0[[:space:]]+024d4c4e[0-9a-f]{8}$"   # name, node GUID ("MLN" prefix)
  expect "^[[:space:]]+soft6[[:space:]]+024d4c4e[0-9a-f]{8}$"
  [ "$(grep -c soft "$out")" -eq 3 ] || fail "expected exactly three devices"
  ;;
ibv_devinfo)
  need ibv_devinfo
  ibv_devinfo -d soft0 > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  loader_clean
  expect $'^hca_id:\tsoft0$'
  expect $'transport:\t+InfiniBand \\(0\\)'
  expect $'fw_ver:\t+0\\.1\\.0'
  expect $'vendor_id:\t+0x4d454c'
  expect $'vendor_part_id:\t+21327'
  expect $'board_id:\t+MELON_SOFT_ROCE'      # ibv_read_sysfs_file, answered without sysfs
  expect $'state:\t+PORT_ACTIVE \\(4\\)'
  expect $'link_layer:\t+Ethernet'
  expect $'active_mtu:\t+4096 \\(5\\)'      # lo has MTU 65536
  ;;
ibv_devinfo_v)
  need ibv_devinfo
  ibv_devinfo -v > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  loader_clean
  expect $'^hca_id:\tsoft0$'
  expect $'^hca_id:\tsoft6$'
  expect $'GID\\[  0\\]:\t+::ffff:127\\.0\\.0\\.2, RoCE v2'   # IPv4-mapped RoCEv2 GID
  expect $'GID\\[  0\\]:\t+::1, RoCE v2'                     # IPv6 RoCEv2 GID
  reject $'GID\\[  1\\]'                                    # empty slots are not listed
  expect $'active_mtu:\t+1024 \\(3\\)'                      # soft6: mtu=1500 -> IB MTU 1024
  expect $'phys_state:\t+LINK_UP \\(5\\)'
  expect $'max_qp_rd_atom:\t+128'
  expect $'num_comp_vectors:\t+1'
  [ "$(grep -c 'PORT_ACTIVE (4)' "$out")" -eq 3 ] || fail "every port ACTIVE"
  ;;
ibv_devinfo_compat_paths)
  # An extended context too small to reach query_port/query_device_ex: ibv_devinfo falls back to
  # the exported ibv_query_port (48-byte layout) and ibv_query_device (the inline fallbacks of rdma-core's verbs.h).
  need ibv_devinfo
  # (0 is raised to the smallest valid size, the context plus the sz field: no op is reachable.)
  MELON_VERBS_CONTEXT_SZ=0 ibv_devinfo -v -d soft0 > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  loader_clean
  expect $'state:\t+PORT_ACTIVE \\(4\\)'
  expect $'link_layer:\t+Ethernet'
  expect $'GID\\[  0\\]:\t+::ffff:127\\.0\\.0\\.2, RoCE v2'
  expect $'device_cap_flags_ex:\t+0x0$'  # extended query unreachable: the zeroed fallback
  ibv_devinfo -v -d soft0 > "$out" 2>&1
  expect $'device_cap_flags_ex:\t+0x7C00$'  # and with the full context it is reached
  ;;
ibv_devinfo_bad_device)
  need ibv_devinfo
  ibv_devinfo -d nosuchdev > "$out" 2>&1; rc=$?
  [ $rc -ne 0 ] || fail "a missing device must fail"
  loader_clean
  expect "nosuchdev' wasn't found"
  ;;
ibv_asyncwatch)
  need ibv_asyncwatch
  # Prints the async fd, then blocks in ibv_get_async_event: a real, blocking fd.
  timeout 2 ibv_asyncwatch > "$out" 2>&1; rc=$?
  [ $rc -eq 124 ] || fail "expected to block until killed, got exit code $rc"
  loader_clean
  expect "^soft0: async event FD [0-9]+$"
  ;;
our_libs_loaded)
  # The loader must take libibverbs, libmlx5 and libefa from $libdir, never the stock ones.
  need ib_write_bw
  # Both run to completion: ib_write_bw as a client of a port nobody listens on loads everything,
  # opens the device and exits when the connection is refused.
  port=$(free_port)
  for bin in ibv_devinfo ib_write_bw; do
    args="-d soft0"
    [ "$bin" = ib_write_bw ] && args="-d soft0 -p $port 127.0.0.1"
    LD_DEBUG=libs timeout 20 "$bin" $args > /dev/null 2> "$out" < /dev/null
    expect "calling init: $libdir/libibverbs\\.so\\.1"
    reject "calling init: /(usr/)?lib[^ ]*/libibverbs\\.so"
    if [ "$bin" = ib_write_bw ]; then
      expect "calling init: $libdir/libmlx5\\.so\\.1"
      expect "calling init: $libdir/libefa\\.so\\.1"
      reject "calling init: /(usr/)?lib[^ ]*/lib(mlx5|efa)\\.so"
    fi
  done
  ;;
perftest_ldd)
  # Every perftest binary: all libraries and symbol versions resolve against ours.
  need ib_write_bw
  for bin in ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat \
             ib_atomic_bw ib_atomic_lat raw_ethernet_bw raw_ethernet_lat \
             raw_ethernet_burst_lat raw_ethernet_fs_rate; do
    path=$(command -v $bin) || fail "$bin missing"
    ldd -r "$path" > "$out" 2>&1
    loader_clean
    reject "undefined symbol"
    for lib in libibverbs libmlx5 libefa; do
      expect "$lib\\.so\\.1 => $libdir/$lib\\.so\\.1"
    done
  done
  ;;
perftest_*)
  # Server on soft0 (127.0.0.2), client on soft1 (127.0.0.3), over perftest's TCP exchange port.
  # Both must exit 0 and print a result table with sane numbers. ACK timeout 1 s (-u 18) instead of
  # perftest's 67 ms: x 8 tries that is shorter than a loaded machine's scheduling stalls, and
  # ib_send_lat -a ended in status 12 (RETRY_EXC_ERR) so at load 10.
  bin=${name#perftest_}
  need "$bin"
  port=$(free_port)
  wire_check_on
  # 200 s: the -a latency runs spin on memory at both ends, so on two loaded cores the progress
  # threads that move their data wait for a time slice (docs/performance.md); 80-100 s there.
  timeout 200 "$bin" -d soft0 -F -u 18 -p $port $opts > "$out2" 2>&1 & spid=$!
  wait_listen $port $spid  # the client makes one connection attempt
  timeout 200 "$bin" -d soft1 -F -u 18 -p $port $opts 127.0.0.1 > "$out" 2>&1; crc=$?
  wait $spid; src=$?
  cat "$out2" >> "$out"
  wire_check
  loader_clean
  reject "Couldn't get device|No IB devices|Unable to find the Infiniband/RoCE device"
  reject "Segmentation fault|Completion with error|error status"
  expect "Waiting for client to connect"
  [ $crc -eq 0 ] && [ $src -eq 0 ] || fail "exit codes client=$crc server=$src (expected 0, 0)"
  expect "^ *#bytes"                                    # the result table header
  # Every result row: a size, an iteration count, and positive numbers after them.
  rows=$(awk '/^ *#bytes/{t=1; next} t && /^ *[0-9]+ +[0-9]+ /{print}' "$out")
  [ -n "$rows" ] || fail "no result rows"
  check_figures "$bin" "$rows"
  case "$opts" in
    *-a*) [ "$(echo "$rows" | sort -u | wc -l)" -ge 6 ] || fail "-a: expected a row per size" ;;
  esac
  echo "$rows"
  ;;
raw_ethernet_*)
  # No raw packet QPs on a soft device (ibv_create_qp(IBV_QPT_RAW_PACKET): EOPNOTSUPP): each tool
  # must open the device and fail exactly at QP creation, not earlier (a rejected option or a
  # missing device also exits 1, and would pass with any library).
  bin=$name
  need "$bin"
  extra=""
  [ "$bin" = raw_ethernet_burst_lat ] && extra="--rate_limit_type=HW"  # its default SW limiter refuses a latency test
  timeout 20 "$bin" -d soft0 -F --client -B 02:00:00:00:00:01 -E 02:00:00:00:00:02 $extra > "$out" 2>&1; rc=$?
  loader_clean
  reject "Unable to find the Infiniband/RoCE device|No IB devices found"
  reject "Segmentation fault"
  reject "cann't be executed|Can't enable burst mode|Invalid|not supported"
  expect "^Unable to create QP\\.$"                    # perftest's create_qp call returned NULL
  expect "^Failed to create QP\\.$"
  expect "Couldn't create IB resources"
  [ $rc -eq 1 ] || fail "exit code $rc (expected 1)"
  ;;
ibv_devices_auto)
  # Devices from the host's interfaces: the loopback interface is one (Linux: "lo").
  need ibv_devinfo
  [ -d /sys/class/net/lo ] || { echo "SKIP: no lo interface"; exit 77; }
  MELON_SOFT_AUTO=1 MELON_SOFT_CONFIG=/nonexistent ibv_devinfo -v -d soft_lo > "$out" 2>&1; rc=$?
  [ $rc -eq 0 ] || fail "exit code $rc"
  loader_clean
  expect $'^hca_id:\tsoft_lo$'
  expect $'GID\\[  0\\]:\t+::ffff:127\\.0\\.0\\.1, RoCE v2'
  expect $'active_mtu:\t+4096 \\(5\\)'
  ;;
ibv_*_pingpong)
  # Server on soft0, client on soft1 (GID index 0: the RoCEv2 IPv4 entry). Both must report the
  # transfer and exit 0.
  need "$name"
  port=$(free_port)
  if [ "$name" = ibv_xsrq_pingpong ]; then  # fails opening the XRC domain, before any connection
    timeout 60 "$name" -d soft1 -g 0 -p $port -n 100 $opts 127.0.0.1 > "$out" 2>&1; crc=$?
    src=0
  else
    wire_check_on
    timeout 60 "$name" -d soft0 -g 0 -p $port -n 100 $opts > "$out2" 2>&1 & spid=$!
    wait_listen $port $spid  # the client makes one connection attempt
    timeout 60 "$name" -d soft1 -g 0 -p $port -n 100 $opts 127.0.0.1 > "$out" 2>&1; crc=$?
    wait $spid; src=$?
    wire_check
  fi
  cat "$out2" >> "$out"
  loader_clean
  reject "Couldn't get|No IB devices|Segmentation fault|Failed status"
  case $name in
    ibv_xsrq_pingpong)  # XRC is not supported by the soft device (EOPNOTSUPP = 95)
      expect "^Couldn't Open the XRC Domain 95$"
      [ $crc -eq 1 ] || fail "client exit code $crc"
      ;;
    *)
      [ $crc -eq 0 ] && [ $src -eq 0 ] || fail "exit codes client=$crc server=$src (expected 0, 0)"
      [ "$(grep -c "bytes in .* seconds = .* Mbit/sec" "$out")" -eq 2 ] || fail "expected both sides' result"
      [ "$(grep -c "iters in .* seconds = .* usec/iter" "$out")" -eq 2 ] || fail "expected both sides' latency"
      ;;
  esac
  ;;
exports_match_stock)
  # Our default-versioned exports equal the stock library's, node for node (rdma-core's libibverbs.map.in).
  need readelf
  stock=$(ldconfig -p | awk '/libibverbs\.so\.1 /{print $NF; exit}')
  [ -n "$stock" ] || { echo "SKIP: no stock libibverbs.so.1"; exit 77; }
  syms() { readelf --dyn-syms -W "$1" | awk '$7 != "UND" && $8 ~ /@@/ {print $8}' | sort; }
  syms "$stock" | grep -v '@@IBVERBS_PRIVATE_' > "$out2"
  syms "$libdir/libibverbs.so.1" > "$out"
  grep -qx 'ibv_query_gid_type@@IBVERBS_PRIVATE_[0-9]*' "$out" || fail "ibv_query_gid_type@@PRIVATE missing"
  grep -v '@@IBVERBS_PRIVATE_' "$out" | diff "$out2" - > /dev/null || {
    grep -v '@@IBVERBS_PRIVATE_' "$out" | diff "$out2" - ; fail "public exports differ from $stock"; }
  [ "$(wc -l < "$out2")" -ge 75 ] || fail "too few stock exports"
  ;;
no_sanitizer_runtime)
  # A stock binary has no ASan runtime: our shared libraries must not need one.
  need readelf
  for lib in libibverbs libmlx5 libefa; do
    readelf -d "$libdir/$lib.so.1" > "$out"
    reject "lib(a|ub|t)san"
    readelf --dyn-syms -W "$libdir/$lib.so.1" > "$out"
    reject "__(asan|ubsan|tsan)_"
    readelf -d "$libdir/$lib.so.1" > "$out"
    expect "BIND_NOW|FLAGS_1.*NOW"
    expect "SONAME.*\\[$lib\\.so\\.1\\]"
  done
  ;;
*)
  echo "unknown test $name"; exit 2 ;;
esac
echo "PASS: $name"
