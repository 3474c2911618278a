#!/usr/bin/env python3
"""Turn selscan_bench JSON output into the markdown tables (and the time-vs-L plot) of docs/performance.md.

Usage:
  python3 bench/report.py RUN.json [LABEL=OTHER.json ...] [--output FILE.md] [--plot FILE.png]
                          [--update-doc docs/performance.md]

Each input file is one "implementation" (a build, a commit, a GPU); its label is LABEL when given as
LABEL=path, else the GPU name from the file's context, else the file name. Runs with
--benchmark_repetitions are reduced to the median (the framework's median aggregate when present).
The plot needs matplotlib; without it the tables are still written.
"""

import argparse
import json
import math
import os
import re
import statistics
import sys

SHAPES_DEF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "bench_shapes.def")
ITYPE_NAMES = {"FLOAT32": "fp32", "FLOAT16": "fp16", "BFLOAT16": "bf16"}


def upstream_figures(path=SHAPES_DEF):
    """Issue #4's rows and upstream selective_scan_cuda's (fwd ms, bwd ms), in table order, from the benchmark
    shape table that selscan_bench and `selscan bench` are built from."""
    rows = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*SELSCAN_BENCH_SHAPE\(\s*gpu\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,"
                         r"\s*(\w+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*\)", line)
            if m:
                bt, d, l, n, itype, fwd, bwd = m.groups()
                rows[(ITYPE_NAMES[itype], f"{bt}x{d}x{l}:{n}")] = (float(fwd), float(bwd))
    return rows


# Targets: fwd 1/3, bwd 1/2.5 of upstream.
UPSTREAM = upstream_figures()
TARGET_DIV = {"fwd": 3.0, "bwd": 2.5}
ISSUE_ORDER = list(UPSTREAM.keys())
MODE_ORDER = {"fwd": 0, "fwd_infer": 1, "bwd": 2, "bwd_det": 3}

BEGIN = "<!-- bench-results:begin -->"
END = "<!-- bench-results:end -->"

TIME_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
FIELDS = ("ms", "GB_s", "exp_floor_frac", "mem_floor_frac", "state_updates_per_s", "bytes", "sets")


def parse_name(run_name):
    """'gpu/fwd/bf16/8x1536x2048:16/manual_time' -> (section, mode, dtype, shape, threads) or None. A fixed iteration
    count in the name (the host rows: 'host/bwd/bf16/8x1536x2048:16/iterations:50/manual_time') is not part of the key."""
    parts = [p for p in run_name.split("/")
             if p not in ("manual_time", "real_time", "process_time") and not re.fullmatch(r"iterations:\d+", p)]
    threads = 1
    rest = []
    for p in parts:
        m = re.fullmatch(r"threads:(\d+)", p)
        if m:
            threads = int(m.group(1))
        else:
            rest.append(p)
    if len(rest) == 3 and rest[0] == "gpu_copy":
        return ("gpu_copy", rest[1], "", rest[2], threads)
    if len(rest) != 4:
        return None
    return (rest[0], rest[1], rest[2], rest[3], threads)


def shape_dims(shape):
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+):(\d+)", shape)
    return tuple(int(g) for g in m.groups()) if m else None


def row_values(b):
    """The fields of one benchmark entry; 'ms' falls back to the framework's time when the counter is absent."""
    v = {k: b[k] for k in FIELDS if k in b and isinstance(b[k], (int, float))}
    if "ms" not in v and "real_time" in b:
        v["ms"] = b["real_time"] * TIME_TO_MS.get(b.get("time_unit", "ns"), 1e-6)
    return v


def load(path, label):
    with open(path) as f:
        data = json.load(f)
    ctx = data.get("context", {})
    if not label:
        label = ctx.get("gpu_name") or os.path.splitext(os.path.basename(path))[0]
    iters, medians, errors = {}, {}, {}
    for b in data.get("benchmarks", []):
        run_name = b.get("run_name", b.get("name", ""))
        key = parse_name(run_name)
        if key is None:
            continue
        if b.get("error_occurred"):
            errors[key] = b.get("error_message", "error")
            continue
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[key] = row_values(b)
            continue
        iters.setdefault(key, []).append(row_values(b))
    results = {}
    for key, rows in iters.items():
        results[key] = {k: statistics.median(r[k] for r in rows if k in r) for k in FIELDS if any(k in r for r in rows)}
    results.update(medians)  # the framework's own median across repetitions wins
    return {"label": label, "path": path, "context": ctx, "results": results, "errors": errors}


def fmt(v, spec="{:.3f}", missing="–"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return missing
    return spec.format(v)


def pct(v):
    return fmt(None if v is None else 100.0 * v, "{:.0f}%")


def get(run, section, mode, dtype, shape, field, threads=1):
    r = run["results"].get((section, mode, dtype, shape, threads))
    return None if r is None else r.get(field)


def describe(run):
    c = run["context"]
    bits = []
    if "gpu_name" in c:
        bits.append(f"{c['gpu_name']}, {c.get('gpu_sms', '?')} SMs at {c.get('gpu_clock_mhz', '?')} MHz, "
                    f"L2 {c.get('gpu_l2_mb', '?')} MB, measured D2D copy {c.get('gpu_d2d_GB_s', '?')} GB/s")
    if c.get("selscan_build"):
        bits.append(f"build: `{c['selscan_build']}`")
    if c.get("date"):
        bits.append(f"run {c['date']}")
    return " — ".join(bits) if bits else f"from {run['path']}"


def issue_tables(run):
    out = []
    has = any(get(run, "gpu", m, d, s, "ms") is not None for (d, s) in ISSUE_ORDER for m in ("fwd", "bwd"))
    if not has:
        return out
    out.append("| Bt×D×L:N | itype | fwd ms | upstream | speedup | target ≤ | met | "
               "bwd ms | upstream | speedup | target ≤ | met |")
    out.append("|---|---|---:|---:|---:|---:|:-:|---:|---:|---:|---:|:-:|")
    for (d, s) in ISSUE_ORDER:
        cells = [s, d]
        for i, mode in enumerate(("fwd", "bwd")):
            ms = get(run, "gpu", mode, d, s, "ms")
            up = UPSTREAM[(d, s)][i]
            target = up / TARGET_DIV[mode]
            cells += [fmt(ms), fmt(up), fmt(None if ms is None else up / ms, "{:.2f}×"), fmt(target),
                      "–" if ms is None else ("yes" if ms <= target else "no")]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("| Bt×D×L:N | itype | fwd_infer ms | bwd_det ms | fwd GB/s | fwd mem floor | fwd exp floor | "
               "bwd GB/s | bwd mem floor | bwd exp floor |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (d, s) in ISSUE_ORDER:
        g = lambda mode, f: get(run, "gpu", mode, d, s, f)  # noqa: E731
        out.append("| " + " | ".join([
            s, d, fmt(g("fwd_infer", "ms")), fmt(g("bwd_det", "ms")),
            fmt(g("fwd", "GB_s"), "{:.0f}"), pct(g("fwd", "mem_floor_frac")), pct(g("fwd", "exp_floor_frac")),
            fmt(g("bwd", "GB_s"), "{:.0f}"), pct(g("bwd", "mem_floor_frac")), pct(g("bwd", "exp_floor_frac")),
        ]) + " |")
    out.append("")
    return out


def sweep_points(run, mode):
    pts = []
    for (section, m, d, s, _t), r in run["results"].items():
        if section == "gpu_sweep" and m == mode and "ms" in r:
            dims = shape_dims(s)
            if dims:
                pts.append((dims[2], r, d, s))
    return sorted(pts, key=lambda p: p[0])


def sweep_table(run):
    fwd = {p[0]: p for p in sweep_points(run, "fwd")}
    bwd = {p[0]: p for p in sweep_points(run, "bwd")}
    ls = sorted(set(fwd) | set(bwd))
    if not ls:
        return []
    any_pt = (fwd.get(ls[0]) or bwd.get(ls[0]))
    dims = shape_dims(any_pt[3])
    out = [f"L sweep, Bt={dims[0]}, D={dims[1]}, N={dims[3]}, {any_pt[2]}:", "",
           "| L | fwd ms | fwd GB/s | fwd mem floor | bwd ms | bwd GB/s | bwd mem floor |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for L in ls:
        f = fwd.get(L, (None, {}))[1]
        b = bwd.get(L, (None, {}))[1]
        out.append("| " + " | ".join([
            str(L), fmt(f.get("ms")), fmt(f.get("GB_s"), "{:.0f}"), pct(f.get("mem_floor_frac")),
            fmt(b.get("ms")), fmt(b.get("GB_s"), "{:.0f}"), pct(b.get("mem_floor_frac"))]) + " |")
    out.append("")
    return out


def copy_line(run):
    for (section, _m, _d, s, _t), r in run["results"].items():
        if section == "gpu_copy" and "GB_s" in r:
            return [f"Device-to-device copy ({s}, read + write counted): {r['GB_s']:.0f} GB/s "
                    f"({r['ms']:.3f} ms per copy).", ""]
    return []


def cpu_table(run):
    keys = sorted((k for k in run["results"] if k[0] == "cpu"),
                  key=lambda k: (shape_dims(k[3]) or (0,), MODE_ORDER.get(k[1], 9), k[4]))
    if not keys:
        return []
    out = ["| mode | itype | Bt×D×L:N | threads | ms | state updates/s |", "|---|---|---|---:|---:|---:|"]
    for k in keys:
        r = run["results"][k]
        ups = r.get("state_updates_per_s")
        out.append(f"| {k[1]} | {k[2]} | {k[3]} | {k[4]} | {fmt(r.get('ms'), '{:.2f}')} | "
                   f"{fmt(None if ups is None else ups / 1e9, '{:.3f}')} G |")
    out.append("")
    return out


def render(runs, plot_path):
    out = []
    for run in runs:
        out.append(f"### {run['label']}")
        out.append("")
        out.append(describe(run))
        out.append("")
        issue = issue_tables(run)
        if issue:
            out.append("#### GPU: issue #4 rows (fp32 weights, variable B/C G=1, D, z, delta_bias, softplus)")
            out.append("")
            out += issue
        sweep = sweep_table(run)
        if sweep:
            out.append("#### GPU: time against L")
            out.append("")
            out += sweep
        out += copy_line(run)
        cpu = cpu_table(run)
        if cpu:
            out.append("#### CPU path (fp32, variable B/C, D, z, delta_bias, softplus)")
            out.append("")
            out += cpu
        if run["errors"]:
            out.append("Benchmarks that did not run:")
            out.append("")
            for k, msg in sorted(run["errors"].items()):
                out.append(f"- `{'/'.join(str(p) for p in k[:4])}`: {msg}")
            out.append("")
    if plot_path:
        out.append(f"![time against L]({os.path.basename(plot_path)})")
        out.append("")
    return "\n".join(out)


def plot(runs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib not installed; no plot (pip install matplotlib)", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drew = False
    for run in runs:
        for mode, style in (("fwd", "-o"), ("bwd", "--s")):
            pts = sweep_points(run, mode)
            if pts:
                ax.plot([p[0] for p in pts], [p[1]["ms"] for p in pts], style, label=f"{run['label']} {mode}")
                drew = True
    # The floor of the first run: the larger of its memory and exp lower bounds, ms * fraction of each.
    for mode in ("fwd", "bwd"):
        pts = sweep_points(runs[0], mode)
        floor = [(p[0], p[1]["ms"] * max(p[1].get("mem_floor_frac", 0), p[1].get("exp_floor_frac", 0)))
                 for p in pts]
        floor = [f for f in floor if f[1] > 0]
        if floor:
            ax.plot([f[0] for f in floor], [f[1] for f in floor], ":" if mode == "fwd" else "-.", color="gray",
                    label=f"{mode} floor")
    if not drew:
        plt.close(fig)
        print("report.py: no gpu_sweep results; no plot", file=sys.stderr)
        return False
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L (Bt=1, D=2048, N=16, bf16)")
    ax.set_ylabel("time per call (ms, median)")
    ax.set_title("libselscan selective scan: time against L")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def update_doc(doc, text):
    with open(doc) as f:
        content = f.read()
    if BEGIN not in content or END not in content:
        raise SystemExit(f"report.py: {doc} has no {BEGIN} ... {END} block")
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc, "w") as f:
        f.write(head + BEGIN + "\n" + text.rstrip() + "\n" + END + tail)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="selscan_bench --benchmark_format=json output, optionally LABEL=path")
    ap.add_argument("--output", help="write the markdown here (default: stdout)")
    ap.add_argument("--plot", help="PNG of time against L (needs matplotlib)")
    ap.add_argument("--update-doc", help="replace the results block of this markdown file")
    args = ap.parse_args(argv)

    runs = []
    for item in args.inputs:
        label, path = (item.split("=", 1) if "=" in item and not os.path.exists(item) else (None, item))
        runs.append(load(path, label))
    seen = {}
    for run in runs:  # keep labels distinct when two files come from the same GPU
        if run["label"] in seen:
            run["label"] += f" ({os.path.splitext(os.path.basename(run['path']))[0]})"
        seen[run["label"]] = True

    plot_path = args.plot if args.plot and plot(runs, args.plot) else None
    text = render(runs, plot_path)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    if args.update_doc:
        update_doc(args.update_doc, text)
    if not args.output and not args.update_doc:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
