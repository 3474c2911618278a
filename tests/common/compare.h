// Tolerances (upstream's tables, tests/data/golden/README.md), the conditioning-aware bound of out/out_z, and a
// GoogleTest allclose with a useful message.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "selscan/selscan.h"
#include "support/dtype.h"

namespace selscan_test {

using namespace selscan_support;

struct Tol {
  double rtol, atol;
  Tol scaled(double r, double a) const { return {rtol * r, atol * a}; }
  Tol at_least(const Tol& o) const { return {std::max(rtol, o.rtol), std::max(atol, o.atol)}; }
};

// Output tolerance of an itype: fp32 (6e-4, 2e-3), fp16 (3e-3, 5e-3), bf16 (3e-2, 5e-2).
inline Tol tol_out(int32_t itype) {
  switch (itype) {
    case SELSCAN_DTYPE_FLOAT16: return {3e-3, 5e-3};
    case SELSCAN_DTYPE_BFLOAT16: return {3e-2, 5e-2};
    default: return {6e-4, 2e-3};
  }
}

// The per-output tolerances of upstream's test_selective_scan.
struct Tolerances {
  Tol out, last_state, du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0, x;
};
inline Tolerances upstream_tolerances(int32_t itype, bool has_z, bool var_B, bool var_C) {
  const Tol o = tol_out(itype);
  Tol w{1e-3, 1e-3};
  if (has_z) w = w.at_least(o);
  Tolerances t;
  t.out = o;
  t.last_state = o;
  t.x = o;
  t.du = o.scaled(2, 2);
  t.ddelta = o.scaled(5, 10);
  t.dA = w.scaled(1, 5);
  t.dB = var_B ? o : w;
  t.dC = var_C ? o : w;
  t.dD = w;
  t.dz = w;
  t.ddelta_bias = w;
  t.dh0 = o.scaled(2, 2);  // not in upstream; as du
  return t;
}

// The conditioning-aware output tolerance (docs/numerics.md, "Conditioning-aware output tolerance"): out and
// out_z may differ from the float64 reference by max(atol + rtol |ref|, k u cond), where u = 2^-24 is fp32's
// unit roundoff and cond is the reference's running first-order error bound of the element in units of u
// (RefFwd::cond_y / cond_out_z). Upstream's tolerance stays the floor: the bound only takes over for elements
// whose fp32 error bound exceeds it (slowly decaying states whose terms cancel in the output).
// k = 4: the per-step relative error, in units of u, that fp32 arithmetic with fast-math exp2/sincos may
// accumulate coherently over a state's memory.
inline constexpr double kU32 = 0x1p-24;
inline constexpr double kCondK = 4.0;

// Per-element bound scale * k u cond (scale = 2 when both compared values carry fp32 error, as GPU vs CPU
// path; else a test's tolerance scale).
inline std::vector<double> cond_bound(const std::vector<double>& cond, double scale = 1.0, double k = kCondK) {
  std::vector<double> a(cond.size());
  for (size_t i = 0; i < cond.size(); ++i) a[i] = scale * k * kU32 * cond[i];
  return a;
}

// The limit of element i: atol + rtol |ref|, or bound[i] where that is larger.
inline double limit_at(const std::vector<double>& ref, Tol tol, const std::vector<double>* bound, size_t i) {
  const double lim = tol.atol + tol.rtol * std::fabs(ref[i]);
  return bound ? std::max(lim, (*bound)[i]) : lim;
}

// |got - ref| <= limit elementwise (NaN never passes; without `bound` the limit is atol + rtol |ref|). Reports
// how many fail and the worst one.
inline ::testing::AssertionResult allclose(const std::string& what, const std::vector<double>& got,
                                           const std::vector<double>& ref, Tol tol,
                                           const std::vector<double>* bound = nullptr) {
  if (got.size() != ref.size() || (bound && bound->size() != ref.size())) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs reference " << ref.size()
                                         << (bound ? " vs bound " + std::to_string(bound->size()) : "");
  }
  int64_t bad = 0, worst = -1;
  double worst_excess = -1.0, max_abs = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    const double lim = limit_at(ref, tol, bound, i);
    if (!(err <= lim)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err / lim;
      if (excess > worst_excess) worst_excess = excess, worst = static_cast<int64_t>(i);
    }
    if (err > max_abs || std::isnan(err)) max_abs = std::isnan(err) ? NAN : std::max(max_abs, err);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << what << ": " << bad << " of " << got.size() << " elements outside (rtol " << tol.rtol << ", atol "
     << tol.atol << (bound ? ", or k u cond where larger" : "") << "); worst at flat index " << worst << ": got "
     << got[static_cast<size_t>(worst)] << ", ref " << ref[static_cast<size_t>(worst)];
  if (bound) os << ", k u cond " << (*bound)[static_cast<size_t>(worst)];
  os << "; max |err| " << max_abs;
  return ::testing::AssertionFailure() << os.str();
}

// Largest |got - ref| / limit (for reporting margins).
inline double worst_ratio(const std::vector<double>& got, const std::vector<double>& ref, Tol tol,
                          const std::vector<double>* bound = nullptr) {
  double w = 0.0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i)
    w = std::max(w, std::fabs(got[i] - ref[i]) / limit_at(ref, tol, bound, i));
  return w;
}

// The element of largest |ref| (the first of equals): where a wrong value matters most.
inline size_t largest_at(const std::vector<double>& ref) {
  size_t big = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (std::fabs(ref[i]) > std::fabs(ref[big])) big = i;
  return big;
}

// The power of a conditioning-aware comparison (tests/cpu/test_conditioning*.cpp): a 1% error put into `got`
// at ref's largest element fails allclose, reported as exactly that one element. Returns at how many elements
// a 1% error (0.01 |ref|) exceeds the limit, with `bound` and with upstream's tolerance alone.
struct Caught {
  int64_t with_bound = 0, upstream = 0;
};
inline Caught expect_one_percent_error_caught(const std::string& what, const std::vector<double>& got,
                                              const std::vector<double>& ref, Tol tol,
                                              const std::vector<double>* bound) {
  const size_t big = largest_at(ref);
  std::vector<double> bad = got;
  bad[big] = ref[big] * 1.01;  // 1e-2 relative error
  const ::testing::AssertionResult res = allclose(what, bad, ref, tol, bound);
  EXPECT_FALSE(res) << "a 1% error at element " << big << " (ref " << ref[big] << ") passed";
  const std::string msg = res.message();
  EXPECT_NE(msg.find(" 1 of " + std::to_string(ref.size()) + " elements"), std::string::npos) << msg;
  EXPECT_NE(msg.find("flat index " + std::to_string(big) + ":"), std::string::npos) << msg;
  Caught c;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = 0.01 * std::fabs(ref[i]);
    c.with_bound += err > limit_at(ref, tol, bound, i);
    c.upstream += err > limit_at(ref, tol, nullptr, i);
  }
  return c;
}

// Rounds reference values to an itype as the compared output is (upstream compares u.grad.to(itype)).
inline std::vector<double> round_to(const std::vector<double>& v, int32_t itype) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to_dtype(itype, v[i]);
  return r;
}

}  // namespace selscan_test
