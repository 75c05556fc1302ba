# shellcheck shell=bash
# shellcheck disable=SC2034  # the settings here are read by the scripts that source this file
# Read-only probes of the Mac's state: who owns the card, what sysextd thinks, which clients hold
# objects, the security posture. Nothing here changes the machine. Sourced after lib.sh.

# The driver's names: our IOUserClass and Apple's (its registry entry and its dext's process path).
OUR_CLASS=MlxPCIDriver
OUR_CLIENT_CLASS=MlxUserClient
APPLE_CLASS=AppleEthernetMLX5
# Our driver logs this line when Start() reads the vendor id as all-ones (contract in docs/macos.md).
ORPHAN_MARK="MlxPCIDriver: config space reads 0xffff"
# Boot-args only a development Mac has: dext relaunch after a kill (the takeover race depends on
# it), a crash budget big enough for racing, AMFI and arm64e preview relaxations.
DEV_BOOT_ARGS="dextrelaunch daily_max_dext_crashes amfi_get_out_of_my_way -arm64e_preview_abi"

# card_owner: ours | apple | none | absent. The first driver below the PCI node owns it.
card_owner() {
  local tree first
  tree=$(ioreg -r -n "$MLX_PCI_NODE" -w 0 2>/dev/null || true)
  [ -n "$tree" ] || {
    echo absent
    return 0
  }
  first=$(printf '%s\n' "$tree" | grep -o -E "$OUR_CLASS|$APPLE_CLASS" | head -n 1)
  case $first in
    "$OUR_CLASS") echo ours ;;
    "$APPLE_CLASS") echo apple ;;
    *) echo none ;;
  esac
}

node_property() {  # node_property <key>: a number or quoted string property of the PCI node's subtree
  ioreg -r -n "$MLX_PCI_NODE" -l -w 0 2>/dev/null |
    sed -n "s/.*\"$1\" = \"*\([^\"]*\)\"*\$/\1/p" | head -n 1
}

# IODEXTMatchCount counts the dext personalities in the kernel's catalogue that match the function:
# Apple's alone gives 1; 2 or more means ours is there and a rematch can pick it. Activation puts
# a new personality there at once only when it replaces an older one; a fresh one arrives at boot.
persona_count() {
  local n
  n=$(node_property IODEXTMatchCount)
  echo "${n:-0}"
}
rematch_count() {
  local n
  n=$(node_property IORematchCount)
  echo "${n:-?}"
}
# Our driver publishes MelonState = starting | ready | fatal once it owns the card (docs/macos.md).
driver_state() { node_property MelonState; }
driver_ready() { [ "$(driver_state)" = ready ]; }

our_dext_pid() { pgrep -f "SystemExtensions/.*$MLX_DEXT_ID" | head -n 1 || true; }
# Apple's driver is found by its name alone (the anchor's hardware-tested pattern); nothing of
# ours carries that name on its command line.
apple_dext_pid() { pgrep -f "$APPLE_CLASS" | head -n 1 || true; }

# The version a running dext was built as, from the bundle around its executable.
bundle_plist() {  # dexts are shallow bundles; apps keep Contents/
  if [ -f "$1/Contents/Info.plist" ]; then echo "$1/Contents/Info.plist"; else echo "$1/Info.plist"; fi
}
bundle_version() { plutil -extract CFBundleVersion raw "$(bundle_plist "$1")" 2>/dev/null || true; }
running_dext_version() {  # running_dext_version <pid>
  local exe dir
  exe=$(ps -o command= -p "$1" 2>/dev/null | awk '{print $1}')
  [ -n "$exe" ] || return 0
  dir=$(dirname "$exe")
  case $dir in */Contents/MacOS) dir=$(dirname "$(dirname "$dir")") ;; esac
  bundle_version "$dir"
}
embedded_dext() { echo "$1/Contents/Library/SystemExtensions/$MLX_DEXT_ID.dext"; }

sysext_lines() { systemextensionsctl list 2>/dev/null | grep -F "$MLX_DEXT_ID" || true; }
# A swap that never finishes shows as "terminating" or "waiting to upgrade" (found on hardware by the anchor project).
swap_stuck() { sysext_lines | grep -E 'terminating|waiting to upgrade' || true; }

# Open user clients, one line each: "<pid> <name> <qps> <mrs>", counts "?" when not published.
# An IOUserClient carries IOUserClientCreator = "pid N, name"; our driver adds MelonQPCount and
# MelonMRCount (docs/macos.md).
client_holdings() {
  ioreg -r -c IOUserUserClient -l -w 0 2>/dev/null | awk -v cls="$OUR_CLIENT_CLASS" '
    function flush() { if (ours) print pid, name, qps, mrs; ours = 0; pid = "?"; name = "?"; qps = "?"; mrs = "?" }
    BEGIN { ours = 0; pid = "?"; name = "?"; qps = "?"; mrs = "?" }
    /\+-o / { flush() }
    /"IOUserClass" = / { if (index($0, "\"" cls "\"")) ours = 1 }
    /"IOUserClientCreator" = / {
      line = $0; sub(/.*"pid /, "", line); pid = line; sub(/,.*/, "", pid)
      name = line; sub(/^[0-9]+, /, "", name); sub(/".*/, "", name)
    }
    /"MelonQPCount" = / { qps = $NF }
    /"MelonMRCount" = / { mrs = $NF }
    END { flush() }'
}
# Clients that hold QPs or MRs, or whose counts are unknown (an unknown count may hide a QP).
clients_holding() { client_holdings | awk '$3 != "0" || $4 != "0"'; }

boot_args() { nvram boot-args 2>/dev/null | sed 's/^boot-args[[:space:]]*//' || true; }
has_boot_arg() {  # has_boot_arg <name>: name or name=value present
  case " $(boot_args) " in *" $1 "* | *" $1="*) return 0 ;; esac
  return 1
}
sip_enabled() { csrutil status 2>/dev/null | grep -q 'status: enabled'; }
sysext_developer_on() {
  systemextensionsctl developer 2>&1 | tr '[:upper:]' '[:lower:]' | grep -q -w -E 'on|enabled'
}

# The orphaned card: nobody owns the function and it reads all-ones. Evidence is our driver's log
# line from Start() or the PCI listing showing vendor 0xffff; a warm reboot keeps the card's power
# and its state, so only a cold power cycle brings it back.
config_reads_ffff() {
  log show --last "$MLX_LOG_WINDOW" --style compact --predicate "eventMessage CONTAINS \"$ORPHAN_MARK\"" \
    2>/dev/null | grep -q -F "$ORPHAN_MARK" && return 0
  system_profiler SPPCIDataType 2>/dev/null | grep -q -i 'vendor id: 0xffff'
}
card_orphaned() { [ "$(card_owner)" = none ] && config_reads_ffff; }
card_on_bus() { system_profiler SPPCIDataType 2>/dev/null | grep -q -i 'vendor id: 0x15b3'; }
