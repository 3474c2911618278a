#!/usr/bin/env python3
"""Host cost and latency of the Python paths, on a CUDA GPU (docs/python.md reports the results).

    python3 bench/python_host.py [--json out.json] [--rows host|loop|all] [--no-upstream]

For each shape (bf16 inputs, fp32 weights, variable B/C, D, z, delta_bias, softplus, as issue #12's table):
  host fwd   the CPU time of one selscan.torch.selective_scan_fn call (inputs requiring grad) while the GPU is
             kept busy by a long kernel queued first, so only the Python and C host work is seen
  host inf   the same for one forward without a gradient (inputs not requiring grad, under torch.no_grad())
  host bwd   the same for one torch.autograd.grad over the eight inputs
  latency    per call on an idle GPU, CUDA events around it (host work and kernels together): `fwd` one training
             forward, `bwd` its autograd.grad over the eight inputs once the forward has finished (the issue's
             per-call columns); the implementations take turns call by call, medians
  loop       back-to-back forward calls and forward+grad calls: GPU time per call (events around the loop);
             compare with the C benchmark (selscan_bench) rows of the same shapes
Where the op library selscan_torch_ops loads (built with -DSELSCAN_TORCH_OPS=ON, beside libselscan), the row
`selscan` is the forward through its ops selscan::scan_fwd (no gradient) and selscan::scan_fwd_for_grad (with one)
and the row `selscan-ctypes` the same calls through the ctypes route (the ops set aside for the call);
SELSCAN_TORCH_STABLE=0 leaves only the ctypes route (row `selscan`).
Upstream's selective_scan_cuda, when importable, is timed through the same autograd path (a thin
autograd.Function calling its fwd/bwd as mamba_ssm's SelectiveScanFn does). The numpy (CPU path) and CuPy rows
time a forward on a small shape: numpy reports the call minus the bare library call on the same arrays.
Medians over repetitions throughout; the host rows interleave the implementations repetition by repetition.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

import selscan
import selscan.torch as st
from selscan import _plan
from selscan.torch import selective_scan_fn
from upstream_scan import upstream_fn

HOST_SHAPES = [(8, 1536, 2048, 16), (1, 5120, 512, 16), (1, 1536, 64, 16), (4, 2048, 2048, 64)]
LOOP_SHAPES = [(8, 1536, 2048, 16, "bf16"), (4, 5120, 2048, 16, "bf16"), (1, 2048, 65536, 16, "bf16"),
               (1, 5120, 512, 16, "bf16"), (8, 1536, 2048, 16, "fp32"), (4, 2048, 2048, 64, "bf16")]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def ours(u, delta, A, B, C, D, z, bias, softplus):
    return selective_scan_fn(u, delta, A, B, C, D, z, bias, softplus)


def ours_ctypes(u, delta, A, B, C, D, z, bias, softplus):
    """The ctypes route: selscan.torch without its ops (a forward run without them leaves its backward on the
    ctypes route too)."""
    ops = (st._scan_op, st._scan_grad_op, st._scan_bwd_op)
    st._scan_op, st._scan_grad_op, st._scan_bwd_op = None, None, None
    try:
        return selective_scan_fn(u, delta, A, B, C, D, z, bias, softplus)
    finally:
        st._scan_op, st._scan_grad_op, st._scan_bwd_op = ops


def make(shape, dtype, grad=True, seed=0):
    bt, d, L, n = shape
    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s, dt=dtype, scale=1.0):
        return (scale * torch.randn(*s, generator=g, device="cuda")).to(dt)

    ts = [r(bt, d, L), (0.5 * torch.rand(bt, d, L, generator=g, device="cuda") - 4.0).to(dtype),
          -torch.rand(d, n, generator=g, device="cuda") - 0.5, r(bt, n, L), r(bt, n, L),
          r(d, dt=torch.float32), r(bt, d, L), r(d, dt=torch.float32, scale=0.1)]
    return [t.requires_grad_(grad) for t in ts]


def busy(ms):
    """Queues a kernel that keeps the GPU busy for about `ms` milliseconds."""
    torch.cuda._sleep(int(ms * 1e-3 * CLOCK_HZ))


def host_rep(fn, args, calls):
    """One repetition's per-call host times (s) of fn(*args) (forward), of autograd.grad over its results
    (backward), and of the same forward without a gradient."""
    torch.cuda.synchronize()
    busy(400)
    t0 = time.perf_counter()
    ys = [fn(*args, True) for _ in range(calls)]
    fwd = (time.perf_counter() - t0) / calls
    dy = torch.ones_like(ys[0])
    t = 0.0
    for y in ys:
        t0 = time.perf_counter()
        torch.autograd.grad(y, args, dy)
        t += time.perf_counter() - t0
    bwd = t / calls
    torch.cuda.synchronize()
    busy(400)
    plain = [a.detach() for a in args]
    with torch.no_grad():
        t0 = time.perf_counter()
        ys = [fn(*plain, True) for _ in range(calls)]  # kept, as the forward's: no block reused mid-loop
        inf = (time.perf_counter() - t0) / calls
    del ys
    torch.cuda.synchronize()
    return fwd, inf, bwd


def host_times(cases, calls, reps):
    """{name: (median host fwd, inf, bwd in ms)} over reps repetitions for each (fn, args) of cases, the
    implementations interleaved (each repetition runs them all, in an order rotated every repetition), so that a
    drift of the machine over the run weighs on every implementation alike."""
    names = list(cases)
    times = {n: [] for n in names}
    for r in range(reps):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn, args = cases[n]
            times[n].append(host_rep(fn, args, calls))
    return {n: tuple(statistics.median(x[i] for x in times[n]) * 1e3 for i in range(3)) for n in names}


def latency_once(fn, args, dy):
    """(fwd, bwd) ms of one training forward and then its backward, each started on an idle GPU."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    e0.record()
    y = fn(*args, True)
    e1.record()
    e1.synchronize()
    fwd = e0.elapsed_time(e1)
    e0.record()
    torch.autograd.grad(y, args, dy)
    e1.record()
    e1.synchronize()
    return fwd, e0.elapsed_time(e1)


def latencies(cases, reps):
    """{name: (median fwd, median bwd) ms} per (fn, args) of cases, the implementations taking turns call by call
    (order rotated every repetition), as host_times does, so that a drift of the host weighs on all alike."""
    names = list(cases)
    dys = {n: torch.ones_like(cases[n][1][0]) for n in names}
    times = {n: [] for n in names}
    for r in range(reps):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn, args = cases[n]
            times[n].append(latency_once(fn, args, dys[n]))
    return {n: tuple(statistics.median(x[i] for x in times[n]) for i in range(2)) for n in names}


def loop_times(fn, args, iters, reps):
    """GPU ms per call of back-to-back forwards (training forward: inputs require grad) and of forward+grad."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dy = torch.ones_like(args[0])
    f, fb = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        e0.record()
        for _ in range(iters):
            fn(*args, True)
        e1.record()
        e1.synchronize()
        f.append(e0.elapsed_time(e1) / iters)
        torch.cuda.synchronize()
        e0.record()
        for _ in range(iters):
            torch.autograd.grad(fn(*args, True), args, dy)
        e1.record()
        e1.synchronize()
        fb.append(e0.elapsed_time(e1) / iters)
    return statistics.median(f), statistics.median(fb)


def xp_host(n_calls=2000, reps=7):
    """Forward host time of the numpy (CPU path) and CuPy fast paths on a small shape, in ms."""
    res = {}
    rng = np.random.default_rng(0)
    bt, d, L, n = 1, 16, 16, 16
    arrs = [rng.standard_normal((bt, d, L)).astype(np.float32), rng.random((bt, d, L)).astype(np.float32),
            -rng.random((d, n)).astype(np.float32), rng.standard_normal((bt, n, L)).astype(np.float32),
            rng.standard_normal((bt, n, L)).astype(np.float32), rng.random(d).astype(np.float32),
            rng.standard_normal((bt, d, L)).astype(np.float32), rng.random(d).astype(np.float32)]

    def call():
        return selscan.selective_scan_fn(*arrs[:5], D=arrs[5], z=arrs[6], delta_bias=arrs[7], delta_softplus=True)

    call()
    plan = next(p for p in _plan.cache("xp_fwd").values() if p is not None)
    outs = [np.empty((bt, d, L), np.float32) for _ in range(2)]
    plan.info[1](tuple(arrs) + (None,) + tuple(outs), 0, 0)  # the plan's caller: these arrays' addresses
    whole, bare = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n_calls):
            call()
        whole.append((time.perf_counter() - t0) / n_calls)
        t0 = time.perf_counter()
        for _ in range(n_calls):
            plan.fn(plan.a_addr, plan.e_addr)
        bare.append((time.perf_counter() - t0) / n_calls)
    res["numpy_fwd_call_ms"] = statistics.median(whole) * 1e3
    res["numpy_fwd_library_ms"] = statistics.median(bare) * 1e3
    res["numpy_fwd_binding_ms"] = res["numpy_fwd_call_ms"] - res["numpy_fwd_library_ms"]
    try:
        import cupy as cp
    except ImportError:
        return res
    carrs = [cp.asarray(a) for a in arrs]

    def ccall():
        return selscan.selective_scan_fn(*carrs[:5], D=carrs[5], z=carrs[6], delta_bias=carrs[7],
                                         delta_softplus=True)

    ccall()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        busy(300)  # torch's and CuPy's default streams are both the legacy default stream
        t0 = time.perf_counter()
        for _ in range(200):
            ccall()
        times.append((time.perf_counter() - t0) / 200)
        cp.cuda.Device().synchronize()
    res["cupy_fwd_host_ms"] = statistics.median(times) * 1e3
    return res


def main():
    global CLOCK_HZ
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--rows", default="all", choices=["host", "loop", "xp", "all"])
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        return 0
    CLOCK_HZ = torch.cuda.get_device_properties(0).clock_rate * 1e3 if hasattr(
        torch.cuda.get_device_properties(0), "clock_rate") else 1.98e9
    impls = {"selscan": ours}
    if st._scan_op is not None:
        impls["selscan-ctypes"] = ours_ctypes
    up = None if args.no_upstream else upstream_fn()
    if up is not None:
        impls["upstream"] = up
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; {selscan.build_info()}; "
          f"upstream {'timed' if up else 'not importable'}; scan forward through "
          f"{'selscan::scan_fwd[_for_grad] (row selscan; selscan-ctypes: the ctypes route)' if st._scan_op else 'ctypes'}")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "library": selscan.build_info(),
               "host": [], "loop": [], "xp": {}}
    if args.rows in ("host", "all"):
        print(f"{'shape':>16} {'impl':>14} {'host fwd ms':>12} {'host inf ms':>12} {'host bwd ms':>12} "
              f"{'lat fwd ms':>11} {'lat bwd ms':>11}")
        for shape in HOST_SHAPES:
            cases = {}
            for name, fn in impls.items():
                ts = make(shape, torch.bfloat16)
                y = fn(*ts, True)  # plans, allocator, lazy module loads
                torch.autograd.grad(y, ts, torch.ones_like(y))  # the backward's plan
                with torch.no_grad():
                    fn(*[t.detach() for t in ts], True)  # the no-grad route's first call
                cases[name] = (fn, ts)
            host = host_times(cases, 20 if shape[0] * shape[1] * shape[2] > 2**22 else 50, args.reps)
            lat = latencies(cases, 9 * args.reps)
            for name in cases:
                hf, hi, hb = host[name]
                lf, lb = lat[name]
                row = {"shape": "x".join(map(str, shape[:3])) + f":{shape[3]}", "impl": name, "host_fwd_ms": hf,
                       "host_inf_ms": hi, "host_bwd_ms": hb, "latency_fwd_ms": lf, "latency_bwd_ms": lb}
                results["host"].append(row)
                print(f"{row['shape']:>16} {name:>14} {hf:12.4f} {hi:12.4f} {hb:12.4f} {lf:11.4f} {lb:11.4f}")
    if args.rows in ("loop", "all"):
        print(f"{'shape':>16} {'dtype':>5} {'impl':>14} {'loop fwd ms':>12} {'loop fwd+bwd ms':>16}")
        for *shape, dt in LOOP_SHAPES:
            for name, fn in impls.items():
                if name == "selscan-ctypes":
                    continue  # GPU time per call: the same kernels as row selscan
                ts = make(tuple(shape), DTYPES[dt])
                fn(*ts, True)
                f, fb = loop_times(fn, ts, 10 if shape[2] < 65536 else 3, 5)
                row = {"shape": "x".join(map(str, shape[:3])) + f":{shape[3]}", "dtype": dt, "impl": name,
                       "loop_fwd_ms": f, "loop_fwd_bwd_ms": fb, "loop_bwd_ms": fb - f}
                results["loop"].append(row)
                print(f"{row['shape']:>16} {dt:>5} {name:>14} {f:12.4f} {fb:16.4f}")
                del ts
                torch.cuda.empty_cache()
    if args.rows in ("xp", "all"):
        results["xp"] = xp_host()
        for k, v in results["xp"].items():
            print(f"{k}: {v:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
