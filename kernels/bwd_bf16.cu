// Backward instances for itype __nv_bfloat16 (real and complex weights). One TU per itype so builds run in parallel.
#include "bwd_launch.cuh"

namespace selscan::kern::bwd {

Status launch_bf16(const Problem& p, const Plan& plan, cudaStream_t st, void* ws) {
  return launch<__nv_bfloat16>(p, plan, st, ws);
}

}  // namespace selscan::kern::bwd
