#!/usr/bin/env python3
"""Every undefined symbol of a Mach-O file must be one macOS provides: an export of the toolchain's
libSystem stubs (Apple's libSystem.B.tbd as the Zig toolchain carries it) or a function named in
apple_frameworks.txt. A Linux-only call (recvmmsg, eventfd, epoll_*, memfd_create, futex...)
reaching a Mac build fails here, naming the file and the symbol.

  check_symbols.py --nm llvm-nm --tbd libSystem.12.tbd --frameworks apple_frameworks.txt
                   --arch arm64|x86_64 [--cxx-runtime] [--ours our.dylib]... file...

--cxx-runtime also accepts the C++ runtime's symbols (mangled names, __cxa_*, __gxx_personality_v0):
for a file linked without the C++ library (the x86-64 dylibs; libc++ is a system library on macOS).
"""
import argparse
import re
import subprocess
import sys

LIST = re.compile(r"\b(?:symbols|weak-symbols|thread-local-symbols):\s*\[([^\]]*)\]", re.S)


def libsystem_exports(tbd):
    names = set()
    for body in LIST.findall(open(tbd).read()):
        names.update(s.strip().strip("'\"") for s in body.split(",") if s.strip())
    return names


def framework_exports(path):
    names = set()
    for line in open(path):
        f = line.split()
        if f and not line.startswith("#"):
            names.add("_" + f[1])
    return names


def cxx_runtime(sym):
    return sym.startswith("__Z") or sym.startswith("___cxa_") or sym == "___gxx_personality_v0"


# Mach-O 64-bit (MH_MAGIC_64, little-endian) and its CPU type: a Linux object must not pass as a Mac one.
CPU = {"arm64": 0x0100000C, "x86_64": 0x01000007}


def arch_of(path):
    head = open(path, "rb").read(8)
    if head[:4] != b"\xcf\xfa\xed\xfe":
        return None
    cpu = int.from_bytes(head[4:8], "little")
    return next((k for k, v in CPU.items() if v == cpu), hex(cpu))


def undefined(nm, path):
    out = subprocess.run([nm, "-u", "-j", path], check=True, capture_output=True, text=True).stdout
    return [s for s in out.split() if s]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nm", required=True)
    ap.add_argument("--tbd", required=True)
    ap.add_argument("--frameworks", required=True)
    ap.add_argument("--cxx-runtime", action="store_true")
    ap.add_argument("--arch", choices=sorted(CPU), required=True)
    ap.add_argument("--ours", action="append", default=[], metavar="DYLIB",
                    help="also accept what this dylib of ours exports (for programs linked to it)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    allowed = libsystem_exports(a.tbd) | framework_exports(a.frameworks)
    libsystem_count = len(allowed)
    for lib in a.ours:
        out = subprocess.run([a.nm, "-g", "-U", "-j", lib], check=True, capture_output=True, text=True).stdout
        allowed.update(out.split())
    if libsystem_count < 1000 or "_recvmsg" not in allowed:  # a misread stub must not pass everything
        sys.exit(f"{a.tbd}: read {libsystem_count} exports, no _recvmsg: not a libSystem stub")
    bad = 0
    for path in a.files:
        if arch_of(path) != a.arch:
            print(f"{path}: not a Mach-O {a.arch} file ({arch_of(path) or 'not Mach-O'})")
            bad += 1
            continue
        syms = undefined(a.nm, path)
        foreign = [s for s in syms if s not in allowed and not (a.cxx_runtime and cxx_runtime(s))]
        for s in foreign:
            print(f"{path}: {s[1:] if s.startswith('_') else s}: not in macOS's libSystem or the named frameworks")
        bad += len(foreign)
        print(f"{path}: {len(syms)} undefined symbols, {len(foreign)} not provided by macOS")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
