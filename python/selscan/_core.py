"""Framework-independent driver: converts the caller's arrays to what the C ABI takes, fills the argument
structs, allocates outputs through the backend, and calls selscan_fwd / selscan_bwd."""

import ctypes

from . import _lib
from ._backends import ITEMSIZE
from ._lib import SelscanError

_ITYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
}


def normalize_itype(itype):
    if itype is None:
        return None
    key = str(itype).lower().replace("torch.", "")
    if key.startswith("<class 'numpy.") and key.endswith("'>"):  # e.g. numpy.float16 passed as a type
        key = key[len("<class 'numpy."):-2]
    if key not in _ITYPE_ALIASES:
        raise SelscanError(f"itype: '{itype}' is not one of 'fp32', 'fp16', 'bf16'", _lib.STATUS_INVALID_ARGUMENT)
    return _ITYPE_ALIASES[key]


class Prepared:
    """The inputs in library form plus what is needed to hand gradients back in the caller's form."""

    def __init__(self, be):
        self.be = be
        self.t = {}              # name -> library-form array (None when absent)
        self.squeezed = {}       # "B"/"C" -> True when given as 3-D (Bt, N, L) and unsqueezed to G = 1
        self.complex_given = {}  # "B"/"C" -> True when a variable complex B/C was given as complex (..., L)
        self.variable = {}
        self.it = self.wt = None

    @property
    def io_shape(self):
        return tuple(self.t["u"].shape)

    def sizes(self):
        sh = tuple(self.t["u"].shape) + (1, 1, 1)
        a = tuple(self.t["A"].shape)
        n = a[-1] if len(a) >= 1 else 1
        return sh[0], sh[1], sh[2], n


def prepare(be, u, delta, A, B, C, D=None, z=None, delta_bias=None, h0=None, itype=None):
    p = Prepared(be)
    raw = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias, "h0": h0}
    for name in ("u", "delta", "A", "B", "C"):
        if raw[name] is None:
            raise SelscanError(f"{name} is required (got None)", _lib.STATUS_INVALID_ARGUMENT)
    a = {name: be.adopt(name, v) for name, v in raw.items()}
    it = normalize_itype(itype) or be.infer_itype("u", a["u"])
    wt = "c64" if be.is_complex(a["A"]) else "fp32"
    p.it, p.wt = it, wt
    for name in ("u", "delta", "z"):
        p.t[name] = None if a[name] is None else be.fix_layout(be.cast(name, a[name], it), True)
    p.t["A"] = be.fix_layout(be.cast("A", a["A"], wt), False)
    for name in ("B", "C"):
        x = a[name]
        var = len(x.shape) >= 3
        p.variable[name] = var
        p.squeezed[name] = var and len(x.shape) == 3
        p.complex_given[name] = False
        if var:
            if be.is_complex(x):
                if wt != "c64":
                    raise SelscanError(f"{name}: variable {name} is complex but A is real; with real A, "
                                       f"{name} must be real", _lib.STATUS_DTYPE_MISMATCH)
                # Complex (…, L) -> the library's real (…, 2L) layout, Re/Im interleaved.
                x = be.complex_to_interleaved(x)
                p.complex_given[name] = True
            x = be.fix_layout(be.cast(name, x, it), True)
            if p.squeezed[name]:
                x = be.reshape(x, (x.shape[0], 1) + tuple(x.shape[1:]))
        else:
            x = be.fix_layout(be.cast(name, x, wt), False)
        p.t[name] = x
    for name in ("D", "delta_bias"):
        p.t[name] = None if a[name] is None else be.fix_layout(be.cast(name, a[name], "fp32"), False)
    p.t["h0"] = None if a["h0"] is None else be.fix_layout(be.cast("initial_state", a["h0"], wt), False)
    return p


class Serving:
    """The serving arguments of a call (docs/serving.md) in library form: packed sequences (cu_seqlens), a state
    pool (ssm_states, updated in place, so it is used as given), cache_indices, has_initial_state, pad_slot_id, and
    block-wise state caching (state_block_size, block_table, context_lens; forward only)."""

    def __init__(self, be, cu_seqlens=None, ssm_states=None, cache_indices=None, has_initial_state=None,
                 pad_slot_id=-1, block_table=None, context_lens=None, state_block_size=0):
        self.t, self.codes = {}, {}
        for name, v in (("cu_seqlens", cu_seqlens), ("cache_indices", cache_indices),
                        ("has_initial_state", has_initial_state), ("block_table", block_table),
                        ("context_lens", context_lens)):
            a = be.adopt(name, v)
            self.t[name] = a
            if a is not None:
                self.codes[name] = be.index_code(name, a)
        self.t["ssm_states"] = be.adopt("ssm_states", ssm_states)
        self.state_block_size = int(state_block_size)
        self.pad_slot_id = int(pad_slot_id) if cache_indices is not None or block_table is not None else 0

    @property
    def varlen(self):
        return self.t["cu_seqlens"] is not None

    def sequences(self, batch):
        cu = self.t["cu_seqlens"]
        return batch if cu is None else int(cu.shape[0]) - 1

    def without_pool(self):
        """The same call for the backward (which has no pool: its initial states come as h0)."""
        s = Serving.__new__(Serving)
        s.t = dict(self.t, ssm_states=None, block_table=None, context_lens=None)
        s.codes = dict(self.codes)
        s.pad_slot_id = self.pad_slot_id if s.t["cache_indices"] is not None else 0
        s.state_block_size = 0
        return s

    def fill(self, p, args, names):
        for name in names:
            if self.t.get(name) is not None:
                code = self.codes.get(name, p.wt)  # ssm_states: A's dtype, used in place (not converted)
                _set(p, args, name, self.t[name], code)
        args.pad_slot_id = self.pad_slot_id
        if hasattr(args, "state_block_size"):  # the forward's struct
            args.state_block_size = self.state_block_size


def _code_of(p, name):
    """dtype code of a library-form input or output tensor."""
    if name in ("u", "delta", "z", "out", "out_z", "dout", "du", "ddelta", "dz"):
        return p.it
    if name in ("D", "delta_bias", "dD", "ddelta_bias"):
        return "fp32"
    if name in ("B", "C", "dB", "dC"):
        return p.it if p.variable[name[-1]] else p.wt
    return p.wt  # A, h0, x, last_state, dA, dh0


def _set(p, struct, name, arr, code=None):
    if arr is None:
        return
    ptr, shape, strides = p.be.describe(arr)
    _lib.set_tensor(getattr(struct, name), ptr, _lib.DTYPE_CODES[code or _code_of(p, name)], shape, strides)


def _exec(p, num_threads):
    be = p.be
    return _lib.make_exec(be.device_kind, be.device_index, be.stream(), num_threads)


def _attach_workspace(p, kind, args, ex):
    """CUDA only: ask the library how much scratch the call needs and allocate it in the caller's framework."""
    if p.be.device_kind != _lib.DEVICE_CUDA:
        return None
    nbytes = ctypes.c_size_t(0)
    _lib.call(f"selscan_{kind}_workspace_size", ctypes.byref(args), ctypes.byref(ex), ctypes.byref(nbytes))
    ptr, keep = p.be.workspace(int(nbytes.value))
    ex.workspace = ptr
    ex.workspace_bytes = int(nbytes.value)
    return keep


def nchunks(seqlen):
    return max(0, (seqlen + _lib.CHUNK - 1) // _lib.CHUNK)


def x_shape(p, serving=None):
    """The chunk states' shape: (Bt, D, ceil(L/2048), 2N); packed sequences: (1, D, L/2048 + sequences, 2N)."""
    bt, dm, L, n = p.sizes()
    if serving is not None and serving.varlen:
        return (1, dm, L // _lib.CHUNK + serving.sequences(bt), 2 * n)
    return (bt, dm, nchunks(L), 2 * n)


def needs_x(p, serving=None):
    """Whether the backward needs the forward's chunk states (a sequence may span chunks)."""
    L = p.sizes()[2]
    return L > _lib.CHUNK if serving is not None and serving.varlen else nchunks(L) > 1


def run_fwd(p, delta_softplus=False, want_x=False, want_last=False, num_threads=0, serving=None):
    """Returns {'out', 'out_z', 'x', 'last_state'} in library form (absent ones None). `serving`: a Serving."""
    be = p.be
    bt, dm, L, n = p.sizes()
    seqs = bt if serving is None else serving.sequences(bt)
    r = {
        "out": be.empty(p.io_shape, p.it),
        "out_z": be.empty(p.io_shape, p.it) if p.t["z"] is not None else None,
        "x": be.empty(x_shape(p, serving), p.wt) if want_x else None,
        "last_state": be.empty((seqs, dm, n), p.wt) if want_last else None,
    }
    args = _lib.new_fwd_args()
    for name in _lib.FWD_INPUTS:
        _set(p, args, name, p.t[name])
    for name in _lib.FWD_OUTPUTS:
        _set(p, args, name, r[name])
    if serving is not None:
        serving.fill(p, args, _lib.FWD_SERVING + _lib.FWD_BLOCKS)
    args.delta_softplus = 1 if delta_softplus else 0
    ex = _exec(p, num_threads)
    keep = _attach_workspace(p, "fwd", args, ex)  # noqa: F841  (alive until the call is enqueued)
    _lib.call("selscan_fwd", ctypes.byref(args), ctypes.byref(ex))
    return r


def run_bwd(p, dout, delta_softplus=False, deterministic=False, num_threads=0, saved_out=None, saved_x=None,
            want_dh0=True, serving=None):
    """Returns the gradients in library form: du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0 (absent: None).
    `saved_out` / `saved_x` are the forward's out and x when the caller kept them; otherwise the forward is
    re-run here for whichever of them the backward needs (out iff z is given, x iff L > 2048)."""
    be = p.be
    bt, dm, L, n = p.sizes()
    has_z = p.t["z"] is not None
    if serving is not None:
        serving = serving.without_pool()  # the initial states come as h0
    need_x = needs_x(p, serving)
    if (has_z and saved_out is None) or (need_x and saved_x is None):
        f = run_fwd(p, delta_softplus, want_x=need_x, num_threads=num_threads, serving=serving)
        saved_out = saved_out if saved_out is not None else f["out"]
        saved_x = saved_x if saved_x is not None else f["x"]
    dout = be.fix_layout(be.cast("dout", be.adopt("dout", dout), p.it), True)
    t = p.t
    g = {
        "du": be.empty(p.io_shape, p.it),
        "ddelta": be.empty(p.io_shape, p.it),
        "dA": be.empty(tuple(t["A"].shape), p.wt),
        "dB": be.empty(tuple(t["B"].shape), _code_of(p, "dB")),
        "dC": be.empty(tuple(t["C"].shape), _code_of(p, "dC")),
        "dD": be.empty(tuple(t["D"].shape), "fp32") if t["D"] is not None else None,
        "dz": be.empty(p.io_shape, p.it) if has_z else None,
        "ddelta_bias": be.empty(tuple(t["delta_bias"].shape), "fp32") if t["delta_bias"] is not None else None,
        "dh0": be.empty(tuple(t["h0"].shape), p.wt) if (t["h0"] is not None and want_dh0) else None,
    }
    args = _lib.new_bwd_args()
    for name in _lib.BWD_INPUTS:
        _set(p, args, name, t[name])
    _set(p, args, "dout", dout)
    if need_x:
        _set(p, args, "x", saved_x, p.wt)
    if has_z:
        _set(p, args, "out", saved_out)
    for name, arr in g.items():
        _set(p, args, name, arr)
    if serving is not None:
        serving.fill(p, args, _lib.BWD_SERVING)
    args.delta_softplus = 1 if delta_softplus else 0
    args.deterministic = 1 if deterministic else 0
    ex = _exec(p, num_threads)
    keep = _attach_workspace(p, "bwd", args, ex)  # noqa: F841
    _lib.call("selscan_bwd", ctypes.byref(args), ctypes.byref(ex))
    return g


def user_grad(p, name, arr):
    """A library-form gradient as the caller gave the matching input: dtype (bf16 -> float32 on numpy/CuPy),
    3-D variable B/C squeezed back, complex variable B/C back to complex."""
    if arr is None:
        return None
    be = p.be
    code = _code_of(p, name)
    out = be.to_user(arr, code)
    if name in ("dB", "dC"):
        key = name[-1]
        if p.squeezed[key]:
            out = be.reshape(out, (out.shape[0],) + tuple(out.shape[2:]))
        if p.complex_given[key]:
            out = be.interleaved_to_complex(out)
    return out
