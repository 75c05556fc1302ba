# shellcheck shell=bash disable=SC2154  # out, out2: set by the sourcing script
# What stock_tools.sh and mlx5_stock.sh share: output checks and the TCP rendezvous of perftest and
# the pingpongs. Sourced; the caller sets $out (the tool's output), $out2 (a server's output) and
# defines fail(), which each script ends differently (mlx5_stock.sh stops its daemons first).

expect() { grep -qE -- "$1" "$out" || fail "expected /$1/"; }
reject() { ! grep -qE -- "$1" "$out" || fail "unexpected /$1/"; }
need() { command -v "$1" >/dev/null || { echo "SKIP: $1 not installed"; exit 77; }; }
# A TCP port nobody listens on (perftest and the pingpongs exchange QP numbers over TCP).
free_port() {
  local p
  while :; do
    p=$(( 20000 + RANDOM % 20000 ))
    ss -Hltn "sport = :$p" | grep -q . || { echo $p; return; }
  done
}
# Wait (at most 20 s) until a server (pid $2) listens on TCP port $1: the client makes one attempt.
wait_listen() {
  local deadline=$(( SECONDS + 20 ))
  until ss -Hltn "sport = :$1" | grep -q .; do
    [ $SECONDS -lt $deadline ] || fail "no server listening on port $1"
    kill -0 "$2" 2>/dev/null || { cat "$out2" > "$out"; fail "the server exited before listening"; }
    sleep 0.05
  done
}
# No loader trouble: every imported symbol and version must have resolved (BIND_NOW).
loader_clean() {
  reject "symbol lookup error|version .* not found|no version information available|cannot open shared object"
}
# check_figures <tool> <rows>: perftest's result rows make sense: bandwidth tests a positive message
# rate (a receiving server may print peak 0, tiny messages 0.00 MB/s after rounding), latency tests a
# positive minimum no larger than the average. Unless perftest could not calibrate its cycle counter
# (its clock regression fails when the machine preempts it: "r^2 < 0.9", then every figure is 0):
# the run itself still had to succeed, only its figures say nothing.
check_figures() {
  if grep -qF "Correlation coefficient r^2" "$out"; then
    echo "NOTE: perftest could not calibrate its clock on this loaded machine; figures not checked"
    return
  fi
  case $1 in
    *_bw) echo "$2" | awk '{ if ($NF + 0 <= 0) exit 1 }' || fail "zero message rate" ;;
    *_lat) echo "$2" | awk '{ if ($3 + 0 <= 0 || $3 + 0 > $6 + 0) exit 1 }' || fail "bad latency figures" ;;
  esac
}
