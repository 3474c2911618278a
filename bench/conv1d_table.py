#!/usr/bin/env python3
"""The causal conv1d rows side by side: selscan (Google Benchmark JSON of bench/bench_conv1d.cpp's conv1d/* rows)
against causal-conv1d (bench/upstream_conv1d.py's JSON), with each row's memory floor, as a markdown table.

    python3 bench/conv1d_table.py conv-bench.json conv-upstream.json [--peak-tbs 4.3] [--out conv-table.md]

Memory floor: the bytes a row cannot avoid moving, over the peak bandwidth (default 4.3 TB/s, about what an H200
copies device to device): forward x read once + out written once; backward x and dout read, dx written; update
the state read and written, x read, out written (weights, bias and the fp32 weight gradients are left out: at most
a few hundred KB). "ratio" is upstream ms / selscan ms (> 1: selscan is faster); "% of floor" is floor / selscan.
"""

import argparse
import json
import re
import sys

ESIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
# Suffixes Google Benchmark appends to a row's name.
GB_SUFFIX = re.compile(r"(/(manual_time|real_time|process_time|iterations:\d+|repeats:\d+|threads:\d+))+$")


def floor_bytes(name, state_len=None, tokens=None):
    """Bytes of a conv1d row's floor (module docstring), from its name; None for a name of another form.
    conv1d/{fwd,bwd}/{cf,cl}/<B>x<D>x<L>/w<W>/<dtype> and conv1d/update/<dtype>/D<D>/Bt=<B>[/T=<T>][/state_len=<S>]
    (state_len defaults to 3, width 4's W-1, and T to 1 unless the row says otherwise)."""
    p = name.split("/")
    if len(p) >= 6 and p[0] == "conv1d" and p[1] in ("fwd", "bwd"):
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", p[3])
        if not m or p[5] not in ESIZE:
            return None
        n = int(m.group(1)) * int(m.group(2)) * int(m.group(3))
        return (2 if p[1] == "fwd" else 3) * n * ESIZE[p[5]]
    if len(p) >= 5 and p[0] == "conv1d" and p[1] == "update" and p[2] in ESIZE:
        fields = {}
        for tok in p[3:]:
            m = re.fullmatch(r"D(\d+)", tok) or re.fullmatch(r"(?:Bt|T|state_len)=(\d+)", tok)
            if not m:
                return None
            fields[tok.split("=")[0] if "=" in tok else "D"] = int(m.group(1))
        if "D" not in fields or "Bt" not in fields:
            return None
        sl = state_len or fields.get("state_len", 3)
        t = tokens or fields.get("T", 1)
        B, D, es = fields["Bt"], fields["D"], ESIZE[p[2]]
        return B * D * (2 * sl + 2 * t) * es
    return None


def selscan_rows(path):
    """{row: median ms} of the conv1d/ rows of a Google Benchmark JSON file (the "ms" counter where present)."""
    with open(path) as f:
        data = json.load(f)
    rows, aggregates = {}, {}
    for b in data.get("benchmarks", []):
        name = GB_SUFFIX.sub("", b.get("run_name", b["name"]))
        if not name.startswith("conv1d/") or b.get("error_occurred"):
            continue
        ms = b.get("ms")
        if ms is None:
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
            ms = b["real_time"] * scale
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                aggregates[name] = ms
        else:
            rows.setdefault(name, ms)
    rows.update(aggregates)  # with repetitions, their median
    return rows, data.get("context", {})


def upstream_rows(path):
    with open(path) as f:
        data = json.load(f)
    return {r["name"]: r for r in data.get("rows", [])}, data.get("context", {})


def ms_text(v):
    """Milliseconds with about four significant digits, without an exponent."""
    if v is None:
        return "-"
    return f"{v:.{3 if v >= 1 else 4 if v >= 0.01 else 6}f}"


def table(sel, sel_ctx, up, up_ctx, peak_tbs):
    names = list(up) + [n for n in sel if n not in up]
    lines = ["| row | selscan ms | upstream ms | ratio | memory floor ms | % of floor |",
             "|---|---:|---:|---:|---:|---:|"]
    for n in names:
        s = sel.get(n)
        u = up[n]["ms"] if n in up else None
        b = floor_bytes(n, up.get(n, {}).get("state_len"), up.get(n, {}).get("tokens"))
        fl = b / (peak_tbs * 1e12) * 1e3 if b else None
        ratio = u / s if (u and s) else None
        pct = 100.0 * fl / s if (fl and s) else None
        lines.append(f"| {n} | {ms_text(s)} | {ms_text(u)} | {'-' if ratio is None else f'{ratio:.2f}'} | "
                     f"{ms_text(fl)} | {'-' if pct is None else f'{pct:.1f}' if pct < 10 else f'{pct:.0f}'} |")
    notes = [f"ratio = upstream / selscan (> 1: selscan faster); floor at {peak_tbs} TB/s (bench/conv1d_table.py)."]
    if sel_ctx:
        notes.append("selscan: " + ", ".join(f"{k} {sel_ctx[k]}" for k in ("gpu_name", "selscan_build") if k in sel_ctx))
    if up_ctx:
        notes.append("upstream: " + ", ".join(f"{k} {up_ctx[k]}" for k in
                                              ("device", "causal_conv1d", "weight_dtype", "bias", "activation",
                                               "method") if k in up_ctx))
    missing = [n for n in names if n not in sel or n not in up]
    if missing:
        notes.append(f"{len(missing)} rows measured on one side only.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("selscan", help="Google Benchmark JSON with the conv1d/ rows (selscan_bench --benchmark_out)")
    ap.add_argument("upstream", help="bench/upstream_conv1d.py's JSON")
    ap.add_argument("--peak-tbs", type=float, default=4.3, help="bandwidth of the floor, TB/s (default 4.3)")
    ap.add_argument("--out", help="write the table here as well as to stdout")
    args = ap.parse_args()
    sel, sel_ctx = selscan_rows(args.selscan)
    up, up_ctx = upstream_rows(args.upstream)
    if not sel and not up:
        sys.exit(f"conv1d_table: no conv1d/ rows in {args.selscan} or {args.upstream}")
    text = table(sel, sel_ctx, up, up_ctx, args.peak_tbs)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
