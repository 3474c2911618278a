"""selscan.torch.mamba_inner_fn (mamba_ssm's fused Mamba-1 layer on the library's conv1d and scan) against a
float64 reference written here from the layer's math (the conv and the scan as explicit loops): the output and
every gradient, with and without each optional piece; that the backward recomputes the conv output and delta
instead of saving them; CUDA tensors where available (skipped with the reason otherwise).

Tolerances: the library computes in float32 (unit roundoff 6e-8) and the reference in float64. The largest chain
is L <= 33 scan steps, each an exp, a multiply-add and an N <= 16-term reduction, inside reductions over at most
B*L = 66 positions and D = 16 channels for the weight gradients: a few thousand roundings of quantities of the
output's size, so errors stay below 1e-5 of the largest magnitude (measured); 2e-4 of it leaves a 20x margin
while a gradient off by 1e-3 relative fails. 16-bit activations round every stored value (xz, conv output, delta,
B, C, the scan's outputs; unit roundoff 2^-9 fp16, 2^-8 bf16): held to 1e-2 (fp16, measured 2e-3) and 4e-2
(bf16, measured 2e-2) of the largest magnitude.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from selscan import _lib  # noqa: E402
from selscan.torch import mamba_inner_fn  # noqa: E402
from selscan._lib import SelscanError  # noqa: E402
from conftest import torch_cuda_skip_reason  # noqa: E402

needs_conv1d = pytest.mark.skipif(not hasattr(_lib.lib, "selscan_conv1d_fwd"),
                                  reason=f"{_lib.library_path} has no selscan_conv1d_fwd (built before ABI 0.5)")
_cuda_reason = torch_cuda_skip_reason()
needs_cuda = pytest.mark.skipif(_cuda_reason is not None, reason=str(_cuda_reason))
pytestmark = needs_conv1d

NAMES = ("xz", "conv1d_weight", "conv1d_bias", "x_proj_weight", "delta_proj_weight", "out_proj_weight",
         "out_proj_bias", "A", "B", "C", "D", "delta_bias", "B_proj_bias", "C_proj_bias", "b_rms_weight",
         "c_rms_weight", "dt_rms_weight")


# ------------------------------------------------------------------------------------------------ reference
def _rms_ref(x, w, eps, dim):
    shape = [1] * x.dim()
    shape[dim % x.dim()] = -1
    return x * torch.rsqrt(x.square().mean(dim, keepdim=True) + eps) * w.reshape(shape)


def reference(t, softplus=True, eps=1e-6):
    """The layer in float64 (complex128 for complex A) from t (name -> tensor or None), written from the math."""
    xz = t["xz"]
    bt, d2, L = xz.shape
    dm = d2 // 2
    x, z = xz[:, :dm], xz[:, dm:]
    w = t["conv1d_weight"].reshape(dm, -1)
    W = w.shape[1]
    conv = torch.zeros_like(x)
    for k in range(W):  # out[l] = sum_k w[k] x[l - (W-1) + k], x before 0 being 0
        s = W - 1 - k
        conv[:, :, s:] = conv[:, :, s:] + w[:, k, None] * x[:, :, :L - s]
    if t["conv1d_bias"] is not None:
        conv = conv + t["conv1d_bias"][:, None]
    conv = conv * torch.sigmoid(conv)
    A = t["A"]
    cplx = A.is_complex()
    N = A.shape[1]
    ds = N * (2 if cplx else 1)
    R = t["delta_proj_weight"].shape[1]
    x_dbl = torch.einsum("kd,bdl->bkl", t["x_proj_weight"], conv)
    delta = torch.einsum("dr,brl->bdl", t["delta_proj_weight"], x_dbl[:, :R])
    if t["dt_rms_weight"] is not None:
        delta = _rms_ref(delta, t["dt_rms_weight"], eps, 1)

    def bc(name, lo, pbias, rms):
        if t[name] is not None:
            v = t[name]
            if t[rms] is not None:
                v = _rms_ref(v, t[rms], eps, -1 if v.dim() == 2 else -2)
            return v if v.dim() == 2 else v[:, 0]  # (D, N) or (batch, N, L)
        v = x_dbl[:, lo:lo + ds]
        if t[pbias] is not None:
            v = v + t[pbias][:, None]
        if t[rms] is not None:
            v = _rms_ref(v, t[rms], eps, 1)
        if cplx:  # rows are (state, re/im) pairs
            v = torch.complex(v[:, 0::2], v[:, 1::2])
        return v

    Bm = bc("B", R, "B_proj_bias", "b_rms_weight")
    Cm = bc("C", x_dbl.shape[1] - ds, "C_proj_bias", "c_rms_weight")
    if t["delta_bias"] is not None:
        delta = delta + t["delta_bias"][:, None]
    if softplus:
        delta = F.softplus(delta)
    h = torch.zeros(bt, dm, N, dtype=A.dtype)
    ys = []
    for i in range(L):
        dl = delta[:, :, i, None]
        b_i = Bm[None] if Bm.dim() == 2 else Bm[:, None, :, i]
        c_i = Cm[None] if Cm.dim() == 2 else Cm[:, None, :, i]
        h = torch.exp(dl * A) * h + dl * b_i * conv[:, :, i, None]
        y = (h * c_i).sum(-1)
        ys.append(2 * y.real if cplx else y)
    y = torch.stack(ys, 2)
    if t["D"] is not None:
        y = y + t["D"][:, None] * conv
    y = y * z * torch.sigmoid(z)
    out = torch.einsum("bdl,ed->ble", y, t["out_proj_weight"])
    if t["out_proj_bias"] is not None:
        out = out + t["out_proj_bias"]
    return out


# ------------------------------------------------------------------------------------------------ inputs
def make(gen, bt=2, dm=16, L=33, N=8, R=4, W=4, E=12, cplx=False, optional=True, rms=False, proj_bias=False,
         given_B=None, given_C=None):
    """Random float64 inputs at scales that keep the layer well conditioned (softplus'd delta ~ 0.1-1, decaying
    states). given_B / given_C: None (projected), "const" (dim, dstate) or "var" (batch, 1, dstate, seqlen)."""
    def rn(*s, scale=1.0):
        return torch.randn(*s, generator=gen, dtype=torch.float64) * scale

    ds = N * (2 if cplx else 1)
    K = R + (ds if given_B is None else 0) + (ds if given_C is None else 0)
    t = dict.fromkeys(NAMES)
    t["xz"] = rn(bt, 2 * dm, L)
    t["conv1d_weight"] = rn(dm, 1, W, scale=0.5)
    t["x_proj_weight"] = rn(K, dm, scale=dm ** -0.5)
    t["delta_proj_weight"] = rn(dm, R, scale=R ** -0.5)
    t["out_proj_weight"] = rn(E, dm, scale=dm ** -0.5)
    a = -(0.5 + torch.rand(dm, N, generator=gen, dtype=torch.float64))
    t["A"] = torch.complex(a, rn(dm, N)) if cplx else a
    if optional:
        t["conv1d_bias"] = rn(dm, scale=0.3)
        t["out_proj_bias"] = rn(E, scale=0.3)
        t["D"] = rn(dm)
        t["delta_bias"] = rn(dm, scale=0.3) - 1.0
    if rms:
        t["b_rms_weight"] = 1.0 + rn(N, scale=0.2)
        t["c_rms_weight"] = 1.0 + rn(N, scale=0.2)
        t["dt_rms_weight"] = 1.0 + rn(dm, scale=0.2)
    if proj_bias:
        t["B_proj_bias"] = rn(ds, scale=0.3)
        t["C_proj_bias"] = rn(ds, scale=0.3)
    for name, kind in (("B", given_B), ("C", given_C)):
        if kind == "const":
            t[name] = rn(dm, N)
        elif kind == "var":
            t[name] = rn(bt, 1, N, L)
    return t


def lib_inputs(t, act=torch.float32, device="cpu"):
    """The library's copies: float32 weights (complex64 A), xz (and given variable B / C) in `act`."""
    r = {}
    for name, v in t.items():
        if v is None:
            r[name] = None
            continue
        dt = torch.complex64 if v.is_complex() else (act if name == "xz" or (name in "BC" and v.dim() == 4)
                                                     else torch.float32)
        r[name] = v.detach().to(device=device, dtype=dt).requires_grad_(True)
    return r


def call(t, softplus=True, eps=1e-6, lvl=1):
    return mamba_inner_fn(t["xz"], t["conv1d_weight"], t["conv1d_bias"], t["x_proj_weight"],
                          t["delta_proj_weight"], t["out_proj_weight"], t["out_proj_bias"], t["A"], t["B"], t["C"],
                          t["D"], t["delta_bias"], t["B_proj_bias"], t["C_proj_bias"], softplus, lvl,
                          t["b_rms_weight"], t["c_rms_weight"], t["dt_rms_weight"], eps)


def check(t, rel=2e-4, softplus=True, eps=1e-6, lvl=1, act=torch.float32, device="cpu", seed=0):
    """Output and every present input's gradient of sum(out * g) (g random) against the float64 reference."""
    names = [n for n in NAMES if t[n] is not None]
    ref_in = {n: (v.clone().requires_grad_(True) if v is not None else None) for n, v in t.items()}
    ref = reference(ref_in, softplus, eps)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    ref_grads = torch.autograd.grad((ref * g).sum(), [ref_in[n] for n in names])
    li = lib_inputs(t, act, device)
    out = call(li, softplus, eps, lvl)
    assert out.shape == ref.shape
    grads = torch.autograd.grad((out * g.to(device=device, dtype=out.dtype)).sum(), [li[n] for n in names])

    def close(what, got, want):
        got = got.detach().cpu().to(torch.complex128 if got.is_complex() else torch.float64)
        assert got.shape == want.shape, what
        assert torch.isfinite(torch.view_as_real(got) if got.is_complex() else got).all(), what
        scale = want.abs().max().item()
        err = (got - want).abs().max().item()
        assert err <= rel * max(scale, 1e-3), f"{what}: max error {err:.3g} vs max |ref| {scale:.3g}"

    close("out", out, ref.detach())
    for n, gl, gr in zip(names, grads, ref_grads):
        assert gl.dtype == li[n].dtype, n
        close(f"d{n}", gl, gr)


# ------------------------------------------------------------------------------------------------ tests
CASES = {
    "full": dict(),
    "no_optional": dict(optional=False),
    "rms": dict(rms=True),
    "rms_proj_bias": dict(rms=True, proj_bias=True),
    "proj_bias_small": dict(proj_bias=True, dm=8, L=8, N=4, R=2),
    "B_const": dict(given_B="const"),
    "C_var": dict(given_C="var"),
    "both_given_rms": dict(given_B="var", given_C="const", rms=True),
    "complex_A": dict(cplx=True, N=4, dm=8, L=17),
    "L1": dict(L=1, dm=8, N=4, R=2),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_against_reference(case, seed):
    t = make(torch.Generator().manual_seed(1000 * seed + len(case)), **CASES[case])
    check(t, seed=seed)


@pytest.mark.parametrize("lvl", [0, 1])
def test_checkpoint_levels(lvl):
    check(make(torch.Generator().manual_seed(7), rms=True), lvl=lvl)


def test_no_softplus():
    # delta as projected (may be negative): short sequence, small projections so exp(delta * A) stays bounded.
    t = make(torch.Generator().manual_seed(11), L=8, dm=8, N=4, R=2)
    t["delta_proj_weight"] = t["delta_proj_weight"] * 0.3
    t["delta_bias"] = t["delta_bias"].abs() + 0.5
    check(t, softplus=False)


def test_eps():
    check(make(torch.Generator().manual_seed(12), rms=True), eps=0.5)


@pytest.mark.parametrize("act,rel", [(torch.bfloat16, 4e-2), (torch.float16, 1e-2)])
def test_16bit_activations(act, rel):
    t = make(torch.Generator().manual_seed(13), rms=True)
    check(t, rel=rel, act=act)


def test_autocast_cpu():
    """Under autocast the matmuls run in its dtype (weights float32 as transformers keeps them) and the
    gradients come back in the weights' dtypes."""
    t = make(torch.Generator().manual_seed(14))
    ref = reference(dict(t))
    li = lib_inputs(t, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = call(li)
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    assert li["x_proj_weight"].grad.dtype == torch.float32 and li["xz"].grad.dtype == torch.bfloat16
    err = (out.double() - ref).abs().max().item()
    assert err <= 4e-2 * ref.abs().max().item()


def _saved_numels(lvl):
    bt, dm, L = 2, 16, 20
    t = make(torch.Generator().manual_seed(15), bt=bt, dm=dm, L=L, N=4, R=2, rms=True)
    li = lib_inputs(t)
    sizes = []

    def pack(x):
        sizes.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = call(li, lvl=lvl)
    out.sum().backward()
    assert all(li[n].grad is not None for n in NAMES if li[n] is not None)
    return sizes, bt * dm * L


def test_backward_recomputes_conv_and_delta():
    """The graph keeps one (batch, dim, seqlen) tensor, the scan's pre-gate output; the conv output and delta are
    recomputed. checkpoint_lvl=0 keeps them: the count is able to see them."""
    sizes, bdl = _saved_numels(1)
    assert sizes.count(bdl) == 1, sizes
    assert sizes.count(2 * bdl) == 1, sizes  # xz
    assert sum(s for s in sizes if s >= bdl) == 3 * bdl, sizes
    sizes0, _ = _saved_numels(0)
    assert sizes0.count(bdl) == 3, sizes0


def test_no_grad_matches():
    t = make(torch.Generator().manual_seed(16))
    li = lib_inputs(t)
    with torch.no_grad():
        a = call(li)
    b = call(li)
    assert torch.equal(a, b.detach())


def test_bad_arguments():
    t = lib_inputs(make(torch.Generator().manual_seed(17), dm=8, L=8, N=4, R=2))
    with pytest.raises(SelscanError, match="checkpoint_lvl"):
        call(t, lvl=2)
    bad = dict(t)
    bad["xz"] = t["xz"][:, :15]
    with pytest.raises(SelscanError, match="xz"):
        call(bad)
    bad = dict(t)
    bad["x_proj_weight"] = t["x_proj_weight"][:5]
    with pytest.raises(SelscanError, match="x_proj_weight"):
        call(bad)


@needs_cuda
@pytest.mark.parametrize("case", ["full", "rms_proj_bias", "B_const", "complex_A"])
def test_cuda_against_reference(case):
    t = make(torch.Generator().manual_seed(21), **CASES[case])
    check(t, device="cuda")


def test_long_sequence_chunk_states():
    """A sequence longer than one chunk: the forward saves the chunk states and the scan backward reads them."""
    check(make(torch.Generator().manual_seed(23), L=2100, dm=8, N=4, R=2, rms=True))


@needs_cuda
def test_cuda_bf16_long():
    """Past one chunk with bf16 activations. Without dt_rms_weight: normalising delta over channels divides by
    the norm of a dt_rank-dimensional projection, and at the few of 4200 positions where that projection nearly
    cancels, bf16 rounding of the conv output moves the normalised delta by O(1) (measured on CPU: 0.3 of the
    largest dxz in bf16, 0.14 in fp16, below 1e-5 in fp32); taken for the norm's conditioning, not yet shown
    against a 16-bit mamba_ssm run."""
    t = make(torch.Generator().manual_seed(22), L=2100, dm=16, N=8, R=4)
    check(t, rel=4e-2, act=torch.bfloat16, device="cuda")


def test_transformers_call_shape():
    """As MambaMixer calls it: xz a transposed view of in_proj's output (seqlen not unit-stride), keywords for the
    rest, one tensor as both b_rms_weight and c_rms_weight (its gradient the sum of both uses)."""
    gen = torch.Generator().manual_seed(18)
    t = make(gen, rms=True)
    t["c_rms_weight"] = t["b_rms_weight"]
    hidden = torch.randn(2, 33, 10, generator=gen, dtype=torch.float64)
    w_in = torch.randn(32, 10, generator=gen, dtype=torch.float64) * 10 ** -0.5
    ref_in = {n: (v.clone().requires_grad_(True) if v is not None else None) for n, v in t.items()}
    ref_in["c_rms_weight"] = ref_in["b_rms_weight"]
    w_ref = w_in.clone().requires_grad_(True)
    ref_in["xz"] = F.linear(hidden, w_ref).transpose(1, 2)
    ref = reference(ref_in)
    ref.square().sum().backward()

    li = lib_inputs(t)
    li["c_rms_weight"] = li["b_rms_weight"]
    w_lib = w_in.float().requires_grad_(True)
    xz = F.linear(hidden.float(), w_lib).transpose(1, 2)
    assert xz.stride(-1) != 1
    out = mamba_inner_fn(xz, li["conv1d_weight"], li["conv1d_bias"], li["x_proj_weight"], li["delta_proj_weight"],
                         li["out_proj_weight"], li["out_proj_bias"], li["A"], None, None, li["D"],
                         delta_bias=li["delta_bias"], delta_softplus=True, b_rms_weight=li["b_rms_weight"],
                         c_rms_weight=li["c_rms_weight"], dt_rms_weight=li["dt_rms_weight"], b_c_dt_rms_eps=1e-6)
    out.square().sum().backward()
    for what, got, want in (("out", out, ref), ("d in_proj", w_lib.grad, w_ref.grad),
                            ("d b/c_rms_weight", li["b_rms_weight"].grad, ref_in["b_rms_weight"].grad),
                            ("d dt_rms_weight", li["dt_rms_weight"].grad, ref_in["dt_rms_weight"].grad)):
        err = (got.double() - want).abs().max().item()
        assert err <= 2e-4 * want.abs().max().item(), f"{what}: {err:.3g}"


def test_16bit_weights():
    """A model kept wholly in bf16 (weights in xz's dtype, A / D / delta_bias float32 as MambaMixer makes them):
    gradients in each weight's dtype."""
    t = make(torch.Generator().manual_seed(19))
    ref = reference(dict(t))
    li = lib_inputs(t, torch.bfloat16)
    for n in ("conv1d_weight", "conv1d_bias", "x_proj_weight", "delta_proj_weight", "out_proj_weight",
              "out_proj_bias"):
        li[n] = li[n].detach().bfloat16().requires_grad_(True)
    out = call(li)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    for n in NAMES:
        if li[n] is not None:
            assert li[n].grad is not None and li[n].grad.dtype == li[n].dtype, n
            assert torch.isfinite(li[n].grad).all(), n
    assert (out.double() - ref).abs().max().item() <= 4e-2 * ref.abs().max().item()


def test_layout_copies_and_fused_outputs(monkeypatch):
    """The layer's data movement, counted (not timed): with xz as transformers passes it (in_proj's output
    transposed), the forward and backward copy xz once (made L-contiguous, as upstream) and nothing else of that
    size. conv, x_dbl, delta, out_z, dy, du and ddelta are (rows, batch*L) GEMM operands the kernels read and write
    in place,
    the scan writes dz into dxz and recomputes out_z itself, the conv writes dx into dxz: the general scan path,
    which would need copies, must not run."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from selscan import torch as sst
    t = make(torch.Generator().manual_seed(21), bt=2, dm=16, L=24, N=8, R=4, E=12)
    li = lib_inputs(t, act=torch.bfloat16)
    leaf = li["xz"].detach().transpose(1, 2).contiguous().requires_grad_(True)  # in_proj's output, (b, L, 2d)
    li["xz"] = xz = leaf.transpose(1, 2)
    bdl = 2 * 16 * 24
    copies = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket)
            if name in ("aten.clone", "aten.copy_", "aten._to_copy", "aten.contiguous") and \
                    isinstance(out, torch.Tensor) and out.numel() in (bdl, 2 * bdl):
                copies.append((name, tuple(out.shape)))
            return out

    def no_general(*a, **k):
        raise AssertionError("the general scan path ran")

    monkeypatch.setattr(sst, "_bwd_impl", no_general)
    monkeypatch.setattr(sst, "_fwd_impl", no_general)
    call(li)  # plans made outside the count
    with Count():
        out = call(li)
        dxz, dw, dow = torch.autograd.grad(out.float().sum(), [xz, li["x_proj_weight"], li["out_proj_weight"]])
    assert dxz.shape == xz.shape and torch.isfinite(dxz).all() and dw.abs().sum() > 0 and dow.abs().sum() > 0
    assert [s for _, s in copies] == [(2, 32, 24)], copies  # xz


@pytest.mark.parametrize("act,L,lvl,bias", [(torch.float32, 20, 1, True), (torch.bfloat16, 20, 0, False),
                                            (torch.float32, 2100, 1, True)])
def test_plan_path_matches_general(monkeypatch, act, L, lvl, bias):
    """A signature's second call runs through its layer plan (none of the general forward): the output and every
    gradient bitwise equal to the general forward's, with and without a gradient."""
    from selscan import _inner, _plan
    t = make(torch.Generator().manual_seed(24), bt=2, dm=8, L=L, N=4, R=2, E=6)
    li = lib_inputs(t, act)
    for n in ("conv1d_weight", "conv1d_bias", "x_proj_weight", "delta_proj_weight", "out_proj_weight"):
        li[n] = li[n].detach().to(act).requires_grad_(True)  # a model kept in `act`; out_proj_bias stays float32
    if not bias:
        li["conv1d_bias"] = None
    names = [n for n in NAMES if li[n] is not None]

    def run():
        out = call(li, lvl=lvl)
        grads = torch.autograd.grad(out.float().square().sum(), [li[n] for n in names])
        with torch.no_grad():
            plain = call(li, lvl=lvl)
        return [out, plain] + list(grads)

    fast = _inner._fast_forward
    monkeypatch.setattr(_inner, "_fast_forward", lambda *a: None)
    want = run()  # the general forward (whose scan and conv1d calls take their own plans)
    monkeypatch.setattr(_inner, "_fast_forward", fast)
    run()  # makes the layer plan
    general = _inner._general_forward

    def no_general(*a, **k):
        raise AssertionError("the general forward ran")

    monkeypatch.setattr(_inner, "_general_forward", no_general)
    got = run()
    monkeypatch.setattr(_inner, "_general_forward", general)
    for what, g, w in zip(["out", "out (no grad)"] + [f"d{n}" for n in names], got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), what


def test_torch_compile_with_grad_takes_function_apply():
    """Under torch.compile the autograd call goes through Function.apply, which dynamo traces (the direct C entry
    point that eager calls take would be a graph break): values and gradients as eager's."""
    from torch._dynamo.utils import counters

    t = lib_inputs(make(torch.Generator().manual_seed(0)))
    y0 = call(t)
    g0 = torch.autograd.grad(y0.square().sum(), [t["xz"], t["A"], t["x_proj_weight"]])
    t2 = {k: (None if v is None else v.detach().clone().requires_grad_(True)) for k, v in t.items()}
    counters.clear()
    y1 = torch.compile(call, backend="aot_eager")(t2)
    g1 = torch.autograd.grad(y1.square().sum(), [t2["xz"], t2["A"], t2["x_proj_weight"]])
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert not [r for r in counters["graph_break"] if "MambaInnerFn" in r], list(counters["graph_break"])
