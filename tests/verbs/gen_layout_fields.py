#!/usr/bin/env python3
"""Regenerate layout_fields.inc from OUR include/infiniband/verbs.h (clang's JSON AST): every
struct/union with its named top-level fields, a few nested/anonymous member paths, and every
IBV_*/IB_UVERBS_* enumerator. layout_oracle_test then compares each row with the stock header.

usage: tests/verbs/gen_layout_fields.py > tests/verbs/layout_fields.inc   (from the repo root)
"""
import json
import subprocess
import sys

PREFIXES = ("ibv_", "verbs_", "ib_uverbs", "_ibv")
# Members reached through anonymous unions or nested structs: offsetof() takes the path.
NESTED = [
    ("ibv_wc", "imm_data"), ("ibv_wc", "invalidated_rkey"),
    ("ibv_send_wr", "imm_data"), ("ibv_send_wr", "invalidate_rkey"),
    ("ibv_send_wr", "wr.rdma.remote_addr"), ("ibv_send_wr", "wr.rdma.rkey"),
    ("ibv_send_wr", "wr.atomic.remote_addr"), ("ibv_send_wr", "wr.atomic.compare_add"),
    ("ibv_send_wr", "wr.atomic.swap"), ("ibv_send_wr", "wr.atomic.rkey"),
    ("ibv_send_wr", "wr.ud.ah"), ("ibv_send_wr", "wr.ud.remote_qpn"),
    ("ibv_send_wr", "wr.ud.remote_qkey"), ("ibv_send_wr", "qp_type.xrc.remote_srqn"),
    ("ibv_send_wr", "bind_mw.mw"), ("ibv_send_wr", "bind_mw.rkey"),
    ("ibv_send_wr", "bind_mw.bind_info"), ("ibv_send_wr", "tso.hdr"),
    ("ibv_send_wr", "tso.hdr_sz"), ("ibv_send_wr", "tso.mss"),
    ("ibv_odp_caps", "per_transport_caps.ud_odp_caps"), ("ibv_ops_wr", "tm.add.mask"),
    ("ibv_ops_wr", "tm.handle"), ("ibv_flow_spec", "hdr.size"), ("ibv_flow_spec", "flow_count"),
    ("ibv_values_ex", "raw_clock"), ("ib_uverbs_flow_action_esp_encap", "val_ptr"),
    ("ib_uverbs_flow_action_esp_encap", "next_ptr"),
]


def main():
    ast = json.loads(subprocess.run(
        ["clang", "-xc", "-Iinclude", "-fsyntax-only", "-Xclang", "-ast-dump=json", "-"],
        input=b"#include <infiniband/verbs.h>\n", capture_output=True, check=True).stdout)
    out = ["/* Generated once from include/infiniband/verbs.h (clang AST): every struct, union, field and",
           " * enumerator it declares. tests/verbs/layout_oracle_test.cpp compares ours with the stock header. */"]
    enums = []
    for d in ast["inner"]:
        kind, name = d.get("kind"), d.get("name")
        if kind == "RecordDecl" and d.get("completeDefinition") and name and name.startswith(PREFIXES):
            tag = d["tagUsed"]
            out.append(f"MELON_LAYOUT_{'STRUCT' if tag == 'struct' else 'UNION'}({name})")
            for f in d.get("inner", []):
                if f.get("kind") == "FieldDecl" and f.get("name"):
                    out.append(f"MELON_LAYOUT_FIELD({tag}, {name}, {f['name']})")
        elif kind == "EnumDecl":
            enums += [c["name"] for c in d.get("inner", []) if c.get("kind") == "EnumConstantDecl"
                      and c["name"].startswith(("IBV_", "IB_UVERBS_"))]
    out.append("/* anonymous members and nested paths */")
    out += [f"MELON_LAYOUT_FIELD(struct, {s}, {f})" for s, f in NESTED]
    out.append("/* enumeration constants */")
    out += [f"MELON_LAYOUT_ENUM({e})" for e in enums]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
