"""The causal depthwise convolution (selscan.causal_conv1d_fn / _update / _bwd, selscan.torch's autograd versions
and the selscan::causal_conv1d_* ops) against float64 references written here from the math of header section 5c
and causal-conv1d's semantics: numpy (CPU path), torch on CPU (autograd against F.conv1d in float64, torch.compile),
CUDA tensors, CUDA graphs and CuPy where available (skipped with the reason otherwise)."""

import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import selscan
from selscan import _lib, _plan
from conftest import REPO, checkout_path, torch_cuda_skip_reason

torch = None
try:
    import torch  # noqa: F811
    import torch.nn.functional as F
except ImportError:
    pass

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
# The entry points arrived with ABI 0.5; a library without them fails every call with a SelscanError naming it.
needs_conv1d = pytest.mark.skipif(not hasattr(_lib.lib, "selscan_conv1d_fwd"),
                                  reason=f"{_lib.library_path} has no selscan_conv1d_fwd (built before ABI 0.5)")
_cuda_reason = torch_cuda_skip_reason()
needs_cuda = pytest.mark.skipif(_cuda_reason is not None, reason=str(_cuda_reason))

TOL = {np.dtype(np.float32): (1e-5, 1e-5), np.dtype(np.float16): (2e-3, 2e-3)}


# ------------------------------------------------------------------------------------------------ references
def f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _silu(y):
    return y / (1 + np.exp(-y))


def _terms(x, w, seq_idx, init):
    """xe (B, D, L+W-1): the inputs at times -(W-1) .. L-1 (initial states, or 0, before 0), and per tap k the mask
    (B, 1, L) of the terms that count (seq_idx: same sequence, position >= 0)."""
    x, w = f64(x), f64(w)
    bt, dm, L = x.shape
    W = w.shape[1]
    prior = np.zeros((bt, dm, W - 1)) if init is None else f64(init)
    xe = np.concatenate([prior, x], axis=2)
    masks = []
    for k in range(W):
        if seq_idx is None:
            masks.append(np.ones((bt, 1, L)))
            continue
        t = np.arange(L)
        tp = t - (W - 1) + k
        s = np.asarray(seq_idx)
        same = s[:, np.clip(tp, 0, None)] == s
        masks.append(((tp >= 0)[None, :] & same)[:, None, :].astype(np.float64))
    return xe, masks


def ref_fwd(x, w, bias=None, seq_idx=None, init=None, silu=False):
    """float64 (out, final_states) of causal_conv1d_fn."""
    xe, masks = _terms(x, w, seq_idx, init)
    w = f64(w)
    bt, dm, L = np.shape(x)
    W = w.shape[1]
    y = np.zeros((bt, dm, L)) + (0 if bias is None else f64(bias)[None, :, None])
    for k in range(W):
        y += w[None, :, k, None] * xe[:, :, k:k + L] * masks[k]
    if silu:
        y = _silu(y)
    if seq_idx is not None:
        y = np.where((np.asarray(seq_idx) < 0)[:, None, :], 0.0, y)
    return y, xe[:, :, L:]


def ref_bwd(dout, x, w, bias=None, seq_idx=None, init=None, dfinal=None, silu=False):
    """float64 (dx, dweight, dbias, dinitial_states) of sum(dout * out) + sum(dfinal * final_states)."""
    xe, masks = _terms(x, w, seq_idx, init)
    w = f64(w)
    bt, dm, L = np.shape(x)
    W = w.shape[1]
    y = np.zeros((bt, dm, L)) + (0 if bias is None else f64(bias)[None, :, None])
    for k in range(W):
        y += w[None, :, k, None] * xe[:, :, k:k + L] * masks[k]
    dy = f64(dout)
    if silu:
        s = 1 / (1 + np.exp(-y))
        dy = dy * s * (1 + y * (1 - s))
    if seq_idx is not None:
        dy = np.where((np.asarray(seq_idx) < 0)[:, None, :], 0.0, dy)
    dxe = np.zeros_like(xe)
    dw = np.zeros((dm, W))
    for k in range(W):
        dk = dy * masks[k]
        dw[:, k] = (dk * xe[:, :, k:k + L]).sum(axis=(0, 2))
        dxe[:, :, k:k + L] += w[None, :, k, None] * dk
    if dfinal is not None:
        dxe[:, :, L:] += f64(dfinal)
    return dxe[:, :, W - 1:], dw, None if bias is None else dy.sum(axis=(0, 2)), dxe[:, :, :W - 1]


def ref_serving(x, w, bias=None, silu=False, cu=None, init=None, pool=None, idx=None, has_init=None, pad=-1):
    """float64 (out, final_states (n, D, W-1), the pool afterwards, padding sequences) of a serving call."""
    x, w = f64(x), f64(w)
    W = w.shape[1]
    dm = x.shape[1]
    n = x.shape[0] if cu is None else len(cu) - 1
    out = np.zeros(x.shape)
    final = np.zeros((n, dm, W - 1))
    new_pool = None if pool is None else f64(pool).copy()
    padding = []
    for b in range(n):
        span = (b, slice(None)) if cu is None else (0, slice(int(cu[b]), int(cu[b + 1])))
        xs = x[span[0], :, span[1]]
        slot = b if idx is None else int(idx[b])
        if idx is not None and slot == pad:  # out 0, final_states row 0, no slot touched
            padding.append(b)
            final[b] = 0
            continue
        start = has_init is None or bool(has_init[b])
        if pool is not None:
            prior = f64(pool)[slot] if start else np.zeros((dm, pool.shape[2]))
        elif init is not None and start:
            prior = f64(init)[b]
        else:
            prior = np.zeros((dm, W - 1))
        o, _ = ref_fwd(xs[None], w, bias, init=prior[None, :, prior.shape[1] - (W - 1):], silu=silu)
        out[span[0], :, span[1]] = o[0]
        xe = np.concatenate([prior, xs], axis=1)
        final[b] = xe[:, xe.shape[1] - (W - 1):]
        if pool is not None and xs.shape[1] > 0:  # an empty sequence reads and writes no slot
            new_pool[slot] = xe[:, xe.shape[1] - pool.shape[2]:]
    return out, final, new_pool, padding


def ref_update(x, state, w, bias=None, silu=False, cache_seqlens=None, idx=None, pad=-1):
    """float64 (out, the state pool afterwards) of causal_conv1d_update."""
    x, w = f64(x), f64(w)
    squeeze = x.ndim == 2
    if squeeze:
        x = x[:, :, None]
    bt, dm, T = x.shape
    W = w.shape[1]
    new = f64(state).copy()
    sl = new.shape[2]
    out = np.zeros(x.shape)
    for b in range(bt):
        slot = b if idx is None else int(idx[b])
        if idx is not None and slot == pad:
            continue
        s = new[slot].copy()
        if cache_seqlens is None:
            window = s[:, sl - (W - 1):]
            new[slot] = np.concatenate([s, x[b]], axis=1)[:, -sl:]
        else:
            c = int(cache_seqlens[b])
            window = s[:, [(c - (W - 1) + j) % sl for j in range(W - 1)]]
            for i in range(T):
                new[slot][:, (c + i) % sl] = x[b][:, i]
        o, _ = ref_fwd(x[b][None], w, bias, init=window[None], silu=silu)
        out[b] = o[0]
    return (out[:, :, 0] if squeeze else out), new


# ------------------------------------------------------------------------------------------------ helpers
def channel_last(a):
    """The same values with stride 1 over channels (causal-conv1d's channel-last layout)."""
    if torch is not None and isinstance(a, torch.Tensor):
        return a.transpose(1, 2).contiguous().transpose(1, 2)
    return np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)


def case(rng, Bt=2, Dm=6, L=19, W=4, dtype=np.float32, bias=True, init=False):
    x = rng.standard_normal((Bt, Dm, L)).astype(dtype)
    w = (0.5 * rng.standard_normal((Dm, W))).astype(np.float32)
    b = (0.5 * rng.standard_normal(Dm)).astype(np.float32) if bias else None
    h = rng.standard_normal((Bt, Dm, W - 1)).astype(dtype) if init else None
    return x, w, b, h


def close(got, want, dtype, scale=1.0):
    rtol, atol = TOL[np.dtype(dtype)]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol * scale)


def strides_of(a):
    return tuple(s // a.dtype.itemsize for s in a.strides)


# ------------------------------------------------------------------------------------------------ ABI mirror
C_LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include "selscan/selscan.h"
#define F(T, m) printf(#T " " #m " %zu\n", offsetof(T, m));
int main(void) {
  selscan_conv1d_fwd_args_t f = SELSCAN_CONV1D_FWD_ARGS_INIT;
  selscan_conv1d_bwd_args_t b = SELSCAN_CONV1D_BWD_ARGS_INIT;
  selscan_conv1d_update_args_t u = SELSCAN_CONV1D_UPDATE_ARGS_INIT;
  printf("selscan_conv1d_fwd_args_t sizeof %zu\n", sizeof f);
  printf("selscan_conv1d_bwd_args_t sizeof %zu\n", sizeof b);
  printf("selscan_conv1d_update_args_t sizeof %zu\n", sizeof u);
  printf("init fwd_pad %lld\n", (long long)f.pad_slot_id);
  printf("init update_pad %lld\n", (long long)u.pad_slot_id);
  printf("const SELSCAN_ACTIVATION_SILU %d\n", (int)SELSCAN_ACTIVATION_SILU);
  printf("const SELSCAN_ACTIVATION_NONE %d\n", (int)SELSCAN_ACTIVATION_NONE);
  %FIELDS%
  return 0;
}
"""


def test_struct_layout_and_init_defaults_match_header():
    checkout_path("include", "selscan", "selscan.h")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler on PATH to read the header's layout")
    py = {"selscan_conv1d_fwd_args_t": _lib.Conv1dFwdArgs, "selscan_conv1d_bwd_args_t": _lib.Conv1dBwdArgs,
          "selscan_conv1d_update_args_t": _lib.Conv1dUpdateArgs}
    fields = [f"F({c}, {name})" for c, s in py.items() for name, _ in s._fields_]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "layout.c")
        with open(src, "w") as f:
            f.write(C_LAYOUT.replace("%FIELDS%", " ".join(fields)))
        exe = os.path.join(tmp, "layout")
        subprocess.run([cc, "-std=c99", "-I", os.path.join(REPO, "include"), src, "-o", exe], check=True)
        lines = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines()
    made = {"fwd_pad": _lib.new_conv1d_fwd_args().pad_slot_id, "update_pad": _lib.new_conv1d_update_args().pad_slot_id}
    consts = {"SELSCAN_ACTIVATION_SILU": _lib.ACTIVATION_SILU, "SELSCAN_ACTIVATION_NONE": _lib.ACTIVATION_NONE}
    for line in lines:
        what, member, value = line.split()
        if what == "init":
            assert made[member] == int(value), f"{member}: the binding's struct starts with {made[member]}"
        elif what == "const":
            assert consts[member] == int(value), member
        else:
            got = ctypes.sizeof(py[what]) if member == "sizeof" else getattr(py[what], member).offset
            assert got == int(value), f"{what}.{member}: ctypes says {got}, the C header {value}"
    assert len(lines) == 3 + 2 + 2 + len(fields)
    for new, s in ((_lib.new_conv1d_fwd_args, _lib.Conv1dFwdArgs), (_lib.new_conv1d_bwd_args, _lib.Conv1dBwdArgs),
                   (_lib.new_conv1d_update_args, _lib.Conv1dUpdateArgs)):
        assert new().struct_size == ctypes.sizeof(s)


# ------------------------------------------------------------------------------------------------ numpy
@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("layout", ["channel_first", "channel_last", "strided"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@needs_conv1d
def test_numpy_forward(W, layout, dtype):
    rng = np.random.default_rng(W + 10 * (layout == "channel_last") + 20 * (layout == "strided"))
    x, w, b, h = case(rng, W=W, dtype=dtype, init=True)
    if layout == "channel_last":
        x = channel_last(x)
    elif layout == "strided":  # every other time step of a longer array
        x = np.repeat(x, 2, axis=2)[:, :, ::2]
    for silu, bias, init in ((False, None, None), (True, b, None), (True, b, h), (False, None, h)):
        want, want_fin = ref_fwd(x, w, bias, init=init, silu=silu)
        out, fin = selscan.causal_conv1d_fn(x, w, bias, initial_states=init, return_final_states=True,
                                            activation="silu" if silu else None)
        assert out.dtype == x.dtype and out.shape == x.shape and fin.dtype == x.dtype
        close(out, want, dtype)
        np.testing.assert_array_equal(fin.astype(np.float64), want_fin)  # copies of the inputs, exactly
        if layout != "strided":
            assert strides_of(out) == strides_of(x), "out is allocated in x's layout"
        layout_of_fin = fin.transpose(0, 2, 1) if layout == "channel_last" else fin
        assert layout_of_fin.flags.c_contiguous, "final_states in x's layout (channel-last or contiguous)"
        only = selscan.causal_conv1d_fn(x, w, bias, initial_states=init, activation="swish" if silu else None)
        np.testing.assert_array_equal(only, out)


@needs_conv1d
def test_numpy_final_states_out_and_short_sequences():
    rng = np.random.default_rng(3)
    for L in (1, 2, 3, 7):  # L < W-1: final_states holds initial states (or zeros) too
        x, w, b, h = case(rng, L=L, W=4, init=True)
        for init in (h, None):
            want, want_fin = ref_fwd(x, w, b, init=init)
            dst = np.full((x.shape[0], x.shape[1], 3), np.nan, np.float32)
            out, fin = selscan.causal_conv1d_fn(x, w, b, None, init, True, dst)
            assert fin is dst, "final_states_out is written and returned"
            close(out, want, np.float32)
            np.testing.assert_array_equal(dst, want_fin)
    # without return_final_states, final_states_out is ignored (causal-conv1d's behaviour)
    dst = np.full((x.shape[0], x.shape[1], 3), 7.0, np.float32)
    out = selscan.causal_conv1d_fn(x, w, b, final_states_out=dst)
    assert isinstance(out, np.ndarray) and np.all(dst == 7.0)


@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@needs_conv1d
def test_numpy_seq_idx(layout):
    rng = np.random.default_rng(5)
    x, w, b, _ = case(rng, Bt=2, L=23, W=4)
    seq = np.array([[0] * 5 + [1] * 2 + [2] * 9 + [-1] * 3 + [3] * 4,
                    [0] * 1 + [1] * 12 + [2] * 10], dtype=np.int32)
    if layout == "channel_last":
        x = channel_last(x)
    want, _ = ref_fwd(x, w, b, seq_idx=seq, silu=True)
    out = selscan.causal_conv1d_fn(x, w, b, seq, activation="silu")
    close(out, want, np.float32)
    assert np.all(out[0, :, 16:19] == 0), "positions with seq_idx < 0 are padding"
    out64 = selscan.causal_conv1d_fn(x, w, b, seq.astype(np.int64), activation="silu")  # int64: converted
    np.testing.assert_array_equal(out64, out)


@needs_conv1d
def test_numpy_float64_and_weight_dtypes():
    rng = np.random.default_rng(7)
    x, w, b, h = case(rng, init=True)
    out = selscan.causal_conv1d_fn(x.astype(np.float64), w, b)  # float64 computes in float32
    assert out.dtype == np.float32
    close(out, ref_fwd(x, w, b)[0], np.float32)
    xh = x.astype(np.float16)
    out = selscan.causal_conv1d_fn(xh, w.astype(np.float16), b.astype(np.float16))  # weight in x's dtype
    close(out, ref_fwd(xh, w.astype(np.float16), b.astype(np.float16))[0], np.float16)
    out = selscan.causal_conv1d_fn(xh, w, b.astype(np.float16))  # bias takes weight's dtype
    close(out, ref_fwd(xh, w, b.astype(np.float16))[0], np.float16)


@needs_conv1d
def test_numpy_backward():
    rng = np.random.default_rng(9)
    for W, layout, silu, with_init in ((4, "channel_first", True, True), (3, "channel_last", False, True),
                                       (2, "channel_first", True, False)):
        x, w, b, h = case(rng, W=W, init=with_init)
        if layout == "channel_last":
            x = channel_last(x)
        dout = rng.standard_normal(x.shape).astype(np.float32)
        dfin = rng.standard_normal((x.shape[0], x.shape[1], W - 1)).astype(np.float32)
        act = "silu" if silu else None
        dx, dw, db, dh = selscan.causal_conv1d_bwd(dout, x, w, b, None, h, dfin, act)
        want = ref_bwd(dout, x, w, b, None, h, dfin, silu)
        for name, got, ref in zip(("dx", "dweight", "dbias", "dinitial_states"), (dx, dw, db, dh), want):
            if got is None:
                assert name == "dinitial_states" and h is None
                continue
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=name)
        assert dx.shape == x.shape and dw.shape == w.shape and db.shape == b.shape
    # seq_idx
    x, w, b, _ = case(rng, L=17)
    seq = np.array([[0] * 6 + [-1] * 2 + [1] * 9, [2] * 17], dtype=np.int32)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    got = selscan.causal_conv1d_bwd(dout, x, w, b, seq, activation="silu")
    for g, r in zip(got[:3], ref_bwd(dout, x, w, b, seq, silu=True)[:3]):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    assert got[3] is None
    assert np.all(got[0][0, :, 6:8] == 0), "padding positions get no gradient"


def _varlen(rng, lens, Dm=6, W=4, dtype=np.float32):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = rng.standard_normal((1, Dm, int(cu[-1]))).astype(dtype)
    w = (0.5 * rng.standard_normal((Dm, W))).astype(np.float32)
    b = (0.5 * rng.standard_normal(Dm)).astype(np.float32)
    return cu, x, w, b


@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@needs_conv1d
def test_numpy_packed_sequences(layout):
    rng = np.random.default_rng(11)
    cu, x, w, b = _varlen(rng, [5, 1, 9, 2])
    if layout == "channel_last":
        x = channel_last(x)
    h = rng.standard_normal((4, 6, 3)).astype(np.float32)
    for init, cu_t in ((None, cu), (h, cu.astype(np.int64))):
        want, want_fin, _, _ = ref_serving(x, w, b, True, cu, init)
        out, fin = selscan.causal_conv1d_fn(x, w, b, initial_states=init, return_final_states=True,
                                            activation="silu", cu_seqlens=cu_t)
        close(out, want, np.float32)
        np.testing.assert_array_equal(fin, want_fin)
    # an empty sequence keeps its initial states as final states; has_initial_state; cache_indices without a pool
    # only marks padding (out 0, final_states row 0)
    cu2, x2, _, _ = _varlen(rng, [4, 0, 7, 3])
    for kw in (dict(init=h), dict(init=h, has_init=np.array([1, 1, 0, 1], np.int32)),
               dict(init=h, idx=np.array([0, 0, -1, 0], np.int64))):
        want, want_fin, _, _ = ref_serving(x2, w, b, False, cu2, **kw)
        out, fin = selscan.causal_conv1d_fn(x2, w, b, initial_states=h, return_final_states=True, cu_seqlens=cu2,
                                            has_initial_state=kw.get("has_init"), cache_indices=kw.get("idx"))
        close(out, want, np.float32)
        np.testing.assert_array_equal(fin, want_fin)
    np.testing.assert_array_equal(fin[1], h[1])
    assert np.all(fin[2] == 0) and np.all(out[:, :, 4:11] == 0)
    # packed backward: each sequence on its own
    dout = rng.standard_normal(x.shape).astype(np.float32)
    dfin = rng.standard_normal(h.shape).astype(np.float32)
    dx, dw, db, dh = selscan.causal_conv1d_bwd(dout, x, w, b, None, h, dfin, "silu", cu_seqlens=cu)
    want = [np.zeros(x.shape), 0, 0, np.zeros(h.shape)]
    for s in range(4):
        t = slice(cu[s], cu[s + 1])
        g = ref_bwd(dout[:, :, t], x[:, :, t], w, b, None, h[s:s + 1], dfin[s:s + 1], True)
        want[0][:, :, t] = g[0]
        want[1], want[2] = want[1] + g[1], want[2] + g[2]
        want[3][s] = g[3][0]
    for name, got, ref in zip(("dx", "dweight", "dbias", "dinitial_states"), (dx, dw, db, dh), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("state_len", [3, 6])
@needs_conv1d
def test_numpy_state_pool(packed, state_len):
    rng = np.random.default_rng(13 + packed + state_len)
    Dm, W, S = 6, 4, 7
    if packed:
        cu, x, w, b = _varlen(rng, [5, 2, 9, 4], Dm=Dm, W=W)
    else:
        x, w, b, _ = case(rng, Bt=4, Dm=Dm, L=8, W=W)
        cu = None
    pool = rng.standard_normal((S, Dm, state_len)).astype(np.float32)
    idx = np.array([4, -1, 0, 6], dtype=np.int32)
    has = np.array([True, True, False, True])
    want, _, want_pool, padding = ref_serving(x, w, b, True, cu, pool=pool, idx=idx, has_init=has)
    before = pool.copy()
    out = selscan.causal_conv1d_fn(x, w, b, activation="silu", cu_seqlens=cu, conv_states=pool, cache_indices=idx,
                                   has_initial_state=has)
    close(out, want, np.float32)
    np.testing.assert_array_equal(pool, want_pool)
    for s in (1, 2, 3, 5):  # slots no sequence names: untouched
        assert np.array_equal(pool[s].view(np.uint8), before[s].view(np.uint8))
    span = (slice(cu[1], cu[2]) if packed else slice(None))
    assert np.all((out[0] if packed else out[1])[:, span] == 0), "padding sequence: out 0"
    assert padding == [1]
    # the pool as the only state, slot b for sequence b, int32 has_initial_state
    pool = rng.standard_normal((4, Dm, state_len)).astype(np.float32)
    want, _, want_pool, _ = ref_serving(x, w, b, False, cu, pool=pool, has_init=[1, 0, 1, 1])
    out = selscan.causal_conv1d_fn(x, w, b, cu_seqlens=cu, conv_states=pool,
                                   has_initial_state=np.array([1, 0, 1, 1], np.int32))
    close(out, want, np.float32)
    np.testing.assert_array_equal(pool, want_pool)
    if packed:  # an empty sequence reads and writes no slot, even when it starts from zero
        cu2, x2, _, _ = _varlen(rng, [3, 0, 6], Dm=Dm, W=W)
        pool = rng.standard_normal((4, Dm, state_len)).astype(np.float32)
        idx, has = np.array([3, 1, 0], np.int64), np.array([True, False, True])
        want, _, want_pool, _ = ref_serving(x2, w, b, True, cu2, pool=pool, idx=idx, has_init=has)
        before = pool.copy()
        out = selscan.causal_conv1d_fn(x2, w, b, activation="silu", cu_seqlens=cu2, conv_states=pool,
                                       cache_indices=idx, has_initial_state=has)
        close(out, want, np.float32)
        np.testing.assert_array_equal(pool, want_pool)
        assert np.array_equal(pool[[1, 2]], before[[1, 2]])


@pytest.mark.parametrize("T", [None, 1, 3])
@pytest.mark.parametrize("state_len", [3, 5])
@pytest.mark.parametrize("circular", [False, True])
@needs_conv1d
def test_numpy_update(T, state_len, circular):
    rng = np.random.default_rng(17 + (T or 0) + state_len + 100 * circular)
    Bt, Dm, W = 3, 8, 4
    x = rng.standard_normal((Bt, Dm) + (() if T is None else (T,))).astype(np.float32)
    w = (0.5 * rng.standard_normal((Dm, W))).astype(np.float32)
    b = (0.5 * rng.standard_normal(Dm)).astype(np.float32)
    state = rng.standard_normal((Bt, Dm, state_len)).astype(np.float32)
    cs = np.array([0, 4, 11], dtype=np.int32) if circular else None
    want, want_state = ref_update(x, state, w, b, True, cs)
    out = selscan.causal_conv1d_update(x, state, w, b, "silu", cs)
    assert out.shape == x.shape and out.dtype == x.dtype
    close(out, want, np.float32)
    np.testing.assert_array_equal(state, want_state)
    # a pool with padding; a second step continues from the first's state
    pool = rng.standard_normal((6, Dm, state_len)).astype(np.float32)
    idx = np.array([5, -1, 2], dtype=np.int64)
    before = pool.copy()
    for _ in range(2):
        want, want_state = ref_update(x, pool, w, None, False, cs, idx)
        out = selscan.causal_conv1d_update(x, pool, w, None, None, cs, idx)
        close(out, want, np.float32)
        np.testing.assert_array_equal(pool, want_state)
        assert np.all(out[1] == 0)
        x = rng.standard_normal(x.shape).astype(np.float32)
    assert np.array_equal(pool[[0, 1, 3, 4]], before[[0, 1, 3, 4]])


@needs_conv1d
def test_numpy_update_channel_last_views_and_state_dtypes():
    rng = np.random.default_rng(19)
    Bt, Dm, W, T = 2, 8, 3, 4
    x = channel_last(rng.standard_normal((Bt, Dm, T)).astype(np.float16))  # (Bt, T, D) memory
    w = (0.5 * rng.standard_normal((Dm, W))).astype(np.float32)
    for sdt in (np.float16, np.float32):  # conv_state: x's dtype or float32
        state = rng.standard_normal((Bt, Dm, 5)).astype(sdt)
        want, want_state = ref_update(x, state, w)
        out = selscan.causal_conv1d_update(x, state, w)
        close(out, want, np.float16)
        assert strides_of(out) == strides_of(x)
        np.testing.assert_array_equal(state.astype(np.float64), want_state.astype(sdt).astype(np.float64))
    # pad_slot_id keyword: slot 0 as the null slot
    state = rng.standard_normal((3, Dm, 5)).astype(np.float32)
    idx = np.array([0, 2], dtype=np.int32)
    want, want_state = ref_update(x, state, w, idx=idx, pad=0)
    out = selscan.causal_conv1d_update(x, state, w, conv_state_indices=idx, pad_slot_id=0)
    close(out, want, np.float16)
    assert np.all(out[0] == 0)
    np.testing.assert_array_equal(state, want_state)


@needs_conv1d
def test_numpy_plans_reused_and_see_new_data():
    _plan.cache("conv1d_fwd").clear()
    _plan.cache("conv1d_update").clear()
    rng = np.random.default_rng(23)
    for seed in range(3):
        x, w, b, h = case(np.random.default_rng(seed), init=True)
        want, want_fin = ref_fwd(x, w, b, init=h, silu=True)
        out, fin = selscan.causal_conv1d_fn(x, w, b, None, h, True, activation="silu")
        close(out, want, np.float32)
        np.testing.assert_array_equal(fin, want_fin)
        state = rng.standard_normal((2, 6, 3)).astype(np.float32)
        xs = rng.standard_normal((2, 6)).astype(np.float32)
        want_u, want_state = ref_update(xs, state, w, b)
        close(selscan.causal_conv1d_update(xs, state, w, b), want_u, np.float32)
        np.testing.assert_array_equal(state, want_state)
    assert len(_plan.cache("conv1d_fwd")) == 1 and len(_plan.cache("conv1d_update")) == 1
    # the general path gives the same bits
    _plan.ENABLED = False
    try:
        again = selscan.causal_conv1d_fn(x, w, b, None, h, True, activation="silu")
    finally:
        _plan.ENABLED = True
    np.testing.assert_array_equal(again[0], out)
    np.testing.assert_array_equal(again[1], fin)


# ------------------------------------------------------------------------------------------------ errors
def test_bad_activation_names_the_value():
    rng = np.random.default_rng(29)
    x, w, b, _ = case(rng)
    state = np.zeros((2, 6, 3), np.float32)
    for bad in ("gelu", "relu", True, "SiLU"):
        for call in (lambda a: selscan.causal_conv1d_fn(x, w, b, activation=a),
                     lambda a: selscan.causal_conv1d_update(x[:, :, 0], state, w, b, a),
                     lambda a: selscan.causal_conv1d_bwd(x, x, w, b, activation=a)):
            with pytest.raises(selscan.SelscanError, match="activation") as e:
                call(bad)
            assert repr(bad) in str(e.value)
            assert isinstance(e.value, NotImplementedError)  # what causal-conv1d raises
            assert e.value.status_name == "INVALID_ARGUMENT"


@needs_conv1d
def test_library_errors_surface():
    rng = np.random.default_rng(31)
    x, w, b, _ = case(rng, W=4)
    w5 = np.zeros((x.shape[1], 5), np.float32)
    with pytest.raises(selscan.SelscanError, match="weight") as e:
        selscan.causal_conv1d_fn(x, w5)
    assert str(e.value) == _lib.last_error() and "5" in str(e.value)
    with pytest.raises(selscan.SelscanError, match="weight") as e:
        selscan.causal_conv1d_update(x[:, :, 0], np.zeros((2, 6, 4), np.float32), w5)
    assert str(e.value) == _lib.last_error()
    seq = np.zeros(x.shape[::2], np.int32)
    with pytest.raises(selscan.SelscanError, match="seq_idx") as e:
        selscan.causal_conv1d_fn(x, w, b, seq, return_final_states=True)
    assert e.value.status_name == "INVALID_ARGUMENT"
    with pytest.raises(selscan.SelscanError, match="conv_state") as e:  # updated in place: never converted
        selscan.causal_conv1d_update(x[:, :, 0], np.zeros((2, 6, 3), np.float64), w)
    with pytest.raises(selscan.SelscanError, match="weight is required"):
        selscan.causal_conv1d_fn(x, None)
    with pytest.raises(selscan.SelscanError, match="x: dtype int32"):
        selscan.causal_conv1d_fn(x.astype(np.int32), w)


# ------------------------------------------------------------------------------------------------ torch (CPU)
def t64(a):
    return None if a is None else a.detach().double()


def torch_ref(x, w, bias=None, init=None, silu=False):
    """float64 torch (out, final_states) through F.conv1d: differentiable w.r.t. every float input."""
    dm, W = w.shape
    prior = torch.zeros(x.shape[0], dm, W - 1, dtype=x.dtype) if init is None else init
    xe = torch.cat([prior, x], dim=2)
    y = F.conv1d(xe, w.unsqueeze(1), bias, groups=dm)
    return (F.silu(y) if silu else y), xe[:, :, xe.shape[2] - (W - 1):]


def leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


def tcase(seed, Bt=2, Dm=8, L=21, W=4, dtype=None, layout="channel_first", device="cpu"):
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    x = torch.randn(Bt, Dm, L, generator=g).to(dtype)
    if layout == "channel_last":
        x = channel_last(x)
    w = 0.5 * torch.randn(Dm, W, generator=g)
    b = 0.5 * torch.randn(Dm, generator=g)
    h = torch.randn(Bt, Dm, W - 1, generator=g).to(dtype)
    return [t.to(device) for t in (x, w, b, h)]


@needs_torch
@needs_conv1d
def test_torch_cpu_matches_numpy_path():
    from selscan.torch import causal_conv1d_fn, causal_conv1d_update
    x, w, b, h = tcase(1, layout="channel_last")
    out, fin = causal_conv1d_fn(x, w, b, initial_states=h, return_final_states=True, activation="silu")
    nout, nfin = selscan.causal_conv1d_fn(x.numpy(), w.numpy(), b.numpy(), initial_states=h.numpy(),
                                          return_final_states=True, activation="silu")
    np.testing.assert_array_equal(out.numpy(), nout)
    np.testing.assert_array_equal(fin.numpy(), nfin)
    assert out.stride() == x.stride() and fin.stride(1) == 1, "outputs in x's (channel-last) layout"
    state = torch.randn(3, 8, 5)
    nstate = state.numpy().copy()
    xs = torch.randn(2, 8, 2)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    got = causal_conv1d_update(xs, state, w, b, "swish", conv_state_indices=idx)
    want = selscan.causal_conv1d_update(xs.numpy(), nstate, w.numpy(), b.numpy(), "swish",
                                        conv_state_indices=idx.numpy())
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(state.numpy(), nstate)
    # the generic API takes torch tensors too and returns torch tensors
    g = selscan.causal_conv1d_fn(x, w, b, initial_states=h, activation="silu")
    assert isinstance(g, torch.Tensor) and torch.equal(g, out)


@needs_torch
@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize("W", [2, 4])
@needs_conv1d
def test_torch_autograd_against_float64(layout, W):
    from selscan.torch import causal_conv1d_fn
    x, w, b, h = tcase(3 + W, W=W, layout=layout)
    ours = leaves(x, w, b, h)
    if layout == "channel_last":
        ours[0] = channel_last(ours[0].detach()).requires_grad_(True)
    ref = leaves(*(t64(t) for t in (x, w, b, h)))
    g_out = torch.randn(x.shape).double()
    g_fin = torch.randn(h.shape).double()
    out, fin = causal_conv1d_fn(*ours[:3], initial_states=ours[3], return_final_states=True, activation="silu")
    ((out.double() * g_out).sum() + (fin.double() * g_fin).sum()).backward()
    rout, rfin = torch_ref(*ref, silu=True)
    ((rout * g_out).sum() + (rfin * g_fin).sum()).backward()
    torch.testing.assert_close(out.double(), rout.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fin.double(), rfin.detach(), rtol=0, atol=0)
    for name, a, r in zip(("x", "weight", "bias", "initial_states"), ours, ref):
        assert a.grad is not None and a.grad.dtype == a.dtype and a.grad.shape == a.shape, name
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    if layout == "channel_last":
        assert ours[0].grad.stride() == ours[0].stride()


@needs_torch
@needs_conv1d
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_half_dtypes_against_float64(dtype):
    """16-bit x and states with float32 or 16-bit weights: fp32 arithmetic, outputs rounded once."""
    from selscan.torch import causal_conv1d_fn
    dt = getattr(torch, dtype)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dt]
    for wdt in (torch.float32, dt):
        x, w, b, h = tcase(97, dtype=dt, layout="channel_last")
        w, b = w.to(wdt), b.to(wdt)
        a = leaves(x, w, b, h)
        r = leaves(*(t64(t) for t in (x, w, b, h)))
        out, fin = causal_conv1d_fn(*a[:3], initial_states=a[3], return_final_states=True, activation="silu")
        assert out.dtype == dt and fin.dtype == dt
        rout, rfin = torch_ref(*r, silu=True)
        torch.testing.assert_close(out.double(), rout.detach(), rtol=tol, atol=tol)
        torch.testing.assert_close(fin.double(), rfin.detach(), rtol=0, atol=0)
        dout = torch.randn(x.shape).to(dt)
        (out * dout).sum().backward()
        (rout * dout.double()).sum().backward()
        for name, t, u in zip(("x", "weight", "bias", "initial_states"), a, r):
            assert t.grad.dtype == t.dtype, name
            scale = max(1.0, float(u.grad.abs().max()))
            torch.testing.assert_close(t.grad.double(), u.grad, rtol=2 * tol, atol=2 * tol * scale,
                                       msg=lambda m: f"{name} ({wdt}): {m}")


@needs_torch
@needs_conv1d
def test_torch_autograd_variants():
    """No bias / no initial states / only out used / final_states_out given / seq_idx / packed sequences."""
    from selscan.torch import causal_conv1d_fn
    x, w, b, h = tcase(11)
    # no bias, no initial states, no activation: only x and weight get gradients
    a = leaves(x, w)
    r = leaves(t64(x), t64(w))
    causal_conv1d_fn(*a).square().sum().backward()
    torch_ref(*r)[0].square().sum().backward()
    for t, u in zip(a, r):
        torch.testing.assert_close(t.grad.double(), u.grad, rtol=1e-4, atol=1e-4)
    # final_states_out: written, returned, and its gradient flows back to x and initial_states
    a = leaves(x, w, b, h)
    r = leaves(*(t64(t) for t in (x, w, b, h)))
    dst = torch.empty(h.shape)
    out, fin = causal_conv1d_fn(*a[:3], None, a[3], True, dst)
    assert fin.data_ptr() == dst.data_ptr()
    (out.sum() + 3 * fin.sum()).backward()
    rout, rfin = torch_ref(*r)
    (rout.sum() + 3 * rfin.sum()).backward()
    for t, u in zip(a, r):
        torch.testing.assert_close(t.grad.double(), u.grad, rtol=1e-4, atol=1e-4)
    # only final_states used: out's gradient is zero
    a = leaves(x, w, b, h)
    _, fin = causal_conv1d_fn(*a[:3], initial_states=a[3], return_final_states=True)
    fin.sum().backward()
    want = torch.zeros_like(x)
    want[:, :, -3:] = 1
    assert torch.equal(a[0].grad, want) and torch.equal(a[1].grad, torch.zeros_like(w))
    # seq_idx against the numpy reference
    seq = torch.tensor([[0] * 7 + [-1] * 4 + [1] * 10, [3] * 21], dtype=torch.int32)
    a = leaves(x, w, b)
    dout = torch.randn(x.shape)
    (causal_conv1d_fn(*a, seq, activation="silu") * dout).sum().backward()
    want = ref_bwd(dout.numpy(), x.numpy(), w.numpy(), b.numpy(), seq.numpy(), silu=True)
    for t, r in zip(a, want):
        np.testing.assert_allclose(t.grad.numpy(), r, rtol=1e-4, atol=1e-4)
    # packed sequences (keyword-only cu_seqlens): each sequence on its own, with its own initial state
    cu = torch.tensor([0, 4, 5, 21], dtype=torch.int32)
    xp = x[:1]
    hp = torch.randn(3, 8, 3)
    a = leaves(xp, w, b, hp)
    r = leaves(*(t64(t) for t in (xp, w, b, hp)))
    out, fin = causal_conv1d_fn(*a[:3], initial_states=a[3], return_final_states=True, activation="silu",
                                cu_seqlens=cu)
    (out.square().sum() + fin.sum()).backward()
    rl = 0
    for s in range(3):
        ro, rf = torch_ref(r[0][:, :, cu[s]:cu[s + 1]], r[1], r[2], r[3][s:s + 1], silu=True)
        torch.testing.assert_close(out[:, :, cu[s]:cu[s + 1]].double(), ro.detach(), rtol=1e-5, atol=1e-5)
        rl = rl + ro.square().sum() + rf.sum()
    rl.backward()
    for t, u in zip(a, r):
        torch.testing.assert_close(t.grad.double(), u.grad, rtol=1e-4, atol=1e-4)


@needs_torch
@needs_conv1d
def test_torch_serving_autograd():
    """A pool call with padding and has_initial_state, differentiated as the call it equals."""
    from selscan.torch import causal_conv1d_fn
    g = torch.Generator().manual_seed(37)
    Dm, W, sl = 8, 4, 5
    cu = torch.tensor([0, 6, 9, 20], dtype=torch.int64)
    x = torch.randn(1, Dm, 20, generator=g)
    w = 0.5 * torch.randn(Dm, W, generator=g)
    b = 0.5 * torch.randn(Dm, generator=g)
    pool = torch.randn(5, Dm, sl, generator=g)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    has = torch.tensor([False, True, True])
    a = leaves(x, w, b)
    r = leaves(*(t64(t) for t in (x, w, b)))
    start = pool.clone()
    out = causal_conv1d_fn(*a, activation="silu", cu_seqlens=cu, conv_states=pool, cache_indices=idx,
                           has_initial_state=has)
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    want, _, want_pool, _ = ref_serving(x.numpy(), w.numpy(), b.numpy(), True, cu.numpy(), pool=start.numpy(),
                                        idx=idx.numpy(), has_init=has.numpy())
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(pool.numpy(), want_pool)
    rl = 0
    for s in range(3):
        if idx[s] == -1:
            continue
        prior = start[idx[s]].double()[None, :, sl - (W - 1):] * float(has[s])
        ro, _ = torch_ref(r[0][:, :, cu[s]:cu[s + 1]], r[1], r[2], prior, silu=True)
        rl = rl + (ro * dout[:, :, cu[s]:cu[s + 1]].double()).sum()
    rl.backward()
    for name, t, u in zip(("x", "weight", "bias"), a, r):
        torch.testing.assert_close(t.grad.double(), u.grad, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    assert torch.all(a[0].grad[:, :, 6:9] == 0), "the padding sequence gets no gradient"
    # initial states with has_initial_state, cache_indices marking padding only, final states' gradient
    h = torch.randn(3, Dm, W - 1, generator=g)
    has = torch.tensor([1, 0, 1], dtype=torch.int32)
    idx = torch.tensor([0, 0, -1], dtype=torch.int64)
    a = leaves(x, w, b, h)
    r = leaves(*(t64(t) for t in (x, w, b, h)))
    out, fin = causal_conv1d_fn(*a[:3], initial_states=a[3], return_final_states=True, cu_seqlens=cu,
                                cache_indices=idx, has_initial_state=has)
    dfin = torch.randn(fin.shape, generator=g)
    ((out * dout).sum() + (fin * dfin).sum()).backward()
    rl = 0
    for s in range(2):  # sequence 2 is padding: out and final_states 0
        ro, rf = torch_ref(r[0][:, :, cu[s]:cu[s + 1]], r[1], r[2], r[3][s:s + 1] * float(has[s]))
        torch.testing.assert_close(out[:, :, cu[s]:cu[s + 1]].detach().double(), ro.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fin[s:s + 1].detach().double(), rf.detach(), rtol=0, atol=0)
        rl = rl + (ro * dout[:, :, cu[s]:cu[s + 1]].double()).sum() + (rf * dfin[s:s + 1].double()).sum()
    assert torch.all(out[:, :, 9:] == 0) and torch.all(fin[2] == 0)
    rl.backward()
    for name, t, u in zip(("x", "weight", "bias", "initial_states"), a, r):
        torch.testing.assert_close(t.grad.double(), u.grad, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


@needs_torch
@needs_conv1d
def test_torch_deterministic_flag_reaches_the_library():
    from selscan.torch import causal_conv1d_fn
    _plan.cache("conv1d_bwd").clear()
    x, w, b, _ = tcase(41)
    a = leaves(x, w, b)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        causal_conv1d_fn(*a, activation="silu").sum().backward()
    finally:
        torch.use_deterministic_algorithms(prev)
    flags = [key[2] for key in _plan.cache("conv1d_bwd")]
    assert flags and all(f[1] is True for f in flags), flags  # (silu, deterministic, ...)


@needs_torch
@needs_conv1d
def test_torch_no_grad_builds_no_graph():
    from selscan.torch import causal_conv1d_fn
    x, w, b, h = leaves(*tcase(43))
    with torch.no_grad():
        out, fin = causal_conv1d_fn(x, w, b, initial_states=h, return_final_states=True)
    assert out.grad_fn is None and fin.grad_fn is None and not out.requires_grad


@needs_torch
@needs_conv1d
def test_torch_custom_ops_opcheck():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    x, w, b, h = tcase(47, L=9, layout="channel_last")
    for req in (False, True):
        args = leaves(x, w, b, h) if req else [x, w, b, h]
        torch.library.opcheck(torch.ops.selscan.causal_conv1d_fwd.default,
                              (args[0], args[1], args[2], None, args[3], None, True, True))
    torch.library.opcheck(torch.ops.selscan.causal_conv1d_bwd.default,
                          (x, w, b, None, h, None, torch.randn(x.shape), torch.randn(h.shape), True, True, False))
    torch.library.opcheck(torch.ops.selscan.causal_conv1d_update.default,
                          (x[:, :, :2], torch.randn(2, 8, 4), w, b, True, None, None, -1))
    torch.library.opcheck(torch.ops.selscan.causal_conv1d_fwd_serving.default,
                          (x, w, b, None, None, torch.randn(3, 8, 3), None, torch.tensor([2, 0]), None, -1, False,
                           True))


class _ConvBlock(torch.nn.Module if torch is not None else object):
    """A Mamba block's convolution: the prefill through causal_conv1d_fn, then a decode step through the update."""

    def __init__(self, dim, width):
        super().__init__()
        self.conv1d = torch.nn.Conv1d(dim, dim, width, groups=dim, padding=width - 1)

    def forward(self, x, conv_state, token):
        from selscan.torch import causal_conv1d_fn, causal_conv1d_update
        w = self.conv1d.weight.squeeze(1)
        y, fin = causal_conv1d_fn(x, w, self.conv1d.bias, return_final_states=True, activation="silu")
        conv_state.copy_(fin.detach())
        step = causal_conv1d_update(token, conv_state, w, self.conv1d.bias, "silu")  # no gradient, as upstream's
        return y.square().mean() + fin.square().mean() + step.square().mean()


def _compile_check(device, backend):
    torch.manual_seed(53)
    m = _ConvBlock(16, 4).to(device)
    x = channel_last(torch.randn(2, 16, 24, device=device)).requires_grad_(True)
    token = torch.randn(2, 16, device=device)
    state_e = torch.zeros(2, 16, 3, device=device)
    loss_e = m(x, state_e, token)
    loss_e.backward()
    grads_e = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    state_c = torch.zeros(2, 16, 3, device=device)
    compiled = torch.compile(m, fullgraph=True, backend=backend)
    loss_c = compiled(x, state_c, token)
    loss_c.backward()
    grads_c = [x.grad] + [p.grad for p in m.parameters()]
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(state_c, state_e)  # the update's mutation survives functionalization
    for a, b in zip(grads_c, grads_e):
        torch.testing.assert_close(a, b)
    # the reference: F.conv1d in float64
    ref = _ConvBlock(16, 4).to(device).double()
    ref.load_state_dict(m.state_dict())
    xr = x.detach().double()
    y = F.silu(ref.conv1d(xr)[:, :, :24])
    step = F.silu(F.conv1d(torch.cat([xr[:, :, 21:], token.double()[:, :, None]], 2), ref.conv1d.weight,
                           ref.conv1d.bias, groups=16))
    want = y.square().mean() + xr[:, :, 21:].square().mean() + step.square().mean()
    torch.testing.assert_close(loss_e.double(), want, rtol=1e-5, atol=1e-6)


@needs_torch
@needs_conv1d
def test_torch_compile_fullgraph_cpu():
    _compile_check("cpu", "aot_eager")


@needs_torch
@needs_conv1d
def test_torch_compile_serving_op_mutates_pool():
    from selscan.torch import causal_conv1d_fn
    rng = np.random.default_rng(59)
    cu, x, w, b = _varlen(rng, [3, 7])
    pool = torch.randn(4, 6, 3)
    idx = torch.tensor([2, 0], dtype=torch.int32)

    def f(x, w, b, pool, idx):
        return causal_conv1d_fn(x, w, b, activation="silu", cu_seqlens=torch.from_numpy(cu), conv_states=pool,
                                cache_indices=idx) * 2

    before, eager_pool = pool.clone(), pool.clone()
    want = f(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), eager_pool, idx)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(torch.from_numpy(x), torch.from_numpy(w),
                                                                 torch.from_numpy(b), pool, idx)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(pool, eager_pool)
    assert not torch.equal(pool[0], before[0]) and not torch.equal(pool[2], before[2])
    assert torch.equal(pool[[1, 3]], before[[1, 3]])


@needs_torch
@needs_conv1d
def test_torch_errors():
    from selscan.torch import causal_conv1d_fn, causal_conv1d_update
    x, w, b, _ = tcase(61)
    with pytest.raises(NotImplementedError, match="'gelu'"):
        causal_conv1d_fn(x, w, b, activation="gelu")
    with pytest.raises(selscan.SelscanError, match="'tanh'"):
        causal_conv1d_update(x[:, :, 0], torch.zeros(2, 8, 3), w, b, "tanh")
    with pytest.raises(selscan.SelscanError, match="weight") as e:
        causal_conv1d_fn(x.requires_grad_(True), torch.zeros(8, 5))
    assert str(e.value) == _lib.last_error() and "5" in str(e.value)


# ------------------------------------------------------------------------------------------------ CUDA
CUDA_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)} \
    if torch is not None else {}


def _to(ts, device):
    return [None if t is None else t.detach().to(device) for t in ts]


@needs_torch
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize("W", [2, 3, 4])
@needs_conv1d
def test_cuda_matches_cpu(dtype, layout, W):
    from selscan.torch import causal_conv1d_fn
    dt = getattr(torch, dtype)
    rtol, atol = CUDA_TOL[dt]
    x, w, b, h = tcase(67 + W, Bt=3, Dm=64, L=300, W=W, dtype=dt, layout=layout)
    cpu = leaves(x, w, b, h)
    gpu = leaves(*_to(cpu, "cuda"))
    if layout == "channel_last":
        gpu[0] = channel_last(gpu[0].detach()).requires_grad_(True)
        assert gpu[0].stride(1) == 1
    outs = []
    for a in (cpu, gpu):
        out, fin = causal_conv1d_fn(*a[:3], initial_states=a[3], return_final_states=True, activation="silu")
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dt).to(out.device)
        dfin = torch.ones(fin.shape, dtype=dt, device=out.device)
        torch.autograd.backward((out, fin), (dout, dfin))
        outs.append((out, fin))
    assert outs[1][0].is_cuda and outs[1][0].stride() == gpu[0].stride()
    torch.testing.assert_close(outs[1][0].cpu(), outs[0][0], rtol=rtol, atol=atol)
    torch.testing.assert_close(outs[1][1].cpu(), outs[0][1], rtol=0, atol=0)
    for name, c, g in zip(("x", "weight", "bias", "initial_states"), cpu, gpu):
        scale = max(1.0, float(c.grad.abs().max()))
        torch.testing.assert_close(g.grad.cpu().float(), c.grad.float(), rtol=10 * rtol, atol=10 * atol * scale,
                                   msg=lambda m: f"{name}: {m}")


@needs_torch
@needs_cuda
@needs_conv1d
def test_cuda_seq_idx_packed_pool_and_update():
    from selscan.torch import causal_conv1d_fn, causal_conv1d_update
    x, w, b, _ = tcase(71, Bt=2, Dm=32, L=40)
    seq = torch.tensor([[0] * 10 + [-1] * 5 + [1] * 25, [4] * 40], dtype=torch.int32)
    want = causal_conv1d_fn(x, w, b, seq, activation="silu")
    got = causal_conv1d_fn(*_to((x, w, b, seq), "cuda"), activation="silu")
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    cu = torch.tensor([0, 9, 10, 40], dtype=torch.int32)
    pool = torch.randn(6, 32, 5)
    idx = torch.tensor([5, -1, 1], dtype=torch.int64)
    has = torch.tensor([1, 1, 0], dtype=torch.int32)
    pool_g = pool.cuda()
    want = causal_conv1d_fn(x[:1], w, b, cu_seqlens=cu, conv_states=pool, cache_indices=idx, has_initial_state=has)
    got = causal_conv1d_fn(*_to((x[:1], w, b), "cuda"), cu_seqlens=cu.cuda(), conv_states=pool_g,
                           cache_indices=idx.cuda(), has_initial_state=has.cuda())
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool_g.cpu(), pool, rtol=0, atol=0)
    for cs in (None, torch.tensor([3, 0, 17], dtype=torch.int32)):
        state = torch.randn(4, 32, 6)
        state_g = state.cuda()
        idx = torch.tensor([3, -1, 0], dtype=torch.int32)
        xs = torch.randn(3, 32, 2)
        want = causal_conv1d_update(xs, state, w, b, "silu", cs, idx)
        got = causal_conv1d_update(xs.cuda(), state_g, w.cuda(), b.cuda(), "silu",
                                   None if cs is None else cs.cuda(), idx.cuda())
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state_g.cpu(), state, rtol=0, atol=0)


@needs_torch
@needs_cuda
@needs_conv1d
def test_cuda_graph_forward_backward():
    from selscan.torch import causal_conv1d_fn
    x, w, b, h = _to(tcase(73, Bt=2, Dm=256, L=512, layout="channel_last"), "cuda")
    x, w, b, h = leaves(x, w, b, h)
    gout = torch.randn(x.shape, device="cuda")

    def step():
        out, fin = causal_conv1d_fn(x, w, b, initial_states=h, return_final_states=True, activation="silu")
        return (out, fin) + torch.autograd.grad((out, fin), (x, w, b, h), (gout, torch.ones_like(fin)))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: call plans, module load, workspace size
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for seed in (1, 2):
        with torch.no_grad():
            gen = torch.Generator(device="cuda").manual_seed(seed)
            x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
            w.copy_(torch.randn(w.shape, device="cuda", generator=gen))
        graph.replay()
        want = step()
        torch.cuda.synchronize()
        for a, e in zip(static, want):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@needs_torch
@needs_cuda
@needs_conv1d
def test_cuda_graph_update_follows_indices():
    from selscan.torch import causal_conv1d_update
    g = torch.Generator().manual_seed(79)
    w = (0.5 * torch.randn(64, 4, generator=g)).cuda()
    b = torch.randn(64, generator=g).cuda()
    xs = torch.randn(4, 64, generator=g).cuda()
    idx = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device="cuda")
    cs = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device="cuda")
    pool = torch.randn(6, 64, 8, generator=g).cuda()
    eager = pool.clone()
    causal_conv1d_update(xs, pool.clone(), w, b, "silu", cs, idx)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = causal_conv1d_update(xs, pool, w, b, "silu", cs, idx)
    for step, pos in (([0, 1, 2, 3], [0, 1, 2, 3]), ([5, -1, 2, 4], [9, 0, 7, 1]), ([-1] * 4, [0] * 4),
                      ([3, 0, 5, 1], [4, 4, 4, 4])):
        idx.copy_(torch.tensor(step, dtype=torch.int32))
        cs.copy_(torch.tensor(pos, dtype=torch.int32))
        xs.copy_(torch.randn(xs.shape, generator=g))
        graph.replay()
        want = causal_conv1d_update(xs, eager, w, b, "silu", cs, idx)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(pool, eager)


@needs_torch
@needs_cuda
@needs_conv1d
def test_cuda_deterministic_backward_is_bitwise_reproducible():
    from selscan.torch import causal_conv1d_fn
    x, w, b, _ = _to(tcase(83, Bt=4, Dm=128, L=2048), "cuda")
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for _ in range(3):
            a = leaves(x, w, b)
            causal_conv1d_fn(*a, activation="silu").square().sum().backward()
            grads.append([t.grad for t in a])
    finally:
        torch.use_deterministic_algorithms(prev)
    for g in grads[1:]:
        for a, e in zip(g, grads[0]):
            assert torch.equal(a, e)


@needs_torch
@needs_cuda
@needs_conv1d
def test_cuda_compile_fullgraph_inductor():
    _compile_check("cuda", "inductor")


# ------------------------------------------------------------------------------------------------ CuPy
def _cupy_reason():
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except Exception as e:
        return f"CuPy cannot reach a CUDA device: {e}"
    if selscan.cuda_device_count() == 0:
        return "libselscan was built without CUDA (" + selscan.build_info() + ")"
    return None


needs_cupy = pytest.mark.skipif(_cupy_reason() is not None, reason=str(_cupy_reason()))


@needs_cupy
@needs_conv1d
def test_cupy_forward_backward_update():
    import cupy as cp
    rng = np.random.default_rng(89)
    x, w, b, h = case(rng, Dm=32, L=100, init=True)
    x = channel_last(x)
    out, fin = selscan.causal_conv1d_fn(cp.asarray(x), cp.asarray(w), cp.asarray(b), initial_states=cp.asarray(h),
                                        return_final_states=True, activation="silu")
    want, want_fin = ref_fwd(x, w, b, init=h, silu=True)
    close(cp.asnumpy(out), want, np.float32)
    np.testing.assert_array_equal(cp.asnumpy(fin), want_fin)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    got = selscan.causal_conv1d_bwd(cp.asarray(dout), cp.asarray(x), cp.asarray(w), cp.asarray(b), None,
                                    cp.asarray(h), None, "silu")
    for g, r in zip(got, ref_bwd(dout, x, w, b, None, h, None, True)):
        np.testing.assert_allclose(cp.asnumpy(g), r, rtol=1e-4, atol=1e-4)
    state = rng.standard_normal((3, 32, 4)).astype(np.float32)
    xs = rng.standard_normal((2, 32)).astype(np.float32)
    idx = np.array([2, 0], np.int32)
    want, want_state = ref_update(xs, state, w, b, True, None, idx)
    sg = cp.asarray(state)
    got = selscan.causal_conv1d_update(cp.asarray(xs), sg, cp.asarray(w), cp.asarray(b), "silu",
                                       conv_state_indices=cp.asarray(idx))
    close(cp.asnumpy(got), want, np.float32)
    np.testing.assert_allclose(cp.asnumpy(sg), want_state, rtol=0, atol=0)
