"""Host cost of one decode step through the Python binding: the wall time per call of

  eager   selscan.torch.selective_state_update(...)              (the binding's cached call plan, no dispatcher)
  op      torch.ops.selscan.selective_state_update(...)         (the custom op, as torch.compile calls it)
  vllm    selscan.integrations.vllm.selective_state_update(...) (vLLM's signature, out given: no allocation)
  stable  torch.ops.selscan.state_update.default(...)            (the op library selscan_torch_ops on torch's stable
                                                                 ABI, when it loads: the checks in C++, out allocated)
  lib     the C ABI alone: selscan_state_update on the eager call's argument struct (ctypes call included)
  alloc   torch.empty_like(x)                                    (the output allocation inside eager)
  ref     torch.add(x, z)                                        (one small torch op, for scale)

and the binding's own cost, eager - lib (argument checks, allocation, pointers, ctypes). The paths take turns
group by group (medians over the groups), so a drift of the host's speed reaches all of them alike.

On CUDA (the default when torch sees a GPU) the GPU is kept busy (torch.cuda._sleep before each group of calls),
so that no call waits for the device and the time is the host's alone; lib is then the library's checks and the
kernel launch. Acceptance: eager <= 15 us per decode step, lib <= 3 us (H200 host).
On the CPU (--device cpu, or no GPU) the library runs the step itself, so the default shape is tiny and lib is
mostly the library's checks; eager - lib is the binding's overhead, the same Python work as on CUDA.

    SELSCAN_LIBRARY=build/<preset>/libselscan.so PYTHONPATH=python python3 bench/bench_decode_host.py [--device cpu]
"""

import argparse
import statistics
import time

import torch

import selscan  # noqa: F401  (loads the library)
from selscan import _decode, _decode_torch, _plan
from selscan.torch import selective_state_update

try:
    from selscan.integrations import vllm as _vllm
except ImportError:  # a binding without the integration (an older checkout)
    _vllm = None


def _eager_plan():
    """The call plan of the eager calls made so far (the one signature this benchmark uses)."""
    tls = getattr(_decode, "_tls", None)  # torch calls: generated steps by x's shape
    for steps in (tls.__dict__.get("steps", {}) if tls is not None else {}).values():
        return steps[0].plan
    for call in _plan.cache("state_update").values():  # older bindings
        plan = getattr(call, "plan", None) or getattr(call, "__globals__", {}).get("plan")
        if plan is not None:
            return plan
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--batch", type=int, default=None, help="default 64 on CUDA, 1 on the CPU")
    ap.add_argument("--dim", type=int, default=None, help="default 5120 on CUDA, 8 on the CPU")
    ap.add_argument("--dstate", type=int, default=None, help="default 16 on CUDA, 8 on the CPU")
    ap.add_argument("--group", type=int, default=200, help="calls per timed group")
    ap.add_argument("--groups", type=int, default=30)
    args = ap.parse_args()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench_decode_host.py: --device cuda but torch sees no CUDA device")
    dev = torch.device("cuda" if cuda else "cpu")
    Bt = args.batch or (64 if cuda else 1)
    D = args.dim or (5120 if cuda else 8)
    N = args.dstate or (16 if cuda else 8)
    io = torch.bfloat16 if cuda else torch.float32
    x, dt, z = (torch.randn(Bt, D, device=dev, dtype=io) for _ in range(3))
    B, C = (torch.randn(Bt, N, device=dev, dtype=io) for _ in range(2))
    A = -torch.rand(D, N, device=dev) - 0.5
    Dw, bias = torch.randn(D, device=dev), torch.rand(D, device=dev) - 4
    pool = torch.randn(4 * Bt, D, N, device=dev)
    slots = torch.randperm(4 * Bt, device=dev)[:Bt].to(torch.int32)
    out = torch.empty_like(x)

    def eager():
        return selective_state_update(pool, x, dt, A, B, C, D=Dw, z=z, dt_bias=bias, dt_softplus=True,
                                      state_batch_indices=slots)

    paths = {
        "eager": eager,
        "op": lambda: torch.ops.selscan.selective_state_update(pool, x, dt, A, B, C, Dw, z, bias, True, slots, -1),
    }
    if _vllm is not None:
        paths["vllm"] = lambda: _vllm.selective_state_update(pool, x, dt, A, B, C, Dw, z, bias, dt_softplus=True,
                                                              state_batch_indices=slots, pad_slot_id=-1, out=out)
    stable = _decode_torch.load_stable_ops() if hasattr(_decode_torch, "load_stable_ops") else None
    if stable is not None:
        paths["stable"] = lambda: stable(pool, x, dt, A, B, C, Dw, z, bias, True, slots, -1, None, None)
    keep = eager()
    plan = _eager_plan()
    if plan is not None:
        paths["lib"] = lambda: plan.fn(plan.a_addr, plan.e_addr)
    paths["alloc"] = lambda: torch.empty_like(x)
    paths["ref"] = lambda: torch.add(x, z)

    sleep_cycles = int(2e9 * args.group * 60e-6)  # GPU time that outlasts the enqueueing of one group
    where = torch.cuda.get_device_name() if cuda else "CPU path (the library computes the step on this thread)"
    print(f"Bt={Bt} D={D} N={N} {str(io).replace('torch.', '')}, {args.groups} groups of {args.group} calls"
          f"{', GPU kept busy' if cuda else ''}; {where}")
    print(f"{'path':8s} {'us/call (median)':>18s} {'min':>8s}")
    # The paths take turns group by group, so a drift of the host's speed during the run (clocks, other load)
    # reaches every path alike instead of whichever was timed at the time.
    def refresh():
        """Before the lib row: every eager call rewrites the plan's argument struct with the out it allocates and
        returns. One more call, its out kept alive, so that the lib row writes into that out, never into memory a
        freed output had."""
        return eager()

    for name, fn in paths.items():
        if name == "lib":
            keep = refresh()
        for _ in range(50):
            fn()
    if cuda:
        torch.cuda.synchronize()
    per_call = {name: [] for name in paths}
    for _ in range(args.groups):
        for name, fn in paths.items():
            if name == "lib":
                keep = refresh()
            if cuda:
                torch.cuda._sleep(sleep_cycles)
            t0 = time.perf_counter()
            for _ in range(args.group):
                fn()
            per_call[name].append((time.perf_counter() - t0) / args.group * 1e6)
            if cuda:
                torch.cuda.synchronize()
    med = {}
    for name, ts in per_call.items():
        med[name] = statistics.median(ts)
        print(f"{name:8s} {med[name]:18.2f} {min(ts):8.2f}")
    if "lib" in med:
        print(f"binding (eager - lib): {med['eager'] - med['lib']:.2f} us per call")
        if "stable" in med:
            print(f"stable op (stable - lib): {med['stable'] - med['lib']:.2f} us per call")
    if stable is None and getattr(_decode_torch, "stable_ops_error", None):
        print(f"stable: not measured ({_decode_torch.stable_ops_error})")
    del keep


if __name__ == "__main__":
    main()
