"""mamba_ssm's mamba_inner_fn (the fused Mamba-1 layer of transformers' MambaMixer fast path) on libselscan's causal
conv1d and selective scan:

    xz (batch, 2*dim, seqlen) -> x, z -> conv = silu(causal_conv1d(x) + bias) -> x_dbl = x_proj @ conv
    -> delta = dt_proj @ x_dbl[:dt_rank], B = x_dbl[dt_rank:dt_rank+N], C = x_dbl[-N:] (optional RMS norms)
    -> y = selective_scan(conv, delta, A, B, C, D, z, delta_bias, softplus) -> out_proj(y)

Same signature and meaning as mamba_ssm.ops.selective_scan_interface.mamba_inner_fn. The backward recomputes the
conv output, delta and the projected B / C (checkpoint_lvl=1, the default; 0 saves conv output and delta) from
xz and x_dbl, so the graph keeps xz, x_dbl, the scan's pre-gate output and its chunk states, plus the weights.

Differences from upstream, each where upstream's result is wrong: the RMS norms are differentiated (upstream
passes dB / dC / ddelta through them unchanged and returns no gradient for their weights, and with
checkpoint_lvl=1 normalises B and C a second time before its scan backward); x_proj's rows of a B or C given by
the caller get a zero gradient (upstream's are uninitialised memory); the weights are cast to the matmul dtype
also without autocast (upstream then requires them in xz's dtype).
"""

import contextlib

import torch
import torch.nn.functional as F

from . import _backends, _conv1d, _lib, _plan
from . import torch as _sst  # selscan.torch (this module is imported at its end): its scan entry points
from ._lib import SelscanError

__all__ = ["mamba_inner_fn", "MambaInnerFn"]


def _autocast_dtype(device_type):
    """The autocast dtype when autocast is on for device_type, else None."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
        return None
    except (TypeError, AttributeError):  # torch < 2.4: CUDA only
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        return None


def _autocast_on(device_type):
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument; assume on (the general path then decides)
        return True


def _no_autocast(device_type):
    """autocast off for device_type (entering torch.autocast costs tens of microseconds: skipped when it is off)."""
    return torch.autocast(device_type, enabled=False) if _autocast_on(device_type) else _NULL


_NULL = contextlib.nullcontext()


def _cast(t, dtype):
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _along(w, dim, ndim):
    """w (n,) shaped to broadcast along dimension `dim` of an ndim-dimensional tensor."""
    dim = dim % ndim
    return w.reshape((-1,) + (1,) * (ndim - dim - 1))


def _rms(x, w, eps, dim):
    """mamba_ssm's rms_norm_forward along `dim`: computed in float32, returned in x's dtype."""
    xf = x.float()
    r = torch.rsqrt(xf.square().mean(dim, keepdim=True) + eps)
    return (xf * r * _along(w.float(), dim, x.dim())).to(x.dtype)


def _rms_bwd(g, x, w, eps, dim):
    """(dx float32, dw float32) of y = _rms(x, w, eps, dim) for the gradient g of y."""
    xf, gf = x.float(), g.float()
    r = torch.rsqrt(xf.square().mean(dim, keepdim=True) + eps)
    xhat = xf * r
    others = [d for d in range(x.dim()) if d != dim % x.dim()]
    dw = (gf * xhat).sum(others)
    gx = gf * _along(w.float(), dim, x.dim())
    dx = r * (gx - xhat * (gx * xhat).mean(dim, keepdim=True))
    return dx, dw


def _interleave(t, ds):
    """Projected B / C of complex A: x_dbl rows (batch, 2N, L) as (n, re/im) pairs -> (batch, N, 2L) with
    Re/Im interleaved along L, the library's layout of complex variable B / C."""
    b, _, L = t.shape
    return t.reshape(b, ds // 2, 2, L).transpose(2, 3).reshape(b, ds // 2, 2 * L)


def _deinterleave(t, ds):
    b, n, L2 = t.shape
    return t.reshape(b, n, L2 // 2, 2).transpose(2, 3).reshape(b, ds, L2 // 2)


class _Cfg:
    __slots__ = ("dm", "rank", "ds", "adt", "mdt", "cplx", "eps", "softplus", "lvl", "given_B", "given_C",
                 "in_dtypes", "w_shape", "dev")


def _bc(cfg, x_dbl, given, proj_bias, rms_w, first):
    """The scan's B (first) or C: projected from x_dbl (+ bias, RMS norm) unless given. Also returns the
    pre-norm value the RMS backward needs (None without a norm)."""
    if given is not None:
        pre = given
        if rms_w is None:
            return given, None
        dim = -1 if given.dim() == 2 else -2
        return _rms(given, rms_w, cfg.eps, dim), pre
    lo = cfg.rank if first else x_dbl.shape[1] - cfg.ds
    v = x_dbl[:, lo:lo + cfg.ds]
    if proj_bias is not None:
        v = v + _along(proj_bias.to(v.dtype), 1, 3)
    pre = v if rms_w is not None else None
    if rms_w is not None:
        v = _rms(v, rms_w, cfg.eps, 1)
    if cfg.cplx:
        v = _interleave(v, cfg.ds)
    return v.to(cfg.adt).unsqueeze(1), pre


def _delta(cfg, x_dbl2, dt_w, dt_rms_w, bt):
    """(delta (batch, dim, L) in the activation dtype, pre-norm delta or None) from x_dbl as (K, bt*L)."""
    d = _bdl(torch.matmul(dt_w, x_dbl2[:cfg.rank]), bt)  # one GEMM; the scan takes the strided view
    if dt_rms_w is None:
        return _cast(d, cfg.adt), None
    return _rms(d, dt_rms_w, cfg.eps, 1).to(cfg.adt), d


def _bdl(t, bt):
    """A (c, bt*L) matrix seen as (bt, c, L) without a copy: strides (L, bt*L, 1)."""
    return t.view(t.shape[0], bt, -1).transpose(0, 1)


def _mat(t):
    """(bt, c, L) -> (c, bt*L): the inverse of _bdl; a view for tensors made by _bdl, else a copy."""
    return t.transpose(0, 1).reshape(t.shape[1], -1)


def _conv_fwd(x, w, bias, want_inputs=False):
    """The conv output as a (dim, bt*L) matrix: x_proj then runs as one GEMM on it without a copy, and the scan
    reads its (bt, dim, L) view. want_inputs: also the inputs as the library read them."""
    out = x.new_empty((x.shape[1], x.shape[0] * x.shape[2]))
    _, _, ins = _conv1d.conv1d_fwd(x, w, bias, None, None, None, False, True, out=_bdl(out, x.shape[0]))
    return (out, ins) if want_inputs else out


def _scan_fwd(u, delta, A, B, C, D, z, bias, softplus, out_z):
    """(out before the z gate, out * silu(z), chunk states or None, the inputs as the fast path read them or None
    where the general path ran) from the library's forward; out_z written into the given tensor (copied there
    where the general path runs)."""
    want_x = u.shape[-1] > _lib.CHUNK
    r = _sst._fast_fwd(u, delta, A, B, C, D, z, bias, softplus, want_x, False, out_z=out_z)
    if r is None:
        out, oz, x, _ = _sst._fwd_impl(*_sst._ready(u, delta, A, B, C, D, z, bias), softplus)
        return out, out_z.copy_(oz), x if want_x else None, None
    ins, (out, out_z, x, _) = r
    return out, out_z, x, ins


def _scan_bwd(dy, u, delta, A, B, C, D, z, bias, x, out, softplus, det, into):
    """The library's (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, out_z), None where absent; du, ddelta, dz,
    dB, dC and the recomputed out_z = out * silu(z) written into `into` (du, ddelta, dz, dB, dC, out_z; dB / dC
    may be None) where the fast path runs, else copied there."""
    ins = _sst._ready(u, delta, A, B, C, D, z, bias)
    g = _sst._fast_bwd(dy, *ins, x, out, softplus, det, into=into)
    if g is None:
        g = _sst._bwd_impl(dy, *ins, x if x is not None else u.new_empty((0,)), out, softplus, det)
        g = [None if t is None else gi for gi, t in zip(g, ins)]
        for i, t in zip(_sst._INTO_GRADS, into):
            if g[i] is not None and t is not None:
                g[i] = t.copy_(g[i])
        g.append(None if z is None else into[5].copy_(out.float() * F.silu(z.float())))
    return list(g)


def _check(xz, conv1d_weight, x_proj_weight, delta_proj_weight, A, B, C, checkpoint_lvl, rms):
    for name, t in (("xz", xz), ("conv1d_weight", conv1d_weight), ("x_proj_weight", x_proj_weight),
                    ("delta_proj_weight", delta_proj_weight), ("A", A)):
        if not isinstance(t, torch.Tensor):
            raise SelscanError(f"{name} is a {type(t).__name__}; selscan.torch takes torch tensors",
                               _lib.STATUS_INVALID_ARGUMENT)
    if xz.dim() != 3 or xz.shape[1] % 2:
        raise SelscanError(f"xz: expected (batch, 2*dim, seqlen); got shape {tuple(xz.shape)}",
                           _lib.STATUS_SHAPE_MISMATCH)
    if checkpoint_lvl not in (0, 1):
        raise SelscanError(f"checkpoint_lvl: expected 0 or 1; got {checkpoint_lvl!r}", _lib.STATUS_INVALID_ARGUMENT)
    dm = xz.shape[1] // 2
    if conv1d_weight.numel() % max(dm, 1) or conv1d_weight.shape[0] != dm:
        raise SelscanError(f"conv1d_weight: expected (dim, 1, width) with dim {dm}; got shape "
                           f"{tuple(conv1d_weight.shape)}", _lib.STATUS_SHAPE_MISMATCH)
    ds = A.shape[-1] * (2 if A.is_complex() else 1)
    rank = delta_proj_weight.shape[1] if delta_proj_weight.dim() == 2 else -1
    need = rank + (ds if B is None else 0) + (ds if C is None else 0)
    if (x_proj_weight.dim() != 2 or x_proj_weight.shape[1] != dm or delta_proj_weight.dim() != 2
            or delta_proj_weight.shape[0] != dm or x_proj_weight.shape[0] < need):
        raise SelscanError(f"x_proj_weight / delta_proj_weight: expected (>= {max(need, 0)}, {dm}) and (dim {dm}, "
                           f"dt_rank); got {tuple(x_proj_weight.shape)} and {tuple(delta_proj_weight.shape)}",
                           _lib.STATUS_SHAPE_MISMATCH)
    if A.is_complex() and any(w is not None for w in rms):
        raise SelscanError("b_rms_weight / c_rms_weight / dt_rms_weight: not supported with complex A (mamba_ssm's "
                           "norm reads interleaved Re/Im as states)", _lib.STATUS_INVALID_ARGUMENT)


class _LayerPlan:
    """The fused forward of one call signature (the common case: real A, B and C projected, no norms or
    projection biases, no autocast, no conversions): the conv1d and scan call plans taking xz, x_dbl and the
    weights' own addresses (the views the general path makes sit at fixed byte offsets into them), and the
    layouts the plans were made for; and the backward's configuration per checkpoint level (everything in it but
    the level follows from the signature)."""

    __slots__ = ("conv", "scan", "ws", "dm", "rank", "states", "xdbl_stride", "d_stride", "cfgs")


def _cfg_at(cfg, lvl):
    """A copy of cfg at checkpoint level lvl."""
    c = _Cfg()
    for name in _Cfg.__slots__:
        if hasattr(cfg, name):
            setattr(c, name, getattr(cfg, name))
    c.lvl = lvl
    return c


def _layer_key(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, A, D, delta_bias, softplus):
    """What a _LayerPlan depends on (None where a tensor is absent); raises AttributeError for non-tensors."""
    sig = _tsig
    return (sig(xz), sig(conv1d_weight), sig(conv1d_bias), sig(x_proj_weight), sig(delta_proj_weight), sig(A),
            sig(D), sig(delta_bias), softplus)


def _tsig(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


def _new_layer_plan(cfg, xz, x, cw, conv1d_bias, conv, x_dbl, d, delta, A, Bs, Cs, D, z, delta_bias, out, out_z,
                    states, dev):
    """A _LayerPlan from the general path's first call of a signature (its tensors as the library read them),
    or None where a plan cannot express the call."""
    kd = _lib.DEVICE_CUDA if dev >= 0 else _lib.DEVICE_CPU
    codes = _conv1d._framework(x).describe
    conv_named = [("x", x), ("weight", cw), ("bias", conv1d_bias), ("out", _bdl(conv, xz.shape[0]))]
    conv_named = [(n, t) for n, t in conv_named if t is not None]
    specs = {n: codes(t) for n, t in conv_named}
    if any(c[0] is None for c in specs.values()):
        return None
    flags = {"activation": _lib.ACTIVATION_SILU, "pad_slot_id": -1}
    try:
        cplan = _plan.Plan("conv1d_fwd", specs, [t.data_ptr() for _, t in conv_named], flags, kd, max(dev, 0), 0)
    except SelscanError:
        return None
    # ts of the conv call: (xz, conv1d_weight, conv1d_bias, conv); x and the (dim, width) weight share their
    # tensors' first element.
    lp = _LayerPlan()
    lp.conv = cplan.caller([0, 1, 2, 3] if conv1d_bias is not None else [0, 1, 3], _plan.PTR_TORCH)
    # ts of the scan call: (conv, d, A, x_dbl, x_dbl, D, xz, delta_bias, out, out_z, states)
    base = (conv, d, A, x_dbl, x_dbl, D, xz, delta_bias, out, out_z, states)
    views = (_bdl(conv, xz.shape[0]), delta, A, Bs, Cs, D, z, delta_bias, out, _bdl(out_z, xz.shape[0]), states)
    names = _lib.FWD_INPUTS[:8] + ("out", "out_z", "x")
    named = [(n, v) for n, v in zip(names, views)]
    it, wt = _sst._ITYPES.get(xz.dtype), _sst._WTYPES.get(A.dtype)
    if it is None or wt is None:
        return None
    sspecs = {n: (_sst._want(_sst._KINDS[n], v, it, wt), tuple(v.shape), tuple(v.stride()))
              for n, v in named if v is not None}
    try:
        splan = _plan.Plan("fwd", sspecs, [v.data_ptr() for _, v in named if v is not None],
                           {"delta_softplus": cfg.softplus}, kd, max(dev, 0), 0)
    except SelscanError:
        return None
    present = [i for i, (_, v) in enumerate(named) if v is not None]
    offsets = [views[i].data_ptr() - base[i].data_ptr() for i in present]
    lp.scan, lp.ws = splan.caller(present, _plan.PTR_TORCH, offsets), splan.ws_bytes
    lp.dm, lp.rank, lp.cfgs = cfg.dm, cfg.rank, (_cfg_at(cfg, 0), _cfg_at(cfg, 1))
    lp.states = None if states is None else (tuple(states.shape), states.dtype)
    lp.xdbl_stride, lp.d_stride = x_dbl.stride(), d.stride()
    return lp


def _forward(ctx, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
             out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias, delta_softplus, checkpoint_lvl,
             b_rms_weight, c_rms_weight, dt_rms_weight, b_c_dt_rms_eps):
    """MambaInnerFn's forward; ctx None when no gradient is wanted (nothing saved, no autograd node)."""
    softplus = bool(delta_softplus)
    if (_plan.ENABLED and B is None and C is None and B_proj_bias is None and C_proj_bias is None
            and b_rms_weight is None and c_rms_weight is None and dt_rms_weight is None):
        try:
            key = _layer_key(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, A, D, delta_bias,
                             softplus)
        except AttributeError:
            key = None
        lp = _plan.cache("inner_fwd").get(key) if key is not None else None
        if lp is not None and checkpoint_lvl in (0, 1) and not _autocast_on("cuda" if xz.is_cuda else "cpu"):
            r = _fast_forward(ctx, lp, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                              out_proj_weight, out_proj_bias, A, D, delta_bias, checkpoint_lvl)
            if r is not None:
                return r
    else:
        key = None
    return _general_forward(ctx, key, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                            out_proj_weight, out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias,
                            softplus, checkpoint_lvl, b_rms_weight, c_rms_weight, dt_rms_weight, b_c_dt_rms_eps)


def _fast_forward(ctx, lp, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                  out_proj_bias, A, D, delta_bias, lvl):
    """The forward through a _LayerPlan: the general path's operations without its views, checks and
    conversions (the key guarantees there are none). None where the GEMMs' outputs are not laid out as the
    plan's first call had them (the general path then runs)."""
    bt, L = xz.shape[0], xz.shape[2]
    dm, rank = lp.dm, lp.rank
    dev = xz.get_device()
    stream = _sst._stream(dev)
    conv = xz.new_empty((dm, bt * L))
    if _backends.POISON:
        conv.fill_(float("nan"))
    lp.conv((xz, conv1d_weight, conv1d_bias, conv), stream, 0)
    x_dbl = torch.matmul(x_proj_weight, conv)  # (K, batch*L)
    d = torch.matmul(delta_proj_weight, x_dbl[:rank])
    if x_dbl.stride() != lp.xdbl_stride or d.stride() != lp.d_stride:
        return None
    out = xz.new_empty((bt, dm, L))
    out_z = xz.new_empty((dm, bt * L))
    states = None if lp.states is None else xz.new_empty(lp.states[0], dtype=lp.states[1])
    if _backends.POISON:
        for t in (out, out_z, states):
            if t is not None:
                t.fill_(float("nan"))
    if lp.ws:
        ws = xz.new_empty(lp.ws, dtype=torch.uint8)
        lp.scan((conv, d, A, x_dbl, x_dbl, D, xz, delta_bias, out, out_z, states), stream, ws.data_ptr())
    else:
        lp.scan((conv, d, A, x_dbl, x_dbl, D, xz, delta_bias, out, out_z, states), stream, 0)
    adt = xz.dtype
    y = F.linear(out_z.t(), _cast(out_proj_weight, adt), _cast(out_proj_bias, adt))
    y = y.view(bt, L, y.shape[-1])
    if ctx is not None:
        keep = (conv, _bdl(d, bt)) if lvl == 0 else (None, None)
        ctx.save_for_backward(xz, conv1d_weight.reshape(dm, -1), conv1d_bias, x_dbl, x_proj_weight,
                              delta_proj_weight, out_proj_weight, out_proj_bias, A, None, None, D, delta_bias, None,
                              None, None, None, None, states, out, *keep)
        ctx.cfg = lp.cfgs[lvl]  # the backward only reads it
    return y


def _general_forward(ctx, key, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                     out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias, softplus, checkpoint_lvl,
                     b_rms_weight, c_rms_weight, dt_rms_weight, b_c_dt_rms_eps):
    _check(xz, conv1d_weight, x_proj_weight, delta_proj_weight, A, B, C, checkpoint_lvl,
           (b_rms_weight, c_rms_weight, dt_rms_weight))
    cfg = _Cfg()
    cfg.dev = xz.device.type
    # Under autocast the matmuls run in its dtype (as upstream casts the weights); explicit casts below, so
    # autocast is off inside and the backward computes in the same dtypes without it.
    cfg.mdt = _autocast_dtype(cfg.dev) or xz.dtype
    given_xz = xz
    if xz.stride(-1) != 1:
        xz = xz.contiguous()
    cfg.adt, cfg.dm = xz.dtype, xz.shape[1] // 2
    cfg.rank, cfg.cplx = delta_proj_weight.shape[1], A.is_complex()
    cfg.ds = A.shape[-1] * (2 if cfg.cplx else 1)
    cfg.eps, cfg.softplus, cfg.lvl = float(b_c_dt_rms_eps), softplus, checkpoint_lvl
    cfg.given_B, cfg.given_C = B is not None, C is not None
    cfg.w_shape = conv1d_weight.shape
    bt = xz.shape[0]
    with _no_autocast(cfg.dev):
        # conv, x_dbl and delta live as (rows, batch*L) matrices, as upstream keeps them: each projection is
        # one GEMM with no layout copy, and the scan reads their (batch, rows, L) views (unit stride in L).
        x, z = xz[:, :cfg.dm], xz[:, cfg.dm:]
        cw = conv1d_weight.reshape(cfg.dm, -1)
        conv, conv_ins = _conv_fwd(x, cw, conv1d_bias, True)
        xw = _cast(x_proj_weight, cfg.mdt)
        x_dbl = torch.matmul(xw, _cast(conv, cfg.mdt))  # (K, batch*L)
        dtw = _cast(delta_proj_weight, cfg.mdt)
        delta, _ = _delta(cfg, x_dbl, dtw, dt_rms_weight, bt)
        x_dbl3 = _bdl(x_dbl, bt)
        Bs, _ = _bc(cfg, x_dbl3, B, B_proj_bias, b_rms_weight, True)
        Cs, _ = _bc(cfg, x_dbl3, C, C_proj_bias, c_rms_weight, False)
        out_z = xz.new_empty((cfg.dm, conv.shape[1]))  # out_proj's operand: (batch*L, dim) transposed
        Df, dbf = _cast(D, torch.float32), _cast(delta_bias, torch.float32)
        u = _bdl(conv, bt)
        out, _, states, scan_ins = _scan_fwd(u, delta, A, Bs, Cs, Df, z, dbf, cfg.softplus, _bdl(out_z, bt))
        y = F.linear(_cast(out_z, cfg.mdt).t(), _cast(out_proj_weight, cfg.mdt), _cast(out_proj_bias, cfg.mdt))
        y = y.view(bt, -1, y.shape[-1])
    # The first call of a signature that needed no conversion (every tensor reached the library as given or as a
    # view the general path makes) records a _LayerPlan for the later ones.
    if (key is not None and given_xz is xz and cfg.mdt == cfg.adt and not cfg.cplx and xw is x_proj_weight
            and dtw is delta_proj_weight and Df is D and dbf is delta_bias and conv_ins[0] is x and conv_ins[1] is cw
            and conv_ins[2] is conv1d_bias and cw.data_ptr() == conv1d_weight.data_ptr() and scan_ins is not None
            and all(a is b for a, b in zip(scan_ins, (u, delta, A, Bs, Cs, D, z, delta_bias)))
            and delta._base is not None and delta._base.dim() == 2 and delta._base.data_ptr() == delta.data_ptr()
            and xz.device.type in ("cpu", "cuda")):
        _plan.cache("inner_fwd")[key] = _new_layer_plan(
            cfg, xz, x, cw, conv1d_bias, conv, x_dbl, delta._base, delta, A, Bs, Cs, D, z, delta_bias, out, out_z,
            states, xz.get_device())
    if ctx is not None:
        keep = (conv, delta) if checkpoint_lvl == 0 else (None, None)
        ctx.save_for_backward(xz, cw, conv1d_bias, x_dbl, x_proj_weight, delta_proj_weight, out_proj_weight,
                              out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias, b_rms_weight,
                              c_rms_weight, dt_rms_weight, states, out, *keep)
        ctx.cfg = cfg
    return y


class MambaInnerFn(torch.autograd.Function):
    """mamba_ssm's MambaInnerFn: MambaInnerFn.apply(xz, conv1d_weight, conv1d_bias, x_proj_weight,
    delta_proj_weight, out_proj_weight, out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias,
    delta_softplus, checkpoint_lvl, b_rms_weight, c_rms_weight, dt_rms_weight, b_c_dt_rms_eps)."""

    @staticmethod
    def forward(ctx, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                out_proj_bias, A, B=None, C=None, D=None, delta_bias=None, B_proj_bias=None, C_proj_bias=None,
                delta_softplus=True, checkpoint_lvl=1, b_rms_weight=None, c_rms_weight=None, dt_rms_weight=None,
                b_c_dt_rms_eps=1e-6):
        return _forward(ctx, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                        out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias, delta_softplus,
                        checkpoint_lvl, b_rms_weight, c_rms_weight, dt_rms_weight, b_c_dt_rms_eps)

    @staticmethod
    def backward(ctx, dout):
        (xz, cw, conv1d_bias, x_dbl, x_proj_weight, delta_proj_weight, out_proj_weight, out_proj_bias, A, B, C, D,
         delta_bias, B_proj_bias, C_proj_bias, b_rms_weight, c_rms_weight, dt_rms_weight, states, out, conv,
         delta) = ctx.saved_tensors
        cfg = ctx.cfg
        need = ctx.needs_input_grad
        det = torch.are_deterministic_algorithms_enabled()
        mdt, adt, dm, r = cfg.mdt, cfg.adt, cfg.dm, cfg.rank
        bt = xz.shape[0]
        with _no_autocast(cfg.dev):
            x, z = xz[:, :dm], xz[:, dm:]
            xw, dtw, ow = (_cast(w, mdt) for w in (x_proj_weight, delta_proj_weight, out_proj_weight))
            if conv is None:
                conv = _conv_fwd(x, cw, conv1d_bias)
                delta, _ = _delta(cfg, x_dbl, dtw, dt_rms_weight, bt)
            x_dbl3 = _bdl(x_dbl, bt)
            Bs, B_pre = _bc(cfg, x_dbl3, B, B_proj_bias, b_rms_weight, True)
            Cs, C_pre = _bc(cfg, x_dbl3, C, C_proj_bias, c_rms_weight, False)
            dout2 = _cast(dout, mdt).reshape(-1, dout.shape[-1])  # (batch*L, d_model)

            # The scan's input gradient, as a (dim, batch*L) GEMM output viewed (batch, dim, L).
            dy = _bdl(torch.matmul(ow.t(), dout2.t()), bt).to(adt)
            # The scan writes dz straight into dxz, du and ddelta as (dim, batch*L) matrices (the GEMMs below
            # read them without a copy) and recomputes out_z = out * silu(z) for out_proj's weight gradient.
            dxz = torch.empty_like(xz)
            du2, dd2, oz2 = (xz.new_empty((dm, dy.shape[0] * dy.shape[2])) for _ in range(3))
            # dB / dC of projected B / C are written straight into their rows of x_dbl's gradient where nothing
            # (norm, complex interleaving, a dtype cast) stands between the scan's gradient and those rows.
            dx_dbl = torch.zeros_like(x_dbl)  # (K, batch*L)
            dx_dbl3 = _bdl(dx_dbl, bt)
            direct = not cfg.cplx and mdt == adt
            put_b = (dx_dbl3[:, r:r + cfg.ds].unsqueeze(1) if direct and B is None and b_rms_weight is None
                     else None)
            lo_c = x_dbl.shape[0] - cfg.ds
            put_c = (dx_dbl3[:, lo_c:lo_c + cfg.ds].unsqueeze(1) if direct and C is None and c_rms_weight is None
                     else None)
            du, ddelta, dA, dB, dC, dD, dz, ddb, _ = _scan_bwd(
                dy, _bdl(conv, bt), delta, A, Bs, Cs, _cast(D, torch.float32), z, _cast(delta_bias, torch.float32),
                states, out, cfg.softplus, det,
                (_bdl(du2, bt), _bdl(dd2, bt), dxz[:, dm:], put_b, put_c, _bdl(oz2, bt)))
            del dy, delta, Bs, Cs, dz, du, ddelta
            d_ow = torch.matmul(dout2.t(), _cast(oz2, mdt).t()) if need[5] else None
            del oz2
            d_ob = dout2.sum(0) if out_proj_bias is not None and need[6] else None
            del dout2

            if dt_rms_weight is not None:
                _, d_pre = _delta(cfg, x_dbl, dtw, dt_rms_weight, bt)
                gd, d_dtrms = _rms_bwd(_bdl(dd2, bt), d_pre, dt_rms_weight, cfg.eps, 1)
                del d_pre
                gd = _mat(gd.to(mdt))
            else:
                gd, d_dtrms = _cast(dd2, mdt), None
            del dd2
            d_dtw = torch.matmul(gd, x_dbl[:r].t()) if need[4] else None
            if dx_dbl.dtype == gd.dtype:
                torch.matmul(dtw.t(), gd, out=dx_dbl[:r])
            else:
                dx_dbl[:r].copy_(dtw.t() @ gd)
            del gd

            grads_bc = []
            for g, pre, given, rms_w, pbias, first, put in (
                    (dB, B_pre, B, b_rms_weight, B_proj_bias, True, put_b),
                    (dC, C_pre, C, c_rms_weight, C_proj_bias, False, put_c)):
                d_rms = d_pbias = d_given = None
                if given is not None:
                    if rms_w is not None:
                        g, d_rms = _rms_bwd(g, pre, rms_w, cfg.eps, -1 if given.dim() == 2 else -2)
                    d_given = _sst._match(g, given)
                else:
                    g = g.squeeze(1)
                    if cfg.cplx:
                        g = _deinterleave(g, cfg.ds)
                    if rms_w is not None:
                        g, d_rms = _rms_bwd(g, pre, rms_w, cfg.eps, 1)
                    if pbias is not None:
                        d_pbias = g.float().sum((0, 2))
                    if put is None:  # else the scan wrote g there
                        lo = r if first else lo_c
                        dx_dbl3[:, lo:lo + cfg.ds] += g.to(mdt)
                grads_bc.append((d_given, d_pbias, d_rms))
            del dB, dC, B_pre, C_pre

            d_xw = torch.matmul(dx_dbl, _cast(conv, mdt).t()) if need[3] else None
            del conv
            if du2.dtype == mdt:
                du2.addmm_(xw.t(), dx_dbl)  # dconv = du + x_proj^T dx_dbl, fused into the GEMM
            else:
                du2.add_(torch.matmul(xw.t(), dx_dbl).to(du2.dtype))
            del dx_dbl
            _, dcw, dcb, _ = _conv1d.conv1d_bwd(_bdl(du2, bt), x, cw, conv1d_bias, None, None, None, True, det,
                                                None, False, dx=dxz[:, :dm])
            del du2

        m = _sst._match
        (dBg, dBpb, dbrms), (dCg, dCpb, dcrms) = grads_bc
        return (dxz, m(dcw, cw).reshape(cfg.w_shape), m(dcb, conv1d_bias), m(d_xw, x_proj_weight),
                m(d_dtw, delta_proj_weight), m(d_ow, out_proj_weight), m(d_ob, out_proj_bias), m(dA, A),
                dBg if need[8] else None, dCg if need[9] else None, m(dD, D) if D is not None else None,
                m(ddb, delta_bias) if delta_bias is not None else None,
                m(dBpb, B_proj_bias) if need[12] else None, m(dCpb, C_proj_bias) if need[13] else None,
                None, None,
                m(dbrms, b_rms_weight) if need[16] else None, m(dcrms, c_rms_weight) if need[17] else None,
                m(d_dtrms, dt_rms_weight) if need[18] else None, None)


def _wants_grad(*ts):
    for t in ts:
        if getattr(t, "requires_grad", False):
            return True
    return False


_inner_apply = _sst.direct_apply(MambaInnerFn)  # MambaInnerFn.apply without Function.apply's Python layer


def mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight, out_proj_bias,
                   A, B=None, C=None, D=None, delta_bias=None, B_proj_bias=None, C_proj_bias=None,
                   delta_softplus=True, checkpoint_lvl=1, b_rms_weight=None, c_rms_weight=None, dt_rms_weight=None,
                   b_c_dt_rms_eps=1e-6):
    """mamba_ssm's mamba_inner_fn: xz (batch, 2*dim, seqlen) (in_proj's output, transposed), conv1d_weight
    (dim, 1, width), conv1d_bias (dim,) or None, x_proj_weight (dt_rank + 2*dstate, dim), delta_proj_weight
    (dim, dt_rank), out_proj_weight (d_model, dim), out_proj_bias or None, A (dim, dstate) float32 or complex64;
    B / C given (not projected): (dim, dstate) or (batch, 1, dstate, seqlen); D, delta_bias (dim,);
    B_proj_bias / C_proj_bias (dstate,); b_rms_weight / c_rms_weight (dstate,), dt_rms_weight (dim,): RMS norms
    (eps b_c_dt_rms_eps) of B, C and delta before the scan. Returns (batch, seqlen, d_model). Differentiable."""
    if not torch.is_grad_enabled() or not _wants_grad(
            xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight, out_proj_bias, A, B, C,
            D, delta_bias, B_proj_bias, C_proj_bias, b_rms_weight, c_rms_weight, dt_rms_weight):
        if not _sst._is_compiling():  # no autograd node to make: the forward alone
            return _forward(None, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                            out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias, delta_softplus,
                            checkpoint_lvl, b_rms_weight, c_rms_weight, dt_rms_weight, b_c_dt_rms_eps)
    return _inner_apply(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                        out_proj_bias, A, B, C, D, delta_bias, B_proj_bias, C_proj_bias, delta_softplus,
                        checkpoint_lvl, b_rms_weight, c_rms_weight, dt_rms_weight, b_c_dt_rms_eps)
