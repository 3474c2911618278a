// Which CUDA kernel serves a call, and its launch plan: the whole decision, in one host-only unit. Inputs: the
// validated Problem, the device's cached properties (src/cuda/arch.cpp) and the kernel override of the process;
// output: a plan (src/cuda/plans.h) that the launchers execute as it is. No CUDA headers, compiled into every build,
// so the rules are tested on the CPU (tests/cpu/test_kernel_choice.cpp). docs/architecture.md has the rules as a
// table.
#pragma once

#include <cstdint>

#include "conv1d.h"
#include "cuda/plans.h"
#include "errors.h"
#include "problem.h"
#include "state_update.h"

namespace selscan::cuda {

// What the kernel choice needs to know about a device; read once per device (src/cuda/arch.cpp).
struct DeviceProps {
  int ordinal = 0;
  int cc = 0;              // compute capability, 10 * major + minor
  int sms = 0;             // multiprocessors
  int64_t smem_optin = 0;  // bytes of dynamic shared memory one block may opt in to
  int ptx = 0;             // the virtual arch the loaded kernels were made from (cudaFuncAttributes::ptxVersion: 90 for
                           // sm_90 SASS or compute_90 PTX); device code sees it as __CUDA_ARCH__ / 10
};

// A kernel override: `warp` or `ts` forces that kernel (tests, A/B benchmarks); a forced thread-states kernel still
// falls back to the warp-scan one where it cannot serve the problem.
enum class Force { none, warp, ts };
// "warp" -> warp, "ts" -> ts, anything else (NULL, "auto", ...) -> none.
Force parse_force(const char* value);
// A decode-kernel override (tests, A/B benchmarks): `lean` gives the lean kernel every call it can serve, small
// grids included (the plan before kSmall existed); `small` / `small4` give kSmall with 8 / 4 states a lane every
// call it can serve, whatever the grid's size (else the default plan's choice); `general` the general kernel always.
enum class DecodeForce { none, lean, general, small, small4 };
// "lean", "general", "small", "small4" -> that value; anything else (NULL, "auto", ...) -> none.
DecodeForce parse_decode_force(const char* value);
struct Overrides {
  Force fwd = Force::none, bwd = Force::none;
  DecodeForce decode = DecodeForce::none;
};
// SELSCAN_FWD_KERNEL / SELSCAN_BWD_KERNEL / SELSCAN_DECODE_KERNEL, read once per process, so workspace queries and
// calls agree.
const Overrides& env_overrides();

// SUCCESS and the plan, or UNSUPPORTED (the chosen kernel needs more shared memory per block than the device
// allows, or more blocks than a CUDA grid holds) with a message. Pure: no CUDA call; no allocation on success.
Status plan_fwd(const Problem& p, const DeviceProps& dev, Force force, FwdPlan* out);
Status plan_bwd(const Problem& p, const DeviceProps& dev, Force force, BwdPlan* out);

// The causal conv1d (src/conv1d.h): the kernel and launch shape of a validated call, and the backward's workspace
// bytes (plan->workspace). SUCCESS, or UNSUPPORTED where the grid would exceed CUDA's limits. Pure: no CUDA call.
Status plan_conv1d_fwd(const Conv1d& p, const DeviceProps& dev, Conv1dPlan* out);
Status plan_conv1d_bwd(const Conv1d& p, const DeviceProps& dev, Conv1dPlan* out);
Status plan_conv1d_update(const Conv1dUpdate& p, const DeviceProps& dev, Conv1dPlan* out);

// The shared-memory class of a device, from its per-block opt-in limit; it sets the warp-scan backward's budgets and
// where the thread-states backward runs by default. Exposed for the tests.
enum class SmemClass { small, medium, large };
SmemClass smem_class(int64_t smem_optin);

// The decode step's launch plan (kernels/decode/): lanes per channel and the vector paths, from the call alone
// (its strides and addresses); no device property enters it. The one-argument form plans with env_overrides().decode.
StateUpdatePlan plan_state_update(const StateUpdate& p);
StateUpdatePlan plan_state_update(const StateUpdate& p, DecodeForce force);

}  // namespace selscan::cuda
