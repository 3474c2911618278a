// Serving calls on the CPU (docs/serving.md): each sequence of a packed batch or of a state-pool call runs as a
// dense problem of batch 1, so the dense forward and backward serve it unchanged.
#pragma once

#include <cstdint>

#include "../problem.h"

namespace selscan::cpu {

struct SeqProblem {
  // Sequence b of the call as a dense problem: batch 1 (row 0 of every batched view is the sequence), seqlen its
  // length, h0 the state it starts from (absent: zero), last_state where its final state goes (its row, or its
  // pool slot), x its chunk slots. Weight views (A, constant B/C, D, delta_bias and their gradients) are p's.
  Problem q;
  int64_t start = 0;  // its offset along the packed time axis (0 in a dense-layout call)
  int64_t row = 0;    // its row of the packed (or batched) time-major tensors
  bool pad = false;   // a padding sequence: its outputs are 0, no state is read or written
  bool from_state = true;  // it starts from its h0 row or slot (else from zero, and its dh0 row is 0)
  // Block-wise state caching: tokens before this call and the block size K (0: off). The state after every local
  // position t < seqlen - 1 with (ctx + t + 1) % K == 0 goes to block_slot(p, b, (ctx + t) / K).
  int64_t ctx = 0, block = 0;
};

// The host-readable index tensors of p (check_host_serving has validated them) give sequence b.
SeqProblem sequence_problem(const Problem& p, int64_t b);

// Block j's slot of sequence b in the pool (absent for pad_slot_id: the state is not kept).
View block_slot(const Problem& p, int64_t b, int64_t j);

// Writes `len` zeros from time 0 into row (b, d) of a (Bt, D, L) itype view (a padding sequence's outputs).
void zero_row(const Problem& q, const View& v, int64_t b, int64_t d, int64_t len);

}  // namespace selscan::cpu
