// The CPU path: the reference semantics and the production CPU implementation (no CUDA headers).
#pragma once

#include "errors.h"
#include "problem.h"

namespace selscan::cpu {

// Forward: writes p.out, p.out_z (iff z), p.x and p.last_state when present.
Status fwd(const Problem& p, int num_threads);
// Backward: writes every present gradient view of p (and p.out_z when present: recompute).
Status bwd(const Problem& p, int num_threads);

}  // namespace selscan::cpu
