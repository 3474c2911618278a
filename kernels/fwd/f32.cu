// Forward instances for itype float (real and complex weights). One TU per itype so builds run in parallel.
#include "launch.cuh"

namespace selscan::kern::fwd {

Status launch_f32(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  return launch<float>(p, plan, l);
}

}  // namespace selscan::kern::fwd
