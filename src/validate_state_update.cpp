// The decode step's argument checks (src/state_update.h): the public struct -> one StateUpdate. Every check and
// message of selscan_state_update lives here, once, on the shared Checker (checker.h), with check_host_dst, the
// CPU call's check of the destination slots' contents (as validate.cpp's check_host_serving for the scan). On
// success nothing is allocated or formatted.
#include "state_update.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checker.h"

namespace selscan {
namespace {

// ------------------------------------------------------------------------------------------ struct versions
// sizeof of the struct in its first version: the smallest struct_size accepted. Later versions append fields
// after `out`; fields past an older caller's struct_size then read as absent.
constexpr size_t kArgsSizeV1 = offsetof(selscan_state_update_args_t, out) + sizeof(selscan_tensor_t);
static_assert(sizeof(void*) != 8 || kArgsSizeV1 == 904, "a field moved: versions may only append fields");
// 0.4 appends dst_state_batch_indices.
constexpr size_t kArgsSizeV2 = offsetof(selscan_state_update_args_t, dst_state_batch_indices) + sizeof(selscan_tensor_t);
static_assert(offsetof(selscan_state_update_args_t, dst_state_batch_indices) == kArgsSizeV1,
              "a version's fields start where the previous version's struct ended");
static_assert(sizeof(selscan_state_update_args_t) == kArgsSizeV2,
              "no tail padding: a later version's field must not land in bytes an older caller never set");

// The CUDA kernel numbers a sequence's (channel, lane) pairs in 32 bits, with up to 32 lanes per channel.
constexpr int64_t kMaxChannels = (int64_t{1} << 31) / 32;

bool is_float(int32_t d) {
  return d == SELSCAN_DTYPE_FLOAT32 || d == SELSCAN_DTYPE_FLOAT16 || d == SELSCAN_DTYPE_BFLOAT16;
}

// An expected shape.
struct Shape {
  int64_t s[SELSCAN_MAX_NDIM];
  int n;
  bool operator==(const selscan_tensor_t& t) const {
    if (t.ndim != n) return false;
    for (int i = 0; i < n; ++i)
      if (t.sizes[i] != s[i]) return false;
    return true;
  }
};

bool sizes_positive(Checker& c, const selscan_tensor_t& t, const char* name) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.sizes[i] < 1) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("{}: every size must be >= 1 (zero-size calls are rejected), got {}", name, given_shape(t)));
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
  Checker c;
  selscan_state_update_args_t local;
  const selscan_state_update_args_t* a = read_struct(c, args, "selscan_state_update_args", kArgsSizeV1, &local);
  if (a == nullptr) return c.status;
  reserved_zero(c, a->flags, "flags");
  if (!c.ok()) return c.status;
  if (a->dt_softplus != 0 && a->dt_softplus != 1)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("dt_softplus: expected 0 or 1, got {}", a->dt_softplus));

  // state decides the form: (S, D, N) Mamba-1, (S, H, P, N) heads.
  const selscan_tensor_t& st = a->state;
  if (!c.presence(st, "state", true, true, "")) return c.status;
  if (st.ndim != 3 && st.ndim != 4)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("state: expected 3 dims (slots, dim, dstate: the Mamba-1 form) or 4 (slots, heads, "
                            "headdim, dstate: the heads form), got {}",
                            given_shape(st)));
  if (!sizes_positive(c, st, "state")) return c.status;
  const bool heads = st.ndim == 4;
  const int64_t S = st.sizes[0], H = st.sizes[1], P = heads ? st.sizes[2] : 1, N = st.sizes[st.ndim - 1];
  if (N > SELSCAN_MAX_DSTATE)
    return fail(SELSCAN_STATUS_UNSUPPORTED,
                fmt::format("state: dstate (the last dim) must be in [1, {}], got {}", SELSCAN_MAX_DSTATE, N));
  if (H > kMaxChannels / P)
    return fail(SELSCAN_STATUS_UNSUPPORTED,
                fmt::format("state: at most {} channels per slot (heads * headdim) are supported, got shape {}",
                            kMaxChannels, given_shape(st)));
  const int nch = heads ? 2 : 1;  // channel dims
  const char* form = heads ? "(batch, heads, headdim) or (batch, tokens, heads, headdim), like state's heads"
                           : "(batch, dim) or (batch, tokens, dim), like state's dim";

  // x decides the batch, the tokens and the itype.
  const selscan_tensor_t& x = a->x;
  if (!c.presence(x, "x", true, true, "")) return c.status;
  if (!is_float(x.dtype))
    return fail(SELSCAN_STATUS_DTYPE_MISMATCH,
                fmt::format("x: expected dtype float32, float16 or bfloat16, got {}", dtype_str(x.dtype)));
  const bool has_t = x.ndim == 2 + nch;
  bool x_ok = x.ndim == 1 + nch || has_t;
  for (int i = 0; x_ok && i < nch; ++i) x_ok = x.sizes[x.ndim - nch + i] == st.sizes[1 + i];
  if (!x_ok)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("x: expected shape {} {}, got {}", form, shape_str(st.sizes + 1, nch), given_shape(x)));
  if (!sizes_positive(c, x, "x")) return c.status;
  const int32_t it = x.dtype;
  const int64_t Bt = x.sizes[0], T = has_t ? x.sizes[1] : 1;
  Shape xs{{0, 0, 0, 0}, x.ndim};
  for (int i = 0; i < x.ndim; ++i) xs.s[i] = x.sizes[i];
  c.dtype(st, "state", SELSCAN_DTYPE_FLOAT32, "float32 or x's dtype", it);
  c.layout(x, "x", false, false);

  c.presence(a->dt, "dt", true, true, "");
  c.dtype(a->dt, "dt", SELSCAN_DTYPE_FLOAT32, "float32 or x's dtype", it);
  c.shape(a->dt, "dt", xs.s, xs.n, "like x");
  c.layout(a->dt, "dt", false, false);
  if (a->z.data != nullptr) {
    c.dtype(a->z, "z", SELSCAN_DTYPE_FLOAT32, "float32 or x's dtype", it);
    c.shape(a->z, "z", xs.s, xs.n, "like x");
    c.layout(a->z, "z", false, false);
  }

  Shape ws{{H, P, N, 0}, 1 + nch};  // A: (D, N) or (H, P, N)
  if (!heads) ws.s[1] = N;
  c.presence(a->A, "A", true, true, "");
  c.dtype(a->A, "A", SELSCAN_DTYPE_FLOAT32, "float32");
  c.shape(a->A, "A", ws.s, ws.n, heads ? "(heads, headdim, dstate)" : "(dim, dstate)");
  c.layout(a->A, "A", false, false);
  const Shape cs{{H, P, 0, 0}, nch};  // D, dt_bias: (D,) or (H, P)
  const selscan_tensor_t* vecs[2] = {&a->D, &a->dt_bias};
  const char* vec_names[2] = {"D", "dt_bias"};
  for (int k = 0; k < 2; ++k)
    if (vecs[k]->data != nullptr) {
      c.dtype(*vecs[k], vec_names[k], SELSCAN_DTYPE_FLOAT32, "float32");
      c.shape(*vecs[k], vec_names[k], cs.s, cs.n, heads ? "(heads, headdim)" : "(dim,)");
      c.layout(*vecs[k], vec_names[k], false, false);
    }
  if (!c.ok()) return c.status;

  // B, C: (Bt, [T,] [G,] N).
  const int base_nd = 2 + (has_t ? 1 : 0);
  int64_t groups[2] = {1, 1};
  const selscan_tensor_t* bc[2] = {&a->B, &a->C};
  const char* bc_names[2] = {"B", "C"};
  for (int k = 0; k < 2 && c.ok(); ++k) {
    const selscan_tensor_t& t = *bc[k];
    if (!c.presence(t, bc_names[k], true, true, "")) break;
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
                          has_t ? fmt::format("{}, ", T) : "", N, has_t ? "tokens, " : "", given_shape(t)));
      break;
    }
    c.dtype(t, bc_names[k], SELSCAN_DTYPE_FLOAT32, "float32 or x's dtype", it);
    c.layout(t, bc_names[k], false, false);
  }
  if (!c.ok()) return c.status;
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
    c.dtype(idx, "state_batch_indices", SELSCAN_DTYPE_INT32, "slot indices", SELSCAN_DTYPE_INT64);
    c.shape(idx, "state_batch_indices", {Bt}, "(batch,): one slot per sequence");
    c.layout(idx, "state_batch_indices", false, false);
  }
  const selscan_tensor_t& dst = a->dst_state_batch_indices;
  if (dst.data != nullptr) {
    if (idx.data == nullptr)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  "dst_state_batch_indices: given without state_batch_indices; the destination slots need the "
                  "source slots (pass state_batch_indices, e.g. equal to the destinations for the in-place update)");
    c.dtype(dst, "dst_state_batch_indices", SELSCAN_DTYPE_INT32, "slot indices", SELSCAN_DTYPE_INT64);
    c.shape(dst, "dst_state_batch_indices", {Bt}, "(batch,): one destination slot per sequence");
    c.layout(dst, "dst_state_batch_indices", false, false);
  }
  if (idx.data == nullptr && S != Bt) {
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("state: expected {} slots (one per sequence of x) without state_batch_indices, got {}",
                            Bt, given_shape(st)));
  }

  // outputs
  c.layout(st, "state", false, true);
  c.presence(a->out, "out", true, true, "");
  c.dtype(a->out, "out", it, "x's dtype");
  c.shape(a->out, "out", xs.s, xs.n, "like x");
  c.layout(a->out, "out", false, true);
  c.aliases("the state is the one argument updated in place, see docs/serving.md");
  if (!c.ok()) return c.status;
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
  p.dst = dst.data;
  p.sdst = p.dst != nullptr ? dst.strides[0] : 0;
  p.dst64 = dst.dtype == SELSCAN_DTYPE_INT64;
  *out = p;
  return SELSCAN_STATUS_SUCCESS;
}

Status check_host_dst(const StateUpdate& p) {
  if (p.dst == nullptr) return SELSCAN_STATUS_SUCCESS;
  // Only a sequence that reads a slot writes one: padding and an unusable source entry touch no slot.
  std::vector<std::pair<int64_t, int64_t>> writes, reads;  // (slot, sequence)
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t src = slot_entry(p.idx, p.idx64, p.sidx, b);
    if (src == p.pad_slot || src < 0 || src >= p.slots) continue;
    reads.emplace_back(src, b);
    const int64_t d = slot_entry(p.dst, p.dst64, p.sdst, b);
    if (d == p.pad_slot) continue;
    if (d < 0 || d >= p.slots)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("dst_state_batch_indices[{}]: expected a slot of state in [0, {}) or pad_slot_id ({}), "
                              "got {}",
                              b, p.slots, p.pad_slot, d));
    writes.emplace_back(d, b);
  }
  std::sort(writes.begin(), writes.end());
  for (size_t i = 1; i < writes.size(); ++i)
    if (writes[i].first == writes[i - 1].first)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("dst_state_batch_indices: sequences {} and {} both write slot {}; a slot takes one "
                              "sequence's state per call",
                              writes[i - 1].second, writes[i].second, writes[i].first));
  for (const auto& [slot, b] : reads) {
    const auto w = std::lower_bound(writes.begin(), writes.end(), std::make_pair(slot, int64_t{0}));
    if (w != writes.end() && w->first == slot && w->second != b)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("dst_state_batch_indices[{}] = {}: sequence {} writes the slot sequence {} reads "
                              "(state_batch_indices[{}] = {}); a slot another sequence writes cannot be read in the "
                              "same call",
                              w->second, slot, w->second, b, b, slot));
  }
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace selscan
