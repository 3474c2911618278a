// The conv1d decode update (selscan_conv1d_update, causal-conv1d's causal_conv1d_update): T new tokens per sequence
// advance that sequence's window of past inputs (a pool slot of state_len columns).
//
// A thread per (sequence, channel); a block covers 128 consecutive channels of one sequence, so the slot lookup and
// the padding branch are uniform over the block. The call is memory-bound and tiny per thread (state_len columns in
// and out, T inputs and outputs): consecutive channels of a slot are state_len elements apart, so a warp's column
// accesses fall in a few sectors that the next column's access finds in L1. The slot's W-1 window columns are read
// before anything is written, then the state shifts (or, with cache_seqlens, the tokens overwrite their circular
// columns); the thread is the slot channel's only reader and writer.
#pragma once

#include "common.cuh"

namespace selscan::kern::conv1d {

// The state's dtype S (f32 or itype) is an instance parameter (run-time dtype IO made every state access a
// three-way branch). The width is not (common.cuh, "width"): a dead tap's FMA is predicated off, and its weight and
// window slot are read from columns that exist (weight column 0; state column 0 where the state has fewer than
// kMaxW - 1 columns) and never used, so the loads stay unconditional and the window's shift stays register moves
// (which the unrolled token loop renames away). Per token that costs at most the copy of the bias the predicated
// first tap needs. The loops stay rolled: unrolled register copies of up to 8 columns and tokens, with every load
// issued before the first store, measured slower on the H200 (runs 43-45: Bt 256 25.8 -> 30.0 -> 34.4 us): the
// kernel is bound by instruction issue, not by its few round trips.
template <typename T, typename S>
__global__ void __launch_bounds__(kThreads) update_kernel(const Conv1dUpdate p, const Conv1dPlan plan) {
  constexpr int W = kMaxW, H = W - 1;
  const Taps tk = taps_of(p.width);
  // grid.x = tiles * batch < 2^31 (the plan): 32-bit division.
  const unsigned bx = blockIdx.x, tiles = static_cast<unsigned>(plan.tiles);
  const int64_t b = bx / tiles;
  const int64_t d = static_cast<int64_t>(bx - static_cast<unsigned>(b) * tiles) * kThreads + threadIdx.x;
  if (d >= p.dim) return;
  const T* xr = static_cast<const T*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1];
  T* orow = static_cast<T*>(p.out.p) + b * p.out.s[0] + d * p.out.s[1];
  const int64_t xs = p.x.s[2], os = p.out.s[2], NT = p.tokens;

  int64_t slot = b;
  if (p.indices.p != nullptr) {
    slot = ld_index(p.indices.p, p.idx_i64, b * p.indices.s[0]);
    if (slot == p.pad_slot_id || slot < 0 || slot >= p.slots) {  // padding: 0; outside the pool: NaN
      const float v = slot == p.pad_slot_id ? 0.f : __uint_as_float(kQuietNan);
      for (int64_t i = 0; i < NT; ++i) orow[i * os] = from_f32<T>(v);
      return;
    }
  }
  float w[W], bias = p.bias.p != nullptr ? ld_dtype(p.wtype, p.bias.p, d * p.bias.s[0]) : 0.f;
#pragma unroll
  for (int k = 0; k < W; ++k) {  // a dead tap reads column 0, unused
    const int64_t col = tk.live(k) ? k - tk.k0 : 0;
    w[k] = ld_dtype(p.wtype, p.weight.p, d * p.weight.s[0] + col * p.weight.s[1]);
  }

  S* cs = static_cast<S*>(p.conv_state.p) + slot * p.conv_state.s[0] + d * p.conv_state.s[1];
  const int64_t sj = p.conv_state.s[2], SL = p.state_len;
  const auto ld_state = [&](int64_t j) { return to_f32(cs[j * sj]); };
  const auto st_state = [&](int64_t j, float v) { cs[j * sj] = from_f32<S>(v); };

  float win[W];  // the H inputs before the current token (unused at dead taps), then the token
  const auto token = [&](int64_t i, float xv) {
    win[H] = xv;
    float acc = bias;
#pragma unroll
    for (int k = 0; k < W; ++k) acc = tap(tk.live(k), w[k], win[k], acc);
    orow[i * os] = from_f32<T>(act(acc, p.silu));
#pragma unroll
    for (int k = 0; k < H; ++k) win[k] = win[k + 1];
  };
  if (p.cache_seqlens.p != nullptr) {
    // Circular: the tokens go to columns (c + i) mod SL, the width-1 before them are the window (the dead slots'
    // columns, mod SL, are read and unused).
    int64_t c = ld_index(p.cache_seqlens.p, p.seqlens_i64, b * p.cache_seqlens.s[0]) % SL;
    if (c < 0) c += SL;  // a negative length breaks the contract; stay inside the slot
    int64_t col = c - H;
    while (col < 0) col += SL;
#pragma unroll
    for (int m = 0; m < H; ++m) {
      win[m] = ld_state(col);
      col = col + 1 == SL ? 0 : col + 1;
    }
    for (int64_t i = 0; i < NT; ++i) {
      const float xv = ldt(xr, i * xs);
      st_state(c, xv);
      c = c + 1 == SL ? 0 : c + 1;
      token(i, xv);
    }
    return;
  }
  // Shift: the window is the last width-1 columns; the state moves left by T (ascending: column j reads j + T > j,
  // not yet written) and the tokens fill its last columns.
#pragma unroll
  for (int m = 0; m < H; ++m) {  // a dead slot reads a column it does not use (column 0 where SL < kMaxW - 1)
    const int64_t j = SL - H + m;
    win[m] = ld_state(j >= 0 ? j : 0);
  }
  for (int64_t j = 0; j + NT < SL; ++j) st_state(j, ld_state(j + NT));
  for (int64_t i = 0; i < NT; ++i) {
    const float xv = ldt(xr, i * xs);
    if (SL - NT + i >= 0) st_state(SL - NT + i, xv);
    token(i, xv);
  }
}

}  // namespace selscan::kern::conv1d
