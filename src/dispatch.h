// Problem + execution context -> an implementation: the CPU path, or the CUDA kernel chosen for the call and device
// (src/cuda/select.h).
#pragma once

#include <cstddef>

#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"

namespace selscan {

enum class Op { fwd, bwd };

// Workspace bytes for `op` on exec's device (0 on CPU). Checks the device on CUDA.
Status workspace_size(Op op, const Problem& p, const selscan_exec_t& exec, size_t* bytes);
// Runs `op`; checks the caller's workspace against the size above.
Status run(Op op, const Problem& p, const selscan_exec_t& exec);

Status cuda_device_count(int32_t* count);
Status check_device(int32_t device);
const char* build_info();

}  // namespace selscan
