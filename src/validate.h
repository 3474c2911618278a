// Public argument structs -> one typed Problem. Every argument check and every message lives here, once.
#pragma once

#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"

namespace selscan {

// Validate an argument struct of any accepted struct_size (older callers' missing fields read as absent) and
// describe the call. Every failure records a message naming the argument and the value given.
Status make_fwd_problem(const selscan_fwd_args_t* args, Problem* out);
Status make_bwd_problem(const selscan_bwd_args_t* args, Problem* out);
// exec: non-NULL, struct_size, device kind, num_threads, reserved, workspace alignment. On success `*out` is the
// caller's context as this version's struct (fields past an older caller's struct_size zero). The workspace
// size is checked by dispatch (it needs the problem and the device).
Status check_exec(const selscan_exec_t* exec, selscan_exec_t* out);
// The contents of a serving call's index tensors, for calls on host memory (CUDA calls never read device memory
// on the host): cu_seqlens starts at 0, never decreases and ends at the packed length; with ssm_states, every
// cache_indices entry is pad_slot_id or a slot in range, and no slot serves two sequences.
Status check_host_serving(const Problem& p);

}  // namespace selscan
