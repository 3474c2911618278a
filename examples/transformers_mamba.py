#!/usr/bin/env python3
"""transformers' MambaForCausalLM with every mixer's selective scan done by libselscan, checked against the
model's own slow (pure PyTorch) path: logits, loss and every parameter gradient, then fwd+bwd tokens/s of both.

    SELSCAN_LIBRARY=build/ci/libselscan.so PYTHONPATH=python python3 examples/transformers_mamba.py

Needs torch and transformers (MambaForCausalLM); a CUDA build of libselscan for --device cuda (the default when
torch sees a GPU), any build for --device cpu. Exit status 0 iff the comparison is within tolerance.
The patched mixer forward below is the model's slow_forward with its Python scan loop replaced by one call of
selscan.torch.selective_scan_fn (the same call mamba_ssm's fast path makes); decoding with a cache keeps the
model's own path.
"""

import argparse
import copy
import sys
import time
import types

import torch
from transformers import MambaConfig, MambaForCausalLM

from selscan.torch import selective_scan_fn


def selscan_mixer_forward(self, hidden_states, cache_params=None, cache_position=None, attention_mask=None,
                          **kwargs):
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
    y = selective_scan_fn(x, delta, A, B.transpose(1, 2), C.transpose(1, 2), self.D.float(), z=gate,
                          delta_bias=self.dt_proj.bias.float(), delta_softplus=True)
    return self.out_proj(y.transpose(1, 2))


def slow_only_forward(self, hidden_states, cache_params=None, cache_position=None, attention_mask=None, **kwargs):
    # The reference: always the model's pure-PyTorch path, even where mamba_ssm's kernels are installed.
    return self.slow_forward(hidden_states, cache_params, cache_position, attention_mask)


def patch(model, fn):
    n = 0
    for layer in model.backbone.layers:
        layer.mixer.forward = types.MethodType(fn, layer.mixer)
        n += 1
    return n


def fwd_bwd(model, ids):
    model.zero_grad(set_to_none=True)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = ap.parse_args()

    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(args.seed)
    config = MambaConfig(vocab_size=args.vocab, hidden_size=args.hidden, state_size=args.state,
                         num_hidden_layers=args.layers, expand=2, conv_kernel=4, use_mambapy=False)
    if config.hidden_act != "silu":
        sys.exit(f"config.hidden_act is {config.hidden_act}; the scan's gate is silu")
    ref = MambaForCausalLM(config).to(device=device, dtype=dtype).train()
    ours = copy.deepcopy(ref)
    patch(ref, slow_only_forward)
    n = patch(ours, selscan_mixer_forward)
    ids = torch.randint(0, args.vocab, (args.batch, args.seqlen), device=device)
    print(f"MambaForCausalLM: {n} layers, hidden {args.hidden}, d_inner {config.intermediate_size}, "
          f"state {args.state}, {args.dtype} on {device}; batch {args.batch} x seqlen {args.seqlen}")

    o_ref = fwd_bwd(ref, ids)
    o_our = fwd_bwd(ours, ids)
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
