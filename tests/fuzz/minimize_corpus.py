#!/usr/bin/env python3
"""Pick a small seed corpus for the C-ABI fuzzer: a greedy set cover of the coverage edges of the given inputs.

libFuzzer's own -merge=1 keeps every input that adds a feature in size order (hundreds of files here); this
keeps the fewest inputs (greedy: most new edges first, smaller file on ties) that reach every edge any input
reaches. Usage, from the repository root after `cmake --build --preset fuzz`:

    python3 tests/fuzz/minimize_corpus.py build/fuzz/tests/fuzz/selscan_fuzz_abi tests/fuzz/corpus NEW_DIR... \
        --out tests/fuzz/corpus --min-gain 5

(--min-gain 5 drops the inputs that add fewer than 5 edges each: the committed corpus is 45 files reaching 1783 of
the 1914 library edges of a 10-minute run's corpus; the fuzzer finds the rest within seconds.)

The output directory is replaced by the chosen files (named by their SHA-1, as libFuzzer names them).
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile


def edges_of(fuzzer, path, tmp):
    """The coverage edges one input reaches (a merge of that input alone: libFuzzer's control file lists, per
    input, only the edges new to its process, so each input gets a process of its own)."""
    control = os.path.join(tmp, "control")
    if os.path.exists(control):
        os.remove(control)  # an existing control file would make libFuzzer resume that merge
    scratch = os.path.join(tmp, "out")
    shutil.rmtree(scratch, ignore_errors=True)
    os.mkdir(scratch)
    single = os.path.join(tmp, "in")
    shutil.rmtree(single, ignore_errors=True)
    os.mkdir(single)
    shutil.copy(path, single)
    cmd = [fuzzer, "-merge=1", "-use_counters=0", "-use_value_profile=0", "-merge_control_file=" + control,
           scratch, single]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(control) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "COV":
                return set(map(int, parts[2:]))
    return set()


def edges_per_input(fuzzer, dirs):
    files = sorted(os.path.join(d, n) for d in dirs for n in os.listdir(d) if os.path.isfile(os.path.join(d, n)))
    with tempfile.TemporaryDirectory() as tmp:
        return {p: edges_of(fuzzer, p, tmp) for p in files}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fuzzer")
    ap.add_argument("inputs", nargs="+", help="corpus directories")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-gain", type=int, default=1,
                    help="stop when the next file would add fewer edges than this (default 1: cover every edge)")
    args = ap.parse_args()

    edges = edges_per_input(args.fuzzer, args.inputs)
    universe = set().union(*edges.values()) if edges else set()
    chosen, covered, gains = [], set(), []
    remaining = dict(edges)
    while covered != universe:
        path, gain = max(((p, len(e - covered)) for p, e in remaining.items()),
                         key=lambda pg: (pg[1], -os.path.getsize(pg[0])))
        if gain < max(1, args.min_gain):
            break
        chosen.append(path)
        covered |= remaining.pop(path)
        gains.append(gain)

    data = [open(p, "rb").read() for p in chosen]
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    for blob in data:
        with open(os.path.join(args.out, hashlib.sha1(blob).hexdigest()), "wb") as f:
            f.write(blob)
    print("edges added per file:", " ".join(map(str, gains)), file=sys.stderr)
    print(f"{len(edges)} inputs, {len(universe)} edges -> {len(chosen)} files covering {len(covered)}, "
          f"{sum(map(len, data))} bytes in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
