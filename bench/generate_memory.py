#!/usr/bin/env python3
"""Where generate()'s peak memory goes, per configuration: the allocations behind torch.cuda.max_memory_allocated of
bench/transformers_model.py's generate() row, by the code that made them (issue #19: selscan's generate() at batch 1
peaked 34.4 MB above upstream's in run 65 while training and prefill matched).

Each configuration runs in its own process, the same sequence of phases as transformers_model.py's run_one (a
training step and a prefill at --shape, timed a few times, then generate() at batch --batch) with the CUDA caching
allocator's history recorded from the start. At the generate() call it reports:
  base   the bytes allocated when the peak window opens (as transformers_model.py's peak() resets it), grouped by
         the code that allocated each block (blocks made before the recording have no frames: "unattributed");
  peak   max_memory_allocated over generate(), and the blocks allocated inside generate() still alive at that
         moment, grouped the same way (the trace replayed from the window's start);
  cublas the bytes torch._C._cuda_clearCublasWorkspaces() frees at the end (cuBLAS / cuBLASLt workspaces, one per
         handle and stream: 32 MiB each on sm90 by default);
then, with two configurations, each group's bytes side by side and the differences, largest first.

    python3 bench/generate_memory.py --upstream-path build/upstream:build/gpu-check/conv-upstream
    python3 bench/generate_memory.py --configs selscan --device cpu --layers 2 --prompt 16 --new-tokens 4
        # a smoke run of the script's control flow (nothing is recorded on the CPU)
"""

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_model as tm  # noqa: E402  (the same model and phases)

_SKIP = ("/torch/", "/transformers/", "<frozen", "/contextlib.py", "/functools.py")


def site(frames, depth=3):
    """A block's allocation site: the innermost `depth` Python frames outside torch and transformers (the caller's
    code), plus the innermost transformers frame, plus a C++ frame naming a BLAS workspace where there is one."""
    if not frames:
        return "unattributed"
    py = [f for f in frames if f.get("filename", "").endswith(".py")]
    own = [f for f in py if not any(s in f["filename"] for s in _SKIP)][:depth]
    hf = [f for f in py if "/transformers/" in f["filename"]][:1]
    blas = [f["name"] for f in frames if any(k in f.get("name", "") for k in ("Workspace", "workspace", "Blas"))][:1]
    parts = [f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in own + hf] + blas
    return " < ".join(parts) if parts else "torch-internal"


def replay(events, start_bytes):
    """(peak bytes, [(size, frames) alive at the peak]) of a window of allocator trace events, starting from
    start_bytes allocated. Only blocks allocated inside the window are listed."""
    live, cur, peak, at_peak = {}, start_bytes, start_bytes, []
    for e in events:
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            cur += e["size"]
            if cur > peak:
                peak, at_peak = cur, list(live.values())
        elif a == "free_requested" and e["addr"] in live:
            cur -= live.pop(e["addr"])[0]
    return peak, at_peak


def grouped(items):
    g = collections.Counter()
    for size, frames in items:
        g[site(frames)] += size
    return dict(g.most_common())


def run_one(args):
    import torch
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="all", max_entries=4_000_000)
    if args.config == "selscan":
        from selscan.integrations import transformers as sst
        sst.enable()
    model = tm.build_model(args, device, torch.bfloat16)
    bt, L = (int(v) for v in args.shape.split("x"))
    train, prefill = tm.phases(model, torch.randint(0, args.vocab, (bt, L), device=device))
    for fn, mode in ((train, model.train), (prefill, model.eval)):
        mode()
        for _ in range(1 + args.iters):
            fn()
    model.eval()
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt), device=device)

    def gen():
        with torch.no_grad():
            model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)

    row = {"config": args.config, "device": str(device)}
    if not cuda:
        gen()
        print("ROW " + json.dumps(row), flush=True)
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory._snapshot()
    start = torch.cuda.memory_allocated(device)
    n0 = len(before["device_traces"][device.index or 0])
    gen()
    torch.cuda.synchronize()
    row["peak"] = torch.cuda.max_memory_allocated(device)
    row["base"] = start
    after = torch.cuda.memory._snapshot()
    trace = after["device_traces"][device.index or 0]
    if len(trace) < n0 or n0 >= 4_000_000:
        row["warning"] = "the trace ring buffer wrapped: the peak window is incomplete"
    peak, alive = replay(trace[n0:], start)
    row["replayed_peak"] = peak
    row["peak_window"] = grouped(alive)
    base_blocks = [(b["size"], b.get("frames", [])) for s in before["segments"] for b in s["blocks"]
                   if b["state"] == "active_allocated"]
    row["base_groups"] = grouped(base_blocks)
    now = torch.cuda.memory_allocated(device)
    torch._C._cuda_clearCublasWorkspaces()
    row["cublas_workspaces"] = now - torch.cuda.memory_allocated(device)
    print("ROW " + json.dumps(row), flush=True)


def diff(rows, top):
    if len(rows) != 2:
        return
    a, b = rows
    print(f"\npeak {a['config']} {a['peak']:,} / {b['config']} {b['peak']:,}: {b['peak'] - a['peak']:+,} B; base "
          f"{a['base']:,} / {b['base']:,}: {b['base'] - a['base']:+,}; cuBLAS workspaces {a['cublas_workspaces']:,} / "
          f"{b['cublas_workspaces']:,}")
    for what in ("base_groups", "peak_window"):
        keys = set(a[what]) | set(b[what])
        d = sorted(keys, key=lambda k: -abs(b[what].get(k, 0) - a[what].get(k, 0)))
        print(f"\n{what}: {a['config']} / {b['config']} / difference (bytes), largest differences first")
        for k in d[:top]:
            x, y = a[what].get(k, 0), b[what].get(k, 0)
            if x != y:
                print(f"  {x:>12,} {y:>12,} {y - x:>+12,}  {k}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    tm.add_model_args(ap)
    ap.add_argument("--shape", default="1x256", help="the training and prefill phases' batch x seqlen")
    ap.add_argument("--iters", type=int, default=3, help="calls of each phase after its first")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--upstream-path", default="")
    ap.add_argument("--configs", default="upstream,selscan")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default="")
    ap.add_argument("--config", choices=tm.CONFIGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.config:
        run_one(args)
        return 0
    rows, ok = [], True
    for row in tm.run_configs(__file__, sys.argv[1:], args.configs, args.upstream_path):
        if row is None:
            ok = False
            continue
        rows.append(row)
        config = row["config"]
        if "peak" in row:
            print(f"{config}: peak {row['peak']:,} (replayed {row['replayed_peak']:,}), base {row['base']:,}, "
                  f"cuBLAS workspaces {row['cublas_workspaces']:,}{' ' + row.get('warning', '')}")
            for k, v in list(row["peak_window"].items())[:args.top]:
                print(f"  peak {v:>12,}  {k}")
        else:
            print(f"{config}: ran (nothing recorded on {row['device']})")
    if all("peak" in r for r in rows):
        diff(rows, args.top)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
