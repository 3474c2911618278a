"""Backward: library gradients vs central finite differences of the float64 recurrence on tiny problems."""

import numpy as np
import pytest
from reference import assert_close, fd_grads, interleaved_to_complex, ref_scan, round_to

import selscan

KEYS = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")


def tiny(rng, var_B, var_C, cplx, G=1, has_h0=False, Bt=2, Dm=4, L=6, N=3, has_opt=True, softplus=True):
    c = {}
    c["u"] = rng.standard_normal((Bt, Dm, L))
    c["delta"] = 0.2 + 0.5 * rng.random((Bt, Dm, L))
    A = -0.2 - 0.5 * rng.random((Dm, N))
    c["A"] = A + 1j * rng.standard_normal((Dm, N)) if cplx else A
    for name, var in (("B", var_B), ("C", var_C)):
        if var:
            shape = (Bt, G, N, L)
            c[name] = rng.standard_normal(shape) + 1j * rng.standard_normal(shape) if cplx else rng.standard_normal(shape)
        else:
            c[name] = rng.standard_normal((Dm, N)) + (1j * rng.standard_normal((Dm, N)) if cplx else 0)
    c["D"] = rng.standard_normal(Dm) if has_opt else None
    c["z"] = rng.standard_normal((Bt, Dm, L)) if has_opt else None
    c["delta_bias"] = 0.3 * rng.random(Dm) if has_opt else None
    c["h0"] = None
    if has_h0:
        c["h0"] = rng.standard_normal((Bt, Dm, N)) + (1j * rng.standard_normal((Bt, Dm, N)) if cplx else 0)
    # Round everything to the float32 / complex64 values the library will see, keep float64 copies for FD.
    for k, v in c.items():
        if v is not None:
            c[k] = np.asarray(v).astype(np.complex64 if np.iscomplexobj(v) else np.float32).astype(
                np.complex128 if np.iscomplexobj(v) else np.float64)
    c["softplus"] = softplus
    return c


def lib_inputs(c):
    f = {}
    for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0"):
        v = c[k]
        f[k] = None if v is None else v.astype(np.complex64 if np.iscomplexobj(v) else np.float32)
    return f


def check_fd(c, rtol=1e-3, atol=1e-4, seed=0):
    rng = np.random.default_rng(seed)
    shape = c["u"].shape
    dout = rng.standard_normal(shape).astype(np.float32).astype(np.float64)

    def loss():
        _, final, _ = ref_scan(c["u"], c["delta"], c["A"], c["B"], c["C"], c["D"], c["z"], c["delta_bias"],
                               c["softplus"], c["h0"])
        return float((final * dout).sum())

    names = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0"]
    ref = fd_grads(loss, {k: c[k] for k in names})
    f = lib_inputs(c)
    g = selscan.selective_scan_bwd(dout.astype(np.float32), f["u"], f["delta"], f["A"], f["B"], f["C"], f["D"],
                                   z=f["z"], delta_bias=f["delta_bias"], delta_softplus=c["softplus"],
                                   initial_state=f["h0"])
    expect_keys = set(KEYS) | ({"dinitial_state"} if c["h0"] is not None else set())
    assert set(g) == expect_keys
    for k in names:
        key = "dinitial_state" if k == "h0" else "d" + k
        if c[k] is None:
            if k == "h0":
                assert key not in g
                continue
            assert g[key] is None, f"{key} should be None when {k} is absent"
            continue
        got = g[key]
        assert got.shape == c[k].shape, f"{key}: shape {got.shape} != {c[k].shape}"
        assert np.iscomplexobj(got) == np.iscomplexobj(c[k]), key
        # Scale atol by the gradient's magnitude: FD of a sum over many terms.
        scale = max(1.0, float(np.abs(ref[k]).max()))
        assert_close(key, got, ref[k], rtol, atol * scale)


@pytest.mark.parametrize("var_B,var_C", [(True, True), (False, False), (True, False), (False, True)])
@pytest.mark.parametrize("cplx", [False, True])
def test_grads_vs_finite_differences(var_B, var_C, cplx):
    rng = np.random.default_rng(4 * var_B + 2 * var_C + cplx)
    check_fd(tiny(rng, var_B, var_C, cplx))


@pytest.mark.parametrize("cplx", [False, True])
def test_grads_groups(cplx):
    rng = np.random.default_rng(40 + cplx)
    check_fd(tiny(rng, True, True, cplx, G=2))


@pytest.mark.parametrize("var_B", [False, True])
@pytest.mark.parametrize("cplx", [False, True])
def test_grads_initial_state(var_B, cplx):
    rng = np.random.default_rng(50 + var_B + 2 * cplx)
    check_fd(tiny(rng, var_B, True, cplx, has_h0=True))


def test_grads_no_optionals_no_softplus():
    rng = np.random.default_rng(60)
    check_fd(tiny(rng, True, True, False, has_opt=False, softplus=False))


def test_grads_multi_chunk():
    """L > 2048: the binding must run the forward for the chunk states x and pass them to the backward.
    Checked against FD on a few sampled coordinates (full FD would be slow)."""
    rng = np.random.default_rng(70)
    c = tiny(rng, True, True, False, Bt=1, Dm=2, L=2100, N=2)
    dout = rng.standard_normal(c["u"].shape).astype(np.float32).astype(np.float64)
    f = lib_inputs(c)
    g = selscan.selective_scan_bwd(dout.astype(np.float32), f["u"], f["delta"], f["A"], f["B"], f["C"], f["D"],
                                   z=f["z"], delta_bias=f["delta_bias"], delta_softplus=True)

    def loss():
        _, final, _ = ref_scan(c["u"], c["delta"], c["A"], c["B"], c["C"], c["D"], c["z"], c["delta_bias"], True)
        return float((final * dout).sum())

    for name, idx in (("u", (0, 1, 5)), ("u", (0, 0, 2060)), ("delta", (0, 1, 2047)), ("A", (1, 1)),
                      ("B", (0, 0, 0, 2048)), ("C", (0, 0, 1, 100)), ("D", (0,)), ("delta_bias", (1,))):
        arr = c[name]
        old = arr[idx]
        h = 1e-5
        arr[idx] = old + h
        lp = loss()
        arr[idx] = old - h
        lm = loss()
        arr[idx] = old
        want = (lp - lm) / (2 * h)
        got = float(g["d" + name][idx])
        assert abs(got - want) <= 5e-3 * abs(want) + 5e-3, f"d{name}{idx}: got {got}, finite differences {want}"
    # Gradients of the first positions depend on the carried chunk state: a wrong seed would show everywhere.
    assert np.all(np.isfinite(g["du"])) and np.all(np.isfinite(g["dB"]))


def test_bwd_3d_BC_and_complex_given_as_complex():
    rng = np.random.default_rng(80)
    c = tiny(rng, True, True, True)
    f = lib_inputs(c)
    # Library layout: real interleaved (Bt, G, N, 2L)
    Bi = np.stack([f["B"].real, f["B"].imag], -1).reshape(f["B"].shape[:-1] + (-1,)).astype(np.float32)
    Ci = np.stack([f["C"].real, f["C"].imag], -1).reshape(f["C"].shape[:-1] + (-1,)).astype(np.float32)
    dout = rng.standard_normal(c["u"].shape).astype(np.float32)
    kw = dict(D=f["D"], z=f["z"], delta_bias=f["delta_bias"], delta_softplus=True)
    g_c = selscan.selective_scan_bwd(dout, f["u"], f["delta"], f["A"], f["B"], f["C"], **kw)
    g_i = selscan.selective_scan_bwd(dout, f["u"], f["delta"], f["A"], Bi, Ci, **kw)
    g_3 = selscan.selective_scan_bwd(dout, f["u"], f["delta"], f["A"], Bi[:, 0], Ci[:, 0], **kw)
    assert g_i["dB"].shape == Bi.shape and g_3["dB"].shape == Bi[:, 0].shape
    assert g_c["dB"].dtype == np.complex64 and g_c["dB"].shape == f["B"].shape
    np.testing.assert_array_equal(interleaved_to_complex(g_i["dB"]), g_c["dB"])
    np.testing.assert_array_equal(g_3["dC"], g_i["dC"][:, 0])
    np.testing.assert_array_equal(g_3["du"], g_i["du"])


@pytest.mark.parametrize("itype", ["fp16", "bf16"])
def test_bwd_low_precision_dtypes(itype):
    """fp16/bf16 gradients: dtype/shape right and close to the fp32 gradients of the same rounded inputs."""
    rng = np.random.default_rng(90)
    c = tiny(rng, True, True, False, L=16)
    f = lib_inputs(c)
    for k in ("u", "delta", "z", "B", "C"):
        f[k] = round_to(f[k], itype)
    dout = round_to(rng.standard_normal(c["u"].shape), itype)
    kw = dict(D=f["D"], z=f["z"], delta_bias=f["delta_bias"], delta_softplus=True)
    g32 = selscan.selective_scan_bwd(dout, f["u"], f["delta"], f["A"], f["B"], f["C"], **kw)
    glo = selscan.selective_scan_bwd(dout, f["u"], f["delta"], f["A"], f["B"], f["C"], itype=itype, **kw)
    io = np.float16 if itype == "fp16" else np.float32
    for k in ("du", "ddelta", "dz", "dB", "dC"):
        assert glo[k].dtype == io, k
    for k in ("dA", "dD", "ddelta_bias"):
        assert glo[k].dtype == np.float32, k
    rtol, atol = {"fp16": (3e-3, 5e-3), "bf16": (3e-2, 5e-2)}[itype]
    for k in KEYS:
        scale = max(1.0, float(np.abs(g32[k]).max()))
        assert_close(k, glo[k], round_to(g32[k], itype) if k in ("du", "ddelta", "dz", "dB", "dC") else g32[k],
                     2 * rtol, 2 * atol * scale)
