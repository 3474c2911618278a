"""selscan.torch: the drop-in autograd op (CPU and CUDA tensors), its custom-op registration and torch.compile.
Skipped when torch is not installed; the CUDA tests also when no usable CUDA device or a CPU-only library."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (selscan.torch tests need it)")

import selscan  # noqa: E402
from selscan.torch import SelectiveScanFn, selective_scan_fn  # noqa: E402
from conftest import torch_cuda_skip_reason  # noqa: E402

TOL = {torch.float32: (6e-4, 2e-3), torch.float16: (3e-3, 5e-3), torch.bfloat16: (3e-2, 5e-2)}


needs_cuda = pytest.mark.skipif(torch_cuda_skip_reason() is not None, reason=str(torch_cuda_skip_reason()))


def make(device="cpu", dtype=torch.float32, Bt=2, Dm=4, L=33, N=8, G=1, var_B=True, var_C=True, cplx=False,
         opt=True, seed=0, three_d=False):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g)

    u = r(Bt, Dm, L).to(dtype)
    delta = (0.5 * torch.rand(Bt, Dm, L, generator=g)).to(dtype)
    A = -0.5 * torch.rand(Dm, N, generator=g)
    if cplx:
        A = torch.complex(A, r(Dm, N))
    Lbc = 2 * L if cplx else L

    def bc(var):
        if var:
            return (r(Bt, N, Lbc) if three_d else r(Bt, G, N, Lbc)).to(dtype)
        return torch.complex(r(Dm, N), r(Dm, N)) if cplx else r(Dm, N)

    B, C = bc(var_B), bc(var_C)
    D = r(Dm) if opt else None
    z = r(Bt, Dm, L).to(dtype) if opt else None
    bias = 0.5 * torch.rand(Dm, generator=g) if opt else None
    ts = [u, delta, A, B, C, D, z, bias]
    return [None if t is None else t.to(device) for t in ts]


def np_of(t):
    if t is None:
        return None
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def leaf(ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


def close(name, got, ref, rtol, atol):
    got, ref = got.detach().cpu(), ref.detach().cpu()
    if got.is_complex():
        got, ref = torch.view_as_real(got), torch.view_as_real(ref.to(got.dtype))
    assert got.shape == ref.shape, f"{name}: {tuple(got.shape)} vs {tuple(ref.shape)}"
    torch.testing.assert_close(got.double(), ref.double(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# ------------------------------------------------------------------------------------------- CPU tensors
@pytest.mark.parametrize("cplx", [False, True])
@pytest.mark.parametrize("var", [(True, True), (False, False), (True, False)])
def test_cpu_tensors_match_numpy_path(cplx, var):
    ts = make(cplx=cplx, var_B=var[0], var_C=var[1], seed=3)
    y, last = selective_scan_fn(*ts, delta_softplus=True, return_last_state=True)
    ny, nlast = selscan.selective_scan_fn(*[np_of(t) for t in ts], delta_softplus=True, return_last_state=True)
    np.testing.assert_array_equal(y.numpy(), ny)
    np.testing.assert_array_equal(last.numpy(), nlast)
    assert not last.requires_grad


@pytest.mark.parametrize("cplx", [False, True])
@pytest.mark.parametrize("three_d", [False, True])
def test_autograd_matches_numpy_bwd(cplx, three_d):
    ts = leaf(make(cplx=cplx, three_d=three_d, seed=4))
    y = selective_scan_fn(*ts, delta_softplus=True)
    dout = torch.randn_like(y)
    (y * dout).sum().backward()
    ref = selscan.selective_scan_bwd(np_of(dout), *[np_of(t) for t in ts], delta_softplus=True)
    for t, k in zip(ts, ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")):
        assert t.grad is not None, k
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype, k
        np.testing.assert_array_equal(t.grad.numpy(), ref[k], err_msg=k)


def test_selective_scan_fn_class_apply_like_upstream():
    ts = leaf(make(seed=5))
    y1 = SelectiveScanFn.apply(*ts, True, False)
    y1.sum().backward()
    g1 = [t.grad.clone() for t in ts]
    ts2 = leaf(ts)
    y2 = selective_scan_fn(*ts2, delta_softplus=True)
    y2.sum().backward()
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    for a, b in zip(g1, ts2):
        torch.testing.assert_close(a, b.grad, rtol=0, atol=0)


def test_absent_optionals_and_return_types():
    u, delta, A, B, C, _, _, _ = leaf(make(opt=False, seed=6))
    y = selective_scan_fn(u, delta, A, B, C)
    assert isinstance(y, torch.Tensor) and y.shape == u.shape
    y, last = selective_scan_fn(u, delta, A, B, C, return_last_state=True)
    assert last.shape == (u.shape[0], u.shape[1], A.shape[1]) and last.dtype == torch.float32
    y.square().sum().backward()
    assert all(t.grad is not None for t in (u, delta, A, B, C))


def test_error_is_selscan_error():
    u, delta, A, B, C, *_ = make(seed=7)
    with pytest.raises(selscan.SelscanError, match="delta"):
        selective_scan_fn(u, delta[:, :, :3], A, B, C)
    with pytest.raises(selscan.SelscanError, match="dtype"):
        selective_scan_fn(u.double(), delta, A, B, C)


def test_custom_op_opcheck():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    ts = make(seed=8, L=20)
    for req in (False, True):
        args = leaf(ts) if req else ts
        torch.library.opcheck(torch.ops.selscan.selective_scan_fwd.default, tuple(args) + (True,))
    u, delta, A, B, C, D, z, bias = ts
    out, out_z, x, last = torch.ops.selscan.selective_scan_fwd(u, delta, A, B, C, D, z, bias, True)
    torch.library.opcheck(torch.ops.selscan.selective_scan_bwd.default,
                          (torch.randn_like(u), u, delta, A, B, C, D, z, bias, x, out, True, False))


def test_torch_compile_fullgraph_no_graph_break():
    ts = make(seed=9)

    def f(u, delta, A, B, C, D, z, bias):
        y = selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True)
        return (y * y).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    a, b = leaf(ts), leaf(ts)
    l_eager = f(*a)
    l_eager.backward()
    l_comp = compiled(*b)
    l_comp.backward()
    torch.testing.assert_close(l_comp, l_eager)
    for x, y in zip(a, b):
        torch.testing.assert_close(y.grad, x.grad)


# ------------------------------------------------------------------------------------------- CUDA tensors
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cplx", [False, True])
def test_cuda_matches_cpu(dtype, cplx):
    if cplx and dtype != torch.float32:
        pytest.skip("complex is covered in fp32")
    cpu = leaf(make(dtype=dtype, cplx=cplx, L=300, seed=10))
    gpu = leaf([None if t is None else t.detach().cuda() for t in cpu])
    yc, lc = selective_scan_fn(*cpu, delta_softplus=True, return_last_state=True)
    yg, lg = selective_scan_fn(*gpu, delta_softplus=True, return_last_state=True)
    assert yg.is_cuda and yg.dtype == dtype
    rtol, atol = TOL[dtype]
    close("out", yg, yc, rtol, atol)
    close("last_state", lg, lc, rtol, atol)
    dout = torch.randn_like(yc)
    (yc * dout).sum().backward()
    (yg * dout.cuda()).sum().backward()
    for k, a, b in zip(("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias"), cpu, gpu):
        scale = max(1.0, float(a.grad.abs().max()))
        close(k, b.grad, a.grad, 5 * rtol, 10 * atol * scale)


@needs_cuda
def test_cuda_long_sequence_two_chunks():
    cpu = leaf(make(L=4100, Bt=1, Dm=8, seed=11))
    gpu = leaf([t.detach().cuda() for t in cpu])
    yc = selective_scan_fn(*cpu, delta_softplus=True)
    yg = selective_scan_fn(*gpu, delta_softplus=True)
    close("out", yg, yc, *TOL[torch.float32])
    yc.sum().backward()
    yg.sum().backward()
    for k, a, b in zip(("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias"), cpu, gpu):
        close(k, b.grad, a.grad, 5e-3, 5e-3 * max(1.0, float(a.grad.abs().max())))


@needs_cuda
def test_cuda_side_stream_and_device_index():
    """Work goes on torch's current stream: results read after that stream (and only it) synchronises."""
    ts = make(L=2000, Dm=64, seed=12, device="cuda")
    ref = selective_scan_fn(*ts, delta_softplus=True)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = selective_scan_fn(*ts, delta_softplus=True)
        y2 = y * 1.0  # stream-ordered consumer
    s.synchronize()
    torch.testing.assert_close(y2, ref, rtol=0, atol=0)
    if torch.cuda.device_count() > 1:
        ts1 = [t.to("cuda:1") for t in ts]
        y1 = selective_scan_fn(*ts1, delta_softplus=True)
        assert y1.device == torch.device("cuda:1")
        torch.testing.assert_close(y1.cpu(), ref.cpu(), rtol=0, atol=0)


@needs_cuda
def test_cuda_compile_inductor():
    ts = make(device="cuda", seed=13)

    def f(u, delta, A, B, C, D, z, bias):
        return selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True).float().square().mean()

    compiled = torch.compile(f, fullgraph=True)
    a, b = leaf(ts), leaf(ts)
    f(*a).backward()
    compiled(*b).backward()
    for x, y in zip(a, b):
        torch.testing.assert_close(y.grad, x.grad)


@needs_cuda
def test_cuda_generic_api_with_torch_tensors():
    """selscan.selective_scan_fn/bwd (no autograd) accept torch CUDA tensors and return torch CUDA tensors."""
    ts = make(device="cuda", seed=14)
    y = selscan.selective_scan_fn(*ts, delta_softplus=True)
    assert isinstance(y, torch.Tensor) and y.is_cuda
    g = selscan.selective_scan_bwd(torch.ones_like(y), *ts, delta_softplus=True)
    assert g["dA"].is_cuda and g["dB"].shape == ts[3].shape
    ref = selscan.selective_scan_bwd(np.ones(y.shape, np.float32), *[np_of(t) for t in ts], delta_softplus=True)
    for k in ("du", "dA", "dB", "dD"):
        scale = max(1.0, float(np.abs(ref[k]).max()))
        close(k, g[k], torch.from_numpy(ref[k]), 5e-3, 5e-3 * scale)
