// Backward launcher entry point (src/cuda/launch.h): the itype instance of the plan; the kernels of each itype live
// in their own TU (bwd_f32.cu, bwd_f16.cu, bwd_bf16.cu).
#include "cuda/launch.h"

namespace selscan::kern::bwd {
Status launch_f32(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l);
Status launch_f16(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l);
Status launch_bf16(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l);
}  // namespace selscan::kern::bwd

namespace selscan::cuda {

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
