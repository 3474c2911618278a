"""Host cost of one decode step through selscan.torch on CUDA: the wall time per call of

  eager   selscan.torch.selective_state_update(...)              (the binding's cached call plan, no dispatcher)
  op      torch.ops.selscan.selective_state_update(...)         (the custom op, as torch.compile calls it)
  ref     torch.add(x, z)                                        (one small torch kernel launch, for scale)

with the GPU kept busy (torch.cuda._sleep before each group of calls), so that no call waits for the device and
the time is the host's alone: argument handling, output allocation, the library's checks and the launch.
Acceptance (issue #14): <= 20 us per decode step.

    SELSCAN_LIBRARY=build/<preset>/libselscan.so PYTHONPATH=python python3 bench/bench_decode_host.py
"""

import argparse
import statistics
import time

import torch

import selscan  # noqa: F401  (loads the library)
from selscan.torch import selective_state_update


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dim", type=int, default=5120)
    ap.add_argument("--dstate", type=int, default=16)
    ap.add_argument("--group", type=int, default=200, help="calls per timed group")
    ap.add_argument("--groups", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_decode_host.py: torch sees no CUDA device")
    dev = torch.device("cuda")
    Bt, D, N = args.batch, args.dim, args.dstate
    bf = torch.bfloat16
    x, dt, z = (torch.randn(Bt, D, device=dev, dtype=bf) for _ in range(3))
    B, C = (torch.randn(Bt, N, device=dev, dtype=bf) for _ in range(2))
    A = -torch.rand(D, N, device=dev) - 0.5
    Dw, bias = torch.randn(D, device=dev), torch.rand(D, device=dev) - 4
    pool = torch.randn(4 * Bt, D, N, device=dev)
    slots = torch.randperm(4 * Bt, device=dev)[:Bt].to(torch.int32)

    paths = {
        "eager": lambda: selective_state_update(pool, x, dt, A, B, C, D=Dw, z=z, dt_bias=bias, dt_softplus=True,
                                                state_batch_indices=slots),
        "op": lambda: torch.ops.selscan.selective_state_update(pool, x, dt, A, B, C, Dw, z, bias, True, slots, -1),
        "ref": lambda: torch.add(x, z),
    }
    # GPU time of one group of calls, so that the sleep in front of a timed group outlasts its enqueueing.
    sleep_cycles = int(2e9 * args.group * 60e-6)
    print(f"Bt={Bt} D={D} N={N}, {args.groups} groups of {args.group} calls, GPU kept busy; "
          f"{torch.cuda.get_device_name()}")
    print(f"{'path':8s} {'us/call (median)':>18s} {'min':>8s}")
    for name, fn in paths.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        per_call = []
        for _ in range(args.groups):
            torch.cuda._sleep(sleep_cycles)
            t0 = time.perf_counter()
            for _ in range(args.group):
                fn()
            per_call.append((time.perf_counter() - t0) / args.group * 1e6)
            torch.cuda.synchronize()
        print(f"{name:8s} {statistics.median(per_call):18.2f} {min(per_call):8.2f}")


if __name__ == "__main__":
    main()
