#!/usr/bin/env python3
"""The real client, measured: transformers' MambaForCausalLM in three configurations, each in its own process (what
transformers binds for its kernels is decided once, when its Mamba module is imported):

  upstream  mamba-ssm + causal-conv1d importable (--upstream-path: the folders holding a built `mamba_ssm` and
            `causal_conv1d` with their extensions, e.g. bench/build_upstream.py's and bench/build_causal_conv1d.py's
            outputs): transformers' own fast path, mamba_inner_fn and the kernels
  selscan   neither importable, `selscan.integrations.transformers.enable()` called before the model is built
  torch     neither importable: the model's own PyTorch path

Per configuration: training (forward + backward) and prefill tokens/s at each --shapes entry, generate() new
tokens/s at each --gen-batches entry (prompt --prompt, --new-tokens greedy tokens), peak memory of each phase. Then
a correctness check of selscan against the torch path in fp32 at a small shape (logits, loss and every gradient),
and the table with the ratios selscan / upstream and selscan / torch.

    python3 bench/transformers_model.py --upstream-path build/upstream:build/gpu-check/conv-upstream --json out.json
    python3 bench/transformers_model.py --device cpu --layers 2 --hidden 64 --shapes 2x64 --gen-batches 1 \\
        --prompt 16 --new-tokens 8       # a smoke run of the script itself on the CPU

Needs torch and transformers >= 5 (MambaForCausalLM); a CUDA build of libselscan for --device cuda (SELSCAN_LIBRARY
or an installed package). Exit status 0 iff every configuration ran and the correctness check passed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = ("upstream", "selscan", "torch")


def sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, iters, rounds):
    """Median over `rounds` of the seconds per call of `iters` calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    sync(device)
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        per.append((time.perf_counter() - t0) / iters)
    return statistics.median(per)


def peak(device, fn):
    import torch
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device)


def add_model_args(ap):
    """The model's shape (mamba-130m by default) and seed, the options build_model reads."""
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50280)
    ap.add_argument("--seed", type=int, default=0)


def build_model(args, device, dtype):
    import torch
    from transformers import MambaConfig, MambaForCausalLM
    torch.manual_seed(args.seed)
    config = MambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, state_size=args.state,
                         num_hidden_layers=args.layers, expand=2, conv_kernel=4, use_mambapy=False)
    return MambaForCausalLM(config).to(device=device, dtype=dtype)


def phases(model, ids):
    """(train, prefill) of one batch of token ids: a training step (forward + backward, no cache) and a forward
    without a gradient or a cache; the caller puts the model in train / eval mode."""
    import torch

    def train():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    def prefill():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    return train, prefill


def run_one(args):
    """One configuration in this process: print its JSON row."""
    import torch
    import transformers
    device = torch.device(args.device)
    if args.config == "selscan":
        from selscan.integrations import transformers as sst
        sst.enable()
    import transformers.models.mamba.modeling_mamba as mm
    bound = {n: getattr(getattr(mm, n), "__module__", "?") for n in ("mamba_inner_fn", "causal_conv1d_fn",
                                                                        "mamba_selective_scan")}
    model = build_model(args, device, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    # transformers wraps what it binds (functools.wraps keeps its own module name): which kernel packages the
    # process imported says whether the upstream configuration really runs mamba-ssm's and causal-conv1d's.
    bound["imported"] = [m for m in ("mamba_ssm", "causal_conv1d", "selective_scan_cuda", "selscan") if m in sys.modules]
    row = {"config": args.config, "transformers": transformers.__version__, "device": str(device), "bound": bound,
           "train": {}, "prefill": {}, "generate": {}, "peak_bytes": {}}
    for shape in args.shapes.split(","):
        bt, L = (int(v) for v in shape.split("x"))
        train, prefill = phases(model, torch.randint(0, args.vocab, (bt, L), device=device))
        for kind, fn, mode in (("train", train, model.train), ("prefill", prefill, model.eval)):
            mode()
            try:
                row["peak_bytes"][f"{kind} {shape}"] = peak(device, fn)
                row[kind][shape] = bt * L / timed(fn, device, args.iters, args.rounds)
            except torch.OutOfMemoryError:  # the torch path's scan at 8x2048 (~5 GiB of fp32 states a layer)
                model.zero_grad(set_to_none=True)
                row["peak_bytes"][f"{kind} {shape}"] = None
                row[kind][shape] = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    model.eval()
    for b in (int(v) for v in args.gen_batches.split(",") if v):
        ids = torch.randint(0, args.vocab, (b, args.prompt), device=device)

        def gen():
            with torch.no_grad():
                model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)

        row["peak_bytes"][f"generate b{b}"] = peak(device, gen)
        row["generate"][f"b{b}"] = b * args.new_tokens / timed(gen, device, 1, args.rounds)
    print("ROW " + json.dumps(row), flush=True)


def check(args):
    """selscan (enable()) against the torch path in fp32 at a small shape: logits, loss, every gradient."""
    import torch
    from selscan.integrations import transformers as sst
    device = torch.device(args.device)
    small = argparse.Namespace(**vars(args))
    small.layers, small.hidden, small.state, small.vocab = 2, 64, 16, 97
    ids = torch.randint(0, 97, (2, 33), device=device, generator=torch.Generator(device).manual_seed(1))

    def run():
        model = build_model(small, device, torch.float32).train()
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        return out.logits.detach(), out.loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    sst.disable()
    ref = run()
    sst.enable()
    got = run()
    sst.disable()
    logit_err = ((got[0] - ref[0]).norm() / ref[0].norm()).item()
    grad_err = max(((got[2][n] - g).norm() / g.norm().clamp_min(1e-30)).item() for n, g in ref[2].items())
    ok = logit_err <= 1e-4 and abs(got[1] - ref[1]) <= 1e-4 * abs(ref[1]) and grad_err <= 1e-3
    print("CHECK " + json.dumps({"logits_rel_l2": logit_err, "loss": [got[1], ref[1]], "grad_max_rel_l2": grad_err,
                                 "ok": ok}), flush=True)
    return ok


def run_configs(script, argv, configs, upstream_path):
    """Runs `script argv --config C` in a process of its own for each configuration C of the comma-separated
    `configs` (the upstream one with `upstream_path` prepended to PYTHONPATH, skipped without it), so each imports
    only its own kernels; yields each process's ROW line as a dict, or None (after printing its output) for one
    that failed."""
    for config in configs.split(","):
        env = dict(os.environ)
        if config == "upstream":
            if not upstream_path:
                print("upstream: skipped (no --upstream-path)")
                continue
            env["PYTHONPATH"] = os.pathsep.join([upstream_path, env.get("PYTHONPATH", "")])
        r = subprocess.run([sys.executable, script, *argv, "--config", config], env=env, capture_output=True,
                           text=True)
        line = next((l for l in r.stdout.splitlines() if l.startswith("ROW ")), None)
        if r.returncode != 0 or line is None:
            print(f"{config}: failed (rc {r.returncode})\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
            yield None
            continue
        yield json.loads(line[4:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    add_model_args(ap)
    ap.add_argument("--shapes", default="8x2048,4x2048,1x256", help="training and prefill batch x seqlen")
    ap.add_argument("--gen-batches", default="1,64")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--upstream-path", default="", help="os.pathsep-separated folders that make mamba_ssm and "
                    "causal_conv1d importable (the upstream configuration); empty: that configuration is skipped")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", default="")
    ap.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)  # one configuration, in this process
    ap.add_argument("--check-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.config:
        run_one(args)
        return 0
    if args.check_only:
        return 0 if check(args) else 1

    argv = sys.argv[1:]
    rows, ok = [], True
    for row in run_configs(__file__, argv, args.configs, args.upstream_path):
        if row is None:
            ok = False
            continue
        rows.append(row)
        print(f"{row['config']}: kernels bound {row['bound']}")
    r = subprocess.run([sys.executable, __file__, *argv, "--check-only"], capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("CHECK ")), None)
    checked = json.loads(line[6:]) if line else {"ok": False, "error": r.stderr[-2000:]}
    ok = ok and checked["ok"]
    by = {row["config"]: row for row in rows}

    def ratio(kind, key, base):
        if "selscan" not in by or base not in by or not by["selscan"][kind][key] or not by[base][kind][key]:
            return "-"
        return f"{by['selscan'][kind][key] / by[base][kind][key]:.2f}"

    print(f"\n| what | {' | '.join(by)} | selscan / upstream | selscan / torch |")
    print(f"|---|{'---:|' * len(by)}---:|---:|")
    for kind, unit in (("train", "tokens/s"), ("prefill", "tokens/s"), ("generate", "new tokens/s")):
        keys = next(iter(by.values()))[kind].keys() if by else []
        for key in keys:
            vals = " | ".join("out of memory" if row[kind][key] is None else f"{row[kind][key]:,.0f}"
                              for row in by.values())
            print(f"| {kind} {key} ({unit}) | {vals} | {ratio(kind, key, 'upstream')} | {ratio(kind, key, 'torch')} |")
    for key in (next(iter(by.values()))["peak_bytes"].keys() if by else []):
        vals = " | ".join("-" if row["peak_bytes"][key] is None else f"{row['peak_bytes'][key] / 2**30:.2f} GiB"
                          for row in by.values())
        print(f"| peak {key} | {vals} | | |")
    print(f"\nfp32 check of selscan against the torch path: {checked}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "check": checked}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
