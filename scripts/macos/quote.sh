# shellcheck shell=bash
# One way to print a command, shared by the operator scripts (dry runs, the record of what ran)
# and by their test stubs (tests/macos), so expected command lines read the same everywhere.
quote_cmd() {
  local out="" a
  for a in "$@"; do
    case $a in
      '' | *[!A-Za-z0-9_./:=@%+,-]*) a="'$(printf '%s' "$a" | sed "s/'/'\\\\''/g")'" ;;
    esac
    out="$out${out:+ }$a"
  done
  printf '%s' "$out"
}
