"""The decode step beside mamba_ssm's Triton kernel (selective_state_update), same tensors, GPU time per step.

Shapes (bf16 x, dt, B, C, z, fp16 with an fp16 state; fp32 A, D, dt_bias; softplus), as the serving issue's
table has them:
  m1          Mamba-1 form: D 5120, N 16, state (S, D, N)
  m2          Mamba-2 form: 80 heads x 64, N 128, 1 group, state (S, H, P, N); dt, A, D, dt_bias broadcast over
              the head dim (stride 0), as Mamba-2 passes them
  m2_pool2x   m2 with the sequences' states scattered over a pool of 2*Bt slots (state_batch_indices)
each with fp32 state, and m2 also with bf16 and fp16 state (vLLM's default state cache dtype is the model's).

Two timings per cell, both CUDA events around many back-to-back steps, median of repeats:
  loop    eager calls from Python, as a serving loop without graphs makes them (host launch cost included where it
          is larger than the kernel)
  graph   the same steps captured in a CUDA graph and replayed: the kernels' GPU time and launch gaps only
States rotate through windows of >= 256 MB so no step finds its slot in L2. The floor is the state read and
written once at the copy bandwidth measured in the same run (read + write counted).

mamba_ssm is not installed: its Triton kernel is loaded from a checkout's source (--mamba, the folder holding
mamba_ssm/), without executing the package's __init__ (which would import its CUDA extensions).

    SELSCAN_LIBRARY=build/gpu-check/libselscan.so PYTHONPATH=python python3 bench/decode_vs_triton.py \
        --mamba .upstream [--json out.json]
"""

import argparse
import importlib
import json
import os
import statistics
import sys
import types

import torch

import selscan.torch as sst

BATCHES = (1, 16, 64, 256)


def load_triton_update(mamba_root):
    """mamba_ssm.ops.triton.selective_state_update from a source checkout, or None (with the reason printed)."""
    if not mamba_root:
        print("triton: no --mamba checkout given; selscan rows only")
        return None
    pkg_dir = os.path.join(mamba_root, "mamba_ssm")
    if not os.path.isdir(pkg_dir):
        print(f"triton: {pkg_dir} does not exist; selscan rows only")
        return None
    # Namespace stand-ins for the packages, so that their __init__ files (CUDA extension imports) never run.
    for name, sub in (("mamba_ssm", ""), ("mamba_ssm.ops", "ops"), ("mamba_ssm.ops.triton", "ops/triton")):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(pkg_dir, sub)] if sub else [pkg_dir]
            sys.modules[name] = mod
    try:
        return importlib.import_module("mamba_ssm.ops.triton.selective_state_update").selective_state_update
    except Exception as e:  # noqa: BLE001 - report any import failure and go on without the baseline
        print(f"triton: cannot import selective_state_update from {pkg_dir}: {type(e).__name__}: {e}")
        return None


def copy_bandwidth(dev):
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
    times = []
    for i in range(12):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        if i >= 2:
            times.append(e0.elapsed_time(e1) * 1e-3)
    del src, dst
    return 2.0 * n / statistics.median(times)


class Cell:
    """The tensors of one table cell: every step reads the same inputs and a different window of state slots."""

    def __init__(self, form, batch, state_dtype, pool2x, dev, seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        bf = torch.float16 if state_dtype == torch.float16 else torch.bfloat16  # a 16-bit state has x's dtype

        def rnd(*shape, dtype=bf, scale=1.0, shift=0.0):
            return (torch.rand(*shape, device=dev, generator=g) * scale + shift).to(dtype)

        self.batch = batch
        if form == "m1":
            D, N = 5120, 16
            self.slot_shape = (D, N)
            self.x, self.z = rnd(batch, D, scale=2, shift=-1), rnd(batch, D, scale=2, shift=-1)
            self.dt = rnd(batch, D, scale=0.1, shift=-4.5)
            self.A = rnd(D, N, dtype=torch.float32, scale=-1.9, shift=-0.1)
            self.B, self.C = rnd(batch, N, scale=2, shift=-1), rnd(batch, N, scale=2, shift=-1)
            self.D = rnd(D, dtype=torch.float32, scale=2, shift=-1)
            self.dt_bias = rnd(D, dtype=torch.float32, scale=0.5, shift=-4)
        else:
            H, P, N = 80, 64, 128
            self.slot_shape = (H, P, N)
            self.x, self.z = rnd(batch, H, P, scale=2, shift=-1), rnd(batch, H, P, scale=2, shift=-1)
            self.dt = rnd(batch, H, scale=0.1, shift=-4.5)[:, :, None].expand(batch, H, P)
            self.A = rnd(H, dtype=torch.float32, scale=-1.9, shift=-0.1)[:, None, None].expand(H, P, N)
            self.B, self.C = rnd(batch, 1, N, scale=2, shift=-1), rnd(batch, 1, N, scale=2, shift=-1)
            self.D = rnd(H, dtype=torch.float32, scale=2, shift=-1)[:, None].expand(H, P)
            self.dt_bias = rnd(H, dtype=torch.float32, scale=0.5, shift=-4)[:, None].expand(H, P)
        slot_bytes = torch.Size(self.slot_shape).numel() * torch.empty((), dtype=state_dtype).element_size()
        per_window = (2 if pool2x else 1) * batch
        windows = max(2, -(-(256 << 20) // (per_window * slot_bytes)))
        self.state = rnd(windows * per_window, *self.slot_shape, dtype=state_dtype, scale=2, shift=-1)
        self.state_bytes = batch * slot_bytes
        self.windows = []
        for w in range(windows):
            if pool2x:
                idx = (torch.randperm(per_window, device=dev, generator=g)[:batch] + w * per_window).to(torch.int32)
                self.windows.append((self.state, idx))
            else:
                self.windows.append((self.state[w * batch:(w + 1) * batch], None))

    def step_fn(self, which, fn):
        """A callable doing step k of the rotation with `fn` (selscan or triton)."""
        def step(k):
            state, idx = self.windows[k % len(self.windows)]
            if which == "selscan":
                sst.selective_state_update(state, self.x, self.dt, self.A, self.B, self.C, D=self.D, z=self.z,
                                           dt_bias=self.dt_bias, dt_softplus=True, state_batch_indices=idx)
            else:
                fn(state, self.x, self.dt, self.A, self.B, self.C, D=self.D, z=self.z, dt_bias=self.dt_bias,
                   dt_softplus=True, state_batch_indices=idx)

        return step


def time_loop(step, calls=64, reps=7):
    for k in range(8):
        step(k)
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for k in range(calls):
            step(k)
        e1.record()
        e1.synchronize()
        per.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(per)


def time_graph(step, calls=32, reps=15):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for k in range(4):
            step(k)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for k in range(calls):
            step(k)
    graph.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        per.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(per)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mamba", default=os.environ.get("MAMBA_SRC", ""),
                    help="a state-spaces/mamba checkout (the folder holding mamba_ssm/)")
    ap.add_argument("--json", default="")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_vs_triton.py: torch sees no CUDA device")
    dev = torch.device("cuda")
    triton_update = load_triton_update(args.mamba)
    bw = copy_bandwidth(dev)
    batches = [int(b) for b in args.batches.split(",")]
    cells = [("m1", torch.float32, False), ("m2", torch.float32, False), ("m2", torch.bfloat16, False),
             ("m2", torch.float16, False), ("m2_pool2x", torch.float32, True)]
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw * 1e-9:.0f} GB/s (read + write)")
    header = (f"{'cell':22s} {'Bt':>4s} {'floor':>7s} | {'loop selscan':>12s} {'triton':>8s} {'x':>6s} | "
              f"{'graph selscan':>13s} {'triton':>8s} {'x':>6s} {'%floor':>7s}")
    print(header)
    rows = []
    for form, sd, pool2x in cells:
        for bt in batches:
            if pool2x and bt not in (64, 256):
                continue
            cell = Cell("m1" if form == "m1" else "m2", bt, sd, pool2x, dev, seed=bt)
            floor_us = 2.0 * cell.state_bytes / bw * 1e6
            row = {"cell": f"{form}/{str(sd).split('.')[-1]}", "batch": bt, "floor_us": floor_us}
            for which in ("selscan", "triton"):
                if which == "triton" and triton_update is None:
                    continue
                step = cell.step_fn(which, triton_update)
                row[f"loop_{which}_us"] = time_loop(step)
                row[f"graph_{which}_us"] = time_graph(step)
            rows.append(row)

            def ratio(mode):
                t = row.get(f"{mode}_triton_us")
                return f"{t / row[f'{mode}_selscan_us']:6.2f}" if t else f"{'-':>6s}"

            def val(key):
                return f"{row[key]:8.1f}" if key in row else f"{'-':>8s}"

            print(f"{row['cell']:22s} {bt:4d} {floor_us:7.1f} | {row['loop_selscan_us']:12.1f} "
                  f"{val('loop_triton_us')} {ratio('loop')} | {row['graph_selscan_us']:13.1f} "
                  f"{val('graph_triton_us')} {ratio('graph')} {100 * floor_us / row['graph_selscan_us']:6.0f}%",
                  flush=True)
            del cell
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_GB_s": bw * 1e-9, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
