"""selscan: Python binding of libselscan, the Mamba selective scan (S6) with a plain C ABI.

    import selscan
    out = selscan.selective_scan_fn(u, delta, A, B, C, D, z=z, delta_bias=bias, delta_softplus=True)
    grads = selscan.selective_scan_bwd(dout, u, delta, A, B, C, D, z=z, delta_bias=bias, delta_softplus=True)

numpy arrays run on the CPU path. torch tensors (CPU or CUDA), CuPy arrays and other GPU arrays exposing
__cuda_array_interface__ / __dlpack__ run where they live (CUDA: on the framework's current stream), with
outputs allocated by that framework. For autograd use `from selscan.torch import selective_scan_fn`.
The library is found through $SELSCAN_LIBRARY, else beside this package, else under <repo>/build/*/.
"""

import ctypes

import sys

import numpy as np

from . import _backends, _lib, _plan
from ._backends import backend_for
from ._core import Serving, prepare, run_bwd, run_fwd, user_grad
from ._lib import SelscanError

__all__ = [
    "SelscanError", "selective_scan_fn", "selective_scan_bwd", "version", "build_info", "cuda_device_count",
    "check_device", "library_path", "__version__",
]

library_path = _lib.library_path
__version__ = _lib.lib.selscan_version_string().decode()


def version():
    """The loaded library's version string, e.g. "0.4.0"."""
    return __version__


def build_info():
    """One line from the library: version, CUDA toolkit, SASS/PTX targets carried."""
    return _lib.lib.selscan_build_info().decode()


def cuda_device_count():
    n = ctypes.c_int32(0)
    _lib.call("selscan_cuda_device_count", ctypes.byref(n))
    return int(n.value)


def check_device(device_index=0):
    """Raises SelscanError (NO_DEVICE, ARCH_MISMATCH, CUDA_NOT_BUILT) unless this build can run on the device."""
    _lib.call("selscan_check_device", int(device_index))


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, initial_state=None, itype=None, num_threads=0, *, cu_seqlens=None,
                      ssm_states=None, cache_indices=None, has_initial_state=None, pad_slot_id=-1,
                      block_table=None, context_lens=None, state_block_size=0):
    """Forward selective scan with upstream mamba_ssm's shapes.

    u, delta, z: (Bt, D, L). A: (D, N) float32 or complex64. B, C: (D, N) weights (A's dtype) or per-token
    (Bt, N, L) / (Bt, G, N, L) (complex A: real (…, 2L) Re/Im interleaved, or complex (…, L)).
    D, delta_bias: (D,). initial_state: (Bt, D, N) in A's dtype (the state before position 0).
    itype: None infers from u (float16 -> fp16, float32/float64 -> fp32); 'fp32' | 'fp16' | 'bf16' converts the
    input-dtype tensors first. bf16 results come back as float32 arrays holding bf16 values (numpy/CuPy).
    Returns out * silu(z) if z is given else out; with return_last_state, (that, last_state (Bt, D, N)).
    num_threads: CPU worker threads (0 = all).
    Serving (docs/serving.md): cu_seqlens (Bt+1,) int32/int64 packs Bt sequences along L (u, delta, z: (1, D,
    total_len); B, C: (1, G, N, total_len)); ssm_states (S, D, N) in A's dtype is a state pool read and written
    in place (each sequence starts from its slot, cache_indices (Bt,) picking it, and ends there);
    has_initial_state (Bt,) bool/int32 starts a sequence from zero where 0; an index equal to pad_slot_id marks
    a padding sequence (zero output, no slot touched). initial_state and last_state are then per sequence.
    Block-wise state caching (docs/serving.md): state_block_size K > 0 with block_table (Bt, M) int32/int64 (slot
    of each K-token block of each sequence, instead of cache_indices) and context_lens (Bt,) (tokens before this
    call) writes the state at every block end into that block's slot of ssm_states.
    """
    if not (cu_seqlens is None and ssm_states is None and cache_indices is None and has_initial_state is None
            and block_table is None and context_lens is None and not state_block_size):
        be, u = backend_for(u)
        p = prepare(be, u, delta, A, B, C, D, z, delta_bias, initial_state, itype)
        sv = Serving(be, cu_seqlens, ssm_states, cache_indices, has_initial_state, pad_slot_id, block_table,
                     context_lens, state_block_size)
        r = run_fwd(p, delta_softplus, want_last=bool(return_last_state), num_threads=num_threads, serving=sv)
        y = be.to_user(r["out_z"] if z is not None else r["out"], p.it)
        return (y, r["last_state"]) if return_last_state else y
    if itype is None:
        r = _fast_fwd(u, delta, A, B, C, D, z, delta_bias, initial_state, bool(delta_softplus),
                      bool(return_last_state), num_threads)
        if r is not None:
            return r
    be, u = backend_for(u)
    p = prepare(be, u, delta, A, B, C, D, z, delta_bias, initial_state, itype)
    r = run_fwd(p, delta_softplus, want_x=False, want_last=bool(return_last_state), num_threads=num_threads)
    y = be.to_user(r["out_z"] if z is not None else r["out"], p.it)
    if return_last_state:
        return y, r["last_state"]
    return y


def selective_scan_bwd(dout, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       initial_state=None, itype=None, deterministic=False, num_threads=0, *, cu_seqlens=None,
                       cache_indices=None, has_initial_state=None, pad_slot_id=-1):
    """Gradients of sum(dout * selective_scan_fn(...)) w.r.t. every input (the forward is run internally).

    dout is the gradient of out * silu(z) when z is given, else of out. Returns a dict with keys du, ddelta,
    dA, dB, dC, dD, dz, ddelta_bias (and dinitial_state when initial_state is given); keys of absent inputs map
    to None. Each gradient has the shape of its input (3-D B/C stay 3-D); complex gradients follow PyTorch's
    convention dL/dRe + i dL/dIm. deterministic: bitwise-reproducible reductions on CUDA.
    Serving calls take the forward's cu_seqlens / cache_indices / has_initial_state / pad_slot_id; a call that
    used a state pool passes the states its sequences started from as initial_state (gathered before the forward
    overwrote the slots); dinitial_state is then per sequence (0 where a sequence started from zero).
    """
    be, u = backend_for(u)
    p = prepare(be, u, delta, A, B, C, D, z, delta_bias, initial_state, itype)
    sv = None
    if not (cu_seqlens is None and cache_indices is None and has_initial_state is None):
        sv = Serving(be, cu_seqlens, None, cache_indices, has_initial_state, pad_slot_id)
    g = run_bwd(p, dout, delta_softplus, deterministic=deterministic, num_threads=num_threads, serving=sv)
    res = {k: user_grad(p, k, g[k]) for k in ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")}
    if initial_state is not None:
        res["dinitial_state"] = g["dh0"]
    return res


# ------------------------------------------------------------------------------------------- fast path
# numpy and CuPy arrays already in the library's dtypes and layouts skip prepare()/run_fwd(): the call plan of
# their signature (_plan.py) is reused and only pointers are written. Anything else takes the general path.

_NP_CODES = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16", np.dtype(np.complex64): "c64"}
_FWD_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")


def _sig(a):
    return None if a is None else (a.shape, a.strides, a.dtype)


def _np_ptr(a):
    return a.__array_interface__["data"][0]


def _cp_ptr(a):
    return a.data.ptr


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _fwd_layout(ins, want_last):
    """(specs of the inputs, the outputs to allocate) of a forward signature, or None when the arrays need
    the general path's conversions (other dtypes, negative or odd strides, a strided last dimension)."""
    u, delta, A, B, C, D, z, bias, h0 = ins
    it, wt = _NP_CODES.get(u.dtype), _NP_CODES.get(A.dtype)
    if it not in ("fp32", "fp16") or wt not in ("fp32", "c64"):
        return None
    want = {"u": it, "delta": it, "z": it, "A": wt, "D": "fp32", "delta_bias": "fp32", "h0": wt}
    for name, a in (("B", B), ("C", C)):
        want[name] = it if a.ndim >= 3 else wt
    specs = {}
    for name, a in zip(_FWD_NAMES, ins):
        if a is None:
            continue
        item = a.dtype.itemsize
        if _NP_CODES.get(a.dtype) != want[name] or any(s < 0 or s % item for s in a.strides):
            return None
        if name in ("u", "delta", "z", "B", "C") and a.ndim >= 3 and a.shape[-1] > 1 and a.strides[-1] != item:
            return None
        specs[name] = (want[name], a.shape, tuple(s // item for s in a.strides))
    outs = [("out", u.shape, u.dtype)]
    if z is not None:
        outs.append(("out_z", u.shape, u.dtype))
    if want_last:
        outs.append(("last_state", (u.shape[0], u.shape[1], A.shape[-1]), A.dtype))
    for name, shape, dt in outs:
        specs[name] = (_NP_CODES[dt], shape, _contiguous_strides(shape))
    return specs, tuple((shape, dt) for _, shape, dt in outs)


def _fast_fwd(u, delta, A, B, C, D, z, bias, h0, softplus, want_last, num_threads):
    if not _plan.ENABLED:
        return None
    tu = type(u)
    if tu is np.ndarray:
        device_kind, device_index, ptr, xp = _lib.DEVICE_CPU, -1, _np_ptr, np  # -1: no plan shared with CuPy's
    else:
        cp = sys.modules.get("cupy")
        if cp is None or tu is not cp.ndarray:
            return None
        device_index = u.device.id
        if device_index != cp.cuda.runtime.getDevice():
            return None  # outputs and stream would belong to another device: the general path switches
        device_kind, ptr, xp = _lib.DEVICE_CUDA, _cp_ptr, cp
    ins = (u, delta, A, B, C, D, z, bias, h0)
    for i, a in enumerate(ins):
        if type(a) is not tu and (a is not None or i < 5):
            return None
    key = (device_index, softplus, want_last, num_threads, _sig(u), _sig(delta), _sig(A), _sig(B), _sig(C),
           _sig(D), _sig(z), _sig(bias), _sig(h0))
    plans = _plan.cache("xp_fwd")
    plan = plans.get(key, False)
    if plan is None:
        return None
    layout = None
    if plan is False:
        layout = _fwd_layout(ins, want_last)
        if layout is None:
            plans[key] = None
            return None
    outs = [xp.empty(shape, dt) for shape, dt in (layout[1] if plan is False else plan.info[0])]
    if _backends.POISON:
        for o in outs:
            o.fill(np.nan)
    ts = ins + tuple(outs)
    if plan is False:
        try:
            plan = _plan.Plan("fwd", layout[0], [ptr(a) for a in ts if a is not None], {"delta_softplus": softplus},
                              device_kind, max(device_index, 0), num_threads)
        except SelscanError:
            plans[key] = None
            return None  # the general path reports the same error in the caller's terms
        plan.info = (layout[1], plan.caller([i for i, a in enumerate(ts) if a is not None],
                                            _plan.PTR_NUMPY if xp is np else _plan.PTR_CUPY))
        plans[key] = plan
    stream = cp.cuda.get_current_stream().ptr if device_kind == _lib.DEVICE_CUDA else 0
    if plan.ws_bytes:
        ws = xp.empty(plan.ws_bytes, np.uint8)
        plan.info[1](ts, stream, ptr(ws))
    else:
        plan.info[1](ts, stream, 0)
    y = outs[1] if z is not None else outs[0]
    return (y, outs[-1]) if want_last else y


# ------------------------------------------------------------------------------------------- decode step
# selscan.selective_state_update (python/selscan/_decode.py): numpy, torch and CuPy.
from ._decode import selective_state_update  # noqa: E402

__all__.append("selective_state_update")


# ------------------------------------------------------------------------------------------- causal conv1d
# selscan.causal_conv1d_fn / causal_conv1d_update / causal_conv1d_bwd (python/selscan/_conv1d.py): numpy, torch
# and CuPy; for autograd use selscan.torch.causal_conv1d_fn.
from ._conv1d import causal_conv1d_bwd, causal_conv1d_fn, causal_conv1d_update  # noqa: E402

__all__ += ["causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_bwd"]
