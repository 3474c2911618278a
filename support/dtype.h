// The element types of the public ABI on the host: sizes, names, and float <-> float16 / bfloat16 conversions
// (round to nearest even). The conversions are written with double arithmetic, independently of the
// library's bit-twiddling ones (src/cpu/common.h), so that the two check each other (tests/cpu/test_cpu_units).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "selscan/selscan.h"

namespace selscan_support {

// Bytes of one element (complex64 and int64: 8, bool: 1).
int64_t dtype_size(int32_t dtype);
// "fp32", "fp16", "bf16", "c64", "i32", "i64", "bool"; "?" for anything else.
const char* dtype_name(int32_t dtype);
// fp32 / float32 / float, fp16 / float16 / half, bf16 / bfloat16 (the input types). False for anything else.
bool parse_dtype(const std::string& text, int32_t* dtype);

inline uint16_t float_to_f16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 is the largest half; halfway and above round to inf
  if (a < std::ldexp(1.0, -14)) {          // subnormal (or zero): multiples of 2^-24
    const double q = std::nearbyint(a * std::ldexp(1.0, 24));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));  // q == 1024 is the smallest normal
  }
  int e2 = 0;
  const double m = std::frexp(a, &e2);  // a = m 2^e2, m in [0.5, 1)
  int E = e2 - 1;
  double q = std::nearbyint((2.0 * m - 1.0) * 1024.0);
  if (q == 1024.0) {
    q = 0.0;
    ++E;
  }
  if (E + 15 >= 31) return sign | 0x7c00;
  return static_cast<uint16_t>(sign | ((E + 15) << 10) | static_cast<int>(q));
}

inline float f16_to_float(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0) v = std::ldexp(static_cast<double>(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return static_cast<float>((h & 0x8000) ? -v : v);
}

inline uint16_t float_to_bf16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7fc0;
  if (std::isinf(f)) return sign | 0x7f80;
  const double a = std::fabs(static_cast<double>(f));
  if (a < std::ldexp(1.0, -126)) {  // subnormal: multiples of 2^-133
    const double q = std::nearbyint(a * std::ldexp(1.0, 133));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  int e2 = 0;
  const double m = std::frexp(a, &e2);
  int E = e2 - 1;
  double q = std::nearbyint((2.0 * m - 1.0) * 128.0);
  if (q == 128.0) {
    q = 0.0;
    ++E;
  }
  if (E + 127 >= 255) return sign | 0x7f80;
  return static_cast<uint16_t>(sign | ((E + 127) << 7) | static_cast<int>(q));
}

inline float bf16_to_float(uint16_t h) {
  const int e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0) v = std::ldexp(static_cast<double>(m), -133);
  else if (e == 255) v = m ? NAN : INFINITY;
  else v = std::ldexp(1.0 + m / 128.0, e - 127);
  return static_cast<float>((h & 0x8000) ? -v : v);
}

// Stores v rounded to a real dtype (fp32, fp16, bf16; complex64 parts are fp32) at p; reads one back. The
// index dtypes (int32, int64, bool) hold integral values: v is truncated (bool: v != 0).
inline void store_real(int32_t dtype, void* p, double v) {
  const float f = static_cast<float>(v);
  uint16_t h;
  int32_t i;
  int64_t l;
  switch (dtype) {
    case SELSCAN_DTYPE_FLOAT16: h = float_to_f16(f); std::memcpy(p, &h, 2); break;
    case SELSCAN_DTYPE_BFLOAT16: h = float_to_bf16(f); std::memcpy(p, &h, 2); break;
    case SELSCAN_DTYPE_INT32: i = static_cast<int32_t>(v); std::memcpy(p, &i, 4); break;
    case SELSCAN_DTYPE_INT64: l = static_cast<int64_t>(v); std::memcpy(p, &l, 8); break;
    case SELSCAN_DTYPE_BOOL: *static_cast<unsigned char*>(p) = v != 0.0 ? 1 : 0; break;
    default: std::memcpy(p, &f, 4);
  }
}
inline double load_real(int32_t dtype, const void* p) {
  uint16_t h;
  float f;
  int32_t i;
  int64_t l;
  switch (dtype) {
    case SELSCAN_DTYPE_FLOAT16: std::memcpy(&h, p, 2); return f16_to_float(h);
    case SELSCAN_DTYPE_BFLOAT16: std::memcpy(&h, p, 2); return bf16_to_float(h);
    case SELSCAN_DTYPE_INT32: std::memcpy(&i, p, 4); return i;
    case SELSCAN_DTYPE_INT64: std::memcpy(&l, p, 8); return static_cast<double>(l);
    case SELSCAN_DTYPE_BOOL: return *static_cast<const unsigned char*>(p);
    default: std::memcpy(&f, p, 4); return f;
  }
}
// What v becomes when stored as a real dtype and read back.
inline double round_to_dtype(int32_t dtype, double v) {
  unsigned char b[8];
  store_real(dtype, b, v);
  return load_real(dtype, b);
}

// False when the element at p (complex64: either part) is NaN or infinite (the 0xFF poison included).
inline bool finite_element(int32_t dtype, const void* p) {
  if (dtype != SELSCAN_DTYPE_COMPLEX64) return std::isfinite(load_real(dtype, p));
  return std::isfinite(load_real(SELSCAN_DTYPE_FLOAT32, p)) &&
         std::isfinite(load_real(SELSCAN_DTYPE_FLOAT32, static_cast<const unsigned char*>(p) + 4));
}

}  // namespace selscan_support
