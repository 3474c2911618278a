// The inner loops of the CPU path for real weights, on plain float arrays (no Problem, no strides, no dtypes).
// They exist twice: a portable build (kernels_generic.cpp) and an AVX2+FMA build (kernels_avx2.cpp) picked at
// run time. States are padded to Np (a multiple of 8) so the loops over states run on whole vectors; padded
// states have A2 = 0 and zero B and coefficient, and are masked out of the sums over states (so a non-finite
// input cannot reach the outputs through them).
#pragma once

#include <cstdint>

namespace selscan::cpu {

// One row (b, d) over T consecutive timesteps. Per-state arrays have Np entries; per-time-and-state arrays
// are [T][Np] (state fastest).
// W is the weight type: float here; the complex path (complex_kernels.cpp) uses the same shapes with cfloat.
template <class W>
struct FwdBlockT {
  int64_t T, Np;
  const float* delta;  // [T] δ after bias and softplus
  const float* du;     // [T] δ*u
  const W* A2;         // [Np] A * log2(e) (complex: only the real part scaled)
  const W* Bc;         // [Np] constant B factor inside b̄ (1 when folded)          (B constant)
  const W* Bt;         // [T][Np] B_t                                                 (B variable)
  const W* Cc;         // [Np] constant output coefficient (B*C when folded, else C)  (C constant)
  const W* Ct;         // [T][Np] C_t                                                 (C variable)
  const W* Cs;         // [Np] factor applied to C_t (B when folded, else 1)          (C variable)
  W* h;                // [Np] scanned state, in/out
  W* P;                // [Np] running product of ā, in/out (only when `with_P`)
  float* y;            // [T] in: D*u, out: + Σ_n s_t*coef_t (complex: 2 Re)
  int64_t N = 0;       // valid states (<= Np): padded lanes are masked out of every sum over states, since
                       // an infinite δ or u turns even their zero factors into NaN (0 * inf)
};
using FwdBlock = FwdBlockT<float>;

// Backward over one chunk of one row, in reverse time, given the state before the chunk (seed) and the
// gradient flowing in from the next chunk (carry = ā_{T} dh_{T}, 0 after the last position).
// Complex: dh_t = 2 dy conj(coef) + conj(ā_{t+1}) dh_{t+1}, and every product below takes the conjugates of
// upstream's convention (gsum = Σ Re(dh conj B̃), dsum = Σ Re(dh conj(A ā s)), S1 = Σ 2 dy conj(s), ...).
template <class W>
struct BwdChunkT {
  int64_t T, Np;
  const float *delta, *du, *dy;     // [T]; dy = gated dout
  const W *A2, *A;                  // [Np]; A unscaled (for dδ)
  const W *Bc, *Bt, *Cc, *Ct, *Cs;  // as in FwdBlockT
  const W* seed;                    // [Np] state before the chunk
  W* hs;                            // scratch [T+1][Np]: row 0 = seed, row t+1 = s_t
  W* as;                            // scratch [T][Np]: ā_t
  W* carry;                         // [Np] in: from the next chunk; out: ā_0 dh_0 of this chunk
  float* gsum;                      // [T] out: Σ_n dh_t * B̃_t          (du = D*dy + δ*gsum)
  float* dsum;                      // [T] out: Σ_n dh_t * A * ā_t s_{t-1} (ddelta = u*gsum + dsum)
  W* dA;                            // [Np] += δ dh ā s_{t-1}
  W* dBt;                           // [T][Np] out: dh * du              (B variable)
  W* dCt;                           // [T][Np] out: dy * s * Cs          (C variable)
  W* S1;                            // [Np] += dy * s                    (C constant)
  W* S2;                            // [Np] += dy * s * C_t              (B folded, C variable)
  W* S3;                            // [Np] += dh * du                   (B constant, not folded)
  int64_t N = 0;                    // valid states (<= Np), as in FwdBlockT
};
using BwdChunk = BwdChunkT<float>;

using FwdFn = void (*)(const FwdBlock&);
using BwdFn = void (*)(const BwdChunk&);

struct KernelTable {
  const char* name;
  FwdFn fwd[2][2][2];  // [B variable][C variable][with_P]
  BwdFn bwd[2][2][2];  // [B variable][C variable][fold_B]
  float (*exp2)(float);                 // the kernels' exp2 (exposed for testing)
  void (*softplus)(float* v, int64_t n);  // in place: v > 20 ? v : log1p(exp(v))
};

// The best table this CPU runs (AVX2+FMA when available, else portable). SELSCAN_CPU_KERNELS=generic in the
// environment forces the portable one (for testing both).
const KernelTable& kernels();
// Tests: use table `t` from now on (nullptr restores the automatic choice). Not for use during a call.
void set_kernels_for_testing(const KernelTable* t);

namespace generic {
KernelTable table();
}
namespace avx2 {
bool available();  // built for x86-64 with GCC/Clang and the CPU has AVX2 and FMA
KernelTable table();
}  // namespace avx2

}  // namespace selscan::cpu
