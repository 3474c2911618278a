#include "cuda/tile_map.h"

#include <cuda_runtime.h>

#if CUDART_VERSION >= 12000
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

namespace selscan::cuda {

#if CUDART_VERSION >= 12000
static_assert(sizeof(TileMap) == sizeof(CUtensorMap) && alignof(TileMap) >= alignof(CUtensorMap),
              "TileMap must hold a CUtensorMap");

namespace {

using Encode = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's encoder, looked up once per process; null where the driver has none (older than CUDA 12).
Encode encoder() {
  static const Encode fn = [] {
    void* f = nullptr;
#if CUDART_VERSION >= 12050
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const bool ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                                     &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
#else
    const bool ok = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault) == cudaSuccess;
#endif
    return ok ? reinterpret_cast<Encode>(f) : nullptr;
  }();
  return fn;
}

}  // namespace
#endif

bool encode_tile_map(TileMap* m, const TileMapSpec& s) {
  if (!tile_map_fits(s)) return false;
#if CUDART_VERSION >= 12000
  cuuint64_t gdim[5], gstride[4];
  cuuint32_t gbox[5], estride[5];
  for (int i = 0; i < s.rank; ++i) {
    gdim[i] = static_cast<cuuint64_t>(s.dims[i]);
    gbox[i] = s.box[i];
    estride[i] = 1;
  }
  for (int i = 0; i + 1 < s.rank; ++i) gstride[i] = static_cast<cuuint64_t>(s.strides[i]);
  const Encode enc = encoder();
  if (enc == nullptr) return false;
  CUtensorMap map;
  const CUresult r = enc(&map, s.elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT32,
                         static_cast<cuuint32_t>(s.rank), const_cast<void*>(s.base), gdim, gstride, gbox, estride,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                         CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  static_assert(sizeof(map) == sizeof(m->q));
  __builtin_memcpy(m->q, &map, sizeof(map));
  return true;
#else
  (void)m;
  return false;
#endif
}

}  // namespace selscan::cuda
