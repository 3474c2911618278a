// Backward launcher entry points (src/cuda/launch.h): the call's layout (Plan) and the itype dispatch; the
// kernels of each itype live in their own TU (bwd_f32.cu, bwd_f16.cu, bwd_bf16.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "bwd.cuh"
#include "bwd_ts.cuh"
#include "cuda/launch.h"

namespace selscan::kern::bwd {
Status launch_f32(const Problem& p, const Plan& plan, cudaStream_t st, void* ws);
Status launch_f16(const Problem& p, const Plan& plan, cudaStream_t st, void* ws);
Status launch_bf16(const Problem& p, const Plan& plan, cudaStream_t st, void* ws);

namespace {
size_t align_up(size_t v) { return (v + 255) / 256 * 256; }

// Shared memory one block may use, per family: sm_90 parts allow 227 KB, sm_86/89 99 KB, sm_75 64 KB.
size_t smem_cap(cuda::Family f) {
  switch (f) {
    case cuda::Family::sm90: return 200 * 1024;
    case cuda::Family::sm80: return 96 * 1024;
    default: return 64 * 1024;
  }
}

// Blocks the deterministic mode aims for when it trades parallelism for fewer partial images.
constexpr int64_t kDetTargetBlocks = 512;
// Shared memory the staged variable B/C rows and the dB/dC reduction buffers may take; sets the states per
// barrier round (sm_90: about 100 KB a block in all, so two blocks share an SM).
int64_t red_budget(cuda::Family f) {
  switch (f) {
    case cuda::Family::sm90: return 80 * 1024;
    case cuda::Family::sm80: return 48 * 1024;
    default: return 32 * 1024;
  }
}
}  // namespace

Plan make_plan(const Problem& p, cuda::Family f) {
  Plan pl;
  const bool cplx = p.is_complex;
  const int64_t wsz = cplx ? 2 : 1;
  const int nvar = (p.var_B ? 1 : 0) + (p.var_C ? 1 : 0);
  const int isz = p.itype == Dtype::f32 ? 4 : 2;
  pl.nacc = 1;
  if (!p.var_B) pl.accB = pl.nacc++;
  if (!p.var_C) pl.accC = pl.nacc++;
  pl.lane_acc = use_lane_acc(p.dstate, cplx, pl.nacc);

  const int64_t cpg = p.dim / p.groups;
  // Channels per block: as many as the group has (up to 8) and the shared memory allows.
  int warps = kMaxWarps;
  while (warps > 1 && warps / 2 >= cpg) warps /= 2;
  const size_t cap = smem_cap(f);
  auto bytes = [&](int w, int s) {
    return static_cast<size_t>(smem_layout(p.dstate, cplx, pl.nacc, nvar, pl.lane_acc, w, s, isz).total) *
           sizeof(float);
  };
  while (warps > 1 && bytes(warps, 1) > cap) warps /= 2;
  int stile = static_cast<int>(p.dstate);  // without variable B/C the state loop has no barriers
  if (nvar > 0) {
    const int64_t per_state = static_cast<int64_t>(nvar) * kPiece * wsz * (warps * 4 + 2 * isz);
    stile = static_cast<int>(std::clamp<int64_t>(red_budget(f) / per_state, 1, std::min<int64_t>(p.dstate, 8)));
    while (stile > 1 && bytes(warps, stile) > cap) --stile;
  }
  pl.warps = warps;
  pl.stile = stile;
  pl.smem = bytes(warps, stile);
  pl.tiles_per_group = (cpg + warps - 1) / warps;

  pl.det_var = p.deterministic && nvar > 0;
  // The thread-states kernel, when it serves the call: deterministic variable dB/dC there are one image per
  // 32-channel tile (each block stores its tile's complete sums; the conversion adds the images in order).
  const KernelChoice choice = ts::bwd_choice();
  const bool use_ts = choice != KernelChoice::warp && ts::plan(p, f, smem_cap(f), choice == KernelChoice::ts, &pl);
  if (use_ts) {
    pl.slots = pl.det_var ? pl.ts_tiles : 1;
    pl.tiles_per_slot = 1;
  } else if (pl.det_var) {
    const int64_t bg = p.batch * p.groups;
    const int64_t want = std::max<int64_t>(1, (kDetTargetBlocks + bg - 1) / bg);
    const int64_t slots = std::min(pl.tiles_per_group, want);
    pl.tiles_per_slot = (pl.tiles_per_group + slots - 1) / slots;
    pl.slots = (pl.tiles_per_group + pl.tiles_per_slot - 1) / pl.tiles_per_slot;
  } else {
    pl.slots = pl.tiles_per_group;
    pl.tiles_per_slot = 1;
  }

  pl.var_row = (p.seqlen * wsz + 3) / 4 * 4;
  pl.var_elems = p.batch * p.groups * p.dstate * pl.var_row;
  const size_t img = static_cast<size_t>(pl.var_elems) * sizeof(float) * (pl.det_var ? pl.slots : 1);
  size_t off = 0;
  pl.off_pw = off;
  off = align_up(off + static_cast<size_t>(pl.nacc) * p.batch * p.dim * p.dstate * wsz * sizeof(float));
  pl.off_ps = off;
  off = align_up(off + 2 * static_cast<size_t>(p.batch * p.dim) * sizeof(float));
  pl.off_vb = off;
  if (p.var_B) off = align_up(off + img);
  pl.off_vc = off;
  if (p.var_C) off = align_up(off + img);
  if (use_ts) {
    pl.off_ck = off;
    off = align_up(off + pl.ts_ck_bytes);
  }
  pl.total = off;
  return pl;
}

}  // namespace selscan::kern::bwd

namespace selscan::cuda {

size_t bwd_workspace_bytes(const Problem& p, Family f) { return kern::bwd::make_plan(p, f).total; }

Status launch_bwd(const Problem& p, Family f, void* stream, void* workspace, size_t workspace_bytes) {
  const kern::bwd::Plan plan = kern::bwd::make_plan(p, f);
  if (workspace_bytes < plan.total || (plan.total > 0 && workspace == nullptr))
    return fail(SELSCAN_STATUS_WORKSPACE_TOO_SMALL,
                "backward: workspace of " + std::to_string(workspace_bytes) + " bytes, need " +
                    std::to_string(plan.total));
  int dev = 0, optin = 0;
  const size_t smem = plan.ts ? plan.ts_smem : plan.smem;  // of the main kernel the plan chose
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
      smem > static_cast<size_t>(optin))
    return fail(SELSCAN_STATUS_UNSUPPORTED, "backward: needs " + std::to_string(smem) +
                                                " bytes of shared memory per block, device " + std::to_string(dev) +
                                                " allows " + std::to_string(optin));
  const auto st = static_cast<cudaStream_t>(stream);
  switch (p.itype) {
    case Dtype::f32: return kern::bwd::launch_f32(p, plan, st, workspace);
    case Dtype::f16: return kern::bwd::launch_f16(p, plan, st, workspace);
    case Dtype::bf16: return kern::bwd::launch_bf16(p, plan, st, workspace);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "backward launcher: itype is not f32/f16/bf16");
}

}  // namespace selscan::cuda
