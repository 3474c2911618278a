#!/usr/bin/env python3
"""Where one training step of transformers' MambaForCausalLM spends its time: forward and backward wall time (each
followed by a device sync), the step without syncs, and torch.profiler's tables (own CPU time per op, then GPU time
per kernel) over two steps. bench/transformers_model.py's shape and model (mamba-130m by default, bf16); selscan
enabled unless --config torch. The question it answers: at 1x256 a step takes ~8x the prefill forward, for selscan and
upstream alike (validation/gpu-runs.md, run 63): which ops' host or GPU time is that.

    SELSCAN_LIBRARY=build/gpu-check/libselscan.so PYTHONPATH=python python3 bench/train_step_profile.py
    SELSCAN_LIBRARY=build/lead/libselscan.so PYTHONPATH=python python3 bench/train_step_profile.py --device cpu \\
        --layers 2 --hidden 64 --vocab 97          # a smoke run of the script on the CPU
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_model as tm  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    tm.add_model_args(ap)
    ap.add_argument("--config", choices=("selscan", "torch"), default="selscan")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="1x256", help="batch x seqlen")
    args = ap.parse_args()
    if args.config == "selscan":
        from selscan.integrations import transformers as sst
        sst.enable()
    dev = torch.device(args.device)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    model = tm.build_model(args, dev, torch.bfloat16).train()
    bt, L = (int(v) for v in args.shape.split("x"))
    ids = torch.randint(0, args.vocab, (bt, L), device=dev)

    def step(parts=None):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids, use_cache=False)
        if parts is not None:
            sync()
            t1 = time.perf_counter()
        out.loss.backward()
        if parts is not None:
            sync()
            parts.append((t1 - t0, time.perf_counter() - t1))

    for _ in range(5):
        step()
    sync()
    parts = []
    for _ in range(11):
        step(parts)
    parts.sort(key=lambda p: p[0] + p[1])
    print(f"config {args.config} shape {args.shape}: median step with syncs: forward {1e3 * parts[5][0]:.2f} ms, "
          f"backward {1e3 * parts[5][1]:.2f} ms")
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    sync()
    print(f"step without syncs: {1e2 * (time.perf_counter() - t0):.2f} ms (mean of 10)")
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            step()
        sync()
    ka = prof.key_averages()
    print(ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    if dev.type == "cuda":
        print(ka.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60))


if __name__ == "__main__":
    main()
