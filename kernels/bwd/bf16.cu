// Backward instances for itype __nv_bfloat16 (real and complex weights). One TU per itype so builds run in parallel.
#include "launch.cuh"

namespace selscan::kern::bwd {

Status launch_bf16(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l) {
  return launch<__nv_bfloat16>(p, plan, l);
}

}  // namespace selscan::kern::bwd
