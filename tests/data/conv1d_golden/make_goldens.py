#!/usr/bin/env python3
"""Golden vectors of causal-conv1d (Dao-AILab/causal-conv1d): fixed-seed inputs run through upstream's CUDA
forward, backward and decode update, saved as .npy files with a cases.json and a provenance README, packed into
one tarball for tests/cpu/test_conv1d_golden.cpp and tests/gpu/test_gpu_conv1d_golden.cpp.

    PYTHONPATH=build/conv-upstream python3 tests/data/conv1d_golden/make_goldens.py --out OUTDIR
    tar -xzf OUTDIR/conv1d_golden.tar.gz -C tests/data      # replaces tests/data/conv1d_golden's data and README

build/conv-upstream is bench/build_causal_conv1d.py's output (causal_conv1d and causal_conv1d_cuda importable).
Every case is also computed by a float64 reference written here; a case whose upstream outputs disagree with it
beyond the tolerances is left out of the tarball, named on stdout and in the README, and the exit status is 2.
--dry-run skips upstream and stores the reference's outputs instead (README marked DRY RUN: for checking this
script and the tests' loader, never for committing). --device cpu runs the upstream calls on CPU tensors (only
useful with a stand-in for the upstream modules).
"""

import argparse
import datetime
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import time

import numpy as np
import torch

UPSTREAM = "Dao-AILab/causal-conv1d"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Relative spacing of a dtype's values (2^-mantissa bits): a rounded output may sit one unit away from the rounding
# of the exact value when the fp32 computation lands near a rounding boundary.
ULP = {"fp32": 2.0 ** -23, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
# The fp32 arithmetic before any rounding, relative to the tensor's largest magnitude: a few-term sum and fast-math
# exp for element-wise outputs, sums over batch and time in any order for dweight and dbias (10x what an fp32
# emulation of both in a bad order measured against float64).
FP32_REL = 2e-6
FP32_REL_SUMS = 1e-5
SUMS = ("dweight", "dbias")
SIZE_BUDGET = 1_500_000  # bytes of .npy data, all cases together


# ---------------------------------------------------------------------------------------------- the cases
def conv(name, seed, B, D, L, W, itype, wtype, layout, bias=True, act="silu", seq_idx=False, init=False,
         final=False, dfinal=False):
    return dict(name=name, op="conv", seed=seed, batch=B, dim=D, seqlen=L, width=W, itype=itype, wtype=wtype,
                layout=layout, bias=bias, activation=act, seq_idx=seq_idx, initial_states=init, final_states=final,
                dfinal_states=dfinal)


def update(name, seed, B, D, T, W, state_len, itype, wtype, bias=True, act="silu", x_2d=False, cache_seqlens=None,
           indices=None, slots=None):
    return dict(name=name, op="update", seed=seed, batch=B, dim=D, tokens=T, width=W, state_len=state_len,
                slots=slots if slots is not None else B, itype=itype, wtype=wtype, bias=bias, activation=act,
                x_2d=x_2d, cache_seqlens=cache_seqlens, conv_state_indices=indices, pad_slot_id=-1)


# Channel-first (cf): x, out, dout, dx have stride 1 over L; channel-last (cl): stride 1 over D, as upstream's
# channel-last kernels (the only ones with seq_idx, initial_states and final_states) need. The cf lengths past
# 512 / 1024 cross upstream's fp32 / 16-bit chunk boundaries; cl D = 72 crosses its 64-channel tile, L = 300 its
# 64- and 128-step tiles.
CASES = [
    conv("c01_fp32_w4_cf", 101, 2, 16, 100, 4, "fp32", "fp32", "cf"),
    conv("c02_fp32_w2_cf_plain", 102, 2, 5, 37, 2, "fp32", "fp32", "cf", bias=False, act="none"),
    conv("c03_fp32_w3_cl", 103, 2, 16, 100, 3, "fp32", "fp32", "cl", act="none"),
    conv("c04_fp16_w4_cf_f32w", 104, 2, 16, 100, 4, "fp16", "fp32", "cf"),
    conv("c05_fp16_w3_cl_f16w", 105, 2, 24, 80, 3, "fp16", "fp16", "cl"),
    conv("c06_bf16_w4_cl_f32w", 106, 3, 16, 70, 4, "bf16", "fp32", "cl"),
    conv("c07_bf16_w2_cf_bf16w", 107, 2, 8, 64, 2, "bf16", "bf16", "cf", act="none"),
    conv("c08_bf16_w4_cf_bf16w_long", 108, 1, 8, 1100, 4, "bf16", "bf16", "cf"),
    conv("c09_fp32_w3_cf_long", 109, 1, 4, 1100, 3, "fp32", "fp32", "cf", bias=False),
    conv("c10_fp32_w4_cl_long", 110, 1, 72, 300, 4, "fp32", "fp32", "cl"),
    conv("c11_fp32_w4_cl_seqidx", 111, 2, 16, 100, 4, "fp32", "fp32", "cl", seq_idx=True),
    conv("c12_bf16_w3_cl_seqidx", 112, 2, 16, 90, 3, "bf16", "fp32", "cl", act="none", seq_idx=True),
    conv("c13_fp16_w2_cl_seqidx", 113, 2, 8, 50, 2, "fp16", "fp16", "cl", bias=False, seq_idx=True),
    conv("c14_fp32_w4_cl_states", 114, 2, 16, 50, 4, "fp32", "fp32", "cl", init=True, final=True, dfinal=True),
    conv("c15_fp16_w2_cl_states", 115, 2, 8, 40, 2, "fp16", "fp16", "cl", bias=False, act="none", init=True,
         final=True, dfinal=True),
    conv("c16_bf16_w3_cl_states_nodfinal", 116, 2, 16, 60, 3, "bf16", "fp32", "cl", init=True, final=True),
    conv("c17_bf16_w4_cl_final_only", 117, 2, 16, 45, 4, "bf16", "bf16", "cl", final=True, dfinal=True),
    conv("c18_fp32_w4_cl_init_only", 118, 2, 16, 33, 4, "fp32", "fp32", "cl", init=True),
    conv("c19_fp32_w4_cl_states_short", 119, 2, 8, 2, 4, "fp32", "fp32", "cl", init=True, final=True, dfinal=True),
    # Plain shift (no cache_seqlens): state_len > W-1, T > 1, and T > state_len.
    update("u01_fp32_w4_T1_2d", 201, 3, 16, 1, 4, 3, "fp32", "fp32", x_2d=True),
    update("u02_bf16_w4_shift_len6_T3", 202, 2, 16, 3, 4, 6, "bf16", "bf16"),
    update("u03_fp16_w3_shift_len4_T5", 203, 2, 8, 5, 3, 4, "fp16", "fp32", bias=False, act="none"),
    # Circular buffer: positions past state_len wrap.
    update("u04_fp32_w4_circ", 204, 3, 8, 2, 4, 5, "fp32", "fp32", cache_seqlens=[0, 7, 13]),
    update("u05_bf16_w2_circ_T4", 205, 2, 16, 4, 2, 3, "bf16", "fp32", cache_seqlens=[2, 9]),
    # Slots through conv_state_indices, one padding entry (-1): its out is 0 and no slot is touched.
    update("u06_fp32_w3_indices_pad", 206, 4, 8, 2, 3, 4, "fp32", "fp32", indices=[3, -1, 0, 5], slots=6),
    update("u07_fp16_w4_circ_indices", 207, 3, 8, 3, 4, 6, "fp16", "fp16", act="none", cache_seqlens=[5, 0, 11],
           indices=[4, -1, 1], slots=5),
]


# ---------------------------------------------------------------------------------------------- inputs
def rounded(x, dtype):
    """float64 values rounded to `dtype` (round to nearest even), as float64."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(TORCH_DTYPE[dtype]).double().numpy()


def seq_idx_rows(rng, B, L):
    """Per row: sequences of random lengths (some shorter than a window) and one padding run (-1): at the end of
    row 0, in the middle of row 1, at the start of row 2."""
    rows = np.empty((B, L), np.int32)
    for b in range(B):
        pad = {0: (L - 7, L), 1: (L // 2, L // 2 + 5), 2: (0, 4)}.get(b, (L, L))
        seq, pos = 0, 0
        while pos < L:
            if pad[0] <= pos < pad[1]:
                rows[b, pos:pad[1]] = -1
                pos = pad[1]
                continue
            end = pos + int(rng.choice([1, 2, 3, 9, 17, 30]))
            if pos < pad[0]:
                end = min(end, pad[0])
            end = min(end, L)
            rows[b, pos:end] = seq
            seq, pos = seq + 1, end
    return rows


def make_inputs(c):
    """The case's inputs as float64 arrays holding values exact in their dtypes (int32 for index tensors)."""
    rng = np.random.default_rng(c["seed"])
    B, D, W, it, wt = c["batch"], c["dim"], c["width"], c["itype"], c["wtype"]
    t = {}
    if c["op"] == "conv":
        L = c["seqlen"]
        t["x"] = rounded(rng.standard_normal((B, D, L)), it)
        t["weight"] = rounded(0.5 * rng.standard_normal((D, W)), wt)
        if c["bias"]:
            t["bias"] = rounded(0.5 * rng.standard_normal(D), wt)
        if c["seq_idx"]:
            t["seq_idx"] = seq_idx_rows(rng, B, L)
        if c["initial_states"]:
            t["initial_states"] = rounded(rng.standard_normal((B, D, W - 1)), it)
        dout = rng.standard_normal((B, D, L))
        if c["seq_idx"]:
            # Padding outputs are constant 0, so their gradient reaches nothing; upstream's backward would still
            # pass it among padding positions, which no forward explains. Zero there, the golden is unambiguous.
            dout *= (t["seq_idx"] >= 0)[:, None, :]
        t["dout"] = rounded(dout, it)
        if c["dfinal_states"]:
            t["dfinal_states"] = rounded(rng.standard_normal((B, D, W - 1)), it)
    else:
        T, S, SL = c["tokens"], c["slots"], c["state_len"]
        x = rng.standard_normal((B, D) if c["x_2d"] else (B, D, T))
        t["x"] = rounded(x, it)
        t["conv_state"] = rounded(rng.standard_normal((S, D, SL)), it)
        t["weight"] = rounded(0.5 * rng.standard_normal((D, W)), wt)
        if c["bias"]:
            t["bias"] = rounded(0.5 * rng.standard_normal(D), wt)
        if c["cache_seqlens"] is not None:
            t["cache_seqlens"] = np.asarray(c["cache_seqlens"], np.int32)
        if c["conv_state_indices"] is not None:
            t["conv_state_indices"] = np.asarray(c["conv_state_indices"], np.int32)
    return t


# ---------------------------------------------------------------------------------------------- float64 reference
def silu_grad(y):
    s = 1.0 / (1.0 + np.exp(-y))
    return s * (1.0 + y * (1.0 - s))


def conv_ref(c, t):
    """Forward and backward in float64, from the ABI's definition (include/selscan/selscan.h, section 5c)."""
    B, D, L, W = c["batch"], c["dim"], c["seqlen"], c["width"]
    x, w = t["x"], t["weight"]
    bias = t.get("bias", np.zeros(D))
    seq = t.get("seq_idx")
    # xe[..., e] is the input at position e - (W-1): initial states (or 0) before position 0.
    xe = np.zeros((B, D, L + W - 1))
    xe[..., W - 1:] = x
    if "initial_states" in t:
        xe[..., :W - 1] = t["initial_states"]
    tt = np.arange(L)
    valid = np.ones((B, L), bool) if seq is None else seq >= 0
    masks = []
    y = np.broadcast_to(bias[None, :, None], (B, D, L)).copy()
    for k in range(W):
        src = tt - (W - 1) + k
        if seq is None:
            m = np.ones((B, L), bool)
        else:
            m = (src >= 0)[None, :] & valid & (seq[:, np.clip(src, 0, L - 1)] == seq)
        masks.append(m)
        y += w[None, :, k, None] * xe[:, :, tt + k] * m[:, None, :]
    y = np.where(valid[:, None, :], y, 0.0)
    silu = c["activation"] == "silu"
    r = {"out": np.where(valid[:, None, :], y / (1.0 + np.exp(-y)) if silu else y, 0.0)}
    if c["final_states"]:
        r["final_states"] = xe[..., L:L + W - 1].copy()
    dy = t["dout"] * valid[:, None, :]
    if silu:
        dy = dy * silu_grad(y)
    dxe = np.zeros_like(xe)
    dw = np.zeros((D, W))
    for k in range(W):
        g = dy * masks[k][:, None, :]
        dxe[:, :, tt + k] += w[None, :, k, None] * g
        dw[:, k] = (g * xe[:, :, tt + k]).sum(axis=(0, 2))
    if "dfinal_states" in t:
        dxe[..., L:L + W - 1] += t["dfinal_states"]
    r["dx"] = dxe[..., W - 1:]
    r["dweight"] = dw
    if c["bias"]:
        r["dbias"] = dy.sum(axis=(0, 2))
    if c["initial_states"]:
        r["dinitial_states"] = dxe[..., :W - 1].copy()
    return r


def update_ref(c, t):
    """causal_conv1d_update in float64: out and the state pool after the call."""
    B, D, T, W, SL = c["batch"], c["dim"], c["tokens"], c["width"], c["state_len"]
    x = t["x"].reshape(B, D, T)
    w = t["weight"]
    bias = t.get("bias", np.zeros(D))
    state = t["conv_state"].copy()
    out = np.zeros((B, D, T))
    for b in range(B):
        slot = int(t["conv_state_indices"][b]) if "conv_state_indices" in t else b
        if slot == c["pad_slot_id"]:
            continue
        st = state[slot]
        if "cache_seqlens" in t:
            pos = int(t["cache_seqlens"][b]) % SL
            window = np.concatenate([st[:, [(pos - (W - 1) + i) % SL for i in range(W - 1)]], x[b]], axis=1)
            for i in range(T):
                st[:, (pos + i) % SL] = x[b, :, i]
        else:
            full = np.concatenate([st, x[b]], axis=1)
            window = full[:, SL - (W - 1):]
            st[:] = full[:, -SL:]
        for i in range(T):
            y = bias + (w * window[:, i:i + W]).sum(axis=1)
            out[b, :, i] = y / (1.0 + np.exp(-y)) if c["activation"] == "silu" else y
    return {"out": out.reshape(t["x"].shape), "conv_state_out": state}


# ---------------------------------------------------------------------------------------------- upstream
def to_device(a, dtype, device, channel_last=False):
    """A tensor of a (B, D, n) array; channel_last: stride 1 over D, as upstream's channel-last kernels want."""
    td = torch.int32 if dtype == "int32" else TORCH_DTYPE[dtype]
    v = torch.from_numpy(np.ascontiguousarray(a)).to(td)
    if channel_last:
        return v.transpose(1, 2).contiguous().to(device).transpose(1, 2)
    return v.contiguous().to(device)


def conv_upstream(c, t, device):
    import causal_conv1d
    import causal_conv1d_cuda
    it, wt, cl = c["itype"], c["wtype"], c["layout"] == "cl"
    B, D, W = c["batch"], c["dim"], c["width"]
    x = to_device(t["x"], it, device, cl)
    weight = to_device(t["weight"], wt, device)
    bias = to_device(t["bias"], wt, device) if c["bias"] else None
    seq_idx = to_device(t["seq_idx"], "int32", device) if c["seq_idx"] else None
    init = to_device(t["initial_states"], it, device, True) if c["initial_states"] else None
    act = "silu" if c["activation"] == "silu" else None
    res = causal_conv1d.causal_conv1d_fn(x, weight, bias, seq_idx, init, c["final_states"], None, act)
    out, fin = res if c["final_states"] else (res, None)
    # The backward through the extension itself: dweight and dbias as upstream's kernels accumulate them (fp32),
    # before its Python wrapper rounds them to the weight's dtype.
    dout = to_device(t["dout"], it, device, cl)
    dfinal = to_device(t["dfinal_states"], it, device, True) if c["dfinal_states"] else None
    dx = torch.empty_like(x)
    dweight = torch.zeros(D, W, dtype=torch.float32, device=device)
    dbias = torch.zeros(D, dtype=torch.float32, device=device) if c["bias"] else None
    dinit = torch.empty(B, W - 1, D, dtype=x.dtype, device=device).transpose(1, 2) if c["initial_states"] else None
    causal_conv1d_cuda.causal_conv1d_bwd(x, weight, bias, dout, seq_idx, init, dfinal, dx, dweight, dbias, dinit,
                                         act is not None)
    r = {"out": out, "dx": dx, "dweight": dweight}
    if fin is not None:
        r["final_states"] = fin
    if dbias is not None:
        r["dbias"] = dbias
    if dinit is not None:
        r["dinitial_states"] = dinit
    return {k: v.detach().double().cpu().numpy() for k, v in r.items()}


def update_upstream(c, t, device):
    import causal_conv1d
    it, wt = c["itype"], c["wtype"]
    x = torch.from_numpy(t["x"]).to(TORCH_DTYPE[it]).to(device)
    state = torch.from_numpy(t["conv_state"]).to(TORCH_DTYPE[it]).to(device)
    weight = torch.from_numpy(t["weight"]).to(TORCH_DTYPE[wt]).to(device)
    bias = torch.from_numpy(t["bias"]).to(TORCH_DTYPE[wt]).to(device) if c["bias"] else None
    seqlens = torch.from_numpy(t["cache_seqlens"]).to(device) if "cache_seqlens" in t else None
    idx = torch.from_numpy(t["conv_state_indices"]).to(device) if "conv_state_indices" in t else None
    act = "silu" if c["activation"] == "silu" else None
    out = causal_conv1d.causal_conv1d_update(x, state, weight, bias, act, seqlens, idx)
    return {"out": out.double().cpu().numpy(), "conv_state_out": state.double().cpu().numpy()}


# ---------------------------------------------------------------------------------------------- checks
# Outputs that copy inputs (final states, the state pool) must match bit for bit.
EXACT = {"final_states", "conv_state_out"}


def out_dtype(c, name):
    return "fp32" if name in SUMS else c["itype"]


def check(c, got, ref):
    """{output: worst |got - ref| / limit}; a value > 1 fails. The limit is one unit of the output's dtype
    relative to |ref| plus FP32_REL (FP32_REL_SUMS) of the tensor's largest magnitude."""
    worst = {}
    for name, r in ref.items():
        g = got[name]
        if g.shape != r.shape:
            worst[name] = float("inf")
            continue
        if name in EXACT:
            worst[name] = 0.0 if np.array_equal(g, rounded(r, c["itype"])) else float("inf")
            continue
        dt = out_dtype(c, name)
        rel = FP32_REL_SUMS if name in SUMS else FP32_REL
        lim = ULP[dt] * np.abs(r) + rel * max(1.0, float(np.abs(r).max(initial=0.0)))
        err = np.abs(g - r)
        worst[name] = float(np.max(np.where(np.isnan(err), np.inf, err / lim), initial=0.0))
    return worst


# ---------------------------------------------------------------------------------------------- files
def npy_bytes(a, dtype):
    """fp32 as '<f4', fp16/bf16 as their raw bits ('<u2'), int32 as '<i4'."""
    if dtype == "int32":
        arr = np.ascontiguousarray(a, dtype="<i4")
    elif dtype == "fp32":
        arr = np.ascontiguousarray(a, dtype="<f4")
    else:
        bits = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(TORCH_DTYPE[dtype]).view(torch.int16)
        arr = np.ascontiguousarray(bits.numpy().view("<u2"))
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def tensor_dtypes(c):
    """Every tensor of the case in file order: name -> (dtype, role)."""
    it, wt = c["itype"], c["wtype"]
    d = {}
    if c["op"] == "conv":
        d["x"] = (it, "input")
        d["weight"] = (wt, "input")
        if c["bias"]:
            d["bias"] = (wt, "input")
        if c["seq_idx"]:
            d["seq_idx"] = ("int32", "input")
        if c["initial_states"]:
            d["initial_states"] = (it, "input")
        d["dout"] = (it, "input")
        if c["dfinal_states"]:
            d["dfinal_states"] = (it, "input")
        d["out"] = (it, "output")
        if c["final_states"]:
            d["final_states"] = (it, "output")
        d["dx"] = (it, "output")
        d["dweight"] = ("fp32", "output")
        if c["bias"]:
            d["dbias"] = ("fp32", "output")
        if c["initial_states"]:
            d["dinitial_states"] = (it, "output")
    else:
        d["x"] = (it, "input")
        d["conv_state"] = (it, "input")
        d["weight"] = (wt, "input")
        if c["bias"]:
            d["bias"] = (wt, "input")
        if c["cache_seqlens"] is not None:
            d["cache_seqlens"] = ("int32", "input")
        if c["conv_state_indices"] is not None:
            d["conv_state_indices"] = ("int32", "input")
        d["out"] = (it, "output")
        d["conv_state_out"] = (it, "output")
    return d


def case_json(c, arrays):
    j = {k: v for k, v in c.items()}
    j["tensors"] = {n: {"dtype": dt, "role": role, "shape": list(arrays[n].shape), "file": f"{n}.npy"}
                    for n, (dt, role) in tensor_dtypes(c).items()}
    return j


def environment(args, device):
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([os.path.relpath(os.path.abspath(sys.argv[0]), REPO)] + sys.argv[1:]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "numpy": np.__version__,
        "upstream_commit": args.upstream_commit,
        "deterministic": os.environ.get("CAUSAL_CONV1D_DETERMINISTIC", "unset"),
    }
    if args.dry_run:
        env["device"] = "none (dry run: outputs are the float64 reference's, rounded)"
        return env
    import causal_conv1d
    import causal_conv1d_cuda
    env["upstream_version"] = getattr(causal_conv1d, "__version__", "?")
    env["extension"] = getattr(causal_conv1d_cuda, "__file__", "?")
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip()
        except (OSError, subprocess.SubprocessError):
            driver = "?"
        env["device"] = f"{p.name} (sm_{p.major}{p.minor}), driver {driver or '?'}"
    else:
        env["device"] = f"{device} (a stand-in for upstream; not golden data)"
    return env


README = """# Golden vectors from causal-conv1d{dry}

Reference inputs and outputs of {upstream}'s CUDA kernels (`causal_conv1d_fn`'s forward, the extension's
backward, `causal_conv1d_update`) for selscan's causal conv1d (include/selscan/selscan.h, section 5c), used by
`tests/cpu/test_conv1d_golden.cpp` and `tests/gpu/test_gpu_conv1d_golden.cpp`. `SELSCAN_CONV1D_GOLDEN_DIR`
(environment) points the tests at another copy. The files are data, not code: regenerate them only from upstream's
kernels (make_goldens.py), never from this library.

## Provenance

{provenance}

Every case was also computed by make_goldens.py's float64 reference (the ABI's definition); upstream agreed with
it within the limits below (worst |upstream - reference| / limit per case in the table). {dropped}

## Layout

```
cases.json          every case: its parameters and tensors (name, dtype, role, shape, file), in order
make_goldens.py     the generator (not in the tarball)
<case>/case.json    the case's entry of cases.json
<case>/<tensor>.npy one file per tensor
```

Arrays are `.npy` (format 1.0, little-endian, C order) in their logical shape, whatever memory layout the call
used: `fp32` as `<f4`; `fp16` and `bf16` as their raw 16-bit patterns (`<u2`; numpy: `a.view(np.float16)`, or
`(a.astype(np.uint32) << 16).view(np.float32)` for bf16); index tensors (`seq_idx`, `cache_seqlens`,
`conv_state_indices`) as `<i4`. Each tensor's dtype is in cases.json (unlike tests/data/golden, which stores
fp16/bf16 values as float32).

Case keys: `op` (`conv`: forward + backward; `update`: the decode update), `seed`, sizes (`batch`, `dim`, `seqlen`
or `tokens`, `width`, `state_len`, `slots`), `itype` (x and every (b, d, t) tensor, states), `wtype` (weight, bias),
`layout` (`cf`: stride 1 over time; `cl`: stride 1 over channels, as upstream's channel-last kernels take x, dout,
dx, and (B, W-1, D)-major initial/final states), `bias`, `activation` (`silu` or `none`), the optional inputs
(`seq_idx`, `initial_states`, `final_states` returned, `dfinal_states` given) and for `update`: `x_2d` (x is
(B, D), one token), `cache_seqlens` (circular buffer), `conv_state_indices` with `pad_slot_id` -1.

| file | shape | dtype | notes |
|---|---|---|---|
| x, dout, out, dx | (B, D, L) | itype | update: x, out (B, D) or (B, D, T) |
| weight | (D, W) | wtype | |
| bias | (D,) | wtype | |
| seq_idx | (B, L) | int32 | -1 = padding; dout is 0 at padding positions (see below) |
| initial_states, final_states, dfinal_states, dinitial_states | (B, D, W-1) | itype | |
| dweight, dbias | (D, W), (D,) | fp32 | upstream's fp32 accumulators, before its wrapper rounds them to wtype |
| conv_state, conv_state_out | (S, D, state_len) | itype | the pool before and after the update |
| cache_seqlens, conv_state_indices | (B,) | int32 | |

Padding with seq_idx: a padding position's output is the constant 0, so its gradient reaches nothing. Upstream's
backward nevertheless passes dout between neighbouring padding positions (their seq_idx, -1, compare equal); the
cases zero dout there, so upstream's results are the true gradient and the golden leaves no ambiguity.

Limits (make_goldens.py's check; the tests use the same rule): |got - ref| <= u |ref| + e max(1, max |ref|) per
tensor, u = one unit of the output's dtype relative to its value (fp32 2^-23, fp16 2^-10, bf16 2^-7: a rounded
output may land one unit from the rounding of the exact value), e = {fp32_rel} for element-wise outputs and
{fp32_rel_sums} for dweight and dbias (the fp32 arithmetic: fast-math exp in SiLU, sums over batch and time in
another order; 10x what an fp32 emulation in a bad order measured). final_states and conv_state_out copy inputs:
bit for bit.

## Cases

| case | op | B x D x L/T | W | itype / wtype | layout / features | worst error / limit |
|---|---|---|---|---|---|---|
{table}
"""


def features(c):
    f = []
    if c["op"] == "conv":
        f.append(c["layout"])
        f += [k for k in ("seq_idx", "initial_states", "final_states", "dfinal_states") if c[k]]
    else:
        f.append(f"state_len {c['state_len']}, S {c['slots']}")
        if c["x_2d"]:
            f.append("x (B, D)")
        if c["cache_seqlens"] is not None:
            f.append(f"cache_seqlens {c['cache_seqlens']}")
        if c["conv_state_indices"] is not None:
            f.append(f"indices {c['conv_state_indices']}")
    f.append("bias" if c["bias"] else "no bias")
    f.append(c["activation"])
    return ", ".join(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".", help="directory the tarball conv1d_golden.tar.gz is written into")
    ap.add_argument("--dry-run", action="store_true", help="no upstream: store the float64 reference's outputs")
    ap.add_argument("--device", default="cuda", help="torch device of the upstream calls (default cuda)")
    ap.add_argument("--upstream-commit", default="0d2252d", help="recorded in the README (default 0d2252d)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args()
    if args.list:
        for c in CASES:
            print(f"{c['name']:34s} {features(c)}")
        return 0
    device = torch.device(args.device)
    if not args.dry_run:
        try:
            import causal_conv1d  # noqa: F401
            import causal_conv1d_cuda  # noqa: F401
        except ImportError as e:
            sys.exit(f"make_goldens: causal_conv1d is not importable ({e}); put bench/build_causal_conv1d.py's "
                     "output on PYTHONPATH, or pass --dry-run")
        if device.type == "cuda" and not torch.cuda.is_available():
            sys.exit("make_goldens: no CUDA device visible to torch (--device cuda)")

    members, cases_json, rows, dropped = {}, [], [], []
    total = 0
    t0 = time.time()
    for c in CASES:
        t = make_inputs(c)
        ref = conv_ref(c, t) if c["op"] == "conv" else update_ref(c, t)
        if args.dry_run:
            got = {n: rounded(v, out_dtype(c, n)) for n, v in ref.items()}
        else:
            got = conv_upstream(c, t, device) if c["op"] == "conv" else update_upstream(c, t, device)
        worst = check(c, got, ref)
        bad = sorted(n for n, v in worst.items() if not v <= 1.0)
        summary = ", ".join(f"{n} {v:.2g}" for n, v in worst.items())
        dims = f"{c['batch']}x{c['dim']}x{c.get('seqlen', c.get('tokens'))}"
        if bad:
            dropped.append(f"{c['name']} ({', '.join(bad)})")
            print(f"DROPPED {c['name']}: upstream disagrees with the float64 reference: {summary}")
            continue
        print(f"ok      {c['name']:34s} {summary}")
        arrays = dict(t)
        arrays.update(got)
        dts = tensor_dtypes(c)
        for n, (dt, _) in dts.items():
            data = npy_bytes(arrays[n], dt)
            members[f"conv1d_golden/{c['name']}/{n}.npy"] = data
            total += len(data)
        j = case_json(c, arrays)
        cases_json.append(j)
        members[f"conv1d_golden/{c['name']}/case.json"] = (json.dumps(j, indent=1) + "\n").encode()
        rows.append(f"| {c['name']} | {c['op']} | {dims} | {c['width']} | {c['itype']} / {c['wtype']} | "
                    f"{features(c)} | {max(worst.values()):.2g} |")
    if not cases_json:
        sys.exit("make_goldens: every case was dropped; nothing written")
    env = environment(args, device)
    provenance = "\n".join(f"- {k}: {v}" for k, v in env.items())
    members["conv1d_golden/cases.json"] = (json.dumps(cases_json, indent=1) + "\n").encode()
    members["conv1d_golden/README.md"] = README.format(
        dry=" (DRY RUN: the float64 reference's outputs, not upstream's; do not commit)" if args.dry_run else "",
        upstream=UPSTREAM, provenance=provenance, fp32_rel=FP32_REL, fp32_rel_sums=FP32_REL_SUMS, table="\n".join(rows),
        dropped=("Left out (upstream disagreed with the reference): " + "; ".join(dropped) + ".") if dropped
        else "No case was left out.").encode()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "conv1d_golden.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            info.mtime = int(time.time())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(members[name]))
    print(f"make_goldens: {len(cases_json)} cases, {total / 1e6:.2f} MB of .npy, {time.time() - t0:.1f} s -> {path}"
          f"{' (DRY RUN)' if args.dry_run else ''}")
    if total > SIZE_BUDGET:
        print(f"make_goldens: over the {SIZE_BUDGET / 1e6:.1f} MB budget")
    if dropped:
        print(f"make_goldens: {len(dropped)} cases left out: {'; '.join(dropped)}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
