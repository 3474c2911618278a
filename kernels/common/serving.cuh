// Where sequence b of a call lives (docs/serving.md), worked out by each block on the device: a dense call's batch row
// b over [0, seqlen), its h0 row and last_state row; a serving call's offsets from cu_seqlens, its slot from
// cache_indices and its flag from has_initial_state. The index tensors are read here only, never on the host, so
// serving calls stay capturable in CUDA graphs.
//
// Robust to bad contents (the host cannot check device memory): offsets are clamped into [0, total_len] (a bad
// cu_seqlens gives wrong values, never an access outside the tensors), and a cache index outside [0, S) that is not
// the padding id reads and writes no slot (its outputs are NaN). In block mode (block-wise state caching) every
// table entry the sequence reads is checked up front, so a bad one leaves all its slots untouched.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "math.cuh"
#include "problem.h"

namespace selscan::kern {

enum SeqSkip : int {
  kSeqRun = 0,      // scan it
  kSeqPad = 1,      // padding: outputs 0, no slot read or written, zero gradients
  kSeqBadSlot = 2,  // cache index outside the pool: outputs NaN, no slot read or written
};

struct Seq {
  int64_t row;  // batch row of the (Bt, D, L) tensors and of variable B/C
  int64_t t0;   // its first time step in them
  int64_t len;  // its length
  int64_t xc0;  // chunk slot of its first chunk in x (row `row`)
  View init;    // the state it starts from, at element d * s[1] + n * s[2] (p == nullptr: zero)
  View fin;     // where its final state goes, likewise (p == nullptr: nowhere)
  int skip;     // SeqSkip
  int64_t ctx;    // block mode: tokens before this call (0 otherwise)
  int64_t block;  // block mode: K, the block size (0: off)
};

__device__ __forceinline__ int64_t load_entry(const View& v, bool i64, int64_t i) {
  return i64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(v.p) + i * v.s[0]))
             : static_cast<int64_t>(__ldg(static_cast<const int*>(v.p) + i * v.s[0]));
}

// Row `r` of a (rows, D, N) weights-typed view (absent stays absent).
template <bool kC>
__device__ __forceinline__ View state_row(const View& v, int64_t r) {
  View s = v;
  if (s.p != nullptr) s.p = static_cast<typename Weights<kC>::W*>(s.p) + r * v.s[0];
  return s;
}

__device__ __forceinline__ int64_t table_entry(const Problem& p, int64_t b, int64_t j) {
  const int64_t i = b * p.block_table.s[0] + j * p.block_table.s[1];
  return p.table_i64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(p.block_table.p) + i))
                     : static_cast<int64_t>(__ldg(static_cast<const int*>(p.block_table.p) + i));
}

// Block mode (p.block_size > 0): the sequence's context, its starting and final slots, and whether every entry it
// writes is pad_slot_id or a slot of the pool. Called by whole warps (the entries are checked lane-strided).
template <bool kC>
__device__ __forceinline__ void seq_blocks(const Problem& p, int64_t b, bool from_state, Seq& s) {
  const int64_t K = p.block_size, len = s.len;
  const int64_t c = p.context_lens.p != nullptr ? load_entry(p.context_lens, p.ctx_i64, b) : 0;
  s.block = K;
  s.ctx = c;
  s.init = s.fin = View{};
  if (len == 0) return;  // no entry read, no slot written
  if (c < 0 || c > INT64_MAX - len || seq_block_last(c, len, K) >= p.table_cols) {
    s.skip = kSeqBadSlot;
    return;
  }
  const int64_t last = seq_block_last(c, len, K), fin = table_entry(p, b, last);
  if (fin == p.pad_slot_id) {
    s.skip = kSeqPad;
    return;
  }
  bool bad = false;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t j = seq_block_first(c, K) + lane; j <= last; j += 32) {
    const int64_t v = table_entry(p, b, j);
    bad = bad || (v != p.pad_slot_id && (v < 0 || v >= p.slots));
  }
  int64_t first = 0;
  if (c > 0 && from_state) {
    first = table_entry(p, b, (c - 1) / K);
    bad = bad || first < 0 || first >= p.slots;  // pad_slot_id included: a resumed sequence needs its state
  }
  if (__any_sync(0xffffffffu, bad)) {
    s.skip = kSeqBadSlot;
    return;
  }
  s.fin = state_row<kC>(p.ssm_states, fin);
  if (c > 0 && from_state) s.init = state_row<kC>(p.ssm_states, first);
}

// Block mode: the state h of channel d, state n after local position pos (a block end) into that block's slot,
// unless its entry is pad_slot_id (seq_blocks has checked the others).
template <bool kC>
__device__ __forceinline__ void store_block_state(const Problem& p, const Seq& s, int64_t b, int64_t pos, int64_t d,
                                                  int64_t n, typename Weights<kC>::W h) {
  const int64_t slot = table_entry(p, b, (s.ctx + pos) / s.block);
  if (slot == p.pad_slot_id) return;
  const View v = state_row<kC>(p.ssm_states, slot);
  st_w<kC>(v.p, d * v.s[1] + n * v.s[2], h);
}

// Which block-mode forward serves sequence b: the aligned one (the warp-scan kernel's aligned instance, or the
// thread-states serving instance in its place) where K = cuda::fwd_warp::kItemsReal divides the block size and the
// sequence's context (its block ends all fall on the last of a lane's K steps), else the warp-scan unaligned
// instance (kernels/fwd/). Decided from the context length alone, so the other kernel's blocks return after one load
// instead of after the sequence's offsets and every table entry it names (three dependent rounds). Every block-mode
// kernel evaluates it alike, so exactly one serves each sequence; seq_blocks reads the same entry, and
// kernels/fwd/launch.cuh skips the unaligned instance where no sequence can need it.
__device__ __forceinline__ bool blocks_aligned_ctx(const Problem& p, int64_t b, int K) {
  const int64_t c = p.context_lens.p != nullptr ? load_entry(p.context_lens, p.ctx_i64, b) : 0;
  return p.block_size % K == 0 && c % K == 0;
}

// The block-mode instances of the forward (kernels/fwd/warp.cuh): none, the one for sequences whose block ends fall
// on the last of every K steps, the one for the others.
enum BlockMode : int { kNoBlocks = 0, kBlocksAligned = 1, kBlocksUnaligned = 2 };

// kBlocks: the kernel variant that runs block mode (the forward's); the others carry none of its code.
template <bool kC, bool kBlocks>
__device__ __forceinline__ Seq seq_of(const Problem& p, int64_t b) {
  Seq s{b, 0, p.seqlen, 0, state_row<kC>(p.h0, b), state_row<kC>(p.last_state, b), kSeqRun, 0, 0};
  if (!p.serving) return s;
  if (p.varlen) {
    const int64_t total = p.seqlen;
    int64_t a = load_entry(p.cu_seqlens, p.cu_i64, b), e = load_entry(p.cu_seqlens, p.cu_i64, b + 1);
    a = a < 0 ? 0 : (a > total ? total : a);
    e = e < a ? a : (e > total ? total : e);
    s.row = 0;
    s.t0 = a;
    s.len = e - a;
    s.xc0 = seq_chunk0(a, b);
  }
  bool from_state = true;
  if (p.has_init.p != nullptr)
    from_state = p.init_i32 ? __ldg(static_cast<const int*>(p.has_init.p) + b * p.has_init.s[0]) != 0
                            : __ldg(static_cast<const unsigned char*>(p.has_init.p) + b * p.has_init.s[0]) != 0;
  if constexpr (kBlocks) {
    seq_blocks<kC>(p, b, from_state, s);
    return s;
  }
  int64_t slot = b;
  if (p.cache_indices.p != nullptr) {
    slot = load_entry(p.cache_indices, p.idx_i64, b);
    if (slot == p.pad_slot_id) s.skip = kSeqPad;
  }
  if (p.ssm_states.p != nullptr) {
    if (s.skip == kSeqRun && (slot < 0 || slot >= p.slots)) s.skip = kSeqBadSlot;
    // The slot is read (before the same warp overwrites it) and written in place.
    s.fin = s.skip == kSeqRun ? state_row<kC>(p.ssm_states, slot) : View{};
    s.init = s.fin;
  }
  if (s.skip != kSeqRun || !from_state) s.init.p = nullptr;
  return s;
}

}  // namespace selscan::kern
