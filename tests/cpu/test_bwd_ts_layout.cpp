// The thread-states backward's shared-memory index maps (kernels/bwd/ts_maps.h), checked on the host: each is a
// bijection inside its buffer, and the accesses the kernel makes through them are free of bank conflicts. A broken map
// shows on a GPU only as wrong gradients (two such bugs did, validation/gpu-runs.md runs 25-26); this needs no GPU.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "bwd/ts_maps.h"

namespace selscan_test {
namespace {

namespace L = selscan::kern::bwd::ts;

// Shared memory has 32 banks of 4 bytes; a wavefront serves one access per bank. Given accesses of `words` words at
// float offsets, served together, true when no two of them touch the same bank.
bool conflict_free(const std::vector<int>& offsets, int words) {
  std::set<int> banks;
  for (int o : offsets)
    for (int w = 0; w < words; ++w)
      if (!banks.insert((o + w) % 32).second) return false;
  return true;
}

TEST(BwdTsLayout, ReductionBufferIsABijectionInsideItsSlots) {
  std::set<int> seen;
  for (int tt = 0; tt < 4; ++tt)
    for (int r = 0; r < 32; ++r) {
      EXPECT_EQ(L::red_at(tt, r, 0) % 4, 0) << "row " << r;  // both float4 halves aligned
      EXPECT_EQ(L::red_at(tt, r, 4) % 4, 0) << "row " << r;
      for (int v = 0; v < 8; ++v) {
        const int a = L::red_at(tt, r, v);
        EXPECT_GE(a, 0);
        EXPECT_LT(a, L::kRedWarp);
        EXPECT_TRUE(seen.insert(a).second) << "slot " << tt << " row " << r << " value " << v << " overlaps";
      }
    }
}

TEST(BwdTsLayout, ReductionWritesAreConflictFreePerQuarterWarp) {
  for (int tt = 0; tt < 4; ++tt)
    for (int half = 0; half < 8; half += 4)
      for (int q = 0; q < 4; ++q) {
        std::vector<int> offs;
        for (int r = 8 * q; r < 8 * q + 8; ++r) offs.push_back(L::red_at(tt, r, half));
        EXPECT_TRUE(conflict_free(offs, 4)) << "slot " << tt << " half " << half << " quarter " << q;
      }
}

// The kernel's reduction: with V values per lane and step (4: one of B/C variable, 8: both), output o = (step tt,
// value v) is summed over rows part*CNT .. part*CNT + CNT - 1 by lane o*P + part, reading through red_read.
TEST(BwdTsLayout, ReductionReadsFindTheWrittenValuesWithoutConflicts) {
  for (int V : {4, 8}) {
    const int O = 4 * V, P = 32 / O, CNT = 32 / P;
    for (int i = 0; i < CNT; ++i) {
      std::vector<int> offs;
      for (int lane = 0; lane < 32; ++lane) {
        const int o = lane / P, part = lane % P, tt = o / V, v = o % V;
        const int a = L::red_read(L::red_at(tt, part * CNT, v), i);
        EXPECT_EQ(a, L::red_at(tt, part * CNT + i, v)) << "V " << V << " lane " << lane << " i " << i;
        offs.push_back(a);
      }
      EXPECT_TRUE(conflict_free(offs, 1)) << "V " << V << " read " << i;
    }
  }
}

TEST(BwdTsLayout, StagingItemsCoverEveryChannelAndStepGroupOnce) {
  std::set<int> seen;
  for (int it = 0; it < L::kCh * 4; ++it) {
    int c = -1, q = -1;
    L::item_at(it, c, q);
    ASSERT_GE(c, 0);
    ASSERT_LT(c, L::kCh);
    ASSERT_GE(q, 0);
    ASSERT_LT(q, 4);
    EXPECT_TRUE(seen.insert(c * 4 + q).second) << "item " << it;
    // 4 consecutive lanes share a channel and cover its 16 steps: one 32-byte sector of a 16-bit global row.
    int c0 = -1, q0 = -1;
    L::item_at(it & ~3, c0, q0);
    EXPECT_EQ(c, c0) << "item " << it;
    EXPECT_EQ(q, it & 3) << "item " << it;
  }
  std::set<int> slots;
  for (int c = 0; c < L::kCh; ++c) slots.insert(L::raw_slot(c));
  EXPECT_EQ(slots.size(), static_cast<size_t>(L::kCh));
  EXPECT_EQ(*slots.rbegin(), L::kCh - 1);
}

TEST(BwdTsLayout, StagingAndSweepRowAccessesAreConflictFree) {
  for (int w = 0; w < 4; ++w) {
    // Float rows (kRow floats a channel), 16-byte accesses by the staging items: per quarter-warp.
    for (int qw = 0; qw < 4; ++qw) {
      std::vector<int> rows, raw32;
      for (int l = 8 * qw; l < 8 * qw + 8; ++l) {
        int c, q;
        L::item_at(32 * w + l, c, q);
        rows.push_back(c * L::kRow + 4 * q);
        raw32.push_back(L::raw_slot(c) * L::kTT + 4 * q);  // fp32 raw rows: kTT words
      }
      EXPECT_TRUE(conflict_free(rows, 4)) << "float rows, warp " << w << " quarter " << qw;
      EXPECT_TRUE(conflict_free(raw32, 4)) << "fp32 raw rows, warp " << w << " quarter " << qw;
    }
    // 16-bit raw rows (kTT/2 words a channel), 8-byte reads: per half-warp.
    for (int hw = 0; hw < 2; ++hw) {
      std::vector<int> raw16;
      for (int l = 16 * hw; l < 16 * hw + 16; ++l) {
        int c, q;
        L::item_at(32 * w + l, c, q);
        raw16.push_back(L::raw_slot(c) * (L::kTT / 2) + 2 * q);
      }
      EXPECT_TRUE(conflict_free(raw16, 2)) << "16-bit raw rows, warp " << w << " half " << hw;
    }
  }
  // The sweep: lane = channel reads its own row's float4 at step group j4.
  for (int j4 = 0; j4 < L::kTT; j4 += 4)
    for (int qw = 0; qw < 4; ++qw) {
      std::vector<int> offs;
      for (int lane = 8 * qw; lane < 8 * qw + 8; ++lane) offs.push_back(lane * L::kRow + j4);
      EXPECT_TRUE(conflict_free(offs, 4)) << "sweep rows, step " << j4 << " quarter " << qw;
    }
}

}  // namespace
}  // namespace selscan_test
