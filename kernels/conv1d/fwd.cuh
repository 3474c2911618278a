// The conv1d forward: y[t] = bias + sum_k w[k] xe(t - (W-1) + k), out = y or silu(y) (include/selscan/selscan.h,
// section 5c). Three kernels:
//   fwd_rows    a thread owns 32 bytes of consecutive steps of one (row, channel) (16 of a 16-bit row, 8 of fp32):
//               two 16-byte loads in flight; the W-1 inputs before its run from the previous lane (shuffle) or, for
//               the first lane of a warp, from memory (the previous warp's or block's run: an L1/L2 hit). No shared
//               memory, no barrier.
//               Short rows share a block (row_threads < 128), so a 64-step row does not idle 120 threads. Without
//               vector IO it serves any strides (the generic kernel).
//   fwd_cl      channel-last: a thread owns kItems consecutive channels (8 bytes of a 16-bit itype) and walks
//               `chunk` steps with the W-1 previous inputs in registers, the next 32 bytes' loads in flight while the
//               current ones compute; a warp's step is 256 contiguous bytes. The block's weights are staged once
//               through shared memory (coalesced loads), and the walk's first loads go out before that barrier.
//   fwd_states  after either: final_states, and the conv_states pool's new columns (one thread per (sequence,
//               channel)). A separate launch because a pool slot is read by the main kernel's first steps of its
//               sequence, which another block may run: the write must wait for every read.
// Packed sequences (cu_seqlens), seq_idx, pool calls and widths below kMaxW take a uniform branch of the main kernels
// (`plain` is false); a plain call runs none of their code.
#pragma once

#include "common.cuh"

namespace selscan::kern::conv1d {

// A call that needs no per-step sequence logic (Conv1d::plain_fwd / plain_bwd): the row kernels have a lean kernel
// for these (fwd_plain, bwd_plain) and one for the rest (fwd_rows, bwd_rows): the packed, seq_idx and pool code raised
// the plain forward from 52 to 66 registers and the backward from 80 to 114 (bf16, W = 4), and those bytes in flight
// are what a plain call's speed is.

// ---------------------------------------------------------------------------------------------- rows
// Where a row-kernel thread works (forward and backward): batch row b, channel d, time tile `tile` and its run of I
// steps from t0. Threads past the last row take a copy of it (they still join the shuffles) and store nothing.
struct RowSpot {
  int64_t b, d, tile, t0;
  bool live;
};
template <int I>
__device__ __forceinline__ RowSpot row_spot(const Conv1d& p, const Conv1dPlan& plan) {
  RowSpot q;
  const int rt = plan.row_threads, tid = static_cast<int>(threadIdx.x);
  const int64_t nrows = p.rows() * p.dim;
  const int64_t rblk = static_cast<int64_t>(blockIdx.x) / plan.tiles;
  q.tile = static_cast<int64_t>(blockIdx.x) - rblk * plan.tiles;
  int64_t row = rblk * (kThreads / rt) + tid / rt;
  q.live = row < nrows;
  if (!q.live) row = nrows - 1;
  q.b = row / p.dim;
  q.d = row - q.b * p.dim;
  q.t0 = q.tile * plan.chunk + static_cast<int64_t>(tid % rt) * I;
  return q;
}

// The kMaxW-1 inputs before a run at t0, for the lane that cannot take them from its neighbour (the first of a warp
// or of a row): steps before 0 are a plain call's initial state (or 0); a dead tap's input is 0 and not read (before
// step 0 it would lie outside the state's width-1 columns). Issued right after the run's own loads and before any
// shuffle, so both latencies overlap: a shuffle of the loaded values waits for them, and loads issued after it would
// cost the warp a second round trip.
template <typename T, int H>
__device__ __forceinline__ void load_halo(const Conv1d& p, Taps tk, const T* xr, int64_t t0, int64_t xs, bool plain,
                                          int64_t b, int64_t d, float* hv) {
  Start<T> s0;
  if (plain && t0 < H) s0 = seq_start<T>(p, b, d);
#pragma unroll
  for (int m = 0; m < H; ++m) {
    const int64_t pos = t0 - H + m;
    hv[m] = !tk.live(m) ? 0.f : (pos >= 0 ? (pos < p.seqlen ? ldt(xr, pos * xs) : 0.f) : s0.at(pos));
  }
}

// The row kernel of every call that is not plain: packed sequences, seq_idx, pools, and a thread's 32 bytes
// contiguous.
template <typename T>
__global__ void __launch_bounds__(kThreads) fwd_rows(const Conv1d p, const Conv1dPlan plan) {
  constexpr int I = cuda::conv1d::kRowBytes / static_cast<int>(sizeof(T)), W = kMaxW, H = W - 1;
  const Taps tk = taps_of(p.width);
  const int rt = plan.row_threads;
  const int seg = rt < 32 ? rt : 32;  // lanes that exchange halos by shuffle
  const int tid = static_cast<int>(threadIdx.x);
  const RowSpot q = row_spot<I>(p, plan);
  const bool live = q.live;
  const int64_t b = q.b, d = q.d, t0 = q.t0;
  const int64_t L = p.seqlen;
  const T* xr = static_cast<const T*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1];
  const int64_t xs = p.x.s[2];

  float w[W], bias;
  load_weights(p, tk, d, w, &bias);
  float xw[H + I];  // inputs at t0 - H .. t0 + I - 1
  load_run<T, I>(xr, t0, L, xs, plan.vec, xw + H);
  const bool first = tid % seg == 0;
  float hv[H];
  if (first) load_halo<T, H>(p, tk, xr, t0, xs, false, b, d, hv);
#pragma unroll
  for (int m = 0; m < H; ++m) {
    const float v = __shfl_up_sync(kFullMask, xw[I + m], 1, seg);
    xw[m] = first ? hv[m] : v;
  }

  float y[I];
  if (p.seq_idx.p != nullptr) {
    // A term counts only where its step carries the output step's seq_idx; a negative seq_idx is padding.
    int tag[H + I];
#pragma unroll
    for (int j = 0; j < H + I; ++j) tag[j] = seq_tag(p, b, t0 - H + j);
#pragma unroll
    for (int i = 0; i < I; ++i) {
      const int tc = tag[H + i];
      float acc = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) acc = tap(tk.live(k) && tag[i + k] == tc, w[k], xw[i + k], acc);
      y[i] = tc < 0 ? 0.f : act(acc, p.silu);
    }
  } else {
    // Sequences: the packed ones, or the dense row b (with a pool or cache_indices). A step's terms before its
    // sequence's start come from the sequence's initial state (or are 0).
    int64_t sb = p.varlen ? seq_of(p, t0 < 0 ? 0 : t0) : b;
    int64_t s = p.varlen ? cu_at(p, sb) : 0, e = p.varlen ? cu_at(p, sb + 1) : L;
    Start<T> st = seq_start<T>(p, sb, d);
#pragma unroll
    for (int i = 0; i < I; ++i) {
      const int64_t t = t0 + i;
      if (p.varlen && t >= e && sb + 1 < p.batch) {
        while (t >= e && sb + 1 < p.batch) {
          ++sb;
          s = cu_at(p, sb), e = cu_at(p, sb + 1);
        }
        st = seq_start<T>(p, sb, d);
      }
      float acc = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int64_t pos = t - H + k;  // a live tap's pos - s is >= -(width-1): inside the state
        if (tk.live(k)) acc = fmaf(w[k], pos >= s ? xw[i + k] : st.at(pos - s), acc);
      }
      // Steps outside every sequence (offsets that break the contract) are written 0.
      const bool zero = t < s || t >= e || st.kind == kPad;
      y[i] = zero ? 0.f : (st.kind == kBad ? __uint_as_float(kQuietNan) : act(acc, p.silu));
    }
  }
  if (live) {
    T* orow = static_cast<T*>(p.out.p) + b * p.out.s[0] + d * p.out.s[1];
    store_run<T, I>(orow, t0, L, p.out.s[2], plan.vec, y);
  }
}

// ---------------------------------------------------------------------------------------------- plain rows
// Plain calls (ncu, H200, bf16 8x1536x2048: fwd_rows issued 557 instructions a warp for 512 steps, 70% of the issue
// slots, and each 16-byte access of a warp touched 32 half-used sectors). Here a thread owns kPlainRuns runs of
// V = 16 / sizeof(T) steps, interleaved over the lanes of its segment: run r of lane l starts at
// ws + (r * seg + l) * V (ws: the segment's first step), so a warp's 16-byte access covers seg * 16 contiguous
// bytes, and a thread's setup (its place, weights, halo) is paid once per 64 bytes. The W-1 inputs before a run:
// the previous lane's same run, for the first lane the last lane's previous run, for the first run of the first
// lane memory (load_halo: the previous segment's steps, or initial_states).
constexpr int kPlainRuns = cuda::conv1d::kPlainRowBytes / 16;

// A run of V steps from e0 as raw words: one 16-byte load when `vec` and whole, else element by element (0 past
// `lim`), packed the same way.
template <typename T, int V>
__device__ __forceinline__ Raw<T, V> ld_run_raw(const T* row, int64_t e0, int64_t lim, int64_t s, bool vec) {
  if (vec && e0 + V <= lim) return ldraw<T, V>(row + e0);
  constexpr int kPer = sizeof(T) == 4 ? 1 : 2;
  Raw<T, V> r;
#pragma unroll
  for (int i = 0; i < V / kPer; ++i) {
    float f[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) f[j] = e0 + i * kPer + j < lim ? to_f32(row[(e0 + i * kPer + j) * s]) : 0.f;
    r.w[i] = pack_word<T>(f);
  }
  return r;
}

// Where a plain-row thread's runs are: run r starts at first + r * stride.
struct PlainSpot {
  RowSpot q;
  int ls;             // lane within the segment
  int seg;            // lanes of the segment (the row's threads, at most a warp)
  int64_t ws;         // the segment's first step
  int64_t first;      // the thread's first run
  int64_t stride;     // steps between its runs
};
template <int V, int I>
__device__ __forceinline__ PlainSpot plain_spot(const Conv1d& p, const Conv1dPlan& plan) {
  PlainSpot s;
  s.q = row_spot<I>(p, plan);
  const int rt = plan.row_threads;
  s.seg = rt < 32 ? rt : 32;
  s.ls = static_cast<int>(threadIdx.x) % s.seg;
  s.ws = s.q.t0 - static_cast<int64_t>(s.ls) * I;
  s.first = s.ws + static_cast<int64_t>(s.ls) * V;
  s.stride = static_cast<int64_t>(s.seg) * V;
  return s;
}

// Each run's last H inputs, taken from the previous lane of the segment (lane 0 gets the last lane's).
template <typename T, int V, int R, int H>
__device__ __forceinline__ void prev_tails(const PlainSpot& ps, const Raw<T, V> (&raw)[R], float (&sh)[R][H]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float f[V];
    unpack<T, V>(raw[r], f);
#pragma unroll
    for (int m = 0; m < H; ++m) sh[r][m] = __shfl_sync(kFullMask, f[V - H + m], ps.ls + ps.seg - 1, ps.seg);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) fwd_plain(const Conv1d p, const Conv1dPlan plan) {
  constexpr int V = 16 / static_cast<int>(sizeof(T)), R = kPlainRuns, I = R * V, W = kMaxW, H = W - 1;
  const Taps tk = all_live();  // Conv1d::plain_fwd: width kMaxW
  const PlainSpot ps = plain_spot<V, I>(p, plan);
  const int64_t b = ps.q.b, d = ps.q.d, L = p.seqlen;
  const T* xr = static_cast<const T*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1];
  const int64_t xs = p.x.s[2];

  Raw<T, V> raw[R];
#pragma unroll
  for (int r = 0; r < R; ++r) raw[r] = ld_run_raw<T, V>(xr, ps.first + r * ps.stride, L, xs, plan.vec);
  float w[W], bias;
  load_weights(p, tk, d, w, &bias);
  const bool lead = ps.ls == 0;
  float hv[H];
  if (lead) load_halo<T, H>(p, tk, xr, ps.ws, xs, true, b, d, hv);
  float sh[R][H];
  prev_tails<T, V, R, H>(ps, raw, sh);
  T* orow = static_cast<T*>(p.out.p) + b * p.out.s[0] + d * p.out.s[1];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float xw[H + V];
    unpack<T, V>(raw[r], xw + H);
#pragma unroll
    for (int m = 0; m < H; ++m) xw[m] = !lead ? sh[r][m] : (r > 0 ? sh[r - 1][m] : hv[m]);
    float y[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float acc = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) acc = tap(tk.live(k), w[k], xw[i + k], acc);
      y[i] = act(acc, p.silu);
    }
    if (ps.q.live) store_run<T, V>(orow, ps.first + r * ps.stride, L, p.out.s[2], plan.vec, y);
  }
}

// ---------------------------------------------------------------------------------------------- channel-last
// A thread's C channels at one step as raw 32-bit words (4, 8 or 16 bytes: one access; kept packed while loads are
// in flight), and their floats. The base is aligned to the access (checked on the host: src/cuda/select.cpp).
template <typename T, int C>
struct ClRaw {
  static constexpr int kWords = C * static_cast<int>(sizeof(T)) / 4;
  static_assert(kWords == 1 || kWords == 2 || kWords == 4, "a thread's channels are 4, 8 or 16 bytes");
  uint32_t w[kWords];
};
template <typename T, int C>
__device__ __forceinline__ ClRaw<T, C> cl_ldraw(const T* p) {
  ClRaw<T, C> r;
  if constexpr (ClRaw<T, C>::kWords == 1) {
    r.w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
  } else if constexpr (ClRaw<T, C>::kWords == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    r.w[0] = v.x, r.w[1] = v.y;
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
  }
  return r;
}
template <typename T, int C>
__device__ __forceinline__ void cl_unpack(const ClRaw<T, C>& r, float* out) {
  constexpr int kPer = sizeof(T) == 4 ? 1 : 2;  // values per word
#pragma unroll
  for (int i = 0; i < ClRaw<T, C>::kWords; ++i) unpack_word<T>(r.w[i], out + i * kPer);
}
template <typename T, int C>
__device__ __forceinline__ void cl_stvec(T* p, const float* in) {
  constexpr int kWords = ClRaw<T, C>::kWords, kPer = sizeof(T) == 4 ? 1 : 2;
  uint32_t w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = pack_word<T>(in + i * kPer);
  if constexpr (kWords == 1) *reinterpret_cast<unsigned int*>(p) = w[0];
  else if constexpr (kWords == 2) *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  else *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// C channels of one step: a vector when `vec`, else element by element (channels past D read 0, are not written).
template <typename T, int C>
__device__ __forceinline__ void ld_step(const T* row, int64_t t, int64_t ts, int64_t cs, int nc, bool vec, float* v) {
  if (vec) {
    cl_unpack<T, C>(cl_ldraw<T, C>(row + t * ts), v);
    return;
  }
#pragma unroll
  for (int c = 0; c < C; ++c) v[c] = c < nc ? to_f32(row[t * ts + c * cs]) : 0.f;
}
template <typename T, int C>
__device__ __forceinline__ void st_step(T* row, int64_t t, int64_t ts, int64_t cs, int nc, bool vec, const float* v) {
  if (vec) {
    cl_stvec<T, C>(row + t * ts, v);
    return;
  }
#pragma unroll
  for (int c = 0; c < C; ++c)
    if (c < nc) row[t * ts + c * cs] = from_f32<T>(v[c]);
}

// The channel-last kernels' block: plan.row_threads lanes along channels (a power of two <= kClLanes), each C
// consecutive channels, by kThreads / lanes time groups, each walking plan.chunk steps. At most kClCh channels.
constexpr int kClCh = cuda::conv1d::kClLanes * cuda::conv1d::kItems;
template <int C>
constexpr int log2_items() {
  static_assert(C == 2 || C == 4 || C == 8, "a channel-last thread owns 2, 4 or 8 channels");
  return C == 2 ? 1 : (C == 4 ? 2 : 3);
}

// Where a channel-last thread works: row r, channels d0 .. d0 + nc - 1 (its block's from dblk), steps [tb, te).
// The block index splits in 32 bits: the grid has fewer than 2^31 blocks, so its tiles and channel tiles fit too.
struct ClSpot {
  int64_t r, dblk, d0, tb, te;
  int tile, lane, nc;
  bool live;
};
template <int C>
__device__ __forceinline__ ClSpot cl_spot(const Conv1d& p, const Conv1dPlan& plan) {
  ClSpot q;
  constexpr int kLogC = log2_items<C>();
  const int lb = __ffs(plan.row_threads) - 1;  // log2 of the lanes
  const int tid = static_cast<int>(threadIdx.x);
  q.lane = tid & (plan.row_threads - 1);
  const int grp = tid >> lb;
  const uint32_t ctiles = static_cast<uint32_t>((p.dim + (int64_t{1} << (lb + kLogC)) - 1) >> (lb + kLogC));
  const uint32_t tiles = static_cast<uint32_t>(plan.tiles), blk = blockIdx.x;
  const uint32_t rc = blk / tiles, r = rc / ctiles;
  q.tile = static_cast<int>(blk - rc * tiles);
  q.r = r;
  q.dblk = static_cast<int64_t>(rc - r * ctiles) << (lb + kLogC);
  q.d0 = q.dblk + (q.lane << kLogC);
  static_assert(kThreads == 128, "a tile is 128 >> lb time groups");
  q.tb = ((static_cast<int64_t>(q.tile) << (7 - lb)) + grp) * plan.chunk;
  q.te = q.tb + plan.chunk < p.seqlen ? q.tb + plan.chunk : p.seqlen;
  q.live = q.d0 < p.dim && q.tb < p.seqlen;
  q.nc = q.live ? static_cast<int>(p.dim - q.d0 < C ? p.dim - q.d0 : C) : 0;
  return q;
}

// The block's weights and bias through shared memory, once per block instead of once per thread: consecutive
// threads load consecutive elements of weight[d, k] (coalesced for a contiguous weight; each thread loading its own
// channels' touched a sector per lane and load), right-aligned as load_weights: sw[k0 + k][j] = weight[dblk + j, k],
// sw[k][j] = 0 for the dead taps k < k0, sw[kMaxW][j] = bias[dblk + j] (0 past D or without bias). Every thread of
// the block calls it; the caller's barrier follows.
__device__ __forceinline__ void cl_stage_weights(const Conv1d& p, Taps tk, const ClSpot& q, int nch,
                                                 float (*sw)[kClCh]) {
  constexpr int kPer = (kClCh * kMaxW + kThreads - 1) / kThreads;
  const int tid = static_cast<int>(threadIdx.x), wd = static_cast<int>(p.width);
  // e / wd as a multiply-high by ceil(2^32 / wd), exact for e * wd < 2^32 (e < kClCh * kMaxW): one instruction
  // instead of a division by a run-time value for each element.
  static_assert(kMaxW == 4 && kClCh * kMaxW * kMaxW < (1 << 30), "the multiply-high quotient is exact");
  const unsigned inv = wd == 2 ? 0x80000000u : (wd == 3 ? 0x55555556u : 0x40000000u);
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid + i * kThreads, j = static_cast<int>(__umulhi(static_cast<unsigned>(e), inv)), k = e - j * wd;
    v[i] = e < nch * wd && q.dblk + j < p.dim
               ? ld_dtype(p.wtype, p.weight.p, (q.dblk + j) * p.weight.s[0] + k * p.weight.s[1])
               : 0.f;
  }
  static_assert(kClCh <= kThreads, "a thread stages at most one bias");
  const float bv = tid < nch && q.dblk + tid < p.dim && p.bias.p != nullptr
                       ? ld_dtype(p.wtype, p.bias.p, (q.dblk + tid) * p.bias.s[0])
                       : 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid + i * kThreads, j = static_cast<int>(__umulhi(static_cast<unsigned>(e), inv)), k = e - j * wd;
    if (e < nch * wd) sw[tk.k0 + k][j] = v[i];
  }
  if (tid < nch) {
    sw[kMaxW][tid] = bv;
#pragma unroll
    for (int k = 0; k < kMaxW - 2; ++k)  // the last two taps are live at every width
      if (!tk.live(k)) sw[k][tid] = 0.f;
  }
}

// A thread's C channels' weights and bias from the staged copy (after the barrier).
template <int W, int C>
__device__ __forceinline__ void cl_read_weights(const float (*sw)[kClCh], int lane, float (&w)[W][C],
                                                float (&bias)[C]) {
  static_assert(C == 2 || C == 4, "read as float2s or float4s");
#pragma unroll
  for (int k = 0; k <= W; ++k) {
    float* dst = k < W ? w[k] : bias;
    if constexpr (C == 4) {
      const float4 v = *reinterpret_cast<const float4*>(&sw[k][lane * C]);
      dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(&sw[k][lane * C]);
      dst[0] = v.x, dst[1] = v.y;
    }
  }
}

// The H inputs before step q.tb; before step 0 from `s0` (an empty Start: 0); a dead tap's input 0, not read (as
// load_halo).
template <typename T, int W, int C>
__device__ __forceinline__ void cl_history(const ClSpot& q, Taps tk, const T* xr, int64_t xts, int64_t xcs, bool vec,
                                           const Start<T>& s0, float (&h)[W - 1][C]) {
  constexpr int H = W - 1;
#pragma unroll
  for (int m = 0; m < H; ++m) {
    const int64_t pos = q.tb - H + m;
    if (!tk.live(m)) {
#pragma unroll
      for (int c = 0; c < C; ++c) h[m][c] = 0.f;
    } else if (pos >= 0) {
      ld_step<T, C>(xr, pos, xts, xcs, q.nc, vec, h[m]);
    } else {
#pragma unroll
      for (int c = 0; c < C; ++c) h[m][c] = c < q.nc ? s0.at(pos, c) : 0.f;
    }
  }
}

// A plain call's H inputs before step q.tb (initial_states, or 0, before step 0).
template <typename T, int W, int C>
__device__ __forceinline__ void cl_halo(const Conv1d& p, Taps tk, const ClSpot& q, const T* xr, int64_t xts,
                                        int64_t xcs, bool vec, float (&h)[W - 1][C]) {
  Start<T> s0;
  if (q.tb < W - 1) s0 = seq_start<T>(p, q.r, q.d0);
  cl_history<T, W, C>(q, tk, xr, xts, xcs, vec, s0, h);
}

// A plain call's element-IO walk over steps [q.tb, q.te), one step at a time (any strides).
template <typename T, int W, int C>
__device__ __forceinline__ void cl_fwd_walk(const Conv1d& p, const ClSpot& q, const T* xr, T* orow, int64_t xts,
                                            int64_t xcs, int64_t ots, int64_t ocs, const float (&w)[W][C],
                                            const float (&bias)[C], float (&h)[W - 1][C]) {
  constexpr int H = W - 1;
  for (int64_t t = q.tb; t < q.te; ++t) {
    float v[C], o[C];
    ld_step<T, C>(xr, t, xts, xcs, q.nc, false, v);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float acc = fmaf(w[H][c], v[c], bias[c]);
#pragma unroll
      for (int k = 0; k < H; ++k) acc = fmaf(w[k][c], h[k][c], acc);
      o[c] = act(acc, p.silu);
    }
    st_step<T, C>(orow, t, ots, ocs, q.nc, false, o);
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int k = 0; k + 1 < H; ++k) h[k][c] = h[k + 1][c];
      h[H - 1][c] = v[c];
    }
  }
}

// The vector walk, software-pipelined: the next U steps' loads are issued before the current U steps are computed
// and stored, so a thread always has a group in flight instead of alternating between waiting and computing (run
// 41: the unpipelined walk reached 50% of the floor on 8x1536x2048). `cur` holds the first group, issued by the
// caller before the weights' barrier.
template <typename T, int W, int C, int U>
__device__ __forceinline__ void cl_fwd_walk_vec(const Conv1d& p, const ClSpot& q, const T* xr, T* orow, int64_t xts,
                                                int64_t ots, const float (&w)[W][C], const float (&bias)[C],
                                                float (&h)[W - 1][C], ClRaw<T, C> (&cur)[U]) {
  constexpr int H = W - 1;
  ClRaw<T, C> nxt[U];
  // Pointers step by a stride (px: the next group's first step, po: the next output) instead of holding each
  // step's offset; steps counted in 32 bits (a walk is at most plan.chunk steps).
  const T* px = xr + (q.tb + U) * xts;
  T* po = orow + q.tb * ots;
  const int n = static_cast<int>(q.te - q.tb);
  for (int i = 0; i < n; i += U, px += U * xts) {
    if (i + U < n) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + U + u < n) nxt[u] = cl_ldraw<T, C>(px + u * xts);
    }
#pragma unroll
    for (int u = 0; u < U; ++u, po += ots) {
      if (i + u >= n) break;
      float v[C], o[C];
      cl_unpack<T, C>(cur[u], v);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        float acc = fmaf(w[H][c], v[c], bias[c]);
#pragma unroll
        for (int k = 0; k < H; ++k) acc = fmaf(w[k][c], h[k][c], acc);
        o[c] = act(acc, p.silu);
      }
      cl_stvec<T, C>(po, o);
#pragma unroll
      for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int k = 0; k + 1 < H; ++k) h[k][c] = h[k + 1][c];
        h[H - 1][c] = v[c];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = nxt[u];
  }
}

// Steps a group of the forward's vector walk: 32 bytes of a thread's channels (4 steps of 16-bit, 2 of fp32).
template <typename T>
constexpr int cl_fwd_unroll() {
  return cuda::conv1d::kClFwdBytes / (cuda::conv1d::kItems * static_cast<int>(sizeof(T)));
}

// A block: kClLanes lanes of kItems channels by 4 time groups. At most 80 registers (6 blocks per SM): 72-80, W = 4
// with a few bytes of spills (ptxas -v, sm_90: 8-24 bytes, two reloads a 4-step group).
template <typename T>
__global__ void __launch_bounds__(kThreads, 6) fwd_cl(const Conv1d p, const Conv1dPlan plan) {
  constexpr int C = cuda::conv1d::kItems, W = kMaxW, H = W - 1, U = cl_fwd_unroll<T>();
  const Taps tk = taps_of(p.width);
  __shared__ __align__(16) float sw[W + 1][kClCh];
  const ClSpot q = cl_spot<C>(p, plan);
  const T* xr = static_cast<const T*>(p.x.p) + q.r * p.x.s[0] + q.d0 * p.x.s[1];
  T* orow = static_cast<T*>(p.out.p) + q.r * p.out.s[0] + q.d0 * p.out.s[1];
  const int64_t xts = p.x.s[2], xcs = p.x.s[1], ots = p.out.s[2], ocs = p.out.s[1];
  const bool vec = plan.vec;
  const bool plain = p.plain_fwd();

  // A plain call's halo and first group of loads go out before the weights' loads and barrier: the latencies
  // overlap.
  float h[H][C];  // inputs at the H steps before the current one
  ClRaw<T, C> cur[U];
  if (plain && q.live) {
    cl_halo<T, W, C>(p, all_live(), q, xr, xts, xcs, vec, h);
    if (vec) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (q.tb + u < q.te) cur[u] = cl_ldraw<T, C>(xr + (q.tb + u) * xts);
    }
  }
  cl_stage_weights(p, tk, q, plan.row_threads * C, sw);
  __syncthreads();
  if (!q.live) return;  // no barrier below
  float w[W][C], bias[C];
  cl_read_weights<W, C>(sw, q.lane, w, bias);

  if (plain) {
    // Conv1d::plain_fwd: width kMaxW, every tap live
    if (vec) cl_fwd_walk_vec<T, W, C, U>(p, q, xr, orow, xts, ots, w, bias, h, cur);
    else cl_fwd_walk<T, W, C>(p, q, xr, orow, xts, xcs, ots, ocs, w, bias, h);
    return;
  }

  // seq_idx, packed sequences, pools: one step at a time, each term checked against the step's sequence (terms
  // before step 0 are never used: their tags match no step, or they precede the sequence's start).
  cl_history<T, W, C>(q, tk, xr, xts, xcs, vec, Start<T>{}, h);
  int th[H];  // seq_idx of the H previous steps
#pragma unroll
  for (int m = 0; m < H; ++m) th[m] = (p.seq_idx.p != nullptr) ? seq_tag(p, q.r, q.tb - H + m) : 0;
  int64_t sb = p.varlen ? seq_of(p, q.tb) : q.r;
  int64_t s = p.varlen ? cu_at(p, sb) : 0, e = p.varlen ? cu_at(p, sb + 1) : p.seqlen;
  Start<T> st;
  if (!(p.seq_idx.p != nullptr)) st = seq_start<T>(p, sb, q.d0);
  for (int64_t t = q.tb; t < q.te; ++t) {
    float v[C], o[C];
    ld_step<T, C>(xr, t, xts, xcs, q.nc, vec, v);
    if (p.seq_idx.p != nullptr) {
      const int tc = seq_tag(p, q.r, t);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        float acc = fmaf(w[H][c], v[c], bias[c]);
#pragma unroll
        for (int k = 0; k < H; ++k) acc = tap(tk.live(k) && th[k] == tc, w[k][c], h[k][c], acc);
        o[c] = tc < 0 ? 0.f : act(acc, p.silu);
      }
#pragma unroll
      for (int k = 0; k + 1 < H; ++k) th[k] = th[k + 1];
      th[H - 1] = tc;
    } else {
      if (p.varlen && t >= e && sb + 1 < p.batch) {
        while (t >= e && sb + 1 < p.batch) {
          ++sb;
          s = cu_at(p, sb), e = cu_at(p, sb + 1);
        }
        st = seq_start<T>(p, sb, q.d0);
      }
      const bool zero = t < s || t >= e || st.kind == kPad;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        float acc = fmaf(w[H][c], v[c], bias[c]);
#pragma unroll
        for (int k = 0; k < H; ++k) {
          const int64_t pos = t - H + k;  // a live tap's pos - s is >= -(width-1): inside the state
          if (tk.live(k)) acc = fmaf(w[k][c], pos >= s ? h[k][c] : (c < q.nc ? st.at(pos - s, c) : 0.f), acc);
        }
        o[c] = zero ? 0.f : (st.kind == kBad ? __uint_as_float(kQuietNan) : act(acc, p.silu));
      }
    }
    st_step<T, C>(orow, t, ots, ocs, q.nc, vec, o);
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int k = 0; k + 1 < H; ++k) h[k][c] = h[k + 1][c];
      h[H - 1][c] = v[c];
    }
  }
}

// ---------------------------------------------------------------------------------------------- states
// One thread per (sequence, channel), after the main kernel: final_states[b, d, j] = xe(len - (W-1) + j) (0 for a
// padding sequence), and a pool slot's column j becomes xe(len - state_len + j) (older columns shift left; zeros
// where the sequence started from zero). In place in increasing j: column j reads column len + j > j, not yet
// written.
template <typename T>
__global__ void __launch_bounds__(kThreads) fwd_states(const Conv1d p) {
  const int64_t H = p.width - 1;
  const int64_t n = p.batch * p.dim;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t b = idx / p.dim, d = idx - b * p.dim;
    int64_t s = 0, e = p.seqlen;
    if (p.varlen) {
      s = cu_at(p, b), e = cu_at(p, b + 1);
      if (e < s) e = s;
    }
    const int64_t len = e - s;
    const int64_t row = p.varlen ? 0 : b;
    const T* xr = static_cast<const T*>(p.x.p) + row * p.x.s[0] + d * p.x.s[1] + s * p.x.s[2];
    const int64_t xs = p.x.s[2];
    const Start<T> st = seq_start<T>(p, b, d);
    if (p.fin.p != nullptr) {  // a padding sequence's row is 0
      T* f = static_cast<T*>(p.fin.p) + b * p.fin.s[0] + d * p.fin.s[1];
      for (int64_t j = 0; j < H; ++j) {
        const int64_t t = len - H + j;
        f[j * p.fin.s[2]] = from_f32<T>(st.kind != kRun ? 0.f : (t >= 0 ? ldt(xr, t * xs) : st.at(t)));
      }
    }
    // An empty sequence reads and writes no slot.
    if (p.conv_states.p != nullptr && st.kind == kRun && len > 0) {
      const int64_t slot =
          (p.cache_indices.p != nullptr) ? ld_index(p.cache_indices.p, p.idx_i64, b * p.cache_indices.s[0]) : b;
      T* cs = static_cast<T*>(p.conv_states.p) + slot * p.conv_states.s[0] + d * p.conv_states.s[1];
      const int64_t sj = p.conv_states.s[2], SL = p.state_len;
      for (int64_t j = 0; j < SL; ++j) {
        const int64_t t = len - SL + j;
        const float v = t >= 0 ? ldt(xr, t * xs) : (st.st != nullptr ? ldt(cs, (SL + t) * sj) : 0.f);
        cs[j * sj] = from_f32<T>(v);
      }
    }
  }
}

}  // namespace selscan::kern::conv1d
