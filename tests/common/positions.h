// GPU vs CPU path position by position (tests/gpu/test_gpu_limits.cpp's non-finite tests), shared with the CPU
// test that rebuilds their explosive cases (tests/cpu/test_conditioning_explosive.cpp): non-finite values at the
// same positions, finite values within upstream's tolerance or, in the oracle-backed explosive comparison,
// 2 k u cond where larger (docs/numerics.md, "Conditioning-aware tolerance of the explosive comparison").
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "case.h"
#include "compare.h"
#include "support/reference.h"

namespace selscan_test {

// Explosive A: float32 intermediates overflow long before float64 values do. Where the float64 oracle is finite
// but beyond this, the two float32 paths may legitimately differ (one overflows, the other not yet).
inline constexpr double kBig = 1e30;

// The cases of GpuLimitsNonFinite.ExplosiveAAtCpuPositions, in its order, shared with the CPU tests that rebuild
// them (tests/cpu/test_conditioning_explosive.cpp, test_conditioning_bwd.cpp): batch 1, dim 3, dstate 8, no
// softplus and no delta_bias, delta in [4, 8); loops L (64, 2100), itype (fp32, fp16), complex, variable B/C;
// seeds 67001... `det`: the deterministic backward (even case numbers), else the atomic one.
struct ExplosiveCase {
  CaseSpec spec;
  bool det;
};
std::vector<ExplosiveCase> explosive_cases();
// Every A of `c` set to the explosive rate: 0.25 + n/16 at L = 64, else 0.0125 (imaginary part 1 for complex
// weights). Positive rates with large delta: float32 states overflow within a few dozen steps at L = 64, after
// ~1200 at L = 2100 (across the chunk boundary).
void set_explosive_A(Case& c);

struct Outcome {
  int64_t finite = 0, nonfinite = 0, kind_differs = 0, indeterminate = 0;
};

// GPU vs CPU path position by position: non-finite at the same positions (a complex value counts as
// non-finite when either part is), finite values within `tol`. NaN vs Inf is tallied, not required: the two
// paths associate products differently (0 * inf on one, inf on the other). `band`: the float64 oracle's
// magnitudes; where one is finite but beyond kBig the float32 paths may legitimately differ, so it is skipped.
// `bound` (an oracle-backed case): finite values may also differ by bound[k] where that is larger than `tol`
// (2 k u cond, docs/numerics.md).
::testing::AssertionResult same_positions(const std::string& what, const std::vector<double>& gpu,
                                          const std::vector<double>& cpu, Tol tol, bool pairs,
                                          const std::vector<double>* band, Outcome& o,
                                          const std::vector<double>* bound = nullptr);

// Upstream's tolerance of an output, by the names of Case::named_fwd_outputs / named_bwd_outputs.
Tol tol_of(const Tolerances& t, const std::string& name);

// The oracle's values of an output, in the order of Tensor::values(); for dz and the gated outputs also the
// pre-gate y where it is larger (those are formed from y).
std::vector<double> oracle_of(const std::string& name, const Case& c, const RefFwd& f, const RefBwd& g);

// scale * k u cond of every element of an output, in the order of Tensor::values(), from the reference's
// condition scales (f = ref_forward(p, true), g = ref_backward(p, dout, true)): out/out_z(/out_z(bwd)) cond_y /
// cond_out_z, x cond_xP / cond_xH, last_state, the per-step gradients du, ddelta, dz, dh0 and the reduced
// gradients dA, dB, dC, dD, ddelta_bias. scale = 2 for GPU vs CPU path (both carry fp32 error).
std::vector<double> cond_bound_of(const std::string& name, const Case& c, const RefFwd& f, const RefBwd& g,
                                  double scale);

}  // namespace selscan_test
