// Forward instances for itype __nv_bfloat16 (real and complex weights). One TU per itype so builds run in parallel.
#include "fwd.cuh"

namespace selscan::kern {

Status fwd_bf16(const Problem& p, cudaStream_t stream) {
  return p.is_complex ? launch_fwd_typed<__nv_bfloat16, true>(p, stream) : launch_fwd_typed<__nv_bfloat16, false>(p, stream);
}

}  // namespace selscan::kern
