// The causal conv1d's argument checks (src/conv1d.h). Placeholder until the checks land: every call is UNSUPPORTED.
#include "conv1d.h"

namespace selscan {

Status make_conv1d_fwd(const selscan_conv1d_fwd_args_t*, Conv1d*) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, "selscan_conv1d_fwd: not implemented yet");
}
Status make_conv1d_bwd(const selscan_conv1d_bwd_args_t*, Conv1d*) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, "selscan_conv1d_bwd: not implemented yet");
}
Status make_conv1d_update(const selscan_conv1d_update_args_t*, Conv1dUpdate*) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, "selscan_conv1d_update: not implemented yet");
}
Status check_host_conv1d(const Conv1d&) { return SELSCAN_STATUS_SUCCESS; }
Status check_host_conv1d_update(const Conv1dUpdate&) { return SELSCAN_STATUS_SUCCESS; }

}  // namespace selscan
