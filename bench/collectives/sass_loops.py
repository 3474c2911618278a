#!/usr/bin/env python3
"""Static instruction counts of selscan_collectives' kernels: per kernel, the instructions of each loop body (from a
backward branch's target to the branch) in its SASS, by opcode class, so that a CUB variant and the hand-written one
can be compared without a GPU.

    cuobjdump -sass build/<dir>/bench/selscan_collectives | python3 bench/collectives/sass_loops.py [--json FILE]

A coll_kernel has one loop (the iteration loop, unroll 1): its body is one collective call plus the input fmaf's and
the accumulator adds that every variant of a case shares, so differences between the variants of a case are the
collectives' own. A rows_kernel's loop is one 32*K-step piece (load, 2x-1, store).
"""
import argparse
import json
import re
import sys

FUNC = re.compile(r"Function : (\S+)")
INST = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?\s*([^;]*);")
BRA_TARGET = re.compile(r"0x([0-9a-f]+)")


# The case structs of collectives.cu and the names its table gives them.
CASES = {"FwdScan": "fwd_scan", "BwdScan2": "bwd_scan2", "BwdScanFwdRev": "bwd_scan_fwd_rev",
         "BwdSuffixSum": "bwd_suffix_sum", "BwdSum2": "bwd_sum2", "WarpSum3": "warp_sum3"}


def demangle_short(name):
    m = re.match(r"_ZN4coll11coll_kernelINS_\d+(\w+?)(I6float2E|IfE)?ELi(\d)EEEvPKfPfi", name)
    if m:
        kind = {"I6float2E": "/complex", "IfE": "/real", None: "/real"}[m.group(2)]
        return f"{CASES.get(m.group(1), m.group(1))}{kind}", ["base", "hand", "cub"][int(m.group(3))]
    m = re.match(r"_ZN4coll11rows_kernelI(13__nv_bfloat16|f)Li(\d+)ELi(\d)EEEvPKT_PS\d_ll", name)
    if m:
        t = "bf16" if "bfloat16" in m.group(1) else "fp32"
        return f"rows/{t}/K{m.group(2)}", ["hand", "cub_vectorize", "cub_transpose", "cub_direct", "cub_blocked_vec"][int(m.group(3))]
    return name, ""


def classify(op):
    if op.startswith("SHFL"):
        return "shfl"
    if op in ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "FSEL", "FSETP"):
        return "fp32"
    if op.startswith("LDG") or op.startswith("STG") or op.startswith("LDS") or op.startswith("STS") or op in ("LD", "ST"):
        return "mem"
    if op in ("BRA", "BSSY", "BSYNC", "WARPSYNC", "BAR", "EXIT", "RET", "NOP", "CALL"):
        return "control"
    return "other"


def parse(text):
    funcs = {}
    cur = None
    for line in text.splitlines():
        m = FUNC.search(line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        if cur is None:
            continue
        m = INST.search(line)
        if m:
            addr = int(m.group(1), 16)
            op = m.group(3)
            args = m.group(5)
            funcs[cur].append((addr, op, args, m.group(4) or ""))
    return funcs


def loops(insts):
    out = []
    for addr, op, args, _ in insts:
        if op != "BRA":
            continue
        t = BRA_TARGET.search(args)
        if not t:
            continue
        target = int(t.group(1), 16)
        if target >= addr:
            continue
        body = [x for x in insts if target <= x[0] <= addr]
        counts = {}
        for _, o, _, _ in body:
            c = classify(o)
            counts[c] = counts.get(c, 0) + 1
        out.append({"from": hex(target), "to": hex(addr), "instructions": len(body), **counts,
                    "opcodes": sorted({o for _, o, _, _ in body})})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the counts here too")
    args = ap.parse_args()
    funcs = parse(sys.stdin.read())
    if not funcs:
        sys.exit("no SASS functions on stdin (pipe cuobjdump -sass <selscan_collectives> into this)")
    rows = []
    for name, insts in funcs.items():
        case, variant = demangle_short(name)
        ls = loops(insts)
        # The outermost loop (largest body) is the iteration loop; inner backward branches (CUB's guarded tails,
        # WARPSYNC retries) sit inside it.
        main_loop = max(ls, key=lambda x: x["instructions"]) if ls else None
        # Global loads and stores of the whole kernel by width (the rows kernels' vector and tail paths both).
        width = {}
        for _, op, _, mods in insts:
            if op in ("LDG", "STG"):
                w = next((x for x in ("128", "64", "U16", "16") if f".{x}" in mods), "32")
                key = f"{op}.{'16' if w in ('U16', '16') else w}"
                width[key] = width.get(key, 0) + 1
        rows.append({"case": case, "variant": variant, "kernel_instructions": len(insts), "loop": main_loop,
                     "loops": len(ls), "global_by_width": width})
    rows.sort(key=lambda r: (r["case"], r["variant"]))
    print(f"{'case':26} {'variant':16} {'kernel':>7} {'loop':>6} {'shfl':>5} {'fp32':>5} {'mem':>5} {'ctrl':>5} {'other':>6}"
          "  global loads/stores by width (rows)")
    for r in rows:
        lp = r["loop"] or {}
        print(f"{r['case']:26} {r['variant']:16} {r['kernel_instructions']:7d} {lp.get('instructions', 0):6d} "
              f"{lp.get('shfl', 0):5d} {lp.get('fp32', 0):5d} {lp.get('mem', 0):5d} {lp.get('control', 0):5d} "
              f"{lp.get('other', 0):6d}  {' '.join(f'{k}:{v}' for k, v in sorted(r['global_by_width'].items())) if r['case'].startswith('rows/') else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
