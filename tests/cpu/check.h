// Shared checks of the CPU test suite: run a case forward and backward through the public ABI and compare
// every output with the float64 oracle at upstream's tolerances.
#pragma once

#include <string>

#include "case.h"
#include "compare.h"

namespace selscan_test {

// Largest error/tolerance ratio seen by check_case across all cases of a run (printed by the tests).
double& worst_seen();

// Forward then backward of `spec` with `threads` CPU workers; every output must be written (no poison left,
// guards intact) and within tolerance. `bwd` = false checks the forward only.
void check_case(const CaseSpec& spec, int threads = 2, bool bwd = true);

}  // namespace selscan_test
