#include "dispatch.h"

#include <fmt/format.h>

#include <string>

#include "build_info.h"
#include "cpu/cpu.h"
#include "validate.h"

#if SELSCAN_WITH_CUDA
#  include "cuda/arch.h"
#  include "cuda/launch.h"
#  include "cuda/select.h"
#endif

namespace selscan {
namespace {

Status not_built() {
  return fail(SELSCAN_STATUS_CUDA_NOT_BUILT,
              "this libselscan was built without CUDA (the `cpu` preset); use SELSCAN_DEVICE_CPU or rebuild with a "
              "CUDA preset, e.g. `cmake --workflow --preset cuda-13.0`");
}

#if SELSCAN_WITH_CUDA
// The chosen kernels of one call: the device's cached properties and the plan of the op, decided once per call and
// shared by the workspace query and the launch, so both see the same workspace size.
struct CudaCall {
  const cuda::DeviceProps* dev = nullptr;
  cuda::FwdPlan fwd;
  cuda::BwdPlan bwd;
  size_t workspace = 0;
};

Status plan_call(Op op, const Problem& p, int32_t device, CudaCall* c) {
  const cuda::Overrides& force = cuda::env_overrides();
  if (Status s = cuda::device_props(device, &c->dev); s != SELSCAN_STATUS_SUCCESS) return s;
  if (op == Op::fwd) return cuda::plan_fwd(p, *c->dev, force.fwd, &c->fwd);  // the forward needs no workspace
  if (Status s = cuda::plan_bwd(p, *c->dev, force.bwd, &c->bwd); s != SELSCAN_STATUS_SUCCESS) return s;
  c->workspace = c->bwd.total;
  return SELSCAN_STATUS_SUCCESS;
}

// The caller's workspace against what the plan needs (`query`: the size query that reports it).
Status check_workspace(const selscan_exec_t& exec, size_t need, const char* query) {
  if (exec.workspace_bytes < need)
    return fail(SELSCAN_STATUS_WORKSPACE_TOO_SMALL,
                fmt::format("exec.workspace_bytes: this call needs {} bytes of workspace, got {} (ask {})", need,
                            exec.workspace_bytes, query));
  if (need > 0 && exec.workspace == nullptr)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("exec.workspace: NULL, but this call needs {} bytes of workspace", need));
  return SELSCAN_STATUS_SUCCESS;
}

// The conv1d forward's or backward's plan on `device` (the backward's `workspace` bytes included).
Status plan_conv1d(Op op, const Conv1d& p, int32_t device, const cuda::DeviceProps** dev, cuda::Conv1dPlan* plan) {
  if (Status s = cuda::device_props(device, dev); s != SELSCAN_STATUS_SUCCESS) return s;
  return op == Op::fwd ? cuda::plan_conv1d_fwd(p, **dev, plan) : cuda::plan_conv1d_bwd(p, **dev, plan);
}
#endif

}  // namespace

Status workspace_size(Op op, const Problem& p, const selscan_exec_t& exec, size_t* bytes) {
  if (bytes == nullptr) return fail(SELSCAN_STATUS_INVALID_ARGUMENT, "bytes: pointer is NULL");
  *bytes = 0;
  // Host memory: the serving call's index contents are checked like the rest (a CUDA call cannot read them).
  if (exec.device_kind == SELSCAN_DEVICE_CPU) return p.serving ? check_host_serving(p) : SELSCAN_STATUS_SUCCESS;
#if SELSCAN_WITH_CUDA
  CudaCall c;
  if (Status s = plan_call(op, p, exec.device_index, &c); s != SELSCAN_STATUS_SUCCESS) return s;
  *bytes = c.workspace;
  return SELSCAN_STATUS_SUCCESS;
#else
  (void)op;
  (void)p;
  return not_built();
#endif
}

Status run(Op op, const Problem& p, const selscan_exec_t& exec) {
  if (exec.device_kind == SELSCAN_DEVICE_CPU) {
    if (p.serving)
      if (Status s = check_host_serving(p); s != SELSCAN_STATUS_SUCCESS) return s;
    return op == Op::fwd ? cpu::fwd(p, exec.num_threads) : cpu::bwd(p, exec.num_threads);
  }
#if SELSCAN_WITH_CUDA
  CudaCall c;
  if (Status s = plan_call(op, p, exec.device_index, &c); s != SELSCAN_STATUS_SUCCESS) return s;
  if (Status s = check_workspace(exec, c.workspace,
                                 op == Op::fwd ? "selscan_fwd_workspace_size" : "selscan_bwd_workspace_size");
      s != SELSCAN_STATUS_SUCCESS)
    return s;
  cuda::DeviceGuard guard(exec.device_index);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return guard.status();
  const cuda::Launch launch{exec.stream, exec.device_index, c.dev->smem_optin, exec.workspace};
  return op == Op::fwd ? cuda::launch_fwd(p, c.fwd, launch) : cuda::launch_bwd(p, c.bwd, launch);
#else
  return not_built();
#endif
}

Status conv1d_workspace_size(Op op, const Conv1d& p, const selscan_exec_t& exec, size_t* bytes) {
  if (bytes == nullptr) return fail(SELSCAN_STATUS_INVALID_ARGUMENT, "bytes: pointer is NULL");
  *bytes = 0;
  if (exec.device_kind == SELSCAN_DEVICE_CPU) return check_host_conv1d(p);
#if SELSCAN_WITH_CUDA
  const cuda::DeviceProps* dev = nullptr;
  cuda::Conv1dPlan plan{};
  if (Status s = plan_conv1d(op, p, exec.device_index, &dev, &plan); s != SELSCAN_STATUS_SUCCESS) return s;
  *bytes = op == Op::bwd ? plan.workspace : 0;
  return SELSCAN_STATUS_SUCCESS;
#else
  (void)op;
  return not_built();
#endif
}

Status run_conv1d(Op op, const Conv1d& p, const selscan_exec_t& exec) {
  if (exec.device_kind == SELSCAN_DEVICE_CPU) {
    if (Status s = check_host_conv1d(p); s != SELSCAN_STATUS_SUCCESS) return s;
    return op == Op::fwd ? cpu::conv1d_fwd(p, exec.num_threads) : cpu::conv1d_bwd(p, exec.num_threads);
  }
#if SELSCAN_WITH_CUDA
  const cuda::DeviceProps* dev = nullptr;
  cuda::Conv1dPlan plan{};
  if (Status s = plan_conv1d(op, p, exec.device_index, &dev, &plan); s != SELSCAN_STATUS_SUCCESS) return s;
  if (op == Op::bwd)
    if (Status s = check_workspace(exec, plan.workspace, "selscan_conv1d_bwd_workspace_size");
        s != SELSCAN_STATUS_SUCCESS)
      return s;
  cuda::DeviceGuard guard(exec.device_index);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return guard.status();
  const cuda::Launch launch{exec.stream, exec.device_index, dev->smem_optin, exec.workspace};
  return op == Op::fwd ? cuda::launch_conv1d_fwd(p, plan, launch) : cuda::launch_conv1d_bwd(p, plan, launch);
#else
  return not_built();
#endif
}

Status run_conv1d_update(const Conv1dUpdate& p, const selscan_exec_t& exec) {
  if (exec.device_kind == SELSCAN_DEVICE_CPU) {
    if (Status s = check_host_conv1d_update(p); s != SELSCAN_STATUS_SUCCESS) return s;
    return cpu::conv1d_update(p, exec.num_threads);
  }
#if SELSCAN_WITH_CUDA
  const cuda::DeviceProps* dev = nullptr;
  if (Status s = cuda::device_props(exec.device_index, &dev); s != SELSCAN_STATUS_SUCCESS) return s;
  cuda::Conv1dPlan plan{};
  if (Status s = cuda::plan_conv1d_update(p, *dev, &plan); s != SELSCAN_STATUS_SUCCESS) return s;
  cuda::DeviceGuard guard(exec.device_index);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return guard.status();
  const cuda::Launch launch{exec.stream, exec.device_index, dev->smem_optin, exec.workspace};
  return cuda::launch_conv1d_update(p, plan, launch);
#else
  return not_built();
#endif
}

// On success nothing is allocated or formatted and the device is not queried beyond the arch decision cached per
// device: a decode step's host cost is the checks plus one kernel launch.
Status run_state_update(const StateUpdate& p, const selscan_exec_t& exec) {
  if (exec.device_kind == SELSCAN_DEVICE_CPU) {
    if (Status s = check_host_dst(p); s != SELSCAN_STATUS_SUCCESS) return s;
    return cpu::state_update(p, exec.num_threads);
  }
#if SELSCAN_WITH_CUDA
  const cuda::DeviceProps* dev = nullptr;  // whether this build serves the device: cached after the first call
  if (Status s = cuda::device_props(exec.device_index, &dev); s != SELSCAN_STATUS_SUCCESS) return s;
  cuda::DeviceGuard guard(exec.device_index);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return guard.status();
  return cuda::launch_state_update(p, cuda::plan_state_update(p), exec.stream);
#else
  return fail(SELSCAN_STATUS_CUDA_NOT_BUILT,
              "selscan_state_update: this libselscan was built without CUDA; use SELSCAN_DEVICE_CPU or rebuild "
              "with a CUDA preset");
#endif
}

Status cuda_device_count(int32_t* count) {
  if (count == nullptr) return fail(SELSCAN_STATUS_INVALID_ARGUMENT, "count: pointer is NULL");
#if SELSCAN_WITH_CUDA
  *count = cuda::device_count();
#else
  *count = 0;
#endif
  return SELSCAN_STATUS_SUCCESS;
}

Status check_device(int32_t device) {
#if SELSCAN_WITH_CUDA
  if (device < 0)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("device_index: expected >= 0, got {}", device));
  const cuda::DeviceProps* dev = nullptr;
  return cuda::device_props(device, &dev);
#else
  (void)device;
  return not_built();
#endif
}

const char* build_info() {
  static const std::string info = [] {
#if SELSCAN_WITH_CUDA
    const std::string targets = cuda::carried_targets();
#else
    const std::string targets = "SASS none; PTX none";
#endif
    return fmt::format("libselscan {}; CUDA {}; {}", SELSCAN_VERSION_STRING, SELSCAN_CUDA_VERSION, targets);
  }();
  return info.c_str();
}

}  // namespace selscan
