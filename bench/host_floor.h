// One enqueued operation without the library (bench/host_floor.cu), for the host-cost section's floor rows.
#pragma once

#include <cuda_runtime.h>

namespace selscan_bench {

// large_args_launch: an empty kernel taking an argument of sizeof(selscan::Problem) bytes; driver_launch: the empty
// kernel through the driver's cuLaunchKernel.
enum class FloorOp { empty_launch, large_args_launch, memset, driver_launch };

// Enqueues `op` on `stream` (`scratch`: 4 KB of device memory for the memset) and returns the launch's error.
cudaError_t floor_op(FloorOp op, cudaStream_t stream, void* scratch);
const char* floor_op_name(FloorOp op);

}  // namespace selscan_bench
