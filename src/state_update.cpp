// selscan_state_update below the API layer: the public struct -> one StateUpdate (every check and message of
// the decode step lives here, once), then the CPU path or the CUDA launcher. On success nothing is allocated
// or formatted and the device is not queried beyond the arch decision cached per device, so a decode step's
// host cost is the checks plus one kernel launch.
#include "state_update.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "validate.h"

#if SELSCAN_WITH_CUDA
#  include "cuda/arch.h"
#endif

namespace selscan {
namespace {

// ------------------------------------------------------------------------------------------ struct versions
// sizeof of the struct in its first version: the smallest struct_size accepted. Later versions append fields
// after `out`; fields past an older caller's struct_size then read as absent.
constexpr size_t kArgsSizeV1 = offsetof(selscan_state_update_args_t, out) + sizeof(selscan_tensor_t);
static_assert(sizeof(void*) != 8 || kArgsSizeV1 == 904, "a field moved: versions may only append fields");
static_assert(sizeof(selscan_state_update_args_t) == kArgsSizeV1,
              "no tail padding: a later version's field must not land in bytes an older caller never set");
// A struct_size above this is garbage rather than a newer version; nothing past the struct is read then.
constexpr size_t kMaxStructSize = size_t{64} << 10;

// The CUDA kernel numbers a sequence's (channel, lane) pairs in 32 bits, with up to 32 lanes per channel.
constexpr int64_t kMaxChannels = (int64_t{1} << 31) / 32;

constexpr int kMaxTensors = 11;

// ------------------------------------------------------------------------------------------ messages
std::string dtype_str(int32_t d) {
  switch (d) {
    case SELSCAN_DTYPE_FLOAT32: return "float32";
    case SELSCAN_DTYPE_FLOAT16: return "float16";
    case SELSCAN_DTYPE_BFLOAT16: return "bfloat16";
    case SELSCAN_DTYPE_COMPLEX64: return "complex64";
    case SELSCAN_DTYPE_INT32: return "int32";
    case SELSCAN_DTYPE_INT64: return "int64";
    default: return fmt::format("dtype code {}", d);
  }
}

int64_t dtype_bytes(int32_t d) {
  switch (d) {
    case SELSCAN_DTYPE_FLOAT16:
    case SELSCAN_DTYPE_BFLOAT16: return 2;
    case SELSCAN_DTYPE_COMPLEX64:
    case SELSCAN_DTYPE_INT64: return 8;
    default: return 4;
  }
}

bool is_float(int32_t d) {
  return d == SELSCAN_DTYPE_FLOAT32 || d == SELSCAN_DTYPE_FLOAT16 || d == SELSCAN_DTYPE_BFLOAT16;
}

std::string tuple_str(const int64_t* s, int n) {
  std::string r = "(";
  for (int i = 0; i < n; ++i) r += fmt::format(i ? ", {}" : "{}", s[i]);
  return r + (n == 1 ? ",)" : ")");
}

// The shape a caller gave: "(2, 4, 9)", or "ndim=7" when ndim itself is out of range.
std::string given(const selscan_tensor_t& t) {
  return t.ndim >= 0 && t.ndim <= SELSCAN_MAX_NDIM ? tuple_str(t.sizes, t.ndim) : fmt::format("ndim={}", t.ndim);
}

// The shapes of one call, as the messages print them.
struct Shape {
  int64_t s[SELSCAN_MAX_NDIM];
  int n;
  bool operator==(const selscan_tensor_t& t) const {
    if (t.ndim != n) return false;
    for (int i = 0; i < n; ++i)
      if (t.sizes[i] != s[i]) return false;
    return true;
  }
  std::string str() const { return tuple_str(s, n); }
};

// ------------------------------------------------------------------------------------------ checks
struct Extent {
  const char* name;
  uintptr_t lo, hi;  // bytes [lo, hi)
  bool output;
};

class Check {
 public:
  bool ok() const { return status_ == SELSCAN_STATUS_SUCCESS; }
  Status status() const { return status_; }

  void failf(Status s, std::string msg) {
    if (ok()) status_ = fail(s, std::move(msg));
  }

  bool required(const selscan_tensor_t& t, const char* name) {
    if (ok() && t.data == nullptr)
      failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("{}: required, but its data pointer is NULL", name));
    return ok();
  }

  // dtype must be `a`, or `b` when b >= 0.
  void dtype(const selscan_tensor_t& t, const char* name, int32_t a, int32_t b, const char* what) {
    if (ok() && t.dtype != a && t.dtype != b)
      failf(SELSCAN_STATUS_DTYPE_MISMATCH,
            fmt::format("{}: expected dtype {}{} ({}), got {}", name, dtype_str(a),
                        b >= 0 && b != a ? " or " + dtype_str(b) : std::string(), what, dtype_str(t.dtype)));
  }

  void shape(const selscan_tensor_t& t, const char* name, const Shape& want, const char* what) {
    if (ok() && !(want == t))
      failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("{}: expected shape {} {}, got {}", name, want.str(), what, given(t)));
  }

  // Strides >= 0, an element-aligned pointer, a byte span that fits 64-bit offsets and does not wrap the
  // address space; for outputs, no two elements sharing memory. Records the byte range for aliases(). Needs a
  // checked ndim and sizes >= 1.
  void layout(const selscan_tensor_t& t, const char* name, bool output) {
    if (!ok()) return;
    const int n = t.ndim;
    const int64_t esize = dtype_bytes(t.dtype);
    const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
    if (base % static_cast<uintptr_t>(esize) != 0)
      return failf(SELSCAN_STATUS_BAD_LAYOUT,
                   fmt::format("{}: data pointer {} is not aligned to its {}-byte elements", name, t.data, esize));
    int64_t span = 0;  // largest element offset
    for (int i = 0; i < n; ++i) {
      if (t.strides[i] < 0)
        return failf(SELSCAN_STATUS_BAD_LAYOUT, fmt::format("{}: negative strides are not supported, got strides {}",
                                                            name, tuple_str(t.strides, n)));
      const int64_t extent = t.sizes[i] - 1;
      if (t.strides[i] != 0 && extent > (INT64_MAX - span) / t.strides[i])
        return failf(SELSCAN_STATUS_UNSUPPORTED, fmt::format("{}: sizes {} with strides {} overflow 64-bit offsets",
                                                             name, tuple_str(t.sizes, n), tuple_str(t.strides, n)));
      span += extent * t.strides[i];
    }
    if (span > INT64_MAX / esize - 1)
      return failf(SELSCAN_STATUS_UNSUPPORTED,
                   fmt::format("{}: sizes {} with strides {} span {} elements of {} bytes, beyond 64-bit byte offsets",
                               name, tuple_str(t.sizes, n), tuple_str(t.strides, n), span + 1, esize));
    const uintptr_t bytes = static_cast<uintptr_t>((span + 1) * esize);
    if (bytes > UINTPTR_MAX - base)
      return failf(SELSCAN_STATUS_UNSUPPORTED,
                   fmt::format("{}: data pointer {} plus its {} bytes wraps the address space", name, t.data, bytes));
    if (output) no_self_overlap(t, name);
    if (ok() && count_ < kMaxTensors) extents_[count_++] = Extent{name, base, base + bytes, output};
  }

  // No output may share a byte with any other tensor of the call: the state is read before it is written, so
  // an input inside it would change under the kernel, and `out` over an input would be read after written.
  // Byte ranges, so interleaved views whose elements happen to be disjoint are turned away too (conservative).
  void aliases() {
    for (int i = 0; ok() && i < count_; ++i)
      for (int j = i + 1; ok() && j < count_; ++j) {
        const Extent& a = extents_[i];
        const Extent& b = extents_[j];
        if (!(a.output || b.output) || a.hi <= b.lo || b.hi <= a.lo) continue;
        const Extent& o = b.output ? b : a;
        const Extent& other = b.output ? a : b;
        failf(SELSCAN_STATUS_BAD_LAYOUT,
              fmt::format("{}: its bytes [{:#x}, {:#x}) overlap {}'s bytes [{:#x}, {:#x}); the outputs (state, out) "
                          "may not share memory with any other tensor of the call",
                          o.name, o.lo, o.hi, other.name, other.lo, other.hi));
      }
  }

 private:
  // Take the dims of size > 1 by increasing stride: each stride must exceed the largest offset the dims
  // before it reach. Then distinct indices never meet (every dense or padded layout passes, in any dim order).
  void no_self_overlap(const selscan_tensor_t& t, const char* name) {
    int order[SELSCAN_MAX_NDIM];
    int m = 0;
    for (int i = 0; i < t.ndim; ++i)
      if (t.sizes[i] > 1) {
        int k = m++;
        for (; k > 0 && t.strides[order[k - 1]] > t.strides[i]; --k) order[k] = order[k - 1];
        order[k] = i;
      }
    int64_t reach = 0;
    for (int k = 0; k < m; ++k) {
      const int d = order[k];
      if (t.strides[d] <= reach)
        return failf(SELSCAN_STATUS_BAD_LAYOUT,
                     fmt::format("{}: output elements would overlap: dim {} (size {}) has stride {}, but the dims with "
                                 "smaller strides already reach offset {} (sizes {}, strides {})",
                                 name, d, t.sizes[d], t.strides[d], reach, tuple_str(t.sizes, t.ndim),
                                 tuple_str(t.strides, t.ndim)));
      reach += (t.sizes[d] - 1) * t.strides[d];
    }
  }

  Status status_ = SELSCAN_STATUS_SUCCESS;
  Extent extents_[kMaxTensors];
  int count_ = 0;
};

// The caller's struct, or NULL after recording why not. A newer caller's larger struct is accepted while every
// byte past this library's struct is zero (a non-zero one asks for something this version cannot do).
const selscan_state_update_args_t* read_struct(Check& c, const selscan_state_update_args_t* a) {
  if (a == nullptr) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT, "selscan_state_update_args: pointer is NULL");
    return nullptr;
  }
  const size_t ss = a->struct_size;
  if (ss < kArgsSizeV1 || ss > kMaxStructSize) {
    c.failf(SELSCAN_STATUS_BAD_STRUCT_SIZE,
            fmt::format("selscan_state_update_args: struct_size is {}, expected sizeof(selscan_state_update_args_t) "
                        "of the caller's header: {} in this version, at most {}",
                        ss, sizeof(selscan_state_update_args_t), kMaxStructSize));
    return nullptr;
  }
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(a);
  for (size_t i = sizeof(selscan_state_update_args_t); i < ss; ++i)
    if (bytes[i] != 0) {
      c.failf(SELSCAN_STATUS_UNSUPPORTED,
              fmt::format("selscan_state_update_args: struct_size is {}, larger than this library's {}, and byte {} "
                          "past its struct is {:#04x}, not 0: a field of a newer version that this library does not "
                          "have (upgrade libselscan, or leave the field 0)",
                          ss, sizeof(selscan_state_update_args_t), i, bytes[i]));
      return nullptr;
    }
  return a;
}

bool sizes_positive(Check& c, const selscan_tensor_t& t, const char* name) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.sizes[i] < 1) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("{}: every size must be >= 1 (zero-size calls are rejected), got {}", name, given(t)));
      return false;
    }
  return true;
}

// The (h, p) strides of a per-channel tensor of either form: Mamba-1's single channel dim becomes h, p stride 0.
void channel_strides(const selscan_tensor_t& t, int first, bool heads, int64_t* s) {
  s[0] = t.strides[first];
  s[1] = heads ? t.strides[first + 1] : 0;
}

}  // namespace

Status make_state_update(const selscan_state_update_args_t* args, StateUpdate* out) {
  Check c;
  const selscan_state_update_args_t* a = read_struct(c, args);
  if (a == nullptr) return c.status();
  if (a->flags != 0)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("flags: reserved, must be 0, got {}", a->flags));
  if (a->dt_softplus != 0 && a->dt_softplus != 1)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("dt_softplus: expected 0 or 1, got {}", a->dt_softplus));

  // state decides the form: (S, D, N) Mamba-1, (S, H, P, N) heads.
  const selscan_tensor_t& st = a->state;
  if (!c.required(st, "state")) return c.status();
  if (st.ndim != 3 && st.ndim != 4)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("state: expected 3 dims (slots, dim, dstate: the Mamba-1 form) or 4 (slots, heads, "
                            "headdim, dstate: the heads form), got {}",
                            given(st)));
  if (!sizes_positive(c, st, "state")) return c.status();
  const bool heads = st.ndim == 4;
  const int64_t S = st.sizes[0], H = st.sizes[1], P = heads ? st.sizes[2] : 1, N = st.sizes[st.ndim - 1];
  if (N > SELSCAN_MAX_DSTATE)
    return fail(SELSCAN_STATUS_UNSUPPORTED,
                fmt::format("state: dstate (the last dim) must be in [1, {}], got {}", SELSCAN_MAX_DSTATE, N));
  if (H > kMaxChannels / P)
    return fail(SELSCAN_STATUS_UNSUPPORTED,
                fmt::format("state: {} channels per slot (heads * headdim), at most {} are supported", H * P,
                            kMaxChannels));
  const int nch = heads ? 2 : 1;  // channel dims
  const char* form = heads ? "(batch, heads, headdim) or (batch, tokens, heads, headdim), like state's heads"
                           : "(batch, dim) or (batch, tokens, dim), like state's dim";

  // x decides the batch, the tokens and the itype.
  const selscan_tensor_t& x = a->x;
  if (!c.required(x, "x")) return c.status();
  if (!is_float(x.dtype))
    return fail(SELSCAN_STATUS_DTYPE_MISMATCH,
                fmt::format("x: expected dtype float32, float16 or bfloat16, got {}", dtype_str(x.dtype)));
  const bool has_t = x.ndim == 2 + nch;
  bool x_ok = x.ndim == 1 + nch || has_t;
  for (int i = 0; x_ok && i < nch; ++i) x_ok = x.sizes[x.ndim - nch + i] == st.sizes[1 + i];
  if (!x_ok)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("x: expected shape {} {}, got {}", form, tuple_str(st.sizes + 1, nch), given(x)));
  if (!sizes_positive(c, x, "x")) return c.status();
  const int32_t it = x.dtype;
  const int64_t Bt = x.sizes[0], T = has_t ? x.sizes[1] : 1;
  Shape xs{{0, 0, 0, 0}, x.ndim};
  for (int i = 0; i < x.ndim; ++i) xs.s[i] = x.sizes[i];
  c.dtype(st, "state", SELSCAN_DTYPE_FLOAT32, it, "float32, or x's dtype");
  c.layout(x, "x", false);

  c.required(a->dt, "dt");
  c.dtype(a->dt, "dt", SELSCAN_DTYPE_FLOAT32, it, "float32, or x's dtype");
  c.shape(a->dt, "dt", xs, "like x");
  c.layout(a->dt, "dt", false);
  if (a->z.data != nullptr) {
    c.dtype(a->z, "z", SELSCAN_DTYPE_FLOAT32, it, "float32, or x's dtype");
    c.shape(a->z, "z", xs, "like x");
    c.layout(a->z, "z", false);
  }

  Shape ws{{H, P, N, 0}, 1 + nch};  // A: (D, N) or (H, P, N)
  if (!heads) ws.s[1] = N;
  c.required(a->A, "A");
  c.dtype(a->A, "A", SELSCAN_DTYPE_FLOAT32, -1, "float32");
  c.shape(a->A, "A", ws, heads ? "(heads, headdim, dstate)" : "(dim, dstate)");
  c.layout(a->A, "A", false);
  const Shape cs{{H, P, 0, 0}, nch};  // D, dt_bias: (D,) or (H, P)
  const selscan_tensor_t* vecs[2] = {&a->D, &a->dt_bias};
  const char* vec_names[2] = {"D", "dt_bias"};
  for (int k = 0; k < 2; ++k)
    if (vecs[k]->data != nullptr) {
      c.dtype(*vecs[k], vec_names[k], SELSCAN_DTYPE_FLOAT32, -1, "float32");
      c.shape(*vecs[k], vec_names[k], cs, heads ? "(heads, headdim)" : "(dim,)");
      c.layout(*vecs[k], vec_names[k], false);
    }
  if (!c.ok()) return c.status();

  // B, C: (Bt, [T,] [G,] N).
  const int base_nd = 2 + (has_t ? 1 : 0);
  int64_t groups[2] = {1, 1};
  const selscan_tensor_t* bc[2] = {&a->B, &a->C};
  const char* bc_names[2] = {"B", "C"};
  for (int k = 0; k < 2 && c.ok(); ++k) {
    const selscan_tensor_t& t = *bc[k];
    if (!c.required(t, bc_names[k])) break;
    const bool grouped = t.ndim == base_nd + 1;
    Shape want{{Bt, T, 0, 0}, grouped ? base_nd + 1 : base_nd};
    int i = has_t ? 2 : 1;
    if (grouped) {
      groups[k] = t.sizes[i];
      want.s[i++] = groups[k];
    }
    want.s[i] = N;
    if (!(want == t) || groups[k] < 1) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("{}: expected shape ({}, {}{}) or ({}, {}groups, {}) (batch, {}[groups,] dstate), got {}",
                          bc_names[k], Bt, has_t ? fmt::format("{}, ", T) : "", N, Bt,
                          has_t ? fmt::format("{}, ", T) : "", N, has_t ? "tokens, " : "", given(t)));
      break;
    }
    c.dtype(t, bc_names[k], SELSCAN_DTYPE_FLOAT32, it, "float32, or x's dtype");
    c.layout(t, bc_names[k], false);
  }
  if (!c.ok()) return c.status();
  if (groups[0] != groups[1])
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("C: expected the same number of groups as B ({}), got {}", groups[0], groups[1]));
  const int64_t G = groups[0];
  if (H % G != 0)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("B/C: groups ({}) must divide {} ({}); {} h uses group h / ({} / groups)", G,
                            heads ? "heads" : "dim", H, heads ? "head" : "channel", heads ? "heads" : "dim"));

  const selscan_tensor_t& idx = a->state_batch_indices;
  if (idx.data != nullptr) {
    c.dtype(idx, "state_batch_indices", SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64, "slot indices");
    c.shape(idx, "state_batch_indices", Shape{{Bt, 0, 0, 0}, 1}, "(batch,): one slot per sequence");
    c.layout(idx, "state_batch_indices", false);
  } else if (S != Bt) {
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("state: expected {} slots (one per sequence of x) without state_batch_indices, got {}",
                            Bt, given(st)));
  }

  // outputs
  c.layout(st, "state", true);
  c.required(a->out, "out");
  c.dtype(a->out, "out", it, -1, "x's dtype");
  c.shape(a->out, "out", xs, "like x");
  c.layout(a->out, "out", true);
  c.aliases();
  if (!c.ok()) return c.status();
  if (out == nullptr) return fail(SELSCAN_STATUS_INTERNAL, "make_state_update: out is NULL");

  StateUpdate p{};
  p.batch = Bt;
  p.tokens = T;
  p.heads = H;
  p.headdim = P;
  p.dstate = N;
  p.groups = G;
  p.slots = S;
  p.heads_per_group = H / G;
  p.pad_slot = a->pad_slot_id;
  p.x_t = static_cast<Dtype>(it);
  p.dt_t = static_cast<Dtype>(a->dt.dtype);
  p.B_t = static_cast<Dtype>(a->B.dtype);
  p.C_t = static_cast<Dtype>(a->C.dtype);
  p.z_t = a->z.data != nullptr ? static_cast<Dtype>(a->z.dtype) : p.x_t;
  p.state_t = static_cast<Dtype>(st.dtype);
  p.softplus = a->dt_softplus != 0;
  p.idx64 = idx.dtype == SELSCAN_DTYPE_INT64;
  p.x = x.data;
  p.dt = a->dt.data;
  p.A = a->A.data;
  p.B = a->B.data;
  p.C = a->C.data;
  p.D = a->D.data;
  p.z = a->z.data;
  p.dt_bias = a->dt_bias.data;
  p.idx = idx.data;
  p.state = st.data;
  p.out = a->out.data;
  // (b, t, h, p) of the x-like tensors; the tokens dim has stride 0 when absent (T = 1).
  const selscan_tensor_t* xl[4] = {&x, &a->dt, &a->z, &a->out};
  int64_t* xl_s[4] = {p.sx, p.sdt, p.sz, p.sout};
  for (int k = 0; k < 4; ++k) {
    if (xl[k]->data == nullptr) continue;
    xl_s[k][0] = xl[k]->strides[0];
    xl_s[k][1] = has_t ? xl[k]->strides[1] : 0;
    channel_strides(*xl[k], has_t ? 2 : 1, heads, xl_s[k] + 2);
  }
  // (b, t, g, n) of B and C; g stride 0 without a groups dim.
  int64_t* bc_s[2] = {p.sB, p.sC};
  for (int k = 0; k < 2; ++k) {
    const selscan_tensor_t& t = *bc[k];
    const bool grouped = t.ndim == base_nd + 1;
    bc_s[k][0] = t.strides[0];
    bc_s[k][1] = has_t ? t.strides[1] : 0;
    bc_s[k][2] = grouped ? t.strides[base_nd - 1] : 0;
    bc_s[k][3] = t.strides[t.ndim - 1];
  }
  channel_strides(a->A, 0, heads, p.sA);
  p.sA[2] = a->A.strides[nch];
  if (p.D != nullptr) channel_strides(a->D, 0, heads, p.sD);
  if (p.dt_bias != nullptr) channel_strides(a->dt_bias, 0, heads, p.sbias);
  p.sstate[0] = st.strides[0];
  channel_strides(st, 1, heads, p.sstate + 1);
  p.sstate[3] = st.strides[st.ndim - 1];
  p.sidx = p.idx != nullptr ? idx.strides[0] : 0;
  *out = p;
  return SELSCAN_STATUS_SUCCESS;
}

Status state_update(const selscan_state_update_args_t* args, const selscan_exec_t* exec) {
  StateUpdate p;
  if (Status s = make_state_update(args, &p); s != SELSCAN_STATUS_SUCCESS) return s;
  if (Status s = check_exec(exec); s != SELSCAN_STATUS_SUCCESS) return s;
  if (exec->device_kind == SELSCAN_DEVICE_CPU) return cpu::state_update(p, exec->num_threads);
#if SELSCAN_WITH_CUDA
  cuda::Family family{};
  if (Status s = cuda::select_family(exec->device_index, &family); s != SELSCAN_STATUS_SUCCESS) return s;
  cuda::DeviceGuard guard(exec->device_index);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return guard.status();
  return cuda::launch_state_update(p, exec->stream);
#else
  return fail(SELSCAN_STATUS_CUDA_NOT_BUILT,
              "selscan_state_update: this libselscan was built without CUDA; use SELSCAN_DEVICE_CPU or rebuild "
              "with a CUDA preset");
#endif
}

}  // namespace selscan
