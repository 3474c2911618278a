// Forward instances for itype float (real and complex weights). One TU per itype so builds run in parallel.
#include "fwd.cuh"

namespace selscan::kern {

Status fwd_f32(const Problem& p, cudaStream_t stream) {
  return p.is_complex ? launch_fwd_typed<float, true>(p, stream) : launch_fwd_typed<float, false>(p, stream);
}

}  // namespace selscan::kern
