// The causal conv1d's argument checks (src/conv1d.h): the public structs -> one Conv1d / Conv1dUpdate. Every
// check and message of selscan_conv1d_fwd / _bwd / _update lives here, once, on the shared Checker (checker.h);
// the rules are the header's section 5c. On success nothing is allocated or formatted.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "checker.h"
#include "conv1d.h"
#include "serving_index.h"

namespace selscan {
namespace {

// ------------------------------------------------------------------------------------------ struct versions
// The structs' first version is 0.5, so the smallest struct_size accepted is the whole struct. Later versions
// append fields after the last one pinned here (no tail padding: a later field must not land in bytes an older
// caller's struct_size covers but never set).
constexpr size_t kFwdArgsSizeV0_5 = offsetof(selscan_conv1d_fwd_args_t, pad_slot_id) + sizeof(int64_t);
constexpr size_t kBwdArgsSizeV0_5 = offsetof(selscan_conv1d_bwd_args_t, reserved) + sizeof(int32_t);
constexpr size_t kUpdateArgsSizeV0_5 = offsetof(selscan_conv1d_update_args_t, out) + sizeof(selscan_tensor_t);
static_assert(sizeof(void*) != 8 || (kFwdArgsSizeV0_5 == 904 && kBwdArgsSizeV0_5 == 984 && kUpdateArgsSizeV0_5 == 584),
              "a 0.5 field moved: versions may only append fields at the end of a struct");
static_assert(sizeof(selscan_conv1d_fwd_args_t) == kFwdArgsSizeV0_5, "conv1d fwd args: no tail padding");
static_assert(sizeof(selscan_conv1d_bwd_args_t) == kBwdArgsSizeV0_5, "conv1d bwd args: no tail padding");
static_assert(sizeof(selscan_conv1d_update_args_t) == kUpdateArgsSizeV0_5, "conv1d update args: no tail padding");

constexpr int64_t kMinWidth = 2, kMaxWidth = 4;

bool is_float(int32_t d) {
  return d == SELSCAN_DTYPE_FLOAT32 || d == SELSCAN_DTYPE_FLOAT16 || d == SELSCAN_DTYPE_BFLOAT16;
}

void sizes_positive(Checker& c, const selscan_tensor_t& t, const char* name) {
  for (int i = 0; c.ok() && i < t.ndim; ++i)
    if (t.sizes[i] < 1)
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("{}: every size must be >= 1 (zero-size calls are rejected), got {}", name, given_shape(t)));
}

void flag01(Checker& c, int32_t v, const char* name, const char* meaning) {
  if (c.ok() && v != 0 && v != 1)
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("{}: expected 0 or 1 ({}), got {}", name, meaning, v));
}

// A tensor of the itype, of shape `want` (what: its meaning), any strides.
void check_itype(Checker& c, const selscan_tensor_t& t, const char* name, int32_t it,
                 std::initializer_list<int64_t> want, const char* what, bool output) {
  c.dtype(t, name, it, "x's dtype");
  c.shape(t, name, want, what);
  c.layout(t, name, false, output);
}

// The fast path the (b, d, t) tensors allow (conv1d.h, Layout).
Layout layout_of(std::initializer_list<const selscan_tensor_t*> ts) {
  bool first = true, last = true;
  for (const selscan_tensor_t* t : ts) {
    first = first && t->strides[2] == 1;
    last = last && t->strides[1] == 1;
  }
  return first ? Layout::channel_first : last ? Layout::channel_last : Layout::strided;
}

// The weight (D, W) of either struct: its width, or 0 after recording the failure.
int64_t check_weight(Checker& c, const selscan_tensor_t& w, int64_t D, int32_t it) {
  if (!c.presence(w, "weight", true, true, "")) return 0;
  if (w.ndim != 2 || w.sizes[0] != D) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("weight: expected shape ({}, width) (dim of x, width in [{}, {}]), got {}", D, kMinWidth,
                        kMaxWidth, given_shape(w)));
    return 0;
  }
  const int64_t W = w.sizes[1];
  if (W < 1) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("weight: width (dim 1) must be >= 1, got shape {}", given_shape(w)));
    return 0;
  }
  if (W < kMinWidth || W > kMaxWidth) {
    c.failf(SELSCAN_STATUS_UNSUPPORTED,
            fmt::format("weight: width (dim 1) must be {}, {} or {} (causal-conv1d's widths), got {} (shape {})",
                        kMinWidth, kMinWidth + 1, kMaxWidth, W, given_shape(w)));
    return 0;
  }
  c.dtype(w, "weight", SELSCAN_DTYPE_FLOAT32, "float32 or x's dtype", it);
  c.layout(w, "weight", false, false);
  return c.ok() ? W : 0;
}

// bias (D,) with weight's dtype.
void check_bias(Checker& c, const selscan_tensor_t& b, const selscan_tensor_t& w, int64_t D) {
  if (!c.presence(b, "bias", false, true, "")) return;
  c.dtype(b, "bias", w.dtype, "weight's dtype");
  c.shape(b, "bias", {D}, "(dim,)");
  c.layout(b, "bias", false, false);
}

// What the forward and the backward share: cu_seqlens, x, weight, bias, seq_idx, initial_states, activation.
struct ConvInputs {
  const selscan_tensor_t *cu_seqlens, *x, *weight, *bias, *seq_idx, *init;
  int32_t activation;
};

void check_conv_inputs(Checker& c, const ConvInputs& in, Conv1d& p) {
  const int64_t seqs = check_cu_seqlens(c, *in.cu_seqlens);  // 0 when absent
  if (!c.ok()) return;
  const selscan_tensor_t& x = *in.x;
  if (!c.presence(x, "x", true, true, "")) return;
  if (!is_float(x.dtype)) {
    c.failf(SELSCAN_STATUS_DTYPE_MISMATCH,
            fmt::format("x: expected dtype float32, float16 or bfloat16, got {}", dtype_str(x.dtype)));
    return;
  }
  if (x.ndim != 3) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("x: expected 3 dims (batch, dim, seqlen), got {}", given_shape(x)));
    return;
  }
  sizes_positive(c, x, "x");
  if (!c.ok()) return;
  const int64_t D = x.sizes[1], L = x.sizes[2];
  if (seqs > 0 && x.sizes[0] != 1) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("x: with cu_seqlens the sequences are packed along time, expected shape (1, dim, total_len), "
                        "got {}",
                        given_shape(x)));
    return;
  }
  const int64_t Bt = seqs > 0 ? seqs : x.sizes[0];
  const int32_t it = x.dtype;
  c.layout(x, "x", false, false);
  const int64_t W = check_weight(c, *in.weight, D, it);
  check_bias(c, *in.bias, *in.weight, D);
  if (!c.ok()) return;

  const bool sidx = c.presence(*in.seq_idx, "seq_idx", false, true, "");
  const bool init = c.presence(*in.init, "initial_states", false, true, "");
  if (sidx && seqs > 0) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            "seq_idx: must be absent with cu_seqlens (cu_seqlens packs sequences along time; seq_idx packs them "
            "inside a batch row: use one of them)");
    return;
  }
  if (sidx && init) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            "initial_states: must be absent with seq_idx (the sequences seq_idx packs into a row each start from "
            "zero)");
    return;
  }
  if (sidx) {
    c.dtype(*in.seq_idx, "seq_idx", SELSCAN_DTYPE_INT32, "sequence ids");
    c.shape(*in.seq_idx, "seq_idx", {Bt, L}, "(batch, seqlen)");
    c.layout(*in.seq_idx, "seq_idx", false, false);
  }
  if (init) check_itype(c, *in.init, "initial_states", it, {Bt, D, W - 1}, "(batch, dim, width - 1)", false);
  flag01(c, in.activation, "activation", "SELSCAN_ACTIVATION_NONE or SELSCAN_ACTIVATION_SILU");
  if (!c.ok()) return;

  p.batch = Bt;
  p.dim = D;
  p.seqlen = L;
  p.width = W;
  p.itype = static_cast<Dtype>(it);
  p.wtype = static_cast<Dtype>(in.weight->dtype);
  p.dwtype = p.wtype;
  p.silu = in.activation == SELSCAN_ACTIVATION_SILU;
  p.x = view_of(x);
  p.weight = view_of(*in.weight);
  p.bias = view_of(*in.bias);
  p.seq_idx = view_of(*in.seq_idx);
  p.init = view_of(*in.init);
  p.varlen = seqs > 0;
  if (p.varlen) {
    p.cu_seqlens = view_of(*in.cu_seqlens);
    p.cu_i64 = in.cu_seqlens->dtype == SELSCAN_DTYPE_INT64;
  }
}

// A (rows, D, L) tensor like x.
void check_like_x(Checker& c, const selscan_tensor_t& t, const char* name, const Conv1d& p, bool output) {
  if (c.presence(t, name, true, true, ""))
    check_itype(c, t, name, static_cast<int32_t>(p.itype), {p.rows(), p.dim, p.seqlen}, "like x", output);
}

// A (Bt, D, W-1) state tensor (final_states, dfinal_states, dinitial_states), when present.
void check_states(Checker& c, const selscan_tensor_t& t, const char* name, const Conv1d& p, bool output) {
  check_itype(c, t, name, static_cast<int32_t>(p.itype), {p.batch, p.dim, p.width - 1},
              p.varlen ? "(sequences, dim, width - 1)" : "(batch, dim, width - 1)", output);
}

// The forward's serving fields after the inputs: the state pool, its indices, has_initial_state.
void check_pool(Checker& c, const selscan_conv1d_fwd_args_t& a, Conv1d& p) {
  const bool pool = c.presence(a.conv_states, "conv_states", false, true, "");
  const bool idx = c.presence(a.cache_indices, "cache_indices", false, true, "");
  const bool init = c.presence(a.has_initial_state, "has_initial_state", false, true, "");
  if (idx) check_entries(c, a.cache_indices, "cache_indices", p.batch, SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64);
  if (init)
    check_entries(c, a.has_initial_state, "has_initial_state", p.batch, SELSCAN_DTYPE_BOOL, SELSCAN_DTYPE_INT32);
  if (!c.ok()) return;
  if (init && !pool && !p.init.present()) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            "has_initial_state: selects the sequences that start from their initial_states row or conv_states slot, "
            "but both are absent");
    return;
  }
  if (pool) {
    const selscan_tensor_t& t = a.conv_states;
    if (p.init.present()) {
      c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
              "initial_states: must be absent with conv_states (the sequences start from their slots)");
      return;
    }
    if (a.final_states.data != nullptr) {
      c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
              "final_states: must be absent with conv_states (the sequences' last inputs are written into their "
              "slots)");
      return;
    }
    c.dtype(t, "conv_states", static_cast<int32_t>(p.itype), "x's dtype");
    if (!c.ok()) return;
    if (t.ndim != 3 || t.sizes[0] < 1 || t.sizes[1] != p.dim || t.sizes[2] < p.width - 1) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("conv_states: expected shape (slots, {}, state_len) with slots >= 1 and state_len >= width "
                          "- 1 = {}, got {}",
                          p.dim, p.width - 1, given_shape(t)));
      return;
    }
    if (!idx && t.sizes[0] != p.batch) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("conv_states: without cache_indices sequence b uses slot b, so the pool must have {} slots "
                          "(one per sequence), got shape {}",
                          p.batch, given_shape(t)));
      return;
    }
    c.layout(t, "conv_states", false, true);  // read and written in place: its bytes are an output's
    if (!c.ok()) return;
    p.conv_states = view_of(t);
    p.slots = t.sizes[0];
    p.state_len = t.sizes[2];
  }
  if (idx) {
    p.cache_indices = view_of(a.cache_indices);
    p.idx_i64 = a.cache_indices.dtype == SELSCAN_DTYPE_INT64;
    p.pad_slot_id = a.pad_slot_id;
  }
  if (init) {
    p.has_init = view_of(a.has_initial_state);
    p.init_i32 = a.has_initial_state.dtype == SELSCAN_DTYPE_INT32;
  }
}

}  // namespace

Status make_conv1d_fwd(const selscan_conv1d_fwd_args_t* args, Conv1d* out) {
  Checker c;
  selscan_conv1d_fwd_args_t local;
  const selscan_conv1d_fwd_args_t* a = read_struct(c, args, "selscan_conv1d_fwd_args", kFwdArgsSizeV0_5, &local);
  if (a == nullptr) return c.status;
  if (out == nullptr) return fail(SELSCAN_STATUS_INTERNAL, "make_conv1d_fwd: out is NULL");
  Conv1d p{};
  check_conv_inputs(c, ConvInputs{&a->cu_seqlens, &a->x, &a->weight, &a->bias, &a->seq_idx, &a->initial_states,
                                  a->activation},
                    p);
  reserved_zero(c, a->flags, "flags");
  if (c.ok()) check_pool(c, *a, p);
  check_like_x(c, a->out, "out", p, true);
  if (c.presence(a->final_states, "final_states", false, !p.seq_idx.present(),
                 " with seq_idx (a row of several sequences has no one final state)"))
    check_states(c, a->final_states, "final_states", p, true);
  c.aliases("conv_states is the one argument updated in place, see docs/abi.md");
  if (!c.ok()) return c.status;
  p.out = view_of(a->out);
  p.fin = view_of(a->final_states);
  p.layout = layout_of({&a->x, &a->out});
  *out = p;
  return SELSCAN_STATUS_SUCCESS;
}

Status make_conv1d_bwd(const selscan_conv1d_bwd_args_t* args, Conv1d* out) {
  Checker c;
  selscan_conv1d_bwd_args_t local;
  const selscan_conv1d_bwd_args_t* a = read_struct(c, args, "selscan_conv1d_bwd_args", kBwdArgsSizeV0_5, &local);
  if (a == nullptr) return c.status;
  if (out == nullptr) return fail(SELSCAN_STATUS_INTERNAL, "make_conv1d_bwd: out is NULL");
  Conv1d p{};
  check_conv_inputs(c, ConvInputs{&a->cu_seqlens, &a->x, &a->weight, &a->bias, &a->seq_idx, &a->initial_states,
                                  a->activation},
                    p);
  flag01(c, a->deterministic, "deterministic", "1: bitwise-reproducible dweight and dbias");
  reserved_zero(c, a->flags, "flags");
  reserved_zero(c, a->reserved, "reserved");
  if (!c.ok()) return c.status;
  check_like_x(c, a->dout, "dout", p, false);
  if (c.presence(a->dfinal_states, "dfinal_states", false, !p.seq_idx.present(),
                 " with seq_idx (the forward has no final_states then)"))
    check_states(c, a->dfinal_states, "dfinal_states", p, false);
  check_like_x(c, a->dx, "dx", p, true);
  if (c.presence(a->dweight, "dweight", true, true, "")) {
    c.dtype(a->dweight, "dweight", SELSCAN_DTYPE_FLOAT32, "float32 or weight's dtype", a->weight.dtype);
    c.shape(a->dweight, "dweight", {p.dim, p.width}, "like weight (dim, width)");
    c.layout(a->dweight, "dweight", false, true);
  }
  const bool hb = p.bias.present();
  if (c.presence(a->dbias, "dbias", hb, hb, hb ? " when bias is given" : " when bias is absent")) {
    c.dtype(a->dbias, "dbias", a->dweight.dtype, "dweight's dtype");
    c.shape(a->dbias, "dbias", {p.dim}, "(dim,)");
    c.layout(a->dbias, "dbias", false, true);
  }
  if (c.presence(a->dinitial_states, "dinitial_states", false, p.init.present(), " when initial_states is absent"))
    check_states(c, a->dinitial_states, "dinitial_states", p, true);
  c.aliases();
  if (!c.ok()) return c.status;
  p.deterministic = a->deterministic != 0;
  p.dwtype = static_cast<Dtype>(a->dweight.dtype);
  p.dout = view_of(a->dout);
  p.dfin = view_of(a->dfinal_states);
  p.dx = view_of(a->dx);
  p.dweight = view_of(a->dweight);
  p.dbias = view_of(a->dbias);
  p.dinit = view_of(a->dinitial_states);
  p.layout = layout_of({&a->x, &a->dout, &a->dx});
  *out = p;
  return SELSCAN_STATUS_SUCCESS;
}

Status make_conv1d_update(const selscan_conv1d_update_args_t* args, Conv1dUpdate* out) {
  Checker c;
  selscan_conv1d_update_args_t local;
  const selscan_conv1d_update_args_t* a =
      read_struct(c, args, "selscan_conv1d_update_args", kUpdateArgsSizeV0_5, &local);
  if (a == nullptr) return c.status;
  if (out == nullptr) return fail(SELSCAN_STATUS_INTERNAL, "make_conv1d_update: out is NULL");
  reserved_zero(c, a->flags, "flags");
  flag01(c, a->activation, "activation", "SELSCAN_ACTIVATION_NONE or SELSCAN_ACTIVATION_SILU");
  if (!c.ok()) return c.status;

  const selscan_tensor_t& x = a->x;
  if (!c.presence(x, "x", true, true, "")) return c.status;
  if (!is_float(x.dtype))
    return fail(SELSCAN_STATUS_DTYPE_MISMATCH,
                fmt::format("x: expected dtype float32, float16 or bfloat16, got {}", dtype_str(x.dtype)));
  if (x.ndim != 2 && x.ndim != 3)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("x: expected shape (batch, dim) or (batch, dim, tokens), got {}", given_shape(x)));
  sizes_positive(c, x, "x");
  if (!c.ok()) return c.status;
  const bool tdim = x.ndim == 3;
  const int64_t Bt = x.sizes[0], D = x.sizes[1], T = tdim ? x.sizes[2] : 1;
  const int32_t it = x.dtype;
  c.layout(x, "x", false, false);
  const int64_t W = check_weight(c, a->weight, D, it);
  check_bias(c, a->bias, a->weight, D);
  if (!c.ok()) return c.status;

  const selscan_tensor_t& st = a->conv_state;
  if (!c.presence(st, "conv_state", true, true, "")) return c.status;
  c.dtype(st, "conv_state", SELSCAN_DTYPE_FLOAT32, "float32 or x's dtype", it);
  if (!c.ok()) return c.status;
  if (st.ndim != 3 || st.sizes[0] < 1 || st.sizes[1] != D || st.sizes[2] < W - 1)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("conv_state: expected shape (slots, {}, state_len) with slots >= 1 and state_len >= width "
                            "- 1 = {}, got {}",
                            D, W - 1, given_shape(st)));
  const bool circ = c.presence(a->cache_seqlens, "cache_seqlens", false, true, "");
  const bool idx = c.presence(a->conv_state_indices, "conv_state_indices", false, true, "");
  if (circ) check_entries(c, a->cache_seqlens, "cache_seqlens", Bt, SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64);
  if (idx)
    check_entries(c, a->conv_state_indices, "conv_state_indices", Bt, SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64);
  if (!c.ok()) return c.status;
  if (!idx && st.sizes[0] != Bt)
    return fail(SELSCAN_STATUS_SHAPE_MISMATCH,
                fmt::format("conv_state: without conv_state_indices sequence b uses slot b, so it must have {} slots "
                            "(one per sequence of x), got shape {}",
                            Bt, given_shape(st)));
  c.layout(st, "conv_state", false, true);  // updated in place: its bytes are an output's
  if (c.presence(a->out, "out", true, true, "")) {
    c.dtype(a->out, "out", it, "x's dtype");
    c.shape(a->out, "out", x.sizes, x.ndim, "like x");
    c.layout(a->out, "out", false, true);
  }
  c.aliases("conv_state is the one argument updated in place, see docs/abi.md");
  if (!c.ok()) return c.status;

  Conv1dUpdate p{};
  p.batch = Bt;
  p.dim = D;
  p.tokens = T;
  p.width = W;
  p.state_len = st.sizes[2];
  p.slots = st.sizes[0];
  p.itype = static_cast<Dtype>(it);
  p.wtype = static_cast<Dtype>(a->weight.dtype);
  p.state_t = static_cast<Dtype>(st.dtype);
  p.silu = a->activation == SELSCAN_ACTIVATION_SILU;
  p.seqlens_i64 = circ && a->cache_seqlens.dtype == SELSCAN_DTYPE_INT64;
  p.idx_i64 = idx && a->conv_state_indices.dtype == SELSCAN_DTYPE_INT64;
  p.pad_slot_id = a->pad_slot_id;
  p.x = view_of(x);  // a 2-D x leaves s[2] = 0: its one token
  p.weight = view_of(a->weight);
  p.bias = view_of(a->bias);
  p.out = view_of(a->out);
  p.conv_state = view_of(st);
  p.cache_seqlens = view_of(a->cache_seqlens);
  p.indices = view_of(a->conv_state_indices);
  *out = p;
  return SELSCAN_STATUS_SUCCESS;
}

Status check_host_conv1d(const Conv1d& p) {
  if (p.varlen)
    if (Status s = check_host_offsets(p.cu_seqlens, p.cu_i64, p.batch, p.seqlen, "x's last dim");
        s != SELSCAN_STATUS_SUCCESS)
      return s;
  if (p.cache_indices.present() && p.conv_states.present())
    return check_host_slots(p.cache_indices, p.idx_i64, p.batch, p.pad_slot_id, p.slots, "cache_indices",
                            "conv_states");
  return SELSCAN_STATUS_SUCCESS;
}

Status check_host_conv1d_update(const Conv1dUpdate& p) {
  if (p.cache_seqlens.present())
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t v = index_entry(p.cache_seqlens, p.seqlens_i64, b);
      if (v < 0)
        return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                    fmt::format("cache_seqlens[{}]: expected >= 0 (tokens already in the circular buffer), got {}", b,
                                v));
    }
  if (p.indices.present())
    return check_host_slots(p.indices, p.idx_i64, p.batch, p.pad_slot_id, p.slots, "conv_state_indices",
                            "conv_state");
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace selscan
