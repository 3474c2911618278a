// Forward instances for itype float (real and complex weights). One TU per itype so builds run in parallel.
#include "fwd.cuh"

namespace selscan::kern {

Status fwd_f32(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  return p.is_complex ? launch_fwd_typed<float, true>(p, plan, l) : launch_fwd_typed<float, false>(p, plan, l);
}

}  // namespace selscan::kern
