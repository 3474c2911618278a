"""Upstream's selective scan as a baseline: mamba_ssm's selective_scan_fn when mamba_ssm is installed, else a thin
autograd.Function over its `selective_scan_cuda` extension that makes the calls mamba_ssm's SelectiveScanFn
makes (last-dim-contiguous inputs, 3-D B/C as one group, x and the pre-gate output saved for the backward).
Used by bench/python_host.py and examples/transformers_mamba.py to time both libraries through the same torch
autograd path. Returns None when neither is importable."""

import torch


def upstream_fn():
    """fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus) -> out (out * silu(z) with z), or None."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn as mamba_fn
    except ImportError:
        mamba_fn = None
    if mamba_fn is not None:
        return lambda u, delta, A, B, C, D, z, bias, softplus: mamba_fn(u, delta, A, B, C, D, z, bias, softplus)
    try:
        import selective_scan_cuda as ext
    except ImportError:
        return None

    def rows(t):
        return t if t is None or t.stride(-1) == 1 else t.contiguous()

    class UpstreamScan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus):
            u, delta, B, C, z = rows(u), rows(delta), rows(B), rows(C), rows(z)
            squeeze = B.dim() == 3
            if squeeze:
                B, C = B.unsqueeze(1), C.unsqueeze(1)
            out, x, *rest = ext.fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
            ctx.softplus, ctx.squeeze = delta_softplus, squeeze
            ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, x, out)
            return rest[0] if z is not None else out

        @staticmethod
        def backward(ctx, dout):
            u, delta, A, B, C, D, z, delta_bias, x, out = ctx.saved_tensors
            du, ddelta, dA, dB, dC, dD, dbias, *rest = ext.bwd(u, delta, A, B, C, D, z, delta_bias, rows(dout), x,
                                                               out, None, ctx.softplus, False)
            if ctx.squeeze:
                dB, dC = dB.squeeze(1), dC.squeeze(1)
            return du, ddelta, dA, dB, dC, dD, rest[0] if z is not None else None, dbias, None

    return lambda u, delta, A, B, C, D, z, bias, softplus: UpstreamScan.apply(u, delta, A, B, C, D, z, bias, softplus)
