"""vLLM's Mamba ops on libselscan: the signatures, layouts and index conventions of
vllm/model_executor/layers/mamba/ops/mamba_ssm.py, so that vLLM's Mamba layers can call selscan in place of
vLLM's own kernels:

    from selscan.integrations.vllm import selective_scan_fn, selective_state_update

selective_scan_fn is the prefill (packed sequences, a state pool with cache indices, padding, block-wise state
caching for prefix caching); selective_state_update is the decode step (in-place or destination slots, padded
CUDA-graph batches, and the speculative-decoding form with num_accepted_tokens and cu_seqlens). torch tensors,
CPU or CUDA (the current stream of the tensors' device). docs/serving.md, section "vLLM", says what is mapped how
and where the semantics differ; in short:

- The caller's tensors go to the C ABI as they are (views, strides, broadcasts). The copies are vLLM's own (its
  wrapper makes u, delta, B, C, z contiguous along time and D contiguous) and, in the prefill, the output: the
  library writes it to separate tensors (an output may not share memory with an input), which are copied into
  delta and z afterwards, as vLLM's kernel writes them in place.
- Built per call: in the prefill, with prefix caching, the context lengths (a few integer ops on the index
  tensors, on their device); without has_initial_state a cached tensor of zeros. In the decode step nothing (the
  indices are used as given, or as column views); with num_accepted_tokens the initial slots (one gather) and the
  per-token source slots (one (batch, tokens) tensor), and one library call per token.
- Padding entries get zero outputs (vLLM's kernels leave them unwritten).
"""

import torch

from .. import _core, _decode, _decode_torch, _lib  # noqa: F401  (_decode_torch: torch tensors take torch_step)
from .._backends import TorchBackend
from .._lib import SelscanError

__all__ = ["selective_scan_fn", "selective_state_update", "PAD_SLOT_ID"]

# The index value that marks padding when neither pad_slot_id nor null_block_id is passed: vLLM's PAD_SLOT_ID.
# vLLM versions that name the argument null_block_id use its NULL_BLOCK_ID, 0: pass null_block_id=0 (or set this
# to 0 once, before the first call).
PAD_SLOT_ID = -1

_step = _decode.torch_step
_STATUS = {name: code for code, name in _lib.STATUS_NAMES.items()}
_consts = {}  # (kind, n, device) -> a constant index tensor: zeros (has_initial_state) or arange (slots)


def _const(kind, n, device):
    key = (kind, n, device)
    t = _consts.get(key)
    if t is None:
        if len(_consts) > 64:
            _consts.clear()
        t = (torch.zeros(n, dtype=torch.bool, device=device) if kind == "zeros"
             else torch.arange(n, dtype=torch.int64, device=device))
        _consts[key] = t
    return t


def _pad(pad_slot_id, null_block_id):
    if null_block_id is not None:
        return int(null_block_id)
    return PAD_SLOT_ID if pad_slot_id is None else int(pad_slot_id)


def _fail(msg, status=_lib.STATUS_INVALID_ARGUMENT):
    return SelscanError(msg, status, "selscan.integrations.vllm")


def _rows(t):
    """vLLM's layout rule: unit stride along time (its wrapper copies otherwise; so does this one)."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


# ------------------------------------------------------------------------------------------------ prefill
def _context_lens(K, first, initial_state_idx, has_init, cu_chunk_seqlen, last_chunk_indices):
    """The tokens each sequence processed before this call, from vLLM's block pointers (on their device).

    vLLM gives the block of the first scheduled token (c // K) and, with cu_chunk_seqlen / last_chunk_indices, the
    chunks of each sequence, the first of which fills the rest of a started block: then c = first * K + (K - the
    first chunk's tokens). A sequence of one chunk that resumes inside a block (its initial block is its first
    block) gets c = first * K + 1: any offset inside that block starts from, and ends in, the same block."""
    first = first.long()
    n = first.shape[0]
    c = first * K
    offset = None
    if cu_chunk_seqlen is not None and last_chunk_indices is not None:
        last = last_chunk_indices[:n].long()
        first_chunk = torch.cat([last.new_zeros(1), last[:-1] + 1])
        cc = cu_chunk_seqlen.long()
        first_tokens = cc[first_chunk + 1] - cc[first_chunk]
        offset = torch.where((last > first_chunk) & (first_tokens < K), K - first_tokens, 0)
        c = c + offset
    if initial_state_idx is not None and has_init is not None:
        inside = has_init[:n].bool() & (initial_state_idx[:n].long() == first)
        if offset is not None:
            inside = inside & (offset == 0)
        c = c + inside.long()
    return c


def _check_blocks(K, ctx, lens, table, has_init, initial_state_idx, last_idx, pad, first, chunks):
    """CPU calls: vLLM's block pointers must say what the context lengths imply (the library reads the blocks from
    the context lengths; a disagreement would read or write other blocks than vLLM's kernel). Padding sequences
    (vLLM's test: the entry of the initial block is the pad value) are not checked."""
    n = ctx.shape[0]
    if table.dim() != 2 or table.shape[0] < n:
        raise _fail(f"cache_indices: with block_idx_first_scheduled_token (prefix caching) expected a block table "
                    f"(sequences, blocks) with >= {n} rows, got shape {tuple(table.shape)}")
    real = lens > 0
    if initial_state_idx is not None:
        first_entry = table[:n].gather(1, initial_state_idx[:n].long().clamp(0, table.shape[1] - 1).unsqueeze(1))
        real = real & (first_entry.squeeze(1) != pad)
    start = real & has_init[:n].bool() if has_init is not None else torch.zeros_like(real)
    bad = start & (ctx <= 0)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise _fail(f"has_initial_state[{b}]: set, but block_idx_first_scheduled_token[{b}] and initial_state_idx "
                    f"give no tokens before this call (context 0); a prefill that resumes inside a block needs "
                    f"cu_chunk_seqlen and last_chunk_indices (or block-aligned chunks)")
    if initial_state_idx is not None and not chunks:
        bad = start & (initial_state_idx[:n].long() == first[:n].long()) & ((ctx + lens - 1) // K > first[:n].long())
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise _fail(f"initial_state_idx[{b}]: {int(initial_state_idx[b])}, the block of the first scheduled "
                        f"token: the sequence resumes inside a block and its tokens reach the next; where its block "
                        f"ends lie needs cu_chunk_seqlen and last_chunk_indices")
    if initial_state_idx is not None:
        want = (ctx - 1).div(K, rounding_mode="floor")
        bad = start & (initial_state_idx.long()[:n] != want)
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise _fail(f"initial_state_idx[{b}]: expected {int(want[b])}, the block of token {int(ctx[b]) - 1} "
                        f"(the last one before this call, block size {K}), got {int(initial_state_idx[b])}")
    if last_idx is not None:
        want = (ctx + lens - 1).div(K, rounding_mode="floor")
        bad = real & (last_idx.long()[:n] != want)
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise _fail(f"block_idx_last_scheduled_token[{b}]: expected {int(want[b])}, the block of token "
                        f"{int(ctx[b] + lens[b]) - 1} (this call's last, block size {K}), got {int(last_idx[b])}")


def selective_scan_fn(u, ssm_states, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      query_start_loc=None, cache_indices=None, has_initial_state=None, pad_slot_id=None,
                      block_size=1024, block_idx_first_scheduled_token=None, block_idx_last_scheduled_token=None,
                      initial_state_idx=None, cu_chunk_seqlen=None, last_chunk_indices=None, *, null_block_id=None):
    """vLLM's selective_scan_fn: the prefill scan, state pool updated in place, output written over delta (and,
    with z, the gated output over z); returns z if given, else delta (after vLLM's contiguity copies, as vLLM).

    u, delta, z: (dim, total_tokens) with query_start_loc (batch + 1,) int32, else (batch, dim, seqlen);
    B, C: (ngroups, dstate, total_tokens) or (dstate, total_tokens), else (batch, [ngroups,] dstate, seqlen);
    ssm_states: (cache lines, dim, dstate) float32 (or (lines, heads, headdim, dstate) viewable as that);
    cache_indices: (batch,) slots, or with prefix caching (block_idx_first_scheduled_token given) the block table
    (batch, blocks) of block_size-token blocks; has_initial_state (batch,) bool, absent: every sequence starts from
    zero; pad_slot_id (or null_block_id): the index entry that marks a padding sequence.
    Prefix caching: the initial state is read from the block before the first scheduled token, the state at every
    block end inside the call is written to that block's slot, the final state to block_idx_last_scheduled_token's.
    """
    pad = _pad(pad_slot_id, null_block_id)
    u, delta, B, C, z = _rows(u), _rows(delta), _rows(B), _rows(C), _rows(z)
    if D is not None:
        D = D.contiguous()
    varlen = query_start_loc is not None
    if varlen:
        if B.dim() == 2:
            B = B.unsqueeze(0)
        if C.dim() == 2:
            C = C.unsqueeze(0)
        u3, delta3, B4, C4 = u.unsqueeze(0), delta.unsqueeze(0), B.unsqueeze(0), C.unsqueeze(0)
        z3 = None if z is None else z.unsqueeze(0)
        seqs = query_start_loc.shape[0] - 1
    else:
        u3, delta3, B4, C4, z3 = u, delta, B, C, z
        seqs = u.shape[0]
    pool = ssm_states
    if pool.dim() == 4:
        try:
            pool = pool.view(pool.shape[0], -1, pool.shape[-1])
        except RuntimeError:
            raise _fail(f"ssm_states: a (lines, heads, headdim, dstate) pool must be viewable as (lines, dim, dstate) "
                        f"(it is updated in place), got strides {tuple(ssm_states.stride())}",
                        _STATUS["BAD_LAYOUT"]) from None
    if pool.dtype != A.dtype:
        raise _fail(f"ssm_states: dtype {pool.dtype} cannot be used: the scan reads and writes its state pool in A's "
                    f"dtype ({A.dtype}); run vLLM with mamba_ssm_cache_dtype=float32", _lib.STATUS_DTYPE_MISMATCH)
    his = has_initial_state
    if his is None:  # vLLM: no initial states (the library's default is to start from the slots)
        his = _const("zeros", seqs, u.device)
    table = ctx = None
    K = 0
    ci = cache_indices
    if block_idx_first_scheduled_token is not None:  # prefix caching: cache_indices is the block table
        K = int(block_size)
        table, ci = cache_indices, None
        ctx = _context_lens(K, block_idx_first_scheduled_token[:seqs], initial_state_idx, has_initial_state,
                            cu_chunk_seqlen, last_chunk_indices)
        if u.device.type == "cpu":
            lens = (query_start_loc[1:] - query_start_loc[:-1]).long() if varlen else torch.full(
                (seqs,), u.shape[-1], dtype=torch.long)
            _check_blocks(K, ctx, lens, table, has_initial_state, initial_state_idx, block_idx_last_scheduled_token,
                          pad, block_idx_first_scheduled_token, cu_chunk_seqlen is not None)
        table = table[:seqs]
    elif ci is None and pool.shape[0] != seqs:  # vLLM: sequence b uses line b of a larger pool
        ci, pad = _const("arange", seqs, u.device), -1
    be = TorchBackend(u3)
    p = _core.prepare(be, u3, delta3, A, B4, C4, D, z3, delta_bias)
    sv = _core.Serving(be, query_start_loc, pool, ci, his, pad, table, ctx, K)
    r = _core.run_fwd(p, bool(delta_softplus), serving=sv)
    delta3.copy_(r["out"])  # vLLM's kernel writes out over delta and out * silu(z) over z
    if z is None:
        return delta
    z3.copy_(r["out_z"])
    return z


# ------------------------------------------------------------------------------------------------ decode
def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, dst_state_batch_indices=None, pad_slot_id=None, out=None,
                           num_accepted_tokens=None, cu_seqlens=None, is_blackwell=False,
                           enable_stochastic_rounding=False, cache_philox_rounds=0, *, null_block_id=None):
    """vLLM's selective_state_update: one decode step, state updated in place, output written into `out`
    (allocated when None; returned either way, where vLLM returns nothing).

    state: (lines, dim, dstate) or (lines, heads, headdim, dstate); x, dt, z: (batch, dim) or (batch, heads,
    headdim); with cu_seqlens (batch + 1,) the tokens of all sequences packed: (total_tokens, ...). B, C: (batch or
    total_tokens, [ngroups,] dstate). state_batch_indices / dst_state_batch_indices: (batch,) or (batch, tokens):
    the slot each sequence reads and the slot it writes (in place without dst). num_accepted_tokens (batch,):
    speculative decoding: sequence b starts from slot state_batch_indices[b][max(n - 1, 0)] and the state after
    its token t is written to dst_state_batch_indices[b][t] (not where that is padding). is_blackwell is a tuning
    hint (ignored); stochastic rounding of 16-bit states is not supported.
    """
    if enable_stochastic_rounding:
        raise _fail("enable_stochastic_rounding: not supported (the state is rounded to nearest)",
                    _STATUS["UNSUPPORTED"])
    pad = PAD_SLOT_ID if pad_slot_id is None and null_block_id is None else _pad(pad_slot_id, null_block_id)
    idx, dst = state_batch_indices, dst_state_batch_indices
    if cu_seqlens is None and num_accepted_tokens is None:
        n = x.shape[0]
        if idx is None:  # vLLM: sequence b uses line b, in place (a dst is ignored)
            dst = None
            if state.shape[0] != n:
                idx, pad = _const("arange", n, x.device), -1
        elif idx.dim() == 2 or idx.shape[0] != n:
            idx = idx[:n, 0] if idx.dim() == 2 else idx[:n]
        if dst is not None and (dst.dim() == 2 or dst.shape[0] != n):
            dst = dst[:n, 0] if dst.dim() == 2 else dst[:n]
        return _step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad, dst, out, 0)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return _tokens(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, dst, pad, out, num_accepted_tokens,
                   cu_seqlens)


def _tokens(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx, dst, pad, out, accepted, cu):
    """The multi-token forms: speculative decoding (per-token destination slots) and packed sequences."""
    dev = x.device
    n = x.shape[0] if cu is None else cu.shape[0] - 1
    if idx is None:  # vLLM: sequence b reads and writes line b (no padding)
        idx, dst, pad = _const("arange", n, dev), None, -1
    idx2 = (idx if idx.dim() == 2 else idx.unsqueeze(1))[:n]
    dst2 = idx2 if dst is None else (dst if dst.dim() == 2 else dst.unsqueeze(1))[:n]
    if accepted is not None:
        init = idx2.gather(1, (accepted[:n].long() - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    else:
        init = idx2[:, 0]
    if cu is None:  # one token per sequence
        return _step(state, x, dt, A, B, C, D, z, dt_bias, softplus, init, pad, dst2[:, 0], out, 0)
    total = x.shape[0]
    starts = cu[:-1].long()
    lens = cu[1:].long() - starts
    if accepted is None:
        # Each sequence's tokens in order, its final state to dst[b][0]. The lengths are read here (on CUDA a
        # synchronisation): equal lengths make one call of T tokens, others one call per token position.
        host = lens.tolist()
        M = max(host) if host else 0
        if M == 0:
            return out
        d0 = dst2[:, 0]
        if min(host) == M:
            v = _tok_views(n, M, x, dt, B, C, z, out)
            _step(state, v[0], v[1], A, v[2], v[3], D, v[4], dt_bias, softplus, init, pad, d0, v[5], 0)
            return out
        t_idx = torch.arange(M, device=dev)
        src = torch.where(t_idx == 0, init.unsqueeze(1), d0.unsqueeze(1))  # later tokens continue from d0
        dsts = d0.unsqueeze(1).expand(n, M)
    else:
        M = dst2.shape[1]  # vLLM's contract: at most one destination column per token
        src = torch.cat([init.unsqueeze(1), dst2[:, : M - 1]], 1)
        dsts = dst2
        t_idx = torch.arange(M, device=dev)
    live = (t_idx.unsqueeze(0) < lens.unsqueeze(1)) & (init != pad).unsqueeze(1)
    if dev.type == "cpu":
        if accepted is not None and n and int(lens.max()) > M:
            b = int((lens > M).nonzero()[0])
            raise _fail(f"cu_seqlens: sequence {b} has {int(lens[b])} tokens, more than the {M} columns of "
                        f"dst_state_batch_indices (one destination slot per token)")
        broken = live[:, 1:] & (src[:, 1:] == pad)
        if bool(broken.any()):
            b, t = (int(i) for i in broken.nonzero()[0])
            name = "dst_state_batch_indices" if dst is not None else "state_batch_indices"
            raise _fail(f"{name}[{b}][{t if accepted is not None else 0}]: pad_slot_id ({pad}) for a token that is "
                        f"not its sequence's last: the next token's step reads the state from that slot (vLLM keeps "
                        f"it in registers); give every token but the last a slot")
    src = torch.where(live, src, pad)
    if total == n * M:  # equal lengths: every step reads strided views of the caller's tensors
        v = _tok_views(n, M, x, dt, B, C, z, out)
        for t in range(M):
            _step(state, v[0][:, t], v[1][:, t], A, v[2][:, t], v[3][:, t], D, None if z is None else v[4][:, t],
                  dt_bias, softplus, src[:, t], pad, dsts[:, t], v[5][:, t], 0)
        return out
    # Unequal lengths: each step gathers its tokens' rows and scatters its outputs (rows past a sequence's end go
    # to a spare row).
    spare = out.new_empty((total + 1,) + tuple(out.shape[1:]))
    for t in range(M):
        rows = (starts + t).clamp(max=total - 1)
        g = [a.index_select(0, rows) for a in (x, dt, B, C)]
        zt = None if z is None else z.index_select(0, rows)
        ot = torch.empty_like(g[0])
        _step(state, g[0], g[1], A, g[2], g[3], D, zt, dt_bias, softplus, src[:, t], pad, dsts[:, t], ot, 0)
        spare.index_copy_(0, torch.where(live[:, t], starts + t, total), ot)
    out.copy_(spare[:total])
    return out


def _tok_views(n, M, x, dt, B, C, z, out):
    """(sequences, tokens, ...) views of packed (sequences * tokens, ...) tensors."""
    return [None if a is None else a.view((n, M) + tuple(a.shape[1:])) for a in (x, dt, B, C, z, out)]
