// Forward instances for itype __nv_bfloat16 (real and complex weights). One TU per itype so builds run in parallel.
#include "launch.cuh"

namespace selscan::kern::fwd {

Status launch_bf16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  return launch<__nv_bfloat16>(p, plan, l);
}

}  // namespace selscan::kern::fwd
