"""The decode step: selective_state_update over numpy arrays, torch tensors and CuPy arrays.

    out = selscan.selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                         state_batch_indices=None, pad_slot_id=-1,
                                         dst_state_batch_indices=None, out=None)

Upstream mamba_ssm's argument order and meaning (mamba_ssm.ops.triton.selective_state_update); `state` is
updated in place and `out` (x's shape and dtype) is returned. Shapes (docs/serving.md):
    Mamba-1 form: state (S, D, N); x, dt, z (Bt, D) or (Bt, T, D); A (D, N); B, C (Bt, [T,] [G,] N); D, dt_bias (D,)
    heads form:   state (S, H, P, N); x, dt, z (Bt, H, P) or (Bt, T, H, P); A (H, P, N); D, dt_bias (H, P)
Inputs may broadcast with stride 0 (torch's expand). With state_batch_indices (Bt,), sequence b uses state
slot idx[b]; an entry equal to pad_slot_id skips the sequence (its out is 0, no slot touched). With
dst_state_batch_indices (Bt,) as well, sequence b reads slot idx[b] and writes its updated state to slot dst[b]
(vLLM's and FlashInfer's argument; a dst entry equal to pad_slot_id computes out and writes no state).

`out`, when given, is written in place (x's shape and dtype, any strides) and returned.

Per-call host work is kept to what the call needs: the argument struct of a call signature (dtypes, shapes,
strides, devices, flags) is built once per thread, and later calls with that signature write only the data
pointers and the stream into it (a call plan of _plan.py, as the scan uses). torch tensors take torch_step,
which checks a call against its plan in one generated function (below).
"""

import sys
import threading

import numpy as np

from . import _backends, _lib, _plan
from ._lib import SelscanError

_NAMES = _lib.STATE_UPDATE_INPUTS + ("state", "out", "dst_state_batch_indices")
_IO = ("fp32", "fp16", "bf16")


# ------------------------------------------------------------------------------------------------ frameworks
class _Torch:
    """torch tensors, CPU or CUDA (the current stream of x's device)."""

    ptr_expr = _plan.PTR_TORCH

    def __init__(self):
        import torch
        global _torch_tensor
        _torch_tensor = torch.Tensor  # later calls take torch_step
        self.torch = torch
        t = torch
        self.codes = {t.float32: "fp32", t.float16: "fp16", t.bfloat16: "bf16", t.int32: "i32", t.int64: "i64"}
        self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.contiguous = torch.contiguous_format

    def adopt(self, name, a, x):
        if not isinstance(a, self.torch.Tensor):
            raise SelscanError(f"{name} is a {type(a).__name__}, expected a torch.Tensor like x",
                               _lib.STATUS_INVALID_ARGUMENT)
        if a.device != x.device:
            raise SelscanError(f"{name} is on {a.device} but x is on {x.device}", _lib.STATUS_INVALID_ARGUMENT)
        return a

    def sig(self, a):
        return None if a is None else (a.shape, a.stride(), a.dtype, a.get_device())

    def to(self, a, dtype):
        return a.to(dtype)

    def float32(self):
        return self.torch.float32

    def int64(self):
        return self.torch.int64

    def describe(self, a):
        return self.codes.get(a.dtype), tuple(a.shape), tuple(a.stride())

    def device(self, x):
        dev = x.get_device()
        return (_lib.DEVICE_CUDA, dev) if dev >= 0 else (_lib.DEVICE_CPU, 0)

    def stream(self, kind, dev):
        if kind != _lib.DEVICE_CUDA:
            return 0
        if self.raw_stream is not None:
            return self.raw_stream(dev)
        return self.torch.cuda.current_stream(dev).cuda_stream

    def empty(self, x):
        out = self.torch.empty_like(x, memory_format=self.contiguous)  # the cheapest allocation torch offers
        if _backends.POISON:
            out.fill_(float("nan"))
        return out


class _Xp:
    """numpy (CPU path) and CuPy (CUDA, its current stream). bfloat16 arrays (ml_dtypes) are passed as such."""

    def __init__(self, xp, cuda):
        self.xp, self.cuda = xp, cuda
        self.ptr_expr = _plan.PTR_CUPY if cuda else _plan.PTR_NUMPY

    def code(self, dt):
        if dt.name == "bfloat16":  # ml_dtypes
            return "bf16"
        return {np.float32: "fp32", np.float16: "fp16", np.int32: "i32", np.int64: "i64"}.get(dt.type)

    def adopt(self, name, a, x):
        xp = self.xp
        if self.cuda:
            if not isinstance(a, xp.ndarray):
                raise SelscanError(f"{name} is a {type(a).__name__}, expected a CuPy array like x",
                                   _lib.STATUS_INVALID_ARGUMENT)
            if a.device.id != x.device.id:
                raise SelscanError(f"{name} is on CUDA device {a.device.id} but x is on device {x.device.id}",
                                   _lib.STATUS_INVALID_ARGUMENT)
            return a
        if not isinstance(a, np.ndarray):
            if hasattr(a, "__cuda_array_interface__"):
                raise SelscanError(f"{name} is a GPU array but x is a host (numpy) array",
                                   _lib.STATUS_INVALID_ARGUMENT)
            a = np.asarray(a)
        return a

    def sig(self, a):
        if a is None:
            return None
        return (a.shape, a.strides, a.dtype, a.device.id) if self.cuda else (a.shape, a.strides, a.dtype)

    def to(self, a, dtype):
        return a.astype(dtype)

    def float32(self):
        return self.xp.float32

    def int64(self):
        return self.xp.int64

    def describe(self, a):
        item = a.dtype.itemsize
        if any(s < 0 or s % item for s in a.strides):
            return None, None, None
        return self.code(a.dtype), tuple(a.shape), tuple(s // item for s in a.strides)

    def device(self, x):
        return (_lib.DEVICE_CUDA, x.device.id) if self.cuda else (_lib.DEVICE_CPU, 0)

    def stream(self, kind, dev):
        if kind != _lib.DEVICE_CUDA:
            return 0
        with self.xp.cuda.Device(dev):
            return self.xp.cuda.get_current_stream().ptr

    def empty(self, x):
        if self.cuda:
            with self.xp.cuda.Device(x.device.id):
                out = self.xp.empty(x.shape, dtype=x.dtype)
        else:
            out = np.empty(x.shape, dtype=x.dtype)
        if _backends.POISON:
            out.fill(np.nan)
        return out


_fw_cache = {}


def _framework(x):
    t = type(x)
    fw = _fw_cache.get(t)
    if fw is not None:
        return fw
    torch = sys.modules.get("torch")
    cp = sys.modules.get("cupy")
    if torch is not None and isinstance(x, torch.Tensor):
        fw = _Torch()
    elif cp is not None and isinstance(x, cp.ndarray):
        fw = _Xp(cp, True)
    elif isinstance(x, np.ndarray):
        fw = _Xp(np, False)
    else:
        return None
    _fw_cache[t] = fw
    return fw


# ------------------------------------------------------------------------------------------------ the call
def _prepare(fw, state, x, dt, A, B, C, D, z, dt_bias, idx, dst, out):
    """The arguments in dtypes the library takes (copies only where the caller's dtype is not one). The state
    and out are never copied: the library writes them."""
    ins = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
           "state_batch_indices": idx, "state": state, "dst_state_batch_indices": dst, "out": out}
    for name in ("x", "dt", "A", "B", "C", "state"):
        if ins[name] is None:
            raise SelscanError(f"{name} is required (got None)", _lib.STATUS_INVALID_ARGUMENT)
    for name, a in ins.items():
        if a is not None and name != "x":
            ins[name] = fw.adopt(name, a, x)
    xc = fw.describe(x)[0]
    if xc not in _IO:
        x = ins["x"] = fw.to(x, fw.float32())  # e.g. float64 -> float32
        xc = "fp32"
    for name in ("dt", "B", "C", "z"):  # float32 or x's dtype
        a = ins[name]
        if a is not None and fw.describe(a)[0] not in ("fp32", xc):
            ins[name] = fw.to(a, x.dtype)
    for name in ("A", "D", "dt_bias"):  # float32
        a = ins[name]
        if a is not None and fw.describe(a)[0] != "fp32":
            ins[name] = fw.to(a, fw.float32())
    for name in ("state_batch_indices", "dst_state_batch_indices"):
        a = ins[name]
        if a is not None and fw.describe(a)[0] not in ("i32", "i64"):
            ins[name] = fw.to(a, fw.int64())
    sc = fw.describe(ins["state"])[0]
    if sc not in ("fp32", xc):
        raise SelscanError(f"state: dtype {ins['state'].dtype} cannot be used: the state is updated in place, so it "
                           f"must be float32 or x's dtype ({x.dtype})", _lib.STATUS_DTYPE_MISMATCH)
    if out is not None and fw.describe(ins["out"])[0] != xc:
        raise SelscanError(f"out: dtype {ins['out'].dtype} cannot be used: the library writes out in x's dtype "
                           f"({x.dtype})", _lib.STATUS_DTYPE_MISMATCH)
    return ins


def _general(fw, state, x, dt, A, B, C, D, z, dt_bias, softplus, idx, pad, dst, out, num_threads):
    """The first call of a signature (and every call that needs a conversion): conversions, then a call plan.
    Returns (out, the plan, whether the caller's arrays went to the library as given)."""
    kind, dev = fw.device(x)
    given_out = out
    named = _prepare(fw, state, x, dt, A, B, C, D, z, dt_bias, idx, dst, out)
    if out is None:
        named["out"] = out = fw.empty(named["x"])
    specs, positions = {}, []
    for i, name in enumerate(_NAMES):
        a = named.get(name)
        if a is None:
            continue
        code, shape, strides = fw.describe(a)
        if code is None:
            raise SelscanError(f"{name}: a negative or fractional stride cannot be passed to the library (make it "
                               "contiguous first)", _lib.STATUS_INVALID_ARGUMENT)
        specs[name] = (code, shape, strides)
        positions.append(i)
    ins = tuple(named.get(n) for n in _NAMES)
    plan = _plan.Plan("state_update", specs, [0] * len(specs), {"dt_softplus": softplus, "pad_slot_id": pad},
                      kind, dev, num_threads)
    call = plan.caller(positions, fw.ptr_expr)
    call.plan = plan
    call(ins, fw.stream(kind, dev), 0)
    callers = (x, dt, A, B, C, D, z, dt_bias, idx, state, given_out, dst)
    converted = {n: b for n, a, b in zip(_NAMES, ins, callers) if b is not None and a is not b}
    return out, specs, call, converted


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=-1, num_threads=0, dst_state_batch_indices=None,
                           out=None):
    """One decode step (or T tokens per sequence): updates `state` in place and returns out (x's shape and dtype).

    numpy arrays run on the CPU path (num_threads workers, 0 = all); torch tensors where they live (CUDA: the
    current stream of x's device); CuPy arrays on their device's current stream. See the module docstring for
    the shapes and docs/serving.md for the math. dst_state_batch_indices: write sequence b's updated state to
    slot dst[b] instead of the slot it was read from (needs state_batch_indices). out: written in place and
    returned (x's shape and dtype; any strides) instead of a new array.
    """
    if _torch_tensor is not None and isinstance(x, _torch_tensor):
        return torch_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                          dst_state_batch_indices, out, num_threads)
    fw = _framework(x)
    if fw is None:
        x = np.asarray(x)
        fw = _framework(x)
    kind, dev = fw.device(x)
    softplus = 1 if dt_softplus else 0
    pad = int(pad_slot_id)
    dst = dst_state_batch_indices
    given = (x, dt, A, B, C, D, z, dt_bias, state_batch_indices, state)
    sig = fw.sig
    try:
        key = (kind, dev, softplus, pad, num_threads, sig(x), sig(dt), sig(A), sig(B), sig(C), sig(D), sig(z),
               sig(dt_bias), sig(state_batch_indices), sig(state), sig(dst), sig(out))
    except AttributeError:  # an argument of another type: the general path reports it
        key = None
    plans = _plan.cache("state_update")
    call = plans.get(key) if key is not None and _plan.ENABLED else None
    if call is not None:
        if out is None:
            out = fw.empty(x)
        call(given + (out, dst), fw.stream(kind, dev), 0)
        return out
    out, _, call, converted = _general(fw, state, x, dt, A, B, C, D, z, dt_bias, softplus, state_batch_indices,
                                       pad, dst, out, num_threads)
    # Only a signature that needed no conversion is cached: a cached call passes the caller's arrays as they are.
    if key is not None and not converted:
        plans[key] = call
    return out


# ------------------------------------------------------------------------------------------------ torch
# The eager torch call is the one a decode loop makes per layer and token, so its host time is the budget
# (bench/bench_decode_host.py). Per signature a function is generated that compares each tensor's shape, strides,
# dtype and device with the plan's constants (the library reads the tensors through the plan's struct, so these
# must match exactly), then writes the data pointers and the stream into the struct and calls the library. The
# functions of a thread are found by x's shape, most recent first.

_torch_tensor = None  # torch.Tensor once torch is imported (set by _decode_torch; numpy-only use never imports it)
_MAX_STEPS = 8  # per x shape and thread; past it the oldest is dropped
_MAX_SHAPES = 256  # x shapes per thread (as _plan's caches)
_tls = threading.local()

_STEP_ARGS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "softplus", "idx", "pad", "dst", "out",
              "nt")
_STEP_TENSORS = {"x": "x", "dt": "dt", "A": "A", "B": "B", "C": "C", "D": "D", "z": "z", "dt_bias": "dt_bias",
                 "state_batch_indices": "idx", "state": "state", "dst_state_batch_indices": "dst", "out": "out"}


def _torch_step_fn(plan, specs, devnum, softplus, pad, num_threads, alloc_out, torch, converted):
    """The generated per-signature function: returns out, or None when an argument does not match the plan.
    converted: name -> the caller's tensor, for arguments the first call converted (e.g. a model's bf16 D and
    dt_bias to float32): the step checks the caller's tensor and converts it the same way."""
    checks, writes, scope = [f"(not softplus) is {not softplus}", f"nt == {num_threads}"], [], {}
    dtypes = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "i32": "i32", "i64": "i64"}
    for name, arg in _STEP_TENSORS.items():
        if name not in specs:
            if not (name == "out" and alloc_out):
                checks.append(f"{arg} is None")
            continue
        code, shape, strides = specs[name]
        if name == "out" and alloc_out:  # allocated below from x: its layout follows from x's shape
            continue
        given = converted.get(name)
        if given is not None:
            scope[f"from_{arg}"] = given.dtype
            checks.append(f"{arg}.shape == {tuple(given.shape)!r} and {arg}.stride() == {tuple(given.stride())!r} "
                          f"and {arg}.dtype is from_{arg} and {arg}.get_device() == {devnum}")
            writes.append(f"{arg} = {arg}.to({dtypes[code]})")
            continue
        checks.append(f"{arg}.shape == {tuple(shape)!r} and {arg}.stride() == {tuple(strides)!r} and "
                      f"{arg}.dtype is {dtypes[code]} and {arg}.get_device() == {devnum}")
    if "state_batch_indices" in specs:
        checks.append(f"pad == {pad}")
    if alloc_out:
        checks.append("out is None")
        writes += ["out = empty_like(x, memory_format=contiguous)", "if backends.POISON:",
                   "    out.fill_(nan)"]
    for slot, name in zip(plan.slots, specs):
        writes.append(f"q[{slot}] = {_STEP_TENSORS[name]}.data_ptr()")
    if devnum >= 0:
        writes.append(f"eq[{_plan._EX_STREAM}] = raw_stream({devnum})")
    src = (f"def step({', '.join(_STEP_ARGS)}):\n"
           f"    if not ({' and '.join(checks)}):\n        return None\n"
           + "".join(f"    {w}\n" for w in writes)
           + "    status = fn(a, e)\n    if status:\n        fail(status)\n    return out\n")
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda dev: torch.cuda.current_stream(dev).cuda_stream)
    scope.update({"q": plan.q, "eq": plan.eq, "fn": plan.fn, "a": plan.a_addr, "e": plan.e_addr, "plan": plan,
             "fail": plan._fail, "empty_like": torch.empty_like, "contiguous": torch.contiguous_format,
             "backends": _backends, "nan": float("nan"), "raw_stream": raw_stream,
             "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32,
             "i64": torch.int64})
    exec(compile(src, "<selscan decode step>", "exec"), scope)
    step = scope["step"]
    step.plan = plan
    return step


def _thread_steps():
    """This thread's generated steps by x's shape (bounded: a stream of new shapes starts it over)."""
    steps = _tls.__dict__.get("steps")
    if steps is None or len(steps) > _MAX_SHAPES:
        steps = _tls.steps = {}
    return steps


def torch_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, dst, out, num_threads=0):
    """selective_state_update on torch tensors (see selective_state_update)."""
    try:
        steps = _tls.steps.get(x.shape)
        if steps is not None and _plan.ENABLED:
            r = steps[0](state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, dst, out, num_threads)
            if r is not None:
                return r
            for i in range(1, len(steps)):
                r = steps[i](state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, dst, out,
                             num_threads)
                if r is not None:
                    steps.insert(0, steps.pop(i))  # most recent first
                    return r
    except (AttributeError, TypeError):  # a thread's first call, or an argument that is not a tensor
        pass
    fw = _framework(x)
    softplus = 1 if dt_softplus else 0
    pad = int(pad_slot_id)
    r, specs, call, converted = _general(fw, state, x, dt, A, B, C, D, z, dt_bias, softplus, idx, pad, dst, out,
                                         num_threads)
    # A conversion the step can repeat (not of x: out's layout follows from it) keeps the signature cached.
    if "x" not in converted and _plan.ENABLED:
        step = _torch_step_fn(call.plan, specs, x.get_device(), softplus, pad, num_threads, out is None, fw.torch,
                              converted)
        steps = _thread_steps().setdefault(x.shape, [])
        steps.insert(0, step)
        del steps[_MAX_STEPS:]
    return r
