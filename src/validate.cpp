#include "validate.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "checker.h"

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
// version's field would otherwise land in bytes an older caller's struct_size covers but never set). exec and
// the forward's args have not grown since 0.1; when one does, pin its first new field like the backward's.
static_assert(offsetof(selscan_bwd_args_t, flags) == kBwdArgsSizeV0_1, "bwd 0.2 fields follow the 0.1 struct");
static_assert(sizeof(selscan_bwd_args_t) == offsetof(selscan_bwd_args_t, reserved) + sizeof(int32_t),
              "bwd args: no padding after the last field");
static_assert(sizeof(selscan_exec_t) == kExecSizeV0_1, "exec: unchanged since 0.1, no tail padding");
static_assert(sizeof(selscan_fwd_args_t) == kFwdArgsSizeV0_1, "fwd args: unchanged since 0.1, no tail padding");

// Workspace pointers must be aligned to this: cudaMalloc and the frameworks' allocators give at least 256, and
// the promise leaves the kernels free to use any vector width on the workspace.
constexpr uintptr_t kWorkspaceAlignment = SELSCAN_WORKSPACE_ALIGNMENT;
static_assert((kWorkspaceAlignment & (kWorkspaceAlignment - 1)) == 0, "a power of two");

View view_of(const selscan_tensor_t& t) {
  View v{t.data, {0, 0, 0, 0}};
  for (int i = 0; i < t.ndim && i < 4; ++i) v.s[i] = t.strides[i];
  return v;
}

// Variable B/C given as (Bt, N, L) mean G = 1: present them to the kernels as (Bt, 1, N, L).
View bc_view(const selscan_tensor_t& t) {
  if (t.ndim == 3) return View{t.data, {t.strides[0], 0, t.strides[1], t.strides[2]}};
  return view_of(t);
}

// The inputs shared by forward and backward, checked in one place.
struct Inputs {
  const selscan_tensor_t *u, *delta, *A, *B, *C, *D, *z, *delta_bias, *h0;
  int32_t softplus;
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
    c.shape(*in.h0, "h0", {Bt, D, N}, "(batch, dim, dstate)");
    c.layout(*in.h0, "h0", false, false);
  }
  if (in.softplus != 0 && in.softplus != 1)
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("delta_softplus: expected 0 or 1, got {}", in.softplus));
  if (!c.ok()) return;

  p.batch = Bt;
  p.dim = D;
  p.seqlen = L;
  p.dstate = N;
  p.groups = G;
  p.nchunks = (L + kChunk - 1) / kChunk;
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

// A (Bt, D, L) itype tensor (an input or an output).
void check_bdl(Checker& c, const selscan_tensor_t& t, const char* name, const Problem& p, bool output) {
  c.dtype(t, name, static_cast<int32_t>(p.itype), "u's dtype");
  c.shape(t, name, {p.batch, p.dim, p.seqlen}, "like u");
  c.layout(t, name, true, output);
}

void check_bdn(Checker& c, const selscan_tensor_t& t, const char* name, const Problem& p, bool output) {
  c.dtype(t, name, p.is_complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32, "A's dtype");
  c.shape(t, name, {p.batch, p.dim, p.dstate}, "(batch, dim, dstate)");
  c.layout(t, name, false, output);
}

void check_x(Checker& c, const selscan_tensor_t& t, const Problem& p, bool output) {
  c.dtype(t, "x", p.is_complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32, "A's dtype");
  c.shape(t, "x", {p.batch, p.dim, p.nchunks, 2 * p.dstate}, "(batch, dim, ceil(seqlen/2048), 2*dstate)");
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
  check_inputs(c, Inputs{&a->u, &a->delta, &a->A, &a->B, &a->C, &a->D, &a->z, &a->delta_bias, &a->h0,
                         a->delta_softplus},
               p);
  reserved_zero(c, a->flags, "flags");
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
  check_inputs(c, Inputs{&a->u, &a->delta, &a->A, &a->B, &a->C, &a->D, &a->z, &a->delta_bias, &a->h0,
                         a->delta_softplus},
               p);
  if (!c.ok()) return c.status;
  if (a->deterministic != 0 && a->deterministic != 1)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("deterministic: expected 0 or 1, got {}", a->deterministic));
  reserved_zero(c, a->flags, "flags");
  reserved_zero(c, a->reserved, "reserved");
  if (!c.ok()) return c.status;
  const bool has_z = p.z.present(), multi = p.nchunks > 1;
  if (c.presence(a->dout, "dout", true, true, "")) check_bdl(c, a->dout, "dout", p, false);
  if (c.presence(a->x, "x", multi, true, " when seqlen > 2048 (the forward's chunk states)"))
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
