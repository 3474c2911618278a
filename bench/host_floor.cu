// The launch floor beside the host-cost rows (bench_host.cpp): what one enqueued operation costs the calling thread
// with no library work around it, so that a call's host time splits into the library's share and the runtime's.
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
  }
  return cudaErrorInvalidValue;
}

const char* floor_op_name(FloorOp op) {
  switch (op) {
    case FloorOp::empty_launch: return "empty_launch";
    case FloorOp::large_args_launch: return "problem_args_launch";
    case FloorOp::memset: return "memset4k";
  }
  return "?";
}

}  // namespace selscan_bench
