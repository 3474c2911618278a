#!/usr/bin/env python3
"""Prints name and median ms of each benchmark in Google Benchmark JSON files, side by side (one column per file)."""
import json
import sys

cols = []
for path in sys.argv[1:]:
    with open(path) as f:
        data = json.load(f)
    cols.append({b["name"]: b.get("ms", b.get("real_time")) for b in data.get("benchmarks", []) if b.get("run_type") != "aggregate"})
names = []
for c in cols:
    names += [n for n in c if n not in names]
print("benchmark".ljust(44) + "".join(p.split("/")[-1][:12].rjust(13) for p in sys.argv[1:]))
for n in names:
    print(n.ljust(44) + "".join(("%.4f" % c[n]).rjust(13) if n in c else "-".rjust(13) for c in cols))
