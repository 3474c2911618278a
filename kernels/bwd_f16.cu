// Backward instances for itype __half (real and complex weights). One TU per itype so builds run in parallel.
#include "bwd_launch.cuh"

namespace selscan::kern::bwd {

Status launch_f16(const Problem& p, const Plan& plan, cudaStream_t st, void* ws) {
  return launch<__half>(p, plan, st, ws);
}

}  // namespace selscan::kern::bwd
