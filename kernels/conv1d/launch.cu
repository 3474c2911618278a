// The conv1d launchers declared in src/cuda/launch.h. Placeholders until the kernels land: every CUDA conv1d call
// answers UNSUPPORTED, so the dispatcher links and CPU calls are unaffected.
#include <string>

#include "cuda/launch.h"

namespace selscan::cuda {

namespace {
Status not_yet(const char* what) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, std::string(what) + ": the CUDA kernels are not built yet; use the CPU");
}
}  // namespace

Status launch_conv1d_fwd(const Conv1d&, const Conv1dPlan&, const Launch&) { return not_yet("conv1d forward"); }
Status launch_conv1d_bwd(const Conv1d&, const Conv1dPlan&, const Launch&) { return not_yet("conv1d backward"); }
Status launch_conv1d_update(const Conv1dUpdate&, const Conv1dPlan&, const Launch&) {
  return not_yet("conv1d update");
}

}  // namespace selscan::cuda
