#include "support/cuda_driver.h"

#if !defined(_WIN32)
#include <dlfcn.h>
#endif

#include <fmt/format.h>

namespace selscan_support {

namespace {

#if !defined(_WIN32)
// Resolves `name` into `fn`; records the first missing symbol in `missing`.
template <typename Fn>
void resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr && missing.empty()) missing = name;
}
#endif

Driver load_driver() {
  Driver d;
#if defined(_WIN32)
  d.why = "the CUDA driver is opened with dlopen, which this platform lacks: GPU checks and benchmarks are off";
  return d;
#else
  // RTLD_LOCAL: the symbols stay private to us; libselscan's runtime opens its own handle to the same file.
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    d.why = fmt::format("libcuda.so.1 could not be loaded ({})", e != nullptr ? e : "unknown reason");
    return d;
  }
  std::string missing;
  // The _v2 names are the 64-bit-size versions every current driver exports (the unsuffixed ones are legacy).
  resolve(h, "cuInit", d.cuInit, missing);
  resolve(h, "cuDriverGetVersion", d.cuDriverGetVersion, missing);
  resolve(h, "cuDeviceGetCount", d.cuDeviceGetCount, missing);
  resolve(h, "cuDeviceGet", d.cuDeviceGet, missing);
  resolve(h, "cuDeviceGetName", d.cuDeviceGetName, missing);
  resolve(h, "cuDeviceGetAttribute", d.cuDeviceGetAttribute, missing);
  resolve(h, "cuDeviceTotalMem_v2", d.cuDeviceTotalMem, missing);
  resolve(h, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain, missing);
  resolve(h, "cuDevicePrimaryCtxRelease_v2", d.cuDevicePrimaryCtxRelease, missing);
  resolve(h, "cuCtxSetCurrent", d.cuCtxSetCurrent, missing);
  resolve(h, "cuCtxSynchronize", d.cuCtxSynchronize, missing);
  resolve(h, "cuMemGetInfo_v2", d.cuMemGetInfo, missing);
  resolve(h, "cuMemAlloc_v2", d.cuMemAlloc, missing);
  resolve(h, "cuMemFree_v2", d.cuMemFree, missing);
  resolve(h, "cuMemcpyHtoD_v2", d.cuMemcpyHtoD, missing);
  resolve(h, "cuMemcpyDtoH_v2", d.cuMemcpyDtoH, missing);
  resolve(h, "cuMemcpyDtoDAsync_v2", d.cuMemcpyDtoDAsync, missing);
  resolve(h, "cuMemsetD8_v2", d.cuMemsetD8, missing);
  resolve(h, "cuStreamCreate", d.cuStreamCreate, missing);
  resolve(h, "cuStreamDestroy_v2", d.cuStreamDestroy, missing);
  resolve(h, "cuStreamSynchronize", d.cuStreamSynchronize, missing);
  resolve(h, "cuEventCreate", d.cuEventCreate, missing);
  resolve(h, "cuEventDestroy_v2", d.cuEventDestroy, missing);
  resolve(h, "cuEventRecord", d.cuEventRecord, missing);
  resolve(h, "cuEventSynchronize", d.cuEventSynchronize, missing);
  resolve(h, "cuEventElapsedTime", d.cuEventElapsedTime, missing);
  resolve(h, "cuGetErrorName", d.cuGetErrorName, missing);
  resolve(h, "cuGetErrorString", d.cuGetErrorString, missing);
  if (!missing.empty()) {
    d.why = fmt::format("libcuda.so.1 was found but lacks {} (driver too old?)", missing);
    return d;
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(d.cuInit), &info) != 0 && info.dli_fname != nullptr) d.path = info.dli_fname;
  d.loaded = true;
  return d;
#endif
}

DriverState init_driver() {
  DriverState s;
  const Driver& d = driver();
  if (!d.loaded) {
    s.message = d.why;
    return s;
  }
  d.cuDriverGetVersion(&s.version);
  CUresult r = d.cuInit(0);
  if (r == kCudaErrorNoDevice) {
    s.available = true;  // a driver without devices: report 0 devices, not an error
    return s;
  }
  if (r != kCudaSuccess) {
    s.message = fmt::format("cuInit failed: {}", d.error_text(r));
    return s;
  }
  r = d.cuDeviceGetCount(&s.device_count);
  if (r != kCudaSuccess) {
    s.message = fmt::format("cuDeviceGetCount failed: {}", d.error_text(r));
    s.device_count = 0;
    return s;
  }
  s.available = true;
  return s;
}

}  // namespace

std::string Driver::error_text(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName != nullptr) cuGetErrorName(r, &name);
  if (cuGetErrorString != nullptr) cuGetErrorString(r, &text);
  if (name == nullptr) return fmt::format("CUresult {}", r);
  return text != nullptr ? fmt::format("{} ({})", name, text) : std::string(name);
}

const Driver& driver() {
  static const Driver d = load_driver();
  return d;
}

const DriverState& driver_state() {
  static const DriverState s = init_driver();
  return s;
}

std::string cuda_version_text(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

bool make_current(int index, std::string* err) {
  const DriverState& s = driver_state();
  if (!s.available || index < 0 || index >= s.device_count) {
    *err = s.available ? fmt::format("no CUDA device {}", index) : s.message;
    return false;
  }
  const Driver& d = driver();
  CUdevice dev = 0;
  CUresult r = d.cuDeviceGet(&dev, index);
  CUcontext ctx = nullptr;
  // The primary context is retained for the life of the process on purpose: the library shares it.
  if (r == kCudaSuccess) r = d.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == kCudaSuccess) r = d.cuCtxSetCurrent(ctx);
  if (r != kCudaSuccess) {
    *err = fmt::format("could not make device {} current: {}", index, d.error_text(r));
    return false;
  }
  return true;
}

}  // namespace selscan_support
