// The decode step (selscan_state_update) on the CPU path against the float64 oracle: both forms, every optional
// input, T > 1, groups, broadcast inputs, state pools with padding and out-of-pool entries, 16-bit states,
// padded layouts, several threads; and serving's equivalence with the scan (prefill, then decode steps).
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

constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;

TEST(CpuStateUpdate, Mamba1FormDtypesAndGate) {
  uint64_t seed = 100;
  for (int32_t it : {kF32, kF16, kBF16})
    for (int32_t sd : {kF32, it})
      for (bool z : {false, true}) {
        StateUpdateSpec s;
        s.batch = 3, s.nheads = 24, s.dstate = 16;
        s.itype = it, s.state_dtype = sd, s.has_z = z, s.seed = ++seed;
        run_and_check(s);
      }
}

TEST(CpuStateUpdate, HeadsFormGroupsAndBroadcast) {
  uint64_t seed = 200;
  for (int32_t it : {kF32, kBF16})
    for (int64_t G : {1, 2, 3})
      for (bool bcast : {false, true}) {
        StateUpdateSpec s;
        s.heads = true, s.batch = 2, s.nheads = 6, s.headdim = 8, s.dstate = 16, s.groups = G;
        s.groups_dim = true, s.itype = it, s.has_z = true, s.broadcast = bcast, s.seed = ++seed;
        run_and_check(s);
      }
}

TEST(CpuStateUpdate, Mamba1FormGroupedBC) {
  StateUpdateSpec s;
  s.batch = 2, s.nheads = 24, s.groups = 4, s.has_z = true, s.seed = 300;
  run_and_check(s);
  s.groups = 1, s.groups_dim = true, s.seed = 301;  // (Bt, 1, N): a groups dim of size 1
  run_and_check(s);
}

TEST(CpuStateUpdate, EveryCombinationOfOptionalInputs) {
  uint64_t seed = 400;
  for (int mask = 0; mask < 16; ++mask)
    for (bool heads : {false, true}) {
      StateUpdateSpec s;
      s.heads = heads, s.nheads = 5, s.headdim = 4, s.dstate = 8;
      s.has_D = mask & 1, s.has_z = mask & 2, s.has_bias = mask & 4, s.softplus = mask & 8, s.seed = ++seed;
      run_and_check(s);
    }
}

TEST(CpuStateUpdate, SeveralTokensPerCall) {
  uint64_t seed = 500;
  for (bool heads : {false, true})
    for (int64_t T : {1, 2, 5})
      for (int32_t sd : {kF32, kBF16}) {
        StateUpdateSpec s;
        s.heads = heads, s.batch = 3, s.tokens = T, s.tokens_dim = true, s.nheads = 4, s.headdim = 4;
        s.itype = kBF16, s.state_dtype = sd, s.has_z = true, s.groups = 2, s.seed = ++seed;
        run_and_check(s);
      }
}

TEST(CpuStateUpdate, DstateRange) {
  uint64_t seed = 600;
  for (int64_t N : {1, 4, 12, 16, 24, 64, 256})
    for (bool heads : {false, true}) {
      StateUpdateSpec s;
      s.heads = heads, s.batch = 2, s.nheads = 3, s.headdim = 2, s.dstate = N, s.has_z = true, s.seed = ++seed;
      run_and_check(s);
    }
}

TEST(CpuStateUpdate, MixedInputDtypes) {
  // upstream's test passes B, C (and D) in float32 with 16-bit x; dt and z may be float32 too
  uint64_t seed = 700;
  for (int32_t it : {kF16, kBF16})
    for (int mask = 1; mask < 8; ++mask) {
      StateUpdateSpec s;
      s.heads = mask & 1, s.headdim = 4, s.itype = it, s.has_z = true, s.seed = ++seed;
      s.bc_dtype = (mask & 1) ? kF32 : it;
      s.dt_dtype = (mask & 2) ? kF32 : it;
      s.z_dtype = (mask & 4) ? kF32 : it;
      run_and_check(s);
    }
}

TEST(CpuStateUpdate, StatePoolWithIndices) {
  uint64_t seed = 800;
  for (int32_t idt : {SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64})
    for (int64_t stride : {1, 3})
      for (bool heads : {false, true}) {
        StateUpdateSpec s;
        s.heads = heads, s.batch = 5, s.pool = 12, s.idx_dtype = idt, s.idx_stride = stride, s.headdim = 4;
        s.has_z = true, s.seed = ++seed;
        run_and_check(s);  // random distinct slots; the other 7 slots must stay bit-identical
      }
}

TEST(CpuStateUpdate, PaddingAndOutOfPoolEntries) {
  uint64_t seed = 900;
  for (bool heads : {false, true}) {
    StateUpdateSpec s;
    s.heads = heads, s.batch = 6, s.pool = 8, s.headdim = 4, s.tokens = 2, s.has_z = true;
    s.indices = {3, -1, 7, -1, 0, 5};  // -1: padding (the default pad_slot_id)
    s.seed = ++seed;
    run_and_check(s);
    s.indices = {2, 8, -7, -1, 1, int64_t{1} << 40};  // 8, -7 and 2^40 name no slot: NaN out, nothing touched
    s.idx_dtype = SELSCAN_DTYPE_INT64, s.seed = ++seed;
    run_and_check(s);
    s.indices = {2, 0, 4, 0, 6, 1};  // pad_slot_id 0: slot 0 is the null block (vLLM's null_block_id)
    s.pad_slot = 0, s.idx_dtype = SELSCAN_DTYPE_INT32, s.seed = ++seed;
    run_and_check(s);
    s.indices = {-1, -1, -1, -1, -1, -1};  // an all-padding batch (a CUDA-graph batch with no live sequence)
    s.pad_slot = -1, s.seed = ++seed;
    run_and_check(s);
  }
}

TEST(CpuStateUpdate, PaddedLayouts) {
  uint64_t seed = 1000;
  for (bool heads : {false, true})
    for (int32_t sd : {kF32, kF16}) {
      StateUpdateSpec s;
      s.heads = heads, s.padded = true, s.itype = kF16, s.state_dtype = sd, s.headdim = 4, s.tokens = 3;
      s.pool = 7, s.has_z = true, s.groups = 2, s.seed = ++seed;
      run_and_check(s);
    }
}

TEST(CpuStateUpdate, ManyThreadsMatchTheOracle) {
  // Large enough that the call splits into tasks on several workers.
  StateUpdateSpec s;
  s.batch = 9, s.nheads = 600, s.dstate = 16, s.pool = 20, s.has_z = true, s.tokens = 2, s.seed = 1100;
  run_and_check(s, 2);
  run_and_check(s, 0);
}

TEST(CpuStateUpdate, PrefillThenDecodeEqualsOneScan) {
  uint64_t seed = 1200;
  for (int32_t it : {kF32, kBF16})
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
