// The launchers declared in src/cuda/launch.h: each picks the itype instance of its direction (fwd/{f32,f16,bf16}.cu,
// bwd/{f32,f16,bf16}.cu), which launches the kernels of the plan.
#include "cuda/launch.h"

namespace selscan::kern::fwd {
Status launch_f32(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l);
Status launch_f16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l);
Status launch_bf16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l);
}  // namespace selscan::kern::fwd

namespace selscan::kern::bwd {
Status launch_f32(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l);
Status launch_f16(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l);
Status launch_bf16(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l);
}  // namespace selscan::kern::bwd

namespace selscan::cuda {

Status launch_fwd(const Problem& p, const FwdPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::fwd::launch_f32(p, plan, l);
    case Dtype::f16: return kern::fwd::launch_f16(p, plan, l);
    case Dtype::bf16: return kern::fwd::launch_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "forward launcher: itype is not f32/f16/bf16");
}

Status launch_bwd(const Problem& p, const BwdPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::bwd::launch_f32(p, plan, l);
    case Dtype::f16: return kern::bwd::launch_f16(p, plan, l);
    case Dtype::bf16: return kern::bwd::launch_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "backward launcher: itype is not f32/f16/bf16");
}

}  // namespace selscan::cuda
