// The kernel choice (src/cuda/select.cpp), checked on the CPU: which kernel serves a call and with what plan, for
// the benchmark rows and at every threshold's edges, on the shared-memory classes of real GPUs. Each expected value
// below is worked out by hand from the rules in docs/architecture.md ("Kernel selection"), not read off the code.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/select.h"
#include "errors.h"
#include "problem.h"

namespace selscan_test {
namespace {

using selscan::Dtype;
using selscan::Problem;
namespace cuda = selscan::cuda;

// Device properties as cudaGetDeviceProperties reports them (sharedMemPerBlockOptin), running a build with SASS for
// their arch (the ptx field: the virtual arch of the loaded kernels).
constexpr cuda::DeviceProps kH200{0, 90, 132, 232448, 90};
constexpr cuda::DeviceProps kA100{0, 80, 108, 166912, 80};
constexpr cuda::DeviceProps kT4{0, 75, 40, 65536, 75};

struct Shape {
  int64_t batch, dim, seqlen, dstate;
  Dtype itype = Dtype::bf16;
  bool var = true;  // variable B and C (else both constant)
  bool cplx = false;
  bool det = false;
  int64_t groups = 1;
};

Problem problem(const Shape& s) {
  Problem p{};
  p.batch = s.batch;
  p.dim = s.dim;
  p.seqlen = s.seqlen;
  p.dstate = s.dstate;
  p.groups = s.groups;
  p.nchunks = (s.seqlen + selscan::kChunk - 1) / selscan::kChunk;
  p.itype = s.itype;
  p.is_complex = s.cplx;
  p.var_B = p.var_C = s.var;
  p.deterministic = s.det;
  p.fold_B = !s.var;
  return p;
}

// problem(s) with row views at made-up addresses (the kernel choice reads only bases and strides): u, delta, dout,
// out and, with has_z, z as contiguous (Bt, D, L), variable B and C as (Bt, G, N, L); u's base moved by misalign_u.
Problem with_views(const Shape& s, bool has_z, uintptr_t misalign_u) {
  Problem p = problem(s);
  const int64_t D = s.dim, L = s.seqlen, N = s.dstate, isz = s.itype == Dtype::f32 ? 4 : 2;
  uintptr_t next = 0x10000000;
  const auto view = [&](std::initializer_list<int64_t> strides) {
    selscan::View v{reinterpret_cast<void*>(next), {0, 0, 0, 0}};
    int i = 0;
    for (int64_t st : strides) v.s[i++] = st;
    next += static_cast<uintptr_t>(s.batch * D * L * isz + 4096) & ~uintptr_t{255};
    return v;
  };
  for (selscan::View* v : {&p.u, &p.delta, &p.dout, &p.out}) *v = view({D * L, L, 1});
  if (has_z) p.z = view({D * L, L, 1});
  p.u.p = static_cast<char*>(p.u.p) + misalign_u;
  if (s.var) p.B = p.C = view({s.groups * N * L, N * L, L, 1});
  return p;
}

std::string name(const Shape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.dim) + "x" + std::to_string(s.seqlen) + ":" +
         std::to_string(s.dstate);
}

TEST(KernelChoice, OverrideValues) {
  EXPECT_EQ(cuda::parse_force("warp"), cuda::Force::warp);
  EXPECT_EQ(cuda::parse_force("ts"), cuda::Force::ts);
  EXPECT_EQ(cuda::parse_force("auto"), cuda::Force::none);
  EXPECT_EQ(cuda::parse_force(""), cuda::Force::none);
  EXPECT_EQ(cuda::parse_force("TS"), cuda::Force::none);
  EXPECT_EQ(cuda::parse_force(nullptr), cuda::Force::none);
}

// The classes by opt-in shared memory give the same budgets the kernels had by compute capability (sm_90 to sm_11x:
// the large budgets; sm_80 to sm_89 and sm_12x: medium; older: small) on every part listed.
TEST(KernelChoice, SharedMemoryClassesOfRealGpus) {
  struct Row {
    const char* gpu;
    int64_t optin;
    cuda::SmemClass want;
  };
  const Row rows[] = {
      {"H100/H200 (sm_90)", 232448, cuda::SmemClass::large}, {"B200 (sm_100)", 232448, cuda::SmemClass::large},
      {"A100 (sm_80)", 166912, cuda::SmemClass::medium},      {"Orin (sm_87)", 166912, cuda::SmemClass::medium},
      {"RTX 4090, L4 (sm_89)", 101376, cuda::SmemClass::medium}, {"A10 (sm_86)", 101376, cuda::SmemClass::medium},
      {"RTX 5090 (sm_120)", 101376, cuda::SmemClass::medium}, {"V100 (sm_70)", 98304, cuda::SmemClass::small},
      {"T4 (sm_75)", 65536, cuda::SmemClass::small},
  };
  for (const Row& r : rows) EXPECT_EQ(cuda::smem_class(r.optin), r.want) << r.gpu;
}

// ------------------------------------------------------------------------------------------------ forward
struct FwdRow {
  Shape s;
  cuda::DeviceProps dev;
  cuda::Force force;
  cuda::Kernel kernel;
  // thread-states: tpc, ch, tt, tiles per group, min blocks; warp-scan: warps, tiles per group (rest 0)
  int a, b, c;
  int64_t tiles;
  int minb;
  int64_t blocks;
  size_t smem;
};

TEST(KernelChoice, Forward) {
  using cuda::Force;
  constexpr auto ts = cuda::Kernel::ts;
  constexpr auto warp = cuda::Kernel::warp;
  const FwdRow rows[] = {
      // The issue #4 rows on the H200. Row 1: 1536 warps (11.6 per SM) -> thread-states, 64-thread blocks (128 would
      // leave 384 blocks, under 4 per SM), 32-step tiles, the 3-blocks-per-SM variant (12 warps per SM hold it).
      {{8, 1536, 2048, 16}, kH200, Force::none, ts, 4, 16, 32, 96, 3, 768, 20672},
      // Row 2: 2560 warps (19.4 per SM, over 16) -> the 5-blocks-per-SM variant; 128-thread blocks.
      {{4, 5120, 2048, 16}, kH200, Force::none, ts, 4, 32, 32, 160, 5, 640, 44480},
      // Rows 3 and 4: 256 and 640 warps, under 8 per SM -> warp-scan (8 warps a block, two staged 32 KB B/C tiles).
      {{1, 2048, 65536, 16}, kH200, Force::none, warp, 8, 0, 0, 256, 0, 256, 68096},
      {{1, 5120, 512, 16}, kH200, Force::none, warp, 8, 0, 0, 640, 0, 640, 68096},
      // Row 5 (fp32): 4-element vectors, so 16-step tiles at 64 threads.
      {{8, 1536, 2048, 16, Dtype::f32}, kH200, Force::none, ts, 4, 16, 16, 96, 3, 768, 11456},
      // Row 6: dstate 64 is past the thread-states kernel's 32.
      {{4, 2048, 2048, 64}, kH200, Force::none, warp, 8, 0, 0, 256, 0, 1024, 75776},
      // dstate 8 has a large grid but 2 threads per channel: not the default range.
      {{8, 1536, 2048, 8}, kH200, Force::none, warp, 8, 0, 0, 192, 0, 1536, 66816},
      // The parallelism edge: B*D*tpc against 8 warps * 32 * 132 SMs = 33792 threads (128-thread blocks would be 264,
      // under 4 per SM, so 64-thread blocks).
      {{1, 8448, 512, 16}, kH200, Force::none, ts, 4, 16, 32, 528, 3, 528, 20672},
      {{1, 8440, 512, 16}, kH200, Force::none, warp, 8, 0, 0, 1055, 0, 1055, 68096},
      // The variant edges: a grid of 1584 warps is 12 per SM (792 blocks of 64 threads: 3 blocks of up to 168
      // registers), one more block is over (4 blocks); 2112 warps is 16 per SM (4 blocks), 2113 is over (5 blocks).
      {{1, 12672, 512, 16}, kH200, Force::none, ts, 4, 16, 32, 792, 3, 792, 20672},
      {{1, 12688, 512, 16}, kH200, Force::none, ts, 4, 16, 32, 793, 4, 793, 20672},
      {{1, 16896, 512, 16}, kH200, Force::none, ts, 4, 32, 32, 528, 4, 528, 36800},
      {{1, 16904, 512, 16}, kH200, Force::none, ts, 4, 32, 32, 529, 5, 529, 44480},
      // Forced: the thread-states kernel on a tiny call (dstate 8: 2 threads per channel; blocks shrink to 32
      // threads), constant B/C; the warp-scan kernel on row 1.
      {{1, 64, 100, 8, Dtype::f16, false}, kH200, Force::ts, ts, 2, 16, 16, 4, 3, 4, 6400},
      {{8, 1536, 2048, 16}, kH200, Force::warp, warp, 8, 0, 0, 192, 0, 1536, 68096},
      // Complex weights always take the warp-scan kernel (K = 8, 8-state tiles of float2), forced or not.
      {{2, 64, 300, 16, Dtype::f32, true, true}, kH200, Force::ts, warp, 8, 0, 0, 8, 0, 16, 37888},
      // Fewer SMs lower the bar: row 4 on a 40-SM part is 16 warps per SM.
      {{1, 5120, 512, 16}, kT4, Force::none, ts, 4, 32, 32, 160, 4, 160, 36800},
  };
  for (const FwdRow& r : rows) {
    SCOPED_TRACE(name(r.s));
    cuda::FwdPlan plan;
    ASSERT_EQ(cuda::plan_fwd(problem(r.s), r.dev, r.force, &plan), SELSCAN_STATUS_SUCCESS)
        << selscan::last_error_message();
    ASSERT_EQ(plan.kernel, r.kernel);
    if (r.kernel == ts) {
      EXPECT_EQ(plan.ts.shape.tpc, r.a);
      EXPECT_EQ(plan.ts.shape.ch, r.b);
      EXPECT_EQ(plan.ts.shape.tt, r.c);
      EXPECT_EQ(plan.ts.shape.tiles_per_group, r.tiles);
      EXPECT_EQ(plan.ts.min_blocks, r.minb);
      EXPECT_EQ(plan.ts.blocks, r.blocks);
      EXPECT_EQ(plan.ts.smem, r.smem);
    } else {
      EXPECT_EQ(plan.warp.warps, r.a);
      EXPECT_EQ(plan.warp.tiles_per_group, r.tiles);
      EXPECT_EQ(plan.warp.blocks, r.blocks);
      EXPECT_EQ(plan.warp.smem, r.smem);
    }
  }
}

// The forward's shared-memory slots (src/cuda/plans.h, raw_slots) are planned only for code made for the 228 KB parts,
// judged by the virtual arch of the loaded kernels, as the device code judges it by __CUDA_ARCH__: row 1 on an H200
// running sm_90 code has them for the packed 5-blocks instance of row 2, the same H200 running compute_80 PTX (a build
// for 8.0+PTX only) does not, nor does an A100; a B200 (sm_100) does, an RTX 5090 (sm_120, 100 KB) does not (a wider
// call there, so that it too runs the 5-blocks instance).
TEST(KernelChoice, ForwardSlotsOnlyInCodeForThe228KbParts) {
  const struct {
    Shape shape;
    cuda::DeviceProps dev;
    size_t smem;
  } rows[] = {
      {{4, 5120, 2048, 16}, kH200, 44480},
      {{4, 5120, 2048, 16}, {0, 90, 132, 232448, 80}, 36800},
      {{4, 5120, 2048, 16}, kA100, 36800},
      {{4, 5120, 2048, 16}, {0, 100, 148, 232448, 100}, 44480},
      {{4, 5632, 2048, 16}, {0, 120, 170, 101376, 120}, 36800},
  };
  for (const auto& r : rows) {
    const Problem p = problem(r.shape);
    cuda::FwdPlan plan;
    ASSERT_EQ(cuda::plan_fwd(p, r.dev, cuda::Force::none, &plan), SELSCAN_STATUS_SUCCESS);
    ASSERT_EQ(plan.kernel, cuda::Kernel::ts);
    ASSERT_EQ(plan.ts.min_blocks, 5) << "cc " << r.dev.cc;
    EXPECT_EQ(plan.ts.smem, r.smem) << "cc " << r.dev.cc << ", ptx " << r.dev.ptx;
  }
}

TEST(KernelChoice, ForwardRefusesWhatNoGridHolds) {
  // 3e9 sequences of one channel: thread-states blocks of 8 channels, warp-scan blocks of 1; both > 2^31 - 1.
  const Problem p = problem({3000000000LL, 1, 64, 16});
  cuda::FwdPlan plan;
  EXPECT_EQ(cuda::plan_fwd(p, kH200, cuda::Force::none, &plan), SELSCAN_STATUS_UNSUPPORTED);
  EXPECT_NE(std::string(selscan::last_error_message()).find("batch * dim / 8 exceeds the CUDA grid limit"),
            std::string::npos)
      << selscan::last_error_message();
  EXPECT_EQ(cuda::plan_fwd(p, kH200, cuda::Force::warp, &plan), SELSCAN_STATUS_UNSUPPORTED);
  EXPECT_NE(std::string(selscan::last_error_message()).find("batch * dim / 1 exceeds"), std::string::npos);
}

TEST(KernelChoice, ForwardRefusesMoreSharedMemoryThanTheDeviceAllows) {
  // Complex, dstate 256, variable B/C: 32 KB of staged rows + 8 warps x 256 states x 5 slots x 8 bytes = 112 KB.
  const Problem p = problem({1, 64, 64, 256, Dtype::f32, true, true});
  cuda::FwdPlan plan;
  ASSERT_EQ(cuda::plan_fwd(p, kH200, cuda::Force::none, &plan), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(plan.warp.smem, 114688u);
  EXPECT_EQ(cuda::plan_fwd(p, kT4, cuda::Force::none, &plan), SELSCAN_STATUS_UNSUPPORTED);
  const std::string msg = selscan::last_error_message();
  EXPECT_NE(msg.find("needs 114688 bytes of shared memory per block, device 0 allows 65536"), std::string::npos) << msg;
}

// ------------------------------------------------------------------------------------------------ backward
struct BwdRow {
  Shape s;
  cuda::DeviceProps dev;
  cuda::Force force;
  cuda::Kernel kernel;
  // thread-states: tpc, grid, ntc; warp-scan: warps, stile, slots
  int64_t a, b, c;
  size_t smem;
  int64_t images;
  size_t total;  // workspace bytes
};

TEST(KernelChoice, Backward) {
  using cuda::Force;
  constexpr auto ts = cuda::Kernel::ts;
  constexpr auto warp = cuda::Kernel::warp;
  const BwdRow rows[] = {
      // Row 1 on the H200: 384 blocks of 32 channels x 4 warps = 1536 warps -> thread-states. Workspace: dA partials
      // 768 KiB, dD/ddelta_bias 96 KiB, dB and dC images 1 MiB each, checkpoints 384 x 128 tiles x 128 threads x 16 B.
      {{8, 1536, 2048, 16}, kH200, Force::none, ts, 4, 384, 128, 67584, 1, 2981888 + 100663296},
      // Deterministic: one image per 32-channel tile (48 per tensor).
      {{8, 1536, 2048, 16, Dtype::bf16, true, false, true}, kH200, Force::none, ts, 4, 384, 128, 67584, 48,
       101548032 + 100663296},
      // Row 4: 160 tiles x 4 warps = 640 warps, under 1024 -> warp-scan; 80 KB of staging fits 4 states a round.
      {{1, 5120, 512, 16}, kH200, Force::none, warp, 8, 4, 640, 97280, 1, 434176},
      // Deterministic warp-scan: 640 tiles, about 512 blocks wanted -> 2 tiles a block, 320 slots (images).
      {{1, 5120, 512, 16, Dtype::bf16, true, false, true}, kH200, Force::none, warp, 8, 4, 320, 97280, 320,
       368640 + 2 * 320 * 32768},
      // Row 6: dstate 64 -> warp-scan.
      {{4, 2048, 2048, 64}, kH200, Force::none, warp, 8, 4, 256, 102400, 1,
       2097152 + 65536 + 2 * 4 * 64 * 2048 * 4},
      // The warp-count edge: 256 tiles (1024 warps) -> thread-states; 255 tiles -> warp-scan.
      {{1, 8192, 512, 16}, kH200, Force::none, ts, 4, 256, 32, 67584, 1,
       524288 + 65536 + 2 * 16 * 512 * 4 + 256 * 32 * 2048},
      {{1, 8160, 512, 16}, kH200, Force::none, warp, 8, 4, 1020, 97280, 1, 522240 + 65280 + 2 * 16 * 512 * 4},
      // Medium class (A100): row 1 stays on the warp-scan kernel; its 48 KB staging budget fits 2 states a round.
      {{8, 1536, 2048, 16}, kA100, Force::none, warp, 8, 2, 192, 60416, 1, 2981888},
      // ... unless forced (67.5 KB fits the medium class's 96 KB block budget).
      {{8, 1536, 2048, 16}, kA100, Force::ts, ts, 4, 384, 128, 67584, 1, 2981888 + 100663296},
      // Small class (T4): fp32 thread-states needs 72 KB, over the 64 KB budget -> the warp-scan kernel, forced or not.
      {{8, 1536, 2048, 16, Dtype::f32}, kT4, Force::ts, warp, 8, 1, 192, 44032, 1, 2981888},
      // Complex, variable B only: two accumulators (dA, constant dC), 2 x 300 floats per B row -> images of 76800 B.
      {{2, 64, 300, 16, Dtype::f32, true, true}, kH200, Force::ts, warp, 8, 4, 8, 97280, 1, 110592},
  };
  for (const BwdRow& r : rows) {
    SCOPED_TRACE(name(r.s));
    Problem p = problem(r.s);
    if (r.s.cplx) p.var_C = false;  // the complex row: variable B, constant C
    cuda::BwdPlan plan;
    ASSERT_EQ(cuda::plan_bwd(p, r.dev, r.force, &plan), SELSCAN_STATUS_SUCCESS) << selscan::last_error_message();
    ASSERT_EQ(plan.kernel, r.kernel);
    if (r.kernel == ts) {
      EXPECT_EQ(plan.ts.tpc, r.a);
      EXPECT_EQ(plan.ts.grid, r.b);
      EXPECT_EQ(plan.ts.ntc, r.c);
      EXPECT_EQ(plan.ts.threads, 32 * r.a);
      EXPECT_EQ(plan.ts.smem, r.smem);
    } else {
      EXPECT_EQ(plan.warp.warps, r.a);
      EXPECT_EQ(plan.warp.stile, r.b);
      EXPECT_EQ(plan.warp.slots, r.c);
      EXPECT_EQ(plan.warp.smem, r.smem);
    }
    EXPECT_EQ(plan.images, r.images);
    EXPECT_EQ(plan.total, r.total);
  }
}

TEST(KernelChoice, BackwardComplexWorkspace) {
  Problem p = problem({2, 64, 300, 16, Dtype::f32, true, true});
  p.var_C = false;
  cuda::BwdPlan plan;
  ASSERT_EQ(cuda::plan_bwd(p, kH200, cuda::Force::none, &plan), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(plan.nacc, 2);
  EXPECT_EQ(plan.accB, -1);
  EXPECT_EQ(plan.accC, 1);
  EXPECT_EQ(plan.var_row, 600);
  EXPECT_EQ(plan.var_elems, 2 * 16 * 600);
  EXPECT_EQ(plan.off_ps, 32768u);   // 2 accumulators x 2 x 64 x 16 float2
  EXPECT_EQ(plan.off_vb, 33792u);   // + 2 x 2 x 64 floats, 256-aligned
  EXPECT_EQ(plan.total, 110592u);   // + 76800 B of dB image, 256-aligned
  EXPECT_EQ(plan.zero_bytes, 76800u);
}

// Non-deterministic variable dB/dC are summed with atomics: the one memset covers both images (adjacent), and
// nothing past them; deterministic images are stored whole and need none.
TEST(KernelChoice, BackwardZeroesExactlyTheAtomicImages) {
  for (const bool det : {false, true})
    for (const cuda::Force f : {cuda::Force::none, cuda::Force::warp}) {
      const Problem p = problem({8, 1536, 2048, 16, Dtype::bf16, true, false, det});
      cuda::BwdPlan plan;
      ASSERT_EQ(cuda::plan_bwd(p, kH200, f, &plan), SELSCAN_STATUS_SUCCESS);
      const size_t img = static_cast<size_t>(plan.var_elems) * sizeof(float);
      EXPECT_EQ(plan.zero_bytes, det ? 0 : plan.off_vc + img - plan.off_vb) << det;
      EXPECT_LE(plan.off_vc + img * plan.images, plan.kernel == cuda::Kernel::ts ? plan.off_ck : plan.total);
    }
}

TEST(KernelChoice, BackwardRefusesMoreSharedMemoryThanTheDeviceAllows) {
  // Row 6 needs 46 KB of the warp-scan kernel at one state a round; a device allowing 32 KB cannot run it.
  const cuda::DeviceProps tiny{3, 75, 10, 32768};
  cuda::BwdPlan plan;
  EXPECT_EQ(cuda::plan_bwd(problem({4, 2048, 2048, 64}), tiny, cuda::Force::none, &plan), SELSCAN_STATUS_UNSUPPORTED);
  const std::string msg = selscan::last_error_message();
  EXPECT_NE(msg.find("needs 47104 bytes of shared memory per block, device 3 allows 32768"), std::string::npos) << msg;
}

// Block mode on the thread-states kernel launches the warp-scan unaligned instance beside it: a device whose shared
// memory holds the former's block but not the latter's cannot run the call, and the message names the latter.
TEST(KernelChoice, BlockModeChecksTheSharedMemoryOfBothKernels) {
  Problem q = problem({8, 1536, 2048, 16, Dtype::bf16, true});
  q.serving = true;
  q.varlen = true;
  q.fold_B = false;
  q.block_size = 16;
  q.table_cols = 128;
  cuda::FwdPlan f;
  ASSERT_EQ(cuda::plan_fwd(q, kH200, cuda::Force::none, &f), SELSCAN_STATUS_SUCCESS);
  ASSERT_EQ(f.kernel, cuda::Kernel::ts);
  ASSERT_GT(f.warp.smem, f.ts.smem) << "the case needs the warp-scan plan to be the larger one";
  const cuda::DeviceProps small{4, 90, 132, static_cast<int64_t>(f.ts.smem)};
  EXPECT_EQ(cuda::plan_fwd(q, small, cuda::Force::none, &f), SELSCAN_STATUS_UNSUPPORTED);
  const std::string msg = selscan::last_error_message();
  EXPECT_NE(msg.find("forward (warp-scan kernel)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs " + std::to_string(cuda::fwd_warp::smem_bytes(false, true, true, 8, 16, 16)) + " bytes"),
            std::string::npos)
      << msg;
  q.block_size = 0;  // the same call without blocks launches the thread-states kernel alone: it fits
  EXPECT_EQ(cuda::plan_fwd(q, small, cuda::Force::none, &f), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(f.kernel, cuda::Kernel::ts);
}

// The thread-states backward's copy-engine instance: 16-bit tensors whose every row the call reads starts on 16
// bytes, in code made for sm_90 (the ptx field), nowhere else. The tensors are never read here: the pointers only
// carry their alignment.
TEST(KernelChoice, BackwardCopyEngineOnlyForAlignedRowsInSm90Code) {
  const auto copy_engine = [](const Problem& p, const cuda::DeviceProps& dev) {
    cuda::BwdPlan plan;
    EXPECT_EQ(cuda::plan_bwd(p, dev, cuda::Force::none, &plan), SELSCAN_STATUS_SUCCESS);
    EXPECT_EQ(plan.kernel, cuda::Kernel::ts);
    return plan.ts.copy_engine;
  };
  const Shape row1{8, 1536, 2048, 16};
  EXPECT_TRUE(copy_engine(with_views(row1, true, 0), kH200));
  EXPECT_TRUE(copy_engine(with_views(row1, false, 0), kH200)) << "without z: three row maps";
  EXPECT_TRUE(copy_engine(with_views({8, 1536, 2048, 16, Dtype::f16}, true, 0), kH200));
  EXPECT_TRUE(copy_engine(with_views({8, 1536, 2048, 16, Dtype::bf16, false}, true, 0), kH200)) << "constant B/C";
  EXPECT_TRUE(copy_engine(with_views({8, 1536, 2040, 16}, true, 0), kH200)) << "L = 2040: rows of 4080 bytes";
  EXPECT_FALSE(copy_engine(with_views({8, 1536, 2044, 16}, true, 0), kH200)) << "rows of 4088 bytes: not on 16";
  EXPECT_FALSE(copy_engine(with_views(row1, true, 8), kH200)) << "u starts 8 bytes past 16";
  EXPECT_TRUE(copy_engine(with_views({8, 1536, 2048, 16, Dtype::f32}, true, 0), kH200)) << "fp32";
  EXPECT_TRUE(copy_engine(with_views({8, 1536, 2044, 16, Dtype::f32}, true, 0), kH200)) << "fp32 rows of 8176 bytes";
  EXPECT_FALSE(copy_engine(with_views({8, 1536, 2046, 16, Dtype::f32}, true, 0), kH200)) << "fp32 rows of 8184 bytes";
  // The same H200 running code made for another virtual arch (a build with compute_80 PTX only), and a part whose
  // code is sm_100's: neither has the instance.
  EXPECT_FALSE(copy_engine(with_views(row1, true, 0), cuda::DeviceProps{0, 90, 132, 232448, 80}));
  EXPECT_FALSE(copy_engine(with_views(row1, true, 0), cuda::DeviceProps{0, 100, 148, 232448, 100}));
  // The warp-scan backward has no such instance: the plan's flag stays off.
  cuda::BwdPlan plan;
  ASSERT_EQ(cuda::plan_bwd(with_views(row1, true, 0), kH200, cuda::Force::warp, &plan), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(plan.kernel, cuda::Kernel::warp);
  EXPECT_FALSE(plan.ts.copy_engine);
}

// The forward's copy-engine form of the slots instance (kernels/fwd/ts.cuh, kTma): in sm_90 code, for calls whose
// 16-bit rows the copy engine can read (bases on 16 bytes, L a multiple of 8) at the slots instance's block and tile
// shape. Its plan carries the slack that puts the slots on 128 bytes; without the copy engine the plan is as before.
TEST(KernelChoice, ForwardCopyEngineOnlyForTheSlotsInstanceInSm90Code) {
  const auto plan_of = [](const Problem& p, const cuda::DeviceProps& dev) {
    cuda::FwdPlan plan;
    EXPECT_EQ(cuda::plan_fwd(p, dev, cuda::Force::none, &plan), SELSCAN_STATUS_SUCCESS);
    EXPECT_EQ(plan.kernel, cuda::Kernel::ts);
    return plan.ts;
  };
  const Shape row2{4, 5120, 2048, 16};
  const cuda::fwd_ts::Plan t = plan_of(with_views(row2, true, 0), kH200);
  EXPECT_TRUE(t.copy_engine);
  EXPECT_EQ(t.min_blocks, 5);
  EXPECT_EQ(t.smem, 44480u + cuda::fwd_ts::kTmaSlack);
  EXPECT_TRUE(plan_of(with_views(row2, false, 0), kH200).copy_engine) << "without z: four boxes a tile";
  EXPECT_TRUE(plan_of(with_views({4, 5120, 2048, 16, Dtype::f16}, true, 0), kH200).copy_engine);
  EXPECT_TRUE(plan_of(with_views({4, 5120, 2040, 16}, true, 0), kH200).copy_engine) << "L = 2040: rows of 4080 bytes";
  const cuda::fwd_ts::Plan odd = plan_of(with_views({4, 5120, 2044, 16}, true, 0), kH200);
  EXPECT_FALSE(odd.copy_engine) << "rows of 4088 bytes: not on 16";
  EXPECT_EQ(odd.smem, 44480u) << "the cp.async slots, no slack";
  EXPECT_FALSE(plan_of(with_views(row2, true, 8), kH200).copy_engine) << "u starts 8 bytes past 16";
  EXPECT_FALSE(plan_of(with_views({4, 5120, 2048, 16, Dtype::bf16, false}, true, 0), kH200).copy_engine)
      << "constant B/C: not the packed instance";
  EXPECT_FALSE(plan_of(with_views({8, 1536, 2048, 16}, true, 0), kH200).copy_engine)
      << "row 1: the 3-blocks instance, no slots";
  EXPECT_FALSE(plan_of(with_views({4, 5120, 2048, 16, Dtype::f32}, true, 0), kH200).copy_engine) << "fp32";
  // The same H200 running compute_80 PTX (no slots), and a B200 running sm_100 code (slots, but the copy-engine form
  // is sm_90 code only).
  EXPECT_FALSE(plan_of(with_views(row2, true, 0), cuda::DeviceProps{0, 90, 132, 232448, 80}).copy_engine);
  const cuda::fwd_ts::Plan b200 = plan_of(with_views(row2, true, 0), cuda::DeviceProps{0, 100, 148, 232448, 100});
  EXPECT_FALSE(b200.copy_engine);
  EXPECT_EQ(b200.smem, 44480u);
}

// Serving calls (docs/serving.md): the forward of one follows the dense rules, with the dense call's plan (8
// sequences packed over 2048 steps: the grid counts sequences, the tile length does not depend on the length) but the
// thread-states kernel's 5-blocks-per-SM instance, the one with a serving variant; forced to the warp-scan kernel it
// takes that kernel's serving variant. The backward stays on the warp-scan kernel. A packed call's variable dB/dC
// images have one row.
TEST(KernelChoice, ServingForwardTakesTheThreadStatesServingInstance) {
  Problem p = problem({8, 1536, 2048, 16, Dtype::bf16, true, false, true});
  cuda::FwdPlan f;
  cuda::BwdPlan b;
  ASSERT_EQ(cuda::plan_fwd(p, kH200, cuda::Force::none, &f), SELSCAN_STATUS_SUCCESS);
  ASSERT_EQ(cuda::plan_bwd(p, kH200, cuda::Force::none, &b), SELSCAN_STATUS_SUCCESS);
  ASSERT_EQ(f.kernel, cuda::Kernel::ts) << "the dense call of this shape takes the thread-states kernels";
  ASSERT_EQ(b.kernel, cuda::Kernel::ts);
  const int64_t dense_elems = b.var_elems;
  for (const bool packed : {true, false}) {  // packed sequences, or a state pool over batch rows
    SCOPED_TRACE(packed ? "packed" : "pool");
    Problem q = p;
    q.serving = true;
    q.varlen = packed;
    q.fold_B = false;
    q.slots = packed ? 0 : 16;
    EXPECT_EQ(cuda::plan_fwd(q, kH200, cuda::Force::warp, &f), SELSCAN_STATUS_SUCCESS);
    EXPECT_EQ(f.kernel, cuda::Kernel::warp);
    EXPECT_EQ(cuda::plan_fwd(q, kH200, cuda::Force::none, &f), SELSCAN_STATUS_SUCCESS);
    ASSERT_EQ(f.kernel, cuda::Kernel::ts);
    EXPECT_EQ(f.ts.shape.tpc, 4);
    EXPECT_EQ(f.ts.shape.ch, 16);
    EXPECT_EQ(f.ts.shape.tt, 32);
    EXPECT_EQ(f.ts.shape.tiles_per_group, 96);
    EXPECT_EQ(f.ts.min_blocks, 4) << "the serving instance: at 5 it spilled";
    EXPECT_EQ(f.ts.blocks, 768);
    EXPECT_EQ(f.ts.smem, 20672u);
    for (cuda::Force force : {cuda::Force::none, cuda::Force::ts}) {
      EXPECT_EQ(cuda::plan_bwd(q, kH200, force, &b), SELSCAN_STATUS_SUCCESS);
      EXPECT_EQ(b.kernel, cuda::Kernel::warp);
      EXPECT_EQ(b.var_elems * (packed ? q.batch : 1), dense_elems) << "packed: one batch row of variable B/C";
    }
    // Block mode: with a block size the warp-scan forward's aligned instance takes (a multiple of 16), the
    // thread-states kernel with a tile of a multiple of 16 steps and the warp-scan plan beside it for the unaligned
    // instance; with any other block size the warp-scan kernel, forced or not.
    q.table_cols = 128;
    for (const int64_t K : {16, 256, 8, 100}) {
      SCOPED_TRACE("block size " + std::to_string(K));
      q.block_size = K;
      EXPECT_EQ(cuda::plan_fwd(q, kH200, cuda::Force::warp, &f), SELSCAN_STATUS_SUCCESS);
      EXPECT_EQ(f.kernel, cuda::Kernel::warp);
      f = cuda::FwdPlan{};
      EXPECT_EQ(cuda::plan_fwd(q, kH200, cuda::Force::none, &f), SELSCAN_STATUS_SUCCESS);
      if (K % 16 == 0) {
        ASSERT_EQ(f.kernel, cuda::Kernel::ts);
        EXPECT_EQ(f.ts.shape.tt, 32) << "the dense call's tile: it runs in 16-step pieces, block ends on piece ends";
        EXPECT_EQ(f.ts.min_blocks, 4) << "block mode's instance";
        EXPECT_EQ(f.warp.warps, 8) << "the unaligned instance's plan";
        EXPECT_EQ(f.warp.smem, cuda::fwd_warp::smem_bytes(false, q.var_B, q.var_C, 8, 16, K));
      } else {
        EXPECT_EQ(f.kernel, cuda::Kernel::warp);
      }
    }
  }
}

}  // namespace
}  // namespace selscan_test
