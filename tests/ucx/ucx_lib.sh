# shellcheck shell=bash
# What the UCX tests share (tests/ucx/ucx_test.sh, tests/peer/gate.sh's UCX rows).
#
# UCX takes a verbs device only when /dev/infiniband/<its uverbs node> is a character device it can
# open (docs/ucx.md). uverbs_dev <scratch dir> gives the calling mount namespace (a private one:
# unshare --mount --propagation private) a /dev that has them: the real /dev as the lower layer of
# an overlay on a tmpfs at <scratch dir>, its submounts carried over, /dev/infiniband/uverbs0..3
# added as /dev/null-like character devices. Returns nonzero (and says why) when it cannot.
uverbs_dev() {
  local w=$1 m i
  mount -t tmpfs tmpfs "$w" || { echo "uverbs_dev: tmpfs on $w"; return 1; }
  mkdir "$w/upper" "$w/wk" "$w/dev" || return 1
  mount -t overlay overlay -o "lowerdir=/dev,upperdir=$w/upper,workdir=$w/wk" "$w/dev" ||
    { echo "uverbs_dev: cannot mount an overlay on /dev"; return 2; }
  for m in shm pts mqueue hugepages; do
    if mountpoint -q "/dev/$m"; then mount --rbind "/dev/$m" "$w/dev/$m" || { echo "uverbs_dev: bind /dev/$m"; return 1; }; fi
  done
  mkdir -p "$w/dev/infiniband"
  for i in 0 1 2 3; do
    [ -e "$w/dev/infiniband/uverbs$i" ] || mknod -m 0666 "$w/dev/infiniband/uverbs$i" c 1 3 || { echo "uverbs_dev: mknod"; return 1; }
  done
  mount --rbind "$w/dev" /dev || { echo "uverbs_dev: our /dev"; return 1; }
}

# io_demo_totals <client output>: "<operations> <reads> <writes>" summed over the client's reports
# (each counts the operations of its interval).
io_demo_totals() {
  sed -n 's/.*total min:[0-9]* max:[0-9]* total:\([0-9]*\) | read .* total:\([0-9]*\) | write .* total:\([0-9]*\) |.*/\1 \2 \3/p' <<<"$1" |
    awk '{o += $1; r += $2; w += $3} END {print o + 0, r + 0, w + 0}'
}
