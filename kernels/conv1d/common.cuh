// What every conv1d kernel shares: scalar IO of itype values (states, gradients; run-time dtypes: io.cuh's ld_dtype),
// vector IO of a thread's run of itype values, the index tensors of packed calls read on the device, and where the
// inputs before a sequence's first step come from (initial_states, a conv_states slot, or zeros).
//
// Bad index contents never leave the tensors: offsets are clamped into [0, total_L], sequence numbers into
// [0, Bt), and a pool entry outside [0, S) makes its sequence's outputs NaN without touching a slot.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "../common/io.cuh"
#include "../common/math.cuh"
#include "conv1d.h"
#include "cuda/plans.h"

namespace selscan::kern::conv1d {

using cuda::Conv1dPlan;
constexpr int kThreads = cuda::conv1d::kThreads;

// ---------------------------------------------------------------------------------------------- scalar IO
// One itype value (plain load: conv_states are read and written in place by the same call).
template <typename T>
__device__ __forceinline__ float ldt(const T* p, int64_t off) {
  return to_f32(p[off]);
}

// ---------------------------------------------------------------------------------------------- vector IO
// N consecutive itype values as floats: N * sizeof(T) is 8, 16 or 32 bytes and p is aligned to min(16, that)
// (checked on the host: src/cuda/select.cpp).
template <typename T>
__device__ __forceinline__ void unpack_word(uint32_t w, float* out) {
  if constexpr (sizeof(T) == 4) {
    out[0] = __uint_as_float(w);
  } else if constexpr (std::is_same_v<T, __half>) {
    out[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    out[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  } else {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
  }
}

template <typename T>
__device__ __forceinline__ uint32_t pack_word(const float* in) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(in[0]);
  } else {
    return static_cast<uint32_t>(bits16(from_f32<T>(in[0]))) |
           (static_cast<uint32_t>(bits16(from_f32<T>(in[1]))) << 16);
  }
}

// The raw 32-bit words of N consecutive itype values (kept packed while loads are in flight: half the registers of
// floats for 16-bit types), and their floats.
template <typename T, int N>
struct Raw {
  static constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes == 8 || kBytes == 16 || kBytes == 32, "vector runs are 8, 16 or 32 bytes");
  uint32_t w[kBytes / 4];
};

template <typename T, int N>
__device__ __forceinline__ Raw<T, N> ldraw(const T* p) {
  Raw<T, N> r;
  if constexpr (Raw<T, N>::kBytes == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    r.w[0] = v.x, r.w[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < Raw<T, N>::kBytes / 16; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      r.w[4 * i] = v.x, r.w[4 * i + 1] = v.y, r.w[4 * i + 2] = v.z, r.w[4 * i + 3] = v.w;
    }
  }
  return r;
}

template <typename T, int N>
__device__ __forceinline__ void unpack(const Raw<T, N>& r, float* out) {
  constexpr int kPer = sizeof(T) == 4 ? 1 : 2;  // values per 32-bit word
#pragma unroll
  for (int i = 0; i < Raw<T, N>::kBytes / 4; ++i) unpack_word<T>(r.w[i], out + i * kPer);
}

template <typename T, int N>
__device__ __forceinline__ void ldvec(const T* p, float* out) {
  unpack<T, N>(ldraw<T, N>(p), out);
}

template <typename T, int N>
__device__ __forceinline__ void stvec(T* p, const float* in) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  constexpr int kPer = sizeof(T) == 4 ? 1 : 2;
  static_assert(kBytes == 8 || kBytes == 16 || kBytes == 32, "vector runs are 8, 16 or 32 bytes");
  uint32_t w[kBytes / 4];
#pragma unroll
  for (int i = 0; i < kBytes / 4; ++i) w[i] = pack_word<T>(in + i * kPer);
  if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      reinterpret_cast<uint4*>(p)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  }
}

// N values of a row from element index e0 on (element stride `s`), 0 at or past `lim`: one vector access when `vec`
// (then s == 1) and the run is whole, else element by element.
template <typename T, int N>
__device__ __forceinline__ void load_run(const T* row, int64_t e0, int64_t lim, int64_t s, bool vec, float* out) {
  if (vec && e0 + N <= lim) {
    ldvec<T, N>(row + e0, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = e0 + j < lim ? to_f32(row[(e0 + j) * s]) : 0.f;
}

template <typename T, int N>
__device__ __forceinline__ void store_run(T* row, int64_t e0, int64_t lim, int64_t s, bool vec, const float* in) {
  if (vec && e0 + N <= lim) {
    stvec<T, N>(row + e0, in);
    return;
  }
#pragma unroll
  for (int j = 0; j < N; ++j)
    if (e0 + j < lim) row[(e0 + j) * s] = from_f32<T>(in[j]);
}

// ---------------------------------------------------------------------------------------------- activation
// y * sigmoid(y) with the fast-math division of upstream's build.
__device__ __forceinline__ float act(float y, bool silu) { return silu ? __fdividef(y, 1.f + __expf(-y)) : y; }
// d act / dy: sigmoid(y) (1 + y (1 - sigmoid(y))) with SiLU, else 1.
__device__ __forceinline__ float dact(float y, bool silu) {
  if (!silu) return 1.f;
  const float s = __fdividef(1.f, 1.f + __expf(-y));
  return s * fmaf(y, 1.f - s, 1.f);
}

// ---------------------------------------------------------------------------------------------- width
// Every kernel is compiled once, for the widest filter (kMaxW taps: the taps index register arrays, so they stay
// unrolled), and serves each width wd in [2, kMaxW] with its taps right-aligned: tap k of the padded filter is the
// call's tap k - k0, k0 = kMaxW - wd, and taps k < k0 are dead (an instance per width would triple the conv1d's
// code for instructions that differ only in those idle taps). A dead tap's term is skipped, not multiplied by a zero
// weight: its input (or gradient) lies outside every window of this width and may be Inf or NaN. The skip is a
// uniform predicate on the FMA (sm_90 SASS: a predicated FFMA), which still costs a register copy where the sum
// starts and a few registers: the plain calls' code (fwd_plain, bwd_plain, the channel-last walks; issue-bound at
// Mamba's shapes) is compiled with every tap live (all_live(): the predicates fold away) and serves width kMaxW only
// (Conv1d::plain_fwd / plain_bwd); narrower plain calls take the general code. Idle taps add few bytes: the
// channel-last backward walks kMaxW-1 steps past its chunk at every width, the update reads a dead tap's weight and
// window column (cached lines it reads anyway).
constexpr int kMaxW = static_cast<int>(Conv1d::kMaxWidth);

struct Taps {
  int k0;  // the first live tap
  // The last two taps are live at every width (>= 2): compile-time true for them.
  __device__ __forceinline__ bool live(int k) const { return k >= kMaxW - 2 || k >= k0; }
};
__device__ __forceinline__ Taps taps_of(int64_t width) { return Taps{kMaxW - static_cast<int>(width)}; }
// Width kMaxW, known at compile time.
__device__ __forceinline__ Taps all_live() { return Taps{0}; }

// acc + w * x for a live tap, else acc as it is (no 0 * x term).
__device__ __forceinline__ float tap(bool live, float w, float x, float acc) { return live ? fmaf(w, x, acc) : acc; }

// ---------------------------------------------------------------------------------------------- weights
// weight[d, 0..wd-1] right-aligned in w[0..kMaxW-1] (0 at dead taps) and bias[d] (0 without bias), as floats;
// wtype is f32 or itype.
__device__ __forceinline__ void load_weights(const Conv1d& p, Taps tk, int64_t d, float* w, float* bias) {
#pragma unroll
  for (int k = 0; k < kMaxW; ++k)
    w[k] = tk.live(k) ? ld_dtype(p.wtype, p.weight.p, d * p.weight.s[0] + (k - tk.k0) * p.weight.s[1]) : 0.f;
  *bias = (p.bias.p != nullptr) ? ld_dtype(p.wtype, p.bias.p, d * p.bias.s[0]) : 0.f;
}

// ---------------------------------------------------------------------------------------------- sequences
__device__ __forceinline__ int64_t ld_index(const void* p, bool i64, int64_t off) {
  if (i64) return __ldg(static_cast<const long long*>(p) + off);
  return __ldg(static_cast<const int*>(p) + off);
}

// cu_seqlens[i] clamped into [0, total_L].
__device__ __forceinline__ int64_t cu_at(const Conv1d& p, int64_t i) {
  const int64_t v = ld_index(p.cu_seqlens.p, p.cu_i64, i * p.cu_seqlens.s[0]);
  return v < 0 ? 0 : (v > p.seqlen ? p.seqlen : v);
}

// The packed sequence holding step t: the last b in [0, Bt) with cu[b] <= t (so an empty sequence never holds a
// step). Binary search: the lanes of a warp probe the same few entries, which stay in L1.
__device__ __forceinline__ int64_t seq_of(const Conv1d& p, int64_t t) {
  int64_t lo = 0, hi = p.batch - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu_at(p, mid) <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// What a sequence does: run normally, or only write out (0 for padding, NaN for a pool entry outside [0, S)).
enum Kind : int { kRun = 0, kPad = 1, kBad = 2 };

// Where sequence b's inputs before its first step come from, for channel d (channel d + c at c * sc further):
// position p in [-cols, -1] is st[p * sj], or 0 when st is null (no initial state, or has_initial_state[b] = 0).
template <typename T>
struct Start {
  int kind = kRun;
  const T* st = nullptr;  // one past the state's last column
  int64_t sj = 0, sc = 0;
  __device__ __forceinline__ float at(int64_t pos, int c = 0) const {
    return st == nullptr ? 0.f : to_f32(st[pos * sj + c * sc]);
  }
};

template <typename T>
__device__ __forceinline__ Start<T> seq_start(const Conv1d& p, int64_t b, int64_t d) {
  Start<T> s;
  int64_t slot = b;
  if (p.cache_indices.p != nullptr) {
    slot = ld_index(p.cache_indices.p, p.idx_i64, b * p.cache_indices.s[0]);
    if (slot == p.pad_slot_id) {
      s.kind = kPad;
      return s;
    }
    if (p.conv_states.p != nullptr && (slot < 0 || slot >= p.slots)) {
      s.kind = kBad;
      return s;
    }
  }
  if (p.has_init.p != nullptr) {
    const int64_t off = b * p.has_init.s[0];
    const bool has = p.init_i32 ? __ldg(static_cast<const int*>(p.has_init.p) + off) != 0
                                : __ldg(static_cast<const unsigned char*>(p.has_init.p) + off) != 0;
    if (!has) return s;
  }
  if (p.init.p != nullptr) {
    s.st = static_cast<const T*>(p.init.p) + b * p.init.s[0] + d * p.init.s[1] + (p.width - 1) * p.init.s[2];
    s.sj = p.init.s[2], s.sc = p.init.s[1];
  } else if (p.conv_states.p != nullptr) {
    s.st = static_cast<const T*>(p.conv_states.p) + slot * p.conv_states.s[0] + d * p.conv_states.s[1] +
           p.state_len * p.conv_states.s[2];
    s.sj = p.conv_states.s[2], s.sc = p.conv_states.s[1];
  }
  return s;
}

constexpr uint32_t kQuietNan = 0x7fc00000u;

// seq_idx[b, t] (t in [0, L)), else INT_MIN: a tag no step carries.
__device__ __forceinline__ int seq_tag(const Conv1d& p, int64_t b, int64_t t) {
  if (t < 0 || t >= p.seqlen) return INT_MIN;
  return __ldg(static_cast<const int*>(p.seq_idx.p) + b * p.seq_idx.s[0] + t * p.seq_idx.s[1]);
}

}  // namespace selscan::kern::conv1d
