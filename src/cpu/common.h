// Private helpers of the CPU path: 16-bit float conversions, row IO by itype, weight loads, a tiny complex
// type and a worker pool runner. Default target only (the AVX2 kernels must not pull inline code from here).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
#include <string>

#include "../errors.h"
#include "../problem.h"

namespace selscan::cpu {

// ---------------------------------------------------------------------------------------------- 16-bit floats
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24 is exact in float
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / nan (payload kept)
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even, overflow to inf, NaN stays NaN (quiet), results below 2^-14 become half subnormals.
inline uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u)  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
  if (ax >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536: inf
  if (ax < 0x38800000u) {
    // Below the smallest normal half: adding 0.5 lets the FPU round |f| to a multiple of 2^-24 (RNE); the
    // low mantissa bits of the sum are then the half subnormal's bits.
    const float s = bits_float(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(s) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even. A carry out of the
  // mantissa correctly bumps the exponent (up to inf for 65520 <= |f| < 65536).
  const uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000000u + 0x0fffu + odd;  // 0xc8000000 = -(112 << 23) mod 2^32
  return static_cast<uint16_t>(sign | (ax >> 13));
}

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------------------------- row IO
// Rows of itype tensors: `off` and `n` are in elements of the itype.
inline void load_row(Dtype it, const void* base, int64_t off, int64_t n, float* dst) {
  switch (it) {
    case Dtype::f16: {
      const uint16_t* s = static_cast<const uint16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
      break;
    }
    case Dtype::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      break;
    }
    default: std::memcpy(dst, static_cast<const float*>(base) + off, static_cast<size_t>(n) * sizeof(float));
  }
}

inline void store_row(Dtype it, void* base, int64_t off, int64_t n, const float* src) {
  switch (it) {
    case Dtype::f16: {
      uint16_t* d = static_cast<uint16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_half(src[i]);
      break;
    }
    case Dtype::bf16: {
      uint16_t* d = static_cast<uint16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
      break;
    }
    default: std::memcpy(static_cast<float*>(base) + off, src, static_cast<size_t>(n) * sizeof(float));
  }
}

// One element of a float tensor of dtype t at element offset `off` (strided access).
inline float load_f(Dtype t, const void* base, int64_t off) {
  switch (t) {
    case Dtype::f16: return half_to_float(static_cast<const uint16_t*>(base)[off]);
    case Dtype::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    default: return static_cast<const float*>(base)[off];
  }
}

inline void store_f(Dtype t, void* base, int64_t off, float v) {
  switch (t) {
    case Dtype::f16: static_cast<uint16_t*>(base)[off] = float_to_half(v); break;
    case Dtype::bf16: static_cast<uint16_t*>(base)[off] = float_to_bf16(v); break;
    default: static_cast<float*>(base)[off] = v;
  }
}

// ---------------------------------------------------------------------------------------------- complex
struct cfloat {
  float re, im;
};
inline cfloat operator+(cfloat a, cfloat b) { return {a.re + b.re, a.im + b.im}; }
inline cfloat operator-(cfloat a, cfloat b) { return {a.re - b.re, a.im - b.im}; }
inline cfloat operator*(cfloat a, cfloat b) { return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
inline cfloat operator*(cfloat a, float s) { return {a.re * s, a.im * s}; }
inline cfloat operator*(float s, cfloat a) { return {a.re * s, a.im * s}; }
inline cfloat& operator+=(cfloat& a, cfloat b) { return a = a + b; }
inline cfloat conj(cfloat a) { return {a.re, -a.im}; }
inline float conj(float a) { return a; }

// Weight-type traits: float for real weights, cfloat for complex64. Views of wtype tensors count elements of
// the weight type, so a complex element at offset `off` starts at float index 2*off.
inline float wload(float*, const View& v, int64_t off) { return static_cast<const float*>(v.p)[off]; }
inline cfloat wload(cfloat*, const View& v, int64_t off) {
  const float* f = static_cast<const float*>(v.p) + 2 * off;
  return {f[0], f[1]};
}
inline void wstore(const View& v, int64_t off, float x) { static_cast<float*>(v.p)[off] = x; }
inline void wstore(const View& v, int64_t off, cfloat x) {
  float* f = static_cast<float*>(v.p) + 2 * off;
  f[0] = x.re;
  f[1] = x.im;
}
template <class W>
W wload(const View& v, int64_t off) {
  return wload(static_cast<W*>(nullptr), v, off);
}
inline float fload(const View& v, int64_t off) { return static_cast<const float*>(v.p)[off]; }

template <class W>
W wone();
template <>
inline float wone<float>() { return 1.f; }
template <>
inline cfloat wone<cfloat>() { return {1.f, 0.f}; }

// ---------------------------------------------------------------------------------------------- scalar math
inline float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

// Padded state count: the kernels work on blocks of 8 states (one AVX2 vector).
inline int64_t padded_states(int64_t n) { return (n + 7) / 8 * 8; }

// ---------------------------------------------------------------------------------------------- threads
// Worker threads for a call of `tasks` independent tasks and `updates` state updates in all: `requested`, or when
// that is 0, the hardware threads, but no more than one per kMinUpdatesPerThread updates.
inline constexpr int64_t kMinUpdatesPerThread = int64_t{1} << 16;
int resolve_threads(int requested, int64_t tasks, int64_t updates);

// Runs body(task, worker) for every task in [0, ntasks) on `nthreads` workers (the caller is worker 0).
// Tasks are handed out in increasing order. The first exception stops the run and becomes the status
// (bad_alloc -> OUT_OF_MEMORY); `abort` is raised so that bodies waiting on each other can give up.
Status run_tasks(int64_t ntasks, int nthreads, const std::function<void(int64_t, int)>& body,
                 std::atomic<bool>* abort = nullptr);

// Thrown by a body that gave up because another worker failed (not an error of its own).
struct Aborted {};

}  // namespace selscan::cpu
