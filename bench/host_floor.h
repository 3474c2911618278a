// One enqueued operation without the library (bench/host_floor.cu), for the host-cost section's floor rows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace selscan_bench {

// large_args_launch: an empty kernel taking an argument of sizeof(selscan::Problem) bytes; driver_launch: the empty
// kernel through the driver's cuLaunchKernel; smem_launch: an empty kernel with 100 KB of dynamic shared memory;
// large_memset: kFloorLargeMemsetBytes zeroed (the backward's two dB/dC images at 8x1536x2048:16).
enum class FloorOp { empty_launch, large_args_launch, memset, driver_launch, smem_launch, large_memset };
constexpr size_t kFloorLargeMemsetBytes = size_t{2} << 20;

// Enqueues `op` on `stream` (`scratch`: at least kFloorLargeMemsetBytes of device memory for the memsets) and
// returns the launch's error.
cudaError_t floor_op(FloorOp op, cudaStream_t stream, void* scratch);
const char* floor_op_name(FloorOp op);

}  // namespace selscan_bench
