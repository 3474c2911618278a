#!/usr/bin/env python3
"""A thread-states forward instance's instructions per state update, estimated from its SASS alone (issue #20).

    cuobjdump -sass build/ci/CMakeFiles/selscan_objects.dir/kernels/fwd/bf16.cu.o > fwd.sass
    python3 bench/sass_hot.py fwd.sass 'fwd_ts_kernel.*Li5ELb0ELi0ELb1E'     # bf16, 5 blocks an SM, packed B/C

For a change to the kernel when no GPU is at hand: the count of the path a full tile takes, per state update, on the
same footing for two builds. How: the state loop is the innermost loop with 16 MUFU.EX2 (4 steps x 4 states); the
tile loop is the smallest loop around it with the tile's two barriers; a tile runs the state loop TT/4 times (--tt,
default 32) and everything else in the tile loop once, for 4*TT updates a thread. Not counted: basic blocks with element-wise global loads or stores
(the ragged-tail and unaligned paths), scalar 32-bit stores (the chunk states x, once per 2048 steps), and loops other
than those two. What it cannot see: which side of a data-dependent branch runs, so a block behind a test that a full
tile never passes (and that holds none of those instructions) is counted. On 79ef9ab..b13dc92's kernels it gave 12.70
and 13.62 for the instances that serve 8x1536x2048:16 and 4x5120x2048:16, where ncu measured 12.80 and 13.35 (runs
124 and 131): a ruler for differences between two builds, within a few percent in absolute terms.
"""

import argparse
import re
import sys

COLD = re.compile(r"LDG\.E\.U16|STG\.E\.U16|LDG\.E\.U8|STG\.E\.U8|\bLDG\.E |\bSTG\.E |LDG\.E\.CONSTANT |STG\.E\.64")
BRANCH = re.compile(r"\bBRA\b(?:\s+!?U?P\w+,)?\s+(0x[0-9a-f]+)")


def functions(path):
    """{name: [(address, instruction)]} of a `cuobjdump -sass` listing."""
    out, cur = {}, None
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                cur = m.group(1)
                out[cur] = []
                continue
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", line)
            if m and cur is not None:
                out[cur].append((int(m.group(1), 16), m.group(2)))
    return out


def back_edges(ins):
    """(target, branch address) of every branch to an address at or before itself: the function's loops."""
    res = []
    for a, t in ins:
        m = BRANCH.search(t)
        if m and int(m.group(1), 16) <= a:
            res.append((int(m.group(1), 16), a))
    return res


def blocks_of(body):
    targets = set()
    for _, t in body:
        m = BRANCH.search(t)
        if m:
            targets.add(int(m.group(1), 16))
    blocks, cur = [], []
    for a, t in body:
        if a in targets and cur:
            blocks.append(cur)
            cur = []
        cur.append((a, t))
        if re.search(r"\bBRA\b|\bEXIT\b", t):
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def hot_path(ins, tt):
    """(instructions a thread runs for one full tile, the state loop's length, blocks skipped as cold)."""
    loops = back_edges(ins)

    def count(lp, what):
        return sum(1 for a, t in ins if lp[0] <= a <= lp[1] and what in t)

    state = [lp for lp in loops if count(lp, "MUFU.EX2") == 16]
    if not state:
        raise SystemExit("no state loop (a loop with 16 MUFU.EX2)")
    st = min(state, key=lambda lp: lp[1] - lp[0])  # the innermost: a tile loop may hold exactly its 16 as well
    # The tile loop: the smallest loop around the state loop with the tile's two barriers. (A branch back from code the
    # compiler moved out of line, such as an mbarrier wait's retry, also looks like a loop, a larger one.)
    around = [lp for lp in loops if lp != st and lp[0] <= st[0] and st[1] <= lp[1] and count(lp, "BAR.SYNC") >= 2]
    if not around:
        raise SystemExit("no tile loop (a loop with two barriers) around the state loop")
    tile = min(around, key=lambda lp: lp[1] - lp[0])
    others = [lp for lp in loops if lp not in (st, tile) and tile[0] <= lp[0] and lp[1] <= tile[1]]
    body = [(a, t) for a, t in ins if tile[0] <= a <= tile[1]]
    total, cold = 0, 0
    for b in blocks_of(body):
        a0 = b[0][0]
        if any(COLD.search(t) for _, t in b) or any(lo <= a0 <= hi for lo, hi in others):
            cold += 1
            continue
        total += len(b) * (tt // 4 if st[0] <= a0 <= st[1] else 1)
    return total, (st[1] - st[0]) // 16 + 1, cold


def self_test():
    sass = """
        Function : k_fake
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0020*/                   LDS.128 R4, [R0] ;
        /*0030*/                   MUFU.EX2 R1, R1 ;
        /*0040*/                   MUFU.EX2 R1, R1 ;
        /*0050*/                   MUFU.EX2 R1, R1 ;
        /*0060*/                   MUFU.EX2 R1, R1 ;
        /*0070*/                   MUFU.EX2 R1, R1 ;
        /*0080*/                   MUFU.EX2 R1, R1 ;
        /*0090*/                   MUFU.EX2 R1, R1 ;
        /*00a0*/                   MUFU.EX2 R1, R1 ;
        /*00b0*/                   MUFU.EX2 R1, R1 ;
        /*00c0*/                   MUFU.EX2 R1, R1 ;
        /*00d0*/                   MUFU.EX2 R1, R1 ;
        /*00e0*/                   MUFU.EX2 R1, R1 ;
        /*00f0*/                   MUFU.EX2 R1, R1 ;
        /*0100*/                   MUFU.EX2 R1, R1 ;
        /*0110*/                   MUFU.EX2 R1, R1 ;
        /*0120*/                   MUFU.EX2 R1, R1 ;
        /*0130*/              @!P0 BRA 0x20 ;
        /*0140*/               @P1 BRA 0x180 ;
        /*0150*/                   LDG.E.U16 R2, desc[UR4][R2.64] ;
        /*0160*/                   STG.E.U16 desc[UR4][R2.64], R2 ;
        /*0170*/                   BRA 0x190 ;
        /*0180*/                   STG.E.128 desc[UR4][R2.64], R4 ;
        /*0190*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*01a0*/              @!P2 BRA 0x10 ;
        /*01b0*/                   EXIT ;
    """
    import os
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".sass")
    with os.fdopen(fd, "w") as f:
        f.write(sass)
    try:
        fns = functions(path)
    finally:
        os.unlink(path)
    ins = fns["k_fake"]
    assert len(ins) == 28, len(ins)
    total, state_len, cold = hot_path(ins, 32)
    # the tile loop 0x10..0x1a0: BAR (1) + the state loop 0x20..0x130 (18 instructions x 8) + the branch at 0x140 (1)
    # + the vector store (1) + the second barrier and the back edge (2); the element path (3) is cold
    assert state_len == 18, state_len
    assert total == 1 + 18 * 8 + 1 + 1 + 2, total
    assert cold == 1, cold
    print("sass_hot self-test: ok")
    return 0


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", help="cuobjdump -sass output")
    ap.add_argument("kernel", help="regular expression over the mangled names; every match is reported")
    ap.add_argument("--tt", type=int, default=32, help="steps a tile (the plan's tt; default 32)")
    ap.add_argument("--self-test", action="store_true", help="check the estimator on a made-up listing, then exit")
    args = ap.parse_args(argv)
    found = 0
    for name, ins in functions(args.sass).items():
        if not re.search(args.kernel, name):
            continue
        found += 1
        total, state_len, cold = hot_path(ins, args.tt)
        spills = sum(1 for _, t in ins if re.search(r"\b(LDL|STL)\b", t))
        print(f"{name}\n  state loop {state_len} instructions (16 updates), full tile {total} a thread: "
              f"{total / (4 * args.tt):.2f} per state update; {cold} cold blocks; {spills} spill instructions")
    if not found:
        raise SystemExit(f"no function matches {args.kernel!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
