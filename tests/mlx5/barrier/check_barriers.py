#!/usr/bin/env python3
"""Checks that the stores handing work to the ConnectX and the loads taking work back are ordered
against the device, in the instructions the compiler emits for aarch64 and x86-64.

Compiles (clang, -O2, freestanding: no C library for the target is needed) the provider's paths
(paths.cpp over src/providers/mlx5/doorbells.h) and the driver core's command queue and event
queue (src/mlx5/core/cmd_queue.cpp, eq.cpp, unchanged), disassembles them with llvm-objdump and
reduces each function to its memory accesses, calls and barriers. The expectations are rdma-core's
(util/udma_barrier.h for the instructions; providers/mlx5 qp.c, cq.c for where they go) and
Linux's mlx5_core (cmd.c, eq.c) for the core.

usage: check_barriers.py CLANG OBJDUMP SRC_ROOT WORK_DIR [--paths FILE] [--expect-fail]
  --paths FILE     compile FILE instead of paths.cpp (the self-test hands in CPU-only fences)
  --expect-fail    exit 0 only if some expectation fails (proves the check can fail)
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Barrier instructions as objdump prints them.
BARRIERS = {"dmb oshst", "dmb oshld", "dsb st", "dmb ish", "dmb ishst", "dmb ishld", "dsb sy", "sfence", "lfence",
            "mfence"}

# Per target and function: which accesses to keep beside barriers (S stores, L loads, C calls), and
# the sequence the reduced function must contain, contiguously (whole: it must be exactly that).
EXPECT = {
    "aarch64": [
        # post_send_db: WQEs | dmb oshst | record | dsb st (mmio_wc_start) | UAR | dsb st (flush)
        ("paths", "path_send_doorbell", "S", "whole", ["dmb oshst", "S", "dsb st", "S", "dsb st"]),
        # mlx5_post_recv / SRQ: WQEs | dmb oshst | record
        ("paths", "path_recv_doorbell", "S", "whole", ["dmb oshst", "S"]),
        # mlx5_get_next_cqe: owner byte | dmb oshld | the CQE's contents
        ("paths", "path_poll_cqe", "L", "whole", ["L", "dmb oshld", "L"]),
        # __mlx5_cq_clean: moved CQEs | dmb oshst | consumer index
        ("paths", "path_cq_clean_ci", "S", "whole", ["dmb oshst", "S"]),
        # mlx5_arm_cq: record | dsb st | UAR | dsb st
        ("paths", "path_cq_arm", "S", "whole", ["S", "dsb st", "S", "dsb st"]),
        # Linux cmd.c: entry | barrier | ownership byte | barrier | doorbell (HAL write32, a call)
        ("cmd_queue", "melon::mlx5::core::CmdQueue::exec(", "SC", "contains", ["dmb oshst", "S", "dmb oshst", "C"]),
        # The owner bit seen, then the output: a barrier before the caller reads it (two returns).
        ("cmd_queue", "melon::mlx5::core::CmdQueue::wait(", "LC", "count", ["dmb oshld", 2]),
        # Linux eq.c: owner bit | dma_rmb | the EQE's contents (dispatch_eqe, a call)
        ("eq", "melon::mlx5::core::Hca::drain_eq(", "LC", "contains", ["L", "dmb oshld", "C"]),
    ],
    "x86_64": [
        # x86-64: udma_to_device_barrier is a compiler barrier only; the flushes are sfence.
        ("paths", "path_send_doorbell", "S", "whole", ["S", "sfence", "S", "sfence"]),
        ("paths", "path_recv_doorbell", "S", "whole", ["S"]),
        ("paths", "path_poll_cqe", "L", "whole", ["L", "lfence", "L"]),
        ("paths", "path_cq_arm", "S", "whole", ["S", "sfence", "S", "sfence"]),
        ("cmd_queue", "melon::mlx5::core::CmdQueue::wait(", "LC", "count", ["lfence", 2]),
        ("eq", "melon::mlx5::core::Hca::drain_eq(", "LC", "contains", ["lfence", "C"]),
    ],
}
TRIPLES = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}


def compile_and_dump(clang, objdump, src_root, work, arch, name, source):
    obj = os.path.join(work, f"{arch}-{name}.o")
    cmd = [clang, f"--target={TRIPLES[arch]}", "-std=c++20", "-O2", "-ffreestanding", "-fno-exceptions", "-fno-rtti",
           "-nostdinc++", "-isystem", os.path.join(HERE, "include"), "-I", os.path.join(src_root, "src"), "-c", source,
           "-o", obj]
    subprocess.run(cmd, check=True)
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", obj], check=True, capture_output=True,
                         text=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = re.match(r"^\s+[0-9a-f]+:\s+(\S+)\s*(.*)$", line)
        if m and cur is not None:
            cur.append((m.group(1), m.group(2).split("<")[0].strip()))
    return funcs


def kind(arch, op, args):
    """B:<barrier>, S (store), L (load), C (call) or None for an instruction."""
    text = f"{op} {args}".strip().replace("\t", " ")
    text = re.sub(r"\s+", " ", text)
    if text in BARRIERS:
        return text
    if arch == "aarch64":
        if op in ("bl", "blr"):
            return "C"
        if re.match(r"^(st(l?)(r|ur|p|xr|lxr)[bhw]?|stlr[bh]?)$", op):
            return "S"
        if re.match(r"^(ld(a?)(r|ur|p|xr|axr)(s?)[bhw]?|ldar[bh]?)$", op):
            return "L"
        return None
    if op.startswith("call"):
        return "C"
    if op.startswith("mov") or op.startswith("cmp") or op.startswith("add") or op.startswith("or"):
        parts = [p.strip() for p in re.split(r",(?![^(]*\))", args)]
        if len(parts) == 2:
            if "(" in parts[1] and op.startswith("mov"):
                return "S"
            if "(" in parts[0]:
                return "L"
    return None


def reduce(arch, insns, keep):
    seq = []
    for op, args in insns:
        k = kind(arch, op, args)
        if k is None:
            continue
        if k in BARRIERS or k in keep:
            seq.append(k)
    return seq


def contains(seq, pat):
    return any(seq[i:i + len(pat)] == pat for i in range(len(seq) - len(pat) + 1))


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    expect_fail = "--expect-fail" in argv
    paths = os.path.join(HERE, "paths.cpp")
    if "--paths" in argv:
        paths = argv[argv.index("--paths") + 1]
        args.remove(paths)
    clang, objdump, src_root, work = args
    os.makedirs(work, exist_ok=True)
    sources = {"paths": paths, "cmd_queue": os.path.join(src_root, "src/mlx5/core/cmd_queue.cpp"),
               "eq": os.path.join(src_root, "src/mlx5/core/eq.cpp")}
    failures, checked = [], 0
    for arch, rows in EXPECT.items():
        dumps = {}
        for name in sorted({r[0] for r in rows}):
            dumps[name] = compile_and_dump(clang, objdump, src_root, work, arch, name, sources[name])
        for obj, func, keep, how, pat in rows:
            matches = [f for f in dumps[obj] if f == func or f.startswith(func)]
            if len(matches) != 1:
                failures.append(f"{arch} {func}: {len(matches)} functions of that name in {obj}")
                continue
            seq = reduce(arch, dumps[obj][matches[0]], set(keep))
            checked += 1
            if how == "whole":
                ok = seq == pat
            elif how == "contains":
                ok = contains(seq, pat)
            else:
                ok = seq.count(pat[0]) >= pat[1]
            line = f"{arch:8} {func:42} {how:8} {pat}: {'ok' if ok else 'FAIL'}"
            print(line)
            if not ok:
                failures.append(f"{line}\n         reduced to {seq}")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"{checked} functions checked, {len(failures)} failed")
    if expect_fail:
        if not failures:
            print("expected the check to fail on CPU-only fences, and it passed", file=sys.stderr)
            return 1
        return 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
