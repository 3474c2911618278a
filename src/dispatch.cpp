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
  if (p.serving && !force.serving)
    return fail(SELSCAN_STATUS_UNSUPPORTED,
                "serving fields (cu_seqlens, ssm_states, cache_indices, has_initial_state, block_table) on CUDA: the CUDA serving "
                "kernels are built but have not yet passed their GPU tests; run the call on the CPU path "
                "(SELSCAN_DEVICE_CPU), or set SELSCAN_CUDA_SERVING=1 to run them anyway (docs/serving.md)");
  if (Status s = cuda::device_props(device, &c->dev); s != SELSCAN_STATUS_SUCCESS) return s;
  if (op == Op::fwd) return cuda::plan_fwd(p, *c->dev, force.fwd, &c->fwd);  // the forward needs no workspace
  if (Status s = cuda::plan_bwd(p, *c->dev, force.bwd, &c->bwd); s != SELSCAN_STATUS_SUCCESS) return s;
  c->workspace = c->bwd.total;
  return SELSCAN_STATUS_SUCCESS;
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
  if (exec.workspace_bytes < c.workspace)
    return fail(SELSCAN_STATUS_WORKSPACE_TOO_SMALL,
                fmt::format("exec.workspace_bytes: this call needs {} bytes of workspace, got {} (ask "
                            "selscan_{}_workspace_size)",
                            c.workspace, exec.workspace_bytes, op == Op::fwd ? "fwd" : "bwd"));
  if (c.workspace > 0 && exec.workspace == nullptr)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("exec.workspace: NULL, but this call needs {} bytes of workspace", c.workspace));
  cuda::DeviceGuard guard(exec.device_index);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return guard.status();
  const cuda::Launch launch{exec.stream, exec.device_index, c.dev->smem_optin, exec.workspace};
  return op == Op::fwd ? cuda::launch_fwd(p, c.fwd, launch) : cuda::launch_bwd(p, c.bwd, launch);
#else
  return not_built();
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
