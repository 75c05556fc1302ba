#!/usr/bin/env bash
# Installed consumers of libibverbs.so.1 / libmlx5.so.1 / libefa.so.1 load our libraries with every
# symbol bound at start (LD_BIND_NOW=1), and their first calls into us end as they should.
#   usage: consumers_test.sh <our library directory> <case>
# A case whose consumer is not installed reports SKIP (exit 77); ./melon deps installs them all.
set -u
libdir=$1
name=$2
export LD_LIBRARY_PATH=$libdir LD_BIND_NOW=1
# An address of its own: the soft device binds UDP port 4791 on it when a QP is made.
export MELON_SOFT_AUTO=0 MELON_SOFT_CONFIG=/nonexistent MELON_SOFT_DEVICES=cons0=127.8.0.1
py=/usr/bin/python3  # Debian's interpreter: the one python3-pyverbs installs into
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() { echo "FAIL: $name: $*"; echo "--- output:"; cat "$out"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
expect() { grep -Eq -- "$1" "$out" || fail "expected /$1/"; }
reject() { ! grep -Eq -- "$1" "$out" || fail "unexpected /$1/"; }
arch_lib=$(dirname "$(ldconfig -p | awk '/libibverbs\.so\.1 .*x86-64/{print $NF; exit}')" 2>/dev/null)
[ -n "$arch_lib" ] || arch_lib=/usr/lib/x86_64-linux-gnu

case $name in
librdmacm)
  # Stock librdmacm (Debian's, loaded by its path) over our libibverbs: its rdma_create_event_channel
  # reads ibv_get_sysfs_path() (rdma-core v44: const char *(void)), then opens the rdma_cm character
  # device: with none, NULL and errno ENOENT. (Ours, in $libdir, needs no device: tests/rdmacm.)
  [ -e "$arch_lib/librdmacm.so.1" ] || skip "librdmacm1 not installed"
  export MELON_STOCK_RDMACM="$arch_lib/librdmacm.so.1"
  "$py" - > "$out" 2>&1 <<'PY'
import ctypes, os
cm = ctypes.CDLL(os.environ["MELON_STOCK_RDMACM"], use_errno=True)
cm.rdma_create_event_channel.restype = ctypes.c_void_p
ch = cm.rdma_create_event_channel()
if ch:
    cm.rdma_destroy_event_channel(ctypes.c_void_p(ch))
    print("channel opened")
else:
    print("channel: NULL errno", ctypes.get_errno())
verbs = ctypes.CDLL("libibverbs.so.1")
print("verbs from", [l for l in open("/proc/self/maps").read().split() if l.endswith("libibverbs.so.1.14.44") or "libibverbs" in l][0])
PY
  rc=$?
  [ $rc -eq 0 ] || fail "python exited $rc (a crash is 139)"
  expect "verbs from $libdir/"
  if [ -e /dev/infiniband/rdma_cm ]; then expect "^channel opened$"; else expect "^channel: NULL errno 2$"; fi
  ;;
pyverbs)
  # Every pyverbs module, the mlx5 and efa ones included, imports; the direct-verbs entry points
  # answer for our device as rdma-core's do for a device that is neither mlx5 nor EFA.
  "$py" -c "import pyverbs" 2>/dev/null || skip "python3-pyverbs not installed"
  "$py" - > "$out" 2>&1 <<'PY'
import glob, importlib, os, pyverbs
root = os.path.dirname(os.path.dirname(pyverbs.__file__))
mods = sorted(os.path.relpath(p, root).split(".")[0].replace("/", ".")
              for p in glob.glob(os.path.join(root, "pyverbs", "**", "*.so"), recursive=True))
for m in mods:
    importlib.import_module(m)
print("imported", len(mods), "modules, providers:", len([m for m in mods if ".providers." in m]))
import pyverbs.device as d
print("devices", [x.name.decode() for x in d.get_device_list()])
from pyverbs.providers.mlx5.mlx5dv import Mlx5Context, Mlx5DVContextAttr
try:
    Mlx5Context(Mlx5DVContextAttr(), name="cons0")
except Exception as e:
    print("mlx5:", type(e).__name__, e)
from pyverbs.providers.efa.efadv import EfaContext
try:
    EfaContext(name="cons0").query_efa_device()
except Exception as e:
    print("efa:", type(e).__name__, getattr(e, "error_code", None))
# Import (issue 8 item 6): the command descriptor is dup-able and importable.
from pyverbs.device import Context
from pyverbs.pd import PD
ctx = Context(name="cons0")
imported = Context(cmd_fd=os.dup(ctx.cmd_fd))
pd = PD(ctx)
pd2 = PD(imported, handle=pd.handle)
print("import pd:", pd2.handle == pd.handle)
pd2.unimport()
print("imported context on", imported.query_device().node_guid == ctx.query_device().node_guid)
pd.close()
imported.close()
ctx.close()
PY
  rc=$?
  [ $rc -eq 0 ] || fail "python exited $rc"
  reject "undefined symbol"
  expect "^imported 35 modules, providers: 15$"
  expect "^devices \['cons0'\]$"
  expect "^mlx5: PyverbsUserError This is not an MLX5 device$"  # mlx5dv_is_supported: false
  expect "^efa: PyverbsRDMAError 95$"                           # efadv_query_device: EOPNOTSUPP
  expect "^import pd: True$"                                    # by handle, into the imported context
  expect "^imported context on True$"
  ;;
ucx)
  # UCX's InfiniBand and RDMA-CM transports load (they link libmlx5.so.1 and librdmacm.so.1). With
  # our librdmacm beside our libibverbs, UCX's RDMA-CM connection manager opens an event channel on
  # it; with the stock one (no /dev/infiniband/rdma_cm) it gets the clean librdmacm error.
  command -v ucx_info > /dev/null || skip "ucx-utils not installed"
  [ -e "$arch_lib/ucx/libuct_ib.so.0" ] || skip "libucx0 has no libuct_ib"
  UCX_LOG_LEVEL=debug timeout 120 ucx_info -d > "$out" 2>&1
  rc=$?
  [ $rc -eq 0 ] || fail "ucx_info -d exited $rc"
  expect "loading modules for uct_ib"
  reject "dlopen\(.*libuct_(ib|rdmacm).*failed"
  if [ -e "$libdir/librdmacm.so.1" ]; then
    expect "created rdmacm_cm .* with event_channel"
    expect "# Connection manager: rdmacm"
  elif [ ! -e /dev/infiniband/rdma_cm ]; then
    expect "rdma_create_event_channel failed: No such file or directory"
  fi
  "$py" -c "import ctypes; ctypes.CDLL('$arch_lib/ucx/libuct_ib.so.0'); ctypes.CDLL('$arch_lib/ucx/libuct_rdmacm.so.0'); print('dlopen ok')" > "$out" 2>&1
  expect "^dlopen ok$"
  ;;
libfabric)
  # fi_info (libfabric links libefa.so.1 and libibverbs.so.1): every provider initialises; the
  # verbs provider lists our device as a datagram domain, the EFA provider finds no device.
  command -v fi_info > /dev/null || skip "libfabric-bin not installed"
  timeout 120 fi_info > "$out" 2>&1 || fail "fi_info exited $?"
  reject "symbol lookup error|undefined symbol"
  expect "^provider: "
  timeout 120 fi_info -p verbs > "$out" 2>&1 || fail "fi_info -p verbs exited $?"
  expect "domain: cons0-dgram"
  timeout 120 fi_info -p efa > "$out" 2>&1
  rc=$?
  [ $rc -eq 61 ] || fail "fi_info -p efa exited $rc, expected 61 (FI_ENODATA: no EFA device)"
  expect "^fi_getinfo: -61$"
  ;;
*)
  echo "unknown case $name"
  exit 2
  ;;
esac
echo "PASS: $name"
