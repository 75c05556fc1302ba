# shellcheck shell=bash source-path=SCRIPTDIR
# shellcheck disable=SC2034  # the settings here are read by the scripts that source this file
# Common ground of the macOS operator scripts (dev, hot-update, preflight, cold-takeover): settings,
# exit codes, output, the dry-run gate and the lock. Sourced, never run.
#
# Written for /bin/bash 3.2, the bash macOS ships: no associative arrays, no ${x,,}, no mapfile,
# no `local -n`, and no "${array[@]}" of a possibly empty array (bash < 4.4 calls it unbound
# under set -u). Tested with Debian's bash 5 (tests/macos).

set -u
set -o pipefail

MLX_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MLX_PROG=$(basename "$0")

# Bundle names default to src/dext/bundle.env; the environment wins. Team ID and signing identity
# have no default: they belong to whoever signs (MLX_TEAM_ID, SIGN_ID).
bundle_default() { sed -n "s/^$1=//p" "$MLX_ROOT/src/dext/bundle.env" | head -n 1; }
: "${MLX_DEXT_ID:=$(bundle_default MLX_DEXT_ID)}"
: "${MLX_DEXT_NAME:=$(bundle_default MLX_DEXT_NAME)}"
: "${MLX_APP_NAME:=$(bundle_default MLX_APP_NAME)}"
: "${MLX_TEAM_ID:=}"
: "${SIGN_ID:=}"

# Where things are. The installed app hosts the loader that asks sysextd for (de)activation.
: "${MLX_APP:=/Applications/$MLX_APP_NAME.app}"
: "${MLX_BUILD_APP:=$MLX_ROOT/build/macos/src/dext/loader/$MLX_APP_NAME.app}"
MLX_LOADER="$MLX_APP/Contents/MacOS/$MLX_APP_NAME"
# The ConnectX function's node in the I/O Registry; ethernet@0 on the anchor's Thunderbolt bench.
: "${MLX_PCI_NODE:=ethernet@0}"
: "${MLX_STATE_DIR:=$HOME/Library/Application Support/MelonDMA}"
: "${MLX_LOCK_DIR:=${TMPDIR:-/tmp}/melondma-macos-$(id -u).lock}"

# Bounds. Every wait and race ends: an unbounded loop against Apple's driver wedges nothing but
# the operator's afternoon, and a bound turns "it never settles" into a diagnosis.
: "${MLX_MAX_ROUNDS:=12}"        # rounds of the takeover race against AppleEthernetMLX5
: "${MLX_READY_SECONDS:=90}"     # Start() to "MelonState = ready"
: "${MLX_PERSONA_SECONDS:=30}"   # activation to our personality reaching the kernel's catalogue
: "${MLX_LOG_WINDOW:=10m}"       # how far back `log show` looks

# A bound that is not a positive number would turn the bounded loops into errors or no-ops.
for bound in MLX_MAX_ROUNDS MLX_READY_SECONDS MLX_PERSONA_SECONDS; do
  case ${!bound} in
    '' | *[!0-9]* | 0)
      printf '%s: %s must be a positive whole number\n' "$MLX_PROG" "$bound" >&2
      exit 2
      ;;
  esac
done

# Exit codes, the same in every script (docs/macos.md lists them).
EX_OK=0
EX_FAIL=1          # an operation failed; the message says which
EX_USAGE=2
EX_POSTURE=3       # refused: this machine or environment is wrong for the request
EX_BUSY=4          # refused: a client holds QPs/MRs, or another script is mutating
EX_POWER_CYCLE=5   # the card is orphaned (config space reads 0xffff): cold power cycle
EX_REBOOT=6        # only a reboot completes or cures this
EX_GAVE_UP=7       # the takeover race ran MLX_MAX_ROUNDS rounds without winning

DRY_RUN=0

note() { printf '%s: %s\n' "$MLX_PROG" "$*"; }
warn() { printf '%s: warning: %s\n' "$MLX_PROG" "$*" >&2; }
die() {  # die <exit code> <message>
  local code=$1
  shift
  printf '%s: %s\n' "$MLX_PROG" "$*" >&2
  exit "$code"
}

# shellcheck source=quote.sh
. "$MLX_ROOT/scripts/macos/quote.sh"

# Every command that changes the machine goes through act. Probes (ioreg, systemextensionsctl list,
# csrutil status, nvram boot-args, log show) run in a dry run too, so a dry run decides exactly as
# a real one would and prints what it would do.
act() {
  if [ "$DRY_RUN" = 1 ]; then
    printf 'dry-run: %s\n' "$(quote_cmd "$@")"
    return 0
  fi
  note "run: $(quote_cmd "$@")"
  "$@"
}

# Pauses are skipped in a dry run: nothing was changed, so there is nothing to wait for.
pause() { [ "$DRY_RUN" = 1 ] || sleep "$1"; }

# wait_until <seconds> <what> <command...>: poll every half second; a dry run assumes success.
wait_until() {
  local seconds=$1 what=$2 i=0
  shift 2
  if [ "$DRY_RUN" = 1 ]; then
    printf 'dry-run: wait up to %ss for %s\n' "$seconds" "$what"
    return 0
  fi
  while [ "$i" -lt $((seconds * 2)) ]; do
    "$@" && return 0
    sleep 0.5
    i=$((i + 1))
  done
  return 1
}

require_not_root() {  # codesign finds the signing identity only in the login user's keychain
  [ "$(id -u)" -ne 0 ] || die "$EX_POSTURE" "run as the login user, not root (sudo is used per step)"
}

require_team_id() {
  [ -n "$MLX_TEAM_ID" ] || die "$EX_POSTURE" "MLX_TEAM_ID is not set (the 10-character Apple team that signed the build)"
}

# Two scripts racing each other over one card is how a takeover wedges; mutating commands hold a
# lock. A child started by a script that holds it (hot-update runs dev release) inherits it.
take_lock() {
  local owner=""
  if [ "${MLX_LOCK_OWNER:-}" = "$PPID" ] && [ -d "$MLX_LOCK_DIR" ]; then
    return 0
  fi
  if ! mkdir "$MLX_LOCK_DIR" 2>/dev/null; then
    owner=$(cat "$MLX_LOCK_DIR/pid" 2>/dev/null || true)
    if [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null; then
      die "$EX_BUSY" "another operator script (pid $owner) is changing the driver; wait for it"
    fi
    rm -rf "$MLX_LOCK_DIR"
    mkdir "$MLX_LOCK_DIR" || die "$EX_FAIL" "cannot create lock $MLX_LOCK_DIR"
  fi
  echo "$$" >"$MLX_LOCK_DIR/pid"
  MLX_LOCK_OWNER=$$
  export MLX_LOCK_OWNER
  trap 'rm -rf "$MLX_LOCK_DIR"' EXIT
}
