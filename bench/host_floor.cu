// The launch floor beside the host-cost rows (bench_host.cpp): what one enqueued operation costs the calling thread
// with no library work around it, so that a call's host time splits into the library's share and the runtime's.
#include <cuda.h>
#include <cuda_runtime.h>

#include "host_floor.h"
#include "src/problem.h"

namespace selscan_bench {
namespace {

__global__ void empty_kernel() {}

// As large as the scan's kernel argument (a Problem by value): the runtime copies it into every launch.
struct LargeArgs {
  unsigned char bytes[sizeof(selscan::Problem)];
};
__global__ void large_args_kernel(LargeArgs a) {
  if (a.bytes[threadIdx.x] == 0xff && threadIdx.x > 1024) a.bytes[0] = 0;  // reads the argument; never true
}

// An empty kernel launched with the backward's kind of dynamic shared memory (past the 48 KB default, opted in once).
constexpr int kSmemBytes = 100 * 1024;
__global__ void smem_kernel() {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x > 1024) smem[0] = 0;  // never true
}
cudaError_t smem_launch(cudaStream_t stream) {
  static const cudaError_t opted =
      cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (opted != cudaSuccess) return opted;
  smem_kernel<<<1, 32, kSmemBytes, stream>>>();
  return cudaGetLastError();
}

// The same empty kernel launched through the driver's cuLaunchKernel (looked up through the runtime, so nothing links
// libcuda): what a launch would cost the library without the runtime's own layer.
using DriverLaunch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void**, void**);
cudaError_t driver_launch(cudaStream_t stream) {
  static DriverLaunch launch = nullptr;
  static CUfunction fn = nullptr;
  if (launch == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || p == nullptr)
      return cudaErrorSymbolNotFound;
    cudaFunction_t f = nullptr;
    if (const cudaError_t e = cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&empty_kernel)); e != cudaSuccess)
      return e;
    fn = reinterpret_cast<CUfunction>(f);
    launch = reinterpret_cast<DriverLaunch>(p);
  }
  return launch(fn, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(stream), nullptr, nullptr) == CUDA_SUCCESS
             ? cudaSuccess
             : cudaErrorLaunchFailure;
}

}  // namespace

cudaError_t floor_op(FloorOp op, cudaStream_t stream, void* scratch) {
  switch (op) {
    case FloorOp::empty_launch:
      empty_kernel<<<1, 32, 0, stream>>>();
      return cudaGetLastError();
    case FloorOp::large_args_launch: {
      LargeArgs a{};
      large_args_kernel<<<1, 32, 0, stream>>>(a);
      return cudaGetLastError();
    }
    case FloorOp::memset:
      return cudaMemsetAsync(scratch, 0, 4096, stream);
    case FloorOp::driver_launch:
      return driver_launch(stream);
    case FloorOp::smem_launch:
      return smem_launch(stream);
    case FloorOp::large_memset:
      return cudaMemsetAsync(scratch, 0, kFloorLargeMemsetBytes, stream);
  }
  return cudaErrorInvalidValue;
}

const char* floor_op_name(FloorOp op) {
  switch (op) {
    case FloorOp::empty_launch: return "empty_launch";
    case FloorOp::large_args_launch: return "problem_args_launch";
    case FloorOp::memset: return "memset4k";
    case FloorOp::driver_launch: return "driver_empty_launch";
    case FloorOp::smem_launch: return "smem100k_launch";
    case FloorOp::large_memset: return "memset2m";
  }
  return "?";
}

}  // namespace selscan_bench
