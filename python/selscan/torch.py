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

from . import _backends, _core, _lib, _plan
from ._backends import TorchBackend
from ._lib import SelscanError

__all__ = ["selective_scan_fn", "SelectiveScanFn", "selective_scan_bwd_op", "selective_scan_fwd_op"]

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _none_if_empty(t, present):
    return t if present else None


def _fwd_impl(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    r = _fast_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, True, True)
    if r is not None:
        out, out_z, x, last = r
        return out, out_z if out_z is not None else u.new_empty((0,)), x, last
    be = TorchBackend(u)
    p = _core.prepare(be, u, delta, A, B, C, D, z, delta_bias)
    r = _core.run_fwd(p, delta_softplus, want_x=True, want_last=True)
    out_z = r["out_z"] if z is not None else u.new_empty((0,))
    return r["out"], out_z, r["x"], r["last_state"]


def _bwd_impl(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic):
    g = _fast_bwd(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic)
    if g is not None:
        return tuple(u.new_empty((0,)) if v is None else v for v in g)
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


# ------------------------------------------------------------------------------------------- eager fast path
# Eager calls (not under torch.compile) skip the custom-op dispatcher and the general conversions: tensors
# already in the library's dtypes and layouts go through a call plan cached per signature (_plan.py), and the
# autograd Function below saves what the backward needs. Anything else takes the custom-op path above.

_ITYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_WTYPES = {torch.float32: "fp32", torch.complex64: "c64"}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _stream(dev):
    if dev < 0:
        return 0
    if _raw_stream is not None:
        return _raw_stream(dev)
    return torch.cuda.current_stream(dev).cuda_stream


def _sig(t):
    return None if t is None else (t.shape, t.stride(), t.dtype)


def _specs(named, kinds, it, wt):
    """Library specs of a signature's tensors, or None when one needs the general path's conversions."""
    specs = {}
    for name, t in named:
        if t is None:
            continue
        kind = kinds[name]
        want = it if kind == "io" or (kind == "bc" and t.dim() >= 3) else ("fp32" if kind == "f32" else wt)
        code = _ITYPES.get(t.dtype) if want in ("fp16", "bf16") else \
            {torch.float32: "fp32", torch.complex64: "c64"}.get(t.dtype)
        if code != want:
            return None
        if kind in ("io", "bc") and t.dim() >= 3 and t.shape[-1] > 1 and t.stride(-1) != 1:
            return None
        specs[name] = (code, tuple(t.shape), tuple(t.stride()))
    return specs


_FWD_KINDS = {"u": "io", "delta": "io", "z": "io", "A": "w", "B": "bc", "C": "bc", "D": "f32", "delta_bias": "f32",
              "out": "io", "out_z": "io", "x": "w", "last_state": "w"}
_BWD_KINDS = dict(_FWD_KINDS, dout="io", du="io", ddelta="io", dz="io", dA="w", dB="bc", dC="bc", dD="f32",
                  ddelta_bias="f32")


def _new(u, shape, dtype):
    t = u.new_empty(shape, dtype=dtype)
    if _backends.POISON:
        t.fill_(float("nan"))
    return t


def _fast_fwd(u, delta, A, B, C, D, z, bias, softplus, want_x, want_last):
    """(out, out_z or None, x or None, last_state or None), or None when the general path must run."""
    if not _plan.ENABLED or delta is None or A is None or B is None or C is None:
        return None
    dev = u.get_device()
    key = (dev, softplus, want_x, want_last, _sig(u), _sig(delta), _sig(A), _sig(B), _sig(C), _sig(D), _sig(z),
           _sig(bias))
    plans = _plan.cache("torch_fwd")
    plan = plans.get(key, False)
    if plan is None:
        return None
    if plan is False:
        it, wt = _ITYPES.get(u.dtype), _WTYPES.get(A.dtype)
        if it is None or wt is None or u.device.type not in ("cpu", "cuda"):
            plans[key] = None
            return None
        bt, dm, L = u.shape
        n = A.shape[-1]
        shapes = ((tuple(u.shape), u.dtype), (tuple(u.shape), u.dtype) if z is not None else None,
                  ((bt, dm, (L + _lib.CHUNK - 1) // _lib.CHUNK, 2 * n), A.dtype) if want_x else None,
                  ((bt, dm, n), A.dtype) if want_last else None)
    else:
        shapes = plan.info
    outs = [None if s is None else _new(u, *s) for s in shapes]
    ins = (u, delta, A, B, C, D, z, bias)
    if plan is False:
        named = tuple(zip(_lib.FWD_INPUTS, ins)) + tuple(zip(_lib.FWD_OUTPUTS, outs))
        specs = _specs(named, _FWD_KINDS, it, wt)
        plan = None
        if specs is not None:
            try:
                plan = _plan.Plan("fwd", specs, [t.data_ptr() for _, t in named if t is not None],
                                  {"delta_softplus": softplus}, _lib.DEVICE_CUDA if dev >= 0 else _lib.DEVICE_CPU,
                                  max(dev, 0), 0)
                plan.info = shapes
            except SelscanError:
                plan = None  # the general path raises the same error in the caller's terms
        plans[key] = plan
        if plan is None:
            return None
    ptrs = [t.data_ptr() for t in ins if t is not None]
    ptrs += [t.data_ptr() for t in outs if t is not None]
    if plan.ws_bytes:
        ws = u.new_empty(plan.ws_bytes, dtype=torch.uint8)
        plan.run(ptrs, _stream(dev), ws.data_ptr())
    else:
        plan.run(ptrs, _stream(dev))
    return outs


def _fast_bwd(dout, u, delta, A, B, C, D, z, bias, x, out, softplus, deterministic):
    """The eight gradients (None where the input is absent), or None when the general path must run."""
    if not _plan.ENABLED:
        return None
    if dout.dim() >= 1 and dout.shape[-1] > 1 and dout.stride(-1) != 1:
        dout = dout.contiguous()
    dev = u.get_device()
    key = (dev, softplus, deterministic, _sig(dout), _sig(u), _sig(delta), _sig(A), _sig(B), _sig(C), _sig(D),
           _sig(z), _sig(bias), _sig(x), _sig(out))
    plans = _plan.cache("torch_bwd")
    plan = plans.get(key, False)
    if plan is None:
        return None
    if plan is False:
        it, wt = _ITYPES.get(u.dtype), _WTYPES.get(A.dtype)
        if it is None or wt is None or u.device.type not in ("cpu", "cuda"):
            plans[key] = None
            return None

        def like(t, dtype):
            return None if t is None else (tuple(t.shape), dtype)

        bc = {True: u.dtype, False: A.dtype}
        shapes = (like(u, u.dtype), like(u, u.dtype), like(A, A.dtype), like(B, bc[B.dim() >= 3]),
                  like(C, bc[C.dim() >= 3]), like(D, torch.float32), like(z, u.dtype), like(bias, torch.float32))
    else:
        shapes = plan.info
    grads = [None if s is None else _new(u, *s) for s in shapes]
    saved_x = x if x is not None and x.numel() > 0 and (u.shape[-1] > _lib.CHUNK) else None
    saved_out = out if z is not None else None
    ins = (u, delta, A, B, C, D, z, bias, None, dout, saved_x, saved_out)
    if plan is False:
        named = tuple(zip(_lib.BWD_INPUTS + _lib.BWD_SAVED, ins)) + tuple(
            zip(("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias"), grads))
        specs = _specs(named, _BWD_KINDS, it, wt)
        plan = None
        if specs is not None:
            try:
                plan = _plan.Plan("bwd", specs, [t.data_ptr() for _, t in named if t is not None],
                                  {"delta_softplus": softplus, "deterministic": deterministic},
                                  _lib.DEVICE_CUDA if dev >= 0 else _lib.DEVICE_CPU, max(dev, 0), 0)
                plan.info = shapes
            except SelscanError:
                plan = None
        plans[key] = plan
        if plan is None:
            return None
    ptrs = [t.data_ptr() for t in ins if t is not None]
    ptrs += [t.data_ptr() for t in grads if t is not None]
    if plan.ws_bytes:
        ws = u.new_empty(plan.ws_bytes, dtype=torch.uint8)
        plan.run(ptrs, _stream(dev), ws.data_ptr())
    else:
        plan.run(ptrs, _stream(dev))
    return grads


def _as_f32(t):
    return t if t is None or t.dtype is torch.float32 else t.float()


def _rows(t):
    """t with a unit-stride last dimension, as the library takes (B, L)-indexed tensors: models hand the scan
    transposed views (u, z, B, C of MambaMixer are), which need one copy, as upstream makes."""
    if t is None or t.dim() < 3 or t.shape[-1] == 1 or t.stride(-1) == 1:
        return t
    return t.contiguous()


class _ScanFn(torch.autograd.Function):
    """The eager autograd path of selective_scan_fn (fast path first, the custom ops' implementation else)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
        # D and delta_bias are float32 in the library; models kept in bf16 hand them in bf16 (cast back below).
        D32, bias32 = _as_f32(D), _as_f32(delta_bias)
        u, delta, B, C, z = _rows(u), _rows(delta), _rows(B), _rows(C), _rows(z)
        want_x = u.shape[-1] > _lib.CHUNK
        r = _fast_fwd(u, delta, A, B, C, D32, z, bias32, delta_softplus, want_x, return_last_state)
        if r is None:
            out, out_z, x, last = _fwd_impl(u, delta, A, B, C, D32, z, bias32, delta_softplus)
        else:
            out, out_z, x, last = r
        ctx.save_for_backward(u, delta, A, B, C, D32, z, bias32, x, out if z is not None else None)
        ctx.delta_softplus = delta_softplus
        ctx.in_dtypes = (D.dtype if D is not None else None, delta_bias.dtype if delta_bias is not None else None)
        y = out_z if z is not None else out
        if return_last_state:
            ctx.mark_non_differentiable(last)
            return y, last
        return y

    @staticmethod
    def backward(ctx, dy, *unused):
        u, delta, A, B, C, D, z, bias, x, out = ctx.saved_tensors
        det = torch.are_deterministic_algorithms_enabled()
        g = _fast_bwd(dy, u, delta, A, B, C, D, z, bias, x, out, ctx.delta_softplus, det)
        if g is None:
            g = _bwd_impl(dy, u, delta, A, B, C, D, z, bias, x if x is not None else u.new_empty((0,)),
                          out if out is not None else u, ctx.delta_softplus, det)
            g = [None if t is None else gi for gi, t in zip(g, (u, delta, A, B, C, D, z, bias))]
        du, ddelta, dA, dB, dC, dD, dz, dbias = g
        d_dt, b_dt = ctx.in_dtypes
        if dD is not None and dD.dtype != d_dt:
            dD = dD.to(d_dt)
        if dbias is not None and dbias.dtype != b_dt:
            dbias = dbias.to(b_dt)
        return du, ddelta, _match(dA, A), _match(dB, B), _match(dC, C), dD, dz, dbias, None, None


def _match(g, t):
    return g if g is None or g.dtype == t.dtype else g.to(t.dtype)


class SelectiveScanFn(torch.autograd.Function):
    """Upstream's class of the same name: SelectiveScanFn.apply(u, delta, A, B, C, D, z, delta_bias,
    delta_softplus, return_last_state). selective_scan_fn is the same computation (and traceable by
    torch.compile)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                return_last_state=False):
        _check_io_dtype(u)
        return _ScanFn.forward(ctx, u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus),
                               bool(return_last_state))

    @staticmethod
    def backward(ctx, dy, *unused):
        return _ScanFn.backward(ctx, dy)


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
    softplus, want_last = bool(delta_softplus), bool(return_last_state)
    if _HAS_CUSTOM_OP and _is_compiling():
        out, out_z, _, last_state = torch.ops.selscan.selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, softplus)
        y = out_z if z is not None else out
        return (y, last_state) if want_last else y
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (u, delta, A, B, C, D, z, delta_bias)):
        return _ScanFn.apply(u, delta, A, B, C, D, z, delta_bias, softplus, want_last)
    # No gradient wanted: no autograd node, no chunk states.
    r = _fast_fwd(_rows(u), _rows(delta), A, _rows(B), _rows(C), _as_f32(D), _rows(z), _as_f32(delta_bias), softplus,
                  False, want_last)
    if r is None:
        out, out_z, _, last_state = selective_scan_fwd_op(u, delta, A, B, C, D, z, delta_bias, softplus)
    else:
        out, out_z, _, last_state = r
    y = out_z if z is not None else out
    return (y, last_state) if want_last else y
