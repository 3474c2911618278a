// The backward launch for one itype: the main kernel the plan names (thread-states, ts.cuh, or warp-scan, warp.cuh;
// src/cuda/select.cpp chose it), then the fixed-order parameter sums and the variable dB/dC conversion both share
// (reduce.cuh, one launch). Included by the per-itype instance files (f32.cu, f16.cu, bf16.cu).
#pragma once

#include <cuda_runtime.h>

#include "../common/launch.cuh"
#include "cuda/launch.h"
#include "cuda/plans.h"
#include "problem.h"
#include "reduce.cuh"
#include "ts.cuh"
#include "warp.cuh"

namespace selscan::kern::bwd {

inline unsigned grid_for(int64_t work, int threads) {
  int64_t blocks = (work + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65536) blocks = 65536;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks);
}

template <typename T, bool kC>
Status launch_typed(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l) {
  const auto st = static_cast<cudaStream_t>(l.stream);
  char* base = static_cast<char*>(l.workspace);
  Args a{};
  a.p = p;
  a.tiles_per_group = plan.warp.tiles_per_group;
  a.slots = plan.kernel == cuda::Kernel::warp ? plan.warp.slots : plan.images;
  a.tiles_per_slot = plan.warp.tiles_per_slot;
  a.var_elems = plan.var_elems;
  a.var_row = plan.var_row;
  a.lane_acc = plan.warp.lane_acc;
  a.stile = plan.warp.stile;
  a.nacc = plan.nacc;
  a.accB = plan.accB;
  a.accC = plan.accC;
  a.det_var = plan.det_var;
  a.pw = reinterpret_cast<float*>(base + plan.off_pw);
  a.ps = reinterpret_cast<float*>(base + plan.off_ps);
  a.vb = p.var_B ? reinterpret_cast<float*>(base + plan.off_vb) : nullptr;
  a.vc = p.var_C ? reinterpret_cast<float*>(base + plan.off_vc) : nullptr;

  if (plan.zero_bytes > 0 && cudaMemsetAsync(base + plan.off_vb, 0, plan.zero_bytes, st) != cudaSuccess)
    return launch_status("backward: launching cudaMemsetAsync(dB/dC images)");

  if (plan.kernel == cuda::Kernel::ts) {
    if constexpr (!kC) {
      // The copy-engine instance where the plan chose it, unless the driver cannot encode the call's maps.
      static SmemLimit limit, tma_limit;
      ts::TileMaps maps{};
      const bool tma = plan.ts.copy_engine && ts::tile_maps(p, &maps);
      auto kfn = tma ? ts::bwd_ts_kernel<T, true> : ts::bwd_ts_kernel<T, false>;
      // The copy-engine instance's static shared memory (its barrier and phase words) counts against the same
      // per-block opt-in limit as the dynamic part, so its dynamic limit is raised that much less.
      cuda::Launch lt = l;
      if (tma) lt.smem_optin -= ts::kTmaStaticSmem;
      if (Status s = (tma ? tma_limit : limit)
                         .raise(kfn, plan.ts.smem, lt, "backward: cudaFuncSetAttribute(shared memory)");
          s != SELSCAN_STATUS_SUCCESS)
        return s;
      kfn<<<static_cast<unsigned>(plan.ts.grid), plan.ts.threads, plan.ts.smem, st>>>(
          a, ts::shape_of(plan.ts), reinterpret_cast<float4*>(base + plan.off_ck), maps);
      if (Status s = launch_status("backward: launching the thread-states backward kernel");
          s != SELSCAN_STATUS_SUCCESS)
        return s;
    }
  } else {
    // Serving calls (real weights only, validate.cpp) take the warp-scan kernel's serving variant.
    static SmemLimit limit, serving_limit;
    const bool serving = !kC && p.serving;
    auto kfn = serving ? bwd_warp_kernel<T, kC, !kC> : bwd_warp_kernel<T, kC, false>;
    if (Status s = (serving ? serving_limit : limit)
                       .raise(kfn, plan.warp.smem, l, "backward: cudaFuncSetAttribute(shared memory)");
        s != SELSCAN_STATUS_SUCCESS)
      return s;
    kfn<<<static_cast<unsigned>(plan.warp.blocks), 32 * plan.warp.warps, plan.warp.smem, st>>>(a);
    if (Status s = launch_status("backward: launching the backward kernel"); s != SELSCAN_STATUS_SUCCESS) return s;
  }

  FinishArgs f{};
  f.batch = p.batch;
  f.dim = p.dim;
  f.dstate = p.dstate;
  f.groups = p.groups;
  f.Lr = p.seqlen * (kC ? 2 : 1);
  f.rows = p.rows() * p.groups * p.dstate;  // rows of variable B/C: one batch row when packed
  f.var_elems = plan.var_elems;
  f.var_row = plan.var_row;
  f.images = plan.images;
  f.accB = plan.accB;
  f.accC = plan.accC;
  f.var_B = p.var_B;
  f.var_C = p.var_C;
  f.dA = p.dA;
  f.dB = p.dB;
  f.dC = p.dC;
  f.dD = p.dD;
  f.ddelta_bias = p.ddelta_bias;
  f.pw = a.pw;
  f.ps = a.ps;
  f.vb = a.vb;
  f.vc = a.vc;
  const FinishGrid g{grid_for(p.dim * p.dstate, 256), p.var_B ? grid_for(f.rows * f.Lr, 256) : 0,
                     p.var_C ? grid_for(f.rows * f.Lr, 256) : 0};
  bwd_finish<T, kC><<<static_cast<unsigned>(g.params + g.dB + g.dC), 256, 0, st>>>(f, g);
  if (Status s = launch_status("backward: launching the parameter sums and dB/dC conversion");
      s != SELSCAN_STATUS_SUCCESS)
    return s;
  return SELSCAN_STATUS_SUCCESS;
}

template <typename T>
Status launch(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l) {
  return p.is_complex ? launch_typed<T, true>(p, plan, l) : launch_typed<T, false>(p, plan, l);
}

}  // namespace selscan::kern::bwd
