// The standard check of a case, for the CPU and the GPU suites alike: run it forward and backward through the
// public ABI (on host pointers, or on device copies via DeviceMemory) and compare every output with the
// float64 oracle at upstream's tolerances (out, out_z and the reduced gradients dA, dB, dC, dD, ddelta_bias: or
// k u cond where larger, docs/numerics.md); every output element must be written and no guard byte touched.
#pragma once

#include <map>
#include <string>

#include "case.h"
#include "compare.h"

namespace selscan_test {

// Largest error/tolerance ratio seen by check_case across all cases of a run (printed by the tests).
double& worst_seen();

// Per output compared under a conditioning-aware bound (out, out_z and the reduced gradients), across all
// check_case calls of a run: elements compared, elements whose limit the bound raised above upstream's
// tolerance, and the largest such raise (bound / upstream's limit). For reporting how much the rule loosens.
struct LooseTally {
  int64_t elements = 0, loosened = 0;
  double max_raise = 0.0;
};
std::map<std::string, LooseTally>& loosened_seen();
// One line per output of loosened_seen() ("dA: 0 of 1234 elements loosened ...").
std::string loosened_report();

// Forward then backward of `spec` on `exec` (device copies through `dev` when given); `bwd` = false checks
// the forward only. `tol_scale` widens every tolerance (1 = upstream's).
void check_case(const CaseSpec& spec, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr,
                bool bwd = true, double tol_scale = 1.0);
// The CPU with `threads` workers.
inline void check_case(const CaseSpec& spec, int threads = 2, bool bwd = true) {
  check_case(spec, cpu_exec(threads), nullptr, bwd);
}

}  // namespace selscan_test
