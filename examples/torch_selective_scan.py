#!/usr/bin/env python3
"""Migrating from mamba_ssm: `from selscan.torch import selective_scan_fn` is the whole change.

    SELSCAN_LIBRARY=build/ci/libselscan.so PYTHONPATH=python python3 examples/torch_selective_scan.py

Checks the output and the gradients against a plain PyTorch loop (upstream's selective_scan_ref math, written
here in float64), then runs the same call under torch.compile(fullgraph=True). Device: the first argument
(cpu | cuda), default cuda when torch sees a GPU (that needs a CUDA build of libselscan).
"""

import sys

import torch

from selscan.torch import selective_scan_fn  # was: from mamba_ssm.ops.selective_scan_interface import ...


def reference(u, delta, A, B, C, D, z, delta_bias):
    """float64 sequential scan with variable B/C (batch, dstate, seqlen), softplus on delta."""
    u, delta, A, B, C, D, z, delta_bias = (t.double() for t in (u, delta, A, B, C, D, z, delta_bias))
    dt = torch.nn.functional.softplus(delta + delta_bias[:, None])
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[-1]):
        h = torch.exp(dt[..., t, None] * A) * h + (dt[..., t] * u[..., t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, -1) + D[:, None] * u
    return y * torch.nn.functional.silu(z)


def main():
    dev = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    batch, dim, seqlen, dstate = 2, 64, 256, 16
    u = torch.randn(batch, dim, seqlen, device=dev, requires_grad=True)
    delta = (0.5 * torch.rand(batch, dim, seqlen, device=dev)).requires_grad_()
    A = (-0.5 * torch.rand(dim, dstate, device=dev)).requires_grad_()
    B = torch.randn(batch, dstate, seqlen, device=dev, requires_grad=True)
    C = torch.randn(batch, dstate, seqlen, device=dev, requires_grad=True)
    D = torch.randn(dim, device=dev, requires_grad=True)
    z = torch.randn(batch, dim, seqlen, device=dev, requires_grad=True)
    bias = (0.5 * torch.rand(dim, device=dev)).requires_grad_()
    inputs = [u, delta, A, B, C, D, z, bias]

    y, last_state = selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True, return_last_state=True)
    y.sum().backward()
    ours = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    y_ref = reference(*inputs)
    y_ref.sum().backward()
    err = (y.double() - y_ref).abs().max().item()
    gerr = max(((a.double() - t.grad).norm() / t.grad.norm()).item() for a, t in zip(ours, inputs))
    print(f"{dev}: out max abs err {err:.2e}; worst relative gradient error {gerr:.2e}; "
          f"last_state {tuple(last_state.shape)}")

    compiled = torch.compile(lambda *a: selective_scan_fn(*a, delta_softplus=True), fullgraph=True)
    y_c = compiled(*inputs)
    cerr = (y_c - y).abs().max().item()
    print(f"torch.compile(fullgraph=True): max abs diff vs eager {cerr:.2e}")
    ok = err < 2e-3 and gerr < 1e-3 and cerr < 1e-5
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
