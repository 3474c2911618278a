"""Loading libselscan with ctypes and mirroring include/selscan/selscan.h.

Everything that knows the C layout lives here; the rest of the package builds these structs and calls
`call(...)`, which turns a non-zero status into SelscanError.
"""

import ctypes
import glob
import os
import sys

# The header version this binding was written against (SELSCAN_VERSION = major*10000 + minor*100 + patch).
HEADER_VERSION_MAJOR = 0
HEADER_VERSION_MINOR = 5
HEADER_VERSION_PATCH = 0
HEADER_VERSION = HEADER_VERSION_MAJOR * 10000 + HEADER_VERSION_MINOR * 100 + HEADER_VERSION_PATCH

# selscan_status_t (values 0 .. STATUS_COUNT - 1; a newer library may return more, named "UNKNOWN" here)
STATUS_NAMES = {
    0: "SUCCESS",
    1: "INVALID_ARGUMENT",
    2: "BAD_STRUCT_SIZE",
    3: "SHAPE_MISMATCH",
    4: "DTYPE_MISMATCH",
    5: "BAD_LAYOUT",
    6: "UNSUPPORTED",
    7: "WORKSPACE_TOO_SMALL",
    8: "CUDA_NOT_BUILT",
    9: "NO_DEVICE",
    10: "ARCH_MISMATCH",
    11: "CUDA_ERROR",
    12: "OUT_OF_MEMORY",
    13: "INTERNAL",
}
STATUS_COUNT = 14  # SELSCAN_STATUS_COUNT
STATUS_SUCCESS = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_SHAPE_MISMATCH = 3
STATUS_DTYPE_MISMATCH = 4

# selscan_dtype_t
DTYPE_FLOAT32 = 0
DTYPE_FLOAT16 = 1
DTYPE_BFLOAT16 = 2
DTYPE_COMPLEX64 = 3
DTYPE_INT32 = 4  # index tensors only (state_batch_indices; serving: cu_seqlens, cache_indices, has_initial_state)
DTYPE_INT64 = 5
DTYPE_BOOL = 6
DTYPE_CODES = {"fp32": DTYPE_FLOAT32, "fp16": DTYPE_FLOAT16, "bf16": DTYPE_BFLOAT16, "c64": DTYPE_COMPLEX64,
               "i32": DTYPE_INT32, "i64": DTYPE_INT64, "bool": DTYPE_BOOL}

# selscan_device_kind_t
DEVICE_CPU = 0
DEVICE_CUDA = 1

MAX_NDIM = 4
MAX_DSTATE = 256
CHUNK = 2048
WORKSPACE_ALIGNMENT = 256  # SELSCAN_WORKSPACE_ALIGNMENT: exec.workspace must be aligned to this


class SelscanError(ValueError):
    """A libselscan call failed. `status` is the selscan_status_t value, `status_name` its enum suffix
    (e.g. "SHAPE_MISMATCH"); str(err) is the library's detailed message (selscan_last_error())."""

    def __init__(self, message, status=STATUS_INVALID_ARGUMENT, function=None):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "UNKNOWN")
        self.function = function
        super().__init__(message)


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * MAX_NDIM),
        ("strides", ctypes.c_int64 * MAX_NDIM),
    ]


class Exec(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("device_kind", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("num_threads", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


FWD_INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
FWD_OUTPUTS = ("out", "out_z", "x", "last_state")


# Serving fields (docs/serving.md), appended to both structs.
FWD_SERVING = ("cu_seqlens", "ssm_states", "cache_indices", "has_initial_state")
BWD_SERVING = ("cu_seqlens", "cache_indices", "has_initial_state")
# Block-wise state caching (forward only, since 0.4), after state_block_size.
FWD_BLOCKS = ("block_table", "context_lens")


class FwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", ctypes.c_size_t)]
        + [(n, Tensor) for n in FWD_INPUTS]
        + [("delta_softplus", ctypes.c_int32), ("flags", ctypes.c_int32)]
        + [(n, Tensor) for n in FWD_OUTPUTS]
        + [(n, Tensor) for n in FWD_SERVING] + [("pad_slot_id", ctypes.c_int64)]  # since 0.3
        + [("state_block_size", ctypes.c_int64)] + [(n, Tensor) for n in FWD_BLOCKS]  # since 0.4
    )


BWD_INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
BWD_SAVED = ("dout", "x", "out")
BWD_OUTPUTS = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dh0", "out_z")


class BwdArgs(ctypes.Structure):
    _fields_ = (
        [("struct_size", ctypes.c_size_t)]
        + [(n, Tensor) for n in BWD_INPUTS]
        + [("delta_softplus", ctypes.c_int32), ("deterministic", ctypes.c_int32)]
        + [(n, Tensor) for n in BWD_SAVED]
        + [(n, Tensor) for n in BWD_OUTPUTS]
        + [("flags", ctypes.c_int32), ("reserved", ctypes.c_int32)]  # since 0.2; must be 0
        + [(n, Tensor) for n in BWD_SERVING] + [("pad_slot_id", ctypes.c_int64)]  # since 0.3
    )


STATE_UPDATE_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "state_batch_indices")


class StateUpdateArgs(ctypes.Structure):
    """selscan_state_update_args_t (the decode step)."""

    _fields_ = (
        [("struct_size", ctypes.c_size_t)]
        + [(n, Tensor) for n in STATE_UPDATE_INPUTS]
        + [("pad_slot_id", ctypes.c_int64), ("dt_softplus", ctypes.c_int32), ("flags", ctypes.c_int32)]
        + [("state", Tensor), ("out", Tensor)]
        + [("dst_state_batch_indices", Tensor)]  # since 0.4
    )


# The causal depthwise convolution (since 0.5, header section 5c).
ACTIVATION_NONE = 0
ACTIVATION_SILU = 1  # causal-conv1d's "silu" and "swish"


class Conv1dFwdArgs(ctypes.Structure):
    """selscan_conv1d_fwd_args_t."""

    _fields_ = (
        [("struct_size", ctypes.c_size_t)]
        + [(n, Tensor) for n in ("x", "weight", "bias", "seq_idx", "initial_states")]
        + [("activation", ctypes.c_int32), ("flags", ctypes.c_int32)]
        + [(n, Tensor) for n in ("out", "final_states")]
        + [(n, Tensor) for n in ("cu_seqlens", "conv_states", "cache_indices", "has_initial_state")]
        + [("pad_slot_id", ctypes.c_int64)]
    )


class Conv1dBwdArgs(ctypes.Structure):
    """selscan_conv1d_bwd_args_t."""

    _fields_ = (
        [("struct_size", ctypes.c_size_t)]
        + [(n, Tensor) for n in ("x", "weight", "bias", "seq_idx", "initial_states")]
        + [("activation", ctypes.c_int32), ("deterministic", ctypes.c_int32)]
        + [(n, Tensor) for n in ("cu_seqlens", "dout", "dfinal_states", "dx", "dweight", "dbias", "dinitial_states")]
        + [("flags", ctypes.c_int32), ("reserved", ctypes.c_int32)]
    )


class Conv1dUpdateArgs(ctypes.Structure):
    """selscan_conv1d_update_args_t (the decode update)."""

    _fields_ = (
        [("struct_size", ctypes.c_size_t)]
        + [(n, Tensor) for n in ("x", "weight", "bias", "cache_seqlens", "conv_state_indices")]
        + [("pad_slot_id", ctypes.c_int64), ("activation", ctypes.c_int32), ("flags", ctypes.c_int32)]
        + [("conv_state", Tensor), ("out", Tensor)]
    )


def _lib_names():
    if sys.platform == "win32":
        return ["selscan.dll", "libselscan.dll"]
    if sys.platform == "darwin":
        return ["libselscan.dylib", "libselscan.*.dylib"]
    return ["libselscan.so", "libselscan.so.*"]


def _source_checkout(pkg_dir):
    """The repository root when this package is python/selscan of a source checkout, else None."""
    repo = os.path.dirname(os.path.dirname(pkg_dir))
    if os.path.basename(os.path.dirname(pkg_dir)) != "python":
        return None
    if not os.path.isfile(os.path.join(repo, "include", "selscan", "selscan.h")):
        return None
    return repo


def package_dirs():
    """The package's directories: this file's, and for an editable install (pip install -e) also the one in
    site-packages that holds the built library."""
    here = os.path.dirname(os.path.abspath(__file__))
    pkg = sys.modules.get(__package__)
    dirs = [os.path.abspath(d) for d in getattr(pkg, "__path__", [])]
    return dirs if here in dirs else [here] + dirs


def candidate_paths():
    """Where the library is looked for, in order. $SELSCAN_LIBRARY alone when set; else the copy inside the
    package (an installed package always has one, and then nothing else is tried); else, in a source checkout
    only, the build trees under <repo>/build, most recently built first."""
    env = os.environ.get("SELSCAN_LIBRARY")
    if env:
        # An explicit choice is never silently replaced by another copy.
        return [env]
    pkg_dir = os.path.dirname(os.path.abspath(__file__))
    packaged = []
    for d in package_dirs():
        for pattern in _lib_names():
            packaged += sorted(glob.glob(os.path.join(d, pattern)))
    if packaged:
        return packaged
    repo = _source_checkout(pkg_dir)
    if repo is None:
        return []
    build = []
    for pattern in _lib_names():
        build += glob.glob(os.path.join(repo, "build", "*", pattern))
        build += glob.glob(os.path.join(repo, "build", "*", "*", pattern))
    # Newest first: after a rebuild that is the one the developer means (selscan.library_path says which).
    build.sort(key=lambda p: os.path.getmtime(p), reverse=True)
    return build


def _declare(lib):
    c_status = ctypes.c_int
    sig = {
        "selscan_version_string": (ctypes.c_char_p, []),
        "selscan_version": (ctypes.c_int32, []),
        "selscan_status_string": (ctypes.c_char_p, [c_status]),
        "selscan_last_error": (ctypes.c_char_p, []),
        "selscan_build_info": (ctypes.c_char_p, []),
        "selscan_cuda_device_count": (c_status, [ctypes.POINTER(ctypes.c_int32)]),
        "selscan_check_device": (c_status, [ctypes.c_int32]),
        "selscan_fwd_workspace_size": (
            c_status, [ctypes.POINTER(FwdArgs), ctypes.POINTER(Exec), ctypes.POINTER(ctypes.c_size_t)]),
        "selscan_bwd_workspace_size": (
            c_status, [ctypes.POINTER(BwdArgs), ctypes.POINTER(Exec), ctypes.POINTER(ctypes.c_size_t)]),
        "selscan_fwd": (c_status, [ctypes.POINTER(FwdArgs), ctypes.POINTER(Exec)]),
        "selscan_bwd": (c_status, [ctypes.POINTER(BwdArgs), ctypes.POINTER(Exec)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    # Entry points a library may lack (a build older than this binding): declared where present; calling a missing
    # one raises SelscanError naming it (_plan._fn).
    optional = {
        "selscan_conv1d_fwd": (c_status, [ctypes.POINTER(Conv1dFwdArgs), ctypes.POINTER(Exec)]),
        "selscan_conv1d_bwd_workspace_size": (
            c_status, [ctypes.POINTER(Conv1dBwdArgs), ctypes.POINTER(Exec), ctypes.POINTER(ctypes.c_size_t)]),
        "selscan_conv1d_bwd": (c_status, [ctypes.POINTER(Conv1dBwdArgs), ctypes.POINTER(Exec)]),
        "selscan_conv1d_update": (c_status, [ctypes.POINTER(Conv1dUpdateArgs), ctypes.POINTER(Exec)]),
    }
    for name, (res, args) in optional.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args


_HOW_TO_FIX = (
    "To fix: install the package, which builds the library and puts it inside selscan/ (pip install selscan, or "
    "pip install . in a checkout; pip install -v shows whether CUDA was found); in a source checkout, build it "
    "(cmake --workflow --preset cpu, or --preset ci with CUDA) so that build/<preset>/libselscan.so exists; or set "
    "SELSCAN_LIBRARY to the path of a libselscan.so. The library loads without an NVIDIA driver (then only the "
    "CPU path runs); its GPU path needs an R580+ driver when built with CUDA 13, R525+ with CUDA 12.x, R450+ with "
    "CUDA 11.8. For an older driver build with an older toolkit: put its nvcc on PATH and run "
    "pip install --no-binary selscan selscan (or cmake --workflow --preset cuda-12.4); selscan doctor says what "
    "the loaded library needs.")


def _load():
    tried = []
    for path in candidate_paths():
        if not os.path.isfile(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(os.path.abspath(path))
            _declare(lib)
        except (OSError, AttributeError) as exc:
            tried.append(f"{path} ({exc})")
            continue
        return lib, os.path.abspath(path)
    if tried:
        where = "; ".join(tried)
    else:
        pkg_dir = os.path.dirname(os.path.abspath(__file__))
        where = f"SELSCAN_LIBRARY is not set, no libselscan in the package ({', '.join(package_dirs())})"
        repo = _source_checkout(pkg_dir)
        where += f", none under {os.path.join(repo, 'build')}/*/" if repo else " (not a source checkout)"
    raise ImportError(f"selscan: cannot load libselscan. Tried: {where}. {_HOW_TO_FIX}")


lib, library_path = _load()

library_version = int(lib.selscan_version())
# Same major and not older than the header we mirror: newer minors only append struct fields, which the
# library treats as absent for our smaller struct_size.
if library_version // 10000 != HEADER_VERSION_MAJOR or library_version < HEADER_VERSION:
    raise ImportError(
        f"selscan: {library_path} is version {lib.selscan_version_string().decode()} ({library_version}); "
        f"this binding was written for {HEADER_VERSION_MAJOR}.{HEADER_VERSION_MINOR}.{HEADER_VERSION_PATCH} "
        f"({HEADER_VERSION}) and needs the same major version, at least that minor")


def last_error():
    msg = lib.selscan_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def status_string(status):
    s = lib.selscan_status_string(int(status))
    return s.decode() if s else ""


def call(fn_name, *args):
    status = getattr(lib, fn_name)(*args)
    if status != STATUS_SUCCESS:
        msg = last_error() or status_string(status)
        raise SelscanError(msg, status, fn_name)


def make_exec(device_kind=DEVICE_CPU, device_index=0, stream=None, num_threads=0):
    ex = Exec()
    ex.struct_size = ctypes.sizeof(Exec)
    ex.device_kind = device_kind
    ex.device_index = device_index
    ex.stream = stream
    ex.workspace = None
    ex.workspace_bytes = 0
    ex.num_threads = int(num_threads or 0)
    return ex


def new_fwd_args():
    a = FwdArgs()  # ctypes zero-fills: every tensor absent, flags 0
    a.struct_size = ctypes.sizeof(FwdArgs)
    return a


def new_bwd_args():
    a = BwdArgs()
    a.struct_size = ctypes.sizeof(BwdArgs)
    return a


def new_state_update_args():
    a = StateUpdateArgs()
    a.struct_size = ctypes.sizeof(StateUpdateArgs)
    a.pad_slot_id = -1  # as SELSCAN_STATE_UPDATE_ARGS_INIT
    return a


def new_conv1d_fwd_args():
    a = Conv1dFwdArgs()
    a.struct_size = ctypes.sizeof(Conv1dFwdArgs)
    a.pad_slot_id = -1  # as SELSCAN_CONV1D_FWD_ARGS_INIT
    return a


def new_conv1d_bwd_args():
    a = Conv1dBwdArgs()
    a.struct_size = ctypes.sizeof(Conv1dBwdArgs)
    return a


def new_conv1d_update_args():
    a = Conv1dUpdateArgs()
    a.struct_size = ctypes.sizeof(Conv1dUpdateArgs)
    a.pad_slot_id = -1  # as SELSCAN_CONV1D_UPDATE_ARGS_INIT
    return a


def set_tensor(t, ptr, dtype_code, shape, strides):
    if len(shape) > MAX_NDIM:
        raise SelscanError(f"tensor has {len(shape)} dimensions; the library takes at most {MAX_NDIM}",
                           STATUS_SHAPE_MISMATCH)
    t.data = ptr
    t.dtype = dtype_code
    t.ndim = len(shape)
    for i in range(MAX_NDIM):
        t.sizes[i] = int(shape[i]) if i < len(shape) else 0
        t.strides[i] = int(strides[i]) if i < len(shape) else 0
