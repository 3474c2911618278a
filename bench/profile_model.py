#!/usr/bin/env python3
"""Where a MambaForCausalLM step spends its time: torch.profiler over one training step and one prefill of the model
bench/transformers_model.py builds, in one configuration per process (upstream / selscan / torch, as there), printing
the operators and kernels by GPU time and by host time. What to change next is read off these tables.

    python3 bench/profile_model.py --config selscan --shapes 8x2048,1x256
    PYTHONPATH=<mamba_ssm and causal_conv1d builds> python3 bench/profile_model.py --config upstream

Needs torch with CUDA and transformers >= 5; for selscan a CUDA build of libselscan (SELSCAN_LIBRARY).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_model as tm  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=("upstream", "selscan", "torch"), required=True)
    ap.add_argument("--shapes", default="8x2048,1x256")
    ap.add_argument("--rows", type=int, default=30)
    tm.add_model_args(ap)
    ap.add_argument("--python", action="store_true", help="cProfile the host side instead (train, prefill, and "
                    "generate at batch 1): where the Python time of a step goes, the GPU kept busy")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    if args.config == "selscan":
        from selscan.integrations import transformers as sst
        sst.enable()
    device = torch.device("cuda")
    model = tm.build_model(args, device, torch.bfloat16)
    if args.python:
        return host_profile(args, model, device)
    for shape in args.shapes.split(","):
        bt, L = (int(v) for v in shape.split("x"))
        train, prefill = tm.phases(model, torch.randint(0, args.vocab, (bt, L), device=device))
        for name, fn, mode in (("train", train, model.train), ("prefill", prefill, model.eval)):
            mode()
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            ka = prof.key_averages()
            print(f"\n### {args.config} {name} {shape}: by GPU time")
            print(ka.table(sort_by="self_device_time_total", row_limit=args.rows, max_name_column_width=70))
            print(f"\n### {args.config} {name} {shape}: by host time")
            print(ka.table(sort_by="self_cpu_time_total", row_limit=args.rows // 2, max_name_column_width=70))
    return 0


def host_profile(args, model, device):
    import cProfile
    import pstats
    import time
    import torch
    shape = args.shapes.split(",")[-1]
    bt, L = (int(v) for v in shape.split("x"))
    train, prefill = tm.phases(model, torch.randint(0, args.vocab, (bt, L), device=device))
    prompt = torch.randint(0, args.vocab, (1, 64), device=device)

    def generate():
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)

    for name, fn, mode, reps in (("train", train, model.train, 10), ("prefill", prefill, model.eval, 20),
                                 ("generate b1", generate, model.eval, 2)):
        mode()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        per = (time.perf_counter() - t0) / reps
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        print(f"\n### {args.config} {name} {shape if name != 'generate b1' else ''}: {per * 1e3:.2f} ms a call "
              f"without the profiler")
        st = pstats.Stats(pr)
        st.sort_stats("tottime").print_stats(args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
