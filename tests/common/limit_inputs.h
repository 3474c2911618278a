// The input values of tests/gpu/test_gpu_limits.cpp's run_limit (a seeded pattern per tensor), shared so that a
// CPU test can rebuild the very problem a GPU limits case ran (tests/cpu/test_conditioning_bwd.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "selscan/selscan.h"
#include "tensor.h"

namespace selscan_test {

// What an input holds. `decay` is A: real A log-uniform in [-1, -1e-3] (slow states carry across chunks and
// through long sequences), complex A with some damping (re in [-0.5, -0.02]) and fast rotation (im ~ 2 N(0,1)).
enum class Dist { normal, delta, bias, decay };

// n elements of `dtype` (bytes), drawn from `dist` with `seed`.
inline std::vector<unsigned char> limit_pattern(int32_t dtype, Dist dist, int64_t n, uint64_t seed) {
  const int64_t es = dtype_size(dtype);
  std::vector<unsigned char> h(static_cast<size_t>(n * es));
  Rng r(seed);
  for (int64_t i = 0; i < n; ++i) {
    unsigned char* p = h.data() + i * es;
    if (dtype == SELSCAN_DTYPE_COMPLEX64) {
      const bool a = dist == Dist::decay;
      const double re = a ? -0.02 - 0.48 * r.uniform() : r.normal();
      const double im = a ? 2.0 * r.normal() : r.normal();
      store_real(SELSCAN_DTYPE_FLOAT32, p, re);
      store_real(SELSCAN_DTYPE_FLOAT32, p + 4, im);
      continue;
    }
    double v = 0.0;
    switch (dist) {
      case Dist::normal: v = r.normal(); break;
      case Dist::delta: v = 0.5 * r.uniform(); break;  // upstream's tests: 0.5 * rand
      case Dist::bias: v = 0.5 * r.uniform(); break;
      case Dist::decay: v = -std::exp(std::log(1e-3) * r.uniform()); break;
    }
    store_real(dtype, p, v);
  }
  return h;
}

}  // namespace selscan_test
