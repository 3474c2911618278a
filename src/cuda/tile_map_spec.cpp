// The copy engine's tensor maps as plain descriptions (src/cuda/tile_map.h): what the kernel choice checks and the
// launcher encodes. Host-only and free of CUDA headers, so that CPU-only builds can test the kernel choice with it.
#include "cuda/tile_map.h"

#include <cstdint>

#include "cuda/plans.h"

namespace selscan::cuda {

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
