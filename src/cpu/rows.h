// Gathering the per-row inputs of the kernels from a Problem: per-channel constants, δ rows, and variable B/C
// transposed to [t][state] (shared by the forward and the backward).
#pragma once

#include <vector>

#include "common.h"
#include "complex_kernels.h"
#include "kernels.h"

namespace selscan::cpu {

inline int64_t bdl_offset(const View& v, int64_t b, int64_t d) { return b * v.s[0] + d * v.s[1]; }

inline float log2e_scaled(float a) { return a * 1.4426950408889634f; }
inline cfloat log2e_scaled(cfloat a) { return {a.re * 1.4426950408889634f, a.im}; }

// Per-channel state constants (see FwdBlockT); padded states get A2 = A = 0 and zero B/C factors.
template <class W>
struct ChannelConsts {
  std::vector<W> A2, A, Bc, Cc, Cs;

  void resize(int64_t Np) {
    for (auto* v : {&A2, &A, &Bc, &Cc, &Cs}) v->assign(static_cast<size_t>(Np), W{});
  }
  void fill(const Problem& p, int64_t d) {
    const W one = wone<W>();
    for (int64_t n = 0; n < p.dstate; ++n) {
      const W a = wload<W>(p.A, d * p.A.s[0] + n * p.A.s[1]);
      const W b = p.var_B ? one : wload<W>(p.B, d * p.B.s[0] + n * p.B.s[1]);
      const W c = p.var_C ? one : wload<W>(p.C, d * p.C.s[0] + n * p.C.s[1]);
      A[n] = a;
      A2[n] = log2e_scaled(a);
      Bc[n] = p.fold_B ? one : b;
      Cc[n] = p.fold_B ? b * c : c;
      Cs[n] = p.fold_B ? b : one;
    }
  }
};

// δ for t in [t0, t0+T): delta + bias, then softplus. `pre` (optional) receives the value before softplus.
inline void load_delta(const Problem& p, int64_t b, int64_t d, int64_t t0, int64_t T, float* delta,
                       float* pre = nullptr) {
  load_row(p.itype, p.delta.p, bdl_offset(p.delta, b, d) + t0, T, delta);
  const float bias = p.delta_bias.present() ? fload(p.delta_bias, d * p.delta_bias.s[0]) : 0.f;
  for (int64_t t = 0; t < T; ++t) delta[t] += bias;
  if (pre != nullptr) std::memcpy(pre, delta, static_cast<size_t>(T) * sizeof(float));
  if (p.softplus) kernels().softplus(delta, T);
}

// A row of an itype input: fp32 rows are used in place, 16-bit rows are converted into `scratch`.
inline const float* input_row(Dtype it, const void* base, int64_t off, int64_t n, float* scratch) {
  if (it == Dtype::f32) return static_cast<const float*>(base) + off;
  load_row(it, base, off, n, scratch);
  return scratch;
}

// Variable B or C of (batch b, group g) for t in [t0, t0+T) into dst[t][n] (n < Np; padding 0). `tmp` holds
// at least 2T floats.
inline void load_bc_block(const Problem& p, const View& v, int64_t b, int64_t g, int64_t t0, int64_t T,
                          int64_t Np, float* tmp, float* dst) {
  for (int64_t n = 0; n < p.dstate; ++n) {
    load_row(p.itype, v.p, b * v.s[0] + g * v.s[1] + n * v.s[2] + t0, T, tmp);
    for (int64_t t = 0; t < T; ++t) dst[t * Np + n] = tmp[t];
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = p.dstate; n < Np; ++n) dst[t * Np + n] = 0.f;
}
inline void load_bc_block(const Problem& p, const View& v, int64_t b, int64_t g, int64_t t0, int64_t T,
                          int64_t Np, float* tmp, cfloat* dst) {
  for (int64_t n = 0; n < p.dstate; ++n) {
    load_row(p.itype, v.p, b * v.s[0] + g * v.s[1] + n * v.s[2] + 2 * t0, 2 * T, tmp);
    for (int64_t t = 0; t < T; ++t) dst[t * Np + n] = cfloat{tmp[2 * t], tmp[2 * t + 1]};
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = p.dstate; n < Np; ++n) dst[t * Np + n] = cfloat{0.f, 0.f};
}

inline void run_fwd_kernel(const FwdBlockT<float>& k, bool vb, bool vc, bool wp) { kernels().fwd[vb][vc][wp](k); }
inline void run_fwd_kernel(const FwdBlockT<cfloat>& k, bool vb, bool vc, bool wp) { cfwd_block(k, vb, vc, wp); }
inline void run_bwd_kernel(const BwdChunkT<float>& k, bool vb, bool vc, bool fold) {
  kernels().bwd[vb][vc][fold](k);
}
inline void run_bwd_kernel(const BwdChunkT<cfloat>& k, bool vb, bool vc, bool fold) {
  cbwd_chunk(k, vb, vc, fold);
}

}  // namespace selscan::cpu
