"""The causal depthwise convolution (causal-conv1d) over numpy arrays, torch tensors and CuPy arrays.

    out = selscan.causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                                   return_final_states=False, final_states_out=None, activation=None)
    out = selscan.causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                                       conv_state_indices=None)
    dx, dweight, dbias, dinitial_states = selscan.causal_conv1d_bwd(dout, x, weight, ...)

causal-conv1d's signatures and return values (causal_conv1d/causal_conv1d_interface.py); the serving arguments
the C ABI adds (header section 5c) are keyword-only: cu_seqlens, conv_states, cache_indices, has_initial_state,
pad_slot_id. Shapes: x, out (Bt, D, L); weight (D, W), W in {2, 3, 4}; bias (D,); seq_idx (Bt, L) int32;
initial_states / final_states (Bt, D, W-1); the update's x (Bt, D) or (Bt, D, T) and conv_state (S, D, state_len).

Arrays pass to the library with their strides as they are (channel-first, channel-last or any other view): out is
allocated like x (torch.empty_like / numpy.empty_like keep its layout), final_states in x's layout. A call copies
only an argument whose dtype the library does not take (float64 x to float32, int64 seq_idx to int32, a bias of
another dtype than weight's). The in-place arguments (conv_states, conv_state, final_states_out) are never copied.

numpy arrays run on the CPU path, torch tensors where they live (CUDA: torch's current stream of x's device; the
backward's workspace from torch's allocator on that stream), CuPy arrays on their device's current stream. As for
the scan and the decode step, the argument structs of a call signature are built once per thread and later calls
only write the data pointers and the stream (a call plan of _plan.py).
"""

import numpy as np

from . import _backends, _lib, _plan
from ._decode import _framework
from ._lib import SelscanError

# The tensors of each entry point in the order a plan's caller takes them (their field names in the C structs).
FWD_NAMES = ("x", "weight", "bias", "seq_idx", "initial_states", "out", "final_states", "cu_seqlens", "conv_states",
             "cache_indices", "has_initial_state")
BWD_NAMES = ("x", "weight", "bias", "seq_idx", "initial_states", "cu_seqlens", "dout", "dfinal_states", "dx",
             "dweight", "dbias", "dinitial_states")
UPDATE_NAMES = ("x", "weight", "bias", "cache_seqlens", "conv_state_indices", "conv_state", "out")

_IO = ("fp32", "fp16", "bf16")
_IN_PLACE = ("conv_states", "conv_state", "final_states")
_INDEX = ("i32", "i64")


class ActivationError(SelscanError, NotImplementedError):
    """An activation other than None, "silu" or "swish". A SelscanError like every bad argument here, and a
    NotImplementedError like causal-conv1d's, so code written for either catches it."""


def silu_flag(activation):
    """causal-conv1d's activation argument as the library's flag: None -> False, "silu" / "swish" -> True."""
    if activation is None:
        return False
    if isinstance(activation, str) and activation in ("silu", "swish"):
        return True
    raise ActivationError(f"activation: {activation!r} is not one of None, 'silu', 'swish'",
                          _lib.STATUS_INVALID_ARGUMENT)


# ------------------------------------------------------------------------------------------------ frameworks
# The framework objects of the decode step (_decode._Torch / _Xp) describe, adopt and cast arrays; what the
# convolution needs beyond them (layout-keeping allocation, bool index tensors, int32 casts) is here.

def _fw_of(x):
    fw = _framework(x)
    if fw is None:
        x = np.asarray(x)
        fw = _framework(x)
    return fw, x


def _is_torch(fw):
    return hasattr(fw, "torch")


def _describe(fw, a):
    """(dtype code, shape, strides in elements) of an array, code None where the library has no such dtype;
    (None, None, None) for strides it cannot take (negative, or not a multiple of the item size)."""
    code, shape, strides = fw.describe(a)
    if code is None and shape is not None and str(a.dtype) in ("bool", "torch.bool"):
        code = "bool"
    return code, shape, strides


def _code(fw, a):
    return None if a is None else _describe(fw, a)[0]


def _dtype(fw, code):
    if _is_torch(fw):
        t = fw.torch
        return {"fp32": t.float32, "i32": t.int32, "i64": t.int64}[code]
    return {"fp32": np.float32, "i32": np.int32, "i64": np.int64}[code]


def _poison(fw, a):
    if _backends.POISON:
        if _is_torch(fw):
            a.fill_(float("nan"))
        else:
            a.fill(np.nan)
    return a


def _on_device(fw, x):
    """A context for allocating beside x (CuPy allocates on the current device), or None."""
    return fw.xp.cuda.Device(x.device.id) if (not _is_torch(fw) and fw.cuda) else None


def _empty_like(fw, a):
    """An array like a: shape, dtype, device and (for dense arrays) layout."""
    if _is_torch(fw):
        return _poison(fw, fw.torch.empty_like(a))
    dev = _on_device(fw, a)
    if dev is None:
        return _poison(fw, fw.xp.empty_like(a))
    with dev:
        return _poison(fw, fw.xp.empty_like(a))


def final_states_like(fw, x, width, cu_seqlens=None):
    """(sequences, D, W-1) in x's dtype and on its device (sequences: Bt, or cu_seqlens' entries - 1); channel-last
    (stride 1 over D) when x is, as causal-conv1d allocates it, else contiguous."""
    bt = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dm = x.shape[1]
    last = _channel_last(fw, x)
    shape = (bt, width - 1, dm) if last else (bt, dm, width - 1)
    if _is_torch(fw):
        a = x.new_empty(shape)
        return _poison(fw, a.transpose(1, 2) if last else a)
    dev = _on_device(fw, x)
    if dev is None:
        a = fw.xp.empty(shape, dtype=x.dtype)
    else:
        with dev:
            a = fw.xp.empty(shape, dtype=x.dtype)
    return _poison(fw, a.transpose(0, 2, 1) if last else a)


def _channel_last(fw, x):
    if len(x.shape) != 3:
        return False
    s = x.stride() if _is_torch(fw) else tuple(v // x.dtype.itemsize for v in x.strides)
    return s[1] == 1 and s[2] != 1 and x.shape[1] > 1


def _ptr(a):
    if hasattr(a, "data_ptr"):
        return a.data_ptr()
    if hasattr(a, "__array_interface__"):
        return a.__array_interface__["data"][0]
    return int(a.data.ptr)


def _workspace(fw, x, nbytes):
    """nbytes of scratch from the caller's framework on x's device (torch: its allocator, on the current stream),
    and the object that keeps it alive until the call is enqueued."""
    if nbytes == 0:
        return 0, None
    if _is_torch(fw):
        buf = x.new_empty(nbytes, dtype=fw.torch.uint8)
    else:
        with _on_device(fw, x):
            buf = fw.xp.empty(nbytes, dtype=np.uint8)
    return _ptr(buf), buf


# ------------------------------------------------------------------------------------------------ conversions
def _adopt_all(fw, x, named, required):
    for name in required:
        if named.get(name) is None:
            raise SelscanError(f"{name} is required (got None)", _lib.STATUS_INVALID_ARGUMENT)
    for name, a in named.items():
        if a is not None and a is not x:
            named[name] = fw.adopt(name, a, x)


def _convert(fw, named, x_name="x"):
    """The library's dtypes, copying only arguments in a dtype it does not take: x (and with it out, dout, the
    states) float32 unless float16 / bfloat16; weight float32 or x's dtype; bias weight's; seq_idx int32; index
    tensors int32 or int64; has_initial_state bool or int32. In-place and output arguments are left as given."""
    x = named[x_name]
    xc = _code(fw, x)
    if xc not in _IO:
        floating = x.is_floating_point() if _is_torch(fw) else x.dtype.kind == "f"
        if not floating:
            raise SelscanError(f"{x_name}: dtype {x.dtype} cannot be used (expected float32, float16 or bfloat16)",
                               _lib.STATUS_DTYPE_MISMATCH)
        x = named[x_name] = fw.to(x, fw.float32())
        xc = "fp32"
    w = named.get("weight")
    if w is not None and _code(fw, w) not in ("fp32", xc):
        w = named["weight"] = fw.to(w, fw.float32())
    for name in ("initial_states", "dout", "dfinal_states"):
        a = named.get(name)
        if a is not None and _code(fw, a) != xc:
            named[name] = fw.to(a, x.dtype)
    b = named.get("bias")
    if b is not None and w is not None and b.dtype != w.dtype:
        named["bias"] = fw.to(b, w.dtype)
    s = named.get("seq_idx")
    if s is not None and _code(fw, s) != "i32":
        named["seq_idx"] = fw.to(s, _dtype(fw, "i32"))
    for name in ("cu_seqlens", "cache_indices", "cache_seqlens", "conv_state_indices"):
        a = named.get(name)
        if a is not None and _code(fw, a) not in _INDEX:
            named[name] = fw.to(a, _dtype(fw, "i64"))
    h = named.get("has_initial_state")
    if h is not None and _code(fw, h) not in ("bool", "i32"):
        named["has_initial_state"] = h != 0
    return named


# ------------------------------------------------------------------------------------------------ plans
def _run(kind, names, fw, x, named, flags, num_threads, key):
    """The general path's call: the struct of this signature filled once (a plan), run, and cached under `key`
    (None: not cached) so that the next call with that signature writes only pointers."""
    kd, dev = fw.device(x)
    specs, positions = {}, []
    for i, name in enumerate(names):
        a = named.get(name)
        if a is None:
            continue
        code, shape, strides = _describe(fw, a)
        if shape is None:
            raise SelscanError(f"{name}: a negative or fractional stride cannot be passed to the library (make it "
                               "contiguous first)", _lib.STATUS_INVALID_ARGUMENT)
        if code is None:
            why = " (written in place, so never converted)" if name in _IN_PLACE else ""
            raise SelscanError(f"{name}: dtype {a.dtype} cannot be passed to the library{why}; expected float32, "
                               "float16 or bfloat16 (index tensors: int32 or int64)", _lib.STATUS_DTYPE_MISMATCH)
        specs[name] = (code, shape, strides)
        positions.append(i)
    ts = tuple(named.get(n) for n in names)
    plan = _plan.Plan(kind, specs, [_ptr(a) for a in ts if a is not None], flags, kd, dev, num_threads)
    call = plan.caller(positions, fw.ptr_expr)
    entry = (call, plan.ws_bytes)
    if key is not None and _plan.ENABLED:
        _plan.cache(kind)[key] = entry
    _enqueue(entry, fw, x, ts, kd, dev)


def _enqueue(entry, fw, x, ts, kd, dev):
    call, ws_bytes = entry
    ptr, keep = _workspace(fw, x, ws_bytes)  # noqa: F841  (alive until the call is enqueued)
    call(ts, fw.stream(kd, dev), ptr)


def _key(fw, x, flags, arrays):
    """The signature of a call (None when an argument is not of x's framework: the general path reports it)."""
    sig = fw.sig
    try:
        return (type(x), fw.device(x), flags) + tuple(sig(a) for a in arrays)
    except (AttributeError, TypeError):
        return None


# ------------------------------------------------------------------------------------------------ forward
def conv1d_fwd(x, weight, bias=None, seq_idx=None, initial_states=None, final_states_out=None,
               return_final_states=False, silu=False, cu_seqlens=None, conv_states=None, cache_indices=None,
               has_initial_state=None, pad_slot_id=-1, num_threads=0, out=None):
    """-> (out, final_states or None, inputs): inputs are (x, weight, bias, seq_idx, initial_states, cu_seqlens)
    as the library read them (the autograd functions save these for the backward). `out`: where to write the
    output (x's shape and dtype, any layout the library takes), else a new array like x."""
    fw, x = _fw_of(x)
    want = bool(return_final_states)
    fin_given = final_states_out if want else None
    given = (x, weight, bias, seq_idx, initial_states, fin_given, cu_seqlens, conv_states, cache_indices,
             has_initial_state)
    pad = int(pad_slot_id)
    key = _key(fw, x, (bool(silu), want, pad, num_threads), given + (out,)) if _plan.ENABLED else None
    entry = _plan.cache("conv1d_fwd").get(key) if key is not None else None
    given_out = out
    if entry is not None:
        out = _empty_like(fw, x) if given_out is None else given_out
        fin = fin_given if (fin_given is not None or not want) else final_states_like(fw, x, weight.shape[1],
                                                                                         cu_seqlens)
        ts = (x, weight, bias, seq_idx, initial_states, out, fin, cu_seqlens, conv_states, cache_indices,
              has_initial_state)
        kd, dev = key[1]
        _enqueue(entry, fw, x, ts, kd, dev)
        return out, fin, (x, weight, bias, seq_idx, initial_states, cu_seqlens)
    named = dict(zip(("x", "weight", "bias", "seq_idx", "initial_states", "final_states", "cu_seqlens",
                      "conv_states", "cache_indices", "has_initial_state"), given))
    _adopt_all(fw, x, named, ("x", "weight"))
    _convert(fw, named)
    x = named["x"]
    named["out"] = out = _empty_like(fw, x) if given_out is None else given_out
    if want and named["final_states"] is None:
        w = named["weight"]
        if len(w.shape) != 2 or len(x.shape) != 3:
            raise SelscanError(f"weight: expected (dim, width) and x (batch, dim, seqlen); got weight "
                               f"{tuple(w.shape)} and x {tuple(x.shape)}", _lib.STATUS_SHAPE_MISMATCH)
        named["final_states"] = final_states_like(fw, x, int(w.shape[1]), named["cu_seqlens"])
    fin = named["final_states"]
    converted = any(named[n] is not g for n, g in zip(("x", "weight", "bias", "seq_idx", "initial_states"), given))
    converted = converted or any(named[n] is not g for n, g in zip(
        ("cu_seqlens", "conv_states", "cache_indices", "has_initial_state"), given[6:]))
    flags = {"activation": _lib.ACTIVATION_SILU if silu else _lib.ACTIVATION_NONE, "pad_slot_id": pad}
    _run("conv1d_fwd", FWD_NAMES, fw, x, named, flags, num_threads, None if converted else key)
    return out, fin, tuple(named[n] for n in ("x", "weight", "bias", "seq_idx", "initial_states", "cu_seqlens"))


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None, *, cu_seqlens=None, conv_states=None,
                     cache_indices=None, has_initial_state=None, pad_slot_id=-1, num_threads=0):
    """causal-conv1d's causal_conv1d_fn: out (Bt, D, L) like x, or (out, final_states (Bt, D, W-1)) with
    return_final_states (written into final_states_out when given, and that returned).

    Keyword-only, the C ABI's serving forms (docs/python.md, include/selscan/selscan.h section 5c): cu_seqlens
    (Bt+1,) packs Bt sequences along L of a (1, D, total_L) x; conv_states (S, D, state_len), a state pool read
    and written in place (sequence b uses slot cache_indices[b], or b); cache_indices (Bt,) with pad_slot_id
    marking padding sequences (out 0, no slot touched); has_initial_state (Bt,): 0 starts sequence b from zero.
    num_threads: CPU worker threads (0 = all). No gradient: for autograd use selscan.torch.causal_conv1d_fn."""
    silu = silu_flag(activation)
    out, fin, _ = conv1d_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, return_final_states, silu,
                             cu_seqlens, conv_states, cache_indices, has_initial_state, pad_slot_id, num_threads)
    return (out, fin) if return_final_states else out


# ------------------------------------------------------------------------------------------------ backward
def conv1d_bwd(dout, x, weight, bias=None, seq_idx=None, initial_states=None, dfinal_states=None, silu=False,
               deterministic=False, cu_seqlens=None, want_dinitial_states=True, num_threads=0, dx=None):
    """-> (dx, dweight, dbias, dinitial_states), None where absent (dbias without bias; dinitial_states without
    initial_states or when not wanted). Gradients have their inputs' dtypes as the library read them. `dx`:
    where to write x's gradient (x's shape and dtype, any layout the library takes), else a new array like x."""
    fw, x = _fw_of(x)
    want_dinit = bool(want_dinitial_states) and initial_states is not None
    given = (x, weight, bias, seq_idx, initial_states, cu_seqlens, dout, dfinal_states)
    key = (_key(fw, x, (bool(silu), bool(deterministic), want_dinit, num_threads), given + (dx,))
           if _plan.ENABLED else None)
    entry = _plan.cache("conv1d_bwd").get(key) if key is not None else None
    if entry is not None:
        g = (_empty_like(fw, x) if dx is None else dx, _empty_like(fw, weight),
             None if bias is None else _empty_like(fw, bias),
             _empty_like(fw, initial_states) if want_dinit else None)
        kd, dev = key[1]
        _enqueue(entry, fw, x, given + g, kd, dev)
        return g
    named = dict(zip(BWD_NAMES[:8], given))
    _adopt_all(fw, x, named, ("x", "weight", "dout"))
    _convert(fw, named)
    x = named["x"]
    named["dx"] = _empty_like(fw, x) if dx is None else dx
    named["dweight"] = _empty_like(fw, named["weight"])
    named["dbias"] = None if named["bias"] is None else _empty_like(fw, named["bias"])
    named["dinitial_states"] = _empty_like(fw, named["initial_states"]) if want_dinit else None
    converted = any(named[n] is not g for n, g in zip(BWD_NAMES[:8], given))
    flags = {"activation": _lib.ACTIVATION_SILU if silu else _lib.ACTIVATION_NONE,
             "deterministic": 1 if deterministic else 0}
    _run("conv1d_bwd", BWD_NAMES, fw, x, named, flags, num_threads, None if converted else key)
    return named["dx"], named["dweight"], named["dbias"], named["dinitial_states"]


def causal_conv1d_bwd(dout, x, weight, bias=None, seq_idx=None, initial_states=None, dfinal_states=None,
                      activation=None, deterministic=False, return_dinitial_states=True, *, cu_seqlens=None,
                      num_threads=0):
    """Gradients of sum(dout * out) (+ sum(dfinal_states * final_states)) of causal_conv1d_fn(x, weight, bias,
    seq_idx, initial_states, activation=activation, cu_seqlens=cu_seqlens): (dx, dweight, dbias,
    dinitial_states), None for absent inputs, as causal-conv1d's causal_conv1d_bwd_function returns them.
    deterministic: bitwise-reproducible dweight / dbias on CUDA."""
    return conv1d_bwd(dout, x, weight, bias, seq_idx, initial_states, dfinal_states, silu_flag(activation),
                      deterministic, cu_seqlens, return_dinitial_states, num_threads)


# ------------------------------------------------------------------------------------------------ update
def conv1d_update(x, conv_state, weight, bias=None, silu=False, cache_seqlens=None, conv_state_indices=None,
                  pad_slot_id=-1, num_threads=0):
    fw, x = _fw_of(x)
    given = (x, weight, bias, cache_seqlens, conv_state_indices, conv_state)
    pad = int(pad_slot_id)
    key = _key(fw, x, (bool(silu), pad, num_threads), given) if _plan.ENABLED else None
    entry = _plan.cache("conv1d_update").get(key) if key is not None else None
    if entry is not None:
        out = _empty_like(fw, x)
        kd, dev = key[1]
        _enqueue(entry, fw, x, given + (out,), kd, dev)
        return out
    named = dict(zip(UPDATE_NAMES[:6], given))
    _adopt_all(fw, x, named, ("x", "weight", "conv_state"))
    _convert(fw, named)
    x = named["x"]
    named["out"] = out = _empty_like(fw, x)
    converted = any(named[n] is not g for n, g in zip(UPDATE_NAMES[:6], given))
    flags = {"activation": _lib.ACTIVATION_SILU if silu else _lib.ACTIVATION_NONE, "pad_slot_id": pad}
    _run("conv1d_update", UPDATE_NAMES, fw, x, named, flags, num_threads, None if converted else key)
    return out


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None, *, pad_slot_id=-1, num_threads=0):
    """causal-conv1d's causal_conv1d_update: T new tokens per sequence (x (Bt, D) or (Bt, D, T)) advance the
    window of past inputs in conv_state (S, D, state_len), updated in place; returns out like x.
    cache_seqlens (Bt,): conv_state is a circular buffer, sequence b's tokens go to columns
    (cache_seqlens[b] + i) % state_len. conv_state_indices (Bt,): sequence b uses slot idx[b]; an entry equal to
    pad_slot_id (keyword-only, default -1) is padding (out 0, no slot touched)."""
    silu = silu_flag(activation)
    return conv1d_update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, pad_slot_id,
                         num_threads)
