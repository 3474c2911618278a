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

from . import _lib
from ._backends import backend_for
from ._core import prepare, run_bwd, run_fwd, user_grad
from ._lib import SelscanError

__all__ = [
    "SelscanError", "selective_scan_fn", "selective_scan_bwd", "version", "build_info", "cuda_device_count",
    "check_device", "library_path", "__version__",
]

library_path = _lib.library_path
__version__ = _lib.lib.selscan_version_string().decode()


def version():
    """The loaded library's version string, e.g. "0.1.0"."""
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
                      return_last_state=False, initial_state=None, itype=None, num_threads=0):
    """Forward selective scan with upstream mamba_ssm's shapes.

    u, delta, z: (Bt, D, L). A: (D, N) float32 or complex64. B, C: (D, N) weights (A's dtype) or per-token
    (Bt, N, L) / (Bt, G, N, L) (complex A: real (…, 2L) Re/Im interleaved, or complex (…, L)).
    D, delta_bias: (D,). initial_state: (Bt, D, N) in A's dtype (the state before position 0).
    itype: None infers from u (float16 -> fp16, float32/float64 -> fp32); 'fp32' | 'fp16' | 'bf16' converts the
    input-dtype tensors first. bf16 results come back as float32 arrays holding bf16 values (numpy/CuPy).
    Returns out * silu(z) if z is given else out; with return_last_state, (that, last_state (Bt, D, N)).
    num_threads: CPU worker threads (0 = all).
    """
    be, u = backend_for(u)
    p = prepare(be, u, delta, A, B, C, D, z, delta_bias, initial_state, itype)
    r = run_fwd(p, delta_softplus, want_x=False, want_last=bool(return_last_state), num_threads=num_threads)
    y = be.to_user(r["out_z"] if z is not None else r["out"], p.it)
    if return_last_state:
        return y, r["last_state"]
    return y


def selective_scan_bwd(dout, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       initial_state=None, itype=None, deterministic=False, num_threads=0):
    """Gradients of sum(dout * selective_scan_fn(...)) w.r.t. every input (the forward is run internally).

    dout is the gradient of out * silu(z) when z is given, else of out. Returns a dict with keys du, ddelta,
    dA, dB, dC, dD, dz, ddelta_bias (and dinitial_state when initial_state is given); keys of absent inputs map
    to None. Each gradient has the shape of its input (3-D B/C stay 3-D); complex gradients follow PyTorch's
    convention dL/dRe + i dL/dIm. deterministic: bitwise-reproducible reductions on CUDA.
    """
    be, u = backend_for(u)
    p = prepare(be, u, delta, A, B, C, D, z, delta_bias, initial_state, itype)
    g = run_bwd(p, dout, delta_softplus, deterministic=deterministic, num_threads=num_threads)
    res = {k: user_grad(p, k, g[k]) for k in ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")}
    if initial_state is not None:
        res["dinitial_state"] = g["dh0"]
    return res
