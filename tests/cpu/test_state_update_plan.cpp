// The CUDA decode kernel's launch plan (src/cuda/select.cpp, plan_state_update), checked on the CPU: lanes per
// channel from dstate, and 16-byte loads only where every lane's states are contiguous and 16-byte aligned.
#include <gtest/gtest.h>

#include "cuda/select.h"
#include "state_update.h"
#include "state_update_case.h"

namespace selscan_test {
namespace {

// The plan of a case's call, its tensors at their host addresses shifted by `shift` elements (misalignment).
selscan::StateUpdatePlan plan_of(StateUpdateCase& c, int64_t shift = 0) {
  selscan_state_update_args_t a = c.args(
      [shift](Tensor& t) { return static_cast<void*>(t.storage.data() + shift * t.esize()); }, c.idx_storage.data());
  selscan::StateUpdate p{};
  EXPECT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  return selscan::cuda::plan_state_update(p);
}

TEST(StateUpdatePlan, LanesCoverDstateInPowersOfTwo) {
  const struct {
    int32_t state_dtype;
    int64_t dstate;
    int lanes;
  } rows[] = {{SELSCAN_DTYPE_FLOAT32, 1, 1},   {SELSCAN_DTYPE_FLOAT32, 4, 1},    {SELSCAN_DTYPE_FLOAT32, 8, 1},
              {SELSCAN_DTYPE_FLOAT32, 9, 2},   {SELSCAN_DTYPE_FLOAT32, 16, 2},   {SELSCAN_DTYPE_FLOAT32, 24, 4},
              {SELSCAN_DTYPE_FLOAT32, 64, 8},  {SELSCAN_DTYPE_FLOAT32, 128, 16}, {SELSCAN_DTYPE_FLOAT32, 200, 32},
              {SELSCAN_DTYPE_FLOAT32, 256, 32}, {SELSCAN_DTYPE_BFLOAT16, 16, 2}, {SELSCAN_DTYPE_BFLOAT16, 256, 32}};
  for (const auto& r : rows) {
    StateUpdateSpec s;
    s.dstate = r.dstate;
    s.itype = r.state_dtype;
    s.state_dtype = r.state_dtype;
    StateUpdateCase c = make_state_update_case(s);
    const selscan::StateUpdatePlan plan = plan_of(c);
    EXPECT_EQ(plan.lanes, r.lanes) << s.str();
    EXPECT_EQ(1 << plan.lane_bits, plan.lanes);
    EXPECT_GE(plan.lanes * selscan::StateUpdatePlan::kStatesPerLane, r.dstate);
  }
}

TEST(StateUpdatePlan, VectorLoadsWhereContiguousAndAligned) {
  for (bool heads : {false, true})
    for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16}) {
      StateUpdateSpec s;
      s.heads = heads, s.headdim = 4, s.itype = it, s.state_dtype = it, s.pool = 6;
      StateUpdateCase c = make_state_update_case(s);
      selscan::StateUpdatePlan plan = plan_of(c);
      EXPECT_TRUE(plan.vec_state && plan.vec_A && plan.vec_B && plan.vec_C) << s.str();
      plan = plan_of(c, 1);  // element-aligned, never 16-byte aligned
      EXPECT_FALSE(plan.vec_state || plan.vec_A || plan.vec_B || plan.vec_C) << s.str();
    }
}

TEST(StateUpdatePlan, ScalarLoadsOtherwise) {
  StateUpdateSpec s;
  s.dstate = 12;  // lanes of 8 states would end mid-vector
  StateUpdateCase c = make_state_update_case(s);
  selscan::StateUpdatePlan plan = plan_of(c);
  EXPECT_FALSE(plan.vec_state || plan.vec_A || plan.vec_B || plan.vec_C);

  s = StateUpdateSpec{};
  s.padded = true;  // rows padded by 3 elements: strides off 16-byte boundaries
  c = make_state_update_case(s);
  plan = plan_of(c);
  EXPECT_FALSE(plan.vec_state || plan.vec_A || plan.vec_B || plan.vec_C);

  s = StateUpdateSpec{};
  s.heads = true, s.headdim = 4, s.broadcast = true;  // A (H, P, N) with strides (1, 0, 0)
  c = make_state_update_case(s);
  plan = plan_of(c);
  EXPECT_FALSE(plan.vec_A);
  EXPECT_TRUE(plan.vec_state && plan.vec_B && plan.vec_C);
}

}  // namespace
}  // namespace selscan_test
