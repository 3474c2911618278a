#!/usr/bin/env python3
"""Turn selscan_bench JSON output into the markdown tables (and the time-vs-L plot) of docs/performance.md.

Usage:
  python3 bench/report.py RUN.json [LABEL=OTHER.json ...] [--output FILE.md] [--plot FILE.png]
                          [--update-doc docs/performance.md] [--upstream-json UP.json[,UP2.json ...]]

Each input file is one "implementation" (a build, a commit, a GPU); its label is LABEL when given as
LABEL=path, else the GPU name from the file's context, else the file name. Runs with
--benchmark_repetitions are reduced to the median (the framework's median aggregate when present).
Several rounds of one implementation are given as one input, comma-separated (a.json,b.json): each row takes the
round with the smallest median ("the better of the rounds").
--upstream-json: upstream's times measured in the same run by bench/upstream_kernels.py (rounds comma-separated as
above); the issue tables then compare against those instead of the figures in support/bench_shapes.def.
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
# Issue #20's targets: forward and backward at least 2.0x upstream on every row, and row 1's forward at most 0.23 ms.
ISSUE20_RATIO = 2.0
ISSUE20_ROW1_FWD_MS = 0.23
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
    """One implementation's results; `path` may list several rounds, comma-separated (the better round per row)."""
    paths = path.split(",")
    if len(paths) > 1:
        rounds = [load(p, label) for p in paths]
        best = {}
        for r in rounds:
            for key, row in r["results"].items():
                if "ms" in row and (key not in best or row["ms"] < best[key]["ms"]):
                    best[key] = row
        errors = {k: v for r in rounds for k, v in r["errors"].items() if k not in best}
        return {"label": rounds[0]["label"], "path": path, "context": rounds[0]["context"], "results": best,
                "errors": errors, "rounds": len(paths)}
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
    if c.get("implementation"):  # a bench/upstream_kernels.py file
        bits.append(f"{c['implementation']} on {c.get('gpu_name', '?')}, torch {c.get('torch', '?')}")
    elif "gpu_name" in c:
        bits.append(f"{c['gpu_name']}, {c.get('gpu_sms', '?')} SMs at {c.get('gpu_clock_mhz', '?')} MHz, "
                    f"L2 {c.get('gpu_l2_mb', '?')} MB, measured D2D copy {c.get('gpu_d2d_GB_s', '?')} GB/s")
    if c.get("selscan_build"):
        bits.append(f"build: `{c['selscan_build']}`")
    if c.get("date"):
        bits.append(f"run {c['date']}")
    return " — ".join(bits) if bits else f"from {run['path']}"


def has_issue_rows(run):
    """Whether the run timed any forward or backward of the issue rows."""
    return any(get(run, "gpu", m, d, s, "ms") is not None for (d, s) in ISSUE_ORDER for m in ("fwd", "bwd"))


def upstream_ms(upstream, dtype, shape, mode):
    """Upstream's time for a row: measured (an --upstream-json run) when given, else the shape table's figure."""
    if upstream is not None:
        return get(upstream, "gpu", mode, dtype, shape, "ms")
    v = UPSTREAM[(dtype, shape)][0 if mode == "fwd" else 1]
    return v if v > 0 else None


def issue20_table(run, upstream):
    """Issue #20's rows: each direction's ratio to upstream against 2.0x (and row 1's forward against 0.23 ms); a
    miss says by how much the time must fall."""
    if not has_issue_rows(run):
        return []
    out = ["| Bt×D×L:N | itype | fwd ms | upstream | ratio | fwd target met | "
           "bwd ms | upstream | ratio | bwd target met |",
           "|---|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for row, (d, s) in enumerate(ISSUE_ORDER):
        cells = [s, d]
        for mode in ("fwd", "bwd"):
            ms = get(run, "gpu", mode, d, s, "ms")
            up = upstream_ms(upstream, d, s, mode)
            if ms is None or up is None:
                cells += [fmt(ms, "{:.4f}"), fmt(up, "{:.4f}"), "–", "–"]
                continue
            need = up / ISSUE20_RATIO
            if row == 0 and mode == "fwd":
                need = min(need, ISSUE20_ROW1_FWD_MS)
            verdict = "yes" if ms <= need else f"no: needs <= {need:.4f} ms ({100.0 * (need / ms - 1):+.1f}%)"
            cells += [fmt(ms, "{:.4f}"), fmt(up, "{:.4f}"), f"{up / ms:.2f}x", verdict]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def issue_tables(run, upstream=None):
    out = []
    if not has_issue_rows(run):
        return out
    out.append("| Bt×D×L:N | itype | fwd ms | upstream | speedup | target ≤ | met | "
               "bwd ms | upstream | speedup | target ≤ | met |")
    out.append("|---|---|---:|---:|---:|---:|:-:|---:|---:|---:|---:|:-:|")
    for (d, s) in ISSUE_ORDER:
        cells = [s, d]
        for mode in ("fwd", "bwd"):
            ms = get(run, "gpu", mode, d, s, "ms")
            up = upstream_ms(upstream, d, s, mode)
            target = None if up is None else up / TARGET_DIV[mode]
            cells += [fmt(ms), fmt(up), fmt(None if ms is None or up is None else up / ms, "{:.2f}×"), fmt(target),
                      "–" if ms is None or target is None else ("yes" if ms <= target else "no")]
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


def render(runs, plot_path, upstream=None):
    out = []
    for run in runs:
        out.append(f"### {run['label']}")
        out.append("")
        out.append(describe(run))
        out.append("")
        issue = issue_tables(run, upstream)
        if issue:
            out.append("#### GPU: issue #4 rows (fp32 weights, variable B/C G=1, D, z, delta_bias, softplus)")
            out.append("")
            out += issue
        i20 = issue20_table(run, upstream)
        if i20:
            src = (f"upstream measured in the same run ({describe(upstream)}"
                   f"{', the better of %d rounds' % upstream['rounds'] if upstream.get('rounds') else ''})"
                   if upstream is not None else "upstream: support/bench_shapes.def's figures (issue #4)")
            out.append(f"#### GPU: issue #20's targets (>= {ISSUE20_RATIO}x upstream both ways; row 1's forward "
                       f"<= {ISSUE20_ROW1_FWD_MS} ms); {src}")
            out.append("")
            out += i20
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


def self_test():
    """The round merge and issue #20's table on made-up selscan_bench and upstream_kernels.py files."""
    import tempfile

    def bench_file(d, name, rows):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            json.dump({"context": {"gpu_name": "GPU"}, "benchmarks": [
                {"name": f"gpu/{m}/{t}/{s}/manual_time", "run_name": f"gpu/{m}/{t}/{s}/manual_time",
                 "run_type": "iteration", "ms": ms} for (m, t, s), ms in rows.items()]}, f)
        return path

    r1, r2 = ("fwd", "bf16", "8x1536x2048:16"), ("bwd", "bf16", "4x5120x2048:16")
    r3 = ("fwd", "bf16", "4x5120x2048:16")
    with tempfile.TemporaryDirectory() as d:
        ours = ",".join([bench_file(d, "a.json", {r1: 0.2250, r2: 1.5700, r3: 0.3806}),
                         bench_file(d, "b.json", {r1: 0.2243, r2: 1.5690})])
        ups = ",".join([bench_file(d, "u1.json", {r1: 0.4530, r2: 2.9150}), bench_file(d, "u2.json", {r1: 0.4500})])
        run, up = load(ours, "ours"), load(ups, "upstream")
        assert run["rounds"] == 2 and up["rounds"] == 2
        assert get(run, "gpu", "fwd", "bf16", "8x1536x2048:16", "ms") == 0.2243  # the better round per row
        assert get(up, "gpu", "fwd", "bf16", "8x1536x2048:16", "ms") == 0.4500
        table = "\n".join(issue20_table(run, up))
        # row 1: 0.4500 / 0.2243 = 2.01x, and 0.2243 <= min(0.4500 / 2, 0.23) = 0.2250
        assert "| 8x1536x2048:16 | bf16 | 0.2243 | 0.4500 | 2.01x | yes |" in table, table
        # row 2's backward: 2.9150 / 1.5690 = 1.86x; it needs 1.4575 ms, 7.1% less
        assert "| 1.5690 | 2.9150 | 1.86x | no: needs <= 1.4575 ms (-7.1%) |" in table, table
        # row 2's forward has no measured upstream time: no ratio and no verdict, not the shape table's figure
        assert "| 4x5120x2048:16 | bf16 | 0.3806 | – | – | – |" in table, table
        # without measured figures the shape table's are used: 0.740 / 0.3806 = 1.94x, needs 0.3700
        table = "\n".join(issue20_table(run, None))
        assert "| 4x5120x2048:16 | bf16 | 0.3806 | 0.7400 | 1.94x | no: needs <= 0.3700 ms (-2.8%) |" in table, table
        text = render([run], None, up)
        assert "upstream measured in the same run" in text and "the better of 2 rounds" in text, text
    print("report self-test: ok")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="*", help="selscan_bench --benchmark_format=json output, optionally LABEL=path")
    ap.add_argument("--output", help="write the markdown here (default: stdout)")
    ap.add_argument("--plot", help="PNG of time against L (needs matplotlib)")
    ap.add_argument("--update-doc", help="replace the results block of this markdown file")
    ap.add_argument("--upstream-json", help="upstream's times from bench/upstream_kernels.py (rounds comma-separated)")
    ap.add_argument("--self-test", action="store_true", help="check the tables on made-up runs, then exit")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.inputs:
        ap.error("at least one selscan_bench JSON file is needed")

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
    upstream = load(args.upstream_json, "upstream") if args.upstream_json else None
    text = render(runs, plot_path, upstream)
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
