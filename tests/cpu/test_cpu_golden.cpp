// Every upstream golden case (tests/data/golden): the CPU forward and backward vs the outputs of upstream's
// selective_scan_cuda, at upstream's own tolerances.
#include <gtest/gtest.h>

#include "golden.h"
#include "check.h"

namespace selscan_test {
namespace {

class CpuGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuGolden, ForwardAndBackward) {
  GoldenCase g;
  Case c;
  const std::string err = load_golden_case(GetParam(), &g, &c);
  ASSERT_TRUE(err.empty()) << err;
  const CaseSpec& s = c.spec;
  SCOPED_TRACE(g.name + ": " + s.str());
  const Tolerances tol = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);

  ASSERT_EQ(run_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  // The golden `out` is the final output: out_z when z is given.
  EXPECT_TRUE(allclose("out", (s.has_z ? c.out_z : c.out).values(), golden_values(g, "out"), tol.out));
  EXPECT_TRUE(allclose("last_state", c.last_state.values(), golden_values(g, "last_state"), tol.last_state));

  ASSERT_EQ(run_bwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  EXPECT_TRUE(allclose("du", c.du.values(), golden_values(g, "du"), tol.du));
  EXPECT_TRUE(allclose("ddelta", c.ddelta.values(), golden_values(g, "ddelta"), tol.ddelta));
  EXPECT_TRUE(allclose("dA", c.dA.values(), golden_values(g, "dA"), tol.dA));
  EXPECT_TRUE(allclose("dB", c.dB.values(), golden_values(g, "dB"), tol.dB));
  EXPECT_TRUE(allclose("dC", c.dC.values(), golden_values(g, "dC"), tol.dC));
  if (s.has_D) EXPECT_TRUE(allclose("dD", c.dD.values(), golden_values(g, "dD"), tol.dD));
  if (s.has_z) EXPECT_TRUE(allclose("dz", c.dz.values(), golden_values(g, "dz"), tol.dz));
  if (s.has_delta_bias)
    EXPECT_TRUE(allclose("ddelta_bias", c.ddelta_bias.values(), golden_values(g, "ddelta_bias"), tol.ddelta_bias));
}

// The golden files must be there: an empty list would silently test nothing.
TEST(CpuGoldenFiles, Present) {
  EXPECT_GE(golden_case_names().size(), 8u) << "golden dir: " << golden_dir();
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuGolden, ::testing::ValuesIn(golden_case_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace selscan_test
