"""Errors surface as selscan.SelscanError (a ValueError) carrying the library's message and status."""

import numpy as np
import pytest

import selscan
from selscan import _lib


def small(rng=None, Bt=2, Dm=4, L=8, N=3):
    rng = rng or np.random.default_rng(0)
    return dict(u=rng.standard_normal((Bt, Dm, L)).astype(np.float32),
                delta=rng.random((Bt, Dm, L)).astype(np.float32),
                A=-rng.random((Dm, N)).astype(np.float32),
                B=rng.standard_normal((Bt, 1, N, L)).astype(np.float32),
                C=rng.standard_normal((Bt, 1, N, L)).astype(np.float32))


def test_error_is_valueerror_with_status():
    assert issubclass(selscan.SelscanError, ValueError)
    a = small()
    a["delta"] = a["delta"][:, :, :5]
    with pytest.raises(selscan.SelscanError) as ei:
        selscan.selective_scan_fn(**a)
    e = ei.value
    assert e.status == 3 and e.status_name == "SHAPE_MISMATCH"
    assert "delta" in str(e) and "(2, 4, 8)" in str(e) and "(2, 4, 5)" in str(e)
    # The message is the library's own.
    assert str(e) == _lib.last_error()


def test_wrong_dstate_of_B():
    a = small()
    a["B"] = a["B"][:, :, :2]
    with pytest.raises(selscan.SelscanError, match=r"^B: ") as ei:
        selscan.selective_scan_fn(**a)
    assert ei.value.status_name == "SHAPE_MISMATCH"


def test_dstate_too_large_is_unsupported():
    a = small(N=300)
    with pytest.raises(selscan.SelscanError, match="dstate") as ei:
        selscan.selective_scan_fn(**a)
    assert ei.value.status_name == "UNSUPPORTED"


def test_groups_must_divide_dim():
    a = small(Dm=4)
    a["B"] = np.zeros((2, 3, 3, 8), np.float32)
    a["C"] = np.zeros((2, 3, 3, 8), np.float32)
    with pytest.raises(selscan.SelscanError, match="groups"):
        selscan.selective_scan_fn(**a)


def test_bad_ndim_of_u():
    a = small()
    a["u"] = a["u"][0]
    with pytest.raises(selscan.SelscanError, match="u") as ei:
        selscan.selective_scan_fn(**a)
    assert ei.value.status_name == "SHAPE_MISMATCH"


def test_zero_size_rejected():
    a = small()
    for k in ("u", "delta"):
        a[k] = a[k][:, :, :0]
    a["B"] = a["B"][..., :0]
    a["C"] = a["C"][..., :0]
    with pytest.raises(selscan.SelscanError, match=">= 1"):
        selscan.selective_scan_fn(**a)


def test_dtype_errors_from_python_side():
    a = small()
    with pytest.raises(selscan.SelscanError, match="u") as ei:
        selscan.selective_scan_fn(**dict(a, u=a["u"].astype(np.int32)))
    assert ei.value.status_name == "DTYPE_MISMATCH"
    # complex B with real A cannot be represented
    with pytest.raises(selscan.SelscanError, match="complex"):
        selscan.selective_scan_fn(**dict(a, B=a["B"].astype(np.complex64)))
    with pytest.raises(selscan.SelscanError, match="itype"):
        selscan.selective_scan_fn(**a, itype="fp64")


def test_missing_required():
    a = small()
    with pytest.raises(selscan.SelscanError, match="C is required"):
        selscan.selective_scan_fn(**dict(a, C=None))


def test_bwd_errors_too():
    a = small()
    with pytest.raises(selscan.SelscanError, match="dout") as ei:
        selscan.selective_scan_bwd(np.zeros((2, 4, 7), np.float32), **a)
    assert ei.value.status_name == "SHAPE_MISMATCH"


def test_gpu_array_mixed_with_numpy_is_refused():
    class FakeGpuArray:
        __cuda_array_interface__ = {"shape": (4, 3), "typestr": "<f4", "data": (0, False), "version": 3}

    a = small()
    with pytest.raises(selscan.SelscanError, match="A is a GPU array"):
        selscan.selective_scan_fn(**dict(a, A=FakeGpuArray()))


def test_error_does_not_leak_into_next_call():
    a = small()
    with pytest.raises(selscan.SelscanError):
        selscan.selective_scan_fn(**dict(a, u=a["u"][:1]))
    out = selscan.selective_scan_fn(**a)  # succeeds after a failure
    assert np.all(np.isfinite(out))
