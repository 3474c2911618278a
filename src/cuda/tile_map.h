// Tensor maps for the copy engine of sm_90 GPUs (the tensor memory accelerator): a kernel copies a whole box of a
// tensor into shared memory with one instruction of one thread. Host side: the maps are encoded by the driver
// (cuTensorMapEncodeTiled, reached through the runtime, so the library still links no libcuda) and passed to the
// kernel as a __grid_constant__ parameter.
#pragma once

#include <cstdint>

namespace selscan::cuda {

// The driver's CUtensorMap: 128 opaque bytes, 128-byte aligned (its layout as cuda.h declares it since CUDA 12).
struct alignas(128) TileMap {
  uint64_t q[16];
};

// Encodes *m for a tensor of `rank` (2..5) dimensions, innermost first: their sizes, the byte strides of dimensions 1
// and up, and the box one copy delivers (box[0] * elem_bytes a multiple of 16). Elements past a dimension's end read
// as zero. Returns false, leaving the caller to copy another way, where a map cannot serve: a toolkit before CUDA 12,
// a driver without tensor maps, a base or stride not on 16 bytes, or a size past 2^31 - 1 (kernels address boxes with
// 32-bit coordinates).
bool encode_tile_map(TileMap* m, int elem_bytes, int rank, const void* base, const int64_t* dims,
                     const int64_t* strides, const uint32_t* box);

}  // namespace selscan::cuda
