"""Every golden case (inputs and outputs of upstream's selective_scan_cuda) through the binding, with the
tolerances upstream's own tests use. Directory: $SELSCAN_GOLDEN_DIR, else <repo>/tests/data/golden."""

import json
import os

import numpy as np
import pytest
from conftest import golden_dir, torch_cuda_skip_reason
from reference import assert_close, interleaved_to_complex, ref_scan

import selscan

TOL = {"fp32": (6e-4, 2e-3), "fp16": (3e-3, 5e-3), "bf16": (3e-2, 5e-2)}


def _cases():
    d = golden_dir()
    if not os.path.isdir(d):
        return []
    return sorted(n for n in os.listdir(d) if os.path.isfile(os.path.join(d, n, "case.json")))


CASES = _cases()


def test_golden_dir_present():
    if not CASES:
        pytest.skip(f"no golden cases under {golden_dir()} (set SELSCAN_GOLDEN_DIR)")
    assert len(CASES) >= 8


def load(name):
    d = os.path.join(golden_dir(), name)
    with open(os.path.join(d, "case.json")) as f:
        meta = json.load(f)
    arrays = {}
    for fn in os.listdir(d):
        if fn.endswith(".npy"):
            arrays[fn[:-4]] = np.load(os.path.join(d, fn))
    return meta, arrays


def inputs(meta, a):
    it = meta["itype"]

    def io(x):  # fp16 cases go in as float16 arrays; bf16 ones as float32 converted by itype='bf16'
        return None if x is None else (x.astype(np.float16) if it == "fp16" else x)

    kw = dict(D=a.get("D"), z=io(a.get("z")), delta_bias=a.get("delta_bias"),
              delta_softplus=bool(meta["delta_softplus"]), itype=it)
    B = io(a["B"]) if meta["variable_B"] else a["B"]
    C = io(a["C"]) if meta["variable_C"] else a["C"]
    return (io(a["u"]), io(a["delta"]), a["A"], B, C), kw


@pytest.mark.parametrize("name", CASES)
def test_golden_forward(name):
    meta, a = load(name)
    args, kw = inputs(meta, a)
    out, last = selscan.selective_scan_fn(*args, return_last_state=True, **kw)
    rtol, atol = TOL[meta["itype"]]
    assert_close("out", out, a["out"], rtol, atol)
    assert_close("last_state", last, a["last_state"], rtol, atol)


def check_grads(meta, a, g):
    """Gradients against the golden ones with the tolerances of upstream's test_selective_scan."""
    rtol, atol = TOL[meta["itype"]]
    rtolw, atolw = 1e-3, 1e-3
    if meta["has_z"]:
        rtolw, atolw = max(rtolw, rtol), max(atolw, atol)
    assert_close("du", g["du"], a["du"], 2 * rtol, 2 * atol)
    assert_close("ddelta", g["ddelta"], a["ddelta"], 5 * rtol, 10 * atol)
    assert_close("dA", g["dA"], a["dA"], rtolw, 5 * atolw)
    for k, var in (("dB", meta["variable_B"]), ("dC", meta["variable_C"])):
        assert_close(k, g[k], a[k], *((rtol, atol) if var else (rtolw, atolw)))
    for k, present in (("dD", meta["has_D"]), ("dz", meta["has_z"]), ("ddelta_bias", meta["has_delta_bias"])):
        if present:
            assert_close(k, g[k], a[k], rtolw, atolw)
        else:
            assert g[k] is None


@pytest.mark.parametrize("name", CASES)
def test_golden_backward(name):
    meta, a = load(name)
    args, kw = inputs(meta, a)
    dout = a["dout"].astype(np.float16) if meta["itype"] == "fp16" else a["dout"]
    check_grads(meta, a, selscan.selective_scan_bwd(dout, *args, **kw))


@pytest.mark.parametrize("name", CASES)
def test_golden_torch_cuda_drop_in(name):
    """Issue #5's migration check: upstream's golden cases through selscan.torch.selective_scan_fn on CUDA tensors,
    forward and autograd backward, against upstream's own outputs and gradients."""
    reason = torch_cuda_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    import torch
    from selscan.torch import selective_scan_fn

    meta, a = load(name)
    io_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[meta["itype"]]

    def leaf(key, io):
        x = a.get(key)
        if x is None:
            return None
        t = torch.from_numpy(np.ascontiguousarray(x)).cuda()
        if io:
            t = t.to(io_dtype)
        return t.requires_grad_(True)

    u, delta, z = leaf("u", True), leaf("delta", True), leaf("z", True)
    A, D, bias = leaf("A", False), leaf("D", False), leaf("delta_bias", False)
    B, C = leaf("B", meta["variable_B"]), leaf("C", meta["variable_C"])
    out, last = selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=bool(meta["delta_softplus"]),
                                  return_last_state=True)
    assert out.is_cuda and out.dtype == io_dtype

    def host(t):
        t = t.detach().cpu()
        return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()

    rtol, atol = TOL[meta["itype"]]
    assert_close("out", host(out), a["out"], rtol, atol)
    assert_close("last_state", host(last), a["last_state"], rtol, atol)
    out.backward(torch.from_numpy(np.ascontiguousarray(a["dout"])).cuda().to(io_dtype))
    names = (("du", u), ("ddelta", delta), ("dA", A), ("dB", B), ("dC", C), ("dD", D), ("dz", z),
             ("ddelta_bias", bias))
    check_grads(meta, a, {k: None if t is None else host(t.grad) for k, t in names})


@pytest.mark.parametrize("name", CASES)
def test_golden_reference_agrees(name):
    """Our float64 recurrence reproduces the golden forward too (guards the test's own reference)."""
    meta, a = load(name)
    B, C = a["B"], a["C"]
    if meta["wtype"] == "complex64":
        B = interleaved_to_complex(B) if meta["variable_B"] else B
        C = interleaved_to_complex(C) if meta["variable_C"] else C
    _, final, h = ref_scan(a["u"], a["delta"], a["A"], B, C, a.get("D"), a.get("z"), a.get("delta_bias"),
                           bool(meta["delta_softplus"]))
    rtol, atol = TOL[meta["itype"]]
    assert_close("out", a["out"], final, rtol, atol)
    assert_close("last_state", a["last_state"], h, rtol, atol)
