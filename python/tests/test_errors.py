"""Errors surface as selscan.SelscanError (a ValueError) carrying the library's message and status."""

import ctypes

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


# ------------------------------------------------------------------------------------ ABI 0.2 checks, raw structs
def _set_all(struct, named_arrays):
    for name, arr in named_arrays:
        _lib.set_tensor(getattr(struct, name), arr.ctypes.data, _lib.DTYPE_FLOAT32, arr.shape,
                        [s // arr.itemsize for s in arr.strides])


def _raw_fwd(a):
    """A forward call's structs over fp32 numpy arrays, filled through the mirror; returns (args, exec, out)."""
    out = np.full(a["u"].shape, np.nan, np.float32)
    args = _lib.new_fwd_args()
    _set_all(args, list(a.items()) + [("out", out)])
    return args, _lib.make_exec(num_threads=1), out


def test_output_aliasing_an_input_is_bad_layout():
    a = small()
    args, ex, out = _raw_fwd(a)
    args.out.data = a["u"].ctypes.data  # in place over u: not supported
    with pytest.raises(selscan.SelscanError) as ei:
        _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
    assert ei.value.status_name == "BAD_LAYOUT"
    assert str(ei.value).startswith("out: output bytes [0x") and "overlap u's bytes [0x" in str(ei.value)
    assert np.isnan(out).all()


def test_overlapping_output_elements_are_bad_layout():
    a = small()
    args, ex, out = _raw_fwd(a)
    args.out.strides[1] = 3  # channel stride shorter than the row of 8
    with pytest.raises(selscan.SelscanError, match="out: output elements would overlap") as ei:
        _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
    assert ei.value.status_name == "BAD_LAYOUT"


def test_reserved_fields_and_workspace_alignment():
    a = small()
    args, ex, out = _raw_fwd(a)
    ex.reserved = 3
    with pytest.raises(selscan.SelscanError, match=r"exec.reserved: reserved, must be 0, got 3") as ei:
        _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
    assert ei.value.status_name == "INVALID_ARGUMENT"
    ex.reserved = 0
    ws = np.zeros(2 * _lib.WORKSPACE_ALIGNMENT, np.uint8)
    base = ws.ctypes.data
    ex.workspace = base + (-base) % _lib.WORKSPACE_ALIGNMENT + 8  # 8 bytes past an aligned address
    ex.workspace_bytes = 64
    with pytest.raises(selscan.SelscanError, match="exec.workspace") as ei:
        _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
    assert ei.value.status_name == "BAD_LAYOUT"
    assert np.isnan(out).all()


def test_struct_sizes_old_and_new():
    a = small()
    args, ex, out = _raw_fwd(a)
    args.struct_size = 8  # below the first version of the struct
    with pytest.raises(selscan.SelscanError, match="struct_size is 8") as ei:
        _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
    assert ei.value.status_name == "BAD_STRUCT_SIZE"

    # The backward at the 0.1 size (before flags): its non-zero flags lie past struct_size and are not read.
    args.struct_size = ctypes.sizeof(_lib.FwdArgs)
    _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
    g = {k: np.full(v.shape, np.nan, np.float32) for k, v in a.items()}
    dout = np.ones_like(out)
    b = _lib.new_bwd_args()
    _set_all(b, list(a.items()) + [("dout", dout), ("du", g["u"]), ("ddelta", g["delta"]), ("dA", g["A"]),
                                   ("dB", g["B"]), ("dC", g["C"])])
    b.flags = 5
    with pytest.raises(selscan.SelscanError, match="flags: reserved, must be 0, got 5"):
        _lib.call("selscan_bwd", ctypes.byref(b), ctypes.byref(ex))
    b.struct_size = _lib.BwdArgs.flags.offset
    _lib.call("selscan_bwd", ctypes.byref(b), ctypes.byref(ex))
    want = selscan.selective_scan_bwd(dout, **a, num_threads=1)
    for k in ("u", "delta", "A", "B", "C"):
        np.testing.assert_array_equal(g[k], want["d" + k])


def test_status_table_matches_the_library():
    for s in range(_lib.STATUS_COUNT):
        assert _lib.status_string(s) != "unknown status"
        assert selscan.SelscanError("m", s).status_name == _lib.STATUS_NAMES[s]
    assert _lib.status_string(_lib.STATUS_COUNT) == "unknown status"
    assert selscan.SelscanError("m", _lib.STATUS_COUNT).status_name == "UNKNOWN"


def test_unknown_dtype_code_is_printed():
    a = small()
    args, ex, out = _raw_fwd(a)
    args.delta.dtype = 7
    with pytest.raises(selscan.SelscanError, match=r"delta: expected dtype float32 \(u's dtype\), got dtype code 7"):
        _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
