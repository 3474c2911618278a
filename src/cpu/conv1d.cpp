// The causal conv1d on the CPU. Placeholder until the CPU path lands.
#include "../conv1d.h"

namespace selscan::cpu {

Status conv1d_fwd(const Conv1d&, int) { return fail(SELSCAN_STATUS_UNSUPPORTED, "CPU conv1d: not implemented yet"); }
Status conv1d_bwd(const Conv1d&, int) { return fail(SELSCAN_STATUS_UNSUPPORTED, "CPU conv1d: not implemented yet"); }
Status conv1d_update(const Conv1dUpdate&, int) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, "CPU conv1d: not implemented yet");
}

}  // namespace selscan::cpu
