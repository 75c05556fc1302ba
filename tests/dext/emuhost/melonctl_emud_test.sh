#!/usr/bin/env bash
# melonctl emud start/status/stop on a private socket: start serves, a second start exits 3 with the
# daemon's reason, stop ends it and removes the socket, status then says nothing serves.
# usage: melonctl_emud_test.sh <melonctl> <build dir>
set -u
ctl=$1 build=$2
dir=$(mktemp -d /tmp/melonctl-emud-XXXXXX)
sock=$dir/mlx5_0.sock
trap '"$ctl" emud stop --socket "$sock" >/dev/null 2>&1; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

wire=127.0.8.2  # its own loopback address: tests run in parallel
out=$("$ctl" emud start --socket "$sock" --wire $wire --build "$build") || fail "start: $out"
[[ $out == "melon-emud "*" serves $sock" ]] || fail "start said: $out"
[ -S "$sock" ] || fail "no socket after start"
"$ctl" emud status --socket "$sock" >/dev/null || fail "status after start"
out=$("$ctl" emud start --socket "$sock" --wire $wire --build "$build"); rc=$?
[ "$rc" = 3 ] || fail "second start exited $rc, want 3"
[[ $out == *"another melon-emud already serves $sock"* ]] || fail "second start said: $out"
out=$("$ctl" emud stop --socket "$sock") || fail "stop: $out"
[ ! -e "$sock" ] || fail "socket left after stop"
"$ctl" emud status --socket "$sock" >/dev/null; rc=$?
[ "$rc" = 3 ] || fail "status after stop exited $rc, want 3"
"$ctl" emud stop --socket "$sock" >/dev/null; rc=$?
[ "$rc" = 1 ] || fail "stop of nothing exited $rc, want 1"
echo "melonctl emud: start, refuse, status, stop: ok"
