#!/usr/bin/env python3
"""transformers' MambaForCausalLM with every mixer's selective scan done by libselscan, checked against the
model's own slow (pure PyTorch) path: logits, loss and every parameter gradient, then fwd+bwd tokens/s of both.

    python3 examples/transformers_mamba.py              # a small model: correctness and speed vs the slow path
    python3 examples/transformers_mamba.py --bench [--upstream-path DIRS]
                                     # the real client, mamba-130m shape, bf16, three configurations in one run:
                                     # transformers' fast path with mamba-ssm + causal-conv1d, selscan's enable(),
                                     # the model's own PyTorch path: training and prefill tokens/s at 8x2048, 4x2048
                                     # and 1x256, generate() at batch 1 and 64, peak memory, an fp32 check
    python3 examples/transformers_mamba.py --bench-scan # the unfused model with only its scan replaced: selscan's
                                                        # against upstream's scan and the slow path
    python3 examples/transformers_mamba.py --generate   # greedy generate(): selscan's prefill and decode step
                                                        # against the model's own path, same tokens, tokens/s

--bench runs bench/transformers_model.py (its options after --bench are passed on: --upstream-path, --shapes,
--gen-batches, --configs, --json, ...; `python3 bench/transformers_model.py --help`). --bench-scan checks the
scan-patched model against the slow path at 1x256 first, then times selscan and, when upstream's
selective_scan_cuda (or mamba_ssm) is importable, upstream's scan through the same unfused model path
(bench/upstream_scan.py); the slow path itself is timed at the small shape only (it loops over tokens in Python).

Needs torch and transformers (MambaForCausalLM); a CUDA build of libselscan for --device cuda (the default when
torch sees a GPU), any build for --device cpu. Exit status 0 iff the comparison is within tolerance.
Only the selective scan is replaced, by selscan.torch.selective_scan_fn (the call mamba_ssm's kernel path makes):
transformers >= 5.15 through its module-level mamba_selective_scan, older releases through MambaMixer.forward.
"""

import argparse
import contextlib
import copy
import statistics
import sys
import time
import types

import torch
import transformers
import transformers.models.mamba.modeling_mamba as mm
from transformers import MambaConfig, MambaForCausalLM

from selscan.torch import selective_scan_fn, selective_state_update

SCAN_FN = [selective_scan_fn]  # what the patched model calls: selscan, or upstream's scan for --bench baselines

# transformers >= 5.15 calls a module-level mamba_selective_scan (upstream's selective_scan_fn signature) from
# MambaMixer.forward; older releases have the scan loop inside MambaMixer.slow_forward. Both are handled.
NEW_API = hasattr(mm, "mamba_selective_scan")
SELSCAN_CALLS = [0]  # proof that the patched model really ran through selscan (and the reference did not)


def selscan_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                 return_last_state=False, **unused):
    SELSCAN_CALLS[0] += 1
    if SCAN_FN[0] is not selective_scan_fn:
        return SCAN_FN[0](hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus)
    return selective_scan_fn(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)


@contextlib.contextmanager
def scan_backend(use_selscan):
    """transformers >= 5.15: swap the module's scan function for the duration of a forward/backward. Both models
    take the unfused path (mamba_inner_fn -> None), so only the scan differs between them."""
    if not NEW_API:
        yield
        return
    saved = mm.mamba_selective_scan, mm.mamba_inner_fn
    if use_selscan:
        mm.mamba_selective_scan = selscan_scan
    mm.mamba_inner_fn = lambda *a, **k: None
    try:
        yield
    finally:
        mm.mamba_selective_scan, mm.mamba_inner_fn = saved


def selscan_mixer_forward(self, hidden_states, cache_params=None, cache_position=None, attention_mask=None,
                          **kwargs):
    """transformers < 5: the mixer's slow_forward with its Python scan loop replaced by one selscan call."""
    if cache_params is not None:  # single-token decoding and cache bookkeeping stay with transformers
        return self.slow_forward(hidden_states, cache_params, cache_position, attention_mask)
    seq_len = hidden_states.shape[1]
    x, gate = self.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)  # (batch, d_inner, seq_len) each
    if attention_mask is not None:
        x = x * attention_mask.unsqueeze(1)
    x = self.act(self.conv1d(x)[..., :seq_len])
    if attention_mask is not None:
        x = x * attention_mask.unsqueeze(1)
    ssm = self.x_proj(x.transpose(1, 2))
    dt, B, C = torch.split(ssm, [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1)
    # dt_proj without its bias: the bias and the softplus are applied inside the scan (delta_bias, softplus).
    delta = (dt @ self.dt_proj.weight.t()).transpose(1, 2)
    A = -torch.exp(self.A_log.float())
    SELSCAN_CALLS[0] += 1
    y = selective_scan_fn(x, delta, A, B.transpose(1, 2), C.transpose(1, 2), self.D.float(), z=gate,
                          delta_bias=self.dt_proj.bias.float(), delta_softplus=True)
    return self.out_proj(y.transpose(1, 2))


def slow_only_forward(self, hidden_states, cache_params=None, cache_position=None, attention_mask=None, **kwargs):
    # transformers < 5 reference: always the pure-PyTorch path, even where mamba_ssm's kernels are installed.
    return self.slow_forward(hidden_states, cache_params, cache_position, attention_mask)


def patch(model, use_selscan):
    model.use_selscan = use_selscan
    layers = model.backbone.layers
    if not NEW_API:
        for layer in layers:
            fn = selscan_mixer_forward if use_selscan else slow_only_forward
            layer.mixer.forward = types.MethodType(fn, layer.mixer)
    return len(layers)


def fwd_bwd(model, ids):
    model.zero_grad(set_to_none=True)
    with scan_backend(model.use_selscan):
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
    return out


def tokens_per_s(model, ids, iters, device):
    for _ in range(2):
        fwd_bwd(model, ids)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fwd_bwd(model, ids)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return ids.numel() * iters / (time.perf_counter() - t0)


def prefill_tokens_per_s(model, ids, iters, device):
    def step():
        with torch.no_grad(), scan_backend(model.use_selscan):
            model(input_ids=ids, use_cache=False)

    for _ in range(2):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return ids.numel() * iters / (time.perf_counter() - t0)


def _bench_dir():
    """The repository's bench/ folder, put on sys.path (its scripts are imported as modules)."""
    here = __import__("pathlib").Path(__file__).resolve().parent.parent / "bench"
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    return here


def bench_model(extra):
    """--bench: bench/transformers_model.py with the options that follow --bench."""
    here = _bench_dir()
    import transformers_model

    sys.argv = [str(here / "transformers_model.py"), *extra]
    return transformers_model.main()


def bench_scan(args, device):
    """The mamba-130m shape (24 layers, hidden 768, state 16, vocab 50280), bf16, random weights."""
    _bench_dir()
    from upstream_scan import upstream_fn

    torch.manual_seed(args.seed)
    config = MambaConfig(vocab_size=50280, hidden_size=768, state_size=16, num_hidden_layers=24, expand=2,
                         conv_kernel=4, use_mambapy=False)
    model = MambaForCausalLM(config).to(device=device, dtype=torch.bfloat16).train()
    slow = copy.deepcopy(model)
    patch(slow, False)
    n = patch(model, True)
    scans = {"selscan": selective_scan_fn}
    up = upstream_fn()
    if up is not None:
        scans["upstream"] = up
    print(f"MambaForCausalLM mamba-130m shape: {n} layers, bf16 on {device}; transformers {transformers.__version__}; "
          f"{selscan_info()}; upstream {'timed' if up else 'not importable'}")
    # Correctness at the small shape against the model's own slow path, in fp32 (the slow path keeps its state
    # in the input dtype, so bf16 runs of it drift from any fp32-state kernel); then selscan against upstream in
    # bf16 where upstream is importable.
    ids = torch.randint(0, 50280, (1, 256), device=device)
    ref32, our32 = copy.deepcopy(slow).float(), copy.deepcopy(model).float()
    patch(ref32, False)
    patch(our32, True)
    o_ref, o_our = fwd_bwd(ref32, ids), fwd_bwd(our32, ids)
    loss_err = abs(o_our.loss.item() - o_ref.loss.item()) / abs(o_ref.loss.item())
    logit_err = ((o_our.logits - o_ref.logits).abs().max() / o_ref.logits.abs().max()).item()
    ok = loss_err <= 1e-3 and logit_err <= 1e-3
    print(f"fp32 1x256 vs the slow path: loss rel diff {loss_err:.2e}, logits max |diff| / max |ref| {logit_err:.2e}: "
          f"{'PASS' if ok else 'FAIL'} (tolerance 1e-3)")
    del ref32, our32, o_ref, o_our
    if up is not None:
        SCAN_FN[0] = up
        o_up = fwd_bwd(model, ids)
        SCAN_FN[0] = selective_scan_fn
        o_our = fwd_bwd(model, ids)
        err = ((o_our.logits.float() - o_up.logits.float()).abs().max() / o_up.logits.float().abs().max()).item()
        print(f"bf16 1x256 vs upstream's scan: loss {o_our.loss.item():.5f} vs {o_up.loss.item():.5f}, "
              f"logits max |diff| / max |ref| {err:.2e}")
    rows = []
    for bt, L, iters, rounds in ((8, 2048, 8, 2), (1, 256, 40, 3)):
        ids = torch.randint(0, 50280, (bt, L), device=device)
        got = {name: ([], []) for name in scans}
        for _ in range(rounds):  # alternate the implementations: slow drifts of clocks hit both alike
            for name, fn in scans.items():
                SCAN_FN[0] = fn
                got[name][0].append(tokens_per_s(model, ids, iters, device))
                got[name][1].append(prefill_tokens_per_s(model, ids, iters, device))
        SCAN_FN[0] = selective_scan_fn
        for name, (train, prefill) in got.items():
            rows.append((f"{bt}x{L}", name, statistics.median(train), statistics.median(prefill)))
            print(f"{bt}x{L} {name:>9}: train {rows[-1][2]:>10,.0f} tokens/s, prefill {rows[-1][3]:>10,.0f} tokens/s"
                  f" (median of {rounds} rounds of {iters} steps)")
        if bt == 1:
            rows.append((f"{bt}x{L}", "slow path", tokens_per_s(slow, ids, 3, device),
                         prefill_tokens_per_s(slow, ids, 3, device)))
            print(f"{bt}x{L} slow path: train {rows[-1][2]:>10,.0f} tokens/s, prefill {rows[-1][3]:>10,.0f} tokens/s")
    return 0 if ok else 1


def selscan_state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None,
                         **unused):
    """transformers' mamba_selective_state_update (upstream's selective_state_update) done by selscan's decode
    step: updates the cached state in place, returns the token's output."""
    SELSCAN_CALLS[0] += 1
    return selective_state_update(state, hidden_states, dt, A, B, C, D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)


def generate(args, device):
    """Greedy generation: the prompt through the scan (with its last state), then one decode step per token,
    against the same model on transformers' own path. Same tokens expected."""
    if not NEW_API or not hasattr(mm, "mamba_selective_state_update"):
        sys.exit("--generate needs transformers >= 5.15 (module-level mamba_selective_scan / state_update)")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(args.seed)
    config = MambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, state_size=args.state,
                         num_hidden_layers=args.layers, expand=2, conv_kernel=4, use_mambapy=False)
    model = MambaForCausalLM(config).to(device=device, dtype=dtype).eval()
    ids = torch.randint(0, args.vocab, (args.batch, args.seqlen), device=device)
    mask = torch.ones_like(ids)

    def run(use_selscan):
        saved = mm.mamba_selective_scan, mm.mamba_selective_state_update, mm.mamba_inner_fn
        if use_selscan:
            mm.mamba_selective_scan, mm.mamba_selective_state_update = selscan_scan, selscan_state_update
        mm.mamba_inner_fn = lambda *a, **k: None
        try:
            with torch.no_grad():
                model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)  # warm-up
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                                     min_new_tokens=args.new_tokens,
                                     do_sample=False)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                return out, args.batch * args.new_tokens / (time.perf_counter() - t0)
        finally:
            mm.mamba_selective_scan, mm.mamba_selective_state_update, mm.mamba_inner_fn = saved

    ref, ref_tps = run(False)
    SELSCAN_CALLS[0] = 0
    ours, our_tps = run(True)
    same = ref.shape == ours.shape and bool((ref == ours).all())
    print(f"MambaForCausalLM {args.layers} layers, hidden {args.hidden}, {args.dtype} on {device}: batch {args.batch}, "
          f"prompt {args.seqlen}, {args.new_tokens} new tokens (greedy); selscan calls {SELSCAN_CALLS[0]}")
    print(f"generate() new tokens/s (the prompt's prefill included): transformers {ref_tps:,.0f}; "
          f"selscan {our_tps:,.0f}")
    if not same and ref.shape == ours.shape:
        new = slice(args.seqlen, None)
        agree = float((ref[:, new] == ours[:, new]).float().mean())
        row, pos = (int(v) for v in (ref != ours).nonzero()[0])
        print(f"tokens differ: first at sequence {row}, position {pos}; {agree:.1%} of the new tokens agree "
              f"(in bf16/fp16 the model's own path keeps the prefill state in the input dtype, so greedy ties can "
              f"break differently; compare in fp32)")
    print("PASS" if same and SELSCAN_CALLS[0] > 0 else "FAIL")
    return 0 if same and SELSCAN_CALLS[0] > 0 else 1


def selscan_info():
    import selscan
    return selscan.build_info()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", action="store_true",
                    help="the real-client benchmark, bench/transformers_model.py (options after it are its own)")
    ap.add_argument("--bench-scan", action="store_true", help="mamba-130m shape, only the scan replaced (see above)")
    ap.add_argument("--generate", action="store_true", help="greedy generate() with selscan's decode step")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    if "--bench" in sys.argv[1:]:
        at = sys.argv.index("--bench")
        return bench_model(sys.argv[1:at] + sys.argv[at + 1:])
    args = ap.parse_args()

    device = torch.device(args.device)
    if args.bench_scan:
        return bench_scan(args, device)
    if args.generate:
        return generate(args, device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(args.seed)
    config = MambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, state_size=args.state,
                         num_hidden_layers=args.layers, expand=2, conv_kernel=4, use_mambapy=False)
    if config.hidden_act != "silu":
        sys.exit(f"config.hidden_act is {config.hidden_act}; the scan's gate is silu")
    ref = MambaForCausalLM(config).to(device=device, dtype=dtype).train()
    ours = copy.deepcopy(ref)
    patch(ref, False)
    n = patch(ours, True)
    ids = torch.randint(0, args.vocab, (args.batch, args.seqlen), device=device)
    print(f"MambaForCausalLM: {n} layers, hidden {args.hidden}, d_inner {config.intermediate_size}, "
          f"state {args.state}, {args.dtype} on {device}; batch {args.batch} x seqlen {args.seqlen}; "
          f"transformers {transformers.__version__}, reference scan: "
          f"{'mamba_selective_scan' if NEW_API else 'MambaMixer.slow_forward'}")

    o_ref = fwd_bwd(ref, ids)
    if SELSCAN_CALLS[0] != 0:
        sys.exit("the reference model called selscan: the patching is wrong for this transformers version")
    o_our = fwd_bwd(ours, ids)
    print(f"selscan calls in one forward of the patched model: {SELSCAN_CALLS[0]}")
    if SELSCAN_CALLS[0] != n:
        sys.exit(f"expected {n} selscan calls (one per layer); this transformers version needs another patch")
    logit_err = ((o_our.logits.float() - o_ref.logits.float()).abs().max()
                 / o_ref.logits.float().abs().max()).item()
    loss_err = abs(o_our.loss.item() - o_ref.loss.item()) / abs(o_ref.loss.item())
    worst, worst_name, missing = 0.0, "", []
    p_ref = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        g_ref = p_ref[name].grad
        if p.grad is None or g_ref is None:
            if (p.grad is None) != (g_ref is None):
                missing.append(name)
            continue
        denom = g_ref.float().norm().item()
        err = (p.grad.float() - g_ref.float()).norm().item() / max(denom, 1e-12)
        if err > worst:
            worst, worst_name = err, name
    tol = {"fp32": 1e-3, "bf16": 5e-2, "fp16": 2e-2}[args.dtype]
    print(f"logits: max |diff| / max |ref| = {logit_err:.2e}; loss rel diff = {loss_err:.2e}")
    print(f"parameter grads: worst relative L2 error {worst:.2e} ({worst_name}); tolerance {tol:g}")
    if missing:
        print("gradient present in one model only:", ", ".join(missing))

    t_ref = tokens_per_s(ref, ids, args.iters, device)
    t_our = tokens_per_s(ours, ids, args.iters, device)
    print(f"fwd+bwd tokens/s: transformers slow path {t_ref:,.0f}; selscan {t_our:,.0f} ({t_our / t_ref:.1f}x)")
    ok = logit_err <= tol and loss_err <= tol and worst <= tol and not missing
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
