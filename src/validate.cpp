#include "validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checker.h"
#include "serving_index.h"

namespace selscan {
namespace {

// ------------------------------------------------------------------------------------------ struct versions
// sizeof of each argument struct in ABI 0.1.0, the first version: the smallest struct_size accepted. A caller
// built against 0.1 passes these sizes; the fields a later version appended are absent (zero) for it. Each
// constant is the end of the struct's last 0.1 field, pinned to its value on 64-bit targets, so a field
// inserted anywhere but at the end fails to compile here.
constexpr size_t kExecSizeV0_1 = offsetof(selscan_exec_t, reserved) + sizeof(int32_t);
constexpr size_t kFwdArgsSizeV0_1 = offsetof(selscan_fwd_args_t, last_state) + sizeof(selscan_tensor_t);
constexpr size_t kBwdArgsSizeV0_1 = offsetof(selscan_bwd_args_t, out_z) + sizeof(selscan_tensor_t);
static_assert(sizeof(void*) != 8 || (kExecSizeV0_1 == 48 && kFwdArgsSizeV0_1 == 1056 && kBwdArgsSizeV0_1 == 1776),
              "a 0.1 field moved: versions may only append fields at the end of a struct");
// Fields appended since 0.1 start exactly where the 0.1 struct ended, and no struct has tail padding (a later
// version's field would otherwise land in bytes an older caller's struct_size covers but never set). exec has
// not grown since 0.1; when it does, pin its first new field like the argument structs'.
static_assert(offsetof(selscan_bwd_args_t, flags) == kBwdArgsSizeV0_1, "bwd 0.2 fields follow the 0.1 struct");
constexpr size_t kBwdArgsSizeV0_2 = offsetof(selscan_bwd_args_t, reserved) + sizeof(int32_t);
static_assert(offsetof(selscan_fwd_args_t, cu_seqlens) == kFwdArgsSizeV0_1, "fwd 0.3 fields follow the 0.1 struct");
static_assert(offsetof(selscan_bwd_args_t, cu_seqlens) == kBwdArgsSizeV0_2, "bwd 0.3 fields follow the 0.2 struct");
constexpr size_t kFwdArgsSizeV0_3 = offsetof(selscan_fwd_args_t, pad_slot_id) + sizeof(int64_t);
static_assert(offsetof(selscan_fwd_args_t, state_block_size) == kFwdArgsSizeV0_3, "fwd 0.4 fields follow the 0.3 struct");
static_assert(sizeof(selscan_fwd_args_t) == offsetof(selscan_fwd_args_t, context_lens) + sizeof(selscan_tensor_t),
              "fwd args: no padding after the last field");
static_assert(sizeof(selscan_bwd_args_t) == offsetof(selscan_bwd_args_t, pad_slot_id) + sizeof(int64_t),
              "bwd args: no padding after the last field");
static_assert(sizeof(selscan_exec_t) == kExecSizeV0_1, "exec: unchanged since 0.1, no tail padding");

// Workspace pointers must be aligned to this: cudaMalloc and the frameworks' allocators give at least 256, and
// the promise leaves the kernels free to use any vector width on the workspace.
constexpr uintptr_t kWorkspaceAlignment = SELSCAN_WORKSPACE_ALIGNMENT;
static_assert((kWorkspaceAlignment & (kWorkspaceAlignment - 1)) == 0, "a power of two");

// Variable B/C given as (Bt, N, L) mean G = 1: present them to the kernels as (Bt, 1, N, L).
View bc_view(const selscan_tensor_t& t) {
  if (t.ndim == 3) return View{t.data, {t.strides[0], 0, t.strides[1], t.strides[2]}};
  return view_of(t);
}

// The inputs shared by forward and backward, checked in one place.
struct Inputs {
  const selscan_tensor_t *u, *delta, *A, *B, *C, *D, *z, *delta_bias, *h0;
  int32_t softplus;
  int64_t seqs;  // with cu_seqlens: the number of packed sequences (u's batch must be 1); else 0
};

void check_inputs(Checker& c, const Inputs& in, Problem& p) {
  const selscan_tensor_t& u = *in.u;
  if (!c.presence(u, "u", true, true, "")) return;
  if (u.dtype != SELSCAN_DTYPE_FLOAT32 && u.dtype != SELSCAN_DTYPE_FLOAT16 && u.dtype != SELSCAN_DTYPE_BFLOAT16) {
    c.failf(SELSCAN_STATUS_DTYPE_MISMATCH,
            fmt::format("u: expected dtype float32, float16 or bfloat16, got {}", dtype_str(u.dtype)));
    return;
  }
  if (u.ndim != 3) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("u: expected 3 dims (batch, dim, seqlen), got ndim={}{}", u.ndim,
                        u.ndim >= 0 && u.ndim <= SELSCAN_MAX_NDIM ? ", shape " + given_shape(u) : std::string()));
    return;
  }
  for (int i = 0; i < 3; ++i)
    if (u.sizes[i] < 1) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("u: every size must be >= 1 (zero-size problems are rejected), got {}", shape_str(u.sizes, 3)));
      return;
    }
  const int64_t Bt = u.sizes[0], D = u.sizes[1], L = u.sizes[2];
  if (in.seqs > 0 && Bt != 1) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("u: with cu_seqlens the sequences are packed along time, expected shape (1, dim, total_len), "
                        "got {}", shape_str(u.sizes, 3)));
    return;
  }
  const int64_t seqs = in.seqs > 0 ? in.seqs : Bt;  // rows of the (Bt, D, N) states
  const int32_t it = u.dtype;
  c.layout(u, "u", true, false);

  c.presence(*in.delta, "delta", true, true, "");
  c.dtype(*in.delta, "delta", it, "u's dtype");
  c.shape(*in.delta, "delta", {Bt, D, L}, "like u");
  c.layout(*in.delta, "delta", true, false);

  const selscan_tensor_t& A = *in.A;
  if (!c.presence(A, "A", true, true, "")) return;
  if (A.dtype != SELSCAN_DTYPE_FLOAT32 && A.dtype != SELSCAN_DTYPE_COMPLEX64) {
    c.failf(SELSCAN_STATUS_DTYPE_MISMATCH,
            fmt::format("A: expected dtype float32 or complex64, got {}", dtype_str(A.dtype)));
    return;
  }
  if (A.ndim != 2 || A.sizes[0] != D) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("A: expected shape ({}, dstate) (dim of u), got {}", D, given_shape(A)));
    return;
  }
  const int64_t N = A.sizes[1];
  if (N < 1 || N > kMaxDstate) {
    c.failf(N < 1 ? SELSCAN_STATUS_SHAPE_MISMATCH : SELSCAN_STATUS_UNSUPPORTED,
            fmt::format("A: dstate must be in [1, {}], got {}", kMaxDstate, N));
    return;
  }
  c.layout(A, "A", false, false);
  const int32_t wt = A.dtype;
  const bool cplx = wt == SELSCAN_DTYPE_COMPLEX64;
  const int64_t Lbc = cplx ? 2 * L : L;

  // B and C: constant (D, N) wtype, or variable (Bt, [G,] N, L or 2L) itype.
  int64_t groups[2] = {0, 0};
  bool var[2] = {false, false};
  const selscan_tensor_t* bc[2] = {in.B, in.C};
  const char* names[2] = {"B", "C"};
  for (int k = 0; k < 2 && c.ok(); ++k) {
    const selscan_tensor_t& t = *bc[k];
    const char* nm = names[k];
    if (!c.presence(t, nm, true, true, "")) return;
    var[k] = t.ndim >= 3;
    if (!var[k]) {
      c.dtype(t, nm, wt, "constant B/C have A's dtype");
      c.shape(t, nm, {D, N}, "(constant: dim, dstate)");
      c.layout(t, nm, false, false);
      continue;
    }
    c.dtype(t, nm, it, "variable B/C have u's dtype");
    if (!c.ok()) return;
    if (t.ndim == 3) {
      groups[k] = 1;
      c.shape(t, nm, {Bt, N, Lbc}, cplx ? "(variable: batch, dstate, 2*seqlen interleaved complex)"
                                        : "(variable: batch, dstate, seqlen)");
    } else {
      groups[k] = t.sizes[1];
      if (groups[k] < 1) {
        c.failf(SELSCAN_STATUS_SHAPE_MISMATCH, fmt::format("{}: groups (dim 1) must be >= 1, got {}", nm, groups[k]));
        return;
      }
      c.shape(t, nm, {Bt, groups[k], N, Lbc}, cplx ? "(variable: batch, groups, dstate, 2*seqlen interleaved complex)"
                                                   : "(variable: batch, groups, dstate, seqlen)");
    }
    c.layout(t, nm, true, false);
  }
  if (!c.ok()) return;
  int64_t G = var[0] ? groups[0] : (var[1] ? groups[1] : 1);
  if (var[0] && var[1] && groups[0] != groups[1]) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("C: expected the same number of groups as B ({}), got {}", groups[0], groups[1]));
    return;
  }
  if (D % G != 0) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("B/C: groups ({}) must divide dim ({}); channel d uses group d / (dim / groups)", G, D));
    return;
  }

  if (c.presence(*in.D, "D", false, true, "")) {
    c.dtype(*in.D, "D", SELSCAN_DTYPE_FLOAT32, "skip weights are float32");
    c.shape(*in.D, "D", {D}, "(dim,)");
    c.layout(*in.D, "D", false, false);
  }
  if (c.presence(*in.z, "z", false, true, "")) {
    c.dtype(*in.z, "z", it, "u's dtype");
    c.shape(*in.z, "z", {Bt, D, L}, "like u");
    c.layout(*in.z, "z", true, false);
  }
  if (c.presence(*in.delta_bias, "delta_bias", false, true, "")) {
    c.dtype(*in.delta_bias, "delta_bias", SELSCAN_DTYPE_FLOAT32, "float32");
    c.shape(*in.delta_bias, "delta_bias", {D}, "(dim,)");
    c.layout(*in.delta_bias, "delta_bias", false, false);
  }
  if (c.presence(*in.h0, "h0", false, true, "")) {
    c.dtype(*in.h0, "h0", wt, "A's dtype");
    c.shape(*in.h0, "h0", {seqs, D, N}, in.seqs > 0 ? "(sequences, dim, dstate)" : "(batch, dim, dstate)");
    c.layout(*in.h0, "h0", false, false);
  }
  if (in.softplus != 0 && in.softplus != 1)
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("delta_softplus: expected 0 or 1, got {}", in.softplus));
  if (!c.ok()) return;

  p.batch = seqs;
  p.dim = D;
  p.seqlen = L;
  p.dstate = N;
  p.groups = G;
  p.varlen = in.seqs > 0;
  // Packed sequences: chunk slots for every sequence's chunks (seq_chunk0 in problem.h).
  p.nchunks = p.varlen ? L / kChunk + seqs : (L + kChunk - 1) / kChunk;
  p.itype = static_cast<Dtype>(it);
  p.is_complex = cplx;
  p.var_B = var[0];
  p.var_C = var[1];
  p.softplus = in.softplus != 0;
  p.u = view_of(u);
  p.delta = view_of(*in.delta);
  p.A = view_of(A);
  p.B = var[0] ? bc_view(*in.B) : view_of(*in.B);
  p.C = var[1] ? bc_view(*in.C) : view_of(*in.C);
  p.D = view_of(*in.D);
  p.z = view_of(*in.z);
  p.delta_bias = view_of(*in.delta_bias);
  p.h0 = view_of(*in.h0);
  p.fold_B = !p.var_B && !p.h0.present();
}

// ------------------------------------------------------------------------------------------ serving
// The serving fields of either struct (docs/serving.md); the backward has no ssm_states and no block fields (NULL
// and 0 here).
struct ServingArgs {
  const selscan_tensor_t *cu_seqlens, *ssm_states, *cache_indices, *has_initial_state;
  int64_t pad_slot_id;
  int64_t block_size;
  const selscan_tensor_t *block_table, *context_lens;
};

// The block-wise caching fields (forward only), after the other serving tensors' presence: whether block mode is on.
bool check_blocks(Checker& c, const ServingArgs& a, bool pool, bool idx, int64_t Bt) {
  if (a.block_table == nullptr) return false;
  const bool table = c.presence(*a.block_table, "block_table", false, true, "");
  const bool ctx = c.presence(*a.context_lens, "context_lens", false, true, "");
  if (!c.ok()) return false;
  if (a.block_size < 0) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            fmt::format("state_block_size: expected >= 0 (0 = no block-wise state caching), got {}", a.block_size));
    return false;
  }
  if (a.block_size == 0) {
    if (table || ctx)
      c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
              fmt::format("{}: only read with state_block_size > 0 (block-wise state caching), got state_block_size 0",
                          table ? "block_table" : "context_lens"));
    return false;
  }
  if (!pool) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            fmt::format("ssm_states: required with state_block_size > 0 (got {}): the blocks' states are written "
                        "into its slots",
                        a.block_size));
    return false;
  }
  if (!table) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            fmt::format("block_table: required with state_block_size > 0 (got {}): entry [b][j] names the slot of "
                        "block j of sequence b, but its data pointer is NULL",
                        a.block_size));
    return false;
  }
  if (idx) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            "cache_indices: must be absent with block_table (block_table names every slot a sequence reads or "
            "writes); got both");
    return false;
  }
  const selscan_tensor_t& t = *a.block_table;
  c.dtype(t, "block_table", SELSCAN_DTYPE_INT32, "slot indices", SELSCAN_DTYPE_INT64);
  if (!c.ok()) return false;
  if (t.ndim != 2 || t.sizes[0] != Bt || t.sizes[1] < 1) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("block_table: expected shape ({}, blocks) (sequences, blocks >= 1), got {}", Bt,
                        given_shape(t)));
    return false;
  }
  c.layout(t, "block_table", false, false);
  if (ctx) check_entries(c, *a.context_lens, "context_lens", Bt, SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64);
  return c.ok();
}

// The other serving fields, after the inputs (p.batch is the number of sequences). `last_state` is the forward's
// (NULL for the backward).
void check_serving(Checker& c, const ServingArgs& a, const selscan_tensor_t& h0, const selscan_tensor_t* last_state,
                   Problem& p) {
  if (!c.ok()) return;
  const int64_t Bt = p.batch;
  const bool pool = a.ssm_states != nullptr && c.presence(*a.ssm_states, "ssm_states", false, true, "");
  const bool idx = c.presence(*a.cache_indices, "cache_indices", false, true, "");
  const bool init = c.presence(*a.has_initial_state, "has_initial_state", false, true, "");
  if (idx) check_entries(c, *a.cache_indices, "cache_indices", Bt, SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64);
  if (init)
    check_entries(c, *a.has_initial_state, "has_initial_state", Bt, SELSCAN_DTYPE_BOOL, SELSCAN_DTYPE_INT32);
  const bool blocks = check_blocks(c, a, pool, idx, Bt);
  if (!c.ok()) return;
  if (!idx && !blocks && a.pad_slot_id != 0) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            fmt::format("pad_slot_id: only read with cache_indices or block_table, got {} without them (leave it 0)",
                        a.pad_slot_id));
    return;
  }
  if (init && h0.data == nullptr && !pool) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
            fmt::format("has_initial_state: selects the rows of {} a sequence starts from, but {} absent",
                        a.ssm_states != nullptr ? "h0 or ssm_states" : "h0",
                        a.ssm_states != nullptr ? "both are" : "h0 is"));
    return;
  }
  if (pool) {
    const selscan_tensor_t& t = *a.ssm_states;
    if (h0.data != nullptr) {
      c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
              "h0: must be absent with ssm_states (the sequences start from their slots' states)");
      return;
    }
    if (last_state != nullptr && last_state->data != nullptr) {
      c.failf(SELSCAN_STATUS_INVALID_ARGUMENT,
              "last_state: must be absent with ssm_states (the final states are written into their slots)");
      return;
    }
    c.dtype(t, "ssm_states", p.is_complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32, "A's dtype");
    if (!c.ok()) return;
    if (t.ndim != 3 || t.sizes[0] < 1 || t.sizes[1] != p.dim || t.sizes[2] != p.dstate) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("ssm_states: expected shape (slots, {}, {}) (slots >= 1, dim, dstate), got {}", p.dim,
                          p.dstate, given_shape(t)));
      return;
    }
    if (!idx && !blocks && t.sizes[0] != Bt) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
              fmt::format("ssm_states: without cache_indices sequence b uses slot b, so the pool must have {} slots "
                          "(one per sequence), got shape {}",
                          Bt, given_shape(t)));
      return;
    }
    c.layout(t, "ssm_states", false, true);  // read and written in place: its bytes are an output's
    if (!c.ok()) return;
    p.ssm_states = view_of(t);
    p.slots = t.sizes[0];
  }
  p.serving = p.varlen || pool || idx || init;
  if (p.serving && p.is_complex) {
    c.failf(SELSCAN_STATUS_UNSUPPORTED,
            "A: complex weights with serving fields (cu_seqlens, ssm_states, cache_indices, has_initial_state) are not "
            "supported; serving calls take real (float32) weights");
    return;
  }
  if (p.varlen) {
    p.cu_seqlens = view_of(*a.cu_seqlens);
    p.cu_i64 = a.cu_seqlens->dtype == SELSCAN_DTYPE_INT64;
  }
  if (idx) {
    p.cache_indices = view_of(*a.cache_indices);
    p.idx_i64 = a.cache_indices->dtype == SELSCAN_DTYPE_INT64;
    p.pad_slot_id = a.pad_slot_id;
  }
  if (init) {
    p.has_init = view_of(*a.has_initial_state);
    p.init_i32 = a.has_initial_state->dtype == SELSCAN_DTYPE_INT32;
  }
  if (blocks) {
    p.block_size = a.block_size;
    p.pad_slot_id = a.pad_slot_id;
    p.block_table = view_of(*a.block_table);
    p.table_cols = a.block_table->sizes[1];
    p.table_i64 = a.block_table->dtype == SELSCAN_DTYPE_INT64;
    if (a.context_lens->data != nullptr) {
      p.context_lens = view_of(*a.context_lens);
      p.ctx_i64 = a.context_lens->dtype == SELSCAN_DTYPE_INT64;
    }
  }
  // x holds the true state in serving calls (the forward and its backward agree without knowing each other's
  // initial-state source).
  if (p.serving) p.fold_B = false;
}

// A (Bt, D, L) itype tensor (an input or an output).
void check_bdl(Checker& c, const selscan_tensor_t& t, const char* name, const Problem& p, bool output) {
  c.dtype(t, name, static_cast<int32_t>(p.itype), "u's dtype");
  c.shape(t, name, {p.rows(), p.dim, p.seqlen}, "like u");
  c.layout(t, name, true, output);
}

void check_bdn(Checker& c, const selscan_tensor_t& t, const char* name, const Problem& p, bool output) {
  c.dtype(t, name, p.is_complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32, "A's dtype");
  c.shape(t, name, {p.batch, p.dim, p.dstate}, "(batch, dim, dstate)");
  c.layout(t, name, false, output);
}

void check_x(Checker& c, const selscan_tensor_t& t, const Problem& p, bool output) {
  c.dtype(t, "x", p.is_complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32, "A's dtype");
  c.shape(t, "x", {p.rows(), p.dim, p.nchunks, 2 * p.dstate},
          p.varlen ? "(1, dim, total_len/2048 + sequences, 2*dstate) with cu_seqlens"
                   : "(batch, dim, ceil(seqlen/2048), 2*dstate)");
  c.layout(t, "x", true, output);
  if (!c.ok()) return;
  const int64_t want[4] = {p.dim * p.nchunks * 2 * p.dstate, p.nchunks * 2 * p.dstate, 2 * p.dstate, 1};
  for (int i = 0; i < 4; ++i)
    if (t.sizes[i] > 1 && t.strides[i] != want[i]) {
      c.failf(SELSCAN_STATUS_BAD_LAYOUT,
              fmt::format("x: must be contiguous, expected strides {}, got {}", shape_str(want, 4),
                          shape_str(t.strides, 4)));
      return;
    }
}

// A weight gradient with the same shape/dtype as its input (dA, dB, dC, dD, ddelta_bias).
void check_like(Checker& c, const selscan_tensor_t& g, const char* name, const selscan_tensor_t& like) {
  c.dtype(g, name, like.dtype, "the dtype of its input");
  if (!c.ok()) return;
  if (g.ndim != like.ndim) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH, fmt::format("{}: expected shape {} like its input, got {}", name,
                                                       shape_str(like.sizes, like.ndim), given_shape(g)));
    return;
  }
  for (int i = 0; i < like.ndim; ++i)
    if (g.sizes[i] != like.sizes[i]) {
      c.failf(SELSCAN_STATUS_SHAPE_MISMATCH, fmt::format("{}: expected shape {} like its input, got {}", name,
                                                         shape_str(like.sizes, like.ndim), given_shape(g)));
      return;
    }
  c.layout(g, name, like.ndim >= 3, true);
}

}  // namespace

Status make_fwd_problem(const selscan_fwd_args_t* args, Problem* out) {
  Checker c;
  selscan_fwd_args_t local;
  const selscan_fwd_args_t* a = read_struct(c, args, "selscan_fwd_args", kFwdArgsSizeV0_1, &local);
  if (a == nullptr) return c.status;
  if (out == nullptr) return fail(SELSCAN_STATUS_INTERNAL, "make_fwd_problem: out is NULL");
  Problem p{};
  const int64_t seqs = check_cu_seqlens(c, a->cu_seqlens);
  check_inputs(c, Inputs{&a->u, &a->delta, &a->A, &a->B, &a->C, &a->D, &a->z, &a->delta_bias, &a->h0,
                         a->delta_softplus, seqs},
               p);
  reserved_zero(c, a->flags, "flags");
  check_serving(c, ServingArgs{&a->cu_seqlens, &a->ssm_states, &a->cache_indices, &a->has_initial_state,
                               a->pad_slot_id, a->state_block_size, &a->block_table, &a->context_lens},
                a->h0, &a->last_state, p);
  if (!c.ok()) return c.status;
  const bool has_z = p.z.present();
  if (c.presence(a->out, "out", true, true, "")) check_bdl(c, a->out, "out", p, true);
  if (c.presence(a->out_z, "out_z", has_z, has_z, has_z ? " when z is given" : " when z is absent"))
    check_bdl(c, a->out_z, "out_z", p, true);
  if (c.presence(a->x, "x", false, true, "")) check_x(c, a->x, p, true);
  if (c.presence(a->last_state, "last_state", false, true, "")) check_bdn(c, a->last_state, "last_state", p, true);
  c.aliases();
  if (!c.ok()) return c.status;
  p.out = view_of(a->out);
  p.out_z = view_of(a->out_z);
  p.x = view_of(a->x);
  p.last_state = view_of(a->last_state);
  *out = p;
  return SELSCAN_STATUS_SUCCESS;
}

Status make_bwd_problem(const selscan_bwd_args_t* args, Problem* out) {
  Checker c;
  selscan_bwd_args_t local;
  const selscan_bwd_args_t* a = read_struct(c, args, "selscan_bwd_args", kBwdArgsSizeV0_1, &local);
  if (a == nullptr) return c.status;
  if (out == nullptr) return fail(SELSCAN_STATUS_INTERNAL, "make_bwd_problem: out is NULL");
  Problem p{};
  const int64_t seqs = check_cu_seqlens(c, a->cu_seqlens);
  check_inputs(c, Inputs{&a->u, &a->delta, &a->A, &a->B, &a->C, &a->D, &a->z, &a->delta_bias, &a->h0,
                         a->delta_softplus, seqs},
               p);
  check_serving(c, ServingArgs{&a->cu_seqlens, nullptr, &a->cache_indices, &a->has_initial_state, a->pad_slot_id, 0,
                               nullptr, nullptr},
                a->h0, nullptr, p);
  if (!c.ok()) return c.status;
  if (a->deterministic != 0 && a->deterministic != 1)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("deterministic: expected 0 or 1, got {}", a->deterministic));
  reserved_zero(c, a->flags, "flags");
  reserved_zero(c, a->reserved, "reserved");
  if (!c.ok()) return c.status;
  // Chunk seeds are needed when a sequence may span chunks.
  const bool has_z = p.z.present(), multi = p.varlen ? p.seqlen > kChunk : p.nchunks > 1;
  if (c.presence(a->dout, "dout", true, true, "")) check_bdl(c, a->dout, "dout", p, false);
  if (c.presence(a->x, "x", multi, true,
                 " when seqlen > 2048 (with cu_seqlens: the packed length; the forward's chunk states)"))
    check_x(c, a->x, p, false);
  if (c.presence(a->out, "out", has_z, true, " when z is given (the forward's pre-gate output)"))
    check_bdl(c, a->out, "out", p, false);
  if (c.presence(a->du, "du", true, true, "")) check_bdl(c, a->du, "du", p, true);
  if (c.presence(a->ddelta, "ddelta", true, true, "")) check_bdl(c, a->ddelta, "ddelta", p, true);
  if (c.presence(a->dA, "dA", true, true, "")) check_like(c, a->dA, "dA", a->A);
  if (c.presence(a->dB, "dB", true, true, "")) check_like(c, a->dB, "dB", a->B);
  if (c.presence(a->dC, "dC", true, true, "")) check_like(c, a->dC, "dC", a->C);
  const bool hD = p.D.present(), hb = p.delta_bias.present(), hh = p.h0.present();
  if (c.presence(a->dD, "dD", hD, hD, hD ? " when D is given" : " when D is absent")) check_like(c, a->dD, "dD", a->D);
  if (c.presence(a->dz, "dz", has_z, has_z, has_z ? " when z is given" : " when z is absent"))
    check_bdl(c, a->dz, "dz", p, true);
  if (c.presence(a->ddelta_bias, "ddelta_bias", hb, hb, hb ? " when delta_bias is given" : " when delta_bias is absent"))
    check_like(c, a->ddelta_bias, "ddelta_bias", a->delta_bias);
  if (c.presence(a->dh0, "dh0", false, hh, " when h0 is absent")) check_bdn(c, a->dh0, "dh0", p, true);
  if (c.presence(a->out_z, "out_z", false, has_z, " when z is absent")) check_bdl(c, a->out_z, "out_z", p, true);
  c.aliases();
  if (!c.ok()) return c.status;
  p.deterministic = a->deterministic != 0;
  p.dout = view_of(a->dout);
  p.x = view_of(a->x);
  p.out = view_of(a->out);
  p.du = view_of(a->du);
  p.ddelta = view_of(a->ddelta);
  p.dA = view_of(a->dA);
  p.dB = p.var_B ? bc_view(a->dB) : view_of(a->dB);
  p.dC = p.var_C ? bc_view(a->dC) : view_of(a->dC);
  p.dD = view_of(a->dD);
  p.dz = view_of(a->dz);
  p.ddelta_bias = view_of(a->ddelta_bias);
  p.dh0 = view_of(a->dh0);
  p.out_z = view_of(a->out_z);
  *out = p;
  return SELSCAN_STATUS_SUCCESS;
}

namespace {

// Block-wise state caching: every entry a sequence reads is a slot of the pool (or pad_slot_id where allowed), the
// table is wide enough, and no slot is written twice or written by one sequence while another starts from it.
Status check_host_blocks(const Problem& p) {
  const int64_t K = p.block_size;
  struct Use {
    int64_t slot, b, j;
    bool write;
  };
  std::vector<Use> uses;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = p.varlen ? index_entry(p.cu_seqlens, p.cu_i64, b + 1) - index_entry(p.cu_seqlens, p.cu_i64, b) : p.seqlen;
    const int64_t ctx = context_len(p, b);
    if (ctx < 0)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("context_lens[{}]: expected >= 0 (tokens before this call), got {}", b, ctx));
    if (ctx > INT64_MAX - len)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("context_lens[{}]: {} plus the sequence's length {} overflows int64", b, ctx, len));
    if (len == 0) continue;  // reads no entry, writes no slot
    const int64_t last = seq_block_last(ctx, len, K);
    if (last >= p.table_cols)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("block_table: sequence {} (context {}, {} tokens, block size {}) ends in block {}, but "
                              "block_table has {} blocks per sequence",
                              b, ctx, len, K, last, p.table_cols));
    // Entry j holds slot v, read or written as `role`; pad_slot_id is allowed there unless the block is read.
    auto slot_ok = [&](int64_t j, int64_t v, bool pad_ok, const char* role) -> Status {
      if (v >= 0 && v < p.slots) return SELSCAN_STATUS_SUCCESS;
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("block_table[{}][{}]: expected a slot of ssm_states in [0, {}){} ({}), got {}", b, j,
                              p.slots, pad_ok ? fmt::format(" or pad_slot_id ({})", p.pad_slot_id) : std::string(),
                              role, v));
    };
    const int64_t fin = table_entry(p, b, last);
    if (fin == p.pad_slot_id) continue;  // padding: nothing read or written
    if (ctx > 0 && has_initial_state(p, b)) {
      const int64_t j = (ctx - 1) / K, v = table_entry(p, b, j);
      if (v == p.pad_slot_id)
        return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                    fmt::format("block_table[{}][{}]: sequence {} resumes at position {} from this block's state, got "
                                "pad_slot_id ({})",
                                b, j, b, ctx, v));
      if (Status st = slot_ok(j, v, false, "the state a resumed sequence starts from"); st != SELSCAN_STATUS_SUCCESS) return st;
      uses.push_back({v, b, j, false});
    }
    for (int64_t j = seq_block_first(ctx, K); j <= last; ++j) {
      const int64_t v = table_entry(p, b, j);
      if (v == p.pad_slot_id && j < last) continue;  // a boundary state nobody keeps
      if (Status st = slot_ok(j, v, true, j < last ? "a block boundary's state" : "the final state"); st != SELSCAN_STATUS_SUCCESS)
        return st;
      uses.push_back({v, b, j, true});
    }
  }
  std::stable_sort(uses.begin(), uses.end(), [](const Use& x, const Use& y) {
    return x.slot != y.slot ? x.slot < y.slot : x.write < y.write;  // per slot: reads first, then writes
  });
  for (size_t i = 0; i < uses.size();) {
    size_t e = i;
    while (e < uses.size() && uses[e].slot == uses[i].slot) ++e;
    const Use* w = nullptr;
    for (size_t k = i; k < e; ++k) {
      const Use& u = uses[k];
      if (!u.write) continue;
      if (w != nullptr)
        return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                    fmt::format("block_table: slot {} is written twice, by sequence {} block {} and by sequence {} "
                                "block {}; a slot holds one block's state per call",
                                u.slot, w->b, w->j, u.b, u.j));
      w = &u;
    }
    if (w != nullptr)
      for (size_t k = i; k < e; ++k)
        if (!uses[k].write && uses[k].b != w->b)
          return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                      fmt::format("block_table: slot {} is read by sequence {} (block {}) and written by sequence {} "
                                  "(block {}) in the same call; the read would race with the write",
                                  uses[k].slot, uses[k].b, uses[k].j, w->b, w->j));
    i = e;
  }
  return SELSCAN_STATUS_SUCCESS;
}
}  // namespace

Status check_host_serving(const Problem& p) {
  if (p.varlen)
    if (Status s = check_host_offsets(p.cu_seqlens, p.cu_i64, p.batch, p.seqlen, "u's last dim");
        s != SELSCAN_STATUS_SUCCESS)
      return s;
  if (p.block_size > 0) return check_host_blocks(p);
  if (p.cache_indices.present() && p.ssm_states.present())
    return check_host_slots(p.cache_indices, p.idx_i64, p.batch, p.pad_slot_id, p.slots, "cache_indices",
                            "ssm_states");
  return SELSCAN_STATUS_SUCCESS;
}

Status check_exec(const selscan_exec_t* exec, selscan_exec_t* out) {
  Checker c;
  selscan_exec_t local;
  const selscan_exec_t* e = read_struct(c, exec, "selscan_exec", kExecSizeV0_1, &local);
  if (e == nullptr) return c.status;
  if (e->device_kind != SELSCAN_DEVICE_CPU && e->device_kind != SELSCAN_DEVICE_CUDA)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("exec.device_kind: expected SELSCAN_DEVICE_CPU (0) or SELSCAN_DEVICE_CUDA (1), got {}",
                            e->device_kind));
  if (e->device_kind == SELSCAN_DEVICE_CUDA && e->device_index < 0)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("exec.device_index: expected a CUDA device ordinal >= 0, got {}", e->device_index));
  if (e->num_threads < 0)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("exec.num_threads: expected >= 0 (0 = all hardware threads), got {}", e->num_threads));
  reserved_zero(c, e->reserved, "exec.reserved");
  if (!c.ok()) return c.status;
  if (e->workspace_bytes > 0 && reinterpret_cast<uintptr_t>(e->workspace) % kWorkspaceAlignment != 0)
    return fail(SELSCAN_STATUS_BAD_LAYOUT,
                fmt::format("exec.workspace: {} is not aligned to SELSCAN_WORKSPACE_ALIGNMENT ({} bytes)",
                            e->workspace, kWorkspaceAlignment));
  *out = *e;
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace selscan
