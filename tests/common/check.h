// The standard check of a case, for the CPU and the GPU suites alike: run it forward and backward through the
// public ABI (on host pointers, or on device copies via DeviceMemory) and compare every output with the
// float64 oracle at upstream's tolerances (out, out_z and the reduced gradients dA, dB, dC, dD, ddelta_bias: or
// k u cond where larger, docs/numerics.md); every output element must be written and no guard byte touched.
#pragma once

#include "case.h"
#include "compare.h"

namespace selscan_test {

// Forward then backward of `spec` on `exec` (device copies through `dev` when given); `bwd` = false checks
// the forward only. `tol_scale` widens every tolerance (1 = upstream's).
void check_case(const CaseSpec& spec, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr,
                bool bwd = true, double tol_scale = 1.0);
// The CPU with `threads` workers.
inline void check_case(const CaseSpec& spec, int threads = 2, bool bwd = true) {
  check_case(spec, cpu_exec(threads), nullptr, bwd);
}

}  // namespace selscan_test
