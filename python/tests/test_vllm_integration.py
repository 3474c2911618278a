"""selscan.integrations.vllm called the way vLLM's Mamba layers call vLLM's ops (vllm/model_executor/layers/mamba:
mamba_mixer.py for Mamba-1 prefill and decode with and without prefix caching, mamba_mixer2.py's decode step, and
the speculative-decoding forms of tests/kernels/mamba/test_mamba_ssm.py): the same argument order and keywords,
the layouts the layers produce (transposed and split views), in-place outputs, padded batches, against a float64
reference of each request's whole token stream. CPU tensors here; the CUDA variants run where torch sees a GPU."""

import numpy as np
import pytest

from conftest import torch_cuda_skip_reason
from reference import ref_scan

torch = pytest.importorskip("torch", reason="torch is not installed")

import selscan  # noqa: E402
from selscan.integrations import vllm  # noqa: E402
from test_state_update import ref_update  # noqa: E402  (the decode step's float64 reference)

RTOL, ATOL = 6e-4, 2e-3


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(torch_cuda_skip_reason() is not None,
                                                                  reason=str(torch_cuda_skip_reason())))]


class Request:
    """One request's whole token stream (dim, L) / (N, L), the model's weights shared by all requests."""

    def __init__(self, rng, L, w):
        self.u = rng.standard_normal((w.dim, L)).astype(np.float32)
        self.dt = (0.5 * rng.standard_normal((w.dim, L)) - 1).astype(np.float32)
        self.B = rng.standard_normal((w.N, L)).astype(np.float32)
        self.C = rng.standard_normal((w.N, L)).astype(np.float32)
        self.z = rng.standard_normal((w.dim, L)).astype(np.float32)
        self.w = w

    def ref(self, stop):
        """float64 (gated outputs (dim, stop), state after token stop - 1) of tokens [0, stop) from zero."""
        w = self.w
        _, y, h = ref_scan(self.u[None, :, :stop], self.dt[None, :, :stop], w.A, self.B[None, :, :stop],
                           self.C[None, :, :stop], w.D, self.z[None, :, :stop], w.bias, True)
        return y[0], h[0]


class Weights:
    def __init__(self, rng, dim=8, N=4, R=3):
        self.dim, self.N, self.R = dim, N, R
        self.A = (-rng.random((dim, N)) - 0.3).astype(np.float32)
        self.D = rng.standard_normal(dim).astype(np.float32)
        self.bias = (0.2 * rng.random(dim)).astype(np.float32)

    def torch(self, dev):
        return (torch.from_numpy(self.A).to(dev), torch.from_numpy(self.D).to(dev),
                torch.from_numpy(self.bias).to(dev))


def mixer_views(w, cols, dev, decode=False):
    """The tensors MambaMixer.forward_cuda hands the ops, for packed token columns cols = [(request, start, stop)]:
    u (dim, T) (the conv output), delta the transposed dt_proj output (dim, T) with strides (1, dim), B and C
    transposed splits of x_proj's output (N, T) with strides (1, R + 2N), the gate a chunk of the transposed
    in_proj output (dim, T) with strides (1, 2 dim). decode=True: the decode step's (T, ...) views instead."""
    T = sum(e - s for _, s, e in cols)
    cat = lambda name: np.concatenate([getattr(r, name)[:, s:e] for r, s, e in cols], axis=1)  # noqa: E731
    u = torch.from_numpy(cat("u")).to(dev)  # (dim, T) contiguous
    dt = torch.from_numpy(np.ascontiguousarray(cat("dt").T)).to(dev).transpose(0, 1)  # (dim, T), strides (1, dim)
    params = torch.zeros(T, w.R + 2 * w.N, device=dev)
    params[:, w.R:w.R + w.N] = torch.from_numpy(cat("B").T).to(dev)
    params[:, w.R + w.N:] = torch.from_numpy(cat("C").T).to(dev)
    _, B, C = torch.split(params, [w.R, w.N, w.N], dim=-1)  # (T, N), strides (R + 2N, 1)
    proj = torch.zeros(T, 2 * w.dim, device=dev)
    proj[:, w.dim:] = torch.from_numpy(cat("z").T).to(dev)
    _, gate = proj.transpose(-2, -1).chunk(2, dim=-2)  # (dim, T), strides (1, 2 dim)
    if decode:  # x, dt, B, C, z as mamba_mixer.py's decode branch passes them
        return u.transpose(0, 1).contiguous(), dt.transpose(0, 1), B, C, gate.transpose(0, 1)
    return u, dt, B.transpose(-2, -1), C.transpose(-2, -1), gate


def check_pool(pool, before, want, dev):
    """Slots in `want` (slot -> float64 state) match; every other slot is bit-identical to `before`."""
    got = pool.cpu()
    for slot, st in want.items():
        np.testing.assert_allclose(got[slot].numpy(), st, rtol=RTOL, atol=ATOL, err_msg=f"slot {slot}")
    others = [s for s in range(pool.shape[0]) if s not in want]
    assert torch.equal(got[others], before[others])


# ------------------------------------------------------------------------------------------------ Mamba-1
@pytest.mark.parametrize("device", DEVICES)
def test_mamba1_chunked_prefill_then_padded_decode(device):
    """Prefill in two chunks (the second resumes from the pool), a padding sequence in the prefill batch, then
    decode steps in a batch padded to a CUDA-graph size, as mamba_mixer.py calls both ops without prefix caching."""
    rng = np.random.default_rng(1)
    w = Weights(rng)
    A, D, bias = w.torch(device)
    lens = [9, 5, 14]
    reqs = [Request(rng, L + 3, w) for L in lens]
    slots = [6, 1, 3]
    pool = torch.from_numpy(rng.standard_normal((8, w.dim, w.N)).astype(np.float32)).to(device)
    before = pool.cpu().clone()
    split = [4, 5, 6]
    for chunk in range(2):  # chunk 0: tokens [0, split); chunk 1: [split, L), from the pool
        cols = [(r, 0, s) if chunk == 0 else (r, s, L) for r, s, L in zip(reqs, split, lens)]
        cols.insert(1, (reqs[0], 0, 2))  # a padding sequence (its tokens are ignored)
        u, dt, B, C, gate = mixer_views(w, cols, device)
        qsl = torch.tensor(np.cumsum([0] + [e - s for _, s, e in cols]), dtype=torch.int32, device=device)
        idx = torch.tensor([slots[0], -1, slots[1], slots[2]], dtype=torch.int32, device=device)
        init = torch.tensor([chunk == 1] * 4, device=device)
        y = vllm.selective_scan_fn(u, pool, dt, A, B, C, D.float(), gate, bias, delta_softplus=True,
                                   cache_indices=idx, has_initial_state=init, query_start_loc=qsl)
        assert y.shape == (w.dim, int(qsl[-1])) and y.is_contiguous()  # gate was strided: vLLM's contiguous copy
        q = qsl.cpu().numpy()
        for k, (r, s, e) in enumerate(cols):
            if k == 1:
                assert torch.all(y[:, q[1]:q[2]] == 0)  # padding: zeros (vLLM leaves it unwritten)
                continue
            np.testing.assert_allclose(y[:, q[k]:q[k + 1]].cpu().numpy(), r.ref(e)[0][:, s:e], rtol=RTOL, atol=ATOL)
    check_pool(pool, before, {s: r.ref(L)[1] for r, s, L in zip(reqs, slots, lens)}, device)
    # Decode: 3 steps, batch padded to 4 with pad_slot_id entries (vLLM's default -1); out preallocated.
    idx = torch.tensor(slots + [-1], dtype=torch.int32, device=device)
    for t in range(3):
        cols = [(r, L + t, L + t + 1) for r, L in zip(reqs, lens)] + [(reqs[0], 0, 1)]
        x, dt, B, C, z = mixer_views(w, cols, device, decode=True)
        out = torch.full_like(x, float("nan"))
        r = vllm.selective_state_update(pool, x, dt, A, B, C, D, z, bias, dt_softplus=True,
                                        state_batch_indices=idx, dst_state_batch_indices=idx, out=out)
        assert r is out
        for k, (req, L) in enumerate(zip(reqs, lens)):
            np.testing.assert_allclose(out[k].cpu().numpy(), req.ref(L + t + 1)[0][:, L + t], rtol=RTOL, atol=ATOL)
        assert torch.all(out[3] == 0)
    check_pool(pool, before, {s: r.ref(L + 3)[1] for r, s, L in zip(reqs, slots, lens)}, device)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_writes_delta_and_z_in_place(device):
    """Contiguous delta and z (vLLM's wrapper copies nothing): the output lands in them, z is returned; without z,
    delta is. The dense form (batch, dim, seqlen) with one pool line per sequence and no has_initial_state starts
    every sequence from zero, as vLLM's kernel."""
    rng = np.random.default_rng(2)
    w = Weights(rng)
    A, D, bias = w.torch(device)
    reqs = [Request(rng, 7, w) for _ in range(2)]
    u = torch.from_numpy(np.stack([r.u for r in reqs])).to(device)
    dt = torch.from_numpy(np.stack([r.dt for r in reqs])).to(device)
    B = torch.from_numpy(np.stack([r.B for r in reqs])).to(device)
    C = torch.from_numpy(np.stack([r.C for r in reqs])).to(device)
    z = torch.from_numpy(np.stack([r.z for r in reqs])).to(device)
    pool = torch.randn(2, w.dim, w.N, device=device)  # read by nobody: no has_initial_state
    y = vllm.selective_scan_fn(u, pool, dt, A, B, C, D, z, bias, True)
    assert y is z
    for b, r in enumerate(reqs):
        want, h = r.ref(7)
        np.testing.assert_allclose(z[b].cpu().numpy(), want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(pool[b].cpu().numpy(), h, rtol=RTOL, atol=ATOL)
        pre = ref_scan(r.u[None], r.dt[None], w.A, r.B[None], r.C[None], w.D, None, w.bias, True)[0][0]
        np.testing.assert_allclose(dt[b].cpu().numpy(), pre, rtol=RTOL, atol=ATOL)  # pre-gate out over delta
    dt2 = torch.from_numpy(np.stack([r.dt for r in reqs])).to(device)
    y = vllm.selective_scan_fn(u, pool, dt2, A, B, C, D, None, bias, True, has_initial_state=torch.tensor(
        [False, False], device=device))
    assert y is dt2
    np.testing.assert_allclose(dt2.cpu().numpy(), dt.cpu().numpy(), rtol=1e-6, atol=1e-6)


def apc_meta(ctx, lens, K, dev):
    """vLLM's prefix-caching pointers for sequences with ctx earlier tokens and lens scheduled ones."""
    ctx, lens = np.asarray(ctx), np.asarray(lens)
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.int32, device=dev)  # noqa: E731
    return dict(block_idx_first_scheduled_token=t(ctx // K), block_idx_last_scheduled_token=t((ctx + lens - 1) // K),
                initial_state_idx=t(np.maximum(ctx - 1, 0) // K))


@pytest.mark.parametrize("device", DEVICES)
def test_mamba1_prefix_caching(device):
    """Block-wise state caching as mamba_mixer.py does it: prefill in block-aligned chunks writes the state at every
    block end into that block's slot; decode steps read the block of the last computed token and write the block
    of the new one (a new block at a boundary); a new request whose first two blocks hit the cache resumes there."""
    rng = np.random.default_rng(3)
    K, M = 4, 6
    w = Weights(rng)
    A, D, bias = w.torch(device)
    r0, r1 = Request(rng, 24, w), Request(rng, 24, w)
    table = torch.tensor([[2, 7, 4, 9, 11, 12], [5, 3, 8, 10, 13, 14]], dtype=torch.int32, device=device)
    pool = torch.from_numpy(rng.standard_normal((16, w.dim, w.N)).astype(np.float32)).to(device)
    before = pool.cpu().clone()
    tab = table.cpu().numpy()
    done = [0, 0]

    def prefill(chunks):  # chunks: [(request row, tokens)]
        cols = [((r0, r1)[b], done[b], done[b] + n) for b, n in chunks]
        u, dt, B, C, gate = mixer_views(w, cols, device)
        qsl = torch.tensor(np.cumsum([0] + [n for _, n in chunks]), dtype=torch.int32, device=device)
        ctx = [done[b] for b, _ in chunks]
        y = vllm.selective_scan_fn(u, pool, dt, A, B, C, D.float(), gate, bias, delta_softplus=True,
                                   cache_indices=table[[b for b, _ in chunks]],
                                   has_initial_state=torch.tensor([c > 0 for c in ctx], device=device),
                                   query_start_loc=qsl, block_size=K,
                                   **apc_meta(ctx, [n for _, n in chunks], K, device))
        q = qsl.cpu().numpy()
        for k, (r, s, e) in enumerate(cols):
            np.testing.assert_allclose(y[:, q[k]:q[k + 1]].cpu().numpy(), r.ref(e)[0][:, s:e], rtol=RTOL, atol=ATOL)
        for b, n in chunks:
            done[b] += n

    def written():  # every complete block's state and the partial last block's, per request so far
        want = {}
        for b, r in enumerate((r0, r1)):
            for j in range((done[b] - 1) // K + 1):
                want[int(tab[b, j])] = r.ref(min((j + 1) * K, done[b]))[1]
        return want

    prefill([(0, 8), (1, 5)])  # block-aligned chunks (vLLM's scheduler aligns them to the block size)
    prefill([(0, 7), (1, 3)])
    check_pool(pool, before, written(), device)
    idx_d = table.clone()
    for step in range(6):  # r0 from 15 tokens, r1 from 8: r1's first step and r0's second open a new block
        last_computed = torch.tensor([(done[0] - 1) // K, (done[1] - 1) // K], device=device)
        last_scheduled = torch.tensor([done[0] // K, done[1] // K], device=device)
        src = idx_d.gather(1, last_computed.unsqueeze(1)).squeeze(1)
        dst = idx_d.gather(1, last_scheduled.unsqueeze(1)).squeeze(1)
        x, dt, B, C, z = mixer_views(w, [(r0, done[0], done[0] + 1), (r1, done[1], done[1] + 1)], device, True)
        out = torch.empty_like(x)
        vllm.selective_state_update(pool, x, dt, A, B, C, D, z, bias, dt_softplus=True, state_batch_indices=src,
                                    dst_state_batch_indices=dst, out=out)
        for b, r in enumerate((r0, r1)):
            np.testing.assert_allclose(out[b].cpu().numpy(), r.ref(done[b] + 1)[0][:, done[b]], rtol=RTOL, atol=ATOL)
        done[0] += 1
        done[1] += 1
    check_pool(pool, before, written(), device)
    # A new request sharing r0's first two blocks (8 tokens): it resumes at token 8 from slot table[0][1].
    hit = Request(rng, 13, w)
    for name in ("u", "dt", "B", "C", "z"):
        getattr(hit, name)[:, :8] = getattr(r0, name)[:, :8]
    row = torch.tensor([[2, 7, 15, 0, 1, 6]], dtype=torch.int32, device=device)
    u, dt, B, C, gate = mixer_views(w, [(hit, 8, 13)], device)
    y = vllm.selective_scan_fn(u, pool, dt, A, B, C, D.float(), gate, bias, delta_softplus=True, cache_indices=row,
                               has_initial_state=torch.tensor([True], device=device),
                               query_start_loc=torch.tensor([0, 5], dtype=torch.int32, device=device), block_size=K,
                               **apc_meta([8], [5], K, device))
    np.testing.assert_allclose(y.cpu().numpy(), hit.ref(13)[0][:, 8:], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(pool[15].cpu().numpy(), hit.ref(12)[1], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(pool[0].cpu().numpy(), hit.ref(13)[1], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("device", DEVICES)
def test_prefix_caching_chunks_inside_blocks(device):
    """vLLM's newer kernel arguments cu_chunk_seqlen / last_chunk_indices: a sequence resuming inside a block (its
    first chunk fills the block's rest) and one whose single chunk stays inside its block."""
    rng = np.random.default_rng(4)
    K = 4
    w = Weights(rng)
    A, D, bias = w.torch(device)
    r0, r1 = Request(rng, 16, w), Request(rng, 16, w)
    table = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]], dtype=torch.int32, device=device)
    tab = table.cpu().numpy()
    pool = torch.zeros(13, w.dim, w.N, device=device)
    # earlier calls left r0 after 6 tokens (block 1 partial) and r1 after 9 (block 2 partial)
    for b, (r, c) in enumerate(((r0, 6), (r1, 9))):
        for j in range((c - 1) // K + 1):
            pool[int(tab[b, j])] = torch.from_numpy(r.ref(min((j + 1) * K, c))[1].astype(np.float32)).to(device)
    before = pool.cpu().clone()
    ctx, lens = [6, 9], [9, 2]  # r0: positions 6..14 in chunks 2 | 4 | 3; r1: positions 9..10, one chunk
    cu_chunk = torch.tensor([0, 2, 6, 9, 11], dtype=torch.int32, device=device)
    last_chunk = torch.tensor([2, 3], dtype=torch.int32, device=device)
    u, dt, B, C, gate = mixer_views(w, [(r0, 6, 15), (r1, 9, 11)], device)
    y = vllm.selective_scan_fn(u, pool, dt, A, B, C, D, gate, bias, delta_softplus=True, cache_indices=table,
                               has_initial_state=torch.tensor([True, True], device=device),
                               query_start_loc=torch.tensor([0, 9, 11], dtype=torch.int32, device=device),
                               block_size=K, cu_chunk_seqlen=cu_chunk, last_chunk_indices=last_chunk,
                               **apc_meta(ctx, lens, K, device))
    np.testing.assert_allclose(y[:, :9].cpu().numpy(), r0.ref(15)[0][:, 6:], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(y[:, 9:].cpu().numpy(), r1.ref(11)[0][:, 9:], rtol=RTOL, atol=ATOL)
    want = {int(tab[0, 1]): r0.ref(8)[1], int(tab[0, 2]): r0.ref(12)[1], int(tab[0, 3]): r0.ref(15)[1],
            int(tab[1, 2]): r1.ref(11)[1], int(tab[0, 0]): before[int(tab[0, 0])].numpy(),
            int(tab[1, 0]): before[int(tab[1, 0])].numpy(), int(tab[1, 1]): before[int(tab[1, 1])].numpy()}
    check_pool(pool, before, want, device)


# ------------------------------------------------------------------------------------------------ Mamba-2 decode
@pytest.mark.parametrize("device", DEVICES)
def test_mamba2_decode_call(device):
    """mamba_mixer2.py's decode step: heads form with A, dt, dt_bias and D expanded over headdim (stride 0), B and C
    views of the conv output, z=None and dt_bias by keyword, separate input/output slots, out a view of the
    preallocated output; a padding entry in the CUDA-graph batch."""
    rng = np.random.default_rng(5)
    nd, H, P, N, G, S = 4, 4, 8, 16, 2, 9
    A_h = -torch.rand(H, device=device) - 0.5
    dt_h = torch.randn(nd, H, device=device)
    bias_h, D_h = torch.rand(H, device=device) - 2, torch.randn(H, device=device)
    xbc = torch.randn(nd, H * P + 2 * G * N, device=device)
    x, Bf, Cf = torch.split(xbc, [H * P, G * N, G * N], dim=-1)
    A_d = A_h[:, None, ...][:, :, None].expand(-1, P, N).to(dtype=torch.float32)
    dt_d = dt_h[:, :, None].expand(-1, -1, P)
    dt_bias = bias_h[:, None, ...].expand(-1, P)
    D_d = D_h[:, None, ...].expand(-1, P)
    B_d, C_d = Bf.view(-1, G, Bf.shape[1] // G), Cf.view(-1, G, Cf.shape[1] // G)
    x_d = x.view(-1, H, P)
    state = torch.randn(S, H, P, N, device=device)
    before = state.cpu().clone()
    src = torch.tensor([4, 0, -1, 7], dtype=torch.int32, device=device)
    dst = torch.tensor([5, 0, 2, 8], dtype=torch.int32, device=device)
    pre = torch.full((nd, H * P), float("nan"), device=device)
    vllm.selective_state_update(state, x_d, dt_d, A_d, B_d, C_d, D_d, z=None, dt_bias=dt_bias, dt_softplus=True,
                                state_batch_indices=src, dst_state_batch_indices=dst,
                                out=pre.view(nd, -1, P))
    c = lambda t: t.cpu().numpy()  # noqa: E731
    want_out, want_state = ref_update(c(before), c(x_d), c(dt_d), c(A_d), c(B_d), c(C_d), c(D_d), None, c(dt_bias),
                                      True, c(src), -1, c(dst))
    np.testing.assert_allclose(c(pre).reshape(nd, H, P), want_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(c(state), want_state, rtol=RTOL, atol=ATOL)
    assert torch.equal(state.cpu()[[1, 2, 3, 4, 6, 7]], before[[1, 2, 3, 4, 6, 7]])  # 2: padding's dst


# ------------------------------------------------------------------------------------------------ spec decoding
def spec_case(rng, device, lens, M, heads=False):
    dim, N = 16, 8
    n = len(lens)
    total = int(sum(lens))
    acc = np.array([0, M] + list(rng.integers(0, M + 1, n - 2)))[:n]
    state = rng.standard_normal((50,) + ((4, dim // 4) if heads else (dim,)) + (N,)).astype(np.float32)
    idx = np.zeros((n, M), np.int32)  # vLLM's tests: NULL_BLOCK_ID (0) everywhere but the initial slot
    init = rng.integers(1, 15, n)
    for b in range(n):
        idx[b, max(acc[b] - 1, 0)] = init[b]
    dst = np.zeros((n, M), np.int32)
    nxt = 15
    for b in range(n):
        for t in range(lens[b]):
            dst[b, t] = nxt
            nxt += 1
    ch = (4, dim // 4) if heads else (dim,)
    a = dict(x=rng.standard_normal((total,) + ch), dt=rng.standard_normal((total,) + ch),
             A=-rng.random(ch + (N,)) - 1, B=rng.standard_normal((total, N)), C=rng.standard_normal((total, N)),
             D=rng.standard_normal(ch), z=rng.standard_normal((total,) + ch), dt_bias=rng.random(ch) - 4)
    t = {k: torch.from_numpy(v.astype(np.float32)).to(device) for k, v in a.items()}
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return (t, torch.from_numpy(state).to(device), torch.from_numpy(idx).to(device), torch.from_numpy(dst).to(device),
            torch.from_numpy(acc.astype(np.int32)).to(device), torch.from_numpy(cu).to(device), init)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lens", [[1, 3, 2, 3], [3, 3, 3, 3]])
@pytest.mark.parametrize("heads", [False, True])
def test_speculative_decoding_per_token_states(device, lens, heads):
    """num_accepted_tokens with cu_seqlens (vLLM's test_selective_state_update_with_num_accepted_tokens): each
    sequence starts from state_batch_indices[b][max(accepted - 1, 0)], every token's state lands in its own
    destination slot, slots nobody writes keep their bits. Equal lengths run on strided views, others gather."""
    rng = np.random.default_rng(6)
    M = 3
    t, state, idx, dst, acc, cu, init = spec_case(rng, device, lens, M, heads)
    before = state.cpu().clone()
    out = torch.full_like(t["x"], float("nan"))
    vllm.selective_state_update(state, t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"], z=t["z"],
                                dt_bias=t["dt_bias"], dt_softplus=True, out=out, cu_seqlens=cu,
                                state_batch_indices=idx, dst_state_batch_indices=dst, num_accepted_tokens=acc,
                                null_block_id=0)
    c = lambda v: v.cpu().numpy()  # noqa: E731
    cus = c(cu)
    written = []
    for b in range(len(lens)):
        s = c(before)[init[b]][None]
        for k in range(lens[b]):
            r = cus[b] + k
            o, s = ref_update(s, c(t["x"])[r:r + 1], c(t["dt"])[r:r + 1], c(t["A"]), c(t["B"])[r:r + 1],
                              c(t["C"])[r:r + 1], c(t["D"]), c(t["z"])[r:r + 1], c(t["dt_bias"]), True)
            np.testing.assert_allclose(c(out)[r], o[0], rtol=RTOL, atol=ATOL)
            slot = int(c(dst)[b, k])
            np.testing.assert_allclose(c(state)[slot], s[0], rtol=RTOL, atol=ATOL)
            written.append(slot)
    keep = [i for i in range(state.shape[0]) if i not in written]
    assert torch.equal(state.cpu()[keep], before[keep])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lens", [[2, 1, 3], [2, 2, 2]])
def test_packed_tokens_without_speculation(device, lens):
    """cu_seqlens alone (vLLM's test_selective_state_update_varlen): each sequence runs its tokens from its line
    and keeps its final state there; the state has one line per sequence and no indices are given."""
    rng = np.random.default_rng(7)
    dim, N, n = 16, 8, len(lens)
    total = sum(lens)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=device)
    state = torch.randn(n, dim, N, device=device)
    before = state.cpu().numpy().copy()
    x, dt, z = (torch.randn(total, dim, device=device) for _ in range(3))
    B, C = torch.randn(total, N, device=device), torch.randn(total, N, device=device)
    A, D, bias = -torch.rand(dim, N, device=device) - 1, torch.randn(dim, device=device), torch.rand(dim,
                                                                                                      device=device) - 4
    out = torch.empty_like(x)
    vllm.selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, out=out,
                                cu_seqlens=cu)
    c = lambda v: v.cpu().numpy()  # noqa: E731
    q = c(cu)
    for b in range(n):
        s = before[b:b + 1]
        for r in range(q[b], q[b + 1]):
            o, s = ref_update(s, c(x)[r:r + 1], c(dt)[r:r + 1], c(A), c(B)[r:r + 1], c(C)[r:r + 1], c(D),
                              c(z)[r:r + 1], c(bias), True)
            np.testing.assert_allclose(c(out)[r], o[0], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(c(state)[b], s[0], rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------------------------------------ conventions
def test_null_block_id_and_default_pad():
    """null_block_id (vLLM's newer name, NULL_BLOCK_ID = 0) marks padding like pad_slot_id; the default is
    PAD_SLOT_ID (-1)."""
    rng = np.random.default_rng(8)
    dim, N = 8, 4
    state = torch.randn(4, dim, N)
    x, dt = torch.randn(3, dim), torch.randn(3, dim)
    B, C, A = torch.randn(3, N), torch.randn(3, N), -torch.rand(dim, N)
    idx = torch.tensor([2, 0, 3], dtype=torch.int32)
    for kw, padded in (({"null_block_id": 0}, 1), ({}, None), ({"pad_slot_id": 3}, 2)):
        st = state.clone()
        out = vllm.selective_state_update(st, x, dt, A, B, C, state_batch_indices=idx, out=torch.empty_like(x), **kw)
        pad = kw.get("null_block_id", kw.get("pad_slot_id", -1))
        want_out, want_state = ref_update(state.numpy(), x.numpy(), dt.numpy(), A.numpy(), B.numpy(), C.numpy(),
                                          idx=idx.numpy(), pad=pad)
        np.testing.assert_allclose(out.numpy(), want_out, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(st.numpy(), want_state, rtol=RTOL, atol=ATOL)
        if padded is not None:
            assert torch.all(out[padded] == 0)
    del rng


def test_errors_name_the_argument():
    rng = np.random.default_rng(9)
    w = Weights(rng)
    A, D, bias = w.torch("cpu")
    r = Request(rng, 8, w)
    u, dt, B, C, gate = mixer_views(w, [(r, 0, 8)], "cpu")
    qsl = torch.tensor([0, 8], dtype=torch.int32)
    pool16 = torch.zeros(2, w.dim, w.N, dtype=torch.bfloat16)
    with pytest.raises(selscan.SelscanError, match="ssm_states: dtype torch.bfloat16.*mamba_ssm_cache_dtype"):
        vllm.selective_scan_fn(u, pool16, dt, A, B, C, D, gate, bias, True, query_start_loc=qsl)
    pool = torch.zeros(6, w.dim, w.N)
    table = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    meta = apc_meta([4], [8], 4, "cpu")
    meta["block_idx_last_scheduled_token"] = torch.tensor([2], dtype=torch.int32)  # (4 + 8 - 1) // 4 = 2: right
    meta["initial_state_idx"] = torch.tensor([2], dtype=torch.int32)  # should be 0
    with pytest.raises(selscan.SelscanError, match=r"initial_state_idx\[0\]: expected 0"):
        vllm.selective_scan_fn(u, pool, dt, A, B, C, D, gate, bias, True, query_start_loc=qsl, cache_indices=table,
                               has_initial_state=torch.tensor([True]), block_size=4, **meta)
    meta["initial_state_idx"] = torch.tensor([1], dtype=torch.int32)  # inside block 1, without the chunks
    with pytest.raises(selscan.SelscanError, match=r"initial_state_idx\[0\]: 1.*needs cu_chunk_seqlen"):
        vllm.selective_scan_fn(u, pool, dt, A, B, C, D, gate, bias, True, query_start_loc=qsl, cache_indices=table,
                               has_initial_state=torch.tensor([True]), block_size=4, **meta)
    meta = apc_meta([4], [8], 4, "cpu")
    meta["block_idx_last_scheduled_token"] = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(selscan.SelscanError, match=r"block_idx_last_scheduled_token\[0\]: expected 2"):
        vllm.selective_scan_fn(u, pool, dt, A, B, C, D, gate, bias, True, query_start_loc=qsl, cache_indices=table,
                               has_initial_state=torch.tensor([True]), block_size=4, **meta)
    x = torch.randn(4, w.dim)
    with pytest.raises(selscan.SelscanError, match="enable_stochastic_rounding"):
        vllm.selective_state_update(pool, x, x, A, torch.randn(4, w.N), torch.randn(4, w.N),
                                    out=torch.empty_like(x), enable_stochastic_rounding=True)
    # speculative decoding: a token that is not its sequence's last without a destination slot
    idx = torch.tensor([[1, 0], [2, 0]], dtype=torch.int32)
    dst = torch.tensor([[3, 0], [4, 5]], dtype=torch.int32)
    with pytest.raises(selscan.SelscanError, match=r"dst_state_batch_indices\[0\]\[0\]: pad_slot_id"):
        vllm.selective_state_update(pool, x, x, A, torch.randn(4, w.N), torch.randn(4, w.N), out=torch.empty_like(x),
                                    cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32), state_batch_indices=idx,
                                    dst_state_batch_indices=torch.tensor([[0, 0], [4, 5]], dtype=torch.int32),
                                    num_accepted_tokens=torch.tensor([1, 1], dtype=torch.int32), null_block_id=0)
    del dst
