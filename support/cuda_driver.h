// The few CUDA driver API entry points the `selscan` command and the benchmarks need, loaded at run time from
// libcuda.so.1, so that they build without CUDA headers and run (CPU only) on machines with no driver. The
// prototypes are declared here by hand from the driver API's documented signatures; the handle types are opaque
// pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace selscan_support {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // 64-bit on every platform the driver supports
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorNoDevice = 100;
// CUdevice_attribute values used here (stable since CUDA 5).
constexpr int kAttrComputeMajor = 75;
constexpr int kAttrComputeMinor = 76;
constexpr int kAttrL2CacheSize = 38;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrClockRate = 13;  // peak SM clock, kHz
constexpr unsigned kStreamNonBlocking = 0x1;  // CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream

// One loaded driver. `ok()` is false when libcuda could not be loaded or lacks a symbol; `why` says which.
struct Driver {
  bool loaded = false;
  std::string why;      // reason it is not loaded
  std::string path;     // file the library was loaded from (from dladdr), when known

  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;

  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" or "CUresult 2" when the driver cannot name it.
  std::string error_text(CUresult r) const;
};

// Loads libcuda.so.1 once per process (never unloaded). Does not call cuInit.
const Driver& driver();

// Initialised driver state: cuInit's result and the device count.
struct DriverState {
  bool available = false;  // loaded and cuInit succeeded (possibly with 0 devices)
  std::string message;     // why not available, in words
  int version = 0;         // cuDriverGetVersion: 13000 = CUDA 13.0
  int device_count = 0;
};
const DriverState& driver_state();

// "13.0" from 13000.
std::string cuda_version_text(int v);

// Makes device `index`'s primary context (the one libselscan's statically linked runtime uses) current on this
// thread. Returns false with `err` set on failure.
bool make_current(int index, std::string* err);

}  // namespace selscan_support
