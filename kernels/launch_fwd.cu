// Forward launcher entry points (src/cuda/launch.h): pick the itype instance; each lives in its own TU.
#include <cuda_runtime.h>

#include "cuda/launch.h"

namespace selscan::kern {
Status fwd_f32(const Problem& p, cudaStream_t stream);
Status fwd_f16(const Problem& p, cudaStream_t stream);
Status fwd_bf16(const Problem& p, cudaStream_t stream);
}  // namespace selscan::kern

namespace selscan::cuda {

// The forward needs no scratch: chunk states go straight to the caller's x.
size_t fwd_workspace_bytes(const Problem&, Family) { return 0; }

// Every Family runs the same kernels for now; the knob is kept for per-arch tuning.
Status launch_fwd(const Problem& p, Family, void* stream, void*, size_t) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.itype) {
    case Dtype::f32: return kern::fwd_f32(p, s);
    case Dtype::f16: return kern::fwd_f16(p, s);
    case Dtype::bf16: return kern::fwd_bf16(p, s);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "forward launcher: itype is not f32/f16/bf16");
}

}  // namespace selscan::cuda
