"""The decode step as a torch op: selscan::selective_state_update, which mutates `state` (declared in its schema),
with a fake (meta) implementation, so torch.compile traces it without a graph break and CUDA graphs capture it
(the call reads no device memory on the host: padding entries are recognised on the GPU).

Eager calls of selscan.torch.selective_state_update skip the op dispatcher and go straight to the binding's
cached call plan (selscan._decode); under torch.compile they go through the op. There is no backward
(upstream's decode step has none either).
"""

import torch

from . import _decode, _plan

_IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


_decode._torch_tensor = torch.Tensor
_torch_step = _decode.torch_step
_steps = _decode._tls  # this thread's generated steps, by x's shape


def _impl(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
          dst_state_batch_indices=None):
    return _torch_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                       dst_state_batch_indices, None)


# The op is defined with torch.library's define / impl / register_fake rather than torch.library.custom_op: the
# same schema-declared mutation (`Tensor(a!) state`) and fake implementation for torch.compile, without
# custom_op's per-call Python wrapper, which costs several times the dispatch itself; a decode step's host time
# is the budget (bench/bench_decode_host.py measures it). dst_state_batch_indices comes last with a default, so
# callers of the schema without it keep working.
_SCHEMA = ("selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, "
           "Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? state_batch_indices, int pad_slot_id, "
           "Tensor? dst_state_batch_indices=None) -> Tensor")


def _fake(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
          dst_state_batch_indices=None):
    return x.new_empty(x.shape, dtype=x.dtype if x.dtype in _IO_DTYPES else torch.float32)


_register_fake = getattr(torch.library, "register_fake", None) or getattr(torch.library, "impl_abstract", None)
if _register_fake is not None and hasattr(torch.library, "Library"):
    _ops = torch.library.Library("selscan", "FRAGMENT")  # kept alive: the registrations live as long as it
    _ops.define(_SCHEMA)
    for _key in ("CPU", "CUDA"):
        _ops.impl("selective_state_update", _impl, _key)
    _register_fake("selscan::selective_state_update")(_fake)
    selective_state_update_op = torch.ops.selscan.selective_state_update.default
else:  # torch too old for fake implementations: a plain function (no torch.compile integration)
    selective_state_update_op = _impl


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=-1, dst_state_batch_indices=None, out=None):
    """mamba_ssm.ops.triton.selective_state_update's signature and semantics, on torch tensors (CPU or CUDA):
    updates `state` in place and returns out. Also takes T > 1 tokens per sequence (x (Bt, T, D) or
    (Bt, T, H, P)), a pad_slot_id, dst_state_batch_indices: sequence b's state read from slot
    state_batch_indices[b] and written to slot dst_state_batch_indices[b] (docs/serving.md), and out: a tensor
    of x's shape and dtype written in place (and returned) instead of a new one."""
    if _is_compiling():
        r = torch.ops.selscan.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus),
                                                      state_batch_indices, int(pad_slot_id), dst_state_batch_indices)
        return r if out is None else out.copy_(r)
    # The most recent step of x's shape first, here rather than through torch_step: one call frame less.
    try:
        r = _steps.steps[x.shape][0](state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                     pad_slot_id, dst_state_batch_indices, out, 0) if _plan.ENABLED else None
        if r is not None:
            return r
    except (AttributeError, KeyError, TypeError):  # the thread's first call, a new shape, not a tensor
        pass
    return _torch_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                       dst_state_batch_indices, out)
