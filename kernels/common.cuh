// Device helpers shared by the forward and backward kernels: dtype conversion and vector IO, the fast-math
// primitives the numerics contract names (docs/numerics.md), a tiny float2 complex type and warp scans.
// Everything here is valid on every target >= sm_75 (the bf16 conversions included).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace selscan::kern {

constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------------- dtypes
// to_f32 / from_f32 for the three itypes. fp16/bf16 stores round to nearest even (c10 semantics).
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  // bf16 -> f32 is exact: the 16 bits are the top half of the float (no sm_80 instruction needed).
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(v)) << 16);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __float2bfloat16_rn(v);
#else
  // Software RNE for sm_75 (no cvt.rn.bf16.f32 there); NaN stays a quiet NaN.
  uint32_t x = __float_as_uint(v);
  if ((x & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(static_cast<unsigned short>((x >> 16) | 0x40u));
  x += 0x7fffu + ((x >> 16) & 1u);
  return __ushort_as_bfloat16(static_cast<unsigned short>(x >> 16));
#endif
}

// ---------------------------------------------------------------------------------------------- vector IO
// Loads/stores of 16 bytes worth of itype values, converted to/from float. The caller guarantees 16-byte
// alignment of `p` (checked on the row base at run time; misaligned rows take the scalar path).
template <typename T>
struct Vec16 {
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));
};

template <typename T>
__device__ __forceinline__ unsigned short bits16(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(v);
  else return __bfloat16_as_ushort(v);
}

// 16 raw bytes of itype values <-> floats.
template <typename T>
__device__ __forceinline__ void unpack16(uint4 raw, float* out) {
  if constexpr (sizeof(T) == 4) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      T lo, hi;
      const unsigned short l16 = static_cast<unsigned short>(w[i] & 0xffffu);
      const unsigned short h16 = static_cast<unsigned short>(w[i] >> 16);
      if constexpr (std::is_same_v<T, __half>) {
        lo = __ushort_as_half(l16);
        hi = __ushort_as_half(h16);
      } else {
        lo = __ushort_as_bfloat16(l16);
        hi = __ushort_as_bfloat16(h16);
      }
      out[2 * i] = to_f32(lo);
      out[2 * i + 1] = to_f32(hi);
    }
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack16(const float* in) {
  if constexpr (sizeof(T) == 4) {
    return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = static_cast<uint32_t>(bits16(from_f32<T>(in[2 * i]))) |
             (static_cast<uint32_t>(bits16(from_f32<T>(in[2 * i + 1]))) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <typename T>
__device__ __forceinline__ void load16(const T* p, float* out) {
  unpack16<T>(__ldg(reinterpret_cast<const uint4*>(p)), out);
}

template <typename T>
__device__ __forceinline__ void store16(T* p, const float* in) {
  *reinterpret_cast<uint4*>(p) = pack16<T>(in);
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// n consecutive itype values of a row starting at element e0 into floats; elements at or past `lim` read as 0.
// 16-byte loads when the row is aligned and the run is whole (n * sizeof(T) is a multiple of 16).
template <typename T, int n>
__device__ __forceinline__ void load_run(const T* row, int64_t e0, int64_t lim, bool vec, float* out) {
  constexpr int VE = Vec16<T>::kElems;
  static_assert(n % VE == 0, "run must be whole 16-byte vectors");
  if (vec && e0 + n <= lim) {
#pragma unroll
    for (int j = 0; j < n / VE; ++j) load16(row + e0 + j * VE, out + j * VE);
  } else {
#pragma unroll
    for (int j = 0; j < n; ++j) out[j] = (e0 + j < lim) ? to_f32(row[e0 + j]) : 0.f;
  }
}
template <typename T, int n>
__device__ __forceinline__ void store_run(T* row, int64_t e0, int64_t lim, bool vec, const float* in) {
  constexpr int VE = Vec16<T>::kElems;
  if (vec && e0 + n <= lim) {
#pragma unroll
    for (int j = 0; j < n / VE; ++j) store16(row + e0 + j * VE, in + j * VE);
  } else {
#pragma unroll
    for (int j = 0; j < n; ++j)
      if (e0 + j < lim) row[e0 + j] = from_f32<T>(in[j]);
  }
}

// 16 bytes' worth of a row's itype values from time t: one vector load when `vec` (the row is 16-byte aligned)
// and the vector ends before L; otherwise element by element, with 0 past L.
template <typename T>
__device__ __forceinline__ uint4 load_row16(const T* row, int64_t t, int64_t L, bool vec) {
  constexpr int VE = Vec16<T>::kElems;
  if (vec && t + VE <= L) return __ldg(reinterpret_cast<const uint4*>(row + t));
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < VE; ++j) {
    if (t + j < L) {
      if constexpr (sizeof(T) == 4) w[j] = __float_as_uint(row[t + j]);
      else w[j / 2] |= static_cast<uint32_t>(bits16(row[t + j])) << (16 * (j % 2));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The store counterpart: steps at or past L are not written.
template <typename T>
__device__ __forceinline__ void store_row16(T* row, int64_t t, int64_t L, bool vec, const float* in) {
  constexpr int VE = Vec16<T>::kElems;
  if (vec && t + VE <= L) {
    store16(row + t, in);
    return;
  }
#pragma unroll
  for (int j = 0; j < VE; ++j)
    if (t + j < L) row[t + j] = from_f32<T>(in[j]);
}

// ---------------------------------------------------------------------------------------------- async copies
// cp.async (sm_80+): global -> shared copies that need no registers, so the next round's rows load while the
// current one computes. Older targets copy synchronously (same layout, no overlap).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gsrc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gsrc) : "memory");
#else
  *static_cast<uint4*>(smem_dst) = *static_cast<const uint4*>(gsrc);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_prev() {  // all but the most recent group have landed
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {  // every committed group has landed
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------------- fast math
// exp2 as upstream's --use_fast_math build runs it: ex2.approx.ftz (flushes denormal results to zero).
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// softplus = max(x, 0) + log1p(e) with e = exp(-|x|) in (0, 1], log1p(e) = e q(e) and q a degree-8 polynomial
// (near-minimax on [0, 1], relative error 2e-7 in fp32 Horner): 12 instructions and one MUFU (ex2), branch-free,
// against 32 with branches for upstream's log1pf(__expf(x)); the same accuracy (a few ulp). A first version
// with 2 atanh(e / (2 + e)) needed a second MUFU (rcp), and the forward, which is short of MUFU issue, got slower.
// F.softplus's threshold holds without a test: for x > 20 the log term (< 2.1e-9) is below half an ulp of x, so the
// result is x. NaN propagates through the log term. With `dsp`, also d softplus / dx = sigmoid(x) from the same e.
__device__ __forceinline__ float softplus(float x, float* dsp = nullptr) {
  const float e = exp2_fast(-fabsf(x) * kLog2e);
  float q = 0.0053808596f;
  q = fmaf(q, e, -0.030095546f);
  q = fmaf(q, e, 0.07918085f);
  q = fmaf(q, e, -0.1374361f);
  q = fmaf(q, e, 0.19143426f);
  q = fmaf(q, e, -0.2485242f);
  q = fmaf(q, e, 0.3332026f);
  q = fmaf(q, e, -0.49999547f);
  q = fmaf(q, e, 1.f);
  if (dsp != nullptr) *dsp = __fdividef(x >= 0.f ? 1.f : e, 1.f + e);  // 1 for x > 20, as upstream's threshold
  return fmaf(e, q, fmaxf(x, 0.f));
}

// Upstream's form, log1pf(__expf(x)) below the threshold: 32 instructions with branches. The branches serialise it, so
// converting 8 values at once needs fewer live registers than with softplus(); the forward's register-starved
// variant (16-bit inputs at 128 registers) measured faster with it (docs/performance.md).
__device__ __forceinline__ float softplus_serial(float x) { return x <= 20.f ? log1pf(__expf(x)) : x; }

// z * sigmoid(z) with the fast-math division upstream's build uses.
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.f + __expf(-z)); }

// ---------------------------------------------------------------------------------------------- complex
// float2 as complex: x = real, y = imaginary.
__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
  return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ float2 cfma(float2 a, float2 b, float2 c) {  // a * b + c
  return make_float2(fmaf(a.x, b.x, fmaf(-a.y, b.y, c.x)), fmaf(a.x, b.y, fmaf(a.y, b.x, c.y)));
}
__device__ __forceinline__ float2 cadd(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float2 cscale(float2 a, float s) { return make_float2(a.x * s, a.y * s); }
__device__ __forceinline__ float2 cconj(float2 a) { return make_float2(a.x, -a.y); }
// exp(x) for x = re*ln2-scaled real part and a plain imaginary part: 2^re * (cos im + i sin im).
// The phase is reduced to [-pi, pi] first (two-constant Cody-Waite): __sincosf is accurate only there, and
// slowly decaying complex states accumulate phases far outside it.
__device__ __forceinline__ float2 cexp2_fast(float re_log2, float im) {
  const float k = rintf(im * 0.159154943f);
  const float r = fmaf(-k, -1.74845553e-07f, fmaf(-k, 6.28318548f, im));
  float s, c;
  __sincosf(r, &s, &c);
  const float m = exp2_fast(re_log2);
  return make_float2(m * c, m * s);
}

// ---------------------------------------------------------------------------------------------- shuffles
__device__ __forceinline__ float shfl_up(float v, int delta) { return __shfl_up_sync(kFullMask, v, delta); }
__device__ __forceinline__ float2 shfl_up(float2 v, int delta) {
  return make_float2(__shfl_up_sync(kFullMask, v.x, delta), __shfl_up_sync(kFullMask, v.y, delta));
}
__device__ __forceinline__ float shfl_down(float v, int delta) { return __shfl_down_sync(kFullMask, v, delta); }
__device__ __forceinline__ float2 shfl_down(float2 v, int delta) {
  return make_float2(__shfl_down_sync(kFullMask, v.x, delta), __shfl_down_sync(kFullMask, v.y, delta));
}
__device__ __forceinline__ float shfl(float v, int lane) { return __shfl_sync(kFullMask, v, lane); }
__device__ __forceinline__ float2 shfl(float2 v, int lane) {
  return make_float2(__shfl_sync(kFullMask, v.x, lane), __shfl_sync(kFullMask, v.y, lane));
}

// Linear recurrence element (a, b) meaning h -> a*h + b; real (float) or complex (float2) weights.
__device__ __forceinline__ float wmul(float a, float b) { return a * b; }
__device__ __forceinline__ float2 wmul(float2 a, float2 b) { return cmul(a, b); }
__device__ __forceinline__ float wfma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ float2 wfma(float2 a, float2 b, float2 c) { return cfma(a, b, c); }
template <typename W>
__device__ __forceinline__ W wone();
template <>
__device__ __forceinline__ float wone<float>() { return 1.f; }
template <>
__device__ __forceinline__ float2 wone<float2>() { return make_float2(1.f, 0.f); }
template <typename W>
__device__ __forceinline__ W wzero();
template <>
__device__ __forceinline__ float wzero<float>() { return 0.f; }
template <>
__device__ __forceinline__ float2 wzero<float2>() { return make_float2(0.f, 0.f); }

// Inclusive warp scan (Hillis-Steele, 5 shuffle steps) of the recurrence pairs in lane order: afterwards lane l
// holds the composition of lanes 0..l, i.e. (a_l*...*a_0, h after lane l starting from h = 0 before lane 0).
template <typename W>
__device__ __forceinline__ void warp_scan_fwd(W& a, W& b, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const W pa = shfl_up(a, off);
    const W pb = shfl_up(b, off);
    if (lane >= off) {
      b = wfma(a, pb, b);
      a = wmul(a, pa);
    }
  }
}

}  // namespace selscan::kern
