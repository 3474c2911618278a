"""CuPy arrays and other __cuda_array_interface__ / DLPack GPU arrays through the generic API.
Skipped without CuPy, without a CUDA device, or with a library built without CUDA."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")

import selscan  # noqa: E402
from reference import assert_close  # noqa: E402


def _skip_reason():
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except Exception as e:  # no driver
        return f"CuPy cannot reach a CUDA device: {e}"
    if selscan.cuda_device_count() == 0:
        return "libselscan was built without CUDA (" + selscan.build_info() + ")"
    try:
        selscan.check_device(0)
    except selscan.SelscanError as e:
        return str(e)
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def case(rng, Bt=2, Dm=8, L=300, N=16):
    return dict(u=rng.standard_normal((Bt, Dm, L)).astype(np.float32),
                delta=(0.5 * rng.random((Bt, Dm, L))).astype(np.float32),
                A=(-0.5 * rng.random((Dm, N))).astype(np.float32),
                B=rng.standard_normal((Bt, 1, N, L)).astype(np.float32),
                C=rng.standard_normal((Bt, N, L)).astype(np.float32),
                D=rng.standard_normal(Dm).astype(np.float32),
                z=rng.standard_normal((Bt, Dm, L)).astype(np.float32),
                delta_bias=(0.5 * rng.random(Dm)).astype(np.float32))


@pytest.mark.parametrize("itype", [None, "fp16", "bf16"])
def test_cupy_forward_backward_match_cpu(itype):
    rng = np.random.default_rng(1)
    c = case(rng)
    g = {k: cp.asarray(v) for k, v in c.items()}
    tol = {None: (6e-4, 2e-3), "fp16": (3e-3, 5e-3), "bf16": (3e-2, 5e-2)}[itype]
    y_cpu, last_cpu = selscan.selective_scan_fn(**c, delta_softplus=True, return_last_state=True, itype=itype)
    y_gpu, last_gpu = selscan.selective_scan_fn(**g, delta_softplus=True, return_last_state=True, itype=itype)
    assert isinstance(y_gpu, cp.ndarray) and y_gpu.dtype == y_cpu.dtype
    assert_close("out", cp.asnumpy(y_gpu), y_cpu.astype(np.float32), *tol)
    assert_close("last_state", cp.asnumpy(last_gpu), last_cpu, *tol)
    dout = rng.standard_normal(y_cpu.shape).astype(np.float32)
    gc = selscan.selective_scan_bwd(dout, **c, delta_softplus=True, itype=itype)
    gg = selscan.selective_scan_bwd(cp.asarray(dout), **g, delta_softplus=True, itype=itype)
    for k, v in gc.items():
        scale = max(1.0, float(np.abs(v).max()))
        assert_close(k, cp.asnumpy(gg[k]).astype(np.float32), v.astype(np.float32), 5 * tol[0], 10 * tol[1] * scale)
    assert gg["dC"].shape == c["C"].shape  # 3-D stays 3-D


def test_cupy_uses_current_stream():
    rng = np.random.default_rng(2)
    g = {k: cp.asarray(v) for k, v in case(rng, Dm=64, L=2000).items()}
    ref = selscan.selective_scan_fn(**g, delta_softplus=True)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        y = selscan.selective_scan_fn(**g, delta_softplus=True)
        y2 = y * 1
    s.synchronize()
    assert cp.array_equal(y2, ref)


def test_cuda_array_interface_object():
    """A non-CuPy object exposing only __cuda_array_interface__ (as Numba's device arrays do)."""
    class Wrapped:
        def __init__(self, a):
            self._a = a
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    rng = np.random.default_rng(3)
    c = case(rng, L=64)
    g = {k: Wrapped(cp.asarray(v)) for k, v in c.items()}
    y = selscan.selective_scan_fn(**g, delta_softplus=True)
    assert_close("out", cp.asnumpy(y), selscan.selective_scan_fn(**c, delta_softplus=True), 6e-4, 2e-3)


def test_host_array_mixed_with_gpu_is_refused():
    rng = np.random.default_rng(4)
    c = case(rng, L=16)
    g = {k: cp.asarray(v) for k, v in c.items()}
    g["A"] = c["A"]
    with pytest.raises(selscan.SelscanError, match="A is a host array"):
        selscan.selective_scan_fn(**g)
