// The CUDA decode kernel's launch plan (src/cuda/select.cpp, plan_state_update), checked on the CPU: which calls the
// lean kernel takes (one token, whole power-of-two lanes of 8 states, contiguous aligned state/B/C, A constant over
// n or aligned) and which the general one; which of the lean kernel's calls its small-grid form (kSmall) takes;
// lanes per channel from dstate; the general kernel's 16-byte loads only where every lane's states are contiguous
// and 16-byte aligned; and the multiply-shift division kSmall uses.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/select.h"
#include "state_update.h"
#include "state_update_case.h"

namespace selscan_test {
namespace {

using selscan::cuda::DecodeForce;

// The plan of a case's call, its tensors at their host addresses shifted by `shift` elements (misalignment), with
// the override `force` (lean: the lean kernel's choice, which the test shapes' small grids would otherwise give
// to kSmall).
selscan::StateUpdatePlan plan_of(StateUpdateCase& c, int64_t shift = 0, DecodeForce force = DecodeForce::lean) {
  selscan_state_update_args_t a = c.args(
      [shift](Tensor& t) { return static_cast<void*>(t.storage.data() + shift * t.esize()); }, c.idx_storage.data());
  selscan::StateUpdate p{};
  EXPECT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  return selscan::cuda::plan_state_update(p, force);
}

constexpr int kLean = selscan::StateUpdatePlan::kLean, kGeneral = selscan::StateUpdatePlan::kGeneral;
constexpr int kSmall = selscan::StateUpdatePlan::kSmall;

TEST(StateUpdatePlan, GeneralLanesCoverDstateInPowersOfTwo) {
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
    s.tokens = 2;  // the lean kernel takes one token
    StateUpdateCase c = make_state_update_case(s);
    const selscan::StateUpdatePlan plan = plan_of(c);
    EXPECT_EQ(plan.kernel, kGeneral) << s.str();
    EXPECT_EQ(plan.lanes, r.lanes) << s.str();
    EXPECT_EQ(1 << plan.lane_bits, plan.lanes);
    EXPECT_GE(plan.lanes * selscan::StateUpdatePlan::kStatesPerLane, r.dstate);
  }
}

// One token, contiguous and aligned: the lean kernel wherever dstate is a power-of-two number (<= 32) of lanes of
// 8 states (16 bytes of 16-bit state, 32 of fp32), every state dtype, in both forms, with or without a pool and
// destinations.
TEST(StateUpdatePlan, LeanWhereDstateIsWholeLanes) {
  const struct {
    int64_t dstate;
    int lanes;  // 0: the general kernel
  } rows[] = {{1, 0},  {2, 0},  {4, 0},  {8, 1},   {12, 0},  {16, 2},
              {24, 0}, {64, 8}, {128, 16}, {200, 0}, {256, 32}};
  for (const auto& r : rows)
    for (int32_t sd : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
      for (bool heads : {false, true}) {
        const bool f32 = sd == SELSCAN_DTYPE_FLOAT32;
        const int lanes = r.lanes;
        StateUpdateSpec s;
        s.heads = heads, s.headdim = 4, s.dstate = r.dstate, s.state_dtype = sd, s.has_z = true;
        s.itype = f32 ? SELSCAN_DTYPE_BFLOAT16 : sd;
        s.pool = 7, s.indices = {5, -1, 2};
        StateUpdateCase c = make_state_update_case(s);
        selscan::StateUpdatePlan plan = plan_of(c);
        EXPECT_EQ(plan.kernel, lanes > 0 ? kLean : kGeneral) << s.str();
        if (lanes == 0) continue;
        EXPECT_EQ(plan.lanes, lanes) << s.str();
        EXPECT_EQ(1 << plan.lane_bits, plan.lanes) << s.str();
        EXPECT_EQ(plan.lanes * selscan::StateUpdatePlan::kLeanStates, r.dstate);
        EXPECT_FALSE(plan.a_const) << s.str();  // A (.., N) contiguous: an exp a state
        EXPECT_TRUE(plan.vec_state && plan.vec_A && plan.vec_B && plan.vec_C) << s.str();

        s.dst = {6, 0, 4};  // destinations keep the lean kernel
        c = make_state_update_case(s);
        EXPECT_EQ(plan_of(c).kernel, kLean) << s.str();

        s.dst.clear();  // fp32 B and C: the lean kernel loads a lane's B and C in one 16-byte load each
        s.bc_dtype = SELSCAN_DTYPE_FLOAT32;
        c = make_state_update_case(s);
        EXPECT_EQ(plan_of(c).kernel, kGeneral) << s.str();  // 32 bytes of B and C a lane
      }
}

// Mamba-2's call (A, dt, D, dt_bias broadcast over the head dim, B and C (Bt, 1, N)) and Mamba-1's with a per-channel
// A: the lean kernel with one exp a thread.
TEST(StateUpdatePlan, LeanWithAConstantOverN) {
  for (int64_t N : {16, 128})
    for (int32_t sd : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
      for (bool heads : {false, true}) {
        StateUpdateSpec s;
        s.heads = heads, s.batch = 4, s.nheads = 6, s.headdim = 8, s.dstate = N, s.groups_dim = true;
        s.state_dtype = sd, s.itype = sd == SELSCAN_DTYPE_FLOAT32 ? SELSCAN_DTYPE_BFLOAT16 : sd;
        s.broadcast = true, s.has_z = true, s.pool = 9, s.indices = {8, -1, 3, 0};
        StateUpdateCase c = make_state_update_case(s);
        const selscan::StateUpdatePlan plan = plan_of(c);
        EXPECT_EQ(plan.kernel, kLean) << s.str();
        EXPECT_EQ(plan.lanes, N / 8) << s.str();
        EXPECT_TRUE(plan.a_const) << s.str();
        EXPECT_FALSE(plan.vec_A) << s.str();
      }
}

// SELSCAN_DECODE_KERNEL: "lean" gives the lean kernel where the call's layout allows it (as the default plan does),
// "general" keeps every call on the general kernel; anything else plans as by default.
TEST(StateUpdatePlan, DecodeKernelOverride) {
  EXPECT_EQ(selscan::cuda::parse_decode_force("lean"), DecodeForce::lean);
  EXPECT_EQ(selscan::cuda::parse_decode_force("general"), DecodeForce::general);
  EXPECT_EQ(selscan::cuda::parse_decode_force("small"), DecodeForce::small);
  EXPECT_EQ(selscan::cuda::parse_decode_force("small4"), DecodeForce::small4);
  EXPECT_EQ(selscan::cuda::parse_decode_force("auto"), DecodeForce::none);
  EXPECT_EQ(selscan::cuda::parse_decode_force(nullptr), DecodeForce::none);
  for (int32_t sd : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16})
    for (int64_t N : {16, 128}) {
      StateUpdateSpec s;
      s.heads = true, s.headdim = 4, s.dstate = N, s.state_dtype = sd, s.itype = SELSCAN_DTYPE_BFLOAT16;
      s.has_z = true, s.pool = 7, s.indices = {5, -1, 2};
      StateUpdateCase c = make_state_update_case(s);
      selscan_state_update_args_t a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); },
                                             c.idx_storage.data());
      selscan::StateUpdate p{};
      ASSERT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::none).kernel, kSmall) << s.str();  // a small grid
      const selscan::StateUpdatePlan lean = selscan::cuda::plan_state_update(p, DecodeForce::lean);
      EXPECT_EQ(lean.kernel, kLean) << s.str();
      EXPECT_EQ(lean.lanes * selscan::StateUpdatePlan::kLeanStates, N) << s.str();
      EXPECT_TRUE(lean.vec_state) << s.str();
      EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::general).kernel, kGeneral) << s.str();
      s.tokens = 2;  // what the lean kernel cannot serve stays general when forced
      c = make_state_update_case(s);
      a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); }, c.idx_storage.data());
      ASSERT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::lean).kernel, kGeneral) << s.str();
    }
}

// What the lean kernel leaves to the general one: several tokens, more than grid.y's 65535 sequences, states or
// B/C off their load's alignment or not contiguous over n.
TEST(StateUpdatePlan, GeneralOtherwise) {
  StateUpdateSpec s;
  s.heads = true, s.headdim = 4, s.dstate = 16, s.state_dtype = SELSCAN_DTYPE_BFLOAT16, s.itype = SELSCAN_DTYPE_BFLOAT16;
  StateUpdateCase c = make_state_update_case(s);
  ASSERT_EQ(plan_of(c).kernel, kLean);

  EXPECT_EQ(plan_of(c, 8).kernel, kLean);     // 8 elements later: 16 bytes, still on the loads' boundary
  EXPECT_EQ(plan_of(c, 4).kernel, kGeneral);  // 8 bytes off a 16-byte load
  EXPECT_EQ(plan_of(c, 1).kernel, kGeneral);

  selscan_state_update_args_t a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); },
                                         c.idx_storage.data());
  selscan::StateUpdate p{};
  ASSERT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  p.batch = 65535;
  EXPECT_EQ(selscan::cuda::plan_state_update(p).kernel, kLean);
  p.batch = 65536;  // the plan reads the sizes alone: no such tensors are needed
  EXPECT_EQ(selscan::cuda::plan_state_update(p).kernel, kGeneral);

  s.tokens = 2;
  c = make_state_update_case(s);
  EXPECT_EQ(plan_of(c).kernel, kGeneral);

  s.tokens = 1, s.padded = true;  // rows padded by 3 elements
  c = make_state_update_case(s);
  EXPECT_EQ(plan_of(c).kernel, kGeneral);
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

// fast_div (kSmall's c / headdim and h / heads_per_group) equals the integer division for every divisor kind
// (1, powers of two, odd, Mamba's 80 heads and 5120 channels, the largest) at the numerators where a wrong
// multiplier would first show: around multiples of d and at the top of the range.
TEST(StateUpdatePlan, FastDivIsExact) {
  const uint32_t divisors[] = {1, 2, 3, 5, 7, 64, 80, 96, 641, 5120, 65535, 65536, 1000003, (1u << 30) + 1,
                               (1u << 31) - 1};
  for (uint32_t d : divisors) {
    uint32_t mul = 0;
    int shift = 0;
    selscan::fast_divisor(d, &mul, &shift);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, (1u << 31) - 1, (1u << 31) - 2, (1u << 31) - d};
    for (uint32_t k : {2u, 3u, 1000u, 65537u})
      if (static_cast<uint64_t>(k) * d < (1u << 31)) ns.insert(ns.end(), {k * d - 1, k * d, k * d + 1});
    for (uint32_t n = 0; n < 5000; ++n) ns.push_back(n);
    for (uint32_t n : ns) {
      if (n >= (1u << 31)) continue;
      ASSERT_EQ(selscan::fast_div(n, mul, shift), n / d) << "n " << n << " d " << d;
    }
  }
}

// The default plan gives kSmall the lean kernel's calls of at most kSmallGridStates states (batch x channels x
// dstate) and the lean kernel the larger ones; kSmall's plan carries the lean lanes and the divisions it uses.
TEST(StateUpdatePlan, SmallForSmallGrids) {
  for (int32_t sd : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (bool pool : {false, true}) {
      StateUpdateSpec s;
      s.heads = true, s.nheads = 6, s.headdim = 4, s.dstate = 16, s.groups = 3, s.groups_dim = true;
      s.state_dtype = sd, s.itype = sd == SELSCAN_DTYPE_FLOAT32 ? SELSCAN_DTYPE_BFLOAT16 : sd, s.has_z = true;
      if (pool) s.pool = 7, s.indices = {5, -1, 2};
      StateUpdateCase c = make_state_update_case(s);
      selscan::StateUpdatePlan plan = plan_of(c, 0, DecodeForce::none);
      ASSERT_EQ(plan.kernel, kSmall) << s.str();
      EXPECT_EQ(plan.small_states, 8) << s.str();
      EXPECT_EQ(plan.lanes, 2) << s.str();
      EXPECT_EQ(plan.lane_bits, 1) << s.str();
      EXPECT_TRUE(plan.vec_state && plan.vec_B && plan.vec_C) << s.str();
      for (uint32_t ch = 0; ch < 24; ++ch) {
        const uint32_t h = selscan::fast_div(ch, plan.p_mul, plan.p_shift);
        EXPECT_EQ(h, ch / 4) << s.str();
        EXPECT_EQ(selscan::fast_div(h, plan.g_mul, plan.g_shift), h / 2) << s.str();  // 6 heads, 3 groups
      }
      // The lean plan is the same apart from the kernel.
      const selscan::StateUpdatePlan lean = plan_of(c, 0, DecodeForce::lean);
      EXPECT_EQ(lean.kernel, kLean) << s.str();
      EXPECT_EQ(lean.lanes, plan.lanes) << s.str();
      EXPECT_EQ(lean.a_const, plan.a_const) << s.str();

      // The threshold: 24 channels x 16 states = 384 a sequence.
      selscan_state_update_args_t a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); },
                                             c.idx_storage.data());
      selscan::StateUpdate p{};
      ASSERT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      p.batch = selscan::StateUpdatePlan::kSmallGridStates / 384;  // 2730: 1,048,320 states
      EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::none).kernel, kSmall) << s.str();
      p.batch += 1;  // 1,048,704 > 2^20
      EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::none).kernel, kLean) << s.str();
      EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kSmall) << s.str();
      p.batch = 65536;  // past grid.y: the general kernel whatever is asked
      EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kGeneral) << s.str();
    }
}

// SELSCAN_DECODE_KERNEL=small4: kSmall with 4 states a lane (twice the lanes) where dstate / 4 lanes fit a warp and
// the loads of 4 values are aligned; else kSmall's 8. `small` and `small4` never reach a call the lean kernel
// cannot serve (several tokens), and a channel whose offsets need 64 bits keeps the lean kernel.
TEST(StateUpdatePlan, SmallOverrides) {
  for (int32_t sd : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16})
    for (int64_t N : {16, 128, 256})
      for (bool broadcast : {false, true}) {
        StateUpdateSpec s;
        s.heads = true, s.headdim = 4, s.dstate = N, s.state_dtype = sd, s.itype = SELSCAN_DTYPE_BFLOAT16;
        s.broadcast = broadcast, s.has_z = true;
        StateUpdateCase c = make_state_update_case(s);
        const selscan::StateUpdatePlan p4 = plan_of(c, 0, DecodeForce::small4);
        ASSERT_EQ(p4.kernel, kSmall) << s.str();
        EXPECT_EQ(p4.small_states, N == 256 ? 8 : 4) << s.str();
        EXPECT_EQ(p4.lanes * p4.small_states, N) << s.str();
        EXPECT_EQ(1 << p4.lane_bits, p4.lanes) << s.str();
        EXPECT_EQ(p4.a_const, broadcast) << s.str();
        const selscan::StateUpdatePlan p8 = plan_of(c, 0, DecodeForce::small);
        EXPECT_EQ(p8.kernel, kSmall) << s.str();
        EXPECT_EQ(p8.small_states, 8) << s.str();
        EXPECT_EQ(p8.lanes * 8, N) << s.str();
        // kSmall serves only the lean kernel's calls: 8 bytes off the lean kernel's 16-byte loads is the general
        // kernel's, even where 4 16-bit states a lane would be aligned.
        if (sd == SELSCAN_DTYPE_BFLOAT16) EXPECT_EQ(plan_of(c, 4, DecodeForce::small4).kernel, kGeneral) << s.str();

        selscan_state_update_args_t a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); },
                                               c.idx_storage.data());
        selscan::StateUpdate p{};
        ASSERT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
        p.sx[2] = int64_t{1} << 30;  // x's head stride: (8 - 1) heads x 2^30 elements > 2^32
        EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kLean) << s.str();
        EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::none).kernel, kLean) << s.str();
        p.sx[2] = int64_t{1} << 29;  // 7 x 2^29 + 3 x sx[3] < 2^32
        EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kSmall) << s.str();
        // kSmall's parameter block holds the row strides in 32 bits too: a batch stride past 2^32 keeps the lean
        // kernel where the batch has more than one sequence, and is harmless (index 0 only) where it has one.
        const int64_t batch = p.batch, sB0 = p.sB[0], sstate0 = p.sstate[0], slots = p.slots;
        p.batch = 2, p.slots = 2;
        p.sB[0] = int64_t{1} << 32;
        EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kLean) << s.str();
        p.sB[0] = UINT32_MAX - 7;  // the largest that fits and keeps B's 16-byte loads aligned
        EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kSmall) << s.str();
        p.batch = 1, p.slots = 1;
        p.sB[0] = int64_t{1} << 40;
        EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kSmall) << s.str();
        p.sB[0] = sB0;
        p.slots = 3;  // the slot stride counts over the pool, not the batch
        p.sstate[0] = int64_t{1} << 32;
        EXPECT_EQ(selscan::cuda::plan_state_update(p, DecodeForce::small).kernel, kLean) << s.str();
        p.batch = batch, p.sstate[0] = sstate0, p.slots = slots;

        s.tokens = 2;
        c = make_state_update_case(s);
        EXPECT_EQ(plan_of(c, 0, DecodeForce::small).kernel, kGeneral) << s.str();
        EXPECT_EQ(plan_of(c, 0, DecodeForce::small4).kernel, kGeneral) << s.str();
      }
}

}  // namespace
}  // namespace selscan_test
