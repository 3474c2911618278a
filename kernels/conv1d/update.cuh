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

// The state's dtype S (f32 or itype) is an instance parameter: with run-time dtype IO every state access was a
// three-way branch, and the kernel issued more instructions than it moved sectors (ncu, H200, bf16 D 5120 Bt 256:
// ALU pipe 49%, issue slots 65%, DRAM 6%).

// State columns held in registers by the shifting update (state_len above it: a loop over the slot).
constexpr int kRegCols = 8;

// a[i] for a run-time i in [0, kRegCols) without indexing the array (which would put it in local memory).
__device__ __forceinline__ float pick(const float (&a)[kRegCols], int64_t i) {
  float v = a[0];
#pragma unroll
  for (int j = 1; j < kRegCols; ++j) v = i == j ? a[j] : v;
  return v;
}

template <typename T, typename S, int W>
__global__ void __launch_bounds__(kThreads) update_kernel(const Conv1dUpdate p, const Conv1dPlan plan) {
  constexpr int H = W - 1;
  // grid.x = tiles * batch < 2^31 (the plan): 32-bit division.
  const unsigned bx = blockIdx.x, tiles = static_cast<unsigned>(plan.tiles);
  const int64_t b = bx / tiles;
  const int64_t d = static_cast<int64_t>(bx - static_cast<unsigned>(b) * tiles) * kThreads + threadIdx.x;
  if (d >= p.dim) return;
  const T* xr = static_cast<const T*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1];
  T* orow = static_cast<T*>(p.out.p) + b * p.out.s[0] + d * p.out.s[1];
  const int64_t xs = p.x.s[2], os = p.out.s[2], NT = p.tokens;

  // Everything that does not depend on the slot is issued before the slot lookup: the weights, the bias and (up
  // to kRegCols) the tokens. Loads after a store to the slot could not be hoisted above it, so nothing is read
  // after the first store.
  float w[W], bias = p.bias.p != nullptr ? ld_dtype(p.wtype, p.bias.p, d * p.bias.s[0]) : 0.f;
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = ld_dtype(p.wtype, p.weight.p, d * p.weight.s[0] + k * p.weight.s[1]);
  const bool xreg = NT <= kRegCols;
  float xt[kRegCols];
  if (xreg) {
#pragma unroll
    for (int i = 0; i < kRegCols; ++i)
      if (i < NT) xt[i] = ldt(xr, i * xs);
  }

  int64_t slot = b;
  if (p.indices.p != nullptr) {
    slot = ld_index(p.indices.p, p.idx_i64, b * p.indices.s[0]);
    if (slot == p.pad_slot_id || slot < 0 || slot >= p.slots) {  // padding: 0; outside the pool: NaN
      const float v = slot == p.pad_slot_id ? 0.f : __uint_as_float(kQuietNan);
      for (int64_t i = 0; i < NT; ++i) orow[i * os] = from_f32<T>(v);
      return;
    }
  }
  S* cs = static_cast<S*>(p.conv_state.p) + slot * p.conv_state.s[0] + d * p.conv_state.s[1];
  const int64_t sj = p.conv_state.s[2], SL = p.state_len;
  const auto ld_state = [&](int64_t j) { return to_f32(cs[j * sj]); };
  const auto st_state = [&](int64_t j, float v) { cs[j * sj] = from_f32<S>(v); };
  const bool circ = p.cache_seqlens.p != nullptr;

  float win[W];  // the H inputs before the current token, then the token
  int64_t c = 0;  // circular: the column of the next token
  if (circ) {
    // The tokens go to columns (c + i) mod SL, the H before them are the window.
    c = ld_index(p.cache_seqlens.p, p.seqlens_i64, b * p.cache_seqlens.s[0]) % SL;
    if (c < 0) c += SL;  // a negative length breaks the contract; stay inside the slot
    int64_t col = c - H;
    while (col < 0) col += SL;
#pragma unroll
    for (int m = 0; m < H; ++m) {
      win[m] = ld_state(col);
      col = col + 1 == SL ? 0 : col + 1;
    }
  } else if (SL <= kRegCols) {
    // Shift: the window is the last H columns; the state moves left by T and the tokens fill its last columns.
    // Every column read at once, then the shifted ones written.
    float old[kRegCols];
#pragma unroll
    for (int j = 0; j < kRegCols; ++j)
      if (j < SL) old[j] = ld_state(j);
#pragma unroll
    for (int m = 0; m < H; ++m) win[m] = pick(old, SL - H + m);
#pragma unroll
    for (int j = 0; j < kRegCols; ++j)
      if (j + NT < SL) st_state(j, pick(old, j + NT));
  } else {  // a long state: ascending, column j reads j + T > j, not yet written
#pragma unroll
    for (int m = 0; m < H; ++m) win[m] = ld_state(SL - H + m);
    for (int64_t j = 0; j + NT < SL; ++j) st_state(j, ld_state(j + NT));
  }
  // Token i: its column (circular: c + i mod SL; shift: SL - T + i where that is a column), its output.
  const auto token = [&](int64_t i, float xv) {
    if (circ) {
      st_state(c, xv);
      c = c + 1 == SL ? 0 : c + 1;
    } else if (SL - NT + i >= 0) {
      st_state(SL - NT + i, xv);
    }
    win[H] = xv;
    float acc = bias;
#pragma unroll
    for (int k = 0; k < W; ++k) acc = fmaf(w[k], win[k], acc);
    orow[i * os] = from_f32<T>(act(acc, p.silu));
#pragma unroll
    for (int k = 0; k < H; ++k) win[k] = win[k + 1];
  };
  if (xreg) {
#pragma unroll
    for (int i = 0; i < kRegCols; ++i)
      if (i < NT) token(i, xt[i]);
  } else {
    for (int64_t i = 0; i < NT; ++i) token(i, ldt(xr, i * xs));
  }
}

}  // namespace selscan::kern::conv1d
