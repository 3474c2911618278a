"""Call plans: the per-call host work of the binding, done once per call signature.

A signature is everything the library checks except addresses: each tensor's dtype, shape and strides, the
flags, the device. The first call with a signature fills the argument and exec structs field by field and asks
for the workspace size; every later call with it only writes the data pointers, the stream and the workspace
into those structs (uint64 stores through a memoryview) and calls the library. Per-call host time is what
decode-sized and per-layer calls pay, so it matters as much as the kernels there (docs/python.md).

Plans live in per-thread caches (a plan's structs are patched in place, so two threads must not share one),
bounded so that a stream of new shapes cannot grow them without limit. The library still validates every call:
a plan only saves the binding's own work.
"""

import ctypes
import threading

from . import _lib

# Test hook: False sends every call through the general path (the tests compare the two).
ENABLED = True

_MAX_PLANS = 256  # per thread and kind; past it the cache starts over (a workload uses a handful of shapes)


def _raw(name):
    # A second handle on the entry point taking plain addresses: no per-call ctypes argument conversion.
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    return proto(ctypes.cast(getattr(_lib.lib, name), ctypes.c_void_p).value)


# kind -> (new argument struct, entry point, its workspace query or None when the call needs no workspace)
_KINDS = {
    "fwd": (_lib.new_fwd_args, "selscan_fwd", "selscan_fwd_workspace_size"),
    "bwd": (_lib.new_bwd_args, "selscan_bwd", "selscan_bwd_workspace_size"),
    "state_update": (_lib.new_state_update_args, "selscan_state_update", None),
    "conv1d_fwd": (_lib.new_conv1d_fwd_args, "selscan_conv1d_fwd", None),
    "conv1d_bwd": (_lib.new_conv1d_bwd_args, "selscan_conv1d_bwd", "selscan_conv1d_bwd_workspace_size"),
    "conv1d_update": (_lib.new_conv1d_update_args, "selscan_conv1d_update", None),
}
_FNS = {}  # entry point name -> its raw handle, made at first use (an older library may lack a newer entry)


def _fn(name):
    fn = _FNS.get(name)
    if fn is None:
        if not hasattr(_lib.lib, name):
            raise _lib.SelscanError(f"{_lib.library_path} has no {name} (a libselscan older than this binding)",
                                    _lib.STATUS_INVALID_ARGUMENT, name)
        fn = _FNS[name] = _raw(name)
    return fn

_EX_STREAM = _lib.Exec.stream.offset // 8
_EX_WS = _lib.Exec.workspace.offset // 8
_EX_WS_BYTES = _lib.Exec.workspace_bytes.offset // 8


def _u64(struct):
    return memoryview(struct).cast("B").cast("Q")


class Plan:
    """One signature's structs. `slots` are the uint64 indices of the present tensors' data pointers, in the
    order of `specs`; `ws_bytes` the workspace the library asked for; `info` whatever the caller needs to
    allocate outputs for this signature."""

    __slots__ = ("args", "ex", "q", "eq", "slots", "a_addr", "e_addr", "ws_bytes", "fn", "fn_name", "info")

    def __init__(self, kind, specs, ptrs, flags, device_kind, device_index, num_threads):
        """specs: name -> (dtype code, shape, strides in elements) for each present tensor, in the order the
        pointers are given per call; ptrs: the first call's pointers (the workspace query validates them)."""
        new_args, fn_name, ws_query = _KINDS[kind]
        args = new_args()
        for (name, (code, shape, strides)), ptr in zip(specs.items(), ptrs):
            _lib.set_tensor(getattr(args, name), ptr, _lib.DTYPE_CODES[code], shape, strides)
        for field, value in flags.items():
            setattr(args, field, int(value))
        ex = _lib.make_exec(device_kind, device_index, None, num_threads)
        self.args, self.ex = args, ex
        self.q, self.eq = _u64(args), _u64(ex)
        cls = type(args)
        self.slots = tuple(getattr(cls, name).offset // 8 for name in specs)
        self.a_addr, self.e_addr = ctypes.addressof(args), ctypes.addressof(ex)
        self.fn, self.fn_name = _fn(fn_name), fn_name
        self.ws_bytes = 0
        if device_kind == _lib.DEVICE_CUDA and ws_query is not None:
            n = ctypes.c_size_t(0)
            _lib.call(ws_query, ctypes.byref(args), ctypes.byref(ex), ctypes.byref(n))
            self.ws_bytes = int(n.value)
            self.eq[_EX_WS_BYTES] = self.ws_bytes
        self.info = None

    def caller(self, positions, ptr, offsets=None):
        """A function f(tensors, stream, workspace) that writes tensors[i]'s address (the expression `ptr` with
        {} standing for the tensor, e.g. "{}.data_ptr()") into the slot of the i-th present tensor, for i in
        `positions`, then calls the library. Generated as straight-line code: per-call host time is the point.
        offsets: bytes added to each address (parallel to positions), so that a view at a fixed offset into a
        tensor is passed as that tensor without making the view per call."""
        offsets = offsets or (0,) * len(positions)
        lines = [f"    q[{slot}] = {ptr.format(f'ts[{i}]')}" + (f" + {off}" if off else "")
                 for slot, i, off in zip(self.slots, positions, offsets)]
        src = ("def call(ts, stream, workspace):\n" + "\n".join(lines) + "\n"
               f"    eq[{_EX_STREAM}] = stream\n    eq[{_EX_WS}] = workspace\n"
               "    status = fn(a, e)\n    if status:\n        fail(status)\n")
        scope = {"q": self.q, "eq": self.eq, "fn": self.fn, "a": self.a_addr, "e": self.e_addr,
                 "fail": self._fail, "plan": self}  # `plan` keeps the structs alive as long as the function
        exec(compile(src, f"<selscan call plan {self.fn_name}>", "exec"), scope)
        return scope["call"]

    def _fail(self, status):
        raise _lib.SelscanError(_lib.last_error() or _lib.status_string(status), status, self.fn_name)


# The address of an array `{}`, as a plan's generated caller reads it, per framework.
PTR_TORCH = "{}.data_ptr()"
PTR_NUMPY = "{}.__array_interface__['data'][0]"
PTR_CUPY = "{}.data.ptr"

_tls = threading.local()


def cache(kind):
    """This thread's plan cache for `kind` (a dict: signature -> Plan, or None where the signature needs the
    general path)."""
    d = _tls.__dict__.get(kind)
    if d is None or len(d) > _MAX_PLANS:
        d = _tls.__dict__[kind] = {}
    return d
