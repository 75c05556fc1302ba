#!/bin/bash
# scripts_test.sh <case>: runs one scripts/macos path on Linux against stubbed macOS commands
# (tests/macos/stub) and asserts its exit code, its messages and the exact commands that change
# the machine (everything run through sudo, the loader app, and the files it writes).
# Each case is one ctest (tests/macos/CMakeLists.txt); `scripts_test.sh --list` names them all.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
failures=0

# --- the world every case starts from: a development Mac, Apple's driver owns the card ----------
setup() {
  local c
  mkdir -p "$T/bin" "$T/world" "$T/home" "$T/tmp" "$T/build/MelonDMA.app/Contents/MacOS" \
    "$T/Applications/MelonDMA.app/Contents/MacOS"
  for c in systemextensionsctl csrutil ioreg log kmutil codesign nvram system_profiler plutil pgrep ps \
    sudo id sleep; do
    ln -s "$top/tests/macos/stub" "$T/bin/$c"
  done
  ln -s "$top/tests/macos/stub" "$T/Applications/MelonDMA.app/Contents/MacOS/MelonDMA"
  export PATH="$T/bin:$PATH" STUB_DIR=$T STUB_TOP=$top HOME=$T/home TMPDIR=$T/tmp
  export MLX_APP=$T/Applications/MelonDMA.app MLX_BUILD_APP=$T/build/MelonDMA.app MLX_TEAM_ID=ABCDE12345
  export MLX_PCI_NODE=ethernet@0 MLX_MAX_ROUNDS=12 MLX_READY_SECONDS=2 MLX_PERSONA_SECONDS=2
  unset SIGN_ID MLX_DEXT_ID MLX_LOCK_OWNER MLX_STATE_DIR MLX_LOCK_DIR 2>/dev/null
  world owner apple
  world persona 2
  world rematch 3
  world apple_pid 4242
  world after_apple_kill ours
  world sysext "$(printf '*\t*\tABCDE12345\torg.melondma.rdma.dext (0.2/2)\tMlxRDMA\t[activated enabled]')"
  world bootargs "dextrelaunch=1 daily_max_dext_crashes=1000"
  world sip disabled
  world devmode on
  world pci "$(printf 'Ethernet controller:\n  Vendor ID: 0x15b3\n  Device ID: 0x1015')"
  world team ABCDE12345
  world uid 501
  world loader_out "$(printf 'REQUEST: activate org.melondma.rdma.dext\nRESULT: completed')"
}
world() { printf '%s\n' "$2" >"$T/world/$1"; }

# MELON_TEST_BASH runs the scripts under another bash, e.g. a 3.2 built from source to stand in
# for macOS's /bin/bash (docs/macos.md); by default their #! line chooses.
run() {  # run <script> <args...>: stdout, stderr and exit code of one script run
  : >"$T/calls"
  ${MELON_TEST_BASH:+"$MELON_TEST_BASH"} "$top/scripts/macos/$1" "${@:2}" >"$T/out" 2>"$T/err"
  rc=$?
}

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
expect_rc() { [ "$rc" -eq "$1" ] || fail "exit code $rc, expected $1"; }
expect_out() { grep -q -F -x -- "$1" "$T/out" || fail "stdout lacks line: $1"; }
expect_err() { grep -q -F -x -- "$1" "$T/err" || fail "stderr lacks line: $1"; }
# The commands that change the machine, in order: sudo, the loader app; nothing else does.
actions() { grep -E "^(sudo|MelonDMA) " "$T/calls" | sed "s|$T|\$T|g" || true; }
expect_actions() {  # expect_actions <<EOF ... one command per line ... EOF
  local want got
  want=$(cat)
  got=$(actions)
  [ "$got" = "$want" ] || fail "actions differ:$(printf '\n--- expected\n%s\n--- got\n%s' "$want" "$got")"
}
expect_no_actions() { expect_actions </dev/null; }
expect_call() { grep -q -F -x -- "$1" "$T/calls" || fail "no call: $1"; }
dry_lines() { grep '^dry-run: ' "$T/out" | sed "s|$T|\$T|g"; }
expect_dry() {
  local want got
  want=$(cat)
  got=$(dry_lines)
  [ "$got" = "$want" ] || fail "dry-run lines differ:$(printf '\n--- expected\n%s\n--- got\n%s' "$want" "$got")"
}

ORPHAN='dev: the card is orphaned: no driver owns it and its config space reads 0xffff. A cold power cycle is needed (shut down, remove the card'"'"'s or enclosure'"'"'s power for 10 s, boot); a reboot or re-activation does not restore it. Then run: scripts/macos/dev takeover'

# --- dev ------------------------------------------------------------------------------------------
case_dev_usage() {
  run dev
  expect_rc 2
  expect_err "usage: dev [--dry-run] <command>"
  run dev frobnicate
  expect_rc 2
  expect_err "dev: unknown command frobnicate (dev --help)"
  run dev log many
  expect_rc 2
  expect_err "dev: log takes a line count and --follow, not 'many'"
  MLX_MAX_ROUNDS=twelve run dev takeover
  expect_rc 2
  expect_err "dev: MLX_MAX_ROUNDS must be a positive whole number"
  MLX_READY_SECONDS=0 run hot-update
  expect_rc 2
  expect_err "hot-update: MLX_READY_SECONDS must be a positive whole number"
  expect_no_actions
}

case_dev_takeover_kills_apple_then_wins() {
  world after_apple_kill "apple ours"
  world state ready
  run dev takeover
  expect_rc 0
  expect_actions <<'EOF'
sudo kill -9 4242
sudo kill -9 4243
EOF
  expect_out "dev: round 1 of 12: owner apple"
  expect_out "dev: round 3 of 12: owner ours"
  expect_out "dev: MlxPCIDriver owns ethernet@0 and is ready"
}

case_dev_takeover_gives_up_after_max_rounds() {
  world after_apple_kill "apple apple apple apple"
  export MLX_MAX_ROUNDS=3
  run dev takeover
  expect_rc 7
  expect_actions <<'EOF'
sudo kill -9 4242
sudo kill -9 4243
sudo kill -9 4244
EOF
  expect_err "dev: gave up after 3 rounds (MLX_MAX_ROUNDS): owner apple; run scripts/macos/dev doctor"
}

case_dev_takeover_refuses_without_dev_boot_args() {
  world bootargs "-v"
  run dev takeover
  expect_rc 3
  expect_err 'dev: missing boot-arg dextrelaunch=1 (development Macs: sudo nvram boot-args="dextrelaunch=1 daily_max_dext_crashes=1000", then reboot)'
  expect_no_actions
  world bootargs ""
  run dev takeover
  expect_rc 3
  expect_no_actions
}

case_dev_takeover_refuses_without_persona() {
  world persona 1
  run dev takeover
  expect_rc 6
  expect_err "dev: our personality is not in the kernel's catalogue (IODEXTMatchCount=1); a fresh activation gets there at boot: reboot, then run: scripts/macos/dev takeover"
  expect_no_actions
}

case_dev_takeover_orphaned_card_needs_power_cycle() {
  world owner none
  world apple_pid ""
  world logtext "2026-11-30 10:00:01.000 Df MlxRDMA[812:1f0] MlxPCIDriver: config space reads 0xffff"
  run dev takeover
  expect_rc 5
  expect_err "$ORPHAN"
  expect_no_actions
  # The other evidence: the PCI listing shows the function's vendor as all-ones.
  world logtext ""
  world pci "$(printf 'Ethernet controller:\n  Vendor ID: 0xffff\n  Device ID: 0xffff')"
  run dev takeover
  expect_rc 5
  expect_no_actions
}

case_dev_takeover_stops_our_restart_cycle() {
  world owner none
  world apple_pid ""
  world our_pid 6100
  world owner_after_our_kill ours
  world our_pid_after_kill 6101
  world state ready
  run dev takeover
  expect_rc 0
  expect_actions <<'EOF'
sudo kill -9 6100
EOF
  expect_out "dev: our driver (pid 6100) runs without the card: restart cycle, stopping it"
}

case_dev_takeover_driver_dies_in_start_orphans_card() {
  world after_apple_kill "none"
  world logtext "MlxPCIDriver: config space reads 0xffff"
  run dev takeover
  expect_rc 5
  expect_actions <<'EOF'
sudo kill -9 4242
EOF
  expect_err "$ORPHAN"
}

case_dev_takeover_not_ready_in_time() {
  world owner ours
  world our_pid 7000
  world state starting
  run dev takeover
  expect_rc 1
  expect_err "dev: MlxPCIDriver owns the card but was not ready within 2s (MelonState=starting); see scripts/macos/dev log 100"
}

case_dev_takeover_dry_run() {
  run dev --dry-run takeover
  expect_rc 0
  expect_no_actions
  expect_dry <<'EOF'
dry-run: sudo kill -9 4242
dry-run: wait up to 2s for MelonState = ready
EOF
  expect_out "dev: dry run: a real run repeats this for up to 12 rounds"
}

case_dev_deactivate_refuses_while_clients_hold_objects() {
  world owner ours
  world our_pid 7000
  world clients "$(
    cat <<'EOF'
+-o MlxUserClient  <class IOUserUserClient, id 0x100000d00, !registered, !matched, active>
    {
      "IOUserClass" = "MlxUserClient"
      "IOUserClientCreator" = "pid 812, ib_write_bw"
      "MelonQPCount" = 2
      "MelonMRCount" = 1
    }
+-o MlxUserClient  <class IOUserUserClient, id 0x100000d01, !registered, !matched, active>
    {
      "IOUserClass" = "MlxUserClient"
      "IOUserClientCreator" = "pid 900, idle_tool"
      "MelonQPCount" = 0
      "MelonMRCount" = 0
    }
+-o SomeoneElsesClient  <class IOUserUserClient, id 0x100000e00, !registered, !matched, active>
    {
      "IOUserClass" = "OtherUserClient"
      "IOUserClientCreator" = "pid 950, other"
    }
EOF
  )"
  run dev deactivate
  expect_rc 4
  expect_err "  pid 812 ib_write_bw: 2 QPs, 1 MRs"
  expect_err "dev: refusing to deactivate the driver: 1 client(s) hold QPs or MRs; stop them first"
  expect_no_actions
  grep -q 'idle_tool\|other' "$T/err" && fail "a client without objects, or not ours, was named"
  # A client whose counts are not published may hold a QP: refused as well.
  world clients "$(printf '+-o MlxUserClient  <class IOUserUserClient>\n  "IOUserClass" = "MlxUserClient"\n  "IOUserClientCreator" = "pid 77, mystery"\n')"
  run dev deactivate
  expect_rc 4
  expect_err "  pid 77 mystery: ? QPs, ? MRs"
  expect_no_actions
}

case_dev_deactivate_returns_card_to_apple() {
  world owner ours
  world our_pid 7000
  world loader_out "$(printf 'REQUEST: deactivate org.melondma.rdma.dext\nRESULT: completed')"
  world loader_sets_owner apple
  run dev deactivate
  expect_rc 0
  expect_actions <<'EOF'
MelonDMA deactivate
EOF
  expect_out "dev: the card is back with AppleEthernetMLX5"
}

case_dev_deactivate_dry_run() {
  world owner ours
  world our_pid 7000
  run dev deactivate --dry-run
  expect_rc 0
  expect_no_actions
  expect_dry <<'EOF'
dry-run: $T/Applications/MelonDMA.app/Contents/MacOS/MelonDMA deactivate
dry-run: wait up to 20s for AppleEthernetMLX5 to take the card
EOF
  grep -q 'the card is back' "$T/out" && fail "a dry run claimed the card moved"
}

case_dev_deactivate_after_reboot() {
  world owner ours
  world loader_out "$(printf 'REQUEST: deactivate org.melondma.rdma.dext\nRESULT: willCompleteAfterReboot')"
  run dev deactivate
  expect_rc 6
  expect_err "dev: deactivation completes at the next reboot; Apple's driver takes the card then"
  world owner apple
  run dev deactivate
  expect_rc 0
  expect_out "dev: AppleEthernetMLX5 already owns the card"
  expect_no_actions
}

case_dev_release_full_path() {
  world our_pid 6100
  world our_pid_after_kill ""
  world state ready
  run dev release
  expect_rc 0
  expect_actions <<'EOF'
sudo rm -rf $T/Applications/MelonDMA.app
sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
sudo kill -9 6100
MelonDMA activate
sudo kill -9 4242
EOF
  expect_out "  loader: RESULT: completed"
}

case_dev_release_finishes_respawned_old_driver() {
  local plist
  plist=$T/Applications/MelonDMA.app/Contents/Library/SystemExtensions/org.melondma.rdma.dext.dext/Info.plist
  mkdir -p "$(dirname "$plist")"
  : >"$plist"
  world "version_$(echo "$plist" | tr '/' '_')" 0.3
  world our_pid 6100
  world our_pid_after_kill 6200 # sysextd respawns the old binary once
  world ps_6200 "/Library/SystemExtensions/AAAA/org.melondma.rdma.dext.dext/MlxRDMA"
  world version__Library_SystemExtensions_AAAA_org.melondma.rdma.dext.dext_Info.plist 0.2
  world owner_after_our_kill apple
  world state ready
  run dev release
  expect_rc 0
  expect_actions <<'EOF'
sudo rm -rf $T/Applications/MelonDMA.app
sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
sudo kill -9 6100
MelonDMA activate
sudo kill -9 6200
sudo kill -9 4242
EOF
  expect_out "dev: old driver 0.2 still runs as pid 6200 (want 0.3), stop 1 of 3"
  # It keeps coming back: three stops, then a refusal to race with the wrong binary.
  world our_pid 6100
  world our_pid_after_kill "6200 6200 6200 6200"
  run dev release
  expect_rc 1
  expect_err "dev: the old driver keeps coming back (pid 6200) after 3 stops; run scripts/macos/dev doctor"
  expect_actions <<'EOF'
sudo rm -rf $T/Applications/MelonDMA.app
sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
sudo kill -9 6100
MelonDMA activate
sudo kill -9 6200
sudo kill -9 6200
sudo kill -9 6200
EOF
}

case_dev_release_refusals() {
  world team "not set"
  run dev release
  expect_rc 3
  expect_err "dev: $T/build/MelonDMA.app is ad-hoc signed; DriverKit entitlements need a team signature (SIGN_ID)"
  expect_no_actions
  world team ZZZZZ99999
  run dev release
  expect_rc 3
  expect_err "dev: $T/build/MelonDMA.app is signed by team ZZZZZ99999, not MLX_TEAM_ID=ABCDE12345"
  world team ABCDE12345
  world verify bad
  run dev release
  expect_rc 3
  expect_err "dev: signature of $T/build/MelonDMA.app does not verify (codesign --verify --deep --strict)"
  world verify ok
  MLX_TEAM_ID="" run dev release
  expect_rc 3
  expect_err "dev: MLX_TEAM_ID is not set (the 10-character Apple team that signed the build)"
  world uid 0
  run dev release
  expect_rc 3
  expect_err "dev: run as the login user, not root (sudo is used per step)"
  world uid 501
  world sysext "$(printf '*\t*\tABCDE12345\torg.melondma.rdma.dext (0.2/2)\tMlxRDMA\t[terminating for uninstall but still running]')"
  run dev release
  expect_rc 3
  expect_err "dev: the extension swap is stuck; run scripts/macos/hot-update, which cures it first"
  expect_no_actions
  world bootargs "-v"
  run dev release
  expect_rc 3
  expect_err 'dev: missing boot-arg dextrelaunch=1 (development Macs: sudo nvram boot-args="dextrelaunch=1 daily_max_dext_crashes=1000", then reboot)'
  expect_no_actions
}

case_dev_release_fresh_install_needs_reboot() {
  world persona 1
  run dev release
  expect_rc 6
  expect_actions <<'EOF'
sudo rm -rf $T/Applications/MelonDMA.app
sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
MelonDMA activate
EOF
  world persona 2
  world loader_out "$(printf 'NEEDS APPROVAL\nRESULT: failed user did not approve within 300 s')"
  run dev release
  expect_rc 1
  expect_err "dev: activation failed: failed user did not approve within 300 s"
  world loader_out "RESULT: willCompleteAfterReboot"
  run dev release
  expect_rc 6
  world loader_out "Illegal instruction"
  world loader_rc 132
  run dev release
  expect_rc 1
  expect_err "dev: activation failed: failed (the loader printed no RESULT line)"
  expect_out "  loader: Illegal instruction"
}

case_dev_release_dry_run() {
  world our_pid 6100
  run dev release --dry-run
  expect_rc 0
  expect_no_actions
  expect_dry <<'EOF'
dry-run: sudo rm -rf $T/Applications/MelonDMA.app
dry-run: sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
dry-run: sudo kill -9 6100
dry-run: $T/Applications/MelonDMA.app/Contents/MacOS/MelonDMA activate
dry-run: sudo kill -9 4242
dry-run: wait up to 2s for MelonState = ready
EOF
}

case_dev_status_and_log() {
  world owner ours
  world our_pid 7000
  world state ready
  run dev status
  expect_rc 0
  expect_out "card (ethernet@0): owner ours, MelonState ready"
  expect_out "catalogue: IODEXTMatchCount 2, IORematchCount 3"
  expect_out "our driver pid: 7000"
  # status only reads: these probes and nothing else.
  [ "$(sed "s|$T|\$T|g" "$T/calls")" = "$(
    cat <<'EOF'
id -u
ioreg -r -n ethernet@0 -w 0
ioreg -r -n ethernet@0 -l -w 0
ioreg -r -n ethernet@0 -l -w 0
ioreg -r -n ethernet@0 -l -w 0
pgrep -f 'SystemExtensions/.*org.melondma.rdma.dext'
pgrep -f AppleEthernetMLX5
systemextensionsctl list
ioreg -r -c IOUserUserClient -l -w 0
EOF
  )" ] || fail "status ran other commands than its probes"
  world logtext "$(printf 'line1\nline2\nline3')"
  run dev log 2
  expect_rc 0
  expect_call "log show --last 10m --style compact --predicate 'process == \"MlxRDMA\" OR (process == \"kernel\" AND eventMessage CONTAINS \"Mlx\") OR (process == \"sysextd\" AND eventMessage CONTAINS \"org.melondma.rdma.dext\")'"
  [ "$(cat "$T/out")" = "$(printf 'line2\nline3')" ] || fail "log did not print the last 2 lines"
  run dev log --follow
  expect_call "log stream --style compact --predicate 'process == \"MlxRDMA\" OR (process == \"kernel\" AND eventMessage CONTAINS \"Mlx\") OR (process == \"sysextd\" AND eventMessage CONTAINS \"org.melondma.rdma.dext\")'"
}

case_dev_report_gathers_bug_report() {
  local tgz
  world owner ours
  world state ready
  world logtext "MlxPCIDriver: started"
  mkdir "$T/rep"
  run dev report "$T/rep"
  expect_rc 0
  expect_no_actions
  expect_call "kmutil showloaded"
  expect_call "system_profiler SPPCIDataType SPThunderboltDataType SPSoftwareDataType"
  expect_call "ioreg -r -c IOUserUserClient -l -w 0"
  tgz=$(ls "$T"/rep/melondma-report-*.tgz 2>/dev/null)
  [ -n "$tgz" ] || fail "no report tarball"
  [ "$(tar -tzf "$tgz" | sed 's|^[^/]*/||' | grep . | sort | tr '\n' ' ')" = \
    "doctor.txt hardware.txt ioreg-card.txt ioreg-clients.txt kexts.txt log.txt security.txt sysext.txt versions.txt " ] ||
    fail "report holds $(tar -tzf "$tgz" | tr '\n' ' ')"
  grep -q -F "  healthy: MlxPCIDriver owns the card and is ready" "$T"/rep/melondma-report-*/doctor.txt || fail "doctor.txt"
  grep -q -x -F "doctor exit code: 0" "$T"/rep/melondma-report-*/doctor.txt || fail "doctor.txt lacks the exit code"
  grep -q -F "System Integrity Protection status: disabled." "$T"/rep/melondma-report-*/security.txt || fail "security.txt"
  run dev --dry-run report "$T/rep"
  expect_rc 0
  grep -q "^dry-run: kmutil showloaded > kexts.txt$" "$T/out" || fail "dry run does not list kmutil"
  grep -q "^dry-run: tar -czf $T/rep/melondma-report-[0-9TZ]*.tgz -C $T/rep melondma-report-[0-9TZ]*$" "$T/out" ||
    fail "dry run does not list the tarball"
  [ "$(find "$T/rep" -mindepth 1 -maxdepth 1 | wc -l)" -eq 2 ] || fail "the dry run wrote files"
  run dev report "$T/missing"
  expect_rc 2
  expect_err "dev: no directory $T/missing"
}

case_dev_doctor_healthy_or_next_step() {
  world owner ours
  world our_pid 7000
  world state ready
  run dev doctor
  expect_rc 0
  expect_out "  healthy: MlxPCIDriver owns the card and is ready"
  world owner apple
  run dev doctor
  expect_rc 1
  expect_out "  owner apple and our personality is in the catalogue: scripts/macos/dev takeover"
  world persona 1
  run dev doctor
  expect_rc 6
  expect_out "  our personality is not in the kernel's catalogue: reboot, then scripts/macos/dev takeover"
  expect_no_actions
}

case_dev_doctor_install_and_stuck_swap() {
  world sysext ""
  run dev doctor
  expect_rc 1
  expect_out "  our extension is not installed: scripts/macos/dev release"
  world sysext "$(printf '*\t*\tABCDE12345\torg.melondma.rdma.dext (0.3/3)\tMlxRDMA\t[activated waiting to upgrade]')"
  world our_pid ""
  run dev doctor
  expect_rc 6
  expect_out "  the extension swap is stuck and no driver process runs; cure: sudo systemextensionsctl reset, then reboot at once (never reset without the reboot)"
  world our_pid 7000
  run dev doctor
  expect_rc 1
  expect_out "  the extension swap is stuck with a live driver process; cure: scripts/macos/hot-update"
  expect_no_actions
}

case_dev_doctor_orphaned_or_absent_card() {
  world sysext ""
  world owner none
  world logtext "MlxPCIDriver: config space reads 0xffff"
  run dev doctor
  expect_rc 5
  expect_out "  the card is orphaned (owner-less, config space reads 0xffff): cold power cycle, then scripts/macos/dev takeover"
  world owner absent
  world pci ""
  run dev doctor
  expect_rc 1
  expect_out "  no ConnectX (vendor 0x15b3) on the PCI bus: check the card, enclosure and cable"
  expect_no_actions
}

case_dev_lock_refuses_parallel_run() {
  mkdir -p "$T/tmp/melondma-macos-501.lock"
  echo $$ >"$T/tmp/melondma-macos-501.lock/pid"
  run dev takeover
  expect_rc 4
  expect_err "dev: another operator script (pid $$) is changing the driver; wait for it"
  expect_no_actions
  # A lock left by a dead process is taken over.
  echo 999999 >"$T/tmp/melondma-macos-501.lock/pid"
  world state ready
  run dev takeover
  expect_rc 0
  [ ! -e "$T/tmp/melondma-macos-501.lock" ] || fail "lock not released"
}

# --- hot-update -----------------------------------------------------------------------------------
case_hot_update_cures_stuck_swap_then_releases() {
  world owner ours
  world our_pid 7000
  world state ready
  world sysext "$(printf '*\t*\tABCDE12345\torg.melondma.rdma.dext (0.3/3)\tMlxRDMA\t[activated waiting to upgrade]')"
  world sysext_after_term "$(printf '*\t*\tABCDE12345\torg.melondma.rdma.dext (0.3/3)\tMlxRDMA\t[activated enabled]')"
  world owner_after_term ours
  world our_pid_after_kill 7001
  world after_apple_kill ours
  run hot-update
  expect_rc 0
  expect_actions <<'EOF'
sudo kill -TERM 7000
sudo rm -rf $T/Applications/MelonDMA.app
sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
sudo kill -9 7001
MelonDMA activate
EOF
  expect_out "hot-update: the extension swap is stuck: $(printf '*\t*\tABCDE12345\torg.melondma.rdma.dext (0.3/3)\tMlxRDMA\t[activated waiting to upgrade]')"
  expect_out "hot-update: HOT_UPDATE PASS: MlxPCIDriver owns ethernet@0, no swap pending"
}

case_hot_update_refusals() {
  run hot-update
  expect_rc 3
  expect_err "hot-update: a hot update replaces a running driver, but the card's owner is apple; first install: scripts/macos/cold-takeover prepare, then resume after the reboot"
  expect_no_actions
  world owner ours
  world uid 0
  run hot-update
  expect_rc 3
  expect_err "hot-update: run as the login user, not root (sudo is used per step)"
  world uid 501
  world sysext "$(printf '*\t*\tABCDE12345\torg.melondma.rdma.dext (0.3/3)\tMlxRDMA\t[terminating for uninstall but still running]')"
  world our_pid 7000
  world clients "$(printf '+-o MlxUserClient\n  "IOUserClass" = "MlxUserClient"\n  "IOUserClientCreator" = "pid 5, perf"\n  "MelonQPCount" = 0\n  "MelonMRCount" = 3\n')"
  run hot-update
  expect_rc 4
  expect_err "hot-update: refusing to update the driver: 1 client(s) hold QPs or MRs; stop them first"
  expect_no_actions
  world clients ""
  world our_pid ""
  run hot-update
  expect_rc 6
  expect_err "hot-update: stuck swap with no live driver process to stop; cure: sudo systemextensionsctl reset, then reboot at once (never reset without the reboot)"
  expect_no_actions
}

case_hot_update_check() {
  world owner ours
  world our_pid 7000
  run hot-update --check
  expect_rc 0
  expect_out "hot-update: HOT_UPDATE_CHECK PASS: pid 7000 owns ethernet@0"
  world our_pid ""
  run hot-update --check
  expect_rc 1
  expect_err "hot-update: no live MlxRDMA process"
  expect_no_actions
}

case_hot_update_dry_run() {
  world owner ours
  world our_pid 7000
  world state ready
  run hot-update --dry-run
  expect_rc 0
  expect_no_actions
  expect_dry <<'EOF'
dry-run: sudo rm -rf $T/Applications/MelonDMA.app
dry-run: sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
dry-run: sudo kill -9 7000
dry-run: $T/Applications/MelonDMA.app/Contents/MacOS/MelonDMA activate
dry-run: wait up to 2s for MelonState = ready
EOF
}

# --- preflight ------------------------------------------------------------------------------------
production_mac() {
  world sip enabled
  world bootargs ""
  world devmode off
  world entitlements_MelonDMA.app "<plist><dict><key>com.apple.developer.system-extension.install</key><true/><key>com.apple.developer.driverkit.userclient-access</key><array><string>org.melondma.rdma.dext</string></array></dict></plist>"
  world entitlements_org.melondma.rdma.dext.dext "<plist><dict><key>com.apple.developer.driverkit</key><true/><key>com.apple.developer.driverkit.transport.pci</key><array/></dict></plist>"
  export SIGN_ID="Developer ID Application: Example Org (ABCDE12345)"
}

case_preflight_passes_production_mac() {
  production_mac
  run preflight
  expect_rc 0
  expect_out "PREFLIGHT PASS"
  expect_call "codesign --verify --deep --strict $T/build/MelonDMA.app"
  expect_call "codesign -d --entitlements - --xml $T/build/MelonDMA.app/Contents/Library/SystemExtensions/org.melondma.rdma.dext.dext"
  expect_no_actions
}

case_preflight_refuses_sip_off() {
  production_mac
  world sip disabled
  run preflight
  expect_rc 3
  expect_err "FAIL: System Integrity Protection is not enabled"
  expect_err "preflight: not production-ready: 1 check(s) failed"
}

case_preflight_refuses_dev_boot_args() {
  production_mac
  world bootargs "-v dextrelaunch=1 amfi_get_out_of_my_way=0x1"
  run preflight
  expect_rc 3
  expect_err "FAIL: development boot-arg dextrelaunch is set"
  expect_err "FAIL: development boot-arg amfi_get_out_of_my_way is set"
  expect_err "preflight: not production-ready: 2 check(s) failed"
}

case_preflight_refuses_sysext_developer_mode() {
  production_mac
  world devmode on
  run preflight
  expect_rc 3
  expect_err "FAIL: system-extension developer mode is on (systemextensionsctl developer off)"
}

case_preflight_reports_every_failure() {
  production_mac
  world sip disabled
  world bootargs "dextrelaunch=1 daily_max_dext_crashes=1000"
  world devmode on
  world team "not set"
  export SIGN_ID="Apple Development: someone (XYZ)"
  run preflight --dry-run
  expect_rc 3
  expect_err "FAIL: System Integrity Protection is not enabled"
  expect_err "FAIL: development boot-arg dextrelaunch is set"
  expect_err "FAIL: development boot-arg daily_max_dext_crashes is set"
  expect_err "FAIL: system-extension developer mode is on (systemextensionsctl developer off)"
  expect_err "FAIL: SIGN_ID is not a Developer ID Application identity: Apple Development: someone (XYZ)"
  expect_err "FAIL: $T/build/MelonDMA.app is ad-hoc signed"
  expect_err "preflight: not production-ready: 6 check(s) failed"
  expect_no_actions
}

case_preflight_refuses_bad_entitlements() {
  production_mac
  world entitlements_org.melondma.rdma.dext.dext "<plist><dict><key>com.apple.developer.driverkit.allow-any-userclient-access</key><true/></dict></plist>"
  world entitlements_MelonDMA.app "<plist><dict></dict></plist>"
  run preflight
  expect_rc 3
  expect_err "FAIL: the driver has com.apple.developer.driverkit.allow-any-userclient-access (forbidden in production)"
  expect_err "FAIL: the driver lacks com.apple.developer.driverkit.transport.pci"
  expect_err "FAIL: the app lacks com.apple.developer.system-extension.install"
  expect_err "FAIL: the app lacks com.apple.developer.driverkit.userclient-access naming org.melondma.rdma.dext"
  MLX_TEAM_ID="" SIGN_ID="" run preflight
  expect_err "FAIL: SIGN_ID is not set"
  expect_err "FAIL: MLX_TEAM_ID is not set"
}

# --- cold-takeover --------------------------------------------------------------------------------
case_cold_prepare_cleans_and_reboots() {
  run cold-takeover prepare
  expect_rc 0
  expect_actions <<'EOF'
sudo systemextensionsctl uninstall ABCDE12345 org.melondma.rdma.dext
sudo systemextensionsctl reset
sudo rm -rf $T/Applications/MelonDMA.app
sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
sudo shutdown -r now
EOF
  [ -f "$T/home/Library/Application Support/MelonDMA/cold-takeover.pending" ] || fail "no pending mark"
  expect_out "cold-takeover: after the reboot run: scripts/macos/cold-takeover resume"
}

case_cold_prepare_refusals() {
  world sip enabled
  world devmode off
  run cold-takeover prepare
  expect_rc 3
  expect_err "cold-takeover: systemextensionsctl uninstall and reset need SIP off or system-extension developer mode; this is a development path"
  expect_no_actions
  world sip disabled
  world bootargs ""
  run cold-takeover prepare
  expect_rc 3
  expect_err 'cold-takeover: missing boot-arg dextrelaunch=1 (development Macs: sudo nvram boot-args="dextrelaunch=1 daily_max_dext_crashes=1000", then reboot)'
  expect_no_actions
  world bootargs "dextrelaunch=1 daily_max_dext_crashes=1000"
  world owner ours
  world clients "$(printf '+-o MlxUserClient\n  "IOUserClass" = "MlxUserClient"\n  "IOUserClientCreator" = "pid 5, perf"\n  "MelonQPCount" = 1\n  "MelonMRCount" = 0\n')"
  run cold-takeover prepare
  expect_rc 4
  expect_err "cold-takeover: refusing to reset the extensions: 1 client(s) hold QPs or MRs; stop them first"
  expect_no_actions
}

case_cold_prepare_dry_run() {
  run cold-takeover --dry-run prepare
  expect_rc 0
  expect_no_actions
  expect_dry <<'EOF'
dry-run: sudo systemextensionsctl uninstall ABCDE12345 org.melondma.rdma.dext
dry-run: sudo systemextensionsctl reset
dry-run: sudo rm -rf $T/Applications/MelonDMA.app
dry-run: sudo cp -R $T/build/MelonDMA.app $T/Applications/MelonDMA.app
dry-run: mkdir -p '$T/home/Library/Application Support/MelonDMA'
dry-run: touch '$T/home/Library/Application Support/MelonDMA/cold-takeover.pending'
dry-run: sudo shutdown -r now
EOF
  [ ! -e "$T/home/Library/Application Support/MelonDMA" ] || fail "dry run wrote the pending mark"
}

case_cold_resume_activates_and_takes_over() {
  mkdir -p "$T/home/Library/Application Support/MelonDMA"
  : >"$T/home/Library/Application Support/MelonDMA/cold-takeover.pending"
  world after_apple_kill "apple ours"
  world state ready
  run cold-takeover resume
  expect_rc 0
  expect_actions <<'EOF'
MelonDMA activate
sudo kill -9 4242
sudo kill -9 4243
EOF
  [ ! -e "$T/home/Library/Application Support/MelonDMA/cold-takeover.pending" ] || fail "pending mark kept"
}

case_cold_resume_refusals() {
  run cold-takeover resume
  expect_rc 3
  expect_err "cold-takeover: no prepared cold takeover (run: scripts/macos/cold-takeover prepare)"
  expect_no_actions
  mkdir -p "$T/home/Library/Application Support/MelonDMA"
  : >"$T/home/Library/Application Support/MelonDMA/cold-takeover.pending"
  world persona 1
  run cold-takeover resume
  expect_rc 6
  expect_err "cold-takeover: our personality did not reach the kernel's catalogue in 2s (IODEXTMatchCount=1); reboot once more, then run: scripts/macos/cold-takeover resume"
  expect_actions <<'EOF'
MelonDMA activate
EOF
  [ -e "$T/home/Library/Application Support/MelonDMA/cold-takeover.pending" ] || fail "pending mark lost"
}

# --- driver ---------------------------------------------------------------------------------------
cases() { declare -F | awk '{print $3}' | sed -n 's/^case_//p'; }
if [ "${1:-}" = --list ]; then
  cases
  exit 0
fi
declare -F "case_${1:-}" >/dev/null || {
  echo "usage: scripts_test.sh --list | <case>" >&2
  exit 2
}
setup
"case_$1"
if [ "$failures" -ne 0 ]; then
  echo "--- calls"
  sed "s|$T|\$T|g" "$T/calls"
  echo "--- stdout"
  cat "$T/out"
  echo "--- stderr"
  cat "$T/err"
  exit 1
fi
echo "PASS $1"
