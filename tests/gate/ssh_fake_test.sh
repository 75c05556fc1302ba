#!/usr/bin/env bash
# --peer ssh:// against a fake SSH (tests/gate/fake_ssh on MELON_GATE_SSH): the gate must drive the
# peer only through ssh with the SPARK_*/MAC_* settings (key, port, login, device, GID, control host),
# run the stock tools there as server and as client, and collect the peer's artifacts into the
# report. The "peer" is a soft device on 127.0.0.55 run by the stub on this host; nothing leaves it.
# Usage: ssh_fake_test.sh <melon-gate> <report-dir>
set -u
gate=$1 rep=$2
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$(dirname "$gate")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export GAT_SSH_LOG=$work/ssh.log GAT_PEER_LIB=$build/lib GAT_PEER_CONF=$work/peer.conf
echo "device soft9 127.0.0.55" > "$GAT_PEER_CONF"
: > "$GAT_SSH_LOG"
echo "not a real key" > "$work/id_gat"
rm -rf "$rep"
MELON_GATE_SSH=$here/fake_ssh SPARK_SSH_KEY=$work/id_gat SPARK_CONTROL_HOST=127.0.0.1 MAC_ROCE_IP=127.0.0.56 \
  SPARK_IB_DEV=soft9 SPARK_GID_INDEX=0 PHASE2_MTU=1024 MLX_MAX_ROUNDS=40 \
  "$gate" p0 --quick --provider soft --peer ssh://gat-user@gat-peer.invalid:2222 --report "$rep" > "$work/out" 2>&1
rc=$?
cat "$work/out"
[ $rc = 0 ] || fail "melon-gate exit $rc"
log=$GAT_SSH_LOG
echo "---- $(wc -l < "$log") ssh calls; the first few:"; head -5 "$log"
# Every call: the login and port of the URL, the key of SPARK_SSH_KEY, batch mode.
awk -F'\t' -v k="$work/id_gat" '$1 != "gat-user@gat-peer.invalid" || $2 != k || $3 != 2222 || $4 !~ /BatchMode=yes/ { bad++ }
  END { exit bad > 0 }' "$log" || fail "an ssh call without the login, key, port or BatchMode"
# The tools ran on the peer with its device and GID, as server and as client (to our control address).
grep -qP '\ttimeout \d+ ibv_rc_pingpong -d soft9 -g 0 -p \d+ -s 4096 -n 40 -c -m 1024$' "$log" || fail "no pingpong server on the peer"
grep -qP '\ttimeout \d+ ibv_rc_pingpong -d soft9 -g 0 -p \d+ -s 4096 -n 40 -c -m 1024 127\.0\.0\.56$' "$log" || fail "no pingpong client on the peer towards MAC_ROCE_IP"
grep -qP '\ttimeout \d+ ib_write_bw -d soft9 -x 0 -p \d+ -F ' "$log" || fail "no ib_write_bw on the peer"
grep -qP '\ttimeout \d+ ib_read_bw -d soft9 -x 0 -p \d+ -F .* -o 16 -m 1024 127\.0\.0\.56$' "$log" || fail "no ib_read_bw client (with -o 16) on the peer"
grep -qP "\tss -Hltn 'sport = :\d+'$" "$log" || fail "the peer's listening socket was not checked over ssh"
# Artifacts: the peer's identity, device and counters, before and after, in the report.
for w in before after; do
  f=$rep/peer/$w.txt
  [ -s "$f" ] || fail "no $f"
  for s in '## uname' '## ibv_devinfo' '## counters' '## neighbour'; do grep -qF -- "$s" "$f" || fail "$f lacks '$s'"; done
  grep -qP '^hca_id:\tsoft9$' "$f" || fail "$f: the peer's ibv_devinfo did not run on the peer device"
done
grep -q "^peer: ssh://gat-user@gat-peer.invalid:2222 (ssh gat-user@gat-peer.invalid (soft9, GID 0))" "$rep/metadata.txt" ||
  fail "metadata.txt does not name the peer"
n=$(grep -c $'\tPASS\t' "$rep/gate.txt")
[ "$n" -ge 7 ] && ! grep -q $'\tFAIL\t' "$rep/gate.txt" || fail "gate.txt: $n passing steps, or a failed one"
ls "$rep"/logs/p0-*-ibv_rc_pingpong.log >/dev/null || fail "no tool logs"
grep -q '^## peer (server): ibv_rc_pingpong -d soft9' "$rep"/logs/p0-001-ibv_rc_pingpong.log || fail "the step log lacks the peer's side"
echo "PASS: $(wc -l < "$log") ssh calls, all with the login, key and port; artifacts collected"
