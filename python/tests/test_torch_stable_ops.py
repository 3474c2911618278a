"""selscan::state_update, the decode step of the op library selscan_torch_ops (src/torch_ops/stable_ops.cpp, built
with -DSELSCAN_TORCH_OPS=ON), against the float64 reference of test_state_update.py and against the binding's
eager call (the same library call, so bit-identical results): both forms, with and without the optional inputs,
slots with padding and destinations, out given or allocated, the conversions the binding makes, errors that
name the argument. Skipped, with the reason, when the op library is not built or does not load."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from selscan import _decode_torch  # noqa: E402
from selscan.torch import selective_state_update  # noqa: E402
from test_state_update import check_torch, make, needs_cuda, to_torch  # noqa: E402

op = _decode_torch.load_stable_ops()
if op is None:
    pytest.skip(f"selscan_torch_ops not loaded: {_decode_torch.stable_ops_error}", allow_module_level=True)

TOL = {torch.float32: (6e-4, 2e-3), torch.bfloat16: (3e-2, 5e-2)}


def stable(**k):
    return op(k["state"], k["x"], k["dt"], k["A"], k["B"], k["C"], k.get("D"), k.get("z"), k.get("dt_bias"),
              k["dt_softplus"], k.get("state_batch_indices"), k.get("pad_slot_id", -1),
              k.get("dst_state_batch_indices"), k.get("out"))


def eager(**k):
    return selective_state_update(**k)


def cases():
    for heads in (False, True):
        for T in (None, 2):
            for opt in (False, True):
                yield dict(heads=heads, T=T, opt=opt, G=2, pool=7, broadcast=heads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_both_forms_and_options(dtype):
    rng = np.random.default_rng(41)
    for kw in cases():
        a = make(rng, **kw)
        a["state_batch_indices"][1] = -1  # padding: out 0, no slot touched
        t, out = check_torch(a, "cpu", dtype, stable)
        assert torch.all(out[1] == 0)
        a = make(rng, **{**kw, "pool": None})  # no indices: slot b is sequence b
        check_torch(a, "cpu", dtype, stable)


def test_matches_eager_bit_for_bit():
    rng = np.random.default_rng(42)
    for kw in cases():
        a = make(rng, **kw)
        a["state_batch_indices"][0] = -1
        t1, t2 = to_torch(a, "cpu", torch.bfloat16), to_torch(a, "cpu", torch.bfloat16)
        o1, o2 = eager(**t1), stable(**t2)
        assert o1.dtype == o2.dtype and o1.shape == o2.shape and o2.is_contiguous()
        assert torch.equal(o1, o2) and torch.equal(t1["state"], t2["state"])


@needs_cuda
def test_cuda_on_the_current_stream():
    """CUDA tensors: the reference, and bit-identical to the eager path, with a side stream current (the op must
    enqueue on it: work on the default stream would race the side stream's producers and consumers)."""
    rng = np.random.default_rng(47)
    side = torch.cuda.Stream()
    for kw in cases():
        a = make(rng, **kw)
        a["state_batch_indices"][2] = -1
        with torch.cuda.stream(side):
            check_torch(a, "cuda", torch.bfloat16, stable)
            t1, t2 = to_torch(a, "cuda", torch.bfloat16), to_torch(a, "cuda", torch.bfloat16)
            o1, o2 = eager(**t1), stable(**t2)
            side.synchronize()
        assert torch.equal(o1, o2) and torch.equal(t1["state"], t2["state"])


def test_destination_slots():
    rng = np.random.default_rng(43)
    for heads in (False, True):
        a = make(rng, heads=heads, G=2, pool=7)
        a["state_batch_indices"] = np.array([1, 6, 3], dtype=np.int64)
        a["dst_state_batch_indices"] = np.array([0, 6, -1], dtype=np.int64)
        t, _ = check_torch(a, "cpu", torch.float32, stable)
        assert torch.equal(t["state"][[1, 3]], to_torch(a, "cpu", torch.float32)["state"][[1, 3]])  # sources kept


def test_out_given_is_written_and_returned():
    rng = np.random.default_rng(44)
    for kw in cases():
        a = make(rng, **kw)
        t = to_torch(a, "cpu", torch.float32)
        want = eager(**to_torch(a, "cpu", torch.float32))
        # a strided out (every other row of a larger buffer), NaN first: every element must be written
        buf = torch.full((2 * want.shape[0],) + tuple(want.shape[1:]), float("nan"))
        out = buf[::2]
        r = stable(**t, out=out)
        assert r.data_ptr() == out.data_ptr() and r.stride() == out.stride()
        assert torch.equal(out, want)
        assert torch.isnan(buf[1::2]).all()  # nothing written between


def test_conversions_as_the_binding():
    """Arguments in a dtype the library does not read are converted as the eager call converts them (a bf16
    model's D and dt_bias to float32, int16 indices to int64, a float64 x and its out to float32)."""
    rng = np.random.default_rng(45)
    a = make(rng, heads=True, G=2, pool=7)
    t1, t2 = to_torch(a, "cpu", torch.bfloat16), to_torch(a, "cpu", torch.bfloat16)
    for t in (t1, t2):
        t["D"], t["dt_bias"] = t["D"].bfloat16(), t["dt_bias"].bfloat16()
        t["state_batch_indices"] = t["state_batch_indices"].to(torch.int16)
    o1, o2 = eager(**t1), stable(**t2)
    assert torch.equal(o1, o2) and torch.equal(t1["state"], t2["state"])
    assert t2["D"].dtype == torch.bfloat16  # the caller's tensor is left as it was

    a = make(rng, G=2, pool=7)
    t1, t2 = to_torch(a, "cpu"), to_torch(a, "cpu")
    for t in (t1, t2):
        t["x"] = t["x"].double()
    o1, o2 = eager(**t1), stable(**t2)
    assert o2.dtype == torch.float32 and torch.equal(o1, o2) and torch.equal(t1["state"], t2["state"])


def test_errors_name_the_argument():
    rng = np.random.default_rng(46)
    a = make(rng, heads=True, G=2, pool=7)
    bad = {
        "B": lambda t: t["B"][..., :5],
        "dt_bias": lambda t: t["dt_bias"][:3],
        "state: dtype float16": lambda t: t["state"].half(),
        "has 5 dims": lambda t: t["x"][None, None],
    }
    keys = {"state: dtype float16": "state", "has 5 dims": "x"}
    for what, change in bad.items():
        t = to_torch(a, "cpu", torch.float32)
        t[keys.get(what, what)] = change(t)
        with pytest.raises(RuntimeError, match=f"selscan::state_update: .*{what}"):
            stable(**t)
    t = to_torch(a, "cpu", torch.float32)
    with pytest.raises(RuntimeError, match="out: dtype bfloat16"):
        stable(**t, out=torch.empty(t["x"].shape, dtype=torch.bfloat16))
    t = to_torch(a, "cpu", torch.float32)
    t["dst_state_batch_indices"] = t.pop("state_batch_indices")
    with pytest.raises(RuntimeError, match="dst_state_batch_indices"):
        stable(**t)


def test_eager_calls_go_through_the_op_unless_opted_out():
    """With the op library loadable, selscan.torch.selective_state_update calls the op (bit-identical to the
    binding's eager path), also with SELSCAN_TORCH_STABLE=1; SELSCAN_TORCH_STABLE=0 at import keeps the binding's
    eager path."""
    code = ("import torch, selscan.torch as st, selscan._decode_torch as d\n"
            "print(d.stable_ops_active)\n"
            "if d.stable_ops_active:\n"
            "    g = torch.Generator().manual_seed(0)\n"
            "    x, dt, z = (torch.randn(3, 8, generator=g) for _ in range(3))\n"
            "    B, C = (torch.randn(3, 4, generator=g) for _ in range(2))\n"
            "    A, s1 = -torch.rand(8, 4, generator=g) - 0.5, torch.randn(3, 8, 4, generator=g)\n"
            "    s2 = s1.clone()\n"
            "    o1 = st.selective_state_update(s1, x, dt, A, B, C, z=z, dt_softplus=True)\n"
            "    o2 = d._eager(s2, x, dt, A, B, C, z=z, dt_softplus=True)\n"
            "    print(torch.equal(o1, o2) and torch.equal(s1, s2))\n")
    env = dict(os.environ)
    for choice, expected in ((None, ["True", "True"]), ("1", ["True", "True"]), ("0", ["False"])):
        env.pop("SELSCAN_TORCH_STABLE", None)
        if choice is not None:
            env["SELSCAN_TORCH_STABLE"] = choice
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == expected, (choice, r.stdout)
