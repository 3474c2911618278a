#!/usr/bin/env python3
"""Upstream's selective_scan_cuda timed like selscan_bench times selscan, for a baseline measured in the same run.

    python3 bench/build_upstream.py <mamba checkout> --out build/upstream --arch 9.0 --jobs 16
    PYTHONPATH=build/upstream python3 bench/upstream_kernels.py --json upstream.json
    python3 bench/report.py selscan.json --upstream-json upstream.json     # the ratios of issue #20's table

The rows are the `gpu` rows of support/bench_shapes.def (the issue rows selscan_bench runs): fp32 real weights,
variable B/C with one group, D, z, delta_bias and softplus; modes `fwd` (selective_scan_cuda.fwd: out, x, out_z) and
`bwd` (selective_scan_cuda.bwd with the forward's x and out, as mamba_ssm's SelectiveScanFn.backward calls it).
The method is selscan_bench's (docs/performance.md, "Method"):
- inputs in the same ranges: u and z in +-2, delta in [-3, -1], delta_bias in [-1, 0], A[d, n] = -(n + 1), B, C and
  dout in +-1, D in [0.5, 1.5];
- at least 3 independent input sets and at least 200 MB of them, used in turn, so no timed call finds its operands
  in L2;
- every set run once before timing; the head, middle and tail of the primary output (out_z, du) read back and
  checked finite;
- per iteration an untimed call on one set, then the timed call on the next between two CUDA events, so the host's
  launch work stays out of the time; the median over the iterations (`ms`), and the fastest (`ms_min`).
Upstream allocates its outputs itself (torch's caching allocator), so they cannot be poisoned first.

The JSON has selscan_bench's shape (context, benchmarks with run_name and the ms counter), so bench/report.py reads
it like a selscan_bench file. Needs torch with CUDA and the `selective_scan_cuda` extension on the path.
"""

import argparse
import datetime
import json
import os
import statistics
import sys

import report  # bench/report.py: the benchmark shape table

MIN_ROTATION_BYTES = 200e6  # > 3x the 50-60 MB L2 of an H100 / H200, as selscan_bench
MIN_SETS = 3
MAX_SETS = 64
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def issue_rows():
    """[(itype, 'BtxDxL:N')] of the benchmark shape table's gpu section, in table order."""
    return list(report.upstream_figures().keys())


def sets_wanted(set_bytes_):
    """Input sets to rotate through: at least MIN_SETS and MIN_ROTATION_BYTES in all, at most MAX_SETS."""
    return max(MIN_SETS, min(MAX_SETS, int(-(-MIN_ROTATION_BYTES // set_bytes_))))


def make_set(torch, ext, itype, bt, d, l, n, mode, gen, dev="cuda"):
    """One independent input set (and, for the backward, the forward's x and out on it)."""
    dt = getattr(torch, TORCH_DTYPES[itype])

    def uni(shape, lo, hi, dtype):
        return (torch.rand(shape, generator=gen, device=dev, dtype=torch.float32) * (hi - lo) + lo).to(dtype)

    s = {
        "u": uni((bt, d, l), -2, 2, dt),
        "delta": uni((bt, d, l), -3, -1, dt),
        "A": -torch.arange(1, n + 1, device=dev, dtype=torch.float32).repeat(d, 1).contiguous(),
        "B": uni((bt, 1, n, l), -1, 1, dt),
        "C": uni((bt, 1, n, l), -1, 1, dt),
        "D": uni((d,), 0.5, 1.5, torch.float32),
        "z": uni((bt, d, l), -2, 2, dt),
        "bias": uni((d,), -1, 0, torch.float32),
    }
    if mode == "bwd":
        s["dout"] = uni((bt, d, l), -1, 1, dt)
        out, x, _ = ext.fwd(s["u"], s["delta"], s["A"], s["B"], s["C"], s["D"], s["z"], s["bias"], True)
        s["x"], s["out"] = x, out
    return s


def call(ext, s, mode):
    """One upstream call; returns its primary output (out_z for the forward, du for the backward)."""
    if mode == "fwd":
        return ext.fwd(s["u"], s["delta"], s["A"], s["B"], s["C"], s["D"], s["z"], s["bias"], True)[2]
    return ext.bwd(s["u"], s["delta"], s["A"], s["B"], s["C"], s["D"], s["z"], s["bias"], s["dout"], s["x"],
                   s["out"], None, True, False)[0]


def set_bytes(s):
    return sum(t.numel() * t.element_size() for t in s.values())


def check(torch, y, what):
    """The head, middle and tail of y were written with finite values, else an error message."""
    flat = y.reshape(-1)
    k = min(4096, flat.numel())
    mid = (flat.numel() - k) // 2
    for name, part in (("head", flat[:k]), ("middle", flat[mid:mid + k]), ("tail", flat[-k:])):
        if not bool(torch.isfinite(part.float()).all()):
            return f"{what}: non-finite values in the {name} of the primary output"
    return None


def time_row(torch, ext, itype, shape, mode, min_iters, min_seconds, seed):
    bt, d, l, n = report.shape_dims(shape)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    sets = [make_set(torch, ext, itype, bt, d, l, n, mode, gen)]
    per = set_bytes(sets[0])
    want = sets_wanted(per)
    while len(sets) < want:
        sets.append(make_set(torch, ext, itype, bt, d, l, n, mode, gen))
    what = f"gpu/{mode}/{itype}/{shape}"
    for s in sets:  # module loading, first touch, clock ramp-up; and the outputs checked
        y = call(ext, s, mode)
        torch.cuda.synchronize()
        err = check(torch, y, what)
        if err:
            raise SystemExit(err)
    stream = torch.cuda.Stream()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, spent, i = [], 0.0, 0
    with torch.cuda.stream(stream):
        while len(times) < min_iters or spent < min_seconds * 1e3:
            call(ext, sets[i % len(sets)], mode)  # keeps the GPU busy while the timed call is enqueued
            e0.record(stream)
            call(ext, sets[(i + 1) % len(sets)], mode)
            e1.record(stream)
            e1.synchronize()
            ms = e0.elapsed_time(e1)
            times.append(ms)
            spent += 2 * ms
            i += 1
            if len(times) >= 100000:
                break
    med = statistics.median(times)
    return {"name": what + "/manual_time", "run_name": what + "/manual_time", "run_type": "iteration",
            "iterations": len(times), "ms": med, "ms_min": min(times), "sets": len(sets),
            "set_MB": per / 1e6, "real_time": med, "time_unit": "ms"}


def self_test():
    """The input sets (ranges, shapes, the backward's forward outputs), the rotation count and the output check, on
    the CPU with a stand-in for the extension. Exit 77 (skipped) without torch."""
    try:
        import torch
    except ImportError:
        print("upstream_kernels self-test: skipped, torch is not importable")
        return 77

    class FakeExt:
        calls = []

        @staticmethod
        def fwd(u, delta, A, B, C, D, z, bias, softplus):
            FakeExt.calls.append(("fwd", softplus))
            x = torch.zeros(u.shape[0], u.shape[1], 1, 2 * A.shape[1])
            return u * 2, x, u * 3

        @staticmethod
        def bwd(u, delta, A, B, C, D, z, bias, dout, x, out, dz, softplus, recompute):
            FakeExt.calls.append(("bwd", softplus, recompute))
            return [dout + out]

    gen = torch.Generator()
    gen.manual_seed(1)
    s = make_set(torch, FakeExt, "bf16", 2, 8, 64, 16, "bwd", gen, dev="cpu")
    assert FakeExt.calls == [("fwd", True)], FakeExt.calls
    for k, lo, hi in (("u", -2, 2), ("z", -2, 2), ("delta", -3, -1), ("bias", -1, 0), ("B", -1, 1), ("C", -1, 1),
                      ("dout", -1, 1), ("D", 0.5, 1.5)):
        v = s[k].float()
        assert lo <= float(v.min()) and float(v.max()) <= hi and float(v.max() - v.min()) > 0.5 * (hi - lo), k
    assert s["u"].dtype == torch.bfloat16 and s["D"].dtype == torch.float32 and s["A"].dtype == torch.float32
    assert tuple(s["B"].shape) == (2, 1, 16, 64) and tuple(s["A"].shape) == (8, 16)
    assert float(s["A"][3, 0]) == -1.0 and float(s["A"][5, 15]) == -16.0  # A[d, n] = -(n + 1)
    assert torch.equal(s["out"], s["u"] * 2)  # the backward's out is the forward's, on this set
    y = call(FakeExt, s, "bwd")
    assert FakeExt.calls[-1] == ("bwd", True, False) and check(torch, y, "row") is None
    y.view(-1)[500] = float("nan")
    assert check(torch, y, "row") is not None
    big = torch.zeros(20000)  # larger than the three 4096-element samples: only the middle one sees element 10000
    big[10000] = float("inf")
    assert "middle" in check(torch, big, "row")
    assert sets_wanted(1e9) == MIN_SETS and sets_wanted(10e6) == 20 and sets_wanted(1e3) == MAX_SETS
    print("upstream_kernels self-test: ok")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here (default: print them)")
    ap.add_argument("--filter", default="", help="only rows whose name contains this (e.g. 'fwd/bf16')")
    ap.add_argument("--min-iters", type=int, default=50, help="timed calls a row at least (default 50)")
    ap.add_argument("--min-seconds", type=float, default=0.5, help="GPU seconds a row at least (default 0.5)")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--self-test", action="store_true", help="check the input sets on the CPU, then exit")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    try:
        import torch
    except ImportError:
        print("upstream_kernels: torch is not importable", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("upstream_kernels: no CUDA device visible to torch", file=sys.stderr)
        return 2
    try:
        import selective_scan_cuda as ext
    except ImportError as e:
        print(f"upstream_kernels: selective_scan_cuda is not importable ({e}); build it with bench/build_upstream.py "
              "and put its folder on PYTHONPATH", file=sys.stderr)
        return 2
    rows = []
    for itype, shape in issue_rows():
        for mode in ("fwd", "bwd"):
            name = f"gpu/{mode}/{itype}/{shape}"
            if args.filter and args.filter not in name:
                continue
            r = time_row(torch, ext, itype, shape, mode, args.min_iters, args.min_seconds, args.seed)
            rows.append(r)
            print(f"{name:36s} {r['ms']:9.4f} ms (min {r['ms_min']:.4f}, {r['iterations']} calls, {r['sets']} sets)",
                  flush=True)
            torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    ctx = {"implementation": "upstream selective_scan_cuda (bench/upstream_kernels.py)",
           "gpu_name": props.name, "gpu_sms": props.multi_processor_count,
           "torch": torch.__version__, "extension": os.path.abspath(ext.__file__),
           "date": datetime.datetime.now().isoformat(timespec="seconds")}
    data = {"context": ctx, "benchmarks": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
