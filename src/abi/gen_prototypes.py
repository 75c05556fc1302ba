#!/usr/bin/env python3
"""Generate the ABI prototype headers and provider version scripts from rdma-core v44's own text.

For each of our libraries, the exports come from the committed symbol list of the stock
Debian 12 binary (src/abi/v44/<lib>.syms, `nm -D --with-symbol-versions`), and each export's
prototype from rdma-core's declaration, read with clang's JSON AST:
  libibverbs.so.1  /usr/include/infiniband/verbs.h (+ sa.h), then src/abi/rdma_core_v44_private.h
                   (driver.h, marshall.h, cmd_ioctl.h, cmd_write.h: not installed by Debian)
  libmlx5.so.1     /usr/include/infiniband/mlx5dv.h
  libefa.so.1      /usr/include/infiniband/efadv.h
  librdmacm.so.1   /usr/include/rdma/rdma_cma.h, rdma_verbs.h, rsocket.h (Debian: librdmacm-dev)
Every export must have a prototype, or generation fails. The headers are C++ only: they are
included where we define the functions, so a definition that differs is a compile error
("conflicting types"). Names are written as `(name)` so that function-like macros of our headers
(ibv_reg_mr, ibv_query_port) do not expand.

usage (from the repo root): src/abi/gen_prototypes.py [--check] [--stock-include DIR]
  --check  compare with the committed files instead of writing them (exit 1 on a difference)
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABI = os.path.join(ROOT, "src", "abi")
FACTS = os.path.join(ABI, "rdma_core_v44_private.h")
FACTS_LABEL = os.path.relpath(FACTS, ROOT)

# library: symbol list, stock headers searched in order, our headers the prototypes are compiled
# against (types they define are not re-declared), output header, provider version script.
LIBS = [
    dict(lib="libibverbs.so.1", sources=["<infiniband/verbs.h>", "<infiniband/sa.h>", f'"{FACTS}"'],
         ours=["infiniband/verbs.h", "infiniband/sa.h"], out="gen/ibverbs_prototypes.h",
         vscript=None),
    dict(lib="libmlx5.so.1", sources=["<infiniband/mlx5dv.h>"], ours=["infiniband/verbs.h"],
         out="gen/mlx5dv_prototypes.h", vscript="gen/libmlx5.map"),
    dict(lib="libefa.so.1", sources=["<infiniband/efadv.h>"], ours=["infiniband/verbs.h"],
         out="gen/efadv_prototypes.h", vscript="gen/libefa.map"),
    dict(lib="librdmacm.so.1", sources=["<rdma/rdma_cma.h>", "<rdma/rdma_verbs.h>", "<rdma/rsocket.h>"],
         ours=["rdma/rdma_cma.h", "rdma/rdma_verbs.h", "rdma/rsocket.h"], out="gen/rdmacm_prototypes.h",
         vscript="gen/librdmacm.map"),
]
# Typedef names the prototypes may use: the C library's and the verbs headers' own.
KNOWN_TYPEDEFS = {"size_t", "ssize_t", "bool", "FILE", "socklen_t", "nfds_t", "fd_set", "off_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t",
                  "__be16", "__be32", "__be64"}
BUILTINS = {"void", "double", "float", "char", "int", "unsigned", "long", "short", "signed", "const", "volatile", "struct",
            "union", "enum", "_Bool"}


def omissions(lib):
    """Regexes of the stock exports we intentionally lack (src/abi/v44/omissions.txt)."""
    out = []
    for line in open(os.path.join(ABI, "v44", "omissions.txt")):
        if line.strip() and not line.startswith("#"):
            name, regex, _reason = line.split(None, 2)
            if name == lib:
                out.append(re.compile(regex))
    return out


def read_syms(lib):
    """[(kind, name, node, default)] of the stock library, without the version-node entries and
    without the intended omissions."""
    rows = []
    skip = omissions(lib)
    for line in open(os.path.join(ABI, "v44", lib + ".syms")):
        if line.startswith("#") or not line.strip():
            continue
        kind, sym = line.split()
        if kind == "A" or any(r.fullmatch(sym) for r in skip):
            continue
        name, node = re.match(r"([^@]+)@@?(.+)", sym).groups()
        rows.append((kind, name, node, "@@" in sym))
    return rows


_AST_CACHE = {}


def clang_ast(code, include_dirs):
    """clang's JSON AST of a C translation unit (memoised: several libraries parse the same one)."""
    key = (code, tuple(include_dirs))
    if key not in _AST_CACHE:
        _AST_CACHE[key] = _clang_ast(code, include_dirs)
    return _AST_CACHE[key]


def _clang_ast(code, include_dirs):
    args = ["clang", "-xc", "-std=gnu11", "-fsyntax-only", "-Xclang", "-ast-dump=json", "-"]
    for d in reversed(include_dirs):
        args[1:1] = ["-I", d]
    res = subprocess.run(args, input=code.encode(), capture_output=True)
    if res.returncode != 0:
        sys.exit(f"gen_prototypes: clang failed:\n{res.stderr.decode()}")
    return json.loads(res.stdout)


def enum_underlying(decl):
    """The type GCC/clang give a C enum without a fixed type: unsigned int unless a value is negative."""
    value = -1
    for c in decl.get("inner", []):
        if c.get("kind") != "EnumConstantDecl":
            continue
        explicit = [i for i in c.get("inner", []) if "value" in i]
        value = int(explicit[0]["value"]) if explicit else value + 1
        if value < 0:
            return "int"
    return "unsigned int"


def declared_tags(ast):
    """{'enum X': decl} and {'struct X'/'union X'} with complete definitions, and typedef names."""
    enums, records, typedefs = {}, set(), set()
    for d in ast["inner"]:
        k, n = d.get("kind"), d.get("name")
        if not n:
            continue
        if k == "EnumDecl" and d.get("inner"):
            enums["enum " + n] = d
        elif k == "RecordDecl" and d.get("completeDefinition"):
            records.add(f"{d['tagUsed']} {n}")
        elif k == "TypedefDecl":
            typedefs.add(n)
    return enums, records, typedefs


def with_name(qual, name):
    """`T *` + n -> `T *n`; function pointers and arrays get the name inside."""
    if "(*)" in qual:
        return qual.replace("(*)", f"(*{name})", 1)
    m = re.match(r"(.*?)(\[.*\])$", qual)
    if m:
        return f"{m.group(1).rstrip()} {name}{m.group(2)}"
    return qual + name if qual.endswith("*") else f"{qual} {name}"


def prototype(decl):
    """(return type, [param strings], variadic) of a FunctionDecl."""
    qual = decl["type"]["qualType"]
    depth = 0
    for i in range(len(qual) - 1, -1, -1):  # the parameter list is the last top-level (...)
        depth += {")": 1, "(": -1}.get(qual[i], 0)
        if depth == 0:
            ret = qual[:i].strip()
            break
    params = [with_name(p["type"]["qualType"], p.get("name") or f"arg{n}")
              for n, p in enumerate(x for x in decl.get("inner", []) if x.get("kind") == "ParmVarDecl")]
    return ret, params, bool(decl.get("variadic"))


def collect(sources, stock_include):
    """name -> (decl, source header) for every non-static function and extern variable, first source
    wins; and the enumerations: 'enum X' -> (decl, source header)."""
    found = {}
    tag_decls = {}
    for src in sources:
        ast = clang_ast(f"#include {src}\n", [stock_include])
        label = os.path.relpath(src.strip('"'), ROOT) if src.startswith('"') else src.strip("<>")
        enums, _, _ = declared_tags(ast)
        for k, v in enums.items():
            if label != FACTS_LABEL or k not in tag_decls:
                tag_decls.setdefault(k, (v, label))
        for d in ast["inner"]:
            k, n = d.get("kind"), d.get("name")
            if k == "FunctionDecl" and d.get("storageClass") != "static" and not d.get("inline"):
                found.setdefault(n, (d, label))
            elif k == "VarDecl" and d.get("storageClass") == "extern":
                found.setdefault(n, (d, label))
    return found, tag_decls


def generate(spec, stock_include):
    syms = read_syms(spec["lib"])
    wanted = []
    for kind, name, node, default in syms:
        if name not in wanted:
            wanted.append(name)
    found, stock_enums = collect(spec["sources"], stock_include)
    ours_ast = clang_ast("".join(f"#include <{h}>\n" for h in spec["ours"]),
                         [os.path.join(ROOT, "include"), os.path.join(ROOT, "src")])
    our_enums, _, our_typedefs = declared_tags(ours_ast)
    missing = [n for n in wanted if n not in found]
    if missing:
        sys.exit(f"gen_prototypes: no prototype for {spec['lib']} exports: {' '.join(missing)}")

    lines, tags, opaque_enums = [], set(), {}
    by_source = {}
    for name in sorted(wanted):
        decl, label = found[name]
        by_source.setdefault(label, []).append((name, decl))
    for label in sorted(by_source):
        lines.append(f"/* {label} */")
        for name, decl in by_source[label]:
            if decl["kind"] == "VarDecl":
                text = f"extern {with_name(decl['type']['qualType'], '(' + name + ')')};"
                quals = [decl["type"]["qualType"]]
            else:
                ret, params, variadic = prototype(decl)
                args = ", ".join(params + (["..."] if variadic else [])) or "void"
                text = f"{ret}{'' if ret.endswith('*') else ' '}({name})({args});"
                quals = [decl["type"]["qualType"]]
            lines.append(text)
            for q in quals:
                for tag in re.findall(r"\b(?:struct|union|enum) \w+", q):
                    tags.add(tag)
                for word in re.findall(r"\b[A-Za-z_]\w*\b", re.sub(r"\b(?:struct|union|enum) \w+", "", q)):
                    if word in BUILTINS or word in KNOWN_TYPEDEFS or word in our_typedefs:
                        continue
                    sys.exit(f"gen_prototypes: {name} uses type name '{word}' unknown to our headers")
                # A record passed by value would need its layout: refuse rather than guess.
                for part in re.split(r"[(),]", q):
                    if re.fullmatch(r"\s*(const )?(struct|union) \w+\s*", part):
                        sys.exit(f"gen_prototypes: {name} passes {part.strip()} by value")
    full_enums = []
    for tag in sorted(tags):
        if tag.startswith("enum ") and tag not in our_enums:
            if tag not in stock_enums:
                sys.exit(f"gen_prototypes: {tag} is not defined by the stock headers")
            decl, label = stock_enums[tag]
            if label == FACTS_LABEL:  # recorded by us: our code needs its enumerators
                full_enums.append(decl)
            else:
                opaque_enums[tag] = enum_underlying(decl)

    out = ["/* Generated by src/abi/gen_prototypes.py from rdma-core v44's declarations; do not edit.",
           f" * Every export of the stock {spec['lib']} (src/abi/v44/{spec['lib']}.syms) with the prototype",
           " * rdma-core declares for it. Included where we define the exports: a definition that differs",
           " * from rdma-core's is a compile error. */",
           "#pragma once",
           "#ifndef __cplusplus",
           "#error \"C++ only: a mismatch must be a conflicting declaration\"",
           "#endif",
           "#include <stdio.h>",
           "#include <sys/types.h>"]
    out += [f"#include <{h}>" for h in spec["ours"]]
    out.append("")
    records = sorted(t for t in tags if not t.startswith("enum "))
    if records:
        out.append("/* Types the prototypes only point to. */")
        out += [f"{t};" for t in records]
    for decl in full_enums:
        out.append(f"/* {FACTS_LABEL} */")
        out.append(f"enum {decl['name']} {{")
        value = -1
        for c in decl["inner"]:
            explicit = [i for i in c.get("inner", []) if "value" in i]
            value = int(explicit[0]["value"]) if explicit else value + 1
            out.append(f"  {c['name']} = {value},")
        out.append("};")
    if opaque_enums:
        out.append("/* Enumerations our headers do not define; a C enum's type as the compiler gives it. */")
        out += [f"{t} : {u};" for t, u in sorted(opaque_enums.items())]
    out.append("")
    out.append('extern "C" {')
    out += [re.sub(r"\b_Bool\b", "bool", l) for l in lines]
    out.append("}")
    return "\n".join(out) + "\n", syms


def version_script(spec, syms):
    """Nodes and members of the stock library. Which version of a name is the default is set by
    .symver in the code that defines both (src/providers/mlx5/dv/context.cpp)."""
    nodes = []
    for line in open(os.path.join(ABI, "v44", spec["lib"] + ".syms")):
        parts = line.split()
        if len(parts) == 2 and parts[0] == "A":
            nodes.append(parts[1])
    nodes.sort(key=lambda n: [int(x) for x in re.findall(r"\d+", n)])
    # A non-default version (name@node) is listed on its node too, or `local: *` would hide it.
    members = {n: sorted(name for kind, name, node, default in syms if node == n) for n in nodes}
    out = [f"/* Generated by src/abi/gen_prototypes.py from src/abi/v44/{spec['lib']}.syms; do not edit.",
           f"   The version nodes of rdma-core v44's {spec['lib']}, each export on its node. */"]
    prev = None
    for n in nodes:
        body = "".join(f" {m};" for m in members[n])
        glob = f" global:{body}" if body else ""
        local = " local: *;" if prev is None else ""
        out.append(f"{n} {{{glob}{local} }}{' ' + prev if prev else ''};")
        prev = n
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--stock-include", default="/usr/include")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.stock_include, "infiniband", "mlx5dv.h")):
        print(f"SKIP: no rdma-core headers in {a.stock_include} (Debian: libibverbs-dev)")
        sys.exit(77)
    if not os.path.exists(os.path.join(a.stock_include, "rdma", "rdma_cma.h")):
        print(f"SKIP: no librdmacm headers in {a.stock_include} (Debian: librdmacm-dev)")
        sys.exit(77)
    files = {}
    for spec in LIBS:
        header, syms = generate(spec, a.stock_include)
        files[spec["out"]] = header
        if spec["vscript"]:
            files[spec["vscript"]] = version_script(spec, syms)
    bad = 0
    for rel, text in files.items():
        path = os.path.join(ABI, rel)
        if a.check:
            old = open(path).read() if os.path.exists(path) else None
            if old != text:
                print(f"DIFFERS: src/abi/{rel} is not what the generator produces")
                bad = 1
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    if a.check and not bad:
        print(f"PASS: {len(files)} generated files reproduce byte for byte")
    sys.exit(bad)


if __name__ == "__main__":
    main()
