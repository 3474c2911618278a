"""Array backends: how numpy, torch and CuPy arrays are described to the library and how outputs are made.

A backend is chosen from `u`; every other argument must belong to the same framework and device. Outputs are
always allocated by the caller's framework (numpy.empty, torch.empty, cupy.empty) on u's device, and CUDA
calls are enqueued on that framework's current stream for the device.
"""

import sys

import numpy as np

from . import _lib
from ._lib import SelscanError

# dtype codes used throughout the package: 'fp32', 'fp16', 'bf16' (itype), 'c64' (complex wtype).
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "c64": 8}

# Test hook: when True, freshly allocated outputs are filled with NaN so that an element the library fails to
# write cannot pass for a correct one.
POISON = False

_BF16_NAN = 0x7FC0


def _dtype_error(name, got, want):
    return SelscanError(f"{name}: dtype {got} cannot be used here (expected {want})", _lib.STATUS_DTYPE_MISMATCH)


def f32_to_bf16_bits(xp, a):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even (NaN stays a quiet NaN)."""
    a = xp.ascontiguousarray(a, dtype=xp.float32)
    bits = a.view(xp.uint32)
    lsb = (bits >> 16) & 1
    rounded = ((bits + (0x7FFF + lsb)) >> 16).astype(xp.uint16)
    sign = ((bits >> 16) & 0x8000).astype(xp.uint16)
    return xp.where(xp.isnan(a), sign | _BF16_NAN, rounded).astype(xp.uint16)


def bf16_bits_to_f32(xp, b):
    """uint16 bf16 bit patterns -> float32 array holding exactly those values."""
    return (xp.ascontiguousarray(b).astype(xp.uint32) << 16).view(xp.float32)


def _is_torch_tensor(obj):
    t = sys.modules.get("torch")
    return t is not None and isinstance(obj, t.Tensor)


def _is_cupy_array(obj):
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(obj, cp.ndarray)


def _dlpack_device_type(obj):
    try:
        return int(obj.__dlpack_device__()[0])
    except Exception:
        return None


def _on_gpu(obj):
    if _is_torch_tensor(obj):
        return obj.is_cuda
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    return hasattr(obj, "__dlpack__") and _dlpack_device_type(obj) not in (None, 1)  # 1 = kDLCPU


# --------------------------------------------------------------------------------------------- numpy
class _XpBackend:
    """Shared by numpy and CuPy: neither has bfloat16, so bf16 travels as uint16 bit patterns and comes
    back to the user as float32 arrays holding bf16 values."""

    xp = np

    def _np_dtype(self, code):
        xp = self.xp
        return {"fp32": xp.float32, "fp16": xp.float16, "bf16": xp.uint16, "c64": xp.complex64}[code]

    def infer_itype(self, name, a):
        dt = a.dtype
        if dt == np.float16:
            return "fp16"
        if dt in (np.float32, np.float64):
            return "fp32"
        if dt.name == "bfloat16":  # ml_dtypes' bfloat16, if the caller uses it
            return "bf16"
        raise _dtype_error(name, dt, "float32, float16 or float64 (or pass itype=)")

    def is_complex(self, a):
        return a.dtype.kind == "c"

    def index_code(self, name, a):
        """'i32', 'i64' or 'bool' for a serving index tensor (docs/serving.md)."""
        code = {"int32": "i32", "int64": "i64", "bool": "bool"}.get(a.dtype.name)
        if code is None:
            raise _dtype_error(name, a.dtype, "int32 or int64 (has_initial_state: bool or int32)")
        return code

    def cast(self, name, a, code):
        xp = self.xp
        dt = a.dtype
        bf16_bits = code == "bf16" and dt == np.uint16  # the caller already holds bf16 bit patterns
        if not (dt.kind in "fc" or dt.name == "bfloat16" or bf16_bits):
            raise _dtype_error(name, dt, "a floating-point array")
        if code == "c64":
            return a if dt == np.complex64 else a.astype(np.complex64)
        if dt.kind == "c":
            raise _dtype_error(name, dt, "a real array (A is real, so the weights are real)")
        if code == "bf16":
            if dt == np.uint16:
                return a  # already bf16 bit patterns
            if dt.name == "bfloat16":
                return a.view(np.uint16)
            return f32_to_bf16_bits(xp, a if dt == np.float32 else a.astype(np.float32))
        if dt.name == "bfloat16":
            a = a.astype(np.float32)
        target = self._np_dtype(code)
        return a if a.dtype == target else a.astype(target)

    def complex_to_interleaved(self, a):
        """(..., L) complex -> (..., 2L) float32, Re/Im interleaved (the variable complex B/C layout)."""
        a = self.xp.ascontiguousarray(a, dtype=self.xp.complex64)
        return a.view(self.xp.float32)

    def interleaved_to_complex(self, a):
        return self.xp.ascontiguousarray(a, dtype=self.xp.float32).view(self.xp.complex64)

    def fix_layout(self, a, last_contiguous):
        item = a.dtype.itemsize
        ok = all(s >= 0 and s % item == 0 for s in a.strides) and self._ptr(a) % item == 0
        if ok and last_contiguous and a.ndim >= 1 and a.shape[-1] > 1 and a.strides[-1] != item:
            ok = False
        return a if ok else self.xp.ascontiguousarray(a)

    def describe(self, a):
        item = a.dtype.itemsize
        return self._ptr(a), tuple(a.shape), tuple(s // item for s in a.strides)

    def reshape(self, a, shape):
        return a.reshape(shape)

    def empty(self, shape, code):
        a = self._alloc(shape, self._np_dtype(code))
        if POISON:
            a[...] = _BF16_NAN if code == "bf16" else np.nan
        return a

    def to_user(self, a, code):
        return bf16_bits_to_f32(self.xp, a) if code == "bf16" else a


class NumpyBackend(_XpBackend):
    name = "numpy"
    device_kind = _lib.DEVICE_CPU
    device_index = 0

    def adopt(self, name, obj):
        if obj is None:
            return None
        if _on_gpu(obj):
            raise SelscanError(f"{name} is a GPU array but u is a host (numpy) array; put all arrays on one "
                               "device", _lib.STATUS_INVALID_ARGUMENT)
        if _is_torch_tensor(obj):
            obj = obj.detach().numpy()
        return np.asarray(obj)

    def _ptr(self, a):
        return a.ctypes.data

    def _alloc(self, shape, dtype):
        return np.empty(shape, dtype=dtype)

    def stream(self):
        return None

    def workspace(self, nbytes):
        if nbytes == 0:
            return None, None
        buf = np.empty(nbytes, dtype=np.uint8)
        return buf.ctypes.data, buf


# --------------------------------------------------------------------------------------------- cupy
class CupyBackend(_XpBackend):
    name = "cupy"
    device_kind = _lib.DEVICE_CUDA

    def __init__(self, u):
        import cupy
        self.xp = cupy
        self.device_index = int(u.device.id)

    def adopt(self, name, obj):
        cp = self.xp
        if obj is None:
            return None
        if not isinstance(obj, cp.ndarray):
            if not _on_gpu(obj):
                raise SelscanError(f"{name} is a host array but u is on CUDA device {self.device_index}; put all "
                                   "arrays on one device", _lib.STATUS_INVALID_ARGUMENT)
            obj = cp.asarray(obj) if hasattr(obj, "__cuda_array_interface__") else cp.from_dlpack(obj)
        if int(obj.device.id) != self.device_index:
            raise SelscanError(f"{name} is on CUDA device {obj.device.id} but u is on device {self.device_index}",
                               _lib.STATUS_INVALID_ARGUMENT)
        return obj

    def infer_itype(self, name, a):
        return super().infer_itype(name, a)

    def cast(self, name, a, code):
        with self.xp.cuda.Device(self.device_index):
            return super().cast(name, a, code)

    def fix_layout(self, a, last_contiguous):
        with self.xp.cuda.Device(self.device_index):
            return super().fix_layout(a, last_contiguous)

    def _ptr(self, a):
        return int(a.data.ptr)

    def _alloc(self, shape, dtype):
        with self.xp.cuda.Device(self.device_index):
            return self.xp.empty(shape, dtype=dtype)

    def to_user(self, a, code):
        with self.xp.cuda.Device(self.device_index):
            return super().to_user(a, code)

    def stream(self):
        with self.xp.cuda.Device(self.device_index):
            return int(self.xp.cuda.get_current_stream().ptr)

    def workspace(self, nbytes):
        if nbytes == 0:
            return None, None
        buf = self._alloc((nbytes,), self.xp.uint8)
        return int(buf.data.ptr), buf


# --------------------------------------------------------------------------------------------- torch
class TorchBackend:
    name = "torch"

    def __init__(self, u):
        import torch
        self.torch = torch
        self.device = u.device
        if u.device.type == "cuda":
            self.device_kind = _lib.DEVICE_CUDA
            self.device_index = u.device.index if u.device.index is not None else torch.cuda.current_device()
        elif u.device.type == "cpu":
            self.device_kind = _lib.DEVICE_CPU
            self.device_index = 0
        else:
            raise SelscanError(f"u is on device '{u.device}'; selscan runs on CPU and CUDA tensors",
                               _lib.STATUS_INVALID_ARGUMENT)
        t = torch
        self._codes = {t.float32: "fp32", t.float16: "fp16", t.bfloat16: "bf16", t.complex64: "c64"}
        self._dtypes = {v: k for k, v in self._codes.items()}

    def adopt(self, name, obj):
        if obj is None:
            return None
        if not isinstance(obj, self.torch.Tensor) and self.device_kind == _lib.DEVICE_CUDA and _on_gpu(obj):
            obj = self.torch.from_dlpack(obj) if hasattr(obj, "__dlpack__") else \
                self.torch.as_tensor(obj, device=self.device)
        if not isinstance(obj, self.torch.Tensor):
            raise SelscanError(f"{name} is a {type(obj).__name__}, expected a torch.Tensor like u",
                               _lib.STATUS_INVALID_ARGUMENT)
        if obj.device != self.device:
            raise SelscanError(f"{name} is on {obj.device} but u is on {self.device}", _lib.STATUS_INVALID_ARGUMENT)
        return obj

    def infer_itype(self, name, a):
        code = self._codes.get(a.dtype)
        if code in ("fp32", "fp16", "bf16"):
            return code
        if a.dtype == self.torch.float64:
            return "fp32"
        raise _dtype_error(name, a.dtype, "torch.float32, float16 or bfloat16")

    def is_complex(self, a):
        return a.is_complex()

    def index_code(self, name, a):
        """'i32', 'i64' or 'bool' for a serving index tensor (docs/serving.md)."""
        t = self.torch
        code = {t.int32: "i32", t.int64: "i64", t.bool: "bool"}.get(a.dtype)
        if code is None:
            raise _dtype_error(name, a.dtype, "torch.int32 or int64 (has_initial_state: bool or int32)")
        return code

    def cast(self, name, a, code):
        if not (a.is_floating_point() or a.is_complex()):
            raise _dtype_error(name, a.dtype, "a floating-point tensor")
        if code != "c64" and a.is_complex():
            raise _dtype_error(name, a.dtype, "a real tensor (A is real, so the weights are real)")
        return a.to(self._dtypes[code])

    def complex_to_interleaved(self, a):
        return self.torch.view_as_real(a.to(self.torch.complex64).contiguous()).flatten(-2)

    def interleaved_to_complex(self, a):
        t = a.float().contiguous()
        return self.torch.view_as_complex(t.unflatten(-1, (t.shape[-1] // 2, 2)))

    def fix_layout(self, a, last_contiguous):
        if last_contiguous and a.dim() >= 1 and a.shape[-1] > 1 and a.stride(-1) != 1:
            return a.contiguous()
        return a

    def describe(self, a):
        return a.data_ptr(), tuple(a.shape), tuple(a.stride())

    def reshape(self, a, shape):
        return a.reshape(shape)

    def empty(self, shape, code):
        t = self.torch.empty(shape, dtype=self._dtypes[code], device=self.device)
        if POISON:
            t.fill_(float("nan"))
        return t

    def to_user(self, a, code):
        return a

    def stream(self):
        if self.device_kind != _lib.DEVICE_CUDA:
            return None
        return int(self.torch.cuda.current_stream(self.device).cuda_stream)

    def workspace(self, nbytes):
        if nbytes == 0:
            return None, None
        buf = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
        return buf.data_ptr(), buf


def _cuda_framework_array(obj):
    """A GPU object of another framework (Numba, JAX, ...) as a CuPy array (preferred) or torch tensor."""
    try:
        import cupy
        return cupy.asarray(obj) if hasattr(obj, "__cuda_array_interface__") else cupy.from_dlpack(obj)
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        raise SelscanError(f"{type(obj).__name__} is a GPU array; selscan needs CuPy or torch to handle it",
                           _lib.STATUS_INVALID_ARGUMENT) from None
    if hasattr(obj, "__dlpack__"):
        return torch.from_dlpack(obj)
    return torch.as_tensor(obj, device="cuda")


def backend_for(u):
    """Picks the backend from u; returns (backend, u as that backend's array)."""
    if _is_torch_tensor(u):
        return TorchBackend(u), u
    if _is_cupy_array(u):
        return CupyBackend(u), u
    if isinstance(u, np.ndarray):
        return NumpyBackend(), u
    if _on_gpu(u):
        u = _cuda_framework_array(u)
        return backend_for(u)
    if hasattr(u, "__dlpack__") and _dlpack_device_type(u) == 1:
        return NumpyBackend(), np.from_dlpack(u)
    return NumpyBackend(), np.asarray(u)
