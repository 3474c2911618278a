// Portable random numbers for test and benchmark inputs: std::mt19937_64 is specified bit for bit (the standard
// distributions are not, so uniform and normal are written here), so a seed gives the same values everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace selscan_support {

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  // [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(g_() >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // N(0, 1) by Box-Muller (one value per call).
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::mt19937_64 g_;
};

}  // namespace selscan_support
