#include "dispatch.h"

#include <fmt/format.h>

#include <string>

#include "build_info.h"
#include "cpu/cpu.h"

#if SELSCAN_WITH_CUDA
#  include "cuda/arch.h"
#  include "cuda/launch.h"
#endif

namespace selscan {
namespace {

Status not_built() {
  return fail(SELSCAN_STATUS_CUDA_NOT_BUILT,
              "this libselscan was built without CUDA (the `cpu` preset); use SELSCAN_DEVICE_CPU or rebuild with a "
              "CUDA preset, e.g. `cmake --workflow --preset cuda-13.0`");
}

#if SELSCAN_WITH_CUDA
size_t cuda_workspace(Op op, const Problem& p, cuda::Family f) {
  return op == Op::fwd ? cuda::fwd_workspace_bytes(p, f) : cuda::bwd_workspace_bytes(p, f);
}
#endif

}  // namespace

Status workspace_size(Op op, const Problem& p, const selscan_exec_t& exec, size_t* bytes) {
  if (bytes == nullptr) return fail(SELSCAN_STATUS_INVALID_ARGUMENT, "bytes: pointer is NULL");
  *bytes = 0;
  if (exec.device_kind == SELSCAN_DEVICE_CPU) return SELSCAN_STATUS_SUCCESS;
#if SELSCAN_WITH_CUDA
  cuda::Family family{};
  if (Status s = cuda::select_family(exec.device_index, &family); s != SELSCAN_STATUS_SUCCESS) return s;
  *bytes = cuda_workspace(op, p, family);
  return SELSCAN_STATUS_SUCCESS;
#else
  (void)op;
  (void)p;
  return not_built();
#endif
}

Status run(Op op, const Problem& p, const selscan_exec_t& exec) {
  if (exec.device_kind == SELSCAN_DEVICE_CPU)
    return op == Op::fwd ? cpu::fwd(p, exec.num_threads) : cpu::bwd(p, exec.num_threads);
#if SELSCAN_WITH_CUDA
  cuda::Family family{};
  if (Status s = cuda::select_family(exec.device_index, &family); s != SELSCAN_STATUS_SUCCESS) return s;
  const size_t need = cuda_workspace(op, p, family);
  if (exec.workspace_bytes < need)
    return fail(SELSCAN_STATUS_WORKSPACE_TOO_SMALL,
                fmt::format("exec.workspace_bytes: this call needs {} bytes of workspace, got {} (ask "
                            "selscan_{}_workspace_size)",
                            need, exec.workspace_bytes, op == Op::fwd ? "fwd" : "bwd"));
  if (need > 0 && exec.workspace == nullptr)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("exec.workspace: NULL, but this call needs {} bytes of workspace", need));
  cuda::DeviceGuard guard(exec.device_index);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return guard.status();
  return op == Op::fwd ? cuda::launch_fwd(p, family, exec.stream, exec.workspace, exec.workspace_bytes)
                       : cuda::launch_bwd(p, family, exec.stream, exec.workspace, exec.workspace_bytes);
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
  cuda::Family family{};
  return cuda::select_family(device, &family);
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
