// Forward instances for itype __half (real and complex weights). One TU per itype so builds run in parallel.
#include "launch.cuh"

namespace selscan::kern::fwd {

Status launch_f16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  return launch<__half>(p, plan, l);
}

}  // namespace selscan::kern::fwd
