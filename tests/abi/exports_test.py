#!/usr/bin/env python3
"""Our libibverbs.so.1, libmlx5.so.1, libefa.so.1 and librdmacm.so.1 export exactly what rdma-core v44's do, each
name on its version node and with its default/non-default marking: `nm -D --with-symbol-versions`
of each built library against the committed stock list (src/abi/v44/<lib>.syms), minus the
intended omissions (src/abi/v44/omissions.txt, each with its reason). When the stock Debian library
is installed at that version, the committed list is first checked against it.

usage: exports_test.py <directory with our libraries>
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V44 = os.path.join(ROOT, "src", "abi", "v44")
LIBS = ["libibverbs.so.1", "libmlx5.so.1", "libefa.so.1", "librdmacm.so.1"]
STOCK_PACKAGE = {"libibverbs.so.1": "libibverbs1", "libmlx5.so.1": "ibverbs-providers",
                 "libefa.so.1": "ibverbs-providers", "librdmacm.so.1": "librdmacm1"}


def nm(path):
    out = subprocess.run(["nm", "-D", "--with-symbol-versions", "--defined-only", path],
                         capture_output=True, text=True, check=True).stdout
    return sorted(" ".join(line.split()[1:3]) for line in out.splitlines() if len(line.split()) >= 3)


def committed(lib):
    return [line.strip() for line in open(os.path.join(V44, lib + ".syms"))
            if line.strip() and not line.startswith("#")]


def omissions(lib):
    rows = []
    for line in open(os.path.join(V44, "omissions.txt")):
        if line.strip() and not line.startswith("#"):
            name, regex, reason = line.split(None, 2)
            if name == lib:
                rows.append((re.compile(regex), reason.strip()))
    return rows


def stock_path(lib):
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith(lib + " ") and "x86-64" in line:
            return line.split("=>")[-1].strip()
    return None


def stock_version(lib):
    res = subprocess.run(["dpkg-query", "-W", "-f=${Version}", STOCK_PACKAGE[lib]], capture_output=True, text=True)
    return res.stdout if res.returncode == 0 else ""


def main():
    if sys.platform != "linux":
        print("SKIP: ELF symbol versions are Linux-only")
        sys.exit(77)
    libdir = sys.argv[1]
    failed = False
    for lib in LIBS:
        want = committed(lib)
        stock = stock_path(lib)
        if stock and stock_version(lib).startswith("44."):
            if nm(stock) != sorted(want):
                print(f"FAIL: src/abi/v44/{lib}.syms is not the export list of {stock}")
                failed = True
        omit = omissions(lib)
        omitted = [s for s in want if any(r.fullmatch(s.split()[1]) for r, _ in omit)]
        for r, reason in omit:
            if not any(r.fullmatch(s.split()[1]) for s in want):
                print(f"FAIL: omission {r.pattern} of {lib} matches no stock export")
                failed = True
        ours = nm(os.path.join(libdir, lib))
        expected = sorted(set(want) - set(omitted))
        missing = sorted(set(expected) - set(ours))
        extra = sorted(set(ours) - set(expected))
        for s in missing:
            print(f"FAIL: {lib} lacks {s}")
        for s in extra:
            print(f"FAIL: {lib} exports {s}, which rdma-core v44's does not")
        failed |= bool(missing or extra)
        n_fn = sum(1 for s in expected if not s.startswith("A "))
        print(f"{lib}: {n_fn} exports and {len(expected) - n_fn} version nodes as in v44; "
              f"{len(omitted)} intended omissions")
    if failed:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
