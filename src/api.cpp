// The extern "C" entry points: catch everything, map it to a status, keep the thread-local message.
// No logic beyond that: validation lives in validate.cpp, the choice of implementation in dispatch.cpp.
#include <exception>
#include <new>
#include <string>

#include "build_info.h"
#include "conv1d.h"
#include "dispatch.h"
#include "errors.h"
#include "selscan/selscan.h"
#include "state_update.h"
#include "validate.h"

namespace {

template <typename F>
selscan_status_t guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return selscan::fail(SELSCAN_STATUS_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return selscan::fail(SELSCAN_STATUS_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return selscan::fail(SELSCAN_STATUS_INTERNAL, "internal error: unknown exception");
  }
}

// The arguments validated into a `Desc` (make), then exec; `go` gets both.
template <typename Desc, typename Args, typename Make, typename Go>
selscan_status_t validated(const Args* args, const selscan_exec_t* exec, Make make, Go go) {
  return guarded([&] {
    Desc p{};
    selscan_exec_t ex{};
    if (auto s = make(args, &p); s != SELSCAN_STATUS_SUCCESS) return s;
    if (auto s = selscan::check_exec(exec, &ex); s != SELSCAN_STATUS_SUCCESS) return s;
    return go(p, ex);
  });
}

template <typename Args, typename Make>
selscan_status_t workspace_query(selscan::Op op, const Args* args, const selscan_exec_t* exec, size_t* bytes,
                                 Make make) {
  if (bytes != nullptr) *bytes = 0;
  return validated<selscan::Problem>(args, exec, make, [&](const selscan::Problem& p, const selscan_exec_t& ex) {
    return selscan::workspace_size(op, p, ex, bytes);
  });
}

template <typename Args, typename Make>
selscan_status_t execute(selscan::Op op, const Args* args, const selscan_exec_t* exec, Make make) {
  return validated<selscan::Problem>(args, exec, make, [&](const selscan::Problem& p, const selscan_exec_t& ex) {
    return selscan::run(op, p, ex);
  });
}

}  // namespace

extern "C" {

SELSCAN_API const char* selscan_version_string(void) { return SELSCAN_VERSION_STRING; }

SELSCAN_API int32_t selscan_version(void) { return SELSCAN_VERSION; }

SELSCAN_API const char* selscan_status_string(selscan_status_t status) {
  switch (status) {
    case SELSCAN_STATUS_SUCCESS: return "success";
    case SELSCAN_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case SELSCAN_STATUS_BAD_STRUCT_SIZE: return "bad struct size";
    case SELSCAN_STATUS_SHAPE_MISMATCH: return "shape mismatch";
    case SELSCAN_STATUS_DTYPE_MISMATCH: return "dtype mismatch";
    case SELSCAN_STATUS_BAD_LAYOUT: return "unsupported layout";
    case SELSCAN_STATUS_UNSUPPORTED: return "unsupported";
    case SELSCAN_STATUS_WORKSPACE_TOO_SMALL: return "workspace too small";
    case SELSCAN_STATUS_CUDA_NOT_BUILT: return "built without CUDA";
    case SELSCAN_STATUS_NO_DEVICE: return "no CUDA device";
    case SELSCAN_STATUS_ARCH_MISMATCH: return "no kernel for this device's architecture";
    case SELSCAN_STATUS_CUDA_ERROR: return "CUDA error";
    case SELSCAN_STATUS_OUT_OF_MEMORY: return "out of memory";
    case SELSCAN_STATUS_INTERNAL: return "internal error";
    case SELSCAN_STATUS_COUNT: break;
  }
  return "unknown status";
}

SELSCAN_API const char* selscan_last_error(void) { return selscan::last_error_message(); }

SELSCAN_API const char* selscan_build_info(void) {
  try {
    return selscan::build_info();
  } catch (...) {
    return "libselscan " SELSCAN_VERSION_STRING;
  }
}

SELSCAN_API selscan_status_t selscan_cuda_device_count(int32_t* count) {
  return guarded([&] { return selscan::cuda_device_count(count); });
}

SELSCAN_API selscan_status_t selscan_check_device(int32_t device_index) {
  return guarded([&] { return selscan::check_device(device_index); });
}

SELSCAN_API selscan_status_t selscan_fwd_workspace_size(const selscan_fwd_args_t* args, const selscan_exec_t* exec,
                                                        size_t* bytes) {
  return workspace_query(selscan::Op::fwd, args, exec, bytes, selscan::make_fwd_problem);
}

SELSCAN_API selscan_status_t selscan_bwd_workspace_size(const selscan_bwd_args_t* args, const selscan_exec_t* exec,
                                                        size_t* bytes) {
  return workspace_query(selscan::Op::bwd, args, exec, bytes, selscan::make_bwd_problem);
}

SELSCAN_API selscan_status_t selscan_fwd(const selscan_fwd_args_t* args, const selscan_exec_t* exec) {
  return execute(selscan::Op::fwd, args, exec, selscan::make_fwd_problem);
}

SELSCAN_API selscan_status_t selscan_bwd(const selscan_bwd_args_t* args, const selscan_exec_t* exec) {
  return execute(selscan::Op::bwd, args, exec, selscan::make_bwd_problem);
}

SELSCAN_API selscan_status_t selscan_state_update(const selscan_state_update_args_t* args,
                                                  const selscan_exec_t* exec) {
  return validated<selscan::StateUpdate>(args, exec, selscan::make_state_update, selscan::run_state_update);
}

SELSCAN_API selscan_status_t selscan_conv1d_fwd(const selscan_conv1d_fwd_args_t* args, const selscan_exec_t* exec) {
  return validated<selscan::Conv1d>(args, exec, selscan::make_conv1d_fwd,
                                    [](const selscan::Conv1d& p, const selscan_exec_t& ex) {
                                      return selscan::run_conv1d(selscan::Op::fwd, p, ex);
                                    });
}

SELSCAN_API selscan_status_t selscan_conv1d_bwd_workspace_size(const selscan_conv1d_bwd_args_t* args,
                                                               const selscan_exec_t* exec, size_t* bytes) {
  if (bytes != nullptr) *bytes = 0;
  return validated<selscan::Conv1d>(args, exec, selscan::make_conv1d_bwd,
                                    [&](const selscan::Conv1d& p, const selscan_exec_t& ex) {
                                      return selscan::conv1d_workspace_size(selscan::Op::bwd, p, ex, bytes);
                                    });
}

SELSCAN_API selscan_status_t selscan_conv1d_bwd(const selscan_conv1d_bwd_args_t* args, const selscan_exec_t* exec) {
  return validated<selscan::Conv1d>(args, exec, selscan::make_conv1d_bwd,
                                    [](const selscan::Conv1d& p, const selscan_exec_t& ex) {
                                      return selscan::run_conv1d(selscan::Op::bwd, p, ex);
                                    });
}

SELSCAN_API selscan_status_t selscan_conv1d_update(const selscan_conv1d_update_args_t* args,
                                                   const selscan_exec_t* exec) {
  return validated<selscan::Conv1dUpdate>(args, exec, selscan::make_conv1d_update, selscan::run_conv1d_update);
}

}  // extern "C"
