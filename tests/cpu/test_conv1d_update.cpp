// The causal conv1d's decode update on the CPU against the float64 reference (tests/common/conv1d_case.h): the
// shared matrix (dtypes, widths, tokens, the shifting state and the circular buffer, slots and padding, gaps), the
// thread count, the device runner on host copies, and T tokens in one call equal to T calls of one token.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compare.h"
#include "conv1d_case.h"

namespace selscan_test {
namespace {

class CpuConv1dUpdateMatrix : public ::testing::TestWithParam<NamedConv1dUpdateSpec> {};

TEST_P(CpuConv1dUpdateMatrix, MatchesReference) {
  const Conv1dUpdateCase before = make_conv1d_update_case(GetParam().spec);
  Conv1dUpdateCase c = before;
  ASSERT_EQ(run_conv1d_update(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  expect_conv1d_update_ok(c, before);
}

INSTANTIATE_TEST_SUITE_P(Conv1d, CpuConv1dUpdateMatrix, ::testing::ValuesIn(conv1d_update_matrix()),
                         [](const ::testing::TestParamInfo<NamedConv1dUpdateSpec>& i) { return i.param.name; });

TEST(CpuConv1dUpdate, ThreadCountsGiveTheSameBytes) {
  Conv1dUpdateSpec s;
  s.batch = 9, s.dim = 300, s.tokens = 3, s.state_len = 7, s.slots = 12, s.itype = SELSCAN_DTYPE_BFLOAT16;
  s.cache_seqlens = {0, 1, 2, 3, 4, 5, 6, 7, 100}, s.seed = 6500;
  const Conv1dUpdateCase before = make_conv1d_update_case(s);
  Conv1dUpdateCase first = before;
  ASSERT_EQ(run_conv1d_update(first, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  expect_conv1d_update_ok(first, before);
  for (int threads : {2, 5, 0}) {
    Conv1dUpdateCase c = before;
    ASSERT_EQ(run_conv1d_update(c, cpu_exec(threads)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    EXPECT_TRUE(c.out.same_bytes(first.out)) << threads << " threads";
    EXPECT_TRUE(c.state.same_bytes(first.state)) << threads << " threads";
  }
}

TEST(CpuConv1dUpdate, DeviceRunnerOnHostCopies) {
  int live = 0;
  const DeviceMemory dev = host_device_memory(&live);
  Conv1dUpdateSpec s;
  s.batch = 4, s.slots = 6, s.indices = {5, -1, 0, 2}, s.tokens = 2, s.cache_seqlens = {3, 0, 1, 9}, s.strided = true;
  s.seed = 6501;
  const Conv1dUpdateCase before = make_conv1d_update_case(s);
  Conv1dUpdateCase c = before;
  ASSERT_EQ(run_conv1d_update(c, cpu_exec(2), &dev), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  expect_conv1d_update_ok(c, before);
  EXPECT_EQ(live, 0);
}

// T tokens in one call and the same tokens one call each leave the same state and give the same outputs: for the
// shifting state (state_len above, at and below T, so the shift moves old columns, new ones or both) and for the
// circular buffer (the position advancing by one a call).
TEST(CpuConv1dUpdate, TokensAtOnceEqualTokensOneByOne) {
  uint64_t seed = 6600;
  for (int64_t W : {2, 4})
    for (int64_t SL : {W - 1, int64_t{5}, int64_t{9}})
      for (int64_t T : {2, 5, 7})
        for (bool circular : {false, true}) {
          Conv1dUpdateSpec s;
          s.batch = 3, s.dim = 4, s.width = W, s.state_len = SL, s.tokens = T, s.seed = ++seed;
          s.itype = SELSCAN_DTYPE_FLOAT16, s.state_dtype = SELSCAN_DTYPE_FLOAT16;
          if (circular) s.cache_seqlens = {0, 3, 11};
          const std::string what = s.str();
          const Conv1dUpdateCase before = make_conv1d_update_case(s);
          Conv1dUpdateCase all = before;
          ASSERT_EQ(run_conv1d_update(all, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
          // One token a call, through views of the same x and out.
          Conv1dUpdateCase one = before;
          one.out.fill_bytes(kPoison);
          Tensor seqlens = make_tensor(SELSCAN_DTYPE_INT32, {s.batch});
          const selscan_exec_t e = cpu_exec(1);
          for (int64_t t = 0; t < T; ++t) {
            selscan_conv1d_update_args_t a = one.args(host_ptr);
            a.x.data = static_cast<unsigned char*>(a.x.data) + t * one.x.strides[2] * one.x.esize();
            a.out.data = static_cast<unsigned char*>(a.out.data) + t * one.out.strides[2] * one.out.esize();
            a.x.sizes[2] = a.out.sizes[2] = 1;
            if (circular) {
              for (int64_t b = 0; b < s.batch; ++b)
                seqlens.set({b}, static_cast<double>(s.cache_seqlens[static_cast<size_t>(b)] + t));
              a.cache_seqlens = seqlens.desc();
            }
            ASSERT_EQ(selscan_conv1d_update(&a, &e), SELSCAN_STATUS_SUCCESS) << what << ": " << selscan_last_error();
          }
          EXPECT_TRUE(one.out.same_bytes(all.out)) << what << ": outputs differ";
          EXPECT_TRUE(one.state.same_bytes(all.state)) << what << ": states differ";
        }
}

}  // namespace
}  // namespace selscan_test
