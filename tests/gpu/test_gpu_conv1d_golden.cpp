// causal-conv1d's golden vectors (tests/data/conv1d_golden) against selscan's CUDA kernels: the forward, the
// backward (both reduction modes) and the decode update of every case on device copies of the inputs, at the
// limits make_goldens.py checked upstream with. Guards around every tensor come back and are checked.
#include <gtest/gtest.h>

#include "conv1d_golden.h"
#include "cuda_memory.h"
#include "gpu_gate.h"

namespace selscan_test {
namespace {

TEST(GpuConv1dGoldenFiles, Present) { expect_conv1d_golden_files(); }

class GpuConv1dGolden : public ::testing::TestWithParam<std::string> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GpuConv1dGolden);  // no cases before the set is generated

TEST_P(GpuConv1dGolden, MatchesUpstream) {
  REQUIRE_GPU();
  Conv1dGolden g;
  const std::string err = load_conv1d_golden(GetParam(), &g);
  ASSERT_TRUE(err.empty()) << err;
  static const DeviceMemory dev = cuda_memory();
  check_conv1d_golden(g, cuda_exec(), &dev);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuConv1dGolden, ::testing::ValuesIn(conv1d_golden_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace selscan_test
