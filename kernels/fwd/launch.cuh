// The forward launch for one itype: the kernel its plan names (src/cuda/select.cpp chose it), with the plan's grid,
// block and shared memory. Included by the per-itype instance files (f32.cu, f16.cu, bf16.cu).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "../common/launch.cuh"
#include "cuda/launch.h"
#include "cuda/plans.h"
#include "problem.h"
#include "ts.cuh"
#include "warp.cuh"

namespace selscan::kern::fwd {

// One launch of a plan's grid: the kernel's shared-memory limit (raised once per device), the launch, its status.
template <typename Kernel, typename... Args>
Status launch_kernel(Kernel* kernel, SmemLimit& limit, int64_t blocks, int threads, size_t smem, const cuda::Launch& l,
                     const Args&... args) {
  if (const Status s = limit.raise(kernel, smem, l, "forward: cudaFuncSetAttribute(shared memory)");
      s != SELSCAN_STATUS_SUCCESS)
    return s;
  kernel<<<static_cast<unsigned>(blocks), threads, smem, static_cast<cudaStream_t>(l.stream)>>>(args...);
  return launch_status("forward: launching the kernel");
}

// The warp-scan forward with K steps per lane (its serving variant for calls with serving fields, and that
// variant's block-mode instances for calls with state_block_size > 0).
template <typename T, bool kComplex, int K, bool kServing, int kBlocks = kNoBlocks>
Status launch_warp(const Problem& p, const cuda::fwd_warp::Plan& w, const cuda::Launch& l) {
  static SmemLimit limit;
  return launch_kernel(&fwd_warp_kernel<T, kComplex, K, cuda::fwd_warp::kMinBlocks, kServing, kBlocks>, limit,
                       w.blocks, w.warps * 32, w.smem, l, p, w.tiles_per_group);
}

// The thread-states forward with its launch-bounds variant (kServing: its instances for serving calls, kBlocks: the
// block-mode one).
template <typename T, int kMinBlocks, bool kServing = false, int kBlocks = kNoBlocks, bool kPackBC = false>
Status launch_ts(const Problem& p, const cuda::fwd_ts::Plan& t, const cuda::Launch& l) {
  static SmemLimit limit;
  return launch_kernel(&ts::fwd_ts_kernel<T, kMinBlocks, kServing, kBlocks, kPackBC>, limit, t.blocks,
                       t.shape.ch * t.shape.tpc, t.smem, l, p, t.shape, ts::NoTileMaps{});
}

// The slots instance's copy-engine form, where the plan chose it and the driver encoded every map; else the cp.async
// form.
template <typename T>
Status launch_ts_slots(const Problem& p, const cuda::fwd_ts::Plan& t, const cuda::Launch& l) {
  constexpr int kMany = cuda::fwd_ts::kMinBlocksMany;
  ts::TileMaps maps;
  if (!t.copy_engine || !ts::tile_maps(p, &maps)) return launch_ts<T, kMany, false, kNoBlocks, true>(p, t, l);
  static SmemLimit limit;
  return launch_kernel(&ts::fwd_ts_kernel<T, kMany, false, kNoBlocks, true, true>, limit, t.blocks,
                       t.shape.ch * t.shape.tpc, t.smem, l, p, t.shape, maps);
}

// The dense thread-states forward at launch-bounds variant MINB; a 16-bit itype with variable B and C at the default
// plan's 4 threads a channel takes the instance with the packed B/C tile (kernels/fwd/ts.cuh, steps_packed), whose
// pitch is that compile-time 4; forced plans at other widths keep the float tiles.
template <typename T, int MINB>
Status launch_ts_dense_at(const Problem& p, const cuda::fwd_ts::Plan& t, const cuda::Launch& l) {
  if constexpr (sizeof(T) == 2) {
    if (cuda::fwd_ts::packed_bc(2, p.var_B, p.var_C, t.shape.tpc)) {
      if constexpr (MINB == cuda::fwd_ts::kMinBlocksMany) return launch_ts_slots<T>(p, t, l);
      return launch_ts<T, MINB, false, kNoBlocks, true>(p, t, l);
    }
  }
  return launch_ts<T, MINB>(p, t, l);
}

// The plan's launch-bounds variant (src/cuda/select.cpp).
template <typename T>
Status launch_ts_dense(const Problem& p, const cuda::fwd_ts::Plan& t, const cuda::Launch& l) {
  using namespace cuda::fwd_ts;
  switch (t.min_blocks) {
    case kMinBlocksRoomy: return launch_ts_dense_at<T, kMinBlocksRoomy>(p, t, l);
    case kMinBlocksMany: return launch_ts_dense_at<T, kMinBlocksMany>(p, t, l);
    default: return launch_ts_dense_at<T, kMinBlocksFew>(p, t, l);
  }
}

template <typename T, bool kComplex>
Status launch_typed(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  if constexpr (kComplex) {
    // Serving calls have real weights (validate.cpp).
    return launch_warp<T, true, cuda::fwd_warp::kItemsComplex, false>(p, plan.warp, l);
  } else {
    constexpr int K = cuda::fwd_warp::kItemsReal;
    // Serving calls on the thread-states kernel: 4 blocks per SM (the plan's choice).
    const bool ts = plan.kernel == cuda::Kernel::ts;
    if (p.serving && p.block_size > 0) {
      // Block mode: an aligned instance (the thread-states or the warp-scan kernel's, as the plan chose) serves the
      // sequences whose block ends fall on the last of every K steps, the warp-scan unaligned one the rest (with a
      // block size K does not divide, every sequence, and the plan chose the warp-scan kernel; without
      // context_lens, where every sequence starts at 0, none: its launch would be a grid of blocks that return at
      // once).
      if (p.block_size % K != 0)
        return launch_warp<T, false, K, true, kBlocksUnaligned>(p, plan.warp, l);
      const Status s = ts ? launch_ts<T, cuda::fwd_ts::kMinBlocksFew, true, kBlocksAligned>(p, plan.ts, l)
                          : launch_warp<T, false, K, true, kBlocksAligned>(p, plan.warp, l);
      if (s != SELSCAN_STATUS_SUCCESS || p.context_lens.p == nullptr) return s;
      return launch_warp<T, false, K, true, kBlocksUnaligned>(p, plan.warp, l);
    }
    if (ts && p.serving) return launch_ts<T, cuda::fwd_ts::kMinBlocksFew, true>(p, plan.ts, l);
    if (ts) return launch_ts_dense<T>(p, plan.ts, l);
    if (p.serving) return launch_warp<T, false, K, true>(p, plan.warp, l);
    return launch_warp<T, false, K, false>(p, plan.warp, l);
  }
}

template <typename T>
Status launch(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  return p.is_complex ? launch_typed<T, true>(p, plan, l) : launch_typed<T, false>(p, plan, l);
}

}  // namespace selscan::kern::fwd
