// CPU forward + backward vs the float64 recurrence over a matrix of flags, dtypes, sizes and layouts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "check.h"
#include "edge_cases.h"

namespace selscan_test {
namespace {

// Every combination of the optional inputs and softplus (fp32, variable B/C).
TEST(CpuMatrix, Flags) {
  for (int m = 0; m < 16; ++m) {
    CaseSpec s;
    s.batch = 2, s.dim = 6, s.seqlen = 45, s.dstate = 8;
    s.has_D = m & 1, s.has_z = m & 2, s.has_delta_bias = m & 4, s.softplus = m & 8;
    s.seed = 100 + m;
    check_case(s);
  }
}

// itype x weight type x B/C variability x groups (odd length, dstate not a multiple of 8).
TEST(CpuMatrix, DtypesAndGroups) {
  uint64_t seed = 200;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (bool cx : {false, true})
      for (int vb = 0; vb < 2; ++vb)
        for (int vc = 0; vc < 2; ++vc)
          for (int64_t G : {1, 2, 4}) {
            if (!vb && !vc && G > 1) continue;
            CaseSpec s;
            s.batch = 2, s.dim = 8, s.seqlen = 37, s.dstate = 5, s.groups = G;
            s.itype = it, s.complex = cx, s.var_B = vb, s.var_C = vc;
            s.seed = seed++;
            check_case(s);
          }
}

TEST(CpuMatrix, SeqLens) {
  uint64_t seed = 300;
  for (int64_t L : {1, 2, 7, 64, 127, 2047, 2048, 2049}) {
    CaseSpec s;
    s.batch = 1, s.dim = 4, s.seqlen = L, s.dstate = 6;
    s.seed = seed++;
    check_case(s);
  }
}

// Several chunks (nc = 3): x holds every chunk's P and H, the backward seeds from it; slowly decaying
// states carry information across the chunk boundaries.
TEST(CpuMatrix, LongMultiChunk) {
  uint64_t seed = 400;
  for (bool cx : {false, true})
    for (int vb = 0; vb < 2; ++vb) {
      CaseSpec s;
      s.batch = 1, s.dim = 3, s.seqlen = 4500, s.dstate = 4, s.complex = cx, s.var_B = vb, s.var_C = !vb;
      s.slow_decay = true, s.softplus = false, s.seed = seed++;
      check_case(s);
    }
  CaseSpec s;  // 16-bit input, h0 across chunks
  s.batch = 2, s.dim = 2, s.seqlen = 4500, s.dstate = 3, s.itype = SELSCAN_DTYPE_BFLOAT16, s.has_h0 = true;
  s.slow_decay = true, s.seed = seed++;
  check_case(s);
}

TEST(CpuMatrix, Dstates) {
  uint64_t seed = 500;
  for (int64_t N : {1, 2, 3, 8, 9, 16, 31, 64, 100, 256}) {
    CaseSpec s;
    s.batch = 1, s.dim = 3, s.seqlen = 33, s.dstate = N;
    s.seed = seed++;
    check_case(s);
  }
}

// h0 with every B/C variability, real and complex (h0 turns fold_B off for constant B).
TEST(CpuMatrix, InitialState) {
  uint64_t seed = 600;
  for (bool cx : {false, true})
    for (int vb = 0; vb < 2; ++vb)
      for (int vc = 0; vc < 2; ++vc) {
        CaseSpec s;
        s.batch = 2, s.dim = 4, s.seqlen = 29, s.dstate = 5, s.complex = cx, s.var_B = vb, s.var_C = vc;
        s.has_h0 = true, s.seed = seed++;
        check_case(s);
      }
  CaseSpec s;  // h0 given, its gradient not requested
  s.has_h0 = true, s.with_dh0 = false, s.seed = seed++;
  check_case(s);
}

// Optional outputs absent / present: no x, no last_state, recomputed out_z from the backward.
TEST(CpuMatrix, OptionalOutputs) {
  CaseSpec s;
  s.with_x = false, s.with_last_state = false, s.seed = 700;
  check_case(s);
  s.with_x = true, s.recompute_out_z = true, s.seed = 701;
  check_case(s);
  s.var_B = false, s.var_C = false, s.recompute_out_z = true, s.seed = 702;
  check_case(s);
}

// Variable B/C given as (Bt, N, L), the 3-D form of groups = 1.
TEST(CpuMatrix, ThreeDimBC) {
  for (bool cx : {false, true}) {
    CaseSpec s;
    s.bc_3d = true, s.complex = cx, s.seed = 800 + cx;
    check_case(s);
  }
}

TEST(CpuMatrix, Strides) {
  uint64_t seed = 900;
  for (Strides st : {Strides::mamba_inner, Strides::padded})
    for (bool cx : {false, true})
      for (int vb = 0; vb < 2; ++vb) {
        CaseSpec s;
        s.batch = 3, s.dim = 4, s.seqlen = 19, s.dstate = 3, s.strides = st, s.complex = cx;
        s.var_B = vb, s.var_C = true, s.groups = 2, s.has_h0 = st == Strides::padded, s.seed = seed++;
        s.itype = cx ? SELSCAN_DTYPE_FLOAT32 : SELSCAN_DTYPE_FLOAT16;
        check_case(s);
      }
}

// delta + bias on both sides of softplus's threshold (20), and negative delta without softplus.
TEST(CpuMatrix, DeltaRange) {
  CaseSpec s;
  s.seqlen = 40, s.delta_lo = 17.0, s.delta_hi = 23.0, s.slow_decay = true, s.seed = 950;
  check_case(s);
  s.softplus = false, s.delta_lo = -0.5, s.delta_hi = 0.5, s.seed = 951;
  check_case(s);
}

// More channels per group than one backward block holds (16): variable dB/dC sums span several blocks.
TEST(CpuMatrix, ManyChannelsPerGroup) {
  uint64_t seed = 960;
  for (int variant = 0; variant < 3; ++variant) {
    CaseSpec s;
    s.batch = 2, s.dim = 40, s.groups = 2, s.seqlen = 2100, s.dstate = 4;
    s.var_B = variant != 1, s.var_C = variant != 2, s.complex = variant == 2, s.seed = seed++;
    s.slow_decay = !s.complex;  // nearly undamped rotations over 2100 steps cost fp32 most of its margin
    check_case(s, 3);
  }
}

TEST(CpuMatrix, ThreadCounts) {
  for (int th : {1, 3, 0}) {
    CaseSpec s;
    s.batch = 3, s.dim = 10, s.groups = 2, s.seqlen = 50, s.seed = 1000 + th;
    check_case(s, th);
  }
}

// softplus between 1 and its threshold (tests/common/edge_cases.h; the GPU suite runs the same cases).
TEST(CpuMatrix, SoftplusMidRange) {
  for (const NamedSpec& n : softplus_mid_range_cases()) {
    SCOPED_TRACE(n.name);
    check_case(n.spec);
  }
}

// The backward at exactly L = 2048 without x (tests/common/edge_cases.h; the GPU suite runs the same cases).
TEST(CpuMatrix, OneChunkBackwardWithoutX) {
  for (const NamedSpec& n : one_chunk_without_x_cases()) {
    SCOPED_TRACE(n.name);
    check_case(n.spec);
  }
}

}  // namespace
}  // namespace selscan_test

namespace selscan_test {
namespace {

// The device runner of tests/common (what the GPU suite uses) with plain host memory as the "device":
// storages are copied out, run on the copies, and copied back.
TEST(CpuMatrix, DeviceMemoryRunnerOnHostCopies) {
  int live = 0;
  const DeviceMemory dev = host_device_memory(&live);
  CaseSpec s;
  s.strides = Strides::mamba_inner, s.has_h0 = true, s.recompute_out_z = true, s.seed = 1100;
  check_case(s, cpu_exec(2), &dev);
  s.complex = true, s.strides = Strides::padded, s.seed = 1101;
  check_case(s, cpu_exec(2), &dev);
  EXPECT_EQ(live, 0);
}

}  // namespace
}  // namespace selscan_test
