// Tensor maps for the copy engine of sm_90 GPUs (the tensor memory accelerator): a kernel copies a whole box of a
// tensor into shared memory with one instruction of one thread. Host side: the maps are encoded by the driver
// (cuTensorMapEncodeTiled, reached through the runtime, so the library still links no libcuda) and passed to the
// kernel as a __grid_constant__ parameter.
#pragma once

#include <cstdint>

#include "problem.h"

namespace selscan::cuda {

// The driver's CUtensorMap: 128 opaque bytes, 128-byte aligned (its layout as cuda.h declares it since CUDA 12).
struct alignas(128) TileMap {
  uint64_t q[16];
};

// One tensor as the copy engine reads it: `rank` (2..5) dimensions, innermost first: their sizes, the byte strides
// of dimensions 1 and up, and the box one copy delivers (box[0] * elem_bytes a multiple of 16). Elements past a
// dimension's end read as zero. base == nullptr: a map the call does not use.
struct TileMapSpec {
  const void* base = nullptr;
  int elem_bytes = 0, rank = 0;
  int64_t dims[5] = {};
  int64_t strides[4] = {};
  uint32_t box[5] = {};
};

// Whether the copy engine can serve s, as far as the library can tell without the driver: a base and strides on 16
// bytes, sizes up to 2^31 - 1 (kernels address boxes with 32-bit coordinates), boxes of 1..256 per dimension.
bool tile_map_fits(const TileMapSpec& s);

// Encodes *m for s. False, leaving the caller to copy another way, where a map cannot serve: tile_map_fits fails, a
// toolkit before CUDA 12, or a driver without the encoder or refusing the map.
bool encode_tile_map(TileMap* m, const TileMapSpec& s);
// Encodes every map of `specs` that has a base; false where one fails.
template <int N>
bool encode_tile_maps(TileMap (&maps)[N], const TileMapSpec (&specs)[N]) {
  for (int i = 0; i < N; ++i)
    if (specs[i].base != nullptr && !encode_tile_map(&maps[i], specs[i])) return false;
  return true;
}

// The maps of the thread-states backward's copy-engine instance (kernels/bwd/ts.cuh, TileMaps), slot by slot: u,
// delta, dout and, with z, z and out as (L, D, Bt) boxes of kTT steps x kCh channels; variable B, C as (L, N, G, Bt)
// boxes of kTT steps x N states. Slots the call does not use keep a null base.
constexpr int kBwdTileMaps = 7;
void bwd_tile_map_specs(const Problem& p, TileMapSpec (&specs)[kBwdTileMaps]);

// The maps of the thread-states forward's copy-engine instance (kernels/fwd/ts.cuh, kTma), in its slot order: u,
// delta as (L, D, Bt) boxes of fwd_ts::kTmaTt steps x kTmaCh channels; variable B, C as (L, N, G, Bt) boxes of
// kTmaTt steps x N states; z (when given) like u. Slots the call does not use keep a null base. Needs 16-bit itype
// tensors.
constexpr int kFwdTileMaps = 5;
void fwd_tile_map_specs(const Problem& p, TileMapSpec (&specs)[kFwdTileMaps]);

}  // namespace selscan::cuda
