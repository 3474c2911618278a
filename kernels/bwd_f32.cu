// Backward instances for itype float (real and complex weights). One TU per itype so builds run in parallel.
#include "bwd_launch.cuh"

namespace selscan::kern::bwd {

Status launch_f32(const Problem& p, const Plan& plan, cudaStream_t st, void* ws) {
  return launch<float>(p, plan, st, ws);
}

}  // namespace selscan::kern::bwd
