// Problem + execution context -> an implementation: the CPU path, or the CUDA kernel chosen for the call and device
// (src/cuda/select.h).
#pragma once

#include <cstddef>

#include "conv1d.h"
#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"
#include "state_update.h"

namespace selscan {

enum class Op { fwd, bwd };

// Workspace bytes for `op` on exec's device (0 on CPU). Checks the device on CUDA.
Status workspace_size(Op op, const Problem& p, const selscan_exec_t& exec, size_t* bytes);
// Runs `op`; checks the caller's workspace against the size above.
Status run(Op op, const Problem& p, const selscan_exec_t& exec);

// The causal conv1d (src/conv1d.h), likewise: the CPU path after the host checks of the index contents, or the
// plan of src/cuda/select.h and its launcher. Only the backward has a workspace (0 on CPU and for Op::fwd).
Status conv1d_workspace_size(Op op, const Conv1d& p, const selscan_exec_t& exec, size_t* bytes);
Status run_conv1d(Op op, const Conv1d& p, const selscan_exec_t& exec);
Status run_conv1d_update(const Conv1dUpdate& p, const selscan_exec_t& exec);

// The decode step (src/state_update.h): the CPU path after the host check of the destination slots, or the plan of
// src/cuda/select.h and its launcher (no workspace).
Status run_state_update(const StateUpdate& p, const selscan_exec_t& exec);

Status cuda_device_count(int32_t* count);
Status check_device(int32_t device);
const char* build_info();

}  // namespace selscan
