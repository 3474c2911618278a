// End-to-end cases at the edges of a rule, checked with check_case against the float64 reference by both the
// CPU suite (tests/cpu/test_cpu_matrix.cpp) and the GPU suite (tests/gpu/test_gpu_limits.cpp, GpuEdges), so
// that the two run the same problems.
#pragma once

#include <string>
#include <vector>

#include "case.h"

namespace selscan_test {

struct NamedSpec {
  std::string name;
  CaseSpec spec;
};

// softplus on, with the pre-softplus delta (delta + delta_bias) in [1, 17.5): below the threshold 20 above which
// softplus(v) is taken as v, but where softplus(v) - v (0.31 at v = 1, 0.13 at 2, 7e-3 at 5) and its
// derivative's 1 - sigmoid(v) (0.27, 0.12, 7e-3) still matter. A threshold moved down into this range changes
// out and every delta gradient. dstate 16 is one the thread-states kernels serve.
inline std::vector<NamedSpec> softplus_mid_range_cases() {
  std::vector<NamedSpec> v;
  CaseSpec a = case_spec(2, 8, 300, 16, SELSCAN_DTYPE_FLOAT32);
  a.delta_lo = 1.0, a.delta_hi = 17.0, a.seed = 1200;
  v.push_back({"fp32_bias", a});
  CaseSpec b = case_spec(2, 6, 150, 8, SELSCAN_DTYPE_BFLOAT16, 2);
  b.var_B = false, b.has_delta_bias = false, b.delta_lo = 1.0, b.delta_hi = 17.0, b.seed = 1201;
  v.push_back({"bf16_constB_groups2_nobias", b});
  CaseSpec c = case_spec(1, 4, 100, 4, SELSCAN_DTYPE_FLOAT16);
  c.complex = true, c.has_h0 = true, c.delta_lo = 1.0, c.delta_hi = 17.0, c.seed = 1202;
  v.push_back({"fp16_complex_h0", c});
  return v;
}

// A backward at exactly one chunk (L = 2048) without the forward's chunk states x: x is required only when
// L > 2048 (tests/cpu/test_validation.cpp checks that L = 2049 needs it), so this call must succeed and agree
// with the reference.
inline std::vector<NamedSpec> one_chunk_without_x_cases() {
  std::vector<NamedSpec> v;
  CaseSpec a = case_spec(2, 4, 2048, 8, SELSCAN_DTYPE_FLOAT32);
  a.with_x = false, a.seed = 1210;
  v.push_back({"fp32", a});
  CaseSpec b = case_spec(1, 6, 2048, 16, SELSCAN_DTYPE_BFLOAT16, 2);
  b.with_x = false, b.var_C = false, b.has_h0 = true, b.slow_decay = true, b.seed = 1211;
  v.push_back({"bf16_constC_h0_slow", b});
  CaseSpec c = case_spec(1, 3, 2048, 4, SELSCAN_DTYPE_FLOAT16);
  c.with_x = false, c.complex = true, c.seed = 1212;
  v.push_back({"fp16_complex", c});
  return v;
}

}  // namespace selscan_test
