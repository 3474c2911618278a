// The CUDA conv1d kernel choice (src/cuda/select.cpp, plan_conv1d_*), checked on the CPU: which kernel serves each
// layout, where 16-byte IO is allowed, that the grid covers every row, channel and step, and the backward's
// workspace for its partial sums.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "conv1d.h"
#include "cuda/select.h"

namespace selscan_test {
namespace {

using selscan::Conv1d;
using selscan::Conv1dUpdate;
using selscan::Dtype;
using selscan::Layout;
using selscan::cuda::Conv1dKernel;
using selscan::cuda::Conv1dPlan;
namespace k = selscan::cuda::conv1d;

selscan::cuda::DeviceProps h200() {
  selscan::cuda::DeviceProps d;
  d.cc = 90;
  d.sms = 132;
  d.smem_optin = 227 * 1024;
  return d;
}

// Storage the views point into: 16-byte aligned, so an offset of `shift` elements decides alignment.
alignas(16) unsigned char g_buf[4096];

// A dense (B, D, L) call; channel-first or channel-last contiguous tensors.
Conv1d dense(int64_t B, int64_t D, int64_t L, Layout layout, Dtype t = Dtype::bf16, int64_t W = 4) {
  Conv1d p{};
  p.batch = B, p.dim = D, p.seqlen = L, p.width = W;
  p.itype = t, p.wtype = t, p.dwtype = Dtype::f32;
  p.layout = layout;
  const auto view = [&](int64_t off) {
    selscan::View v{};
    v.p = g_buf + off;
    if (layout == Layout::channel_last) {
      v.s[0] = L * D, v.s[1] = 1, v.s[2] = D;
    } else {
      v.s[0] = D * L, v.s[1] = L, v.s[2] = 1;
    }
    return v;
  };
  p.x = view(0), p.out = view(256), p.dout = view(512), p.dx = view(768);
  p.weight = view(1024);
  return p;
}

Conv1dPlan fwd(const Conv1d& p) {
  Conv1dPlan pl;
  EXPECT_EQ(selscan::cuda::plan_conv1d_fwd(p, h200(), &pl), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  return pl;
}
Conv1dPlan bwd(const Conv1d& p) {
  Conv1dPlan pl;
  EXPECT_EQ(selscan::cuda::plan_conv1d_bwd(p, h200(), &pl), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  return pl;
}

TEST(Conv1dPlan, ChannelFirstRowKernelCoversEveryStep) {
  const int64_t Ls[] = {1, 7, 8, 9, 64, 100, 1000, 1024, 1025, 2048, 5000};
  for (int64_t L : Ls) {
    const Conv1d p = dense(2, 24, L, Layout::channel_first);
    const Conv1dPlan pl = fwd(p);
    EXPECT_EQ(pl.kernel, Conv1dKernel::rows);
    // 16-bit rows start on 16-byte boundaries when L is a multiple of 8.
    EXPECT_EQ(pl.vec, L % 8 == 0) << L;
    // A power of two of threads per row, as few as cover the row (up to a block).
    EXPECT_EQ(pl.row_threads & (pl.row_threads - 1), 0);
    EXPECT_LE(pl.row_threads, k::kThreads);
    EXPECT_EQ(pl.items, k::row_items(Dtype::bf16, true));  // a plain call: the 64-byte runs
    EXPECT_EQ(pl.items, 32);
    EXPECT_EQ(pl.chunk, int64_t{pl.row_threads} * pl.items);
    EXPECT_GE(pl.chunk * pl.tiles, L);
    EXPECT_LT(pl.chunk * (pl.tiles - 1), L);
    if (pl.row_threads < k::kThreads) {
      EXPECT_EQ(pl.tiles, 1);
      EXPECT_LT(int64_t{pl.row_threads / 2} * pl.items, L);
    }
    const int64_t rows_per_block = k::kThreads / pl.row_threads;
    EXPECT_GE(pl.blocks / pl.tiles * rows_per_block, 2 * 24);
    EXPECT_LT((pl.blocks / pl.tiles - 1) * rows_per_block, 2 * 24);
    EXPECT_FALSE(pl.states);
    EXPECT_EQ(pl.workspace, 0u);
  }
}

TEST(Conv1dPlan, VectorIoOnlyWhenAligned) {
  Conv1d p = dense(2, 24, 96, Layout::channel_first);
  EXPECT_TRUE(fwd(p).vec);
  p.out.p = g_buf + 256 + 2;  // out's base off a 16-byte boundary
  EXPECT_FALSE(fwd(p).vec);
  EXPECT_TRUE(bwd(dense(2, 24, 96, Layout::channel_first)).vec);
  EXPECT_FALSE(fwd(dense(2, 24, 100, Layout::channel_first)).vec);  // rows 200 bytes apart
  p = dense(2, 24, 96, Layout::channel_first);
  p.x.s[1] = 97;  // a row stride of 194 bytes
  EXPECT_FALSE(fwd(p).vec);
  p = dense(2, 24, 96, Layout::channel_first);
  p.dx.s[0] = 24 * 96 + 3;  // backward streams dx too
  EXPECT_TRUE(fwd(p).vec);
  EXPECT_FALSE(bwd(p).vec);
  // A size-1 dim's stride does not matter.
  p = dense(1, 24, 96, Layout::channel_first);
  p.x.s[0] = 7, p.out.s[0] = 7;
  EXPECT_TRUE(fwd(p).vec);
  // fp32 rows of 4-float multiples are aligned; 16-bit rows need 8-element multiples. A thread of the plain calls'
  // kernels owns 64 bytes, of the others 32.
  EXPECT_TRUE(fwd(dense(2, 3, 4, Layout::channel_first, Dtype::f32)).vec);
  EXPECT_EQ(fwd(dense(2, 3, 4, Layout::channel_first, Dtype::f32)).items, 16);
  EXPECT_FALSE(fwd(dense(2, 3, 4, Layout::channel_first, Dtype::f16)).vec);
  EXPECT_EQ(fwd(dense(2, 3, 4, Layout::channel_first, Dtype::f16)).items, 32);
  int seq[1];
  p = dense(2, 24, 96, Layout::channel_first);
  p.seq_idx.p = seq;
  EXPECT_EQ(fwd(p).items, 16);
  EXPECT_EQ(bwd(p).items, 16);
  p = dense(2, 24, 96, Layout::channel_first);
  p.conv_states.p = g_buf;  // a pool: the forward's general kernel, the backward's plain one
  EXPECT_EQ(fwd(p).items, 16);
  EXPECT_EQ(bwd(p).items, 32);
  // The lean kernels serve the widest width only; narrower dense calls take the general kernel's 32-byte runs.
  for (int64_t w = 2; w <= 3; ++w) {
    p = dense(2, 24, 96, Layout::channel_first, Dtype::bf16, w);
    EXPECT_FALSE(p.plain_fwd());
    EXPECT_FALSE(p.plain_bwd());
    EXPECT_EQ(fwd(p).items, 16);
    EXPECT_EQ(bwd(p).items, 16);
  }
}

TEST(Conv1dPlan, ChannelLastKernel) {
  const Conv1d p = dense(8, 1536, 2048, Layout::channel_last);
  const Conv1dPlan pl = fwd(p);
  EXPECT_EQ(pl.kernel, Conv1dKernel::cl);
  EXPECT_TRUE(pl.vec);
  EXPECT_EQ(pl.items, k::kItems);
  EXPECT_EQ(pl.row_threads, k::kClLanes);
  const int64_t groups = k::kThreads / k::kClLanes;
  EXPECT_GE(pl.tiles * pl.chunk * groups, 2048);
  EXPECT_LT((pl.tiles - 1) * pl.chunk * groups, 2048);
  EXPECT_EQ(pl.blocks, 8 * ((1536 + k::kClLanes * k::kItems - 1) / (k::kClLanes * k::kItems)) * pl.tiles);
  // The longest walk whose grid fills most of one wave of resident threads (6 blocks of 128 per SM): 64 steps,
  // 768 blocks for 792 places.
  EXPECT_EQ(pl.chunk, 64);
  EXPECT_EQ(pl.blocks, 768);
  // Past one wave, the longest walk that leaves 1280 threads per SM: 4x5120x2048 at 64 steps would be 1.6 waves
  // with 1241 threads per SM; 32 steps.
  EXPECT_EQ(fwd(dense(4, 5120, 2048, Layout::channel_last)).chunk, 32);
  // Few channels: short walks, as many threads as fill the machine once (latency-bound calls).
  const Conv1dPlan mid = fwd(dense(1, 5120, 512, Layout::channel_last));
  EXPECT_EQ(mid.chunk, 8);
  EXPECT_EQ(mid.blocks, 640);
  const Conv1dPlan tiny = fwd(dense(1, 1536, 64, Layout::channel_last));
  EXPECT_EQ(tiny.chunk, 4);
  EXPECT_EQ(tiny.blocks, 1536 / (k::kClLanes * k::kItems) * (64 / (4 * groups)));
  // The backward's thread owns fewer channels, and its block is narrower and longer in time (fewer partials).
  const Conv1dPlan b = bwd(p);
  EXPECT_EQ(b.kernel, Conv1dKernel::cl);
  EXPECT_EQ(b.items, k::kClBwdItems);
  EXPECT_EQ(b.row_threads, k::kClBwdLanes);
  EXPECT_TRUE(b.vec);
  EXPECT_EQ(b.chunk, 64);  // 1024 threads per SM
  const int64_t bgroups = k::kThreads / k::kClBwdLanes;
  EXPECT_GE(b.tiles * b.chunk * bgroups, 2048);
  EXPECT_LT((b.tiles - 1) * b.chunk * bgroups, 2048);
  EXPECT_EQ(b.blocks, 8 * ((1536 + k::kClBwdLanes * b.items - 1) / (k::kClBwdLanes * b.items)) * b.tiles);
  EXPECT_EQ(b.parts, 8 * b.tiles);
  // One wave (5 blocks of 128 per SM) of 16-step walks: 640 blocks, 4 parts per channel.
  const Conv1dPlan bmid = bwd(dense(1, 5120, 512, Layout::channel_last));
  EXPECT_EQ(bmid.chunk, 16);
  EXPECT_EQ(bmid.blocks, 640);
  EXPECT_EQ(bmid.parts, 4);
  // Channels not a multiple of a thread's: the same kernels, element IO.
  const Conv1dPlan odd = fwd(dense(2, 13, 64, Layout::channel_last));
  EXPECT_EQ(odd.kernel, Conv1dKernel::cl);
  EXPECT_FALSE(odd.vec);
  EXPECT_FALSE(bwd(dense(2, 13, 64, Layout::channel_last)).vec);
  // A thread's channels are whole vectors (8 bytes forward, 4 backward, of a 16-bit itype).
  EXPECT_FALSE(fwd(dense(2, 14, 64, Layout::channel_last)).vec);
  EXPECT_TRUE(bwd(dense(2, 14, 64, Layout::channel_last)).vec);
}

TEST(Conv1dPlan, StridedLayoutsTakeTheRowKernelWithoutVectors) {
  Conv1d p = dense(2, 24, 100, Layout::channel_first);
  p.layout = Layout::strided;
  p.x.s[2] = 2;
  const Conv1dPlan pl = fwd(p);
  EXPECT_EQ(pl.kernel, Conv1dKernel::rows);
  EXPECT_FALSE(pl.vec);
}

TEST(Conv1dPlan, StatesKernelsFollowOnlyWhenAsked) {
  Conv1d p = dense(2, 24, 100, Layout::channel_first);
  EXPECT_FALSE(fwd(p).states);
  p.fin.p = g_buf + 2048;
  EXPECT_TRUE(fwd(p).states);
  p = dense(2, 24, 100, Layout::channel_first);
  p.conv_states.p = g_buf + 2048;
  EXPECT_TRUE(fwd(p).states);
  p = dense(2, 24, 100, Layout::channel_first);
  EXPECT_FALSE(bwd(p).states);
  p.dinit.p = g_buf + 2048;
  EXPECT_TRUE(bwd(p).states);
}

TEST(Conv1dPlan, BackwardWorkspaceHoldsEveryPartial) {
  for (Layout layout : {Layout::channel_first, Layout::channel_last})
    for (int64_t W : {2, 3, 4}) {
      const Conv1d p = dense(3, 40, 3000, layout, Dtype::bf16, W);
      const Conv1dPlan pl = bwd(p);
      EXPECT_EQ(pl.parts, 3 * pl.tiles);
      EXPECT_GE(pl.workspace, static_cast<size_t>(pl.parts * (W + 1) * 40) * sizeof(float));
      EXPECT_EQ(pl.workspace % SELSCAN_WORKSPACE_ALIGNMENT, 0u);
    }
  // Packed sequences are one row.
  Conv1d p = dense(1, 40, 3000, Layout::channel_first);
  p.batch = 5, p.varlen = true;
  EXPECT_EQ(bwd(p).parts, bwd(p).tiles);
  // No packed sequence at all: no main kernel (the finalize writes zero gradients).
  p.batch = 0;
  EXPECT_EQ(fwd(p).blocks, 0);
  EXPECT_EQ(bwd(p).blocks, 0);
  EXPECT_FALSE(bwd(p).direct);
}

TEST(Conv1dPlan, OnePartPerChannelWritesTheWeightGradientsDirectly) {
  // One row in one tile: the main kernel writes dweight/dbias, no workspace, no finalize launch.
  for (Layout layout : {Layout::channel_first, Layout::channel_last}) {
    const Conv1dPlan small = bwd(dense(1, 1536, 64, layout));
    EXPECT_EQ(small.tiles, 1);
    EXPECT_TRUE(small.direct);
    EXPECT_EQ(small.workspace, 0u);
    const Conv1dPlan two_rows = bwd(dense(2, 1536, 64, layout));
    EXPECT_FALSE(two_rows.direct);
    EXPECT_GT(two_rows.workspace, 0u);
  }
  // A channel-last row past one block's 16-step walks: several tiles, partials.
  const Conv1dPlan edge = bwd(dense(1, 1536, 16 * (k::kThreads / k::kClBwdLanes), Layout::channel_last));
  EXPECT_EQ(edge.tiles, 1);
  EXPECT_TRUE(edge.direct);
  const Conv1dPlan longer = bwd(dense(1, 1536, 16 * (k::kThreads / k::kClBwdLanes) + 1, Layout::channel_last));
  EXPECT_GT(longer.tiles, 1);
  EXPECT_FALSE(longer.direct);
  // Channel-first rows up to a block's run are one tile (a plain call's thread owns 32 bf16 steps).
  EXPECT_TRUE(bwd(dense(1, 64, 4096, Layout::channel_first)).direct);
  EXPECT_FALSE(bwd(dense(1, 64, 4097, Layout::channel_first)).direct);
  EXPECT_FALSE(fwd(dense(1, 64, 64, Layout::channel_first)).direct);  // forward: no gradients
}

TEST(Conv1dPlan, UpdateCoversEveryChannelOfEverySequence) {
  Conv1dUpdate u{};
  u.batch = 3, u.dim = 300, u.tokens = 1, u.width = 4, u.state_len = 3, u.slots = 3;
  u.itype = u.wtype = u.state_t = Dtype::bf16;
  Conv1dPlan pl;
  ASSERT_EQ(selscan::cuda::plan_conv1d_update(u, h200(), &pl), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(pl.kernel, Conv1dKernel::update);
  EXPECT_GE(pl.tiles * pl.threads, 300);
  EXPECT_LT((pl.tiles - 1) * pl.threads, 300);
  EXPECT_EQ(pl.blocks, 3 * pl.tiles);
  EXPECT_EQ(pl.workspace, 0u);
}

TEST(Conv1dPlan, GridsPastCudasLimitAreUnsupported) {
  Conv1d p = dense(1, int64_t{1} << 40, int64_t{1} << 12, Layout::channel_first);
  Conv1dPlan pl;
  EXPECT_EQ(selscan::cuda::plan_conv1d_fwd(p, h200(), &pl), SELSCAN_STATUS_UNSUPPORTED);
  EXPECT_NE(std::string(selscan_last_error()).find("grid"), std::string::npos) << selscan_last_error();
  EXPECT_EQ(selscan::cuda::plan_conv1d_bwd(p, h200(), &pl), SELSCAN_STATUS_UNSUPPORTED);
}

}  // namespace
}  // namespace selscan_test
