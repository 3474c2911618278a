"""An independent float64 numpy recurrence of the selective scan (the math of upstream's selective_scan_ref),
plus helpers for rounding to the input dtypes and for finite-difference gradients. Test-only."""

import numpy as np


def bf16_round(a):
    """float -> nearest bf16 value (ties to even), returned as float32."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    r = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def round_to(a, itype):
    """Values as the library sees them after converting to itype (float32 arrays)."""
    if itype == "fp16":
        return np.asarray(a).astype(np.float16).astype(np.float32)
    if itype == "bf16":
        return bf16_round(a)
    return np.asarray(a, dtype=np.float32)


def interleaved_to_complex(b):
    b = np.asarray(b, dtype=np.float64)
    return b[..., 0::2] + 1j * b[..., 1::2]


def ref_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, h0=None):
    """float64 sequential recurrence. B/C: constant (Dm, N) or variable (Bt, G, N, L) (complex for complex A;
    convert the interleaved layout first). Returns (out, final, last_state): out is the pre-gate y, final is
    y * silu(z) when z is given else y, last_state is the true state after the last position."""
    u = np.asarray(u, np.float64)
    dt = np.asarray(delta, np.float64)
    cplx = np.iscomplexobj(A)
    wdt = np.complex128 if cplx else np.float64
    A = np.asarray(A, wdt)
    Bt, Dm, L = u.shape
    N = A.shape[1]
    if delta_bias is not None:
        dt = dt + np.asarray(delta_bias, np.float64)[None, :, None]
    if delta_softplus:
        dt = np.where(dt <= 20.0, np.log1p(np.exp(np.minimum(dt, 20.0))), dt)

    def per_channel(X):
        X = np.asarray(X, wdt)
        if X.ndim == 2:
            return None, X[None]  # constant: (1, Dm, N)
        if X.ndim == 3:
            X = X[:, None]
        G = X.shape[1]
        return np.repeat(X, Dm // G, axis=1), None  # variable: (Bt, Dm, N, L)

    Bv, Bc = per_channel(B)
    Cv, Cc = per_channel(C)
    h = np.zeros((Bt, Dm, N), wdt) if h0 is None else np.array(h0, dtype=wdt)
    y = np.zeros((Bt, Dm, L), np.float64)
    for t in range(L):
        a = np.exp(dt[:, :, t, None] * A[None])
        bt = Bv[..., t] if Bv is not None else Bc
        h = a * h + bt * (dt[:, :, t] * u[:, :, t])[..., None]
        ct = Cv[..., t] if Cv is not None else Cc
        s = (h * ct).sum(-1)
        y[:, :, t] = 2.0 * s.real if cplx else s
    if D is not None:
        y = y + np.asarray(D, np.float64)[None, :, None] * u
    final = y
    if z is not None:
        zz = np.asarray(z, np.float64)
        final = y * zz / (1.0 + np.exp(-zz))
    return y, final, h


def fd_grads(loss, params, eps=1e-6):
    """Central differences of loss(params) w.r.t. each float64/complex128 array in the dict `params`
    (modified in place and restored). Complex entries get dL/dRe + i dL/dIm (PyTorch's convention)."""
    grads = {}
    for name, arr in params.items():
        if arr is None:
            continue
        g = np.zeros_like(arr)
        flat = arr.reshape(-1)
        gflat = g.reshape(-1)
        parts = (1.0, 1j) if np.iscomplexobj(arr) else (1.0,)
        for i in range(flat.size):
            for unit in parts:
                old = flat[i]
                h = eps * max(1.0, abs(old))
                flat[i] = old + unit * h
                lp = loss()
                flat[i] = old - unit * h
                lm = loss()
                flat[i] = old
                gflat[i] += unit * (lp - lm) / (2 * h)
        grads[name] = g
    return grads


def assert_close(name, got, ref, rtol, atol):
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != reference {ref.shape}"
    assert np.all(np.isfinite(got)), f"{name}: non-finite values (unwritten output?)"
    err = np.abs(got.astype(ref.dtype) - ref)
    bound = atol + rtol * np.abs(ref)
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} elements outside atol={atol} rtol={rtol}; "
                             f"worst at {i}: got {got[i]}, reference {ref[i]}, max abs err {err.max():.3g}")
