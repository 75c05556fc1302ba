# shellcheck shell=bash
# Linux RoCEv2 peers for MelonDMA: qemu guests running Debian's kernel with Soft-RoCE (rdma_rxe), on a
# bridge inside a private network namespace. See docs/peer.md.
#
#   source tests/peer/lib.sh
#   peer_up 2 1500                    # two guests, MTU 1500; installs an EXIT/INT/TERM trap that tears down
#   peer_run 1 'ibv_devinfo -d rxe0'  # run a sh script in guest 1: its stdout/stderr, its exit status
#   id=$(peer_spawn 1 'ibv_rc_pingpong -d rxe0 -g 1'); ...; peer_wait 1 "$id"
#   peer_host ping -c1 10.77.0.2      # run a command on the host inside the namespace (owns 10.77.0.1)
#   peer_down
#
# Call peer_up in the script's own shell, never inside $(...): the guests die with the shell that
# started them (PR_SET_PDEATHSIG), so a harness killed by a timeout leaves no qemu behind.
#
# Addresses: host side 10.77.0.1/24, fd77::1/64 and fe80::5054:ff:fe77:1 on bridge br0; guest i is
# 10.77.0.(i+1) and fd77::(i+1), MAC 52:54:00:77:00:(i+1), tap<i>. These exist only inside the
# namespace this file creates.

PEER_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PEER_CACHE=${MELON_PEER_CACHE:-${HOME:-/root}/.cache/melondma/peer}
PEER_MIRROR=${MELON_PEER_MIRROR:-http://deb.debian.org/debian}
PEER_SUITE=bookworm
PEER_RUN_BASE=${MELON_PEER_RUN_BASE:-${TMPDIR:-/tmp}/melon-peer}
PEER_MEM=${MELON_PEER_MEM:-512}
PEER_BOOT_TIMEOUT=${MELON_PEER_BOOT_TIMEOUT:-240}
PEER_JOB_TIMEOUT=${PEER_JOB_TIMEOUT:-120}   # seconds a job may run in the guest (peer_run/peer_spawn)
PEER_PREFIX=10.77.0
PEER_HOST_ADDR=$PEER_PREFIX.1
# IPv6 on the same bridge: a ULA prefix, and a fixed bridge MAC so the host's link-local address
# (EUI-64 of the MAC) is known in advance. Guest i: fd77::(i+1), link-local from its MAC.
PEER_PREFIX6=fd77:
PEER_HOST_ADDR6=${PEER_PREFIX6}:1
PEER_HOST_MAC=52:54:00:77:00:01
PEER_HOST_LL6=fe80::5054:ff:fe77:1

# What the guest root file system holds (debootstrap --variant=minbase).
PEER_GUEST_PACKAGES=(rdma-core ibverbs-utils ibverbs-providers perftest rdmacm-utils iproute2 kmod
                     tcpdump netcat-openbsd iputils-ping ethtool libfabric-bin ucx-utils qperf)
# Kernel modules copied into the root file system (with their dependencies); the rest of the
# 390 MB module tree stays out of the image.
PEER_ROOT_MODULES=(rdma_rxe crc32_generic crc32-pclmul rdma_ucm ib_umad ib_uverbs virtio_net 9p 9pnet_virtio
                   sch_netem sch_prio sch_tbf sch_htb sch_ingress cls_u32 cls_basic act_mirred ifb veth)
# Modules the initramfs loads to mount the root file system.
PEER_INITRD_MODULES=(virtio_pci virtio_blk ext4)

peer_log() { echo "peer: $*" >&2; }
peer_die() { echo "peer: error: $*" >&2; return 1; }

# ---------------------------------------------------------------------------------------------------
# Preconditions. peer_check prints why the harness cannot run here and returns 1 (callers skip).
peer_check() {
  local tool
  [ "$(id -u)" -eq 0 ] || { echo "not root (network namespaces and taps need root)"; return 1; }
  for tool in qemu-system-x86_64 ip debootstrap mkfs.ext4 cpio modprobe depmod setpriv apt-get \
              dpkg-deb flock; do
    command -v "$tool" >/dev/null || { echo "$tool not installed (./melon deps installs it)"; return 1; }
  done
  [ -x /bin/busybox ] || { echo "busybox-static not installed"; return 1; }
  [ -c /dev/net/tun ] || { echo "/dev/net/tun missing"; return 1; }
  local ns=melonpeer-check-$$
  ip netns add "$ns" 2>/dev/null || { echo "cannot create a network namespace"; return 1; }
  if ! ip -n "$ns" link add br0 type bridge 2>/dev/null ||
     ! ip -n "$ns" tuntap add tap1 mode tap 2>/dev/null; then
    ip netns del "$ns"; echo "cannot create a bridge or tap device in a namespace"; return 1
  fi
  ip netns del "$ns"
  return 0
}

# ---------------------------------------------------------------------------------------------------
# The guest image: $PEER_CACHE/image-<key>/{vmlinuz,initrd.img,rootfs.ext4}, built when missing.
# Three cached stages, each keyed by what it is made from:
#   kernel-<pkg>/     Debian's linux-image package, unpacked, depmod run   (apt-get download)
#   rootfs-<key>/     debootstrap --variant=minbase of PEER_GUEST_PACKAGES    (~2 min)
#   image-<key>/      rootfs + module subset + guest/melon-init, as ext4; initramfs   (~20 s)

peer_kernel_package() {
  if [ -n "${MELON_PEER_KERNEL:-}" ]; then echo "$MELON_PEER_KERNEL"; return; fi
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
  if [ -z "$pkg" ]; then
    apt-get update -q >/dev/null 2>&1 || true
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
  fi
  [ -n "$pkg" ] || { peer_die "cannot resolve linux-image-amd64 (apt-get update?)"; return 1; }
  echo "$pkg"
}

peer_hash() { sha256sum | cut -c1-12; }

peer_build_kernel() {  # peer_build_kernel <pkg>: unpack into $PEER_CACHE/kernel-<pkg>
  local pkg=$1 dir=$PEER_CACHE/kernel-$1
  [ -f "$dir/.done" ] && return 0
  peer_log "kernel: downloading $pkg"
  local tmp; tmp=$(mktemp -d "$PEER_CACHE/.kernel.XXXXXX")
  chmod 755 "$tmp"
  ( cd "$tmp" && apt-get download -q "$pkg" >/dev/null ) ||
    { rm -rf "$tmp"; peer_die "apt-get download $pkg failed"; return 1; }
  mkdir "$tmp/root"
  dpkg-deb -x "$tmp"/*.deb "$tmp/root" || { rm -rf "$tmp"; return 1; }
  rm -f "$tmp"/*.deb
  local ver; ver=$(ls "$tmp/root/lib/modules")
  depmod -b "$tmp/root" "$ver" || { rm -rf "$tmp"; return 1; }
  echo "$ver" > "$tmp/root/version"
  rm -rf "$dir"; mv "$tmp/root" "$dir"; rm -rf "$tmp"
  touch "$dir/.done"
}

peer_rootfs_key() { { echo "$PEER_SUITE $PEER_MIRROR"; printf '%s\n' "${PEER_GUEST_PACKAGES[@]}"; } | peer_hash; }

peer_build_rootfs() {  # peer_build_rootfs <dir>
  local dir=$1
  [ -f "$dir/.done" ] && return 0
  peer_log "rootfs: debootstrap $PEER_SUITE (minbase + ${PEER_GUEST_PACKAGES[*]}), ~2 min"
  local tmp; tmp=$(mktemp -d "$PEER_CACHE/.rootfs.XXXXXX")
  local inc; inc=$(IFS=,; echo "${PEER_GUEST_PACKAGES[*]}")
  if ! debootstrap --variant=minbase --include="$inc" "$PEER_SUITE" "$tmp/root" "$PEER_MIRROR" \
       >"$tmp/debootstrap.log" 2>&1; then
    tail -20 "$tmp/debootstrap.log" >&2
    tail -20 "$tmp/root/debootstrap/debootstrap.log" >&2 2>/dev/null
    umount -R "$tmp/root/proc" "$tmp/root/sys" 2>/dev/null
    rm -rf --one-file-system "$tmp"; peer_die "debootstrap failed"; return 1
  fi
  rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
  rm -rf "$dir"; mv "$tmp/root" "$dir"; rm -rf "$tmp"
  touch "$dir/.done"
}

# Module file paths (relative to lib/modules/<ver>/), dependencies first, for the named modules.
peer_module_closure() {  # peer_module_closure <kernel-root> <ver> <module...>
  local root=$1 ver=$2; shift 2
  local m
  for m in "$@"; do
    modprobe -C /dev/null -d "$root" -S "$ver" --show-depends "$m" || return 1
  done | sed -n "s|^insmod $root/lib/modules/$ver/\([^ ]*\).*|\1|p" | awk '!seen[$0]++'
}

peer_image_key() {  # everything the image is made from
  { peer_kernel_package; peer_rootfs_key; printf '%s\n' "${PEER_ROOT_MODULES[@]}" "${PEER_INITRD_MODULES[@]}"
    cat "$PEER_LIB_DIR/guest/initramfs-init" "$PEER_LIB_DIR/guest/melon-init"
    sed -n '/^peer_assemble()/,/^}/p' "$PEER_LIB_DIR/lib.sh"; } | peer_hash
}

peer_assemble() {  # peer_assemble <kernel-dir> <rootfs-dir> <image-dir>
  local kdir=$1 rdir=$2 out=$3 ver m
  ver=$(cat "$kdir/version")
  local tmp; tmp=$(mktemp -d "$PEER_CACHE/.image.XXXXXX")
  # Root file system: hard links to the cached rootfs (files are replaced, never edited in place).
  cp -al "$rdir" "$tmp/root"
  rm -f "$tmp/root/.done" "$tmp/root/etc/hostname"
  local mods; mods=$(peer_module_closure "$kdir" "$ver" "${PEER_ROOT_MODULES[@]}") || { rm -rf "$tmp"; return 1; }
  for m in $mods; do
    mkdir -p "$tmp/root/lib/modules/$ver/$(dirname "$m")"
    cp "$kdir/lib/modules/$ver/$m" "$tmp/root/lib/modules/$ver/$m"
  done
  cp "$kdir/lib/modules/$ver/"modules.{order,builtin,builtin.modinfo} "$tmp/root/lib/modules/$ver/"
  depmod -b "$tmp/root" "$ver"
  install -m 755 "$PEER_LIB_DIR/guest/melon-init" "$tmp/root/sbin/melon-init"
  echo peer > "$tmp/root/etc/hostname"
  # "localhost" resolves, as on any installed Debian (minbase has no /etc/hosts): libfabric's verbs
  # provider binds it for a passive fi_getinfo, and finds no FI_EP_MSG match without it.
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$tmp/root/etc/hosts"
  local kb; kb=$(du -sk "$tmp/root" | cut -f1)
  mkfs.ext4 -q -F -L melonpeer -d "$tmp/root" "$tmp/rootfs.ext4" "$(( kb * 5 / 4 + 131072 ))k" >/dev/null ||
    { rm -rf "$tmp"; peer_die "mkfs.ext4 failed"; return 1; }
  # initramfs: busybox, the modules that mount the root, /init.
  local ird=$tmp/initrd
  mkdir -p "$ird/bin" "$ird/lib/modules"
  cp /bin/busybox "$ird/bin/busybox"
  install -m 755 "$PEER_LIB_DIR/guest/initramfs-init" "$ird/init"
  mods=$(peer_module_closure "$kdir" "$ver" "${PEER_INITRD_MODULES[@]}") || { rm -rf "$tmp"; return 1; }
  for m in $mods; do
    mkdir -p "$ird/lib/modules/$(dirname "$m")"
    cp "$kdir/lib/modules/$ver/$m" "$ird/lib/modules/$m"
  done
  printf '%s\n' $mods > "$ird/modules.list"
  ( cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$tmp/initrd.img"
  # An uncompressed ELF kernel boots through its PVH entry: no xz decompression under TCG (~10 s).
  local bz=$kdir/boot/vmlinuz-$ver off
  off=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$bz" | LC_ALL=C sed -n '1s/:.*//p')
  local xzrc=1
  if [ -n "$off" ]; then
    tail -c +$((off + 1)) "$bz" 2>/dev/null | xz -dc --single-stream > "$tmp/vmlinux" 2>/dev/null
    xzrc=${PIPESTATUS[1]}
  fi
  if [ "$xzrc" != 0 ] || [ "$(od -An -tx1 -N4 "$tmp/vmlinux" 2>/dev/null | tr -d ' ')" != 7f454c46 ]; then
    peer_log "image: no PVH vmlinux from $bz; booting the bzImage"
    cp "$bz" "$tmp/vmlinux"
  fi
  chmod 755 "$tmp"
  echo "$ver" > "$tmp/version"
  rm -rf "$tmp/root" "$ird"
  rm -rf "$out"; mv "$tmp" "$out"
  touch "$out/.done"
}

# peer_image: make sure the image exists; sets PEER_IMAGE to its folder. A failed build is tried once
# more after `apt-get update`: old apt lists may name a kernel package the mirror no longer has.
peer_image() {
  mkdir -p "$PEER_CACHE" || return 1
  local attempt key
  for attempt in 1 2; do
    key=$(peer_image_key) || return 1
    PEER_IMAGE=$PEER_CACHE/image-$key
    [ -f "$PEER_IMAGE/.done" ] && return 0
    peer_build_image "$PEER_IMAGE" && return 0
    [ $attempt = 1 ] || break
    peer_log "image: build failed; apt-get update and one more try"
    apt-get update -q >/dev/null 2>&1
  done
  return 1
}

peer_build_image() {  # peer_build_image <image-dir>
  (
    flock 9
    [ -f "$1/.done" ] && exit 0
    t0=$SECONDS
    pkg=$(peer_kernel_package) || exit 1
    rdir=$PEER_CACHE/rootfs-$(peer_rootfs_key)
    peer_build_kernel "$pkg" & kpid=$!
    peer_build_rootfs "$rdir" || { wait $kpid; exit 1; }
    wait $kpid || exit 1
    peer_log "image: assembling $1"
    peer_assemble "$PEER_CACHE/kernel-$pkg" "$rdir" "$1" || exit 1
    peer_log "image: built in $((SECONDS - t0)) s"
  ) 9>"$PEER_CACHE/.lock"
}

# ---------------------------------------------------------------------------------------------------
# Sessions: a namespace, a bridge, taps and guests. State lives in $PEER_RUN.

# Remove what a dead harness left behind: namespaces melonpeer-<pid> whose <pid> is gone.
peer_reap_stale() {
  local ns pid f
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^melonpeer-[0-9]*$'); do
    pid=${ns#melonpeer-}
    kill -0 "$pid" 2>/dev/null && continue
    for f in "$PEER_RUN_BASE/$ns"/g*/qemu.pid; do
      [ -f "$f" ] && peer_is_qemu "$(cat "$f")" && kill -KILL "$(cat "$f")" 2>/dev/null
    done
    ip netns del "$ns" 2>/dev/null && peer_log "removed stale namespace $ns"
    rm -rf "${PEER_RUN_BASE:?}/$ns"
  done
}

# peer_is_qemu <pid>: the process is (still) one of our qemus, not a later process that reused the PID
# (setpriv, setsid and ip are what it is for a moment before it execs qemu).
peer_is_qemu() {
  case $(cat "/proc/$1/comm" 2>/dev/null) in qemu-system-x86|setpriv|setsid|ip) return 0 ;; esac
  return 1
}

peer_guest_addr() { echo "$PEER_PREFIX.$(( $1 + 1 ))"; }
peer_guest_addr6() { printf '%s:%x\n' "$PEER_PREFIX6" $(( $1 + 1 )); }
# peer_ready <guest> <key>: a value from the guest's ready file (state, gid1, gid_ll, gid_ula, ip6_ll, ...).
peer_ready() { sed -n "s/^$2=//p" "$PEER_RUN/g$1/share/ready"; }

# peer_up [guests=2] [mtu=1500]: namespace + bridge + guests, each booted and with rxe0 ACTIVE.
# PEER_NS (default melonpeer-<pid of this shell>) names the namespace. PEER_TRAP=0: no trap.
peer_up() {
  local n=${1:-2} mtu=${2:-1500} i
  case $mtu in 1500|4200) ;; *) peer_log "warning: MTU $mtu (1500 -> path MTU 1024, 4200 -> 4096)";; esac
  [ "$n" -ge 1 ] && [ "$n" -le 200 ] || { peer_die "guest count $n"; return 1; }
  peer_image || return 1
  peer_reap_stale
  PEER_NS=${PEER_NS:-melonpeer-$$}
  PEER_RUN=$PEER_RUN_BASE/$PEER_NS
  PEER_GUESTS=$n
  PEER_MTU=$mtu
  if [ "${PEER_TRAP:-1}" = 1 ]; then
    trap 'peer_down' EXIT
    trap 'peer_down; trap - EXIT; exit 130' INT
    trap 'peer_down; trap - EXIT; exit 143' TERM HUP
  fi
  [ -e "/run/netns/$PEER_NS" ] && { peer_die "namespace $PEER_NS exists (peer down?)"; return 1; }
  rm -rf "$PEER_RUN"; mkdir -p "$PEER_RUN"
  { echo "PEER_NS=$PEER_NS"; echo "PEER_RUN=$PEER_RUN"; echo "PEER_GUESTS=$n"; echo "PEER_MTU=$mtu"
    echo "PEER_IMAGE=$PEER_IMAGE"; } > "$PEER_RUN/session"
  ip netns add "$PEER_NS" || return 1
  ip -n "$PEER_NS" link set lo up
  # No duplicate address detection in the namespace: IPv6 addresses are usable at once.
  ip netns exec "$PEER_NS" sh -c 'echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad' || return 1
  ip -n "$PEER_NS" link add br0 type bridge stp_state 0 forward_delay 0 mcast_snooping 0 || return 1
  ip -n "$PEER_NS" link set br0 address "$PEER_HOST_MAC" || return 1
  for ((i = 1; i <= n; i++)); do
    ip -n "$PEER_NS" tuntap add "tap$i" mode tap || return 1
    ip -n "$PEER_NS" link set "tap$i" mtu "$mtu" master br0 up || return 1
  done
  ip -n "$PEER_NS" link set br0 mtu "$mtu" up
  ip -n "$PEER_NS" addr add "$PEER_HOST_ADDR/24" dev br0
  ip -n "$PEER_NS" -6 addr add "$PEER_HOST_ADDR6/64" dev br0 nodad
  local t0=$SECONDS
  for ((i = 1; i <= n; i++)); do peer_start_guest "$i" "$mtu" || return 1; done
  for ((i = 1; i <= n; i++)); do peer_wait_ready "$i" || return 1; done
  PEER_BOOT_SECONDS=$((SECONDS - t0))
  peer_log "$n guest(s) up in ${PEER_BOOT_SECONDS} s (namespace $PEER_NS, MTU $mtu, run dir $PEER_RUN)"
}

peer_start_guest() {  # peer_start_guest <i> <mtu>
  local i=$1 mtu=$2 g=$PEER_RUN/g$1
  mkdir -p "$g/share/jobs"
  local addr; addr=$(peer_guest_addr "$i")
  local mac; mac=$(printf '52:54:00:77:%02x:%02x' $(( (i + 1) >> 8 )) $(( (i + 1) & 255 )))
  local cmdline="console=ttyS0 ${MELON_PEER_APPEND:-quiet loglevel=4} panic=-1 mitigations=off"
  cmdline+=" melon.name=g$i melon.ip=$addr/24 melon.ip6=$(peer_guest_addr6 "$i")/64 melon.mtu=$mtu"
  local qemu=(qemu-system-x86_64 -name "peer-g$i" -machine pc,accel=tcg -cpu max -smp 1 -m "$PEER_MEM"
    -nodefaults -no-user-config -display none -no-reboot
    -kernel "$PEER_IMAGE/vmlinux" -initrd "$PEER_IMAGE/initrd.img" -append "$cmdline"
    -drive "file=$PEER_IMAGE/rootfs.ext4,if=virtio,format=raw,snapshot=on"
    -netdev "tap,id=net0,ifname=tap$i,script=no,downscript=no"
    -device "virtio-net-pci,netdev=net0,mac=$mac"
    -virtfs "local,path=$g/share,mount_tag=host0,security_model=none,id=fs0"
    -device virtio-rng-pci
    -chardev "socket,id=ser0,path=$g/console.sock,server=on,wait=off,logfile=$g/console.log"
    -serial chardev:ser0 -monitor none -pidfile "$g/qemu.pid")
  printf '%q ' "${qemu[@]}" > "$g/qemu.cmd"
  # The guest dies with this shell (pdeathsig), and qemu runs inside the namespace to reach tap<i>.
  local pdeath=(setpriv --pdeathsig KILL)
  [ "${PEER_DETACH:-0}" = 1 ] && pdeath=(setsid)
  TMPDIR=$PEER_RUN "${pdeath[@]}" ip netns exec "$PEER_NS" "${qemu[@]}" >"$g/qemu.log" 2>&1 </dev/null &
  echo $! > "$g/pid"
}

peer_guest_alive() { local p; p=$(cat "$PEER_RUN/g$1/pid" 2>/dev/null) && kill -0 "$p" 2>/dev/null; }

peer_wait_ready() {  # peer_wait_ready <i>
  local i=$1 g=$PEER_RUN/g$1 t0=$SECONDS
  while [ ! -f "$g/share/ready" ]; do
    if ! peer_guest_alive "$i"; then
      peer_log "guest $i died while booting"; peer_console "$i" >&2; return 1
    fi
    if (( SECONDS - t0 > PEER_BOOT_TIMEOUT )); then
      peer_log "guest $i not ready after $PEER_BOOT_TIMEOUT s"; peer_console "$i" >&2; return 1
    fi
    sleep 0.2
  done
  grep -q '^state=.*ACTIVE' "$g/share/ready" || { peer_log "guest $i: rxe0 not ACTIVE"; cat "$g/share/ready" >&2; return 1; }
}

peer_console() { tail -n "${2:-40}" "$PEER_RUN/g$1/console.log" 2>/dev/null; cat "$PEER_RUN/g$1/qemu.log" 2>/dev/null; }

# peer_down: stop the guests (by PID), delete the namespace and the run dir (kept if PEER_KEEP=1).
peer_down() {
  [ -n "${PEER_RUN:-}" ] || return 0
  peer_capture_stop 2>/dev/null
  local f p left=()
  for f in "$PEER_RUN"/g*/pid "$PEER_RUN"/g*/qemu.pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null) || continue
    peer_is_qemu "$p" && kill -TERM "$p" 2>/dev/null && left+=("$p")
  done
  local k
  for ((k = 0; k < 50; k++)); do
    local alive=0
    for p in "${left[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${left[@]}"; do peer_is_qemu "$p" && kill -KILL "$p" 2>/dev/null; done
  [ -n "${PEER_NS:-}" ] && ip netns del "$PEER_NS" 2>/dev/null
  if [ "${PEER_KEEP:-0}" = 1 ]; then peer_log "kept $PEER_RUN"; else rm -rf "$PEER_RUN"; fi
  PEER_RUN=
}

# peer_attach [run-dir]: use a session started elsewhere (e.g. `tests/peer/peer up`).
peer_attach() {
  local run=${1:-${PEER_RUN:-$PEER_RUN_BASE/melonpeer}}
  [ -f "$run/session" ] || { peer_die "no session at $run (tests/peer/peer up)"; return 1; }
  # shellcheck disable=SC1091
  . "$run/session"
}

# ---------------------------------------------------------------------------------------------------
# Running things.

# peer_spawn <guest> <script | command args...>: start a job in the guest, print its id.
# One argument is a sh script ('a | b; c'); several are a command, quoted word by word.
# PEER_JOB_TIMEOUT bounds the job inside the guest.
peer_spawn() {
  local i=$1; shift
  local jobs=$PEER_RUN/g$i/share/jobs
  [ -d "$jobs" ] || { peer_die "no guest $i"; return 1; }
  local script
  if [ $# -eq 1 ]; then script=$1; else script=$(printf '%q ' "$@"); fi
  local id; id=$(date +%s%N)-$RANDOM
  mkdir "$jobs/.$id"
  echo "$PEER_JOB_TIMEOUT" > "$jobs/.$id/timeout"
  printf '%s\n' "$script" > "$jobs/.$id/cmd"
  mv "$jobs/.$id" "$jobs/$id"
  echo "$id"
}

# peer_wait <guest> <id> [seconds]: wait for a job; its stdout to stdout, stderr to stderr; its status.
peer_wait() {
  local i=$1 id=$2 limit=${3:-$((PEER_JOB_TIMEOUT + 30))}
  local d=$PEER_RUN/g$i/share/jobs/$id t0=$SECONDS
  [ -d "$d" ] || { peer_die "no job $id in guest $i"; return 1; }
  while [ ! -s "$d/rc" ]; do
    peer_guest_alive "$i" || { peer_log "guest $i is gone"; peer_console "$i" >&2; return 255; }
    (( SECONDS - t0 > limit )) && { peer_log "job $id in guest $i: no answer after $limit s"; return 124; }
    sleep 0.05
  done
  cat "$d/out" 2>/dev/null
  cat "$d/err" >&2 2>/dev/null
  local rc; rc=$(cat "$d/rc")
  rm -rf "$d"
  return "$rc"
}

# peer_done <guest> <id>: 0 when the job has finished (peer_wait then returns at once).
peer_done() { [ -s "$PEER_RUN/g$1/share/jobs/$2/rc" ]; }
# peer_job_output <guest> <id>: what a running job has printed so far (stdout then stderr).
peer_job_output() { cat "$PEER_RUN/g$1/share/jobs/$2/out" "$PEER_RUN/g$1/share/jobs/$2/err" 2>/dev/null; }

# peer_run <guest> <script | command args...>: run and wait.
peer_run() {
  local i=$1 id; shift
  id=$(peer_spawn "$i" "$@") || return 1
  peer_wait "$i" "$id"
}

# peer_host <command args...>: run on the host inside the namespace, where 10.77.0.1 is ours.
peer_host() { ip netns exec "$PEER_NS" "$@"; }

# peer_wait_listen <guest> <tcp-port> [seconds]: until a program in the guest listens on the port.
peer_wait_listen() {
  PEER_JOB_TIMEOUT=${3:-30} peer_run "$1" \
    "while ! ss -Hltn 'sport = :$2' | grep -q .; do sleep 0.1; done" >/dev/null
}

# peer_counter <guest> <name>: an rxe0 hw counter (rcvd_pkts, sent_pkts, rcvd_icrc_err?, ...).
peer_counter() { peer_run "$1" "cat /sys/class/infiniband/rxe0/ports/1/hw_counters/$2"; }

# peer_capture_start <file.pcap> [filter]: tcpdump on br0 in the namespace (every guest's traffic and
# the host side's), as the captures in tests/data were taken. peer_capture_stop ends it.
peer_capture_start() {
  local file=$1 filter=${2:-udp port 4791 or tcp port 18515}
  ip netns exec "$PEER_NS" tcpdump -q -n -i br0 -s 9216 -B 32768 -U --immediate-mode -w "$file" "$filter" \
    2>"$PEER_RUN/capture.log" &
  PEER_CAPTURE_PID=$! PEER_CAPTURE_FILE=$file
  local k
  for ((k = 0; k < 50; k++)); do grep -q 'listening on' "$PEER_RUN/capture.log" 2>/dev/null && return 0; sleep 0.1; done
  peer_log "tcpdump did not start: $(cat "$PEER_RUN/capture.log")"; return 1
}
peer_capture_stop() {
  [ -n "${PEER_CAPTURE_PID:-}" ] || return 0
  # tcpdump drops what it has not yet read from the kernel when signalled: first let the file stop growing.
  local k a b=-1
  for ((k = 0; k < 30; k++)); do
    a=$(stat -c %s "$PEER_CAPTURE_FILE" 2>/dev/null || echo 0)
    [ "$a" = "$b" ] && break
    b=$a; sleep 0.3
  done
  kill -INT "$PEER_CAPTURE_PID" 2>/dev/null; wait "$PEER_CAPTURE_PID" 2>/dev/null
  PEER_CAPTURE_PID=
  tail -3 "$PEER_RUN/capture.log" >&2
}
