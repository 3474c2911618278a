// An independent float64 selective scan (forward and analytic backward) written from the recurrence itself,
// used to judge the library's outputs. Real weights only; no initial state. The loss whose gradients the
// backward returns is sum(dout * final_output), final_output = out_z when z is given, else out.
#pragma once

#include <array>
#include <vector>

#include "scan_case.h"

namespace selscan_cli {

struct Reference {
  // Forward outputs (kOut, kOutZ, kX, kLast) and backward outputs (kDu ... kDbias), in the tensors' layouts.
  std::array<std::vector<double>, kTensorCount> v;
};

// Forward only (out, out_z, x, last_state).
void reference_forward(const CaseSpec& s, const HostData& in, Reference* ref, int threads);
// Forward and backward.
void reference_forward_backward(const CaseSpec& s, const HostData& in, Reference* ref, int threads);

// Checks the float64 backward against central finite differences of the float64 forward, along `directions`
// random directions in the space of all inputs, on a small problem with s's flags and groups (so it stays
// fast whatever s's size). Returns the worst relative disagreement (expect ~1e-8; the check passes below 1e-5).
double reference_gradient_check(const CaseSpec& s, int directions, uint64_t seed);

}  // namespace selscan_cli
