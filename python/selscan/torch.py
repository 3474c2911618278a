"""Drop-in replacement for mamba_ssm's selective_scan_fn on torch tensors (CPU or CUDA):

    from selscan.torch import selective_scan_fn

Same signature and return values as mamba_ssm.ops.selective_scan_interface.selective_scan_fn. Differentiable,
and registered as the torch.library custom ops selscan::selective_scan_fwd / selscan::selective_scan_bwd (with
fake implementations and an autograd formula) so torch.compile traces through it without a graph break.
CUDA tensors run on torch's current stream of their device; outputs and workspace come from torch's allocator.
Differences from upstream: last_state is the true state for constant B too (upstream's is off by a factor B),
and it is returned without a gradient (upstream silently ignores its gradient).
"""

from typing import Optional, Tuple

import torch

from . import _core, _lib
from ._backends import TorchBackend
from ._lib import SelscanError

__all__ = ["selective_scan_fn", "SelectiveScanFn", "selective_scan_bwd_op", "selective_scan_fwd_op"]

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _none_if_empty(t, present):
    return t if present else None


def _fwd_impl(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    be = TorchBackend(u)
    p = _core.prepare(be, u, delta, A, B, C, D, z, delta_bias)
    r = _core.run_fwd(p, delta_softplus, want_x=True, want_last=True)
    out_z = r["out_z"] if z is not None else u.new_empty((0,))
    return r["out"], out_z, r["x"], r["last_state"]


def _bwd_impl(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic):
    be = TorchBackend(u)
    p = _core.prepare(be, u, delta, A, B, C, D, z, delta_bias)
    g = _core.run_bwd(p, dout, delta_softplus, deterministic=deterministic, saved_out=out, saved_x=x)
    res = []
    for k in ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias"):
        v = _core.user_grad(p, k, g[k])
        res.append(u.new_empty((0,)) if v is None else v)  # one tensor each: custom-op outputs may not alias
    return tuple(res)


def _wtype(A):
    return torch.complex64 if A.is_complex() else torch.float32


def _fake_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    bt, dm, L = u.shape
    n = A.shape[-1]
    nc = (L + _lib.CHUNK - 1) // _lib.CHUNK
    out = u.new_empty((bt, dm, L))
    out_z = u.new_empty((bt, dm, L)) if z is not None else u.new_empty((0,))
    x = u.new_empty((bt, dm, nc, 2 * n), dtype=_wtype(A))
    last = u.new_empty((bt, dm, n), dtype=_wtype(A))
    return out, out_z, x, last


def _fake_bwd(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic):
    wt = _wtype(A)

    def bc_grad(X):
        if X.dim() >= 3:  # variable: input dtype; given as complex -> complex back
            return X.new_empty(X.shape, dtype=torch.complex64 if X.is_complex() else u.dtype)
        return X.new_empty(X.shape, dtype=wt)

    def empty():
        return u.new_empty((0,))

    return (u.new_empty(u.shape), u.new_empty(delta.shape), A.new_empty(A.shape, dtype=wt), bc_grad(B), bc_grad(C),
            D.new_empty(D.shape, dtype=torch.float32) if D is not None else empty(),
            u.new_empty(z.shape) if z is not None else empty(),
            delta_bias.new_empty(delta_bias.shape, dtype=torch.float32) if delta_bias is not None else empty())


def _grads_to_inputs(grads, inputs):
    """Library gradients in the dtype of each input (autograd wants them to match), None where absent."""
    res = []
    for g, x in zip(grads, inputs):
        res.append(None if x is None else g.to(x.dtype))
    return res


_HAS_CUSTOM_OP = hasattr(torch, "library") and hasattr(torch.library, "custom_op")

if _HAS_CUSTOM_OP:
    @torch.library.custom_op("selscan::selective_scan_fwd", mutates_args=())
    def selective_scan_fwd_op(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                              C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                              delta_bias: Optional[torch.Tensor], delta_softplus: bool
                              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (out (pre-gate y), out_z (empty when z is None), x chunk states, last_state)."""
        return _fwd_impl(u, delta, A, B, C, D, z, delta_bias, delta_softplus)

    @torch.library.custom_op("selscan::selective_scan_bwd", mutates_args=())
    def selective_scan_bwd_op(dout: torch.Tensor, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor,
                              B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor],
                              z: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor], x: torch.Tensor,
                              out: torch.Tensor, delta_softplus: bool, deterministic: bool
                              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                         torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias); absent ones are empty tensors."""
        return _bwd_impl(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic)

    selective_scan_fwd_op.register_fake(_fake_fwd)
    selective_scan_bwd_op.register_fake(_fake_bwd)

    def _setup_context(ctx, inputs, output):
        u, delta, A, B, C, D, z, delta_bias, delta_softplus = inputs
        out, out_z, x, last_state = output
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, x, out)
        ctx.delta_softplus = delta_softplus
        # x and last_state carry no gradient (the library has no input for one).
        ctx.mark_non_differentiable(x, last_state)

    def _backward(ctx, dout, dout_z, dx, dlast):
        u, delta, A, B, C, D, z, delta_bias, x, out = ctx.saved_tensors
        g = dout_z if z is not None else dout
        if g is None:
            g = torch.zeros_like(u)
        grads = torch.ops.selscan.selective_scan_bwd(
            g, u, delta, A, B, C, D, z, delta_bias, x, out, ctx.delta_softplus,
            torch.are_deterministic_algorithms_enabled())
        return tuple(_grads_to_inputs(grads, (u, delta, A, B, C, D, z, delta_bias))) + (None,)

    selective_scan_fwd_op.register_autograd(_backward, setup_context=_setup_context)
else:  # torch < 2.4: plain functions, autograd through SelectiveScanFn only
    def selective_scan_fwd_op(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
        return _fwd_impl(u, delta, A, B, C, D, z, delta_bias, delta_softplus)

    def selective_scan_bwd_op(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic):
        return _bwd_impl(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic)


class SelectiveScanFn(torch.autograd.Function):
    """Upstream's class of the same name: SelectiveScanFn.apply(u, delta, A, B, C, D, z, delta_bias,
    delta_softplus, return_last_state). selective_scan_fn (the custom op) is the torch.compile-friendly path."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                return_last_state=False):
        _check_io_dtype(u)
        out, out_z, x, last_state = selective_scan_fwd_op(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus))
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, x, out)
        ctx.delta_softplus = bool(delta_softplus)
        ctx.mark_non_differentiable(last_state)
        y = out_z if z is not None else out
        return (y, last_state) if return_last_state else y

    @staticmethod
    def backward(ctx, dy, *unused):
        u, delta, A, B, C, D, z, delta_bias, x, out = ctx.saved_tensors
        grads = selective_scan_bwd_op(dy, u, delta, A, B, C, D, z, delta_bias, x, out, ctx.delta_softplus,
                                      torch.are_deterministic_algorithms_enabled())
        return tuple(_grads_to_inputs(grads, (u, delta, A, B, C, D, z, delta_bias))) + (None, None)


def _check_io_dtype(u):
    if not isinstance(u, torch.Tensor):
        raise SelscanError(f"u is a {type(u).__name__}; selscan.torch takes torch tensors", _lib.STATUS_INVALID_ARGUMENT)
    if u.dtype not in _IO_DTYPES:
        raise SelscanError(f"u: dtype {u.dtype} is not supported (expected torch.float32, float16 or bfloat16)",
                           _lib.STATUS_DTYPE_MISMATCH)


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False):
    """u, delta, z: (batch, dim, seqlen); A: (dim, dstate) float32 or complex64; B, C: (dim, dstate) or
    (batch, dstate, seqlen) / (batch, groups, dstate, seqlen) (complex A: seqlen*2, Re/Im interleaved);
    D, delta_bias: (dim,) float32. Returns out (out * silu(z) when z is given), and last_state
    (batch, dim, dstate) when return_last_state."""
    _check_io_dtype(u)
    if _HAS_CUSTOM_OP:
        out, out_z, _, last_state = torch.ops.selscan.selective_scan_fwd(
            u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus))
        y = out_z if z is not None else out
        return (y, last_state) if return_last_state else y
    return SelectiveScanFn.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
