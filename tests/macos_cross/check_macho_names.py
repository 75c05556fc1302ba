#!/usr/bin/env python3
"""The names and versions dyld sees in the Mac build's dylibs (docs/macos.md, "Our library under
Apple's name"), read from their load commands with llvm-objdump:

- lib<x>.1.dylib for x in ibverbs, mlx5, efa: install name @rpath/lib<x>.1.dylib; current version
  the first three parts of rdma-core's library version, read from the rdma-core this machine has
  installed (Debian's lib<x>.so.1.<a>.<b>.<c>, the oracle); compatibility version <major>.0.0;
- librdma.dylib: a file of its own (not a link), install name @rpath/librdma.dylib, libibverbs'
  versions, LC_REEXPORT_DYLIB @rpath/libibverbs.1.dylib, LC_RPATH @loader_path, and no exports of
  its own (everything is libibverbs', so one image serves both names).

  check_macho_names.py --objdump llvm-objdump --rdma-core <Debian libdir> <Mac lib dir>
"""
import argparse
import glob
import os
import re
import subprocess
import sys

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def load_commands(objdump, path):
    out = subprocess.run([objdump, "--macho", "--private-headers", path], check=True, capture_output=True,
                         text=True).stdout
    cmds = []
    for block in re.split(r"^Load command \d+$", out, flags=re.M)[1:]:
        fields = {}
        for line in block.splitlines():
            m = re.match(r"\s*(cmd|name|path|current version|compatibility version)\s+(\S+)", line)
            if m:
                fields[m.group(1)] = m.group(2)
        cmds.append(fields)
    return cmds


def one(cmds, cmd, path):
    found = [c for c in cmds if c.get("cmd") == cmd]
    if len(found) != 1:
        fail(f"{path}: {len(found)} {cmd} load commands, not 1")
        return {}
    return found[0]


def rdma_core_version(libdir, lib):
    """Debian's rdma-core file name carries the library version: libibverbs.so.1.14.44.0."""
    names = [os.path.basename(p) for p in glob.glob(f"{libdir}/lib{lib}.so.1.*")]
    versions = [n[len(f"lib{lib}.so."):] for n in names if re.fullmatch(rf"lib{lib}\.so\.\d+(\.\d+)+", n)]
    if len(versions) != 1:
        sys.exit(f"no single rdma-core lib{lib}.so.1.* in {libdir} (libibverbs-dev): {names}")
    parts = versions[0].split(".")
    return ".".join(parts[:3]), parts[0] + ".0.0"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--objdump", required=True)
    ap.add_argument("--rdma-core", required=True)
    ap.add_argument("libdir")
    a = ap.parse_args()

    ids = {}
    for lib in ("ibverbs", "mlx5", "efa"):
        path = f"{a.libdir}/lib{lib}.1.dylib"
        if not os.path.exists(path):
            fail(f"no {path}")
            continue
        current, compat = rdma_core_version(a.rdma_core, lib)
        lc = one(load_commands(a.objdump, path), "LC_ID_DYLIB", path)
        ids[lib] = lc
        want = {"name": f"@rpath/lib{lib}.1.dylib", "current version": current, "compatibility version": compat}
        for k, v in want.items():
            if lc.get(k) != v:
                fail(f"{path}: LC_ID_DYLIB {k} {lc.get(k)}, want {v}")
        print(f"{path}: {lc.get('name')} current {lc.get('current version')} compatibility "
              f"{lc.get('compatibility version')}")

    path = f"{a.libdir}/librdma.dylib"
    if os.path.islink(path) or not os.path.isfile(path):
        fail(f"{path} is not a dylib of its own")
    else:
        cmds = load_commands(a.objdump, path)
        lc = one(cmds, "LC_ID_DYLIB", path)
        iv = ids.get("ibverbs", {})
        want = {"name": "@rpath/librdma.dylib", "current version": iv.get("current version"),
                "compatibility version": iv.get("compatibility version")}
        for k, v in want.items():
            if lc.get(k) != v:
                fail(f"{path}: LC_ID_DYLIB {k} {lc.get(k)}, want {v}")
        if one(cmds, "LC_REEXPORT_DYLIB", path).get("name") != "@rpath/libibverbs.1.dylib":
            fail(f"{path}: does not re-export @rpath/libibverbs.1.dylib")
        if "@loader_path" not in [c.get("path") for c in cmds if c.get("cmd") == "LC_RPATH"]:
            fail(f"{path}: no LC_RPATH @loader_path (the re-exported library beside it)")
        trie = subprocess.run([a.objdump, "--macho", "--exports-trie", path], check=True, capture_output=True,
                              text=True).stdout
        own = [l for l in trie.splitlines()[1:] if l.strip() and not l.startswith("Exports trie")]
        if own:
            fail(f"{path}: exports symbols of its own: {own[:3]}")
        print(f"{path}: {lc.get('name')} current {lc.get('current version')}, re-exports "
              "@rpath/libibverbs.1.dylib, rpath @loader_path")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
