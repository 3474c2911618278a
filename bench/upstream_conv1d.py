#!/usr/bin/env python3
"""causal-conv1d's kernels alone (Dao-AILab/causal-conv1d's causal_conv1d_cuda forward, backward and decode update),
timed at the rows of bench/bench_conv1d.cpp and written as JSON for bench/conv1d_table.py. Needs
bench/build_causal_conv1d.py's output on PYTHONPATH and a CUDA device.

    PYTHONPATH=build/conv-upstream python3 bench/upstream_conv1d.py --json conv-upstream.json

Method: every row owns complete buffer sets (all tensors of the call) that rotate, at least 3 and together at
least 200 MB (as selscan's harness, support/bench.h), so no call finds its operands in L2 from the previous one.
A batch of launches over the sets is captured once in a CUDA graph (no Python or launch gaps between kernels) and
replayed between two CUDA events; a batch lasts about --batch-ms; the row's time is the median over --repeats
batches of the batch time / launches. Inputs are allocated and filled once. The extension is called directly,
as causal_conv1d_fn's autograd function does: the backward's fp32 dweight/dbias accumulators are zeroed once
outside the timed loop (upstream's wrapper zeroes them before each call, two small memsets not counted here), and
CAUSAL_CONV1D_DETERMINISTIC decides its reduction mode (unset: atomics).
"""

import argparse
import json
import math
import os
import re
import statistics
import sys
import time

import torch

from conv1d_table import floor_bytes  # bench/conv1d_table.py: the rows' memory floors

SHAPES = [(8, 1536, 2048), (4, 5120, 2048), (1, 5120, 512), (1, 1536, 64)]
UPDATE_BATCHES = [1, 16, 64, 256]
UPDATE_DIM = 5120
WIDTH = 4
STATE_LEN = WIDTH - 1
MIN_ROTATION_BYTES = 200e6
MIN_SETS, MAX_SETS = 3, 64
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def rows(dtype):
    out = []
    for direction in ("fwd", "bwd"):
        for layout in ("cf", "cl"):
            for B, D, L in SHAPES:
                out.append(dict(name=f"conv1d/{direction}/{layout}/{B}x{D}x{L}/w{WIDTH}/{dtype}", op=direction,
                                layout=layout, batch=B, dim=D, seqlen=L))
    for B in UPDATE_BATCHES:
        out.append(dict(name=f"conv1d/update/{dtype}/D{UPDATE_DIM}/Bt={B}", op="update", batch=B, dim=UPDATE_DIM,
                        tokens=1, state_len=STATE_LEN))
    return out


class Row:
    """The buffer sets of one row and a launch of the extension on set k."""

    def __init__(self, ext, r, args, device):
        self.ext, self.r = ext, r
        it, wt = DTYPES[args.dtype], DTYPES[args.wtype or args.dtype]
        self.silu = args.act == "silu"
        B, D = r["batch"], r["dim"]
        g = torch.Generator(device=device).manual_seed(1234)

        def rand(*shape, dtype):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.5).to(dtype)

        def seq_tensor(L, dtype):
            # channel-last: stride 1 over D (the (B, L, D) buffer of Mamba-2's in_proj, transposed)
            if r.get("layout") == "cl":
                return rand(B, L, D, dtype=dtype).transpose(1, 2)
            return rand(B, D, L, dtype=dtype)

        def one_set():
            s = {"weight": rand(D, WIDTH, dtype=wt), "bias": rand(D, dtype=wt) if args.bias else None}
            if r["op"] == "update":
                s["x"] = rand(B, D, 1, dtype=it)
                s["state"] = rand(B, D, r["state_len"], dtype=it)
                s["out"] = torch.empty_like(s["x"])
            else:
                s["x"] = seq_tensor(r["seqlen"], it)
                if r["op"] == "fwd":
                    s["out"] = torch.empty_like(s["x"])
                else:
                    s["dout"] = seq_tensor(r["seqlen"], it)
                    s["dx"] = torch.empty_like(s["x"])
                    s["dweight"] = torch.zeros(D, WIDTH, dtype=torch.float32, device=device)
                    s["dbias"] = torch.zeros(D, dtype=torch.float32, device=device) if args.bias else None
            return s

        one = one_set()
        self.set_bytes = sum(t.numel() * t.element_size() for t in one.values() if t is not None)
        n = max(MIN_SETS, min(MAX_SETS, math.ceil(MIN_ROTATION_BYTES / self.set_bytes)))
        self.sets = [one] + [one_set() for _ in range(n - 1)]

    def launch(self, k):
        s, e = self.sets[k % len(self.sets)], self.ext
        if self.r["op"] == "fwd":
            e.causal_conv1d_fwd(s["x"], s["weight"], s["bias"], None, None, s["out"], None, self.silu)
        elif self.r["op"] == "bwd":
            e.causal_conv1d_bwd(s["x"], s["weight"], s["bias"], s["dout"], None, None, None, s["dx"], s["dweight"],
                                s["dbias"], None, self.silu)
        else:
            e.causal_conv1d_update(s["x"], s["state"], s["weight"], s["bias"], s["out"], self.silu, None, None)

    def check(self):
        """"" or what is wrong with the primary output of the first and last set (written and finite)."""
        key = {"fwd": "out", "bwd": "dx", "update": "out"}[self.r["op"]]
        for k in (0, len(self.sets) - 1):
            t = self.sets[k][key]
            if not bool(torch.isfinite(t).all()):
                return f"set {k}: {key} not finite"
        return ""


def time_row(row, args, device):
    """(median ms, min ms, launches per batch) of one launch."""
    cuda = device.type == "cuda"
    for k in range(len(row.sets)):  # warm-up: module load, first touch, clocks
        row.launch(k)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    err = row.check()
    if err:
        raise RuntimeError(f"{row.r['name']}: {err}")
    # Size a batch from a rough eager estimate.
    t0 = time.perf_counter()
    for k in range(len(row.sets)):
        row.launch(k)
    sync()
    est_ms = max((time.perf_counter() - t0) * 1e3 / len(row.sets), 1e-3)
    batch = max(len(row.sets), min(args.max_batch, math.ceil(args.batch_ms / est_ms)))
    times = []
    if not cuda:  # a check of this script against a stand-in, not a measurement
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for k in range(batch):
                row.launch(k)
            times.append((time.perf_counter() - t0) * 1e3 / batch)
        return statistics.median(times), min(times), batch
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if args.graph:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for k in range(len(row.sets)):  # eager launches on the capture stream before capturing
                row.launch(k)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph, stream=stream):
            for k in range(batch):
                row.launch(k)
        run = graph.replay
    else:
        def run():
            for k in range(batch):
                row.launch(k)
    run()
    torch.cuda.synchronize()
    for _ in range(args.repeats):
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / batch)
    err = row.check()
    if err:
        raise RuntimeError(f"{row.r['name']} after timing: {err}")
    return statistics.median(times), min(times), batch


def context(args, device, ext):
    import causal_conv1d
    ctx = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "causal_conv1d": getattr(causal_conv1d, "__version__", "?"),
        "extension": getattr(ext, "__file__", "?"),
        "dtype": args.dtype,
        "weight_dtype": args.wtype or args.dtype,
        "bias": args.bias,
        "activation": args.act,
        "deterministic": os.environ.get("CAUSAL_CONV1D_DETERMINISTIC", "unset"),
        "method": (f"CUDA graph of a ~{args.batch_ms} ms batch" if args.graph and device.type == "cuda"
                   else f"eager ~{args.batch_ms} ms batch")
                  + f", median of {args.repeats}, sets rotating over >= {MIN_ROTATION_BYTES / 1e6:.0f} MB",
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        ctx["device"] = f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs)"
        l2 = getattr(p, "L2_cache_size", 0)
        if l2:
            ctx["l2_mb"] = round(l2 / 2 ** 20, 1)
    else:
        ctx["device"] = f"{device} (a check of the script, not a measurement)"
    return ctx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="output file")
    ap.add_argument("--filter", default="", help="regex on the row names (default: every row)")
    ap.add_argument("--list", action="store_true", help="print the rows and exit")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="x's dtype (default bf16)")
    ap.add_argument("--wtype", choices=sorted(DTYPES), help="weight and bias dtype (default: x's)")
    ap.add_argument("--no-bias", dest="bias", action="store_false", help="no bias (default: bias)")
    ap.add_argument("--act", default="silu", choices=["silu", "none"], help="activation (default silu)")
    ap.add_argument("--repeats", type=int, default=30, help="timed batches per row (default 30)")
    ap.add_argument("--batch-ms", type=float, default=2.0, help="about how long one batch runs (default 2 ms)")
    ap.add_argument("--max-batch", type=int, default=2000, help="launches per batch at most (default 2000)")
    ap.add_argument("--no-graph", dest="graph", action="store_false", help="eager launches instead of a CUDA graph")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda; cpu only checks the script)")
    args = ap.parse_args()
    selected = [r for r in rows(args.dtype) if re.search(args.filter, r["name"])]
    if args.list:
        for r in selected:
            print(r["name"])
        return
    if not selected:
        sys.exit(f"upstream_conv1d: no row matches --filter '{args.filter}'")
    if args.repeats < 1 or args.batch_ms <= 0 or args.max_batch < 1:
        sys.exit(f"upstream_conv1d: --repeats ({args.repeats}) and --max-batch ({args.max_batch}) must be >= 1, "
                 f"--batch-ms ({args.batch_ms}) > 0")
    try:
        import causal_conv1d_cuda as ext
    except ImportError as e:
        sys.exit(f"upstream_conv1d: causal_conv1d_cuda is not importable ({e}); put bench/build_causal_conv1d.py's "
                 "output on PYTHONPATH")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("upstream_conv1d: no CUDA device visible to torch")
    out = {"context": context(args, device, ext), "rows": []}
    for r in selected:
        row = Row(ext, r, args, device)
        ms, ms_min, launches = time_row(row, args, device)
        entry = dict(r)
        entry.update(ms=ms, ms_min=ms_min, launches=launches, repeats=args.repeats, sets=len(row.sets),
                     set_MB=round(row.set_bytes / 1e6, 3), bytes=floor_bytes(r["name"]))
        out["rows"].append(entry)
        print(f"{r['name']:40s} {ms:9.4f} ms (min {ms_min:.4f}, {len(row.sets)} sets, {launches} launches a batch)",
              flush=True)
        del row
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"upstream_conv1d: {len(out['rows'])} rows -> {args.json}")


if __name__ == "__main__":
    main()
