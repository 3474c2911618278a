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


def test_loaded_from_beside_libselscan():
    """Without $SELSCAN_TORCH_OPS_LIBRARY the op library is the one beside the loaded libselscan: in an installed
    wheel, the package's own copy (tools/build-wheel.sh puts it there), never one found elsewhere."""
    from selscan import _lib

    chosen = os.environ.get("SELSCAN_TORCH_OPS_LIBRARY")
    if chosen:
        assert os.path.realpath(_decode_torch.stable_ops_path) == os.path.realpath(chosen)
    else:
        here = os.path.realpath(os.path.dirname(_lib.library_path))
        assert os.path.realpath(_decode_torch.stable_ops_path) == os.path.join(here, _decode_torch.STABLE_OPS_LIBRARY)
    assert hasattr(torch.ops.selscan, "scan_fwd") and hasattr(torch.ops.selscan, "state_update")


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


# ------------------------------------------------------------------------------------------------ scan forward
# selscan::scan_fwd, the scan's forward in the same library: against the float64 reference, bit for bit against
# the binding's ctypes routes (its call plan and its general path: the same library call on the same values), the
# conversions the binding makes, out_z given, errors that name the argument, and selscan.torch's routing through
# it (with and without a gradient) unless SELSCAN_TORCH_STABLE=0.

import selscan.torch as st  # noqa: E402
from selscan import _core, _plan  # noqa: E402
from selscan._backends import TorchBackend  # noqa: E402
from reference import fd_grads, interleaved_to_complex, ref_scan, round_to  # noqa: E402
from test_torch import make as make_scan  # noqa: E402

scan_op = torch.ops.selscan.scan_fwd.default  # loaded above, also where selscan.torch opted out
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
ITYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def scan_cases():
    """(description, make_scan keywords): real and complex A, variable B/C with groups or 3-D, constant B/C,
    with and without the optional inputs, one long enough for two chunk states."""
    yield "var G=2", dict(G=2, Dm=4)
    yield "var 3-D", dict(three_d=True)
    yield "const", dict(var_B=False, var_C=False)
    yield "var B const C", dict(var_C=False)
    yield "complex var", dict(cplx=True)
    yield "complex const", dict(cplx=True, var_B=False, var_C=False)
    yield "no optionals", dict(opt=False)
    yield "two chunks", dict(L=2100, Bt=1, Dm=2, N=4)


def binding_fwd(ts, softplus, want_x, want_last):
    """The ctypes general path (_core): what the binding's forward computes."""
    p = _core.prepare(TorchBackend(ts[0]), *ts)
    r = _core.run_fwd(p, softplus, want_x=want_x, want_last=want_last)
    return r["out"], r["out_z"], r["x"], r["last_state"]


def plan_fwd(ts, softplus, want_x, want_last, monkeypatch):
    """The ctypes plan route (_run_fwd without the op), or None where the plan path does not take the call."""
    monkeypatch.setattr(st, "_scan_op", None)
    try:
        r = st._fast_fwd(*ts, softplus, want_x, want_last)
    finally:
        monkeypatch.setattr(st, "_scan_op", scan_op)
    return None if r is None else r[1]


def same(got, want, what):
    for name, g, w in zip(("out", "out_z", "x", "last_state"), got, want):
        assert (g is None) == (w is None), f"{what}: {name} present {g is not None}, expected {w is not None}"
        if g is not None:
            assert g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous(), f"{what}: {name}"
            assert torch.equal(g, w), f"{what}: {name} differs"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scan_matches_the_binding_bit_for_bit(device, dtype, monkeypatch):
    for what, kw in scan_cases():
        ts = make_scan(device, dtype, **kw)
        for softplus, want_x, want_last in ((True, True, True), (False, False, False), (True, False, True)):
            got = scan_op(*ts, softplus, want_x, want_last, None)
            label = f"{what} softplus={softplus} x={want_x} last={want_last}"
            same(got, binding_fwd(ts, softplus, want_x, want_last), label + " vs general")
            plan = plan_fwd(ts, softplus, want_x, want_last, monkeypatch)
            assert plan is not None, label  # library-ready inputs: the plan path takes every case
            same(got, plan, label + " vs plan")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scan_against_the_float64_reference(dtype):
    rtol, atol = TOL[dtype]
    for what, kw in scan_cases():
        u, delta, A, B, C, D, z, bias = ts = make_scan("cpu", dtype, **kw)
        out, out_z, _, last = scan_op(*ts, True, False, True, None)

        def f64(t, bc=False):
            if t is None:
                return None
            a = t.double().numpy() if not t.is_complex() else t.numpy().astype(np.complex128)
            if bc and A.is_complex() and t.dim() >= 3:
                a = interleaved_to_complex(round_to(a, ITYPE[dtype]))
            return a

        y, final, h = ref_scan(f64(u), f64(delta), f64(A), f64(B, True), f64(C, True), f64(D), f64(z), f64(bias),
                               True)
        torch.testing.assert_close(out.double(), torch.from_numpy(y), rtol=rtol, atol=atol,
                                   msg=lambda m: f"{what}: out {m}")
        if z is not None:
            torch.testing.assert_close(out_z.double(), torch.from_numpy(final), rtol=rtol, atol=atol,
                                       msg=lambda m: f"{what}: out_z {m}")
        want_h = torch.from_numpy(h)
        got_h = last if not last.is_complex() else last.to(torch.complex128)
        torch.testing.assert_close(got_h.to(want_h.dtype), want_h, rtol=rtol, atol=atol,
                                   msg=lambda m: f"{what}: last_state {m}")


def last_dim_strided(t):
    """t's values in a layout whose last dimension is strided (a transposed view), as models hand B, C or u."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def test_scan_conversions_as_the_binding(monkeypatch):
    """What the binding converts the op converts the same way, leaving the caller's tensors as they were: a bf16
    model's D and delta_bias to float32, B/C handed as transposed views (a row-major copy), a float32 delta with
    bf16 u to bf16, a float64 A to float32."""
    u, delta, A, B, C, D, z, bias = make_scan("cpu", torch.bfloat16, G=2)
    Bt, Ct = last_dim_strided(B), last_dim_strided(C)
    variants = {
        "bf16 D, delta_bias": (u, delta, A, B, C, D.bfloat16(), z, bias.bfloat16()),
        "transposed B, C": (u, delta, A, Bt, Ct, D, z, bias),
        "float32 delta": (u, delta.float(), A, B, C, D, z, bias),
        "float64 A": (u, delta, A.double(), B, C, D, z, bias),
    }
    for what, ts in variants.items():
        before = [None if t is None else (t.dtype, t.stride()) for t in ts]
        got = scan_op(*ts, True, True, True, None)
        same(got, binding_fwd(list(ts), True, True, True), what)
        assert [None if t is None else (t.dtype, t.stride()) for t in ts] == before, what
        if what in ("bf16 D, delta_bias", "transposed B, C"):  # the plan path's own casts and row copies
            same(got, plan_fwd(list(ts), True, True, True, monkeypatch), what + " vs plan")


def _op_net_bytes(ts):
    """Bytes the op leaves allocated on the CPU, from the profiler's memory events (its children included), and
    the bytes of the tensors it returned."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        got = scan_op(*ts, True, False, True, None)
    net = sum(e.cpu_memory_usage for e in prof.key_averages() if e.key == "selscan::scan_fwd")
    kept = sum(t.untyped_storage().nbytes() for t in got if t is not None)
    return net, kept


def test_scan_frees_its_copies():
    """The row-major copies and conversions the op makes are freed when it returns: what stays allocated is its
    outputs (a copy left referenced by the dispatcher's returned handle grew a model's memory by u's size on every
    call; 24 such copies in one generate() prefill)."""
    u, delta, A, B, C, D, z, bias = make_scan("cpu", torch.bfloat16, Bt=2, Dm=96, L=300)
    ut, Bt = last_dim_strided(u), last_dim_strided(B)
    variants = {"contiguous": (u, delta, A, B, C, D, z, bias),
                "transposed u": (ut, delta, A, B, C, D, z, bias),
                "transposed B, float32 delta": (u, delta.float(), A, Bt, C, D, None, bias)}
    for what, ts in variants.items():
        scan_op(*ts, True, False, True, None)  # first call: anything the op or the library sets up once
        net, kept = _op_net_bytes(ts)
        assert net == kept, f"{what}: {net - kept} bytes left allocated beyond the {kept} of the outputs"


@needs_cuda
def test_scan_cuda_frees_its_copies():
    u, delta, A, B, C, D, z, bias = make_scan("cuda", torch.bfloat16, Bt=2, Dm=96, L=300)
    ts = (last_dim_strided(u), delta.float(), A, last_dim_strided(B), C, D, z, bias)
    scan_op(*ts, True, False, True, None)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        got = scan_op(*ts, True, False, True, None)
        del got
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


def test_scan_out_z_given_is_written_and_returned():
    u, delta, A, B, C, D, z, bias = ts = make_scan("cpu", torch.float32)
    want = scan_op(*ts, True, False, False, None)
    # a strided out_z (a (dim, batch*L) buffer viewed as (batch, dim, L), as the fused layer passes it), NaN first
    bt, dm, L = u.shape
    buf = torch.full((dm, bt * L), float("nan"))
    oz = buf.view(dm, bt, L).transpose(0, 1)
    got = scan_op(*ts, True, False, False, oz)
    assert got[1].data_ptr() == oz.data_ptr() and got[1].stride() == oz.stride()
    assert torch.equal(got[0], want[0]) and torch.equal(oz, want[1])


def test_scan_errors_name_the_argument():
    ts = make_scan("cpu", torch.float32, G=2, Dm=4)
    u, delta, A, B, C, D, z, bias = ts

    def args(**k):
        named = dict(zip(("u", "delta", "A", "B", "C", "D", "z", "delta_bias"), ts))
        named.update(k)
        return list(named.values())

    bad = {
        "u: dtype float64 is not supported": args(u=u.double()),
        "u: has 2 dims, expected 3": args(u=u[0]),
        "A: has 3 dims, expected 2": args(A=A[None]),
        "D: dtype int32 cannot be used": args(D=D.int()),
        "delta: dtype complex64 cannot be used: expected a real tensor": args(delta=delta.to(torch.complex64)),
        r"C: dtype complex64 cannot be used: expected a real tensor \(A is real\)":
            args(C=torch.complex(C[0, 0, :, :4], C[0, 0, :, :4])),
        "B: a variable B must be real here": args(B=torch.complex(B, B)),
        "B": args(B=B[..., :5]),  # the library's own shape check names it
        "delta_bias": args(delta_bias=bias[:3]),
        "has 5 dims": args(B=B[None]),
    }
    for what, a in bad.items():
        with pytest.raises(RuntimeError, match=f"selscan::scan_fwd: .*{what}"):
            scan_op(*a, True, False, False, None)
    with pytest.raises(RuntimeError, match="selscan::scan_fwd: out_z: dtype bfloat16"):
        scan_op(*ts, True, False, False, torch.empty(u.shape, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="selscan::scan_fwd: out_z: given without z"):
        scan_op(*args(z=None), True, False, False, torch.empty(u.shape))


scan_grad_op = torch.ops.selscan.scan_fwd_for_grad.default


def counting(monkeypatch):
    """Records (op, want_x, want_last) of each call of either scan op."""
    calls = []

    def op(*a):
        calls.append(("scan_fwd",) + a[9:11])
        return scan_op(*a)

    def grad_op(*a):
        calls.append(("scan_fwd_for_grad",) + a[9:11])
        return scan_grad_op(*a)

    monkeypatch.setattr(st, "_scan_op", op)
    monkeypatch.setattr(st, "_scan_grad_op", grad_op)
    return calls


def ctypes_route(monkeypatch):
    monkeypatch.setattr(st, "_scan_op", None)
    monkeypatch.setattr(st, "_scan_grad_op", None)
    monkeypatch.setattr(st, "_scan_bwd_op", None)


@pytest.mark.parametrize("grad", [False, True])
def test_selective_scan_fn_routes_through_the_op(grad, monkeypatch):
    """selective_scan_fn's forward goes through an op, with a gradient (the autograd Function, scan_fwd_for_grad;
    chunk states only past one chunk) and without (scan_fwd, no signature lookup): outputs, last_state and every
    gradient bit-identical to the ctypes route. Inputs the library reads as given and inputs it converts (bf16 D
    and delta_bias, a transposed u and z as MambaMixer hands them)."""
    for L, convert in ((33, False), (2100, False), (40, True)):
        base = make_scan("cpu", torch.bfloat16, G=2, Dm=4, L=L, Bt=1)
        if convert:
            u, delta, A, B, C, D, z, bias = base
            base = [u.transpose(1, 2).contiguous().transpose(1, 2), delta, A, B, C, D.bfloat16(),
                    z.transpose(1, 2).contiguous().transpose(1, 2), bias.bfloat16()]
        for _ in range(2):  # the first call of a signature makes its plan, the second runs it
            outs = {}
            for route in ("op", "ctypes"):
                ts = [None if t is None else t.detach().clone(memory_format=torch.preserve_format)
                      .requires_grad_(grad) for t in base]
                if route == "op":
                    calls = counting(monkeypatch)
                else:
                    ctypes_route(monkeypatch)
                y, last = st.selective_scan_fn(*ts, delta_softplus=True, return_last_state=True)
                grads = torch.autograd.grad(y.float().square().sum(), ts) if grad else ()
                outs[route] = [y, last, *grads]
                monkeypatch.setattr(st, "_scan_op", scan_op)
                monkeypatch.setattr(st, "_scan_grad_op", scan_grad_op)
                monkeypatch.setattr(st, "_scan_bwd_op", scan_bwd_op)
            op = "scan_fwd_for_grad" if grad else "scan_fwd"
            assert calls == [(op, grad and L > 2048, True)], calls
            for i, (a, b) in enumerate(zip(outs["op"], outs["ctypes"])):
                assert a.dtype == b.dtype and torch.equal(a, b), (L, convert, i)


def test_scan_fwd_for_grad_returns_the_inputs_it_read():
    """scan_fwd_for_grad: scan_fwd's outputs (bit-identical), then each input as the library read it: None where
    the argument was read as given, else a new row-major tensor in the library's dtype holding the converted
    values, as the binding converts them."""
    u, delta, A, B, C, D, z, bias = make_scan("cpu", torch.bfloat16, G=2, Dm=4, L=40, Bt=2)
    ready = (u, delta, A, B, C, D, z, bias)
    r = scan_grad_op(*ready, True, False, True)
    same(r[:4], scan_op(*ready, True, False, True, None), "ready inputs")
    assert r[4:] == (None,) * 8, [i for i, t in enumerate(r[4:]) if t is not None]
    strided = (u.transpose(1, 2).contiguous().transpose(1, 2), delta.float(), A.double(),
               B.transpose(2, 3).contiguous().transpose(2, 3), C, D.bfloat16(), z, bias.half())
    r = scan_grad_op(*strided, True, False, True)
    same(r[:4], scan_op(*strided, True, False, True, None), "converted inputs")
    want = (u, delta.float().bfloat16(), A.double().float(), B, None, D.bfloat16().float(), None, bias.half().float())
    for name, got, w in zip(("u", "delta", "A", "B", "C", "D", "z", "delta_bias"), r[4:], want):
        assert (got is None) == (w is None), name
        if w is not None:
            assert got.dtype == w.dtype and got.is_contiguous() and torch.equal(got, w), name
    with pytest.raises(RuntimeError, match="selscan::scan_fwd_for_grad: D: dtype int32 cannot be used"):
        scan_grad_op(u, delta, A, B, C, D.int(), z, bias, True, False, False)


def test_selective_scan_fn_falls_back_where_the_op_refuses(monkeypatch):
    """Complex variable B/C handed as complex: the op refuses them, the binding interleaves them; the result is
    the ctypes route's."""
    u, delta, A, B, C, D, z, bias = make_scan("cpu", torch.float32, cplx=True)
    Bc, Cc = interleaved_to_complex_t(B), interleaved_to_complex_t(C)
    calls = counting(monkeypatch)
    got = st.selective_scan_fn(u, delta, A, Bc, Cc, D, z, bias, True)
    assert len(calls) == 1  # tried, refused
    ctypes_route(monkeypatch)
    want = st.selective_scan_fn(u, delta, A, Bc, Cc, D, z, bias, True)
    assert torch.equal(got, want)


def interleaved_to_complex_t(t):
    return torch.view_as_complex(t.unflatten(-1, (t.shape[-1] // 2, 2)).contiguous())


def test_scan_route_unless_opted_out():
    """selscan.torch takes the op where the library loads, also with SELSCAN_TORCH_STABLE=1; =0 at import keeps
    the ctypes route."""
    code = ("import selscan.torch as st\n"
            "print(st._scan_op is not None, st._scan_grad_op is not None, st._scan_bwd_op is not None)\n")
    env = dict(os.environ)
    for choice, expected in ((None, "True"), ("1", "True"), ("0", "False")):
        env.pop("SELSCAN_TORCH_STABLE", None)
        if choice is not None:
            env["SELSCAN_TORCH_STABLE"] = choice
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [expected] * 3, (choice, r.stdout)


@needs_cuda
def test_scan_cuda_on_the_current_stream():
    """CUDA tensors with a side stream current: the op allocates and enqueues on it (the same values as the
    ctypes route on that stream)."""
    side = torch.cuda.Stream()
    for what, kw in scan_cases():
        with torch.cuda.stream(side):
            ts = make_scan("cuda", torch.bfloat16, **kw)
            got = scan_op(*ts, True, True, True, None)
            want = binding_fwd(ts, True, True, True)
            side.synchronize()
        same(got, want, what)


scan_bwd_op = torch.ops.selscan.scan_bwd.default
GRADS = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")


def same_grads(got, want, what):
    for name, g, w in zip(GRADS, got, want):
        assert (g is None) == (w is None), f"{what}: {name} present {g is not None}, expected {w is not None}"
        if g is not None:
            assert g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous(), f"{what}: {name}"
            assert torch.equal(g, w), f"{what}: {name} differs"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scan_bwd_matches_the_binding_bit_for_bit(device, dtype):
    """scan_bwd on a forward's saved tensors: every gradient bit-identical to the binding's backward plan
    (_fast_bwd: the same library call), in the dtype and shape it allocates, deterministic or not, with dout
    row-major, strided in L, or in another dtype (rounded to u's)."""
    for what, kw in scan_cases():
        ts = make_scan(device, dtype, **kw)
        u, z = ts[0], ts[6]
        long = u.shape[-1] > 2048
        out, _, x, _ = scan_op(*ts, True, long, False, None)
        out = out if z is not None else None
        g = torch.Generator().manual_seed(7)
        dout = torch.randn(u.shape, generator=g).to(dtype).to(device)
        douts = (("rows", dout), ("strided", dout.transpose(1, 2).contiguous().transpose(1, 2)),
                 ("float64", dout.double()))
        for (name, d), det in zip(douts, (False, True, False)):
            label = f"{what} dout={name} deterministic={det}"
            # A dout in another dtype: the op rounds it to u's, the binding's plan takes only u's.
            want = st._fast_bwd(d.to(dtype), *ts, x, out, True, det)
            assert want is not None, label
            same_grads(scan_bwd_op(d, *ts, x, out, True, det), want, label)


def test_scan_bwd_against_float64():
    """scan_bwd's gradients (fp32 inputs, variable B/C in two groups) against central differences of the float64
    reference scan (reference.py)."""
    ts = make_scan("cpu", torch.float32, G=2, Dm=4, L=12, N=3)
    out, _, _, _ = scan_op(*ts, True, False, False, None)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    got = scan_bwd_op(dout, *ts, None, out, True, False)
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    c = {n: t.double().numpy().copy() for n, t in zip(names, ts)}
    dout64 = dout.double().numpy()

    def loss():
        return float((ref_scan(*(c[n] for n in names), delta_softplus=True)[1] * dout64).sum())

    want = fd_grads(loss, c)
    for name, g in zip(names, got):
        np.testing.assert_allclose(g.double().numpy(), want[name], rtol=1e-4, atol=1e-4, err_msg="d" + name)


def test_scan_bwd_errors_name_the_argument():
    u, delta, A, B, C, D, z, bias = ts = make_scan("cpu", torch.bfloat16, G=2, Dm=4, L=40)
    out = scan_op(*ts, True, False, False, None)[0]
    dout = torch.randn(u.shape).bfloat16()
    with pytest.raises(RuntimeError, match="selscan::scan_bwd: D: dtype int32 cannot be used"):
        scan_bwd_op(dout, u, delta, A, B, C, D.int(), z, bias, None, out, True, False)
    with pytest.raises(RuntimeError, match="dout"):
        scan_bwd_op(dout[:, :, :39], u, delta, A, B, C, D, z, bias, None, out, True, False)
    with pytest.raises(RuntimeError, match="out"):
        scan_bwd_op(dout, u, delta, A, B, C, D, z, bias, None, None, True, False)
