// Backward instances for itype float (real and complex weights). One TU per itype so builds run in parallel.
#include "launch.cuh"

namespace selscan::kern::bwd {

Status launch_f32(const Problem& p, const cuda::BwdPlan& plan, const cuda::Launch& l) {
  return launch<float>(p, plan, l);
}

}  // namespace selscan::kern::bwd
