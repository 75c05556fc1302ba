# shellcheck shell=bash
# Steps that change who drives the card: install, activation, the takeover race, readiness, the
# stuck-swap cure, and the refusals that guard them. Sourced after lib.sh and probes.sh.

# --- refusals ------------------------------------------------------------------------------------

# Tearing the driver down under a client frees queues and memory the NIC may still DMA into, and
# the client's next doorbell hits a dead mapping: refuse while any client holds QPs or MRs.
refuse_if_clients_hold() {  # refuse_if_clients_hold <what we would do>
  local holders n
  holders=$(clients_holding)
  [ -n "$holders" ] || return 0
  n=$(printf '%s\n' "$holders" | wc -l | tr -d ' ')
  printf '%s\n' "$holders" | awk '{ printf "  pid %s %s: %s QPs, %s MRs\n", $1, $2, $3, $4 }' >&2
  die "$EX_BUSY" "refusing to $1: $n client(s) hold QPs or MRs; stop them first"
}

# The race kills Apple's dext and counts on it being relaunched; without these the kill simply
# leaves the card owner-less after a few rounds, or the daily crash budget ends the race early.
require_dev_boot_args() {
  local a
  for a in dextrelaunch=1 daily_max_dext_crashes=1000; do
    case " $(boot_args) " in *" $a "*) ;; *)
      die "$EX_POSTURE" "missing boot-arg $a (development Macs: sudo nvram boot-args=\"dextrelaunch=1 daily_max_dext_crashes=1000\", then reboot)"
      ;;
    esac
  done
}

# Without our personality in the catalogue no rematch can choose us; killing Apple's driver would
# only orphan the card.
require_persona() {
  local n
  n=$(persona_count)
  [ "$n" -ge 2 ] && return 0
  die "$EX_REBOOT" "our personality is not in the kernel's catalogue (IODEXTMatchCount=$n); a fresh activation gets there at boot: reboot, then run: scripts/macos/dev takeover"
}

# The kernel rejects com.apple.developer.* entitlements of an ad-hoc signature (IOServiceOpen then
# fails with 0xe00002e2), so a build signed by anyone but our team is refused before install.
verify_signature() {  # verify_signature <bundle>
  local info team
  codesign --verify --deep --strict "$1" >/dev/null 2>&1 ||
    die "$EX_POSTURE" "signature of $1 does not verify (codesign --verify --deep --strict)"
  info=$(codesign -dv "$1" 2>&1 || true)
  team=$(printf '%s\n' "$info" | sed -n 's/^TeamIdentifier=//p' | head -n 1)
  case $team in
    "$MLX_TEAM_ID") return 0 ;;
    '' | 'not set') die "$EX_POSTURE" "$1 is ad-hoc signed; DriverKit entitlements need a team signature (SIGN_ID)" ;;
    *) die "$EX_POSTURE" "$1 is signed by team $team, not MLX_TEAM_ID=$MLX_TEAM_ID" ;;
  esac
}

# --- installation and activation -----------------------------------------------------------------

install_app() {
  [ -d "$MLX_BUILD_APP" ] || die "$EX_FAIL" "no built app at $MLX_BUILD_APP (cmake --build --preset macos)"
  # cp -R onto an existing bundle nests the new one inside the old; remove first.
  act sudo rm -rf "$MLX_APP"
  act sudo cp -R "$MLX_BUILD_APP" "$MLX_APP"
}

# run_loader activate|deactivate: the loader prints RESULT: completed | willCompleteAfterReboot |
# failed <why>, after the user approved (it waits in its run loop meanwhile, so its lines are shown
# as they come: NEEDS APPROVAL tells the user where to click). Sets LOADER_RESULT.
run_loader() {
  local line
  LOADER_RESULT=
  if [ "$DRY_RUN" = 1 ]; then
    act "$MLX_LOADER" "$1"
    LOADER_RESULT=completed
    return 0
  fi
  [ -x "$MLX_LOADER" ] || die "$EX_FAIL" "no loader at $MLX_LOADER (scripts/macos/dev release installs it)"
  note "run: $(quote_cmd "$MLX_LOADER" "$1")"
  while IFS= read -r line; do
    printf '  loader: %s\n' "$line"
    case $line in "RESULT: "*) LOADER_RESULT=${line#RESULT: } ;; esac
  done < <("$MLX_LOADER" "$1" 2>&1)
  [ -n "$LOADER_RESULT" ] || LOADER_RESULT="failed (the loader printed no RESULT line)"
}

activate() {
  run_loader activate
  case $LOADER_RESULT in
    completed) ;;
    willCompleteAfterReboot)
      die "$EX_REBOOT" "activation completes only after a reboot (the old driver process outlived the kill); reboot, then run: scripts/macos/dev takeover"
      ;;
    *) die "$EX_FAIL" "activation failed: $LOADER_RESULT" ;;
  esac
}

# Replacing a live dext yields willCompleteAfterReboot; with the old process gone REPLACE
# completes at once and a rematch picks the new binary.
stop_our_dext() {
  local pid
  pid=$(our_dext_pid)
  [ -n "$pid" ] || return 0
  act sudo kill -9 "$pid"
  pause 2
}

# sysextd may respawn the old dext between the kill and the activation; it then holds the card
# and starves the new binary although REPLACE completed. Stop it until the new version runs.
finish_stale_dext() {
  local want pid running try
  want=$(bundle_version "$(embedded_dext "$MLX_APP")")
  [ -n "$want" ] || return 0
  for try in 1 2 3; do
    pid=$(our_dext_pid)
    [ -n "$pid" ] || return 0
    running=$(running_dext_version "$pid")
    if [ -z "$running" ] || [ "$running" = "$want" ]; then return 0; fi
    note "old driver $running still runs as pid $pid (want $want), stop $try of 3"
    act sudo kill -9 "$pid"
    pause 2
  done
  [ "$DRY_RUN" = 1 ] && return 0
  pid=$(our_dext_pid)
  [ -z "$pid" ] || [ "$(running_dext_version "$pid")" = "$want" ] ||
    die "$EX_FAIL" "the old driver keeps coming back (pid $pid) after 3 stops; run scripts/macos/dev doctor"
}

# --- the takeover race ---------------------------------------------------------------------------

# Apple's AppleEthernetMLX5 binds the card at boot. Killing its live process makes the kernel
# rematch the function (dextrelaunch=1), and with our personality in the catalogue either driver
# may win. Race a bounded number of rounds; kill only a live process, since killing a dead one
# triggers no rematch. An owner-less card that reads 0xffff is orphaned: stop at once.
takeover_race() {
  local round=1 owner pid
  while [ "$round" -le "$MLX_MAX_ROUNDS" ]; do
    owner=$(card_owner)
    note "round $round of $MLX_MAX_ROUNDS: owner $owner"
    case $owner in
      ours) return 0 ;;
      absent) die "$EX_FAIL" "no $MLX_PCI_NODE in the I/O Registry: is the card connected and powered? (system_profiler SPPCIDataType)" ;;
      apple)
        pid=$(apple_dext_pid)
        if [ -n "$pid" ]; then
          act sudo kill -9 "$pid"
          [ "$DRY_RUN" = 1 ] && break
          wait_until 15 "the rematch after the kill" settled_after "$pid"
        else
          note "Apple's driver owns the card but no $APPLE_CLASS process runs yet; waiting for it"
          wait_until 15 "Apple's driver process" apple_alive
        fi
        ;;
      none)
        card_orphaned && orphan_exit
        pid=$(our_dext_pid)
        if [ -n "$pid" ]; then
          # Ours runs but owns nothing: a restart cycle. Stop it so the function rematches cleanly.
          note "our driver (pid $pid) runs without the card: restart cycle, stopping it"
          act sudo kill -9 "$pid"
          [ "$DRY_RUN" = 1 ] && break
          pause 12
        else
          wait_until 20 "any driver to take the card" has_owner
        fi
        ;;
    esac
    round=$((round + 1))
  done
  if [ "$DRY_RUN" = 1 ]; then
    note "dry run: a real run repeats this for up to $MLX_MAX_ROUNDS rounds"
    return 0
  fi
  [ "$(card_owner)" = ours ] && return 0
  die "$EX_GAVE_UP" "gave up after $MLX_MAX_ROUNDS rounds (MLX_MAX_ROUNDS): owner $(card_owner); run scripts/macos/dev doctor"
}
settled_after() {  # settled_after <killed pid>: ours, or Apple back with a new process
  local owner pid
  owner=$(card_owner)
  [ "$owner" = ours ] && return 0
  pid=$(apple_dext_pid)
  [ "$owner" = apple ] && [ -n "$pid" ] && [ "$pid" != "$1" ]
}
apple_alive() { [ -n "$(apple_dext_pid)" ]; }
has_owner() { case $(card_owner) in ours | apple) return 0 ;; esac; return 1; }

orphan_exit() {
  die "$EX_POWER_CYCLE" "the card is orphaned: no driver owns it and its config space reads 0xffff. A cold power cycle is needed (shut down, remove the card's or enclosure's power for 10 s, boot); a reboot or re-activation does not restore it. Then run: scripts/macos/dev takeover"
}

# Owning the function is not being usable: Start() still brings the firmware up. Wait for the
# driver to say ready; if it dies meanwhile and the card reads 0xffff, it is orphaned.
wait_ready() {
  local i=0
  [ "$DRY_RUN" = 1 ] && {
    printf 'dry-run: wait up to %ss for MelonState = ready\n' "$MLX_READY_SECONDS"
    return 0
  }
  while [ "$i" -lt $((MLX_READY_SECONDS * 2)) ]; do
    driver_ready && {
      note "MlxPCIDriver owns $MLX_PCI_NODE and is ready"
      return 0
    }
    if [ "$(card_owner)" != ours ] && [ -z "$(our_dext_pid)" ]; then
      card_orphaned && orphan_exit
      die "$EX_FAIL" "our driver exited during Start() and left the card (owner $(card_owner)); see scripts/macos/dev log"
    fi
    sleep 0.5
    i=$((i + 1))
  done
  die "$EX_FAIL" "MlxPCIDriver owns the card but was not ready within ${MLX_READY_SECONDS}s (MelonState=$(driver_state)); see scripts/macos/dev log 100"
}

# --- the stuck swap ------------------------------------------------------------------------------

# A swap stuck in "terminating" or "waiting to upgrade" finishes when the old process exits:
# SIGTERM lets sysextd complete it without a reboot. With no live process the only cure is
# `systemextensionsctl reset` followed at once by a reboot; reset on a running system stops every
# dext from launching until the next boot, so it is never run alone.
RESET_CURE="sudo systemextensionsctl reset, then reboot at once (never reset without the reboot)"
cure_stuck_swap() {
  local pid
  [ -n "$(swap_stuck)" ] || return 0
  note "the extension swap is stuck: $(swap_stuck | head -n 1)"
  pid=$(our_dext_pid)
  [ -n "$pid" ] || die "$EX_REBOOT" "stuck swap with no live driver process to stop; cure: $RESET_CURE"
  act sudo kill -TERM "$pid"
  wait_until 30 "the swap to finish" swap_finished ||
    die "$EX_REBOOT" "the swap is still stuck 30s after stopping pid $pid; cure: $RESET_CURE"
}
swap_finished() { [ -z "$(swap_stuck)" ] && [ -n "$(our_dext_pid)" ] && [ "$(card_owner)" = ours ]; }
