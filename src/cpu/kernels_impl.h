// Body of the real-weight kernels (see kernels.h). Included by kernels_generic.cpp and kernels_avx2.cpp, each
// with its own SELSCAN_CPU_ISA namespace and SELSCAN_VFMA. Everything here has internal linkage and calls no
// library templates, so the AVX2 build cannot leak AVX2 code into other translation units.
//
// Vectorisation is explicit (8-lane vectors over states) rather than left to the optimiser: the exp2's
// selects are not if-converted under the default -ftrapping-math, and -O2 refuses loops needing alias checks.
// Sums over states keep 8 partial sums.
#ifndef SELSCAN_CPU_ISA
#  error "define SELSCAN_CPU_ISA, SELSCAN_CPU_ISA_NAME and SELSCAN_VFMA before including kernels_impl.h"
#endif

namespace selscan::cpu::SELSCAN_CPU_ISA {
namespace {

// ---------------------------------------------------------------------------------------------- 8 lanes
// An 8-float vector: GCC/Clang vector extensions (one AVX register, or two SSE registers in the portable
// build), or a plain array elsewhere. SELSCAN_VFMA(a, b, c) = a*b + c is defined by the including file.
#if defined(__GNUC__) || defined(__clang__)
// The portable build caps the alignment at 16 bytes: its vectors are two SSE registers anyway, and a 32-byte
// aligned by-value argument would trigger GCC's -Wpsabi note.
#  ifndef SELSCAN_VEC_ALIGN
#    define SELSCAN_VEC_ALIGN 32
#  endif
typedef float vf8 __attribute__((vector_size(32), aligned(SELSCAN_VEC_ALIGN)));
typedef int32_t vi8 __attribute__((vector_size(32), aligned(SELSCAN_VEC_ALIGN)));
typedef uint32_t vu8 __attribute__((vector_size(32), aligned(SELSCAN_VEC_ALIGN)));
struct V {
  vf8 v;
};
struct M {  // lane mask: all ones or zero
  vi8 m;
};
inline V vload(const float* p) {
  V r;
  __builtin_memcpy(&r.v, p, sizeof r.v);
  return r;
}
inline void vstore(float* p, V a) { __builtin_memcpy(p, &a.v, sizeof a.v); }
inline V vset(float x) { return V{vf8{x, x, x, x, x, x, x, x}}; }
inline V operator+(V a, V b) { return V{a.v + b.v}; }
inline V operator-(V a, V b) { return V{a.v - b.v}; }
inline V operator*(V a, V b) { return V{a.v * b.v}; }
inline V operator/(V a, V b) { return V{a.v / b.v}; }
inline M operator<(V a, V b) { return M{a.v < b.v}; }
inline M operator>(V a, V b) { return M{a.v > b.v}; }
inline M isnan(V a) { return M{a.v != a.v}; }
inline V vabs(V a) {
  const vu8 magnitude = {0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu,
                         0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu};
  return V{(vf8)((vu8)a.v & magnitude)};
}
inline V select(M m, V a, V b) {  // m ? a : b
  return V{(vf8)(((vi8)a.v & m.m) | ((vi8)b.v & ~m.m))};
}
// 2^k * p for integral k in [-127, 128] by adding k to the exponent field.
inline V ldexp_int(V p, V k) {
  const vu8 ki = (vu8)__builtin_convertvector(k.v, vi8);
  return V{(vf8)((vu8)p.v + (ki << 23))};
}
#else
struct V {
  float v[8];
};
struct M {
  bool m[8];
};
#  define SELSCAN_LANES(expr)    \
    for (int i = 0; i < 8; ++i) { \
      expr;                       \
    }
inline V vload(const float* p) {
  V r;
  SELSCAN_LANES(r.v[i] = p[i]);
  return r;
}
inline void vstore(float* p, V a) { SELSCAN_LANES(p[i] = a.v[i]); }
inline V vset(float x) {
  V r;
  SELSCAN_LANES(r.v[i] = x);
  return r;
}
inline V operator+(V a, V b) { SELSCAN_LANES(a.v[i] += b.v[i]); return a; }
inline V operator-(V a, V b) { SELSCAN_LANES(a.v[i] -= b.v[i]); return a; }
inline V operator*(V a, V b) { SELSCAN_LANES(a.v[i] *= b.v[i]); return a; }
inline V operator/(V a, V b) { SELSCAN_LANES(a.v[i] /= b.v[i]); return a; }
inline M operator<(V a, V b) { M r; SELSCAN_LANES(r.m[i] = a.v[i] < b.v[i]); return r; }
inline M operator>(V a, V b) { M r; SELSCAN_LANES(r.m[i] = a.v[i] > b.v[i]); return r; }
inline M isnan(V a) { M r; SELSCAN_LANES(r.m[i] = a.v[i] != a.v[i]); return r; }
inline V vabs(V a) { SELSCAN_LANES(a.v[i] = a.v[i] < 0.f ? -a.v[i] : a.v[i]); return a; }
inline V select(M m, V a, V b) { SELSCAN_LANES(a.v[i] = m.m[i] ? a.v[i] : b.v[i]); return a; }
inline V ldexp_int(V p, V k) {
  SELSCAN_LANES(uint32_t u; std::memcpy(&u, &p.v[i], 4); u += static_cast<uint32_t>(static_cast<int32_t>(k.v[i])) << 23;
                std::memcpy(&p.v[i], &u, 4));
  return p;
}
#  undef SELSCAN_LANES
#endif

inline V vfma(V a, V b, V c) { return SELSCAN_VFMA(a, b, c); }

// Lanes i < count (all lanes when count >= 8): the valid states of a block's last vector.
inline M lanes_below(int64_t count) {
  const float c = count < 8 ? static_cast<float>(count) : 8.f;
  return vset(c) > V{{0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f}};
}

// 2^x to ~1.2 ulp, branch-free. Results below 2^-126 flush to 0 (like ex2.approx.ftz), x > 128 gives inf,
// NaN propagates. 2^x = 2^k p(f) with k = round(x), f in [-0.5, 0.5] and p a degree-6 fit with p(0) = 1.
inline V vexp2(V x) {
  V xc = select(x > vset(-127.f), x, vset(-127.f));  // NaN lanes become -127 here, restored below
  xc = select(xc < vset(128.f), xc, vset(128.f));
  const V magic = vset(12582912.f);  // 1.5 * 2^23: adding and subtracting it rounds to nearest
  const V r = (xc + magic) - magic;
  const V f = xc - r;
  V q = vset(1.5353362e-4f);
  q = vfma(q, f, vset(1.3398875e-3f));
  q = vfma(q, f, vset(9.6184369e-3f));
  q = vfma(q, f, vset(5.5503324e-2f));
  q = vfma(q, f, vset(2.4022648e-1f));
  q = vfma(q, f, vset(6.9314718e-1f));
  const V p = vfma(q, f, vset(1.f));
  V res = ldexp_int(p, r);
  res = select(x < vset(-126.f), vset(0.f), res);
  res = select(x > vset(128.f), vset(HUGE_VALF), res);
  return select(isnan(x), x, res);
}

// e^x to ~1.2 ulp: x = k ln2 + r (Cody-Waite, |r| <= ln2/2), e^r by its Taylor polynomial of degree 7.
// Below e^-87.33 (2^-126) the result flushes to 0; above 88.72 it is inf.
inline V vexp(V x) {
  V xc = select(x > vset(-88.f), x, vset(-88.f));
  xc = select(xc < vset(88.8f), xc, vset(88.8f));
  const V magic = vset(12582912.f);
  const V k = (xc * vset(1.44269504f) + magic) - magic;
  V r = vfma(k, vset(-0.693145751953125f), xc);  // ln2 split in a short high part (k * hi exact) and the rest
  r = vfma(k, vset(-1.428606765330187e-06f), r);
  V p = vset(1.f / 5040.f);
  p = vfma(p, r, vset(1.f / 720.f));
  p = vfma(p, r, vset(1.f / 120.f));
  p = vfma(p, r, vset(1.f / 24.f));
  p = vfma(p, r, vset(1.f / 6.f));
  p = vfma(p, r, vset(0.5f));
  p = vfma(p, r, vset(1.f));
  p = vfma(p, r, vset(1.f));
  V res = ldexp_int(p, k);
  res = select(x < vset(-87.33654f), vset(0.f), res);
  res = select(x > vset(88.72283f), vset(HUGE_VALF), res);
  return select(isnan(x), x, res);
}

// log(1 + e) for e in [0, 1]: u = 1 + e = 2^k m with m in [1, sqrt 2), log m = 2 atanh(s), s = (m-1)/(m+1),
// plus the correction (e - (u - 1)) / u for the bits of e lost in u.
inline V vlog1p01(V e) {
  const V u = vset(1.f) + e;
  const M big = u > vset(1.41421356f);
  const V m = select(big, u * vset(0.5f), u);
  const V k = select(big, vset(1.f), vset(0.f));
  const V s = (m - vset(1.f)) / (m + vset(1.f));
  const V s2 = s * s;
  V q = vset(2.f / 11.f);
  q = vfma(q, s2, vset(2.f / 9.f));
  q = vfma(q, s2, vset(2.f / 7.f));
  q = vfma(q, s2, vset(2.f / 5.f));
  q = vfma(q, s2, vset(2.f / 3.f));
  const V logm = vfma(s * s2, q, s + s);
  const V corr = (e - (u - vset(1.f))) / u;
  return vfma(k, vset(0.693145751953125f), vfma(k, vset(1.428606765330187e-06f), logm) + corr);
}

// softplus as upstream (threshold 20): v > 20 ? v : log(1 + e^v), computed as max(v, 0) + log1p(e^-|v|).
inline V vsoftplus(V v) {
  const V sp = select(v > vset(0.f), v, vset(0.f)) + vlog1p01(vexp(vset(0.f) - vabs(v)));
  return select(v > vset(20.f), v, sp);
}

void softplus_row(float* v, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vstore(v + i, vsoftplus(vload(v + i)));
  if (i < n) {
    float tail[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int64_t j = i; j < n; ++j) tail[j - i] = v[j];
    vstore(tail, vsoftplus(vload(tail)));
    for (int64_t j = i; j < n; ++j) v[j] = tail[j - i];
  }
}

float ex2_scalar(float x) {
  float in[8] = {x, x, x, x, x, x, x, x}, out[8];
  vstore(out, vexp2(vload(in)));
  return out[0];
}

inline float hsum(V a) {
  float v[8];
  vstore(v, a);
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// Forward over a block. NV > 0: exactly NV vectors of states (Np == 8 NV), held in registers for the whole
// block; NV == 0: any Np, states in memory.
template <bool VB, bool VC, bool WP, int NV>
void fwd_block_regs(const FwdBlock& k) {
  V h[NV], P[NV], A2[NV], Cs[NV], Bc[NV], Cc[NV];
  for (int v = 0; v < NV; ++v) {
    h[v] = vload(k.h + 8 * v);
    P[v] = WP ? vload(k.P + 8 * v) : vset(1.f);
    A2[v] = vload(k.A2 + 8 * v);
    Cs[v] = VC ? vload(k.Cs + 8 * v) : vset(0.f);
    Bc[v] = VB ? vset(0.f) : vload(k.Bc + 8 * v);
    Cc[v] = VC ? vset(0.f) : vload(k.Cc + 8 * v);
  }
  const int64_t T = k.T;
  const M last = lanes_below(k.N - 8 * (NV - 1));
  for (int64_t t = 0; t < T; ++t) {
    const V dt = vset(k.delta[t]), dut = vset(k.du[t]);
    V acc = vset(0.f);
    for (int v = 0; v < NV; ++v) {
      const V a = vexp2(dt * A2[v]);
      const V b = VB ? vload(k.Bt + t * 8 * NV + 8 * v) : Bc[v];
      h[v] = vfma(a, h[v], b * dut);
      if (WP) P[v] = P[v] * a;
      const V c = VC ? vload(k.Ct + t * 8 * NV + 8 * v) * Cs[v] : Cc[v];
      acc = vfma(v == NV - 1 ? select(last, h[v], vset(0.f)) : h[v], c, acc);
    }
    k.y[t] += hsum(acc);
  }
  for (int v = 0; v < NV; ++v) {
    vstore(k.h + 8 * v, h[v]);
    if (WP) vstore(k.P + 8 * v, P[v]);
  }
}

template <bool VB, bool VC, bool WP>
void fwd_block(const FwdBlock& k) {
  switch (k.Np) {
    case 8: return fwd_block_regs<VB, VC, WP, 1>(k);
    case 16: return fwd_block_regs<VB, VC, WP, 2>(k);
    case 32: return fwd_block_regs<VB, VC, WP, 4>(k);
    default: break;
  }
  const int64_t T = k.T, Np = k.Np;
  const M last = lanes_below(k.N - (Np - 8));
  for (int64_t t = 0; t < T; ++t) {
    const V dt = vset(k.delta[t]), dut = vset(k.du[t]);
    const float* bt = VB ? k.Bt + t * Np : k.Bc;
    const float* ct = VC ? k.Ct + t * Np : k.Cc;
    V acc = vset(0.f);
    for (int64_t n = 0; n < Np; n += 8) {
      const V a = vexp2(dt * vload(k.A2 + n));
      const V s = vfma(a, vload(k.h + n), vload(bt + n) * dut);
      vstore(k.h + n, s);
      if (WP) vstore(k.P + n, vload(k.P + n) * a);
      const V c = VC ? vload(ct + n) * vload(k.Cs + n) : vload(ct + n);
      acc = vfma(n == Np - 8 ? select(last, s, vset(0.f)) : s, c, acc);
    }
    k.y[t] += hsum(acc);
  }
}

template <bool VB, bool VC, bool FOLD>
void bwd_chunk(const BwdChunk& k) {
  const int64_t T = k.T, Np = k.Np;
  float* hs = k.hs;
  float* as = k.as;
  const M last = lanes_below(k.N - (Np - 8));
  // Recompute the chunk's forward states (row 0 of hs is the seed).
  for (int64_t n = 0; n < Np; n += 8) vstore(hs + n, vload(k.seed + n));
  for (int64_t t = 0; t < T; ++t) {
    const V dt = vset(k.delta[t]), dut = vset(k.du[t]);
    const float* bt = VB ? k.Bt + t * Np : k.Bc;
    for (int64_t n = 0; n < Np; n += 8) {
      const V a = vexp2(dt * vload(k.A2 + n));
      vstore(as + t * Np + n, a);
      vstore(hs + (t + 1) * Np + n, vfma(a, vload(hs + t * Np + n), vload(bt + n) * dut));
    }
  }
  // Reverse pass: dh_t = dy_t coef_t + ā_{t+1} dh_{t+1}; `carry` holds ā_{t+1} dh_{t+1}.
  for (int64_t t = T - 1; t >= 0; --t) {
    const V dt = vset(k.delta[t]), dut = vset(k.du[t]), dyt = vset(k.dy[t]);
    const float* bt = VB ? k.Bt + t * Np : k.Bc;
    const float* ct = VC ? k.Ct + t * Np : k.Cc;
    V gacc = vset(0.f), dacc = vset(0.f);
    for (int64_t n = 0; n < Np; n += 8) {
      const V cn = vload(ct + n);
      const V c = VC ? cn * vload(k.Cs + n) : cn;
      const V dh = vfma(dyt, c, vload(k.carry + n));
      const V a = vload(as + t * Np + n);
      const V dha = dh * (a * vload(hs + t * Np + n));  // dh ā_t s_{t-1}
      const bool tail = n == Np - 8;
      gacc = vfma(tail ? select(last, dh, vset(0.f)) : dh, vload(bt + n), gacc);
      dacc = vfma(tail ? select(last, dha, vset(0.f)) : dha, vload(k.A + n), dacc);
      vstore(k.dA + n, vfma(dt, dha, vload(k.dA + n)));
      const V s = vload(hs + (t + 1) * Np + n);
      if (VB) vstore(k.dBt + t * Np + n, dh * dut);
      if (VC) vstore(k.dCt + t * Np + n, dyt * s * vload(k.Cs + n));
      if (!VC) vstore(k.S1 + n, vfma(dyt, s, vload(k.S1 + n)));
      if (!VB && FOLD && VC) vstore(k.S2 + n, vfma(dyt * s, cn, vload(k.S2 + n)));
      if (!VB && !FOLD) vstore(k.S3 + n, vfma(dh, dut, vload(k.S3 + n)));
      vstore(k.carry + n, a * dh);
    }
    k.gsum[t] = hsum(gacc);
    k.dsum[t] = hsum(dacc);
  }
}

}  // namespace

KernelTable table() {
  KernelTable t{};
  t.name = SELSCAN_CPU_ISA_NAME;
#define SELSCAN_FILL(vb, vc, x)                                        \
  t.fwd[vb ? 1 : 0][vc ? 1 : 0][x ? 1 : 0] = &fwd_block<vb, vc, x>; \
  t.bwd[vb ? 1 : 0][vc ? 1 : 0][x ? 1 : 0] = &bwd_chunk<vb, vc, x>;
  SELSCAN_FILL(false, false, false)
  SELSCAN_FILL(false, false, true)
  SELSCAN_FILL(false, true, false)
  SELSCAN_FILL(false, true, true)
  SELSCAN_FILL(true, false, false)
  SELSCAN_FILL(true, false, true)
  SELSCAN_FILL(true, true, false)
  SELSCAN_FILL(true, true, true)
#undef SELSCAN_FILL
  t.exp2 = &ex2_scalar;
  t.softplus = &softplus_row;
  return t;
}

}  // namespace selscan::cpu::SELSCAN_CPU_ISA

