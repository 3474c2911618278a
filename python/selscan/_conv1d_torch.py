"""The causal depthwise convolution on torch tensors: causal-conv1d's causal_conv1d_fn (differentiable) and
causal_conv1d_update, as torch.library ops with fake implementations so torch.compile(fullgraph=True) traces them:

    selscan::causal_conv1d_fwd          functional, differentiable (register_autograd): x, weight, bias, seq_idx,
                                        initial_states, cu_seqlens -> (out, final_states)
    selscan::causal_conv1d_bwd          functional: -> (dx, dweight, dbias, dinitial_states)
    selscan::causal_conv1d_fwd_serving  with a state pool (conv_states, mutated), cache_indices, has_initial_state:
                                        no autograd formula (inference, as vLLM calls it)
    selscan::causal_conv1d_update       the decode update (conv_state mutated)

Absent outputs of the ops are empty tensors (custom-op outputs may not be None). Eager calls skip the dispatcher:
they go through the binding's cached call plans (selscan._conv1d) and, when a gradient is wanted, a
torch.autograd.Function. Nothing synchronises with the host and the backward's workspace comes from torch's
allocator on the current stream, so forward, backward and update can be captured in CUDA graphs. The backward is
deterministic when torch.are_deterministic_algorithms_enabled().
"""

import torch

from . import _conv1d, _lib
from ._lib import SelscanError

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _io_dtype(x):
    """The dtype the library computes x (and out, dx, the states) in: x's, float32 for any other float."""
    return x.dtype if x.dtype in _IO_DTYPES else torch.float32


def _w_dtype(weight, x):
    return weight.dtype if weight.dtype in (torch.float32, _io_dtype(x)) else torch.float32


def _none_to_empty(t, x):
    return x.new_empty((0,)) if t is None else t


def _match(g, t):
    """A gradient in its input's dtype (autograd wants them equal; the library may have computed in float32)."""
    return g if g is None or t is None or g.dtype == t.dtype else g.to(t.dtype)


# ------------------------------------------------------------------------------------------------ op bodies
def _fwd_impl(x, weight, bias, seq_idx, initial_states, cu_seqlens, return_final_states, silu):
    out, fin, _ = _conv1d.conv1d_fwd(x, weight, bias, seq_idx, initial_states, None, return_final_states, silu,
                                     cu_seqlens)
    return out, _none_to_empty(fin, x)


def _bwd_impl(x, weight, bias, seq_idx, initial_states, cu_seqlens, dout, dfinal_states, want_dinitial_states,
              silu, deterministic):
    g = _conv1d.conv1d_bwd(dout, x, weight, bias, seq_idx, initial_states, dfinal_states, silu, deterministic,
                           cu_seqlens, want_dinitial_states)
    return tuple(_none_to_empty(t, x) for t in g)


def _serving_impl(x, weight, bias, seq_idx, initial_states, conv_states, cu_seqlens, cache_indices,
                  has_initial_state, pad_slot_id, return_final_states, silu):
    out, fin, _ = _conv1d.conv1d_fwd(x, weight, bias, seq_idx, initial_states, None, return_final_states, silu,
                                     cu_seqlens, conv_states, cache_indices, has_initial_state, pad_slot_id)
    return out, _none_to_empty(fin, x)


def _update_impl(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, pad_slot_id):
    return _conv1d.conv1d_update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, pad_slot_id)


# ------------------------------------------------------------------------------------------------ fakes
def _fake_final(x, weight, cu_seqlens, want):
    if not want:
        return x.new_empty((0,))
    bt = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dm, w = x.shape[1], weight.shape[1]
    if x.dim() == 3 and x.stride(1) == 1 and x.stride(2) != 1 and dm > 1:  # as _conv1d.final_states_like
        return x.new_empty((bt, w - 1, dm), dtype=_io_dtype(x)).transpose(1, 2)
    return x.new_empty((bt, dm, w - 1), dtype=_io_dtype(x))


def _fake_fwd(x, weight, bias, seq_idx, initial_states, cu_seqlens, return_final_states, silu):
    return torch.empty_like(x, dtype=_io_dtype(x)), _fake_final(x, weight, cu_seqlens, return_final_states)


def _fake_bwd(x, weight, bias, seq_idx, initial_states, cu_seqlens, dout, dfinal_states, want_dinitial_states,
              silu, deterministic):
    wd, xd = _w_dtype(weight, x), _io_dtype(x)
    want_dinit = want_dinitial_states and initial_states is not None
    return (torch.empty_like(x, dtype=xd), torch.empty_like(weight, dtype=wd),
            torch.empty_like(bias, dtype=wd) if bias is not None else x.new_empty((0,)),
            torch.empty_like(initial_states, dtype=xd) if want_dinit else x.new_empty((0,)))


def _fake_serving(x, weight, bias, seq_idx, initial_states, conv_states, cu_seqlens, cache_indices,
                  has_initial_state, pad_slot_id, return_final_states, silu):
    return torch.empty_like(x, dtype=_io_dtype(x)), _fake_final(x, weight, cu_seqlens, return_final_states)


def _fake_update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, pad_slot_id):
    return torch.empty_like(x, dtype=_io_dtype(x))


# ------------------------------------------------------------------------------------------------ autograd
def _setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, initial_states, cu_seqlens, return_final_states, silu = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx, initial_states, cu_seqlens)
    ctx.silu, ctx.want_final = silu, return_final_states
    ctx.want_dinit = initial_states is not None and ctx.needs_input_grad[4]


def _backward(ctx, dout, dfinal):
    x, weight, bias, seq_idx, initial_states, cu_seqlens = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(x)
    dx, dw, db, dinit = torch.ops.selscan.causal_conv1d_bwd(
        x, weight, bias, seq_idx, initial_states, cu_seqlens, dout, dfinal if ctx.want_final else None,
        ctx.want_dinit, ctx.silu, torch.are_deterministic_algorithms_enabled())
    return (_match(dx, x), _match(dw, weight), _match(db, bias) if bias is not None else None, None,
            _match(dinit, initial_states) if ctx.want_dinit else None, None, None, None)


# The ops are defined with torch.library's define / impl / register_fake, as the decode step's: the schema-declared
# mutations and fake implementations without custom_op's per-call Python wrapper.
_SCHEMAS = {
    "causal_conv1d_fwd": ("causal_conv1d_fwd(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, "
                          "Tensor? initial_states, Tensor? cu_seqlens, bool return_final_states, bool silu) "
                          "-> (Tensor, Tensor)", _fwd_impl, _fake_fwd),
    "causal_conv1d_bwd": ("causal_conv1d_bwd(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, "
                          "Tensor? initial_states, Tensor? cu_seqlens, Tensor dout, Tensor? dfinal_states, "
                          "bool want_dinitial_states, bool silu, bool deterministic) "
                          "-> (Tensor, Tensor, Tensor, Tensor)", _bwd_impl, _fake_bwd),
    "causal_conv1d_fwd_serving": ("causal_conv1d_fwd_serving(Tensor x, Tensor weight, Tensor? bias, "
                                  "Tensor? seq_idx, Tensor? initial_states, Tensor(a!)? conv_states, "
                                  "Tensor? cu_seqlens, Tensor? cache_indices, Tensor? has_initial_state, "
                                  "int pad_slot_id, bool return_final_states, bool silu) -> (Tensor, Tensor)",
                                  _serving_impl, _fake_serving),
    "causal_conv1d_update": ("causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
                             "bool silu, Tensor? cache_seqlens, Tensor? conv_state_indices, int pad_slot_id) "
                             "-> Tensor", _update_impl, _fake_update),
}

_register_fake = getattr(torch.library, "register_fake", None)
HAS_OPS = _register_fake is not None and hasattr(torch.library, "register_autograd")
if HAS_OPS:
    _ops = torch.library.Library("selscan", "FRAGMENT")  # kept alive: the registrations live as long as it
    for _name, (_schema, _impl, _fake) in _SCHEMAS.items():
        _ops.define(_schema)
        for _key in ("CPU", "CUDA"):
            _ops.impl(_name, _impl, _key)
        _register_fake(f"selscan::{_name}", _fake, lib=_ops)
    torch.library.register_autograd("selscan::causal_conv1d_fwd", _backward, setup_context=_setup_context,
                                    lib=_ops)
    causal_conv1d_fwd_op = torch.ops.selscan.causal_conv1d_fwd.default
    causal_conv1d_bwd_op = torch.ops.selscan.causal_conv1d_bwd.default
    causal_conv1d_fwd_serving_op = torch.ops.selscan.causal_conv1d_fwd_serving.default
    causal_conv1d_update_op = torch.ops.selscan.causal_conv1d_update.default
else:  # torch < 2.4: plain functions (eager only, no torch.compile integration)
    causal_conv1d_fwd_op, causal_conv1d_bwd_op = _fwd_impl, _bwd_impl
    causal_conv1d_fwd_serving_op, causal_conv1d_update_op = _serving_impl, _update_impl


# ------------------------------------------------------------------------------------------------ eager autograd
class _ConvFn(torch.autograd.Function):
    """Eager causal_conv1d_fn with a gradient: the cached call plans, no dispatcher. final_states_out, when given,
    is written by the library and returned (autograd returns it as a view carrying the gradient, as upstream)."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, silu,
                cu_seqlens):
        out, fin, ins = _conv1d.conv1d_fwd(x, weight, bias, seq_idx, initial_states, final_states_out,
                                           return_final_states, silu, cu_seqlens)
        ctx.save_for_backward(*ins)
        ctx.silu, ctx.want_final = silu, return_final_states
        ctx.want_dinit = initial_states is not None and ctx.needs_input_grad[4]
        ctx.given = (x, weight, bias, initial_states)
        return (out, fin) if return_final_states else out

    @staticmethod
    def backward(ctx, dout, *rest):
        x, weight, bias, seq_idx, initial_states, cu_seqlens = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(x)
        dfinal = rest[0] if ctx.want_final and rest else None
        g = _conv1d.conv1d_bwd(dout, x, weight, bias, seq_idx, initial_states, dfinal, ctx.silu,
                               torch.are_deterministic_algorithms_enabled(), cu_seqlens, ctx.want_dinit)
        dx, dw, db, dinit = (_match(t, like) for t, like in zip(g, ctx.given))
        return dx, dw, db, None, dinit, None, None, None, None


class _ServingConvFn(torch.autograd.Function):
    """Eager causal_conv1d_fn with serving arguments and a gradient. The library's backward has no pool, cache
    indices or has_initial_state, so the call is differentiated as the one it equals: the states the sequences
    started from (gathered from the pool before the forward overwrites it, zero where has_initial_state is 0) as
    initial_states, and the gradient of padding sequences' outputs (constant 0) cut before the backward. The pool
    itself is not differentiable."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, silu, sv):
        cu, pool, idx, has_init, pad = sv
        n = x.shape[0] if cu is None else cu.shape[0] - 1
        keep = None
        h0 = initial_states
        if pool is not None:
            width = weight.shape[1]
            slots = torch.arange(n, device=x.device) if idx is None else idx.long()
            valid = (slots >= 0) & (slots < pool.shape[0])
            keep = valid if has_init is None else valid & (has_init != 0)
            h0 = pool[torch.where(valid, slots, 0)][:, :, pool.shape[2] - (width - 1):]
            h0 = h0 * keep.view(-1, 1, 1).to(h0.dtype)
        elif initial_states is not None and has_init is not None:
            keep = has_init != 0
            h0 = initial_states * keep.view(-1, 1, 1).to(initial_states.dtype)
        out, fin, ins = _conv1d.conv1d_fwd(x, weight, bias, seq_idx, initial_states, final_states_out,
                                           return_final_states, silu, cu, pool, idx, has_init, pad)
        live = None if idx is None else (idx != pad)
        ctx.save_for_backward(ins[0], ins[1], ins[2], ins[3], h0, ins[5], keep, live)
        ctx.silu, ctx.want_final, ctx.n = silu, return_final_states, n
        ctx.want_dinit = initial_states is not None and ctx.needs_input_grad[4]
        ctx.given = (x, weight, bias, initial_states)
        return (out, fin) if return_final_states else out

    @staticmethod
    def backward(ctx, dout, *rest):
        x, weight, bias, seq_idx, h0, cu, keep, live = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(x)
        dfinal = rest[0] if ctx.want_final and rest else None
        if live is not None:  # padding sequences: out is 0 whatever the inputs
            if cu is None:
                dout = dout * live.view(-1, 1, 1).to(dout.dtype)
            else:
                pos = torch.arange(x.shape[2], device=x.device, dtype=cu.dtype)
                seq = torch.searchsorted(cu[1:].contiguous(), pos, right=True).clamp_(max=ctx.n - 1)
                dout = dout * live[seq].view(1, 1, -1).to(dout.dtype)
            if dfinal is not None:
                dfinal = dfinal * live.view(-1, 1, 1).to(dfinal.dtype)
        g = _conv1d.conv1d_bwd(dout, x, weight, bias, seq_idx, h0, dfinal, ctx.silu,
                               torch.are_deterministic_algorithms_enabled(), cu, ctx.want_dinit)
        dx, dw, db, dinit = (_match(t, like) for t, like in zip(g, ctx.given))
        if dinit is not None:
            for m in (keep, live):
                if m is not None:
                    dinit = dinit * m.view(-1, 1, 1).to(dinit.dtype)
        return dx, dw, db, None, dinit, None, None, None, None


# ------------------------------------------------------------------------------------------------ the functions
def _check_x(x):
    if not isinstance(x, torch.Tensor):
        raise SelscanError(f"x is a {type(x).__name__}; selscan.torch takes torch tensors",
                           _lib.STATUS_INVALID_ARGUMENT)


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None, *, cu_seqlens=None, conv_states=None, cache_indices=None,
                     has_initial_state=None, pad_slot_id=-1):
    """causal-conv1d's causal_conv1d_fn on torch tensors (CPU or CUDA), differentiable w.r.t. x, weight, bias and
    initial_states (and final_states' gradient flowing back with return_final_states).

    x: (batch, dim, seqlen), any strides (channel-last included); weight: (dim, width), width 2-4; bias: (dim,);
    seq_idx: (batch, seqlen) int32; initial_states: (batch, dim, width-1); final_states_out: (batch, dim,
    width-1), written to; activation: None, "silu" or "swish". Returns out, or (out, final_states).
    Keyword-only serving arguments (the C ABI's; not in causal-conv1d): cu_seqlens (batch+1,) packs sequences
    along seqlen of a (1, dim, total) x; conv_states (slots, dim, state_len) is a state pool read and written in
    place; cache_indices (batch,) picks each sequence's slot, pad_slot_id marking padding; has_initial_state
    (batch,): 0 starts a sequence from zero. Under torch.compile the pool forms trace without a gradient."""
    _check_x(x)
    silu = _conv1d.silu_flag(activation)
    want = bool(return_final_states)
    serving = conv_states is not None or cache_indices is not None or has_initial_state is not None
    if _is_compiling() and HAS_OPS:
        if serving:  # no autograd formula: traced as the constant it is in inference
            with torch.no_grad():
                out, fin = torch.ops.selscan.causal_conv1d_fwd_serving(
                    x, weight, bias, seq_idx, initial_states, conv_states, cu_seqlens, cache_indices,
                    has_initial_state, int(pad_slot_id), want, silu)
        else:
            out, fin = torch.ops.selscan.causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states, cu_seqlens, want,
                                                           silu)
        if not want:
            return out
        if final_states_out is not None:
            final_states_out.copy_(fin)
            fin = final_states_out
        return out, fin
    # Spelled out rather than any(...) over a tuple: this runs per layer and step.
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)
                                        or (initial_states is not None and initial_states.requires_grad))
    if grad:
        if serving:
            return _ServingConvFn.apply(x, weight, bias, seq_idx, initial_states, want, final_states_out, silu,
                                        (cu_seqlens, conv_states, cache_indices, has_initial_state, pad_slot_id))
        return _ConvFn.apply(x, weight, bias, seq_idx, initial_states, want, final_states_out, silu, cu_seqlens)
    out, fin, _ = _conv1d.conv1d_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, want, silu,
                                     cu_seqlens, conv_states, cache_indices, has_initial_state, pad_slot_id)
    return (out, fin) if want else out


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None, *, pad_slot_id=-1):
    """causal-conv1d's causal_conv1d_update on torch tensors: x (batch, dim) or (batch, dim, seqlen); conv_state
    (slots, dim, state_len) updated in place (a circular buffer with cache_seqlens); conv_state_indices picks each
    sequence's slot, an entry equal to pad_slot_id (keyword-only, default -1) is padding. Returns out like x.
    No gradient (upstream's has none)."""
    _check_x(x)
    silu = _conv1d.silu_flag(activation)
    if _is_compiling() and HAS_OPS:
        with torch.no_grad():  # as in eager (and upstream): the output carries no gradient
            return torch.ops.selscan.causal_conv1d_update(x, conv_state, weight, bias, silu, cache_seqlens,
                                                          conv_state_indices, int(pad_slot_id))
    return _conv1d.conv1d_update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, pad_slot_id)
