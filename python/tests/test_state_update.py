"""selscan.selective_state_update (the decode step) against a float64 reference written from upstream's
semantics: numpy (CPU path), torch (CPU, and CUDA when usable: plus CUDA-graph replays), CuPy when installed;
the torch op under torch.compile; serving's equivalence prefill (scan) + decode steps = one scan."""

import numpy as np
import pytest

import selscan
from conftest import torch_cuda_skip_reason

TOL = {np.dtype(np.float32): (6e-4, 2e-3), np.dtype(np.float16): (3e-3, 5e-3)}


def ref_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus=False, idx=None, pad=-1, dst=None):
    """float64 (out, new state) from numpy inputs of either form, upstream's math (T tokens in order); with dst,
    sequence b's state goes to slot dst[b] (none when pad)."""
    f = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    state, x, dt, A, B, C, D, z, dt_bias = map(f, (state, x, dt, A, B, C, D, z, dt_bias))
    heads = state.ndim == 4
    if not heads:  # the Mamba-1 form is the heads form with P = 1
        state, A = state[:, :, None, :], A[:, None, :]
        x, dt = x[..., None], dt[..., None]
        z = None if z is None else z[..., None]
        D = None if D is None else D[:, None]
        dt_bias = None if dt_bias is None else dt_bias[:, None]
    has_t = x.ndim == 4
    if not has_t:
        x, dt = x[:, None], dt[:, None]
        z = None if z is None else z[:, None]
        B, C = B[:, None], C[:, None]
    if B.ndim == 3:  # (Bt, T, N): one group
        B, C = B[:, :, None], C[:, :, None]
    Bt, T, H, P = x.shape
    G = B.shape[2]
    new = state.copy()
    out = np.zeros(x.shape)
    for b in range(Bt):
        slot = b if idx is None else int(idx[b])
        if idx is not None and slot == pad:
            continue
        s = state[slot].copy()  # (H, P, N)
        for t in range(T):
            d = dt[b, t] + (0 if dt_bias is None else dt_bias)
            if softplus:
                d = np.where(d <= 20, np.log1p(np.exp(d)), d)
            Bg = np.repeat(B[b, t], H // G, axis=0)[:, None, :]  # (H, 1, N)
            Cg = np.repeat(C[b, t], H // G, axis=0)[:, None, :]
            s = s * np.exp(A * d[..., None]) + Bg * (d * x[b, t])[..., None]
            y = (s * Cg).sum(-1)
            if D is not None:
                y = y + D * x[b, t]
            if z is not None:
                y = y * z[b, t] / (1 + np.exp(-z[b, t]))
            out[b, t] = y
        to = slot if dst is None else int(dst[b])
        if to != pad:
            new[to] = s
    if not has_t:
        out = out[:, 0]
    if not heads:
        out, new = out[..., 0], new[:, :, 0, :]
    return out, new


def make(rng, heads=False, Bt=3, T=None, H=8, P=4, N=16, G=1, grouped=False, pool=None, dtype=np.float32,
         state_dtype=np.float32, opt=True, broadcast=False):
    """upstream's test inputs; T None: no tokens dim. Returns a dict of keyword arguments."""
    ch = (H, P) if heads else (H,)
    io = (Bt,) + (() if T is None else (T,)) + ch
    bc = (Bt,) + (() if T is None else (T,)) + ((G,) if grouped or G > 1 else ()) + (N,)
    S = Bt if pool is None else pool
    a = {
        "state": rng.standard_normal((S,) + ch + (N,)).astype(state_dtype),
        "x": rng.standard_normal(io).astype(dtype),
        "dt": rng.standard_normal(io).astype(dtype),
        "A": (-rng.random(ch + (N,)) - 1).astype(np.float32),
        "B": rng.standard_normal(bc).astype(dtype),
        "C": rng.standard_normal(bc).astype(dtype),
        "dt_softplus": True,
    }
    if opt:
        a["D"] = rng.standard_normal(ch).astype(np.float32)
        a["z"] = rng.standard_normal(io).astype(dtype)
        a["dt_bias"] = (rng.random(ch) - 4).astype(np.float32)
    if broadcast and heads:  # Mamba-2: A per head, dt / D / dt_bias per head, expanded over P (stride 0)
        a["A"] = np.broadcast_to((-rng.random((H, 1, 1)) - 1).astype(np.float32), (H, P, N))
        a["dt"] = np.broadcast_to(rng.standard_normal(io[:-1] + (1,)).astype(dtype), io)
        if opt:
            a["D"] = np.broadcast_to(rng.standard_normal((H, 1)).astype(np.float32), (H, P))
            a["dt_bias"] = np.broadcast_to((rng.random((H, 1)) - 4).astype(np.float32), (H, P))
    if pool is not None:
        a["state_batch_indices"] = rng.permutation(pool)[:Bt].astype(np.int32)
    return a


def call_ref(a):
    return ref_update(a["state"], a["x"], a["dt"], a["A"], a["B"], a["C"], a.get("D"), a.get("z"), a.get("dt_bias"),
                      a.get("dt_softplus", False), a.get("state_batch_indices"), a.get("pad_slot_id", -1),
                      a.get("dst_state_batch_indices"))


def check(a, run, tol=None):
    """Runs `run(**a)` (it updates a["state"] in place) and compares out and the pool with the reference."""
    want_out, want_state = call_ref(a)
    before = np.array(a["state"], copy=True)
    out = np.asarray(run(**a))
    rtol, atol = tol or TOL[np.dtype(a["x"].dtype)]
    np.testing.assert_allclose(out.astype(np.float64), want_out, rtol=rtol, atol=atol)
    st = np.asarray(a["state"]).astype(np.float64)
    srtol, satol = TOL[np.dtype(np.asarray(a["state"]).dtype)]
    np.testing.assert_allclose(st, want_state, rtol=srtol, atol=satol)
    idx = a.get("state_batch_indices")
    if a.get("dst_state_batch_indices") is not None:
        idx = a["dst_state_batch_indices"]
    if idx is not None:  # slots no sequence writes: bit-identical
        untouched = np.setdiff1d(np.arange(before.shape[0]), np.asarray(idx))
        assert np.array_equal(np.asarray(a["state"])[untouched].view(np.uint8), before[untouched].view(np.uint8))
    return out


# ------------------------------------------------------------------------------------------------ numpy
@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("T", [None, 1, 3])
@pytest.mark.parametrize("opt", [False, True])
def test_numpy_both_forms(heads, T, opt):
    rng = np.random.default_rng(1 + 10 * heads + (T or 0) + 100 * opt)
    check(make(rng, heads=heads, T=T, opt=opt, G=2), selscan.selective_state_update)


@pytest.mark.parametrize("heads", [False, True])
def test_numpy_pool_padding_and_broadcast(heads):
    rng = np.random.default_rng(5 + heads)
    a = make(rng, heads=heads, Bt=5, pool=9, broadcast=True)
    a["state_batch_indices"] = np.array([4, -1, 0, 8, -1], dtype=np.int64)
    out = check(a, selscan.selective_state_update)
    assert np.all(out[[1, 4]] == 0)  # padding: out exactly 0
    a = make(rng, heads=heads, Bt=3, pool=4)
    a["state_batch_indices"] = np.array([2, 0, 3], dtype=np.int32)
    a["pad_slot_id"] = 0  # slot 0 as a null block: sequence 1 is padding
    out = check(a, lambda pad_slot_id, **k: selscan.selective_state_update(**k, pad_slot_id=pad_slot_id))
    assert np.all(out[1] == 0)


@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("T", [None, 3])
def test_numpy_dst_slots(heads, T):
    rng = np.random.default_rng(51 + heads + (T or 0))
    a = make(rng, heads=heads, T=T, G=2, Bt=4, pool=10, broadcast=heads)
    a["state_batch_indices"] = np.array([3, 0, -1, 5], dtype=np.int32)
    in_place = {k: (v.copy() if k == "state" else v) for k, v in a.items()}
    out_in_place = selscan.selective_state_update(**in_place)
    # sequence 0 moves to slot 8, 1 updates in place, 2 is padding, 3 computes out and keeps no state
    a["dst_state_batch_indices"] = np.array([8, 0, 9, -1], dtype=np.int64)
    before = a["state"].copy()
    out = check(a, selscan.selective_state_update)
    assert np.array_equal(out, out_in_place)
    assert np.array_equal(a["state"][[3, 5]], before[[3, 5]])  # the sources: untouched
    assert np.array_equal(a["state"][8], in_place["state"][3])  # the state the in-place call left in slot 3
    assert np.array_equal(a["state"][0], in_place["state"][0])
    # dst == idx is the in-place call, bit for bit
    b = {k: (v.copy() if k == "state" else v) for k, v in in_place.items()}
    b["state"][:] = before
    b["dst_state_batch_indices"] = b["state_batch_indices"]
    assert np.array_equal(selscan.selective_state_update(**b), out_in_place)
    assert np.array_equal(b["state"], in_place["state"])


def test_numpy_dst_errors_and_plans():
    rng = np.random.default_rng(61)
    a = make(rng, pool=6)
    a["state_batch_indices"] = np.array([4, 0, 2], dtype=np.int32)
    a["dst_state_batch_indices"] = np.array([1, 1, 3], dtype=np.int32)
    with pytest.raises(selscan.SelscanError, match="sequences 0 and 1 both write slot 1"):
        selscan.selective_state_update(**a)
    a["dst_state_batch_indices"] = np.array([0, 5, 3], dtype=np.int32)
    with pytest.raises(selscan.SelscanError, match="writes the slot sequence 1 reads"):
        selscan.selective_state_update(**a)
    a["dst_state_batch_indices"] = np.array([1, 6, 3], dtype=np.int32)
    with pytest.raises(selscan.SelscanError, match=r"dst_state_batch_indices\[1\].*got 6"):
        selscan.selective_state_update(**a)
    b = make(rng)
    b["dst_state_batch_indices"] = np.array([0, 1, 2], dtype=np.int32)
    with pytest.raises(selscan.SelscanError, match="without state_batch_indices"):
        selscan.selective_state_update(**b)
    # Same signature with and without destinations: two plans, each seeing its call's data.
    for dst in (None, [5, 1, 3], None, [1, 5, 3]):
        c = make(rng, pool=6)
        c["state_batch_indices"] = np.array([4, 0, 2], dtype=np.int32)
        if dst is not None:
            c["dst_state_batch_indices"] = np.array(dst, dtype=np.int32)
        check(c, selscan.selective_state_update)


def test_numpy_half_state_and_dtypes():
    rng = np.random.default_rng(9)
    a = make(rng, dtype=np.float16, state_dtype=np.float16)
    check(a, selscan.selective_state_update)
    a = make(rng, dtype=np.float16)  # B, C float32 with float16 x (upstream's test does this)
    a["B"], a["C"] = a["B"].astype(np.float32), a["C"].astype(np.float32)
    check(a, selscan.selective_state_update)
    a = make(rng, dtype=np.float64, state_dtype=np.float32)  # float64 inputs compute and return float32
    out = selscan.selective_state_update(**a)
    assert out.dtype == np.float32


def test_numpy_errors_name_the_argument():
    rng = np.random.default_rng(3)
    a = make(rng, dtype=np.float32, state_dtype=np.float64)
    with pytest.raises(selscan.SelscanError, match="state: dtype float64"):
        selscan.selective_state_update(**a)
    a = make(rng)
    a["x"] = a["x"][:, :5]
    with pytest.raises(selscan.SelscanError, match="x: expected shape") as e:
        selscan.selective_state_update(**a)
    assert e.value.status_name == "SHAPE_MISMATCH"
    a = make(rng, pool=6)
    a["z"] = a["state"][: a["x"].shape[0], :, 0]  # a view into the state pool: the state would change under z
    with pytest.raises(selscan.SelscanError, match="overlap") as e:
        selscan.selective_state_update(**a)
    assert e.value.status_name == "BAD_LAYOUT"


def test_numpy_cached_plan_sees_new_data():
    rng = np.random.default_rng(11)
    for _ in range(3):  # same signature: the second and third calls reuse the plan
        check(make(rng, heads=True, pool=7), selscan.selective_state_update)


@pytest.mark.parametrize("per_call", [1, 2])
def test_numpy_prefill_then_decode_equals_one_scan(per_call):
    rng = np.random.default_rng(21)
    Bt, D, N, L, K = 2, 12, 16, 30, 4
    u = rng.standard_normal((Bt, D, L + K)).astype(np.float32)
    delta = (rng.random((Bt, D, L + K)) * 2 - 3).astype(np.float32)
    A = (-rng.random((D, N)) - 0.2).astype(np.float32)
    B = rng.standard_normal((Bt, N, L + K)).astype(np.float32)
    C = rng.standard_normal((Bt, N, L + K)).astype(np.float32)
    Dv = rng.standard_normal(D).astype(np.float32)
    z = rng.standard_normal((Bt, D, L + K)).astype(np.float32)
    bias = (rng.random(D) - 1).astype(np.float32)
    kw = dict(D=Dv, delta_bias=bias, delta_softplus=True, return_last_state=True)
    full, last_full = selscan.selective_scan_fn(u, delta, A, B, C, z=z, **kw)
    _, state = selscan.selective_scan_fn(u[..., :L], delta[..., :L], A, B[..., :L], C[..., :L], z=z[..., :L], **kw)
    for t0 in range(L, L + K, per_call):
        sl = slice(t0, t0 + per_call)
        if per_call == 1:
            args = (u[..., t0], delta[..., t0], A, B[..., t0], C[..., t0])
            zz = z[..., t0]
        else:  # (Bt, T, D) and (Bt, T, N) views of the scan's inputs
            args = (u[..., sl].transpose(0, 2, 1), delta[..., sl].transpose(0, 2, 1), A,
                    B[..., sl].transpose(0, 2, 1), C[..., sl].transpose(0, 2, 1))
            zz = z[..., sl].transpose(0, 2, 1)
        out = selscan.selective_state_update(state, *args, D=Dv, z=zz, dt_bias=bias, dt_softplus=True)
        want = full[..., sl] if per_call > 1 else full[..., t0]
        np.testing.assert_allclose(out.transpose(0, 2, 1) if per_call > 1 else out, want, rtol=6e-4, atol=2e-3)
    np.testing.assert_allclose(state, last_full, rtol=6e-4, atol=2e-3)


# ------------------------------------------------------------------------------------------------ torch
torch = None
try:
    import torch  # noqa: F811
except ImportError:
    pass

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
cuda_reason = torch_cuda_skip_reason()
needs_cuda = pytest.mark.skipif(cuda_reason is not None, reason=str(cuda_reason))


def to_torch(a, device, dtype=None):
    """numpy kwargs -> torch; broadcast numpy views become expand()ed tensors (their zero strides kept)."""
    r = {}
    for k, v in a.items():
        if isinstance(v, np.ndarray):
            base = tuple(slice(0, 1) if s == 0 else slice(None) for s in v.strides)
            t = torch.from_numpy(np.array(v[base]))
            if dtype is not None and t.is_floating_point() and k in ("x", "dt", "z", "B", "C", "state"):
                t = t.to(dtype)
            r[k] = t.to(device).expand(v.shape)
        else:
            r[k] = v
    return r


def check_torch(a, device, dtype, run):
    t = to_torch(a, device, dtype)
    back = {k: (v.float().cpu().numpy() if isinstance(v, torch.Tensor) and v.is_floating_point() else
                (v.cpu().numpy() if isinstance(v, torch.Tensor) else v)) for k, v in t.items()}
    want_out, want_state = call_ref(back)
    out = run(**t)
    rtol, atol = {torch.float32: (6e-4, 2e-3), torch.float16: (3e-3, 5e-3), torch.bfloat16: (3e-2, 5e-2)}[dtype]
    assert out.dtype == t["x"].dtype and out.shape == t["x"].shape
    np.testing.assert_allclose(out.float().cpu().numpy(), want_out, rtol=rtol, atol=atol)
    np.testing.assert_allclose(t["state"].float().cpu().numpy(), want_state, rtol=rtol, atol=atol)
    return t, out


def torch_cases():
    for heads in (False, True):
        for T in (None, 2):
            yield dict(heads=heads, T=T, G=2, pool=7, broadcast=heads)


def op_call(**k):
    args = (k["state"], k["x"], k["dt"], k["A"], k["B"], k["C"], k.get("D"), k.get("z"), k.get("dt_bias"),
            k["dt_softplus"], k.get("state_batch_indices"), -1)
    if "dst_state_batch_indices" in k:  # else the schema's default: the callers written before the argument
        args += (k["dst_state_batch_indices"],)
    return torch.ops.selscan.selective_state_update(*args)


@needs_torch
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch(device, dtype):
    from selscan.torch import selective_state_update
    dt = getattr(torch, dtype)
    rng = np.random.default_rng(31)
    for kw in torch_cases():
        for run in (selective_state_update, op_call):
            check_torch(make(rng, **kw), device, dt, run)
            # with destinations: 0 moves to slot 0, 1 updates in place, 2 computes out and keeps no state
            a = make(rng, **kw)
            a["state_batch_indices"] = np.array([1, 6, 3], dtype=np.int64)
            a["dst_state_batch_indices"] = np.array([0, 6, -1], dtype=np.int64)
            t, _ = check_torch(a, device, dt, run)
            assert torch.equal(t["state"][[1, 3]], to_torch(a, device, dt)["state"][[1, 3]])  # sources kept


@needs_torch
def test_torch_steps_follow_every_argument():
    """The eager call's per-signature steps (_decode.torch_step): calls of one x shape that differ in any other
    argument (flags, pad value, a dtype, strides, presence, a given out) each match the reference; a given out is
    written in place and returned; a later argument of the wrong type still gets the general path's error."""
    from selscan import _decode
    # the binding's own eager call (with the op library present, selscan.torch's goes through the op)
    from selscan._decode_torch import selective_state_update_binding as selective_state_update
    rng = np.random.default_rng(57)
    wide = torch.full((3, 2 * 8), 7.0)
    variants = [
        {},
        {"dt_softplus": False},
        {"pad_slot_id": 5, "state_batch_indices": np.array([5, 1, 3], dtype=np.int32)},  # 5 is padding here
        {"state_batch_indices": np.array([0, 1, 2], dtype=np.int64)},
        {"dt": "float64"},  # converted by the first call, then by its step
        {"out": torch.empty(3, 8)},
        {"out": wide[:, ::2]},  # strided out: the other columns stay
        {"z": None, "D": None},
    ]
    for rep in range(2):  # the second round runs on the steps the first one made
        for v in variants:
            a = make(rng, pool=7, H=8)
            a["pad_slot_id"] = v.get("pad_slot_id", -1)
            for k in ("dt_softplus", "state_batch_indices"):
                if k in v:
                    a[k] = v[k]
            if v.get("dt") == "float64":
                a["dt"] = a["dt"].astype(np.float64)
            for k in ("z", "D"):
                if k in v:
                    del a[k]
            t = to_torch(a, "cpu")
            want_out, want_state = call_ref({k: (w.numpy() if isinstance(w, torch.Tensor) else w)
                                             for k, w in t.items()})
            out = v.get("out")
            if out is not None:
                out.fill_(float("nan"))
            got = selective_state_update(**t, out=out)
            if out is not None:
                assert got is out
            np.testing.assert_allclose(got.numpy(), want_out, rtol=6e-4, atol=2e-3)
            np.testing.assert_allclose(t["state"].numpy(), want_state, rtol=6e-4, atol=2e-3)
    assert torch.equal(wide[:, 1::2], torch.full((3, 8), 7.0))
    assert all(len(v) <= _decode._MAX_STEPS for v in _decode._tls.steps.values())
    t = to_torch(make(rng, pool=7, H=8), "cpu")
    t["D"] = t["D"].numpy()
    with pytest.raises(selscan.SelscanError, match="D is a ndarray"):
        selective_state_update(**t)
    t = to_torch(make(rng, pool=7, H=8), "cpu")
    with pytest.raises(selscan.SelscanError, match="out: dtype torch.float64"):
        selective_state_update(**t, out=torch.empty(3, 8, dtype=torch.float64))


@needs_torch
def test_torch_steps_repeat_conversions(monkeypatch):
    """A model kept in bf16 hands D and dt_bias in bf16 (the library reads them in float32) on every decode call:
    after the first call of the signature no call plan is made again (the step converts them itself), and every
    call matches the reference computed from the same bf16 values."""
    from selscan import _plan
    # the binding's own eager call (with the op library present, selscan.torch's goes through the op)
    from selscan._decode_torch import selective_state_update_binding as selective_state_update
    rng = np.random.default_rng(58)
    made = []
    real = _plan.Plan.__init__

    def counting(self, *a, **k):
        made.append(a[0])
        real(self, *a, **k)

    monkeypatch.setattr(_plan.Plan, "__init__", counting)
    for i in range(3):
        a = make(rng, H=8)
        a["dt_softplus"] = True
        t = to_torch(a, "cpu", torch.bfloat16)
        t["D"], t["dt_bias"] = t["D"].to(torch.bfloat16), t["dt_bias"].to(torch.bfloat16)
        want_out, want_state = call_ref({k: (w.float().numpy() if isinstance(w, torch.Tensor) else w)
                                         for k, w in t.items()})
        got = selective_state_update(**t)
        np.testing.assert_allclose(got.float().numpy(), want_out, rtol=2e-2, atol=2e-2)
        np.testing.assert_allclose(t["state"].float().numpy(), want_state, rtol=2e-2, atol=2e-2)
        assert len(made) == (1 if i == 0 else made_after_first), made
        made_after_first = len(made)


@needs_torch
def test_torch_compile_traces_the_op_with_dst():
    from selscan.torch import selective_state_update
    rng = np.random.default_rng(43)
    a = make(rng, heads=True, T=2, pool=6, broadcast=True)
    a["state_batch_indices"] = np.array([0, 2, 4], dtype=np.int32)
    a["dst_state_batch_indices"] = np.array([1, 3, 5], dtype=np.int32)
    a = to_torch(a, "cpu")
    state0 = a["state"].clone()

    def step(state, x, dt, A, B, C, D, z, dt_bias, idx, dst):
        return selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
                                      state_batch_indices=idx, dst_state_batch_indices=dst) * 2

    args = (a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], a["z"], a["dt_bias"], a["state_batch_indices"],
            a["dst_state_batch_indices"])
    eager_state = state0.clone()
    want = step(eager_state, *args)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(a["state"], *args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(a["state"], eager_state)
    assert not torch.equal(eager_state, state0)


@needs_torch
def test_torch_compile_traces_the_op():
    from selscan.torch import selective_state_update
    rng = np.random.default_rng(41)
    a = to_torch(make(rng, heads=True, T=2, pool=5, broadcast=True), "cpu")
    state0 = a["state"].clone()

    def step(state, x, dt, A, B, C, D, z, dt_bias, idx):
        return selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
                                      state_batch_indices=idx) * 2

    args = (a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], a["z"], a["dt_bias"], a["state_batch_indices"])
    eager_state = state0.clone()
    want = step(eager_state, *args)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(a["state"], *args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(a["state"], eager_state)  # the mutation of state survives functionalization


@needs_torch
@needs_cuda
def test_torch_cuda_graph_replays_follow_the_indices():
    from selscan.torch import selective_state_update
    rng = np.random.default_rng(61)
    a = to_torch(make(rng, Bt=4, pool=6, H=64), "cuda")
    idx = a["state_batch_indices"]
    eager_state = a["state"].clone()
    kw = dict(D=a["D"], z=a["z"], dt_bias=a["dt_bias"], dt_softplus=True)
    selective_state_update(eager_state.clone(), a["x"], a["dt"], a["A"], a["B"], a["C"], state_batch_indices=idx,
                           **kw)  # warm-up (plan, module load) outside the capture
    g = torch.cuda.CUDAGraph()
    graph_state = a["state"].clone()
    with torch.cuda.graph(g):
        out = selective_state_update(graph_state, a["x"], a["dt"], a["A"], a["B"], a["C"], state_batch_indices=idx,
                                     **kw)
    for step in ([0, 1, 2, 3], [5, -1, 2, 4], [-1, -1, -1, -1], [3, 0, 5, 1]):
        idx.copy_(torch.tensor(step, dtype=idx.dtype))
        g.replay()
        want = selective_state_update(eager_state, a["x"], a["dt"], a["A"], a["B"], a["C"], state_batch_indices=idx,
                                      **kw)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(graph_state, eager_state)


# ------------------------------------------------------------------------------------------------ CuPy
@needs_cuda
def test_cupy():
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    rng = np.random.default_rng(71)
    a = make(rng, heads=True, T=2, pool=6, G=2)
    want_out, want_state = call_ref(a)
    g = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in a.items()}
    out = selscan.selective_state_update(**g)
    np.testing.assert_allclose(cp.asnumpy(out), want_out, rtol=6e-4, atol=2e-3)
    np.testing.assert_allclose(cp.asnumpy(g["state"]), want_state, rtol=6e-4, atol=2e-3)
