// Forward instances for itype __nv_bfloat16 (real and complex weights). One TU per itype so builds run in parallel.
#include "fwd.cuh"

namespace selscan::kern {

Status fwd_bf16(const Problem& p, const cuda::FwdPlan& plan, const cuda::Launch& l) {
  return p.is_complex ? launch_fwd_typed<__nv_bfloat16, true>(p, plan, l) : launch_fwd_typed<__nv_bfloat16, false>(p, plan, l);
}

}  // namespace selscan::kern
