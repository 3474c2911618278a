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
        out, out_z, x, last = r[1]
        return out, out_z if out_z is not None else u.new_empty((0,)), x, last
    be = TorchBackend(u)
    p = _core.prepare(be, u, delta, A, B, C, D, z, delta_bias)
    r = _core.run_fwd(p, delta_softplus, want_x=True, want_last=True)
    out_z = r["out_z"] if z is not None else u.new_empty((0,))
    return r["out"], out_z, r["x"], r["last_state"]


def _bwd_impl(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic):
    g = None
    if _ITYPES.get(u.dtype) and _WTYPES.get(A.dtype):
        g = _fast_bwd(dout, *_ready(u, delta, A, B, C, D, z, delta_bias), x, out, delta_softplus, deterministic)
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


def _code(t, want):
    """t's dtype code when it is `want`'s dtype, else None."""
    return want if (_ITYPES.get(t.dtype) if want in ("fp16", "bf16") else _WTYPES.get(t.dtype)) == want else None


# What each tensor of a call is: "io" (B, D, L) in u's dtype, "bc" B/C (variable: u's dtype; constant: A's),
# "w" A's dtype, "f32" float32.
_KINDS = {"u": "io", "delta": "io", "z": "io", "dout": "io", "out": "io", "out_z": "io", "du": "io", "ddelta": "io",
          "dz": "io", "A": "w", "x": "w", "last_state": "w", "dA": "w", "B": "bc", "C": "bc", "dB": "bc", "dC": "bc",
          "D": "f32", "delta_bias": "f32", "dD": "f32", "ddelta_bias": "f32"}


def _want(kind, t, it, wt):
    """The dtype code a tensor of `kind` must have, given u's (it) and A's (wt)."""
    if kind == "io" or (kind == "bc" and t.dim() >= 3):
        return it
    return "fp32" if kind == "f32" else wt


def _fixed(named, it, wt):
    """The library-ready form of a call's inputs: a tensor of the right dtype with a unit-stride last dimension
    where the library needs one (u, delta, z, dout, variable B/C). Models hand the scan transposed views (u, z,
    B, C of MambaMixer) and bf16 D / delta_bias: one copy each, as upstream makes. Returns (tensors, indices
    made row-contiguous, indices cast to float32), or None where the general path must convert (complex
    variable B/C given as complex, other dtypes)."""
    out, rows, casts = [], [], []
    for i, (name, t) in enumerate(named):
        if t is not None:
            kind = _KINDS[name]
            if kind == "f32" and t.dtype != torch.float32 and t.is_floating_point():
                t = t.float()
                casts.append(i)
            if _code(t, _want(kind, t, it, wt)) is None:
                return None
            if kind in ("io", "bc") and t.dim() >= 3 and t.shape[-1] > 1 and t.stride(-1) != 1:
                t = t.contiguous()
                rows.append(i)
        out.append(t)
    return out, tuple(rows), tuple(casts)


def _make_plan(kind, named, flags, dev):
    """A call plan from a first call's library-ready tensors ((name, tensor or None) pairs), or None."""
    it, wt = _ITYPES[named[0][1].dtype], _WTYPES[named[2][1].dtype]  # u's and A's dtypes
    specs = {name: (_want(_KINDS[name], t, it, wt), tuple(t.shape), tuple(t.stride()))
             for name, t in named if t is not None}
    ptrs = [t.data_ptr() for _, t in named if t is not None]
    try:
        plan = _plan.Plan(kind, specs, ptrs, flags, _lib.DEVICE_CUDA if dev >= 0 else _lib.DEVICE_CPU, max(dev, 0), 0)
    except SelscanError:
        return None  # the general path raises the same error in the caller's terms
    plan.info = plan.caller([i for i, (_, t) in enumerate(named) if t is not None], _plan.PTR_TORCH)
    return plan


def _allocator(shapes, like_dtype):
    """A function f(u) -> [new tensors of `shapes` ((shape, dtype) or None) on u's device], as straight-line
    code: per-call host time is the point. The dtype argument is left out where it is u's (`like_dtype`), which
    saves the argument parser a keyword."""
    scope, items = {}, []
    for i, s in enumerate(shapes):
        if s is None:
            items.append("None")
        elif s[1] == like_dtype:
            items.append(f"u.new_empty({tuple(s[0])!r})")
        else:
            scope[f"dt{i}"] = s[1]
            items.append(f"u.new_empty({tuple(s[0])!r}, dtype=dt{i})")
    src = "def alloc(u):\n    return [" + ", ".join(items) + "]\n"
    exec(compile(src, "<selscan allocator>", "exec"), scope)
    return scope["alloc"]


class _FwdPlan:
    __slots__ = ("plan", "call", "rows", "casts", "alloc", "softplus", "want_x", "want_last")


# torch.ops.selscan.scan_fwd.default (the op library selscan_torch_ops, src/torch_ops/stable_ops.cpp) where it
# loads and SELSCAN_TORCH_STABLE is not 0 (set at the end of this module): the forward's outputs and workspace
# are then allocated, and selscan_fwd called, in one torch op call instead of the plan's Python allocations and
# ctypes call. None: the ctypes route (bench/python_host.py sets it to None to time that route).
_scan_op = None
# torch.ops.selscan.scan_fwd_for_grad.default, from the same library: a training forward that also returns the
# inputs as the library read them, so the autograd forward needs no call-plan lookup.
_scan_grad_op = None
# torch.ops.selscan.scan_bwd.default, from the same library: the autograd backward as one op call (gradients,
# workspace and selscan_bwd in C++), taken by the backward of a forward run while it is set. None: the backward's
# call plan.
_scan_bwd_op = None


def _fwd_sig(u, delta, A, B, C, D, z, bias, flags):
    return (flags, u.shape, u.stride(), u.dtype, delta.shape, delta.stride(), delta.dtype, A.shape, A.stride(),
            A.dtype, B.shape, B.stride(), B.dtype, C.shape, C.stride(), C.dtype,
            None if D is None else (D.shape, D.stride(), D.dtype), None if z is None else (z.shape, z.stride(), z.dtype),
            None if bias is None else (bias.shape, bias.stride(), bias.dtype))


def _fast_fwd(u, delta, A, B, C, D, z, bias, softplus, want_x, want_last, out_z=None):
    """((u, delta, A, B, C, D, z, bias) as the library read them, (out, out_z, x, last_state) with None for
    absent ones), or None when the general path must run. The first call of a signature makes its plan.
    out_z: where the library writes out * silu(z) (u's shape and dtype, unit stride in L), else a new tensor."""
    fp = _fwd_plan(u, delta, A, B, C, D, z, bias, softplus, want_x, want_last, out_z)
    return None if fp is None else _run_fwd(fp, u, delta, A, B, C, D, z, bias, out_z)


def _fwd_plan(u, delta, A, B, C, D, z, bias, softplus, want_x, want_last, out_z=None):
    """The forward plan of this call's signature (made at its first call), or None for the general path."""
    if not _plan.ENABLED or delta is None or A is None or B is None or C is None:
        return None
    if out_z is not None and (z is None or out_z.shape != u.shape or out_z.dtype != u.dtype):
        return None
    # The signature, spelled out (no helper call, optional tensors nested): it is built on every call.
    key = (u.get_device(), softplus, want_x, want_last, None if out_z is None else out_z.stride(),
           u.shape, u.stride(), u.dtype, delta.shape, delta.stride(), delta.dtype, A.shape, A.stride(), A.dtype,
           B.shape, B.stride(), B.dtype, C.shape, C.stride(), C.dtype,
           None if D is None else (D.shape, D.stride(), D.dtype), None if z is None else (z.shape, z.stride(), z.dtype),
           None if bias is None else (bias.shape, bias.stride(), bias.dtype))
    plans = _plan.cache("torch_fwd")
    fp = plans.get(key, False)
    if fp is False:
        plans[key] = fp = _new_fwd_plan(u, delta, A, B, C, D, z, bias, softplus, want_x, want_last, key[0], out_z)
    return fp


def _run_fwd(fp, u, delta, A, B, C, D, z, bias, out_z=None):
    """One library forward through plan fp: (inputs as the library read them, outputs); see _fast_fwd."""
    ins = [u, delta, A, B, C, D, z, bias]
    for i in fp.rows:
        ins[i] = ins[i].contiguous()
    for i in fp.casts:
        ins[i] = ins[i].float()
    op = _scan_op
    if op is not None:  # the op allocates the outputs (the test hook POISON reaches the ctypes route's alone)
        try:
            return ins, op(*ins, fp.softplus, fp.want_x, fp.want_last, out_z)
        except RuntimeError:
            pass  # a call the library refuses (a CPU plan is not validated when made): raised below as SelscanError
    outs = fp.alloc(u)
    if out_z is not None:
        outs[1] = out_z
    if _backends.POISON:
        for t in outs:
            if t is not None:
                t.fill_(float("nan"))
    ts = ins + outs
    dev = u.get_device()
    if fp.plan.ws_bytes:
        ws = u.new_empty(fp.plan.ws_bytes, dtype=torch.uint8)
        fp.call(ts, _stream(dev), ws.data_ptr())
    else:
        fp.call(ts, _stream(dev), 0)
    return ins, outs


def _new_fwd_plan(u, delta, A, B, C, D, z, bias, softplus, want_x, want_last, dev, out_z=None):
    it, wt = _ITYPES.get(u.dtype), _WTYPES.get(A.dtype)
    if it is None or wt is None or u.device.type not in ("cpu", "cuda"):
        return None
    fixed = _fixed(tuple(zip(_lib.FWD_INPUTS, (u, delta, A, B, C, D, z, bias))), it, wt)
    if fixed is None:
        return None
    ins, rows, casts = fixed
    bt, dm, L = u.shape
    n = A.shape[-1]
    shapes = ((tuple(u.shape), u.dtype), (tuple(u.shape), u.dtype) if z is not None else None,
              ((bt, dm, (L + _lib.CHUNK - 1) // _lib.CHUNK, 2 * n), A.dtype) if want_x else None,
              ((bt, dm, n), A.dtype) if want_last else None)
    outs = [None if s is None else u.new_empty(s[0], dtype=s[1]) for s in shapes]
    if out_z is not None:
        outs[1] = out_z
    named = tuple(zip(_lib.FWD_INPUTS[:8], ins)) + tuple(zip(_lib.FWD_OUTPUTS, outs))
    plan = _make_plan("fwd", named, {"delta_softplus": softplus}, dev)
    if plan is None:
        return None
    fp = _FwdPlan()
    fp.plan, fp.call, fp.rows, fp.casts = plan, plan.info, rows, casts
    fp.softplus, fp.want_x, fp.want_last = softplus, want_x, want_last
    # out_z is given by the caller where it is given at all: no allocation for it.
    fp.alloc = _allocator(shapes if out_z is None else shapes[:1] + (None,) + shapes[2:], u.dtype)
    return fp


class _BwdPlan:
    __slots__ = ("plan", "call", "dout_rows", "alloc")


_GRADS = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")
_INTO_GRADS = (0, 1, 6, 3, 4)  # where _fast_bwd's `into` du, ddelta, dz, dB and dC go among the gradients


def _placed(grads, into):
    """grads with into's du, ddelta, dz, dB and dC in their places (where given) and into's out_z appended."""
    grads = list(grads)
    for i, t in zip(_INTO_GRADS, into):
        if t is not None:
            grads[i] = t
    return grads + [into[5]]


def _fast_bwd(dout, u, delta, A, B, C, D, z, bias, x, out, softplus, deterministic, into=None):
    """The eight gradients (None where the input is absent), or None when the general path must run. The
    inputs are what _fast_fwd returned (library-ready); x is read only when seqlen > 2048, out only with z.
    Each gradient is its own tensor (custom-op outputs may not share storage).
    `into` (du, ddelta, dz, dB, dC, out_z): tensors the library writes instead of new ones, any unit-last-stride
    layout (None: allocated here; dB / dC only for variable B / C); out_z, given only with z, is the recomputed
    out * silu(z), appended to the result. The fused layer uses it to write dz into its dxz, dB / dC into the
    rows of its x_dbl gradient, and du / ddelta in the layout of its projections."""
    if not _plan.ENABLED:
        return None
    dev = u.get_device()
    if x is not None and u.shape[-1] <= _lib.CHUNK:
        x = None
    if z is None:
        out = None
    into_sig = None if into is None else tuple(None if t is None else (t.shape, t.stride(), t.dtype) for t in into)
    key = _fwd_sig(u, delta, A, B, C, D, z, bias, (dev, softplus, deterministic, dout.shape, dout.stride(),
                                                   dout.dtype, x is None, out is None, into_sig))
    plans = _plan.cache("torch_bwd")
    bp = plans.get(key, False)
    if bp is None:
        return None
    if bp is False:
        plans[key] = bp = _new_bwd_plan(dout, u, delta, A, B, C, D, z, bias, x, out, softplus, deterministic, dev,
                                        into)
        if bp is None:
            return None
    return _run_bwd(bp, dout, u, delta, A, B, C, D, z, bias, x, out, dev, into)


def _run_bwd(bp, dout, u, delta, A, B, C, D, z, bias, x, out, dev, into=None):
    """One library backward through plan bp: the eight gradients (None where absent; see _fast_bwd)."""
    if bp.dout_rows:
        dout = dout.contiguous()
    # One allocation per gradient not written into `into` (which ones is part of the plan's signature): fewer
    # torch calls than carving them out of shared buffers (measured: the views and slices cost more than the
    # allocations they save), and no aliasing for custom-op outputs.
    grads = bp.alloc(u) if into is None else _placed(bp.alloc(u), into)
    if _backends.POISON:
        for t in grads:
            if t is not None:
                t.fill_(float("nan"))
    ts = [u, delta, A, B, C, D, z, bias, dout, x, out] + grads
    if bp.plan.ws_bytes:
        ws = u.new_empty(bp.plan.ws_bytes, dtype=torch.uint8)
        bp.call(ts, _stream(dev), ws.data_ptr())
    else:
        bp.call(ts, _stream(dev), 0)
    return grads


def _new_bwd_plan(dout, u, delta, A, B, C, D, z, bias, x, out, softplus, deterministic, dev, into=None):
    it, wt = _ITYPES.get(u.dtype), _WTYPES.get(A.dtype)
    if it is None or wt is None or u.device.type not in ("cpu", "cuda") or dout.shape != u.shape:
        return None
    fixed = _fixed((("dout", dout),), it, wt)
    if fixed is None:
        return None
    (dout,), dout_rows, _ = fixed
    bp = _BwdPlan()
    bp.dout_rows = bool(dout_rows)
    var_b, var_c = B.dim() >= 3, C.dim() >= 3
    shapes = [None if t is None else (tuple(t.shape), d) for t, d in (
        (u, u.dtype), (u, u.dtype), (A, A.dtype), (B, u.dtype if var_b else A.dtype), (C, u.dtype if var_c else A.dtype),
        (D, torch.float32), (z, u.dtype), (bias, torch.float32))]
    names = _GRADS
    if into is not None:
        like = (u, u, u, B if B.dim() >= 3 else None, C if C.dim() >= 3 else None, u)
        if (z is None) != (into[5] is None) or any(
                t is not None and (w is None or t.shape != w.shape or t.dtype != u.dtype or t.device != u.device)
                for t, w in zip(into, like)):
            return None
        skip = {i for i, t in zip(_INTO_GRADS, into) if t is not None}
        bp.alloc = _allocator([None if i in skip else sh for i, sh in enumerate(shapes)], u.dtype)
        grads, names = _placed(bp.alloc(u), into), _GRADS + ("out_z",)
    else:
        bp.alloc = _allocator(shapes, u.dtype)
        grads = bp.alloc(u)
    named = (tuple(zip(_lib.BWD_INPUTS[:8], (u, delta, A, B, C, D, z, bias))) + (("dout", dout), ("x", x), ("out", out))
             + tuple(zip(names, grads)))
    plan = _make_plan("bwd", named, {"delta_softplus": softplus, "deterministic": deterministic}, dev)
    if plan is None:
        return None
    bp.plan, bp.call = plan, plan.info
    return bp


# torch.autograd.Function.apply is a Python layer over the C entry point _FunctionBase.apply: for a Function with
# no setup_context and no functorch transform active, all it adds is unwrapping dead functorch wrappers (tensors
# that escaped a finished transform), through a generator over the arguments, about 7 µs of a training forward's
# host time on the 2-core machine. direct_apply(cls) calls the entry point with the same unwrapping, and
# Function.apply itself while a transform is active (where it raises for these Functions), under torch.compile
# (dynamo knows Function.apply, not the C call) or where this torch lacks any of the pieces.
_unwrap_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
_base_apply = getattr(torch._C, "_FunctionBase", object).__dict__.get("apply")


def _bound_apply(cls):
    """cls's _FunctionBase.apply, or None where direct_apply must fall back to cls.apply."""
    if _unwrap_dead is None or _transforms_active is None or _base_apply is None or "setup_context" in cls.__dict__:
        return None
    return _base_apply.__get__(None, cls)


def direct_apply(cls):
    """f(*args) doing cls.apply(*args) without Function.apply's Python layer (above)."""
    raw = _bound_apply(cls)
    if raw is None:
        return cls.apply
    uw, active, tensor = _unwrap_dead, _transforms_active, torch.Tensor

    def apply(*args):
        if active() or _is_compiling():  # under torch.compile too: dynamo traces Function.apply, not the C call
            return cls.apply(*args)
        return raw(*[uw(a) if isinstance(a, tensor) else a for a in args])

    return apply


class _ScanFn(torch.autograd.Function):
    """The eager autograd path of selective_scan_fn (fast path first, the custom ops' implementation else)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
        fp, r, op = None, None, _scan_grad_op
        if op is not None and _plan.ENABLED:
            try:
                r = op(u, delta, A, B, C, D, z, delta_bias, delta_softplus, u.shape[-1] > _lib.CHUNK, return_last_state)
            except (RuntimeError, NotImplementedError, TypeError):
                pass  # what the op refuses, the paths below convert or raise in the caller's terms
        if r is not None:
            out, out_z, x, last, cu, cdelta, cA, cB, cC, cD, cz, cbias = r
            ins = (u if cu is None else cu, delta if cdelta is None else cdelta, A if cA is None else cA,
                   B if cB is None else cB, C if cC is None else cC, D if cD is None else cD, z if cz is None else cz,
                   delta_bias if cbias is None else cbias)
        else:
            fp = _fwd_plan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, u.shape[-1] > _lib.CHUNK,
                           return_last_state)
            if fp is None:
                ins = _ready(u, delta, A, B, C, D, z, delta_bias)
                out, out_z, x, last = _fwd_impl(*ins, delta_softplus)
            else:
                ins, (out, out_z, x, last) = _run_fwd(fp, u, delta, A, B, C, D, z, delta_bias)
        ctx.save_for_backward(*ins, x, out if z is not None else None)
        ctx.fp, ctx.delta_softplus, ctx.bwd_op = fp, delta_softplus, _scan_bwd_op  # the route: chosen here
        # D and delta_bias are float32 in the library; models kept in bf16 hand them in bf16 (cast back below).
        ctx.in_dtypes = (None if D is None else D.dtype, None if delta_bias is None else delta_bias.dtype)
        y = out_z if z is not None else out
        if return_last_state:
            ctx.mark_non_differentiable(last)
            return y, last
        return y

    @staticmethod
    def backward(ctx, dy, *unused):
        u, delta, A, B, C, D, z, bias, x, out = ctx.saved_tensors
        det = torch.are_deterministic_algorithms_enabled()
        fp, g, op = ctx.fp, None, ctx.bwd_op
        if op is not None and _plan.ENABLED:
            # One op call: gradients, workspace and the library call in C++, no plan lookup here.
            try:
                g = op(dy, u, delta, A, B, C, D, z, bias, x, out, ctx.delta_softplus, det)
            except (RuntimeError, NotImplementedError, TypeError):
                pass  # what the op refuses, the paths below run or raise in the caller's terms
        if g is None and fp is not None and _plan.ENABLED:
            # The saved tensors are the ones forward plan fp ran on, so fp stands for their whole signature: the
            # backward's key adds only what varies, dy's layout (its shape is y's: autograd checks) and det.
            key = (fp, dy.stride(), dy.dtype, det)
            plans = _plan.cache("torch_bwd")
            bp = plans.get(key, False)
            if bp is False:
                plans[key] = bp = _new_bwd_plan(dy, u, delta, A, B, C, D, z, bias, x, out, ctx.delta_softplus, det,
                                                u.get_device())
            if bp is not None:
                g = _run_bwd(bp, dy, u, delta, A, B, C, D, z, bias, x, out, u.get_device())
        if g is None:
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


# selective_scan_fn's autograd call, spelled out there (a tensor test per argument is the generic form's cost).
_scan_apply = _bound_apply(_ScanFn)


def _block_slots(sv, n, length, slots):
    """Block mode: the slot each sequence starts from and whether it starts from it (c > 0, its flag set, a slot of
    the pool), and the backward's serving arguments: the backward has no block fields, so its cache_indices mark
    the padding sequences (final entry pad_slot_id)."""
    table, K, pad = sv.t["block_table"].long(), sv.state_block_size, sv.pad_slot_id
    dev = table.device
    cu = sv.t["cu_seqlens"]
    lens = torch.full((n,), length, device=dev, dtype=torch.long) if cu is None else (cu[1:] - cu[:-1]).long()
    ctx = sv.t["context_lens"]
    ctx = torch.zeros(n, device=dev, dtype=torch.long) if ctx is None else ctx.long()
    rows = torch.arange(n, device=dev)
    start = table[rows, ((ctx - 1) // K).clamp(0, table.shape[1] - 1)]
    fin = table[rows, ((ctx + lens - 1) // K).clamp(0, table.shape[1] - 1)]
    padding = (lens > 0) & (fin == pad)
    keep = (ctx > 0) & (lens > 0) & ~padding & (start >= 0) & (start < slots)
    if sv.t["has_initial_state"] is not None:
        keep = keep & (sv.t["has_initial_state"] != 0)
    bwd = sv.without_pool()
    if bool(padding.any()):
        bwd.t["cache_indices"] = torch.where(padding, pad, 0).to(torch.int64)
        bwd.codes["cache_indices"] = "i64"
        bwd.pad_slot_id = pad
    return start, keep, bwd


class _ServingScanFn(torch.autograd.Function):
    """selective_scan_fn with serving arguments (docs/serving.md): packed sequences, per-sequence initial states,
    a state pool. The general path (_core), kept apart from the dense fast path. The pool is updated in place and
    is not differentiable; the states the sequences started from get gradients through initial_state."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, return_last_state, sv_args):
        be = TorchBackend(u)
        p = _core.prepare(be, u, delta, A, B, C, D, z, delta_bias, initial_state)
        sv = _core.Serving(be, *sv_args)
        grad = any(ctx.needs_input_grad[:9])
        h0, sv_bwd = None, sv
        pool = sv.t["ssm_states"]
        if grad and pool is not None:
            # The backward starts each sequence where the forward did: gather the slots before they are overwritten.
            idx = sv.t["cache_indices"]
            n = sv.sequences(u.shape[0])
            if sv.state_block_size > 0:
                idx, keep, sv_bwd = _block_slots(sv, n, u.shape[2], pool.shape[0])
            else:
                idx = torch.arange(n, device=u.device) if idx is None else idx.long()
                keep = (idx >= 0) & (idx < pool.shape[0])
            h0 = pool[torch.where(keep, idx, torch.zeros_like(idx))] * keep.view(-1, 1, 1).to(pool.dtype)
        r = _core.run_fwd(p, delta_softplus, want_x=grad and _core.needs_x(p, sv), want_last=return_last_state,
                          serving=sv)
        ctx.p, ctx.sv, ctx.softplus, ctx.h0 = p, sv_bwd, delta_softplus, h0
        ctx.saved = (r["out"] if z is not None else None, r["x"])
        ctx.in_dtypes = (None if D is None else D.dtype, None if delta_bias is None else delta_bias.dtype)
        y = r["out_z"] if z is not None else r["out"]
        if return_last_state:
            ctx.mark_non_differentiable(r["last_state"])
            return y, r["last_state"]
        return y

    @staticmethod
    def backward(ctx, dy, *unused):
        p, sv = ctx.p, ctx.sv
        if ctx.h0 is not None:  # a pool call: its sequences' starting states as h0
            p.t["h0"] = ctx.h0
        out, x = ctx.saved
        det = torch.are_deterministic_algorithms_enabled()
        g = _core.run_bwd(p, dy.contiguous(), ctx.softplus, deterministic=det, saved_out=out, saved_x=x, serving=sv)
        dD, dbias = g["dD"], g["ddelta_bias"]
        d_dt, b_dt = ctx.in_dtypes
        if dD is not None and dD.dtype != d_dt:
            dD = dD.to(d_dt)
        if dbias is not None and dbias.dtype != b_dt:
            dbias = dbias.to(b_dt)
        grads = [_core.user_grad(p, k, g[k]) for k in ("du", "ddelta", "dA", "dB", "dC")]
        dh0 = g["dh0"] if ctx.h0 is None else None
        return (*grads, dD, g["dz"], dbias, dh0, None, None, None)


def _as_f32(t):
    return t if t is None or t.dtype is torch.float32 else t.float()


def _rows(t):
    return t if t is None or t.dim() < 3 or t.shape[-1] == 1 or t.stride(-1) == 1 else t.contiguous()


def _ready(u, delta, A, B, C, D, z, delta_bias):
    """The inputs as the library reads them (see _fixed), for the general path."""
    return [_rows(u), _rows(delta), A, _rows(B), _rows(C), _as_f32(D), _rows(z), _as_f32(delta_bias)]


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
                      return_last_state=False, *, cu_seqlens=None, initial_state=None, ssm_states=None,
                      cache_indices=None, has_initial_state=None, pad_slot_id=-1, block_table=None,
                      context_lens=None, state_block_size=0):
    """u, delta, z: (batch, dim, seqlen); A: (dim, dstate) float32 or complex64; B, C: (dim, dstate) or
    (batch, dstate, seqlen) / (batch, groups, dstate, seqlen) (complex A: seqlen*2, Re/Im interleaved);
    D, delta_bias: (dim,) float32. Returns out (out * silu(z) when z is given), and last_state
    (batch, dim, dstate) when return_last_state.
    Serving (docs/serving.md; keyword-only, eager autograd, not traced by torch.compile): cu_seqlens packs
    sequences along seqlen (u (1, dim, total_len)); initial_state (sequences, dim, dstate) is differentiable;
    ssm_states (slots, dim, dstate) is a state pool updated in place, cache_indices / has_initial_state /
    pad_slot_id as the C ABI's; block_table / context_lens / state_block_size: block-wise state caching (the
    state at every block end written into that block's slot of ssm_states)."""
    if not (cu_seqlens is None and initial_state is None and ssm_states is None and cache_indices is None
            and has_initial_state is None and block_table is None and context_lens is None and not state_block_size):
        _check_io_dtype(u)
        sv_args = (cu_seqlens, ssm_states, cache_indices, has_initial_state, pad_slot_id, block_table, context_lens,
                   state_block_size)
        return _ServingScanFn.apply(u, delta, A, B, C, D, z, delta_bias, initial_state, bool(delta_softplus),
                                    bool(return_last_state), sv_args)
    _check_io_dtype(u)
    if delta is None or A is None or B is None or C is None:
        missing = next(n for n, t in (("delta", delta), ("A", A), ("B", B), ("C", C)) if t is None)
        raise SelscanError(f"{missing} is required (got None)", _lib.STATUS_INVALID_ARGUMENT)
    softplus, want_last = bool(delta_softplus), bool(return_last_state)
    if _HAS_CUSTOM_OP and _is_compiling():
        out, out_z, _, last_state = torch.ops.selscan.selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, softplus)
        y = out_z if z is not None else out
        return (y, last_state) if want_last else y
    # Spelled out rather than any(...) over a tuple: this runs on every call, per layer and token.
    if torch.is_grad_enabled() and (u.requires_grad or delta.requires_grad or A.requires_grad or B.requires_grad
                                    or C.requires_grad or (D is not None and D.requires_grad)
                                    or (z is not None and z.requires_grad)
                                    or (delta_bias is not None and delta_bias.requires_grad)):
        if _scan_apply is None or _transforms_active() or _is_compiling():
            return _ScanFn.apply(u, delta, A, B, C, D, z, delta_bias, softplus, want_last)
        uw = _unwrap_dead
        return _scan_apply(uw(u), uw(delta), uw(A), uw(B), uw(C), None if D is None else uw(D),
                           None if z is None else uw(z), None if delta_bias is None else uw(delta_bias), softplus,
                           want_last)
    # No gradient wanted: no autograd node, no chunk states.
    op = _scan_op
    if op is not None and _plan.ENABLED:
        # The op converts as the plan path does, so no signature lookup here. What it refuses (complex variable
        # B/C given as complex, another device, a wrong argument) the path below converts, or raises in the
        # caller's terms.
        try:
            out, out_z, _, last_state = op(u, delta, A, B, C, D, z, delta_bias, softplus, False, want_last, None)
        except (RuntimeError, NotImplementedError, TypeError):
            pass
        else:
            y = out_z if z is not None else out
            return (y, last_state) if want_last else y
    r = _fast_fwd(u, delta, A, B, C, D, z, delta_bias, softplus, False, want_last)
    if r is None:
        out, out_z, _, last_state = selective_scan_fwd_op(u, delta, A, B, C, D, z, delta_bias, softplus)
    else:
        out, out_z, _, last_state = r[1]
    y = out_z if z is not None else out
    return (y, last_state) if want_last else y


# ------------------------------------------------------------------------------------------- decode step
# selscan.torch.selective_state_update and the op selscan::selective_state_update (_decode_torch.py).
from ._decode_torch import selective_state_update, selective_state_update_op  # noqa: E402
from . import _decode_torch  # noqa: E402

# The scan forward's op comes with the decode step's library, loaded there under the same SELSCAN_TORCH_STABLE
# choice; an op library built before it had the op leaves the ctypes route.
if _decode_torch.stable_ops_active:
    try:
        _scan_op = torch.ops.selscan.scan_fwd.default
    except (AttributeError, RuntimeError):
        _scan_op = None
    try:
        _scan_grad_op = torch.ops.selscan.scan_fwd_for_grad.default
    except (AttributeError, RuntimeError):
        _scan_grad_op = None
    try:
        _scan_bwd_op = torch.ops.selscan.scan_bwd.default
    except (AttributeError, RuntimeError):
        _scan_bwd_op = None

__all__ += ["selective_state_update", "selective_state_update_op"]


# ------------------------------------------------------------------------------------------- causal conv1d
# selscan.torch.causal_conv1d_fn / causal_conv1d_update and the ops selscan::causal_conv1d_* (_conv1d_torch.py).
from ._conv1d_torch import causal_conv1d_fn, causal_conv1d_update  # noqa: E402

__all__ += ["causal_conv1d_fn", "causal_conv1d_update"]


# ------------------------------------------------------------------------------------------- fused Mamba-1 layer
# selscan.torch.mamba_inner_fn: mamba_ssm's, on the conv1d and scan above (_inner.py).
from ._inner import MambaInnerFn, mamba_inner_fn  # noqa: E402

__all__ += ["mamba_inner_fn", "MambaInnerFn"]
