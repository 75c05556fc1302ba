#!/bin/bash
# ctest oracle_vfio_faults: faults injected through the interposer into the emulated function while
# rdma-core's mlx5_vfio drives it, and what that driver does (docs/core.md "Fault injection against
# rdma-core's driver" has the table beside our core's behaviour). Pins rdma-core v44's behaviour:
# if a later libmlx5 changes it, this test says so.
prog=$1 run=$2
if [ -z "$prog" ] || [ ! -x "$prog" ]; then
  echo "SKIP: vfio_stock_bringup was not built (needs libibverbs-dev and linux-headers)"
  exit 77
fi
dev=0000:6d:00.0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail=0
expect() {  # name, wanted exit status, grep pattern that must appear, command...
  local name=$1 want=$2 pat=$3
  shift 3
  "$@" > "$log" 2>&1
  local rc=$?
  if [ "$rc" = "$want" ] && grep -q -- "$pat" "$log"; then
    echo "ok   $name (exit $rc)"
  else
    echo "FAIL $name: exit $rc (want $want), pattern '$pat':"
    sed 's/^/    /' "$log" | tail -15
    fail=1
  fi
}
# A bad status with a syndrome on ALLOC_PD: the driver logs it, ibv_alloc_pd fails with the errno
# of the status (BAD_PARAM -> EINVAL), the next one works.
expect "bad status + syndrome" 0 "refused, errno 22" \
  "$run" --faults bad_status=800:3:1234 -- "$prog" $dev --pd-refused
# The health counter stops: the driver's health poll (inside mlx5dv_vfio_process_events, once a
# second) misses it 3 times and abort()s the whole process (SIGABRT: 134).
expect "health counter stalls" 134 "ALLOC_PD ok" \
  timeout -s KILL 15 "$run" --faults health_stall@300 -- "$prog" $dev --events 8
# Commands taken and never completed after bring-up: with its command EQ the driver waits in
# poll(-1) on the completion eventfd, with no timeout: ALLOC_PD never returns (killed here: 124).
expect "command timeout" 124 "fault injected: cmd_timeout" \
  timeout 3 "$run" --faults cmd_timeout@300 -- "$prog" $dev --events 8
# Fatal firmware syndrome (HW_FATAL 0x8; commands no longer complete): the same wait, forever; the
# health poll that would see the syndrome/counter runs only from process_events, which the thread
# blocked in the command never reaches.
expect "fatal syndrome" 124 "fault injected: fatal=8" \
  timeout 3 "$run" --faults fatal=8@300 -- "$prog" $dev --events 8
[ $fail = 0 ] && echo "oracle_vfio_faults: PASS"
exit $fail
