// The input values of tests/gpu/test_gpu_limits.cpp's run_limit (a seeded pattern per tensor), shared so that a
// CPU test can rebuild the very problem a GPU limits case ran (tests/cpu/test_conditioning_bwd.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "half.h"
#include "selscan/selscan.h"
#include "tensor.h"

namespace selscan_test {

struct LimitRng {
  std::mt19937_64 g;
  explicit LimitRng(uint64_t seed) : g(seed) {}
  double uniform() { return static_cast<double>(g() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    const double a = 1.0 - uniform(), b = uniform();
    return std::sqrt(-2.0 * std::log(a)) * std::cos(6.283185307179586 * b);
  }
};

// Stores v rounded to `dtype` (float32, float16 or bfloat16) at p.
inline void put_real(int32_t dtype, unsigned char* p, double v) {
  const float f = static_cast<float>(v);
  uint16_t h = 0;
  if (dtype == SELSCAN_DTYPE_FLOAT16) {
    h = float_to_f16(f);
    std::memcpy(p, &h, 2);
  } else if (dtype == SELSCAN_DTYPE_BFLOAT16) {
    h = float_to_bf16(f);
    std::memcpy(p, &h, 2);
  } else {
    std::memcpy(p, &f, 4);
  }
}

// What an input holds. `decay` is A: real A log-uniform in [-1, -1e-3] (slow states carry across chunks and
// through long sequences), complex A with some damping (re in [-0.5, -0.02]) and fast rotation (im ~ 2 N(0,1)).
enum class Dist { normal, delta, bias, decay };

// n elements of `dtype` (bytes), drawn from `dist` with `seed`.
inline std::vector<unsigned char> limit_pattern(int32_t dtype, Dist dist, int64_t n, uint64_t seed) {
  const int64_t es = dtype_size(dtype);
  std::vector<unsigned char> h(static_cast<size_t>(n * es));
  LimitRng r(seed);
  for (int64_t i = 0; i < n; ++i) {
    unsigned char* p = h.data() + i * es;
    if (dtype == SELSCAN_DTYPE_COMPLEX64) {
      const bool a = dist == Dist::decay;
      const double re = a ? -0.02 - 0.48 * r.uniform() : r.normal();
      const double im = a ? 2.0 * r.normal() : r.normal();
      put_real(SELSCAN_DTYPE_FLOAT32, p, re);
      put_real(SELSCAN_DTYPE_FLOAT32, p + 4, im);
      continue;
    }
    double v = 0.0;
    switch (dist) {
      case Dist::normal: v = r.normal(); break;
      case Dist::delta: v = 0.5 * r.uniform(); break;  // upstream's tests: 0.5 * rand
      case Dist::bias: v = 0.5 * r.uniform(); break;
      case Dist::decay: v = -std::exp(std::log(1e-3) * r.uniform()); break;
    }
    put_real(dtype, p, v);
  }
  return h;
}

}  // namespace selscan_test
