// Test-side float <-> float16 / bfloat16 conversions (round to nearest even). Written with double arithmetic,
// independently of the library's bit-twiddling versions, so the two check each other.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace selscan_test {

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

}  // namespace selscan_test
