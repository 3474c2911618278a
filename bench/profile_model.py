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
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50280)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    if args.config == "selscan":
        from selscan.integrations import transformers as sst
        sst.enable()
    device = torch.device("cuda")
    model = tm.build_model(args, device, torch.bfloat16)
    for shape in args.shapes.split(","):
        bt, L = (int(v) for v in shape.split("x"))
        ids = torch.randint(0, args.vocab, (bt, L), device=device)

        def train():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

        def prefill():
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)

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


if __name__ == "__main__":
    sys.exit(main())
