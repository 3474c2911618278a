// Forward launcher entry point (src/cuda/launch.h): the itype instance of the plan; each lives in its own TU.
#include "cuda/launch.h"

namespace selscan::kern {
Status fwd_f32(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l);
Status fwd_f16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l);
Status fwd_bf16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l);
}  // namespace selscan::kern

namespace selscan::cuda {

Status launch_fwd(const Problem& p, const FwdPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::fwd_f32(p, plan, l);
    case Dtype::f16: return kern::fwd_f16(p, plan, l);
    case Dtype::bf16: return kern::fwd_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "forward launcher: itype is not f32/f16/bf16");
}

}  // namespace selscan::cuda
