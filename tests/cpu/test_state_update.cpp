// The decode step (selscan_state_update) on the CPU path against the float64 oracle: the shared matrix (both
// forms, every optional input, T > 1, groups, broadcast inputs, state pools with padding and out-of-pool
// entries, 16-bit states, padded layouts), several threads, and serving's equivalence with the scan (prefill,
// then decode steps).
#include <gtest/gtest.h>

#include <vector>

#include "state_update_case.h"

namespace selscan_test {
namespace {

void run_and_check(const StateUpdateSpec& spec, int threads = 1) {
  const StateUpdateCase before = make_state_update_case(spec);
  StateUpdateCase c = before;
  ASSERT_EQ(run_state_update(c, cpu_exec(threads)), SELSCAN_STATUS_SUCCESS) << spec.str() << ": "
                                                                             << selscan_last_error();
  expect_state_update_ok(c, before);
}

class CpuStateUpdate : public ::testing::TestWithParam<NamedStateUpdateSpec> {};

TEST_P(CpuStateUpdate, MatchesTheOracle) { run_and_check(GetParam().spec); }

INSTANTIATE_TEST_SUITE_P(Matrix, CpuStateUpdate, ::testing::ValuesIn(state_update_matrix()),
                         [](const auto& info) { return info.param.name; });

TEST(CpuStateUpdateThreads, ManyThreadsMatchTheOracle) {
  // Large enough that the call splits into tasks on several workers.
  StateUpdateSpec s;
  s.batch = 9, s.nheads = 600, s.dstate = 16, s.pool = 20, s.has_z = true, s.tokens = 2, s.seed = 1100;
  run_and_check(s, 2);
  run_and_check(s, 0);
}

TEST(CpuStateUpdateEquivalence, PrefillThenDecodeEqualsOneScan) {
  uint64_t seed = 1200;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16})
    for (int64_t per_call : {1, 3})
      for (int64_t G : {1, 2}) {
        PrefillDecodeSpec s;
        s.itype = it, s.tokens_per_call = per_call, s.groups = G, s.seed = ++seed;
        expect_prefill_then_decode_equals_scan(s, cpu_exec(1));
      }
  PrefillDecodeSpec s;  // a prefill past the scan's 2048-token chunk, no optional inputs
  s.prefill = 2100, s.has_D = s.has_z = s.has_bias = s.softplus = false, s.seed = ++seed;
  expect_prefill_then_decode_equals_scan(s, cpu_exec(2));
}

}  // namespace
}  // namespace selscan_test
