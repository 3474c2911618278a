// Complex weights: ā = 2^(δ A.re log2 e) (cos δ A.im + i sin δ A.im), y += 2 Re(s coef); gradients follow
// PyTorch's convention for real losses (∂L/∂Re + i ∂L/∂Im), hence the conjugates.
#include "complex_kernels.h"

#include <cmath>

namespace selscan::cpu {
namespace {

inline cfloat cdecay(float dt, cfloat a2) {
  const float m = std::exp2(dt * a2.re);
  const float ph = dt * a2.im;
  return {m * std::cos(ph), m * std::sin(ph)};
}

}  // namespace

void cfwd_block(const CFwdBlock& k, bool var_B, bool var_C, bool with_P) {
  const int64_t T = k.T, Np = k.Np;
  for (int64_t t = 0; t < T; ++t) {
    const float dt = k.delta[t], dut = k.du[t];
    const cfloat* bt = var_B ? k.Bt + t * Np : k.Bc;
    const cfloat* ct = var_C ? k.Ct + t * Np : k.Cc;
    float acc = 0.f;
    for (int64_t n = 0; n < Np; ++n) {
      const cfloat a = cdecay(dt, k.A2[n]);
      const cfloat s = a * k.h[n] + bt[n] * dut;
      k.h[n] = s;
      if (with_P) k.P[n] = k.P[n] * a;
      const cfloat c = var_C ? ct[n] * k.Cs[n] : ct[n];
      if (n < k.N) acc += 2.f * (s.re * c.re - s.im * c.im);  // padded states never reach y
    }
    k.y[t] += acc;
  }
}

void cbwd_chunk(const CBwdChunk& k, bool var_B, bool var_C, bool fold_B) {
  const int64_t T = k.T, Np = k.Np;
  for (int64_t n = 0; n < Np; ++n) k.hs[n] = k.seed[n];
  for (int64_t t = 0; t < T; ++t) {
    const float dt = k.delta[t], dut = k.du[t];
    const cfloat* bt = var_B ? k.Bt + t * Np : k.Bc;
    for (int64_t n = 0; n < Np; ++n) {
      const cfloat a = cdecay(dt, k.A2[n]);
      k.as[t * Np + n] = a;
      k.hs[(t + 1) * Np + n] = a * k.hs[t * Np + n] + bt[n] * dut;
    }
  }
  for (int64_t t = T - 1; t >= 0; --t) {
    const float dt = k.delta[t], dut = k.du[t], dyt = k.dy[t];
    const cfloat* bt = var_B ? k.Bt + t * Np : k.Bc;
    const cfloat* ct = var_C ? k.Ct + t * Np : k.Cc;
    float g = 0.f, dd = 0.f;
    for (int64_t n = 0; n < Np; ++n) {
      const cfloat c = var_C ? ct[n] * k.Cs[n] : ct[n];
      const cfloat dh = (2.f * dyt) * conj(c) + k.carry[n];
      const cfloat a = k.as[t * Np + n];
      const cfloat s = k.hs[(t + 1) * Np + n];
      const cfloat ah = a * k.hs[t * Np + n];
      if (n < k.N) {  // padded states never reach du/ddelta
        g += (dh * conj(bt[n])).re;
        dd += (dh * conj(k.A[n] * ah)).re;
      }
      k.dA[n] += dt * (dh * conj(ah));
      if (var_B) k.dBt[t * Np + n] = dh * dut;
      if (var_C) k.dCt[t * Np + n] = (2.f * dyt) * conj(s * k.Cs[n]);
      if (!var_C) k.S1[n] += (2.f * dyt) * conj(s);
      if (!var_B && fold_B && var_C) k.S2[n] += (2.f * dyt) * conj(s * ct[n]);
      if (!var_B && !fold_B) k.S3[n] += dh * dut;
      k.carry[n] = conj(a) * dh;
    }
    k.gsum[t] = g;
    k.dsum[t] = dd;
  }
}

}  // namespace selscan::cpu
