// Forward instances for itype __half (real and complex weights). One TU per itype so builds run in parallel.
#include "fwd.cuh"

namespace selscan::kern {

Status fwd_f16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  return p.is_complex ? launch_fwd_typed<__half, true>(p, plan, l) : launch_fwd_typed<__half, false>(p, plan, l);
}

}  // namespace selscan::kern
