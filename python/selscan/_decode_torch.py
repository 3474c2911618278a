"""The decode step as a torch op: selscan::selective_state_update, which mutates `state` (declared in its schema),
with a fake (meta) implementation, so torch.compile traces it without a graph break and CUDA graphs capture it
(the call reads no device memory on the host: padding entries are recognised on the GPU).

Eager calls of selscan.torch.selective_state_update skip the op dispatcher and go straight to the binding's
cached call plan (selscan._decode); under torch.compile they go through the op. There is no backward
(upstream's decode step has none either).

The op library selscan_torch_ops (built with -DSELSCAN_TORCH_OPS=ON; torch >= 2.9) defines selscan::state_update,
the same step in C++ on PyTorch's stable ABI (and selscan::scan_fwd, which selscan.torch's scan forward takes when
this module found the library); load_stable_ops() loads it. Where it loads (beside libselscan, or
$SELSCAN_TORCH_OPS_LIBRARY), eager calls of selective_state_update go through it: on the H200 host an eager step
costs 13.6 µs that way against 24.3 through the binding (bench/bench_decode_host.py, run 60). SELSCAN_TORCH_STABLE=0
at import keeps them on the binding; =1 also warns when the library does not load.
"""

import os
import warnings

import torch

from . import _decode, _lib, _plan

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


# ------------------------------------------------------------------------------------------------ stable-ABI op
STABLE_OPS_LIBRARY = "libselscan_torch_ops.so"
stable_ops_path = None  # the op library loaded, once load_stable_ops() succeeded
stable_ops_error = None  # why it could not be loaded, after a failed load_stable_ops()
stable_ops_active = False  # whether eager selective_state_update calls go through it


def _torch_at_least(major, minor):
    try:
        have = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:  # a version string this does not parse: let the load itself decide
        return True
    return have >= (major, minor)


def load_stable_ops():
    """Loads selscan_torch_ops (selscan::state_update) into torch: $SELSCAN_TORCH_OPS_LIBRARY when set, else the
    file beside the loaded libselscan. Returns torch.ops.selscan.state_update.default, or None (the reason in
    stable_ops_error)."""
    global stable_ops_path, stable_ops_error
    if stable_ops_path is not None:
        return torch.ops.selscan.state_update.default
    if not _torch_at_least(2, 9):
        stable_ops_error = f"torch {torch.__version__} is older than 2.9 (the stable ABI's first version)"
        return None
    path = os.environ.get("SELSCAN_TORCH_OPS_LIBRARY") or os.path.join(os.path.dirname(_lib.library_path),
                                                                        STABLE_OPS_LIBRARY)
    if not os.path.isfile(path):
        stable_ops_error = (f"{path} does not exist (build it with -DSELSCAN_TORCH_OPS=ON, or set "
                            "SELSCAN_TORCH_OPS_LIBRARY)")
        return None
    try:
        torch.ops.load_library(path)
        op = torch.ops.selscan.state_update.default
    except (OSError, RuntimeError, AttributeError) as e:
        stable_ops_error = f"{path} did not load: {e}"
        return None
    stable_ops_path, stable_ops_error = path, None
    return op


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


# The binding's eager call, whichever route selective_state_update takes below (tests of its per-signature steps
# call it directly).
selective_state_update_binding = selective_state_update

_stable_choice = os.environ.get("SELSCAN_TORCH_STABLE", "")
if _stable_choice != "0":
    _stable_op = load_stable_ops()
    if _stable_op is None and _stable_choice == "1":
        warnings.warn(f"SELSCAN_TORCH_STABLE=1: selscan::state_update not used: {stable_ops_error}", stacklevel=2)
    elif _stable_op is not None:
        stable_ops_active = True
        _eager = selective_state_update

        def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                   state_batch_indices=None, pad_slot_id=-1, dst_state_batch_indices=None,
                                   out=None):
            """selective_state_update (above), eager calls through the op library selscan_torch_ops."""
            if _is_compiling():  # the stable op has no fake implementation: the traced op is the Python one
                return _eager(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                              dst_state_batch_indices, out)
            return _stable_op(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                              dst_state_batch_indices, out)
