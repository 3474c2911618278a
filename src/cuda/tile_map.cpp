#include "cuda/tile_map.h"

#include <cuda_runtime.h>

#if CUDART_VERSION >= 12000
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

#include "cuda/plans.h"

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

bool tile_map_fits(const TileMapSpec& s) {
  constexpr int64_t kMaxCoord = (int64_t{1} << 31) - 1;
  if (s.rank < 2 || s.rank > 5 || (s.elem_bytes != 2 && s.elem_bytes != 4) || s.base == nullptr ||
      reinterpret_cast<uintptr_t>(s.base) % 16 != 0 || (s.box[0] * static_cast<uint32_t>(s.elem_bytes)) % 16 != 0)
    return false;
  for (int i = 0; i < s.rank; ++i)
    if (s.dims[i] < 1 || s.dims[i] > kMaxCoord || s.box[i] < 1 || s.box[i] > 256) return false;
  for (int i = 0; i + 1 < s.rank; ++i)
    if (s.strides[i] < 16 || s.strides[i] % 16 != 0 || s.strides[i] >= (int64_t{1} << 40)) return false;
  return true;
}

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

void bwd_tile_map_specs(const Problem& p, TileMapSpec (&specs)[kBwdTileMaps]) {
  constexpr int isz = 2;
  for (TileMapSpec& s : specs) s = TileMapSpec{};
  // A dimension of size 1 is only ever at coordinate 0, so its stride is free: give it a packed one (a multiple of
  // 16 bytes when the dimension below is), since a view may hold anything there (0 for B of shape (Bt, N, L)).
  const auto packed = [](TileMapSpec& s) {
    for (int i = 1; i < s.rank; ++i)
      if (s.dims[i] == 1)
        s.strides[i - 1] = i == 1 ? (s.dims[0] * isz + 15) / 16 * 16 : s.strides[i - 2] * s.dims[i - 1];
  };
  const View* rows[5] = {&p.u, &p.delta, &p.dout, &p.z, &p.out};
  const int nrows = p.z.p != nullptr ? 5 : 3;
  for (int i = 0; i < nrows; ++i) {
    TileMapSpec& s = specs[i];
    s = {rows[i]->p, isz, 3, {p.seqlen, p.dim, p.batch}, {rows[i]->s[1] * isz, rows[i]->s[0] * isz},
         {bwd_ts::kTT, bwd_ts::kCh, 1}};
    packed(s);
  }
  for (int isC = 0; isC < 2; ++isC) {
    if (!(isC ? p.var_C : p.var_B)) continue;
    const View& v = isC ? p.C : p.B;
    TileMapSpec& s = specs[5 + isC];
    s = {v.p, isz, 4, {p.seqlen, p.dstate, p.groups, p.batch}, {v.s[2] * isz, v.s[1] * isz, v.s[0] * isz},
         {bwd_ts::kTT, static_cast<uint32_t>(p.dstate), 1, 1}};
    packed(s);
  }
}

}  // namespace selscan::cuda
