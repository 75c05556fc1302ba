#!/usr/bin/env bash
# The peer harness proves itself (docs/peer.md): two Debian guests with Soft-RoCE (rxe) talk RoCEv2 to
# each other with stock rdma-core tools, and the host side of the namespace reaches a guest's UDP 4791.
# Exit 77 (ctest: skipped) when this machine cannot run guests; never a pass in that case.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

if ! why=$(peer_check); then
  echo "SKIPPED: $why"
  exit 77
fi

failures=0
check() {  # check <what> <condition...>
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
has() { grep -Eq -- "$2" <<<"$1"; }

t0=$SECONDS
peer_image || { echo "FAIL: cannot build the guest image"; exit 1; }
echo "image: $PEER_IMAGE (ready after $((SECONDS - t0)) s)"

# PEER_SELFTEST_MTU=4200 runs the same checks with a 4096 path MTU (CI runs 1500).
mtu=${PEER_SELFTEST_MTU:-1500}
case $mtu in 1500) pmtu=1024 ;; 4200) pmtu=4096 ;; *) echo "PEER_SELFTEST_MTU is 1500 or 4200"; exit 2 ;; esac
t1=$SECONDS
peer_up 2 "$mtu" || { echo "FAIL: guests did not boot"; exit 1; }
echo "boot: 2 guests in $((SECONDS - t1)) s (MTU $mtu)"
for i in 1 2; do cat "$PEER_RUN/g$i/share/ready" | tr '\n' ' '; echo; done

# --- each guest: rxe0 up, GID index 1 is the RoCEv2 ::ffff:10.77.0.x entry, path MTU 1024
for i in 1 2; do
  addr=$(peer_guest_addr "$i")
  info=$(peer_run "$i" 'ibv_devinfo -d rxe0; cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1 /sys/class/infiniband/rxe0/ports/1/gids/1')
  check "guest $i: rxe0 PORT_ACTIVE" has "$info" 'state:[[:space:]]+PORT_ACTIVE'
  check "guest $i: active_mtu $pmtu" has "$info" "active_mtu:[[:space:]]+$pmtu"
  check "guest $i: GID 1 is RoCE v2 ::ffff:$addr" has "$info" \
    "RoCE v2"
  printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${addr//./ }
  check "guest $i: GID 1 = $want" has "$info" "^$want\$"
  # IPv6 (the gate's IPv6 rows use these): rxe has RoCEv2 GIDs for the link-local and the fd77:: address.
  check "guest $i: rxe0 has an IPv6 link-local GID ($(peer_ready "$i" ip6_ll) at $(peer_ready "$i" gid_ll))" \
    [ -n "$(peer_ready "$i" gid_ll)" ]
  check "guest $i: rxe0 has a GID for $(peer_guest_addr6 "$i") (at $(peer_ready "$i" gid_ula))" \
    [ -n "$(peer_ready "$i" gid_ula)" -a "$(peer_ready "$i" ip6)" = "$(peer_guest_addr6 "$i")" ]
done
out=$(peer_host ping -6 -c 2 -W 5 fd77::2 2>&1); check "host ping -6 fd77::2" has "$out" ' 0% packet loss'

# --- the host side of the namespace reaches both guests
out=$(peer_host ping -c 2 -W 5 10.77.0.2 2>&1); check "host ping 10.77.0.2" has "$out" ' 0% packet loss'
out=$(peer_host ping -c 2 -W 5 10.77.0.3 2>&1); check "host ping 10.77.0.3" has "$out" ' 0% packet loss'

# --- ibv_rc_pingpong: guest 1 server, guest 2 client, GID index 1 (RoCEv2)
t2=$SECONDS
pcap=$PEER_RUN/rc_pingpong.pcap
peer_capture_start "$pcap" || echo "warning: no capture"
srv=$(peer_spawn 1 "ibv_rc_pingpong -d rxe0 -g 1 -n 100 -m $pmtu")
peer_wait_listen 1 18515 || echo "warning: server not listening yet"
cli_out=$(peer_run 2 "ibv_rc_pingpong -d rxe0 -g 1 -n 100 -m $pmtu 10.77.0.2" 2>&1); cli_rc=$?
srv_out=$(peer_wait 1 "$srv" 2>&1); srv_rc=$?
echo "--- ibv_rc_pingpong client:"; echo "$cli_out"; echo "--- server:"; echo "$srv_out"
check "ibv_rc_pingpong client exit 0" [ "$cli_rc" = 0 ]
check "ibv_rc_pingpong server exit 0" [ "$srv_rc" = 0 ]
# 100 round trips of 4096 bytes; rc_pingpong counts both directions.
check "ibv_rc_pingpong client: 100 iters" has "$cli_out" '^819200 bytes in [0-9.]+ seconds'
check "ibv_rc_pingpong server: 100 iters" has "$srv_out" '^100 iters in [0-9.]+ seconds'
check "client saw the server's GID ::ffff:10.77.0.2" has "$cli_out" 'remote address: .*GID ::ffff:10.77.0.2'
peer_capture_stop
# 100 x 4096 B each way: 4 packets a message at path MTU 1024 (FIRST, 2 MIDDLE, LAST), 1 at 4096; + ACKs.
roce=$(tcpdump -n -r "$pcap" 'udp dst port 4791' 2>/dev/null | wc -l)
full=$(tcpdump -n -r "$pcap" "udp dst port 4791 and greater $pmtu" 2>/dev/null | wc -l)
want=$(( 200 * 4096 / pmtu ))
echo "capture on br0: $roce RoCEv2 packets, $full of them carrying a full $pmtu-byte payload"
check "br0 capture: >= $want full-MTU RoCEv2 packets" [ "$full" -ge "$want" ]
echo "ibv_rc_pingpong: $((SECONDS - t2)) s"

# --- ib_write_bw: RC RDMA WRITE, RoCEv2 GID index 1
t3=$SECONDS
srv=$(peer_spawn 1 "ib_write_bw -d rxe0 -x 1 -F -n 100 -s 65536 -m $pmtu")
peer_wait_listen 1 18515 || echo "warning: server not listening yet"
cli_out=$(peer_run 2 "ib_write_bw -d rxe0 -x 1 -F -n 100 -s 65536 -m $pmtu 10.77.0.2" 2>&1); cli_rc=$?
srv_out=$(peer_wait 1 "$srv" 2>&1); srv_rc=$?
echo "--- ib_write_bw client:"; echo "$cli_out"; echo "--- server:"; echo "$srv_out"
check "ib_write_bw client exit 0" [ "$cli_rc" = 0 ]
check "ib_write_bw server exit 0" [ "$srv_rc" = 0 ]
check "ib_write_bw reports 100 x 65536 with a bandwidth" has "$cli_out" '^ *65536 +100 +[0-9.]+ +[0-9.]*[1-9][0-9.]* '
check "ib_write_bw used RoCE (GID ::ffff:10.77.0.x)" has "$cli_out" 'GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:03'
echo "ib_write_bw: $((SECONDS - t3)) s"

# --- a plain UDP datagram from the host side (10.77.0.1) reaches guest 1's port 4791: tcpdump in the
# guest sees it; rxe drops it (no valid BTH/ICRC), so rcvd_pkts does not count it.
before=$(peer_counter 1 rcvd_pkts)
dump=$(PEER_JOB_TIMEOUT=40 peer_spawn 1 'tcpdump -n -l -i eth0 -c 1 "udp dst port 4791 and src host 10.77.0.1" 2>&1')
for ((k = 0; k < 60; k++)); do  # until tcpdump listens, then one datagram
  [[ $(peer_job_output 1 "$dump") == *"listening on"* ]] && break
  sleep 0.25
done
peer_host python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.77.0.1", 0))
s.sendto(b"melondma-peer-probe", ("10.77.0.2", 4791))'
dump_out=$(peer_wait 1 "$dump" 2>&1)
after=$(peer_counter 1 rcvd_pkts)
echo "--- tcpdump in guest 1:"; echo "$dump_out"; echo "rcvd_pkts before $before after $after"
check "guest 1 saw UDP 10.77.0.1 -> 10.77.0.2.4791" has "$dump_out" 'IP 10\.77\.0\.1\.[0-9]+ > 10\.77\.0\.2\.4791: UDP, length 19'
check "rxe did not count the non-RoCE datagram" [ "$before" = "$after" ]

# --- and the other way: a guest's datagram reaches a socket bound to 10.77.0.1:4791 in the namespace,
# where our soft provider will listen.
got=$PEER_RUN/host-udp.txt
peer_host python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.77.0.1", 4791))
open(sys.argv[1] + ".bound", "w").close()
s.settimeout(30)
data, addr = s.recvfrom(2048)
open(sys.argv[1], "w").write("%s %s\n" % (addr[0], data.decode().strip()))' "$got" & listener=$!
for ((k = 0; k < 40; k++)); do [ -f "$got.bound" ] && break; sleep 0.1; done
peer_run 2 'for i in 1 2 3; do echo melondma-guest-probe | nc -u -w1 10.77.0.1 4791; done' >/dev/null 2>&1
wait "$listener"
echo "host socket got: $(cat "$got" 2>/dev/null)"
check "host 10.77.0.1:4791 got the datagram from guest 2" grep -qx '10.77.0.3 melondma-guest-probe' "$got"

peer_down
echo "selftest: $((SECONDS - t0)) s in all, $failures failure(s)"
[ "$failures" -eq 0 ] && exit 0
exit 1
