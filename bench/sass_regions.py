#!/usr/bin/env python3
"""Where a kernel's instructions go, per state update, from an Nsight Compute source-counter profile (issue #20).

    ncu --clock-control none --section SourceCounters -k regex:<kernel> -c 1 -o prof <program> [args]
    ncu --import prof.ncu-rep --page source --csv --print-source sass > prof.csv
    python3 bench/sass_regions.py prof.csv --shape 8x1536x2048:16

(`tools/gpu-check.sh build kprof` does all three for the thread-states forward and backward on a benchmark row.)
Prints the kernel's instructions per state update (warp instructions x 32 / (Bt*D*L*N)) by opcode, then by region:
the SASS instructions grouped by how many times each ran. A fully unrolled loop body runs all its instructions equally
often, so a group is a loop level (the forward's state loop, its per-tile staging and epilogue; the backward's
sweep, its forward pass, the per-item loops), and `runs/upd` says how often per state update it ran (1/16: once per 16
updates of a thread, i.e. per 4 steps of 4 states). Each region comes with its share of the warp-stall samples and
its opcode mix, so a change can be aimed at the region that costs and checked against it afterwards.
"""

import argparse
import collections
import csv
import gzip
import re
import sys


def parse_shape(text):
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+):(\d+)", text)
    if not m:
        raise SystemExit(f"--shape: expected BtxDxL:N (e.g. 8x1536x2048:16), got {text!r}")
    bt, d, L, n = map(int, m.groups())
    return bt * d * L * n


def opcode(sass):
    s = sass.strip()
    s = re.sub(r"^@!?U?P[T0-9]+\s+", "", s)  # a predicate guard
    return s.split()[0].split(".")[0] if s else "?"


def number(text):
    text = text.replace(",", "").strip()
    return float(text) if text else 0.0


def read_rows(path):
    """(kernel name, [(address, sass, executed warp instructions, stall samples)]) of the first kernel in the CSV."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    name = next((r[1] for r in rows if len(r) > 1 and r[0] == "Kernel Name"), "?")
    try:
        hi = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    except StopIteration:
        raise SystemExit(f"{path}: no 'Address' header: not an `ncu --page source --csv` export")
    hdr = rows[hi]
    try:
        i_src, i_exe = hdr.index("Source"), hdr.index("Instructions Executed")
    except ValueError as e:
        raise SystemExit(f"{path}: column missing ({e}); columns: {hdr}")
    i_st = hdr.index("Warp Stall Sampling (All Samples)") if "Warp Stall Sampling (All Samples)" in hdr else None
    out = []
    for r in rows[hi + 1:]:
        if len(r) <= i_exe or not r[0].startswith("0x"):
            if r and r[0] == "Kernel Name":
                break  # the next kernel's table
            continue
        out.append((r[0], r[i_src], number(r[i_exe]), number(r[i_st]) if i_st is not None else 0.0))
    return name, out


def regions_of(rows, scale):
    """[(runs per update, [rows])], the heaviest region first: instructions that ran equally often (to 0.5%), so
    slightly different trip counts of one loop level (a pass that skips the last tile) stay apart only when they
    differ by more than that."""
    groups = collections.defaultdict(list)
    for row in rows:
        if row[2] <= 0:
            continue
        key = round(row[2] * scale, 6)
        match = next((k for k in groups if abs(k - key) <= 0.005 * max(k, key)), None)
        groups[key if match is None else match].append(row)
    return sorted(groups.items(), key=lambda kv: -sum(r[2] for r in kv[1]))


def self_test():
    """The parser and the arithmetic on a made-up export: a 4-instruction loop run 512 times by 8 warps, a
    2-instruction prologue once per warp, one line never run, and a second kernel's table that must be ignored."""
    import os
    import tempfile
    lines = [
        '"Kernel Name","void k<float>(Args)",',
        '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"',
        '"0x10","S2R R0, SR_TID.X","2","8"',
        '"0x20","@!P1 LDG.E R2, desc[UR4][R4.64]","6","8"',
        '"0x30","MUFU.EX2 R3, R3","40","4,096"',
        '"0x40","FFMA.FTZ R5, R3, R5, R6","30","4,096"',
        '"0x50","@P0 FMUL R6, R6, R7","20","4,096"',
        '"0x60","BRA 0x30","2","4,096"',
        '"0x70","EXIT","0","0"',
        '"Kernel Name","void other(Args)",',
        '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"',
        '"0x10","FADD R0, R0, R1","9","1,000,000"',
    ]
    fd, path = tempfile.mkstemp(suffix=".csv")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        name, rows = read_rows(path)
    finally:
        os.unlink(path)
    assert name == "void k<float>(Args)", name
    assert len(rows) == 7, rows
    assert [opcode(r[1]) for r in rows] == ["S2R", "LDG", "MUFU", "FFMA", "FMUL", "BRA", "EXIT"]
    updates = parse_shape("1x4x64:16")  # 4096 updates: 8 warps x 512 trips x 32 lanes / 4096 = 32 per update
    assert updates == 4096
    scale = 32.0 / updates
    regions = regions_of(rows, scale)
    assert [len(rs) for _, rs in regions] == [4, 2], regions
    assert abs(regions[0][0] - 32.0) < 1e-9 and abs(regions[1][0] - 0.0625) < 1e-9, [k for k, _ in regions]
    assert abs(sum(r[2] for r in rows) * scale - (4 * 32 + 2 * 0.0625)) < 1e-9
    try:
        parse_shape("8x1536x2048")
    except SystemExit:
        pass
    else:
        raise AssertionError("a shape without :N was accepted")
    print("sass_regions self-test: ok")
    return 0


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    ap.add_argument("--shape", required=True, help="the call's BtxDxL:N, for the per-update scale")
    ap.add_argument("--top", type=int, default=8, help="regions to list (default 8)")
    ap.add_argument("--self-test", action="store_true", help="check the parser on a made-up export, then exit")
    args = ap.parse_args(argv)
    updates = parse_shape(args.shape)
    name, rows = read_rows(args.csv)
    if not rows:
        raise SystemExit(f"{args.csv}: no SASS rows")
    scale = 32.0 / updates
    total = sum(r[2] for r in rows)
    stalls = sum(r[3] for r in rows) or 1.0
    print(f"{name}")
    print(f"shape {args.shape}: {total:,.0f} warp instructions, {total * scale:.2f} per state update, "
          f"{len(rows)} SASS lines")
    by_op = collections.Counter()
    for _, sass, n, _ in rows:
        by_op[opcode(sass)] += n
    print("by opcode (per update): " + ", ".join(f"{op} {n * scale:.2f}" for op, n in by_op.most_common(16)))

    regions = regions_of(rows, scale)
    print(f"\n{'region (runs/upd)':>18} {'lines':>6} {'inst/upd':>9} {'share':>6} {'stalls':>7}  span, top opcodes")
    for key, rs in regions[:args.top]:
        n = sum(r[2] for r in rs)
        st = sum(r[3] for r in rs)
        ops = collections.Counter()
        for r in rs:
            ops[opcode(r[1])] += 1
        span = f"{rs[0][0]}..{rs[-1][0]}"
        mix = " ".join(f"{o}:{c}" for o, c in ops.most_common(10))
        print(f"{key:18.5f} {len(rs):6d} {n * scale:9.2f} {100 * n / total:5.1f}% {100 * st / stalls:6.1f}%  "
              f"{span}, {mix}")
    rest = regions[args.top:]
    if rest:
        n = sum(r[2] for _, rs in rest for r in rs)
        print(f"{'others':>18} {sum(len(rs) for _, rs in rest):6d} {n * scale:9.2f} {100 * n / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
