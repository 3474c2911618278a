// Shared-memory index maps of the thread-states backward (ts.cuh), in a header of its own so that the host
// tests (tests/cpu/test_bwd_ts_layout.cpp) check them without a GPU: every map is a bijection, and the accesses the
// kernel makes through them are free of bank conflicts.
//
// Shared memory serves 16-byte accesses per quarter-warp (8 lanes: 128 bytes a wavefront) and 8-byte ones per
// half-warp, so the layouts keep those groups on distinct banks.
#pragma once

#include "cuda/plans.h"  // the kernel's shape constants and SELSCAN_HD

namespace selscan::kern::bwd::ts {

using cuda::bwd_ts::kCh;
using cuda::bwd_ts::kRedSlot;
using cuda::bwd_ts::kRedWarp;
using cuda::bwd_ts::kRow;
using cuda::bwd_ts::kTT;

// The per-warp dB/dC reduction buffer: step slot tt (4), lane row r (32, 8 floats each), value v (8). Slots are 264
// floats apart, and row r holds its two float4 halves swapped when red_swz(r) (bit 2 of r differs from bit 4).
// Writes: the 8 lanes of a quarter-warp store their rows' float4s (values 0-3 at red_at(tt, r, 0), 4-7 at
// red_at(tt, r, 4)) to 8 different bank quads. Reads: the 32 lanes reading (slot, value) pairs of one row (or, with
// 16 rows per output, of rows i and 16 + i) hit 32 different banks.
SELSCAN_HD constexpr int red_swz(int r) { return ((r >> 2) ^ (r >> 4)) & 1; }
SELSCAN_HD constexpr int red_at(int tt, int r, int v) { return tt * kRedSlot + r * 8 + (v ^ (red_swz(r) << 2)); }
// The reduction's read of row r0 + i, r0 = 0 or 16, given base = red_at(tt, r0, v): the row's swizzle is red_swz(r0)
// flipped by red_swz(i), known at compile time per i, so each read is base or base ^ 4 (the other half of the same
// row) plus an immediate offset.
SELSCAN_HD constexpr int red_read(int base, int i) { return (red_swz(i) ? (base ^ 4) : base) + i * 8; }

// Staging and epilogue items (channel c, 4 steps q) of a tile. Item it goes to channel
// 8 (it / 32) + (it % 32) / 8 + 4 ((it / 4) % 2), steps q = it % 4: a quarter-warp holds channels m and m + 4, whose
// float rows start 16 banks apart (4 kRow = 80), and the 4 lanes of a channel still cover one 32-byte sector of its
// global row. Raw rows (32 bytes in bf16/fp16) are stored in the order raw_slot(c), which puts the 4 channels of a
// half-warp (m, m + 4, m + 1, m + 5) on consecutive rows, so their 8-byte reads are conflict-free too.
static_assert(kTT / 4 == 4 && kCh % 8 == 0, "item mapping assumes 4 items per channel and 8-channel groups");
SELSCAN_HD inline void item_at(int it, int& c, int& q) {
  const int l = it & 31;
  c = (it >> 5) * 8 + (l >> 3) + 4 * ((l >> 2) & 1);
  q = l & 3;
}
SELSCAN_HD constexpr int raw_slot(int c) { return (c & ~7) | ((c & 3) << 1) | ((c >> 2) & 1); }

}  // namespace selscan::kern::bwd::ts
