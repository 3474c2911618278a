#!/usr/bin/env python3
"""One DistributedDataParallel training step of transformers' MambaForCausalLM with every selective scan done by
libselscan, checked against the same step on one GPU without DDP, plus fwd+bwd tokens/s of both.

    SELSCAN_LIBRARY=build/ci/libselscan.so PYTHONPATH=python \
        torchrun --standalone --nproc_per_node=2 examples/ddp_mamba.py

Each rank owns one GPU (cuda:LOCAL_RANK) and one CUDA stream of its own; NCCL carries the gradient all-reduce.
A fixed global batch is split evenly across the ranks; rank 0 also runs the full batch through an unwrapped copy
of the model, and every rank compares its all-reduced gradients with that copy's (fp32, torch.allclose with
--rtol and --atol times the largest |gradient| of each parameter). Every libselscan call is checked to have
been made for the rank's own device and stream. With --nproc_per_node=1 (or plain `python3`) it runs the same
comparison with a single rank. Exit status 0 iff every rank passes. Needs torch, transformers and a CUDA build.
"""

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_mamba as tm  # noqa: E402  (the scan patching for each transformers version lives there)
from transformers import MambaConfig, MambaForCausalLM  # noqa: E402
from selscan import _lib as selscan_lib  # noqa: E402

# Record the execution context (device kind, device index, stream) of every library call, forward and backward:
# the binding builds one per selscan_fwd / selscan_bwd call through _lib.make_exec.
LIB_CALLS = []
_make_exec = selscan_lib.make_exec


def _recording_make_exec(*args, **kwargs):
    ex = _make_exec(*args, **kwargs)
    LIB_CALLS.append((int(ex.device_kind), int(ex.device_index), int(ex.stream or 0)))
    return ex


selscan_lib.make_exec = _recording_make_exec


def check_calls(rank, device, stream, expected=None):
    """True iff every recorded library call ran on this rank's CUDA device and stream (and, when given, there
    were exactly `expected` of them). Clears the record."""
    want = (selscan_lib.DEVICE_CUDA, device.index, int(stream.cuda_stream))
    seen, n = set(LIB_CALLS), len(LIB_CALLS)
    LIB_CALLS.clear()
    ok = seen == {want} and (expected is None or n == expected)
    if not ok:
        print(f"[rank {rank}] selscan calls: {n} (expected {expected}), (kind, device, stream) seen {sorted(seen)}, "
              f"expected only {want}", flush=True)
    return ok


def flat_grads(model):
    return torch.cat([p.grad.detach().float().flatten() if p.grad is not None else
                      torch.full((p.numel(),), float("nan"), device=p.device) for p in model.parameters()])


def compare(rank, model, g_all, g_ref, rtol, atol):
    """Per-parameter allclose of this rank's gradients with the reference's (flat vectors in parameter order)."""
    bad, worst, worst_name, off = [], -1.0, "", 0
    for name, p in model.named_parameters():
        g, r = g_all[off:off + p.numel()], g_ref[off:off + p.numel()]
        off += p.numel()
        scale = r.abs().max().item()
        err = (g - r).norm().item() / max(r.norm().item(), 1e-30)
        if worst == worst and not err <= worst:  # a NaN error is the worst and stays so
            worst, worst_name = err, name
        if not torch.allclose(g, r, rtol=rtol, atol=atol * scale):
            bad.append(name)
    print(f"[rank {rank}] DDP vs single-GPU grads: worst relative L2 error {worst:.2e} ({worst_name}); "
          f"allclose(rtol={rtol:g}, atol={atol:g}*max|ref|) failed for {len(bad)} of "
          f"{len(list(model.parameters()))} parameters{': ' + ', '.join(bad[:8]) if bad else ''}", flush=True)
    return not bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8, help="global batch, split evenly across the ranks")
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5, help="timed fwd+bwd steps")
    ap.add_argument("--seed", type=int, default=0)
    # Only the order of the sums over the batch differs (per-rank partial sums, then the all-reduce), so fp32
    # gradients agree to a few ulps of each parameter's largest gradient; 1e-5 leaves a wide margin.
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5, help="times the largest |reference gradient| per parameter")
    args = ap.parse_args()

    if "RANK" not in os.environ:  # plain `python3 examples/ddp_mamba.py`: a one-rank group
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if not torch.cuda.is_available() or torch.cuda.device_count() <= local_rank:
        sys.exit(f"[rank {rank}] needs CUDA device {local_rank}; torch sees {torch.cuda.device_count()}")
    if args.batch % world:
        sys.exit(f"--batch {args.batch} does not split evenly across {world} ranks")
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group(backend="nccl", device_id=device)
    # Plain fp32 everywhere, so that the comparison measures the data split and not TF32 rounding.
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9 (the old flags are deprecated)
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        ok = run(args, rank, world, device, stream)
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    ok = bool(flag.item())
    if rank == 0:
        print("PASS" if ok else "FAIL", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


def run(args, rank, world, device, stream):
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    config = MambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, state_size=args.state,
                         num_hidden_layers=args.layers, expand=2, conv_kernel=4, use_mambapy=False)
    if config.hidden_act != "silu":
        sys.exit(f"config.hidden_act is {config.hidden_act}; the scan's gate is silu")
    model = MambaForCausalLM(config).to(device=device, dtype=torch.float32).train()
    single = copy.deepcopy(model) if rank == 0 else None  # the one-GPU reference, same weights
    n = tm.patch(model, True)
    ddp = DDP(model, device_ids=[device.index], output_device=device.index)
    ddp.use_selscan = True  # read by tm.fwd_bwd
    gen = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seqlen), generator=gen).to(device)
    per_rank = args.batch // world
    local_ids = ids[rank * per_rank:(rank + 1) * per_rank]
    if rank == 0:
        print(f"MambaForCausalLM: {n} layers, hidden {args.hidden}, state {args.state}, fp32; global batch "
              f"{args.batch} x seqlen {args.seqlen} over {world} rank(s) (NCCL), {per_rank} sequences each; "
              f"torch {torch.__version__}", flush=True)

    # The DDP step. Every rank's loss is the mean over the same number of tokens, so DDP's average of the rank
    # gradients is the gradient of the full batch's mean loss: what the single-GPU step computes.
    calls0 = tm.SELSCAN_CALLS[0]
    out = tm.fwd_bwd(ddp, local_ids)
    torch.cuda.synchronize(device)
    ok = check_calls(rank, device, stream, expected=2 * n)  # one selscan_fwd and one selscan_bwd per layer
    if tm.SELSCAN_CALLS[0] - calls0 != n:
        print(f"[rank {rank}] the patched model made {tm.SELSCAN_CALLS[0] - calls0} scan calls, expected {n}")
        ok = False
    if ok:
        print(f"[rank {rank}] selscan: {n} forward + {n} backward calls, all on {device}, stream "
              f"{stream.cuda_stream:#x} (this rank's)", flush=True)
    loss = out.loss.detach().clone()
    dist.all_reduce(loss)
    loss /= world
    g_ddp = flat_grads(ddp.module)

    # Rank 0: the same step on one GPU over the full batch; its gradients go to every rank for comparison.
    g_ref = torch.empty_like(g_ddp)
    loss_ref = torch.zeros((), device=device)
    if rank == 0:
        tm.patch(single, True)
        out_ref = tm.fwd_bwd(single, ids)
        g_ref.copy_(flat_grads(single))
        loss_ref.copy_(out_ref.loss.detach())
        torch.cuda.synchronize(device)
        ok = check_calls(rank, device, stream, expected=2 * n) and ok
    dist.broadcast(g_ref, src=0)
    dist.broadcast(loss_ref, src=0)
    ok = compare(rank, ddp.module, g_ddp, g_ref, args.rtol, args.atol) and ok
    # Bitwise: every rank must hold the same all-reduced gradients.
    g0 = g_ddp.clone()
    dist.broadcast(g0, src=0)
    if not torch.equal(g0, g_ddp):
        print(f"[rank {rank}] gradients differ from rank 0's: max |diff| {(g0 - g_ddp).abs().max().item():.2e}",
              flush=True)
        ok = False
    loss_err = abs(loss.item() - loss_ref.item()) / abs(loss_ref.item())
    ok = loss_err <= args.rtol and ok
    if rank == 0:
        print(f"loss: DDP mean over ranks {loss.item():.6f}, single GPU {loss_ref.item():.6f}, relative diff "
              f"{loss_err:.2e} (tolerance {args.rtol:g})", flush=True)

    # Throughput: every rank times the same number of DDP steps; the slowest rank sets the global rate.
    rate = torch.tensor([tm.tokens_per_s(ddp, local_ids, args.iters, device)], dtype=torch.float64, device=device)
    dist.all_reduce(rate, op=dist.ReduceOp.MIN)
    steps = args.iters + 2  # tm.tokens_per_s runs two untimed steps first
    ok = check_calls(rank, device, stream, expected=2 * n * steps) and ok
    if rank == 0:
        t_single = tm.tokens_per_s(single, ids, args.iters, device)
        ok = check_calls(rank, device, stream, expected=2 * n * steps) and ok
        t_ddp = rate.item() * world
        print(f"fwd+bwd tokens/s: DDP over {world} GPU(s) {t_ddp:,.0f}; one GPU without DDP {t_single:,.0f} "
              f"({t_ddp / t_single:.2f}x)", flush=True)
    dist.barrier()
    return ok


if __name__ == "__main__":
    sys.exit(main())
