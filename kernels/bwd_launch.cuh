// The backward launch for one itype: the main kernel the Plan chose (thread-states, bwd_ts.cuh, or warp-scan,
// bwd.cuh), then the fixed-order parameter sums and the variable dB/dC conversion shared by both.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "bwd.cuh"
#include "bwd_ts.cuh"

namespace selscan::kern::bwd {

inline Status check_launch(const char* what) { return launch_status(std::string("backward: launching ") + what); }

inline unsigned grid_for(int64_t work, int threads) {
  int64_t blocks = (work + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65536) blocks = 65536;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks);
}

template <typename T, bool kC>
Status launch_typed(const Problem& p, const Plan& plan, cudaStream_t st, void* ws) {
  char* base = static_cast<char*>(ws);
  Args a{};
  a.p = p;
  a.tiles_per_group = plan.tiles_per_group;
  a.slots = plan.slots;
  a.tiles_per_slot = plan.tiles_per_slot;
  a.var_elems = plan.var_elems;
  a.var_row = plan.var_row;
  a.lane_acc = plan.lane_acc;
  a.stile = plan.stile;
  a.nacc = plan.nacc;
  a.accB = plan.accB;
  a.accC = plan.accC;
  a.det_var = plan.det_var;
  a.pw = reinterpret_cast<float*>(base + plan.off_pw);
  a.ps = reinterpret_cast<float*>(base + plan.off_ps);
  a.vb = p.var_B ? reinterpret_cast<float*>(base + plan.off_vb) : nullptr;
  a.vc = p.var_C ? reinterpret_cast<float*>(base + plan.off_vc) : nullptr;

  if (!plan.det_var) {
    const size_t bytes = static_cast<size_t>(plan.var_elems) * sizeof(float);
    if (p.var_B && cudaMemsetAsync(a.vb, 0, bytes, st) != cudaSuccess) return check_launch("cudaMemsetAsync(dB)");
    if (p.var_C && cudaMemsetAsync(a.vc, 0, bytes, st) != cudaSuccess) return check_launch("cudaMemsetAsync(dC)");
  }

  if (plan.ts) {
    if constexpr (!kC) {
      auto kfn = ts::bwd_ts_kernel<T>;
      if (Status s = set_smem(kfn, plan.ts_smem, "backward"); s != SELSCAN_STATUS_SUCCESS) return s;
      kfn<<<static_cast<unsigned>(plan.ts_grid), ts::kCh * plan.ts_tpc, plan.ts_smem, st>>>(
          a, plan, reinterpret_cast<float4*>(base + plan.off_ck));
      if (Status s = check_launch("the thread-states backward kernel"); s != SELSCAN_STATUS_SUCCESS) return s;
    }
  } else {
    auto kfn = bwd_main<T, kC>;
    if (Status s = set_smem(kfn, plan.smem, "backward"); s != SELSCAN_STATUS_SUCCESS) return s;
    int64_t blocks = p.batch * p.groups * plan.slots;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;  // the kernel loops over the rest
    kfn<<<static_cast<unsigned>(blocks), 32 * plan.warps, plan.smem, st>>>(a);
    if (Status s = check_launch("the backward kernel"); s != SELSCAN_STATUS_SUCCESS) return s;
  }

  bwd_params<kC><<<grid_for(p.dim * p.dstate, 256), 256, 0, st>>>(a);
  if (Status s = check_launch("the backward parameter reduction"); s != SELSCAN_STATUS_SUCCESS) return s;

  const int64_t Lr = p.seqlen * (kC ? 2 : 1);
  const int64_t rows = p.batch * p.groups * p.dstate;
  const int64_t nimg = plan.det_var ? plan.slots : 1;
  if (p.var_B) {
    bwd_var_out<T><<<grid_for(rows * Lr, 256), 256, 0, st>>>(a.vb, nimg, plan.var_elems, plan.var_row, p.dB,
                                                             p.groups, p.dstate, Lr, rows);
    if (Status s = check_launch("the dB conversion"); s != SELSCAN_STATUS_SUCCESS) return s;
  }
  if (p.var_C) {
    bwd_var_out<T><<<grid_for(rows * Lr, 256), 256, 0, st>>>(a.vc, nimg, plan.var_elems, plan.var_row, p.dC,
                                                             p.groups, p.dstate, Lr, rows);
    if (Status s = check_launch("the dC conversion"); s != SELSCAN_STATUS_SUCCESS) return s;
  }
  return SELSCAN_STATUS_SUCCESS;
}

template <typename T>
Status launch(const Problem& p, const Plan& plan, cudaStream_t st, void* ws) {
  return p.is_complex ? launch_typed<T, true>(p, plan, st, ws) : launch_typed<T, false>(p, plan, st, ws);
}

}  // namespace selscan::kern::bwd
