#!/usr/bin/env python3
"""iig_match_test.py <repo>: the hand-written stand-ins for iig's output (tests/driverkit/generated)
declare every method of the .iig files in src/dext/driverkit with the same parameter types, and an
IMPL parameter list (<Class>_<Method>_Args) for each method the glue implements with IMPL. iig
itself only runs on a Mac (check-dext); this keeps the Linux build from drifting from the .iig."""
import os
import re
import sys

top = sys.argv[1]
src = os.path.join(top, "src/dext/driverkit")
gen = os.path.join(top, "tests/driverkit/generated")
problems = []


def norm(params):
    """Parameter types only, whitespace-free: 'IOService* provider' -> 'IOService*'."""
    out = []
    for p in params.split(","):
        p = " ".join(p.replace("*", " * ").split())
        if not p:
            continue
        words = p.split(" ")
        if len(words) > 1 and re.match(r"^[A-Za-z_]\w*$", words[-1]):
            words = words[:-1]  # drop the parameter name
        out.append("".join(words))
    return out


for iig in sorted(f for f in os.listdir(src) if f.endswith(".iig")):
    cls = iig[:-4]
    text = open(os.path.join(src, iig)).read()
    text = re.sub(r"//[^\n]*", "", text)
    header = open(os.path.join(gen, cls + ".h")).read()
    impl_src = open(os.path.join(src, cls + ".cpp")).read()
    methods = re.findall(r"(\w+)\s*\(([^()]*)\)\s*(?:const\s*)?(?:override|LOCAL|\n\s*TYPE)", text)
    if not methods:
        problems.append(f"{iig}: no methods found")
    for name, params in methods:
        decls = re.findall(r"\b" + name + r"(?:_Impl)?\s*\(([^()]*)\)", header)
        if not any(norm(d) == norm(params) for d in decls):
            problems.append(f"{cls}.h lacks {name}({', '.join(norm(params))}) of {iig}")
        if re.search(r"IMPL\(\s*" + cls + r"\s*,\s*" + name + r"\s*\)", impl_src):
            m = re.search(r"#define " + cls + "_" + name + r"_Args (.*)", header)
            if not m or norm(m.group(1)) != norm(params):
                problems.append(f"{cls}.h: {cls}_{name}_Args differs from {iig}'s parameters")

for p in problems:
    print("FAIL:", p)
if problems:
    sys.exit(1)
print("PASS: generated headers match the .iig files")
