// Public argument structs -> one typed Problem. Every argument check and every message lives here, once.
#pragma once

#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"

namespace selscan {

Status make_fwd_problem(const selscan_fwd_args_t* args, Problem* out);
Status make_bwd_problem(const selscan_bwd_args_t* args, Problem* out);
// exec: non-NULL, struct_size, device kind, num_threads. Workspace is checked by dispatch (needs the size).
Status check_exec(const selscan_exec_t* exec);

}  // namespace selscan
