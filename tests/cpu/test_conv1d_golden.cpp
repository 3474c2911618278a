// causal-conv1d's golden vectors (tests/data/conv1d_golden) against selscan's CPU path: the forward, the
// backward (both reduction modes) and the decode update of every case, at the limits make_goldens.py checked
// upstream with (tests/data/conv1d_golden/README.md once generated).
#include <gtest/gtest.h>

#include "conv1d_golden.h"

namespace selscan_test {
namespace {

// Skips, saying why, while the set is not generated; fails when cases.json names a missing file.
TEST(CpuConv1dGoldenFiles, Present) { expect_conv1d_golden_files(); }

class CpuConv1dGolden : public ::testing::TestWithParam<std::string> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CpuConv1dGolden);  // no cases before the set is generated

TEST_P(CpuConv1dGolden, MatchesUpstream) {
  Conv1dGolden g;
  const std::string err = load_conv1d_golden(GetParam(), &g);
  ASSERT_TRUE(err.empty()) << err;
  check_conv1d_golden(g, cpu_exec(2), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuConv1dGolden, ::testing::ValuesIn(conv1d_golden_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace selscan_test
