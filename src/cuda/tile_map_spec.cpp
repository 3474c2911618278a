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

namespace {
// A dimension of size 1 is only ever at coordinate 0, so its stride is free: give it a packed one (a multiple of 16
// bytes when the dimension below is), since a view may hold anything there (0 for B of shape (Bt, N, L)).
void packed(TileMapSpec& s) {
  for (int i = 1; i < s.rank; ++i)
    if (s.dims[i] == 1)
      s.strides[i - 1] = i == 1 ? (s.dims[0] * s.elem_bytes + 15) / 16 * 16 : s.strides[i - 2] * s.dims[i - 1];
}
// A (Bt, D, L) tensor as (L, D, Bt) boxes of `steps` x `channels`.
TileMapSpec row_spec(const Problem& p, const View& v, uint32_t steps, uint32_t channels) {
  const int isz = real_bytes(p.itype);
  TileMapSpec s{v.p, isz, 3, {p.seqlen, p.dim, p.batch}, {v.s[1] * isz, v.s[0] * isz}, {steps, channels, 1}};
  packed(s);
  return s;
}
// Variable B or C, (Bt, G, N, L), as (L, N, G, Bt) boxes of `steps` x N.
TileMapSpec bc_spec(const Problem& p, const View& v, uint32_t steps) {
  const int isz = real_bytes(p.itype);
  TileMapSpec s{v.p, isz, 4, {p.seqlen, p.dstate, p.groups, p.batch}, {v.s[2] * isz, v.s[1] * isz, v.s[0] * isz},
                {steps, static_cast<uint32_t>(p.dstate), 1, 1}};
  packed(s);
  return s;
}
}  // namespace

void bwd_tile_map_specs(const Problem& p, TileMapSpec (&specs)[kBwdTileMaps]) {
  for (TileMapSpec& s : specs) s = TileMapSpec{};
  const View* rows[5] = {&p.u, &p.delta, &p.dout, &p.z, &p.out};
  const int nrows = p.z.p != nullptr ? 5 : 3;
  for (int i = 0; i < nrows; ++i) specs[i] = row_spec(p, *rows[i], bwd_ts::kTT, bwd_ts::kCh);
  if (p.var_B) specs[5] = bc_spec(p, p.B, bwd_ts::kTT);
  if (p.var_C) specs[6] = bc_spec(p, p.C, bwd_ts::kTT);
}

void fwd_tile_map_specs(const Problem& p, TileMapSpec (&specs)[kFwdTileMaps]) {
  for (TileMapSpec& s : specs) s = TileMapSpec{};
  specs[0] = row_spec(p, p.u, fwd_ts::kTmaTt, fwd_ts::kTmaCh);
  specs[1] = row_spec(p, p.delta, fwd_ts::kTmaTt, fwd_ts::kTmaCh);
  if (p.var_B) specs[2] = bc_spec(p, p.B, fwd_ts::kTmaTt);
  if (p.var_C) specs[3] = bc_spec(p, p.C, fwd_ts::kTmaTt);
  if (p.z.p != nullptr) specs[4] = row_spec(p, p.z, fwd_ts::kTmaTt, fwd_ts::kTmaCh);
}

}  // namespace selscan::cuda
