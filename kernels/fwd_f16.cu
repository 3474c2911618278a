// Forward instances for itype __half (real and complex weights). One TU per itype so builds run in parallel.
#include "fwd.cuh"

namespace selscan::kern {

Status fwd_f16(const Problem& p, cudaStream_t stream) {
  return p.is_complex ? launch_fwd_typed<__half, true>(p, stream) : launch_fwd_typed<__half, false>(p, stream);
}

}  // namespace selscan::kern
