"""Serving arguments through the binding (docs/serving.md): packed sequences equal separate calls, a state pool is
updated in place (slots nobody names untouched), padding gives zeros, and the torch autograd path's gradients of a
packed call (initial states included) equal those of separate calls."""

import numpy as np
import pytest

import selscan

from conftest import torch_cuda_skip_reason

LENS = [5, 0, 33, 12]


def inputs(rng, total, dim=4, n=8, g=2):
    u = rng.standard_normal((1, dim, total)).astype(np.float32)
    delta = (0.5 * rng.random((1, dim, total))).astype(np.float32)
    A = (-0.5 * rng.random((dim, n))).astype(np.float32)
    B = rng.standard_normal((1, g, n, total)).astype(np.float32)
    C = rng.standard_normal((1, g, n, total)).astype(np.float32)
    D = rng.standard_normal(dim).astype(np.float32)
    z = rng.standard_normal((1, dim, total)).astype(np.float32)
    bias = (0.5 * rng.random(dim)).astype(np.float32)
    return u, delta, A, B, C, D, z, bias


def piece(a, s, e):
    return np.ascontiguousarray(a[..., s:e])


@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64])
def test_packed_equals_separate_calls_and_pool(cu_dtype):
    rng = np.random.default_rng(3)
    cu = np.concatenate([[0], np.cumsum(LENS)]).astype(cu_dtype)
    u, delta, A, B, C, D, z, bias = inputs(rng, int(cu[-1]))
    slots = rng.standard_normal((6, 4, 8)).astype(np.float32)
    pool = slots.copy()
    idx = np.array([4, -1, 0, 2], dtype=np.int64)
    init = np.array([1, 1, 0, 1], dtype=bool)
    y = selscan.selective_scan_fn(u, delta, A, B, C, D, z, bias, True, cu_seqlens=cu, ssm_states=pool,
                                  cache_indices=idx, has_initial_state=init, pad_slot_id=-1)
    for b, L in enumerate(LENS):
        s, e = int(cu[b]), int(cu[b + 1])
        if idx[b] == -1:
            assert np.all(y[..., s:e] == 0)
            continue
        if L == 0:
            assert np.array_equal(pool[idx[b]], slots[idx[b]] if init[b] else np.zeros_like(slots[0]))
            continue
        h0 = slots[idx[b]][None] if init[b] else None
        yb, last = selscan.selective_scan_fn(piece(u, s, e), piece(delta, s, e), A, piece(B, s, e), piece(C, s, e), D,
                                             piece(z, s, e), bias, True, return_last_state=True, initial_state=h0)
        np.testing.assert_array_equal(y[..., s:e], yb)
        np.testing.assert_array_equal(pool[idx[b]], last[0])
    for k in (1, 3, 5):  # no sequence names these slots
        np.testing.assert_array_equal(pool[k], slots[k])


def test_backward_of_packed_call_equals_separate_calls():
    rng = np.random.default_rng(4)
    cu = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    u, delta, A, B, C, D, z, bias = inputs(rng, int(cu[-1]))
    h0 = rng.standard_normal((len(LENS), 4, 8)).astype(np.float32)
    dout = rng.standard_normal(u.shape).astype(np.float32)
    g = selscan.selective_scan_bwd(dout, u, delta, A, B, C, D, z, bias, True, initial_state=h0, cu_seqlens=cu)
    dA = np.zeros_like(A)
    for b, L in enumerate(LENS):
        s, e = int(cu[b]), int(cu[b + 1])
        if L == 0:
            assert np.all(g["dinitial_state"][b] == 0)
            continue
        gb = selscan.selective_scan_bwd(piece(dout, s, e), piece(u, s, e), piece(delta, s, e), A, piece(B, s, e),
                                        piece(C, s, e), D, piece(z, s, e), bias, True, initial_state=h0[b:b + 1])
        for k in ("du", "ddelta", "dz", "dB", "dC"):
            np.testing.assert_array_equal(g[k][..., s:e], gb[k], err_msg=k)
        np.testing.assert_array_equal(g["dinitial_state"][b], gb["dinitial_state"][0])
        dA += gb["dA"]
    np.testing.assert_allclose(g["dA"], dA, rtol=1e-5, atol=1e-5)


def _torch_devices():
    devs = ["cpu"]
    if torch_cuda_skip_reason() is None:
        devs.append("cuda")
    return devs


@pytest.mark.parametrize("device", _torch_devices())
def test_torch_packed_autograd(device):
    torch = pytest.importorskip("torch")
    from selscan.torch import selective_scan_fn

    rng = np.random.default_rng(5)
    cu_np = np.concatenate([[0], np.cumsum(LENS)])
    arrs = [torch.from_numpy(a).to(device) for a in inputs(rng, int(cu_np[-1]))]
    h0 = torch.from_numpy(rng.standard_normal((len(LENS), 4, 8)).astype(np.float32)).to(device)
    cu = torch.from_numpy(cu_np).to(device=device, dtype=torch.int32)
    leaves = [t.clone().requires_grad_() for t in arrs] + [h0.clone().requires_grad_()]
    u, delta, A, B, C, D, z, bias, h = leaves
    y = selective_scan_fn(u, delta, A, B, C, D, z, bias, True, cu_seqlens=cu, initial_state=h)
    dout = torch.randn_like(y)
    (y * dout).sum().backward()
    for b, L in enumerate(LENS):
        if L == 0:
            assert torch.all(h.grad[b] == 0)
            continue
        s, e = int(cu_np[b]), int(cu_np[b + 1])
        sl = [t.detach()[..., s:e].contiguous().requires_grad_() for t in (u, delta, B, C, z)]
        hb = h.detach()[b:b + 1].clone().requires_grad_()
        yb = selective_scan_fn(sl[0], sl[1], A.detach(), sl[2], sl[3], D.detach(), sl[4], bias.detach(), True,
                               initial_state=hb)
        torch.testing.assert_close(y[..., s:e], yb, rtol=1e-5, atol=1e-5)
        (yb * dout[..., s:e]).sum().backward()
        for got, t in zip((u.grad, delta.grad, B.grad, C.grad, z.grad), sl):
            torch.testing.assert_close(got[..., s:e], t.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h.grad[b:b + 1], hb.grad, rtol=1e-5, atol=1e-5)


def test_block_states_equal_truncated_scans():
    """Block-wise state caching: the state at each block end lands in that block's slot and equals the last state of
    a scan of the tokens up to there; out is the call's without blocks; pad entries and unnamed slots untouched."""
    rng = np.random.default_rng(8)
    K = 4
    lens, ctx = [10, 0, 7], np.array([3, 5, 0], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    u, delta, A, B, C, D, z, bias = inputs(rng, int(cu[-1]))
    table = np.array([[0, 1, -1, 2], [9, 9, 9, 9], [3, 4, 5, 6]], dtype=np.int64)
    slots = rng.standard_normal((10, 4, 8)).astype(np.float32)
    pool = slots.copy()
    y = selscan.selective_scan_fn(u, delta, A, B, C, D, z, bias, True, cu_seqlens=cu, ssm_states=pool,
                                  block_table=table, context_lens=ctx, state_block_size=K, pad_slot_id=-1)
    written = set()
    for b, L in enumerate(lens):
        if L == 0:
            continue
        s, e, c = int(cu[b]), int(cu[b + 1]), int(ctx[b])
        h0 = slots[table[b][(c - 1) // K]][None] if c > 0 else None
        yb = selscan.selective_scan_fn(piece(u, s, e), piece(delta, s, e), A, piece(B, s, e), piece(C, s, e), D,
                                       piece(z, s, e), bias, True, initial_state=h0)
        np.testing.assert_array_equal(y[..., s:e], yb)
        for j in range(c // K, (c + L - 1) // K + 1):
            if table[b][j] == -1:
                continue
            m = min(L, (j + 1) * K - c)  # the tokens of this call up to the block's end (or the sequence's)
            _, last = selscan.selective_scan_fn(piece(u, s, s + m), piece(delta, s, s + m), A, piece(B, s, s + m),
                                                piece(C, s, s + m), D, piece(z, s, s + m), bias, True,
                                                return_last_state=True, initial_state=h0)
            np.testing.assert_array_equal(pool[table[b][j]], last[0], err_msg=f"sequence {b} block {j}")
            written.add(int(table[b][j]))
    assert written == {0, 1, 2, 3, 4}  # block 2 of sequence 0 is a pad entry; sequence 1 is empty (slot 9 untouched)
    for k in set(range(10)) - written:
        np.testing.assert_array_equal(pool[k], slots[k])


def test_block_states_bad_entry_is_named():
    rng = np.random.default_rng(9)
    u, delta, A, B, C, D, z, bias = inputs(rng, 6)
    pool = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(selscan.SelscanError, match=r"block_table\[0\]\[1\]: expected a slot of ssm_states in \[0, 2\)"):
        selscan.selective_scan_fn(u, delta, A, B, C, D, z, bias, True, ssm_states=pool,
                                  block_table=np.array([[0, 5]], np.int32), state_block_size=4, pad_slot_id=-1)


@pytest.mark.parametrize("device", _torch_devices())
def test_torch_block_states_autograd(device):
    """selscan.torch with block fields: the pool gets the block states, and the gradients (the states the sequences
    started from gathered for the backward, padding marked) equal those of dense calls."""
    torch = pytest.importorskip("torch")
    from selscan.torch import selective_scan_fn
    rng = np.random.default_rng(10)
    K, lens = 4, [9, 6, 5]
    cu_np = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    arrs = [torch.from_numpy(a).to(device) for a in inputs(rng, int(cu_np[-1]))]
    slots = torch.from_numpy(rng.standard_normal((8, 4, 8)).astype(np.float32)).to(device)
    pool = slots.clone()
    cu = torch.from_numpy(cu_np).to(device)
    table = torch.tensor([[0, 1, 2, 3], [-1, -1, -1, -1], [4, 5, 6, 7]], device=device, dtype=torch.int32)
    ctx = torch.tensor([0, 0, 5], device=device, dtype=torch.int64)
    leaves = [a.clone().requires_grad_(True) for a in arrs]
    y = selective_scan_fn(*leaves, True, cu_seqlens=cu, ssm_states=pool, block_table=table, context_lens=ctx,
                          state_block_size=K, pad_slot_id=-1)
    dout = torch.randn_like(y)
    y.backward(dout)
    assert torch.all(y[..., 9:15] == 0)  # sequence 1 is padding
    for b, (s, e) in enumerate(zip(cu_np[:-1], cu_np[1:])):
        if b == 1:
            continue
        part = [a[..., s:e].clone().requires_grad_(True) if a.dim() > 1 and a.shape[-1] == y.shape[-1]
                else a.detach().clone().requires_grad_(True) for a in arrs]
        h0 = slots[5:6].clone() if b == 2 else None  # sequence 2 resumes at 5 from block 1 (slot 5)
        yb, last = selective_scan_fn(*part, True, return_last_state=True, initial_state=h0)
        torch.testing.assert_close(y[..., s:e], yb, rtol=1e-5, atol=1e-5)
        yb.backward(dout[..., s:e])
        for got, t in zip(leaves, part):
            if t.dim() > 1 and t.shape[-1] == yb.shape[-1]:
                torch.testing.assert_close(got.grad[..., s:e], t.grad, rtol=1e-5, atol=1e-5)
        fin = table[b][(int(ctx[b]) + (e - s) - 1) // K]
        torch.testing.assert_close(pool[fin], last[0], rtol=1e-5, atol=1e-5)
