"""The per-call fast path (call plans cached per signature, python/selscan/_plan.py) against the general path:
same bits, plans really reused, stale pointers never used, per-thread plans, and the inputs models really pass
(transposed views, bf16 parameters). CUDA graph capture and torch.compile(mode="reduce-overhead") on a GPU."""

import threading

import numpy as np
import pytest

import selscan
from selscan import _plan


@pytest.fixture
def general_path():
    """Runs the body with the fast path off."""
    _plan.ENABLED = False
    try:
        yield
    finally:
        _plan.ENABLED = True


def np_case(seed, Bt=2, Dm=6, L=40, N=5, dtype=np.float32, z=True):
    r = np.random.default_rng(seed)
    u = r.standard_normal((Bt, Dm, L)).astype(dtype)
    delta = (0.5 * r.random((Bt, Dm, L))).astype(dtype)
    A = (-0.5 * r.random((Dm, N))).astype(np.float32)
    B = r.standard_normal((Bt, N, L)).astype(dtype)
    C = r.standard_normal((Bt, 1, N, L)).astype(dtype)
    D = r.standard_normal(Dm).astype(np.float32)
    zz = r.standard_normal((Bt, Dm, L)).astype(dtype) if z else None
    bias = (0.5 * r.random(Dm)).astype(np.float32)
    return u, delta, A, B, C, D, zz, bias


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_numpy_fast_path_matches_general_path(dtype):
    _plan.cache("xp_fwd").clear()
    for seed in (1, 2):  # the second call reuses the plan with other arrays: no stale pointer may be used
        ts = np_case(seed, dtype=dtype)
        y, last = selscan.selective_scan_fn(*ts, delta_softplus=True, return_last_state=True)
        _plan.ENABLED = False
        try:
            y_ref, last_ref = selscan.selective_scan_fn(*ts, delta_softplus=True, return_last_state=True)
        finally:
            _plan.ENABLED = True
        np.testing.assert_array_equal(y, y_ref)
        np.testing.assert_array_equal(last, last_ref)
        assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    plans = [p for p in _plan.cache("xp_fwd").values() if p is not None]
    assert len(plans) == 1, "the second call should have reused the first call's plan"


def test_numpy_unsupported_layouts_take_the_general_path():
    u, delta, A, B, C, D, z, bias = np_case(3)
    ref = selscan.selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    # float64 input, a strided last dimension, a negative stride: converted by the general path, same result
    for args in ((u.astype(np.float64), delta, A, B, C, D, z, bias),
                 (u, delta, A, np.ascontiguousarray(B.transpose(0, 2, 1)).transpose(0, 2, 1), C, D, z, bias),
                 (u, delta, A, B, C, np.ascontiguousarray(D[::-1])[::-1], z, bias)):
        np.testing.assert_array_equal(selscan.selective_scan_fn(*args, delta_softplus=True), ref)


def test_numpy_plans_are_per_thread():
    cases = [np_case(10 + i) for i in range(4)]
    refs = [selscan.selective_scan_fn(*c, delta_softplus=True) for c in cases]
    errors = []

    def worker(i):
        try:
            for _ in range(50):
                np.testing.assert_array_equal(selscan.selective_scan_fn(*cases[i], delta_softplus=True), refs[i])
        except AssertionError as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ------------------------------------------------------------------------------------------- torch
torch = pytest.importorskip("torch", reason="torch is not installed (the torch fast-path tests need it)")
from selscan.torch import selective_scan_fn  # noqa: E402
from conftest import torch_cuda_skip_reason  # noqa: E402

needs_cuda = pytest.mark.skipif(torch_cuda_skip_reason() is not None, reason=str(torch_cuda_skip_reason()))

import selscan.torch as sst  # noqa: E402

# A training step's two routes: the op library's selscan::scan_fwd_for_grad and selscan::scan_bwd where it loads
# (no call plan at all), else the forward's call plan and the backward's plan keyed by it.
ROUTES = ["plan", pytest.param("op", marks=pytest.mark.skipif(
    sst._scan_grad_op is None or sst._scan_bwd_op is None,
    reason="the op library selscan_torch_ops is not loaded (-DSELSCAN_TORCH_OPS=ON)"))]


def take_route(route, monkeypatch):
    if route == "plan":
        monkeypatch.setattr(sst, "_scan_grad_op", None)
        monkeypatch.setattr(sst, "_scan_bwd_op", None)


def torch_case(seed, device="cpu", dtype=torch.float32, Bt=2, Dm=6, L=40, N=5, transposed=False, param_dtype=None):
    """MambaMixer's call: with transposed=True, u/z/B/C are transposed views (stride(-1) != 1) as the model
    passes them; param_dtype gives D and delta_bias another dtype than float32 (a model kept in bf16)."""
    g = torch.Generator().manual_seed(seed)
    if transposed:
        u = torch.randn(Bt, L, Dm, generator=g).to(dtype).transpose(1, 2)
        z = torch.randn(Bt, L, Dm, generator=g).to(dtype).transpose(1, 2)
        B = torch.randn(Bt, L, N, generator=g).to(dtype).transpose(1, 2)
        C = torch.randn(Bt, L, N, generator=g).to(dtype).transpose(1, 2)
    else:
        u = torch.randn(Bt, Dm, L, generator=g).to(dtype)
        z = torch.randn(Bt, Dm, L, generator=g).to(dtype)
        B = torch.randn(Bt, N, L, generator=g).to(dtype)
        C = torch.randn(Bt, 1, N, L, generator=g).to(dtype)
    delta = (0.5 * torch.rand(Bt, Dm, L, generator=g)).to(dtype)
    A = -0.5 * torch.rand(Dm, N, generator=g)
    D = torch.randn(Dm, generator=g).to(param_dtype or torch.float32)
    bias = (0.5 * torch.rand(Dm, generator=g)).to(param_dtype or torch.float32)
    return [t.to(device) for t in (u, delta, A, B, C, D, z, bias)]


def leaf(ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


def fwd_bwd(ts, seed=0):
    ts = leaf(ts)
    y, last = selective_scan_fn(*ts, delta_softplus=True, return_last_state=True)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y)
    grads = torch.autograd.grad(y, ts, dy)
    return [y, last] + list(grads)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("param_dtype", [None, torch.bfloat16])
def test_torch_fast_path_matches_general_path(transposed, param_dtype, route, monkeypatch):
    take_route(route, monkeypatch)
    for kind in ("torch_fwd", "torch_bwd"):
        _plan.cache(kind).clear()
    for seed in (1, 2):
        ts = torch_case(seed, transposed=transposed, param_dtype=param_dtype)
        got = fwd_bwd(ts, seed)
        _plan.ENABLED = False
        try:
            ref = fwd_bwd(ts, seed)
        finally:
            _plan.ENABLED = True
        for i, (a, b) in enumerate(zip(got, ref)):
            assert a.dtype == b.dtype and a.shape == b.shape, i
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"output {i}: {m}")
        assert got[2 + 5].dtype == (param_dtype or torch.float32)  # dD in D's dtype
    for kind, want in (("torch_fwd", 1 if route == "plan" else 0), ("torch_bwd", 1 if route == "plan" else 0)):
        plans = [p for p in _plan.cache(kind).values() if p is not None]
        assert len(plans) == want, f"{kind}: expected {want} reused plan(s), got {len(plans)}"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", ["plain", "transposed", "no_z", "no_D_bias", "constant_BC", "long", "complex"])
def test_torch_scan_plan_path_matches_general(monkeypatch, case, route):
    """A signature's second call runs forward and backward through plans only (the general implementations
    forbidden, and on the plan route the signature-keyed backward lookup too: the forward's plan keys the
    backward's), or through the two ops only (every plan lookup forbidden): y, last_state and every gradient
    bitwise equal to the general path's, for inputs that exercise each tensor's place (absent D / delta_bias / z,
    2-D B/C, L past one chunk so that the chunk states are read back, complex A, a dy whose last stride is not 1)."""
    take_route(route, monkeypatch)
    L = 2100 if case == "long" else 40
    ts = torch_case(31, L=L, N=3 if case == "long" else 5, Dm=4 if case == "long" else 6,
                    transposed=case == "transposed", param_dtype=torch.bfloat16 if case == "transposed" else None)
    u, delta, A, B, C, D, z, bias = ts
    if case == "no_z":
        z = None
    if case == "no_D_bias":
        D = bias = None
    if case == "constant_BC":
        B, C = B[0, :, 0].expand(u.shape[1], -1).contiguous() + 0.5, C[0, 0, :, 0].expand(u.shape[1], -1) * 0.7
    if case == "complex":
        A = torch.complex(A, 0.3 * torch.ones_like(A))
        B = torch.randn(u.shape[0], 1, A.shape[1], 2 * L, generator=torch.Generator().manual_seed(3))
        C = torch.randn(u.shape[0], A.shape[1], 2 * L, generator=torch.Generator().manual_seed(5))
    ts = [None if t is None else t.detach().clone().requires_grad_(True) for t in (u, delta, A, B, C, D, z, bias)]
    given = [t for t in ts if t is not None]
    dy = torch.randn(u.shape[0], L, u.shape[1], generator=torch.Generator().manual_seed(4)).transpose(1, 2)

    def run():
        y, last = selective_scan_fn(*ts, delta_softplus=True, return_last_state=True)
        return [y, last] + list(torch.autograd.grad(y, given, dy))

    _plan.ENABLED = False
    try:
        want = run()
    finally:
        _plan.ENABLED = True
    for kind in ("torch_fwd", "torch_bwd"):
        _plan.cache(kind).clear()
    run()  # makes the plans

    def forbidden(*a, **k):
        raise AssertionError("the general path ran")

    op_route = route == "op"
    for name in ("_fwd_impl", "_bwd_impl", "_fast_fwd", "_fast_bwd") + (("_fwd_plan", "_run_bwd") if op_route else ()):
        monkeypatch.setattr(sst, name, forbidden)
    got = run()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), i
    for kind, n in (("torch_fwd", 0 if op_route else 1), ("torch_bwd", 0 if op_route else 1)):
        assert len([p for p in _plan.cache(kind).values() if p is not None]) == n, kind


def test_torch_missing_required_is_selscan_error():
    u, delta, A, B, C, D, z, bias = torch_case(11)
    for i, name in ((1, "delta"), (2, "A"), (3, "B"), (4, "C")):
        args = [u, delta, A, B, C, D, z, bias]
        args[i] = None
        with pytest.raises(selscan.SelscanError, match=f"{name} is required"):
            selective_scan_fn(*args)


def test_torch_inference_needs_no_autograd_node():
    ts = torch_case(5)
    with torch.no_grad():
        y = selective_scan_fn(*leaf(ts), delta_softplus=True)
    assert y.grad_fn is None
    y2 = selective_scan_fn(*ts, delta_softplus=True)  # no input requires grad
    assert y2.grad_fn is None
    torch.testing.assert_close(y, y2, rtol=0, atol=0)


def test_autograd_call_without_function_apply_layer(monkeypatch):
    """selective_scan_fn's autograd call through _FunctionBase.apply (sst._scan_apply) builds the same node as
    _ScanFn.apply and gives the same outputs and gradients, also with a dead functorch wrapper as u (unwrapped as
    Function.apply unwraps it); under a functorch transform it is Function.apply's own error."""
    assert sst._scan_apply is not None, "this torch has _FunctionBase.apply and unwrap_if_dead"
    ts = torch_case(9)
    leaked = []

    def escape(x):
        leaked.append(x)
        return (2 * x).sum()

    torch.func.grad(escape)(ts[0].clone())
    dead = leaked[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(dead)
    results = {}
    for route in ("direct", "apply"):
        if route == "apply":
            monkeypatch.setattr(sst, "_scan_apply", None)
        for u_kind in ("plain", "dead"):
            lv = leaf(ts)
            u = lv[0] if u_kind == "plain" else dead
            y, last = selective_scan_fn(u, *lv[1:], delta_softplus=True, return_last_state=True)
            assert type(y.grad_fn).__name__ == "_ScanFnBackward", route
            saved_u = y.grad_fn.saved_tensors[0]
            assert not torch._C._functorch.is_functorch_wrapped_tensor(saved_u), (route, u_kind)  # unwrapped
            results[route, u_kind] = [y, last] + list(torch.autograd.grad(y.square().sum(), lv[1:]))
    for u_kind in ("plain", "dead"):
        for i, (a, b) in enumerate(zip(results["direct", u_kind], results["apply", u_kind])):
            assert torch.equal(a, b), (u_kind, i)
    for i, (a, b) in enumerate(zip(results["direct", "dead"], results["direct", "plain"])):
        assert torch.equal(a, b), i  # the dead wrapper holds u's values
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda u: selective_scan_fn(u, *ts[1:], delta_softplus=True).sum())(ts[0].clone())


def test_direct_apply_falls_back_for_setup_context():
    """A Function with setup_context (which Function.apply treats differently) keeps Function.apply."""

    class WithSetup(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return 2 * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    assert sst.direct_apply(WithSetup) == WithSetup.apply
    x = torch.randn(3, requires_grad=True)
    y = sst.direct_apply(WithSetup)(x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


@pytest.fixture
def deterministic():
    """Bitwise comparisons of backward results need the library's deterministic reductions."""
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@needs_cuda
def test_cuda_fast_path_matches_general_path(deterministic):
    ts = torch_case(7, device="cuda", dtype=torch.bfloat16, Dm=64, L=300, N=16, transposed=True)
    got = fwd_bwd(ts, 7)
    _plan.ENABLED = False
    try:
        ref = fwd_bwd(ts, 7)
    finally:
        _plan.ENABLED = True
    for i, (a, b) in enumerate(zip(got, ref)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"output {i}: {m}")


@needs_cuda
def test_cuda_graph_capture_forward_and_backward(deterministic):
    """A captured forward+backward replays on new input data and matches eager calls."""
    ts = leaf(torch_case(8, device="cuda", dtype=torch.bfloat16, Dm=64, L=256, N=16))
    static = [t.detach().clone().requires_grad_(True) for t in ts]
    dy = torch.randn_like(ts[0])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up plans and the allocator off the capture
        for _ in range(2):
            y = selective_scan_fn(*static, delta_softplus=True)
            torch.autograd.grad(y, static, dy)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = selective_scan_fn(*static, delta_softplus=True)
        g_static = torch.autograd.grad(y_static, static, dy)
    fresh = torch_case(9, device="cuda", dtype=torch.bfloat16, Dm=64, L=256, N=16)
    with torch.no_grad():
        for dst, src in zip(static, fresh):
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    ref = leaf(fresh)
    y_ref = selective_scan_fn(*ref, delta_softplus=True)
    g_ref = torch.autograd.grad(y_ref, ref, dy)
    torch.testing.assert_close(y_static, y_ref, rtol=0, atol=0)
    for a, b in zip(g_static, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_cuda
def test_cuda_compile_reduce_overhead():
    ts = torch_case(10, device="cuda", dtype=torch.bfloat16, Dm=64, L=128, N=16)

    def f(*a):
        return selective_scan_fn(*a, delta_softplus=True)

    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # the first calls record, later ones replay the graph
        y = compiled(*ts)
    torch.testing.assert_close(y.clone(), f(*ts), rtol=0, atol=0)
