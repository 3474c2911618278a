// The conv1d backward. With g(t) = dout(t) * act'(y(t)) (y recomputed), per sequence:
//   dx(t)        = sum_k w[k] g(t + W-1 - k) over steps of t's sequence, + dfinal_states[j] where t = len-(W-1)+j
//   dweight[d,k] = sum_t g(t) xe(t - (W-1) + k),  dbias[d] = sum_t g(t)
//   dinitial[j]  = sum_{k <= j, j-k < len} w[k] g(j-k) + dfinal_states[j - len] (j >= len)
// Kernels:
//   bwd_rows / bwd_cl   the forward's two mappings. A thread's run needs g W-1 steps past its end: the next lane's
//                       (shuffle; rows) or computed by the walk itself, which runs W-1 steps past its chunk (cl).
//                       Each block leaves one partial of dweight/dbias per channel in the workspace ([part][W+1][D]
//                       floats), summed within the block in a fixed order (shuffle trees, then shared memory).
//   bwd_finalize        (launch.cu) sums the partials of each channel in a fixed order and writes dweight/dbias in
//                       their dtype:
//                       every call is bitwise reproducible, so `deterministic` costs nothing (no atomics, no memset).
//                       A call of one part per channel (one row, one time tile) skips it: the main kernel writes
//                       dweight/dbias (plan.direct).
//   bwd_dinit           dinitial_states, one thread per (sequence, channel), recomputing g at the first W-1 steps.
#pragma once

#include "common.cuh"
#include "fwd.cuh"

namespace selscan::kern::conv1d {

// g at step P of row (b, d) computed from memory: the last lane of a shuffle group needs it for the W-1 steps past
// its run. seq_idx, packed and dense calls (`tag` returns the step's seq_idx or sequence: a dense call's row).
template <typename T>
__device__ float g_at(const Conv1d& p, Taps tk, int64_t b, int64_t d, int64_t P, const float* w, float bias,
                      int* tag) {
  constexpr int W = kMaxW, H = W - 1;
  *tag = INT_MIN;
  if (P >= p.seqlen) return 0.f;
  const T* xr = static_cast<const T*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1];
  const T* dr = static_cast<const T*>(p.dout.p) + b * p.dout.s[0] + d * p.dout.s[1];
  const int64_t xs = p.x.s[2];
  float acc = bias;
  if (p.seq_idx.p != nullptr) {
    const int tc = seq_tag(p, b, P);
    *tag = tc;
    if (tc < 0) return 0.f;
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (tk.live(k) && seq_tag(p, b, P - H + k) == tc) acc = fmaf(w[k], ldt(xr, (P - H + k) * xs), acc);
  } else {
    const int64_t sb = p.varlen ? seq_of(p, P) : b;
    const int64_t s = p.varlen ? cu_at(p, sb) : 0, e = p.varlen ? cu_at(p, sb + 1) : p.seqlen;
    *tag = static_cast<int>(sb);
    if (P < s || P >= e) return 0.f;
    const Start<T> st = seq_start<T>(p, sb, d);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const int64_t pos = P - H + k;
      if (tk.live(k)) acc = fmaf(w[k], pos >= s ? ldt(xr, pos * xs) : st.at(pos - s), acc);
    }
  }
  return ldt(dr, P * p.dout.s[2]) * dact(acc, p.silu);
}

// dfinal_states' share of dx at step t of a sequence [s, e) that is row/sequence `b`'s.
template <typename T>
__device__ __forceinline__ float dfin_at(const Conv1d& p, int64_t b, int64_t d, int64_t t, int64_t e) {
  const int64_t j = t - (e - (p.width - 1));
  if (j < 0) return 0.f;
  return ldt(static_cast<const T*>(p.dfin.p), b * p.dfin.s[0] + d * p.dfin.s[1] + j * p.dfin.s[2]);
}

// A block's sums for channel d (v: the padded taps' sums, then dbias's; the live taps' are dweight's width): its part
// of the workspace ([part][width + 1][D] floats), or, when the call has one part per channel (plan.direct), dweight
// and dbias themselves in their dtype.
__device__ __forceinline__ void put_part(const Conv1d& p, Taps tk, const Conv1dPlan& plan, float* ws, int64_t part,
                                         int64_t d, const float* v) {
  constexpr int W = kMaxW;
  if (plan.direct) {
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (tk.live(k)) st_dtype(p.dwtype, p.dweight.p, d * p.dweight.s[0] + (k - tk.k0) * p.dweight.s[1], v[k]);
    if (p.dbias.p != nullptr) st_dtype(p.dwtype, p.dbias.p, d * p.dbias.s[0], v[W]);
    return;
  }
  float* wp = ws + part * (p.width + 1) * p.dim + d;
#pragma unroll
  for (int k = 0; k < W; ++k)
    if (tk.live(k)) wp[(k - tk.k0) * p.dim] = v[k];
  wp[p.width * p.dim] = v[W];
}

// A row kernel's partial sums of dweight/dbias for its row tile: a shuffle tree over the row's lanes, then (rows
// over a warp) its warps in order; every thread of the block calls it (a barrier when rows span warps).
template <int W>
__device__ __forceinline__ void row_part(const Conv1d& p, Taps tk, const Conv1dPlan& plan, float* ws, const RowSpot& q,
                                         float (&acc)[W + 1]) {
  const int rt = plan.row_threads, seg = rt < 32 ? rt : 32, tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int off = seg / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k <= W; ++k) acc[k] += __shfl_xor_sync(kFullMask, acc[k], off, seg);
  }
  if (rt <= 32) {
    if (q.live && tid % rt == 0) put_part(p, tk, plan, ws, q.b * plan.tiles + q.tile, q.d, acc);
    return;
  }
  __shared__ float red[kThreads / 32][W + 1];
  if ((tid & 31) == 0) {
#pragma unroll
    for (int k = 0; k <= W; ++k) red[tid >> 5][k] = acc[k];
  }
  __syncthreads();
  if (q.live && tid % rt == 0) {
    const int w0 = tid >> 5, nw = rt >> 5;
#pragma unroll
    for (int k = 0; k <= W; ++k) {
      // A fixed trip count (nw <= kThreads / 32): the compiler's unrolling of a loop to a run-time nw was ~480
      // instructions of code for a sum of at most 4 values.
      float v = red[w0][k];
#pragma unroll
      for (int j = 1; j < kThreads / 32; ++j)
        if (j < nw) v += red[w0 + j][k];
      acc[k] = v;
    }
    put_part(p, tk, plan, ws, q.b * plan.tiles + q.tile, q.d, acc);
  }
}

// ---------------------------------------------------------------------------------------------- rows
// The backward's calls without per-step sequence logic at width kMaxW (Conv1d::plain_bwd: no packed sequences, no
// seq_idx) take bwd_plain (fwd.cuh says why); bwd_rows serves the others, dense rows of narrower widths among them.

template <typename T>
__global__ void __launch_bounds__(kThreads) bwd_rows(const Conv1d p, const Conv1dPlan plan, float* ws) {
  constexpr int I = cuda::conv1d::kRowBytes / static_cast<int>(sizeof(T)), W = kMaxW, H = W - 1;
  const Taps tk = taps_of(p.width);
  const int rt = plan.row_threads;
  const int seg = rt < 32 ? rt : 32;
  const int tid = static_cast<int>(threadIdx.x);
  const RowSpot q = row_spot<I>(p, plan);
  const bool live = q.live;
  const int64_t b = q.b, d = q.d, t0 = q.t0;
  const int64_t L = p.seqlen;
  const T* xr = static_cast<const T*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1];
  const T* dr = static_cast<const T*>(p.dout.p) + b * p.dout.s[0] + d * p.dout.s[1];
  const int64_t xs = p.x.s[2];

  float w[W], bias;
  load_weights(p, tk, d, w, &bias);
  float xw[H + I], g[I + H];  // inputs at t0 - H .. t0 + I - 1; g at t0 .. t0 + I + H - 1
  load_run<T, I>(xr, t0, L, xs, plan.vec, xw + H);
  load_run<T, I>(dr, t0, L, p.dout.s[2], plan.vec, g);  // dout, turned into g below
  // The first lane's W-1 inputs before the run, issued with the run's own loads (load_halo says why).
  const bool first = tid % seg == 0, last = tid % seg == seg - 1;
  float hv[H];
  if (first) load_halo<T, H>(p, tk, xr, t0, xs, false, b, d, hv);
#pragma unroll
  for (int m = 0; m < H; ++m) {
    const float v = __shfl_up_sync(kFullMask, xw[I + m], 1, seg);
    xw[m] = first ? hv[m] : v;
  }

  float acc[W + 1];
#pragma unroll
  for (int k = 0; k <= W; ++k) acc[k] = 0.f;
  int tag[I + H];  // seq_idx or sequence of the steps of g (general calls)
  int64_t s = 0, e = L, sb = b;  // the sequence of the run's last step (packed calls; a dense call's row)
  if (p.seq_idx.p != nullptr) {
    int tw[H + I];
#pragma unroll
    for (int j = 0; j < H + I; ++j) tw[j] = seq_tag(p, b, t0 - H + j);
#pragma unroll
    for (int i = 0; i < I; ++i) {
      const int tc = tw[H + i];
      float v[W], y = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        v[k] = tk.live(k) && tw[i + k] == tc ? xw[i + k] : 0.f;
        y = tap(tk.live(k), w[k], v[k], y);
      }
      g[i] = tc < 0 ? 0.f : g[i] * dact(y, p.silu);
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] = fmaf(g[i], v[k], acc[k]);
      acc[W] += g[i];
      tag[i] = tc;
    }
  } else {
    if (p.varlen) {
      sb = seq_of(p, t0);
      s = cu_at(p, sb), e = cu_at(p, sb + 1);
    }
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
      float v[W], y = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int64_t pos = t - H + k;  // a live tap's pos - s is >= -(width-1): inside the state
        v[k] = !tk.live(k) ? 0.f : (pos >= s ? xw[i + k] : st.at(pos - s));
        y = tap(tk.live(k), w[k], v[k], y);
      }
      g[i] = (t < s || t >= e) ? 0.f : g[i] * dact(y, p.silu);
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] = fmaf(g[i], v[k], acc[k]);
      acc[W] += g[i];
      tag[i] = static_cast<int>(sb);
    }
  }

  // g of the W-1 steps past the run: the next lane's first ones, or (last lane of a group) from memory.
#pragma unroll
  for (int m = 0; m < H; ++m) g[I + m] = __shfl_down_sync(kFullMask, g[m], 1, seg);
#pragma unroll
  for (int m = 0; m < H; ++m) tag[I + m] = __shfl_down_sync(kFullMask, tag[m], 1, seg);
  if (last) {  // the live taps read g up to width-2 steps past the run (m + k0 <= H - 1)
#pragma unroll
    for (int m = 0; m < H; ++m)
      if (tk.live(H - 1 - m)) g[I + m] = g_at<T>(p, tk, b, d, t0 + I + m, w, bias, &tag[I + m]);
  }

  float dx[I];
#pragma unroll
  for (int i = 0; i < I; ++i) {
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < W; ++k) a = tap(tk.live(k) && tag[i + H - k] == tag[i], w[k], g[i + H - k], a);
    dx[i] = a;
  }
  if (p.dfin.p != nullptr) {  // packed or dense (seq_idx excludes final states)
#pragma unroll
    for (int i = 0; i < I; ++i) {
      const int64_t t = t0 + i;
      if (t >= L) break;
      const int64_t tb = tag[i];
      const int64_t te = tb == sb ? e : cu_at(p, tb + 1);
      const int64_t ts = tb == sb ? s : cu_at(p, tb);
      if (t >= ts && t < te) dx[i] += dfin_at<T>(p, tb, d, t, te);
    }
  }
  if (live) {
    T* xrow = static_cast<T*>(p.dx.p) + b * p.dx.s[0] + d * p.dx.s[1];
    store_run<T, I>(xrow, t0, L, p.dx.s[2], plan.vec, dx);
  }

  row_part<W>(p, tk, plan, ws, q, acc);
}

// ---------------------------------------------------------------------------------------------- plain rows
// Plain calls: fwd_plain's layout (kPlainRuns runs of V steps a thread, interleaved over the segment's lanes). A run
// needs the W-1 inputs before it (as the forward) and g of the W-1 steps past it: the next lane's same run, for the
// last lane the first lane's next run, for the last run of the last lane computed here from memory (the segment's
// next W-1 inputs and douts). Two passes: g of every run, then dx.
template <typename T>
__global__ void __launch_bounds__(kThreads, 5) bwd_plain(const Conv1d p, const Conv1dPlan plan, float* ws) {
  constexpr int V = 16 / static_cast<int>(sizeof(T)), R = kPlainRuns, I = R * V, W = kMaxW, H = W - 1;
  const Taps tk = all_live();  // Conv1d::plain_bwd: width kMaxW
  const PlainSpot ps = plain_spot<V, I>(p, plan);
  const int64_t b = ps.q.b, d = ps.q.d, L = p.seqlen;
  const T* xr = static_cast<const T*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1];
  const T* dr = static_cast<const T*>(p.dout.p) + b * p.dout.s[0] + d * p.dout.s[1];
  const int64_t xs = p.x.s[2], ds = p.dout.s[2];

  Raw<T, V> xraw[R], draw[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    xraw[r] = ld_run_raw<T, V>(xr, ps.first + r * ps.stride, L, xs, plan.vec);
    draw[r] = ld_run_raw<T, V>(dr, ps.first + r * ps.stride, L, ds, plan.vec);
  }
  float w[W], bias;
  load_weights(p, tk, d, w, &bias);
  const bool lead = ps.ls == 0, tail = ps.ls == ps.seg - 1;
  float hv[H], xa[H], da[H];
  if (lead) load_halo<T, H>(p, tk, xr, ps.ws, xs, true, b, d, hv);
  const int64_t next = ps.ws + static_cast<int64_t>(ps.seg) * I;  // the segment's end
  if (tail) {
#pragma unroll
    for (int m = 0; m < H; ++m) {
      xa[m] = next + m < L ? ldt(xr, (next + m) * xs) : 0.f;
      da[m] = next + m < L ? ldt(dr, (next + m) * ds) : 0.f;
    }
  }
  float sh[R][H];  // each run's last H inputs, from the previous lane
  prev_tails<T, V, R, H>(ps, xraw, sh);

  float acc[W + 1];
#pragma unroll
  for (int k = 0; k <= W; ++k) acc[k] = 0.f;
  float g[R][V];
  float xl[H];  // the last run's last H inputs (the tail lane's g past the segment needs them)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float xw[H + V];
    unpack<T, V>(xraw[r], xw + H);
    unpack<T, V>(draw[r], g[r]);
#pragma unroll
    for (int m = 0; m < H; ++m) xw[m] = !lead ? sh[r][m] : (r > 0 ? sh[r - 1][m] : hv[m]);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float y = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) y = tap(tk.live(k), w[k], xw[i + k], y);
      g[r][i] *= dact(y, p.silu);  // steps past L: dout read 0
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] = fmaf(g[r][i], xw[i + k], acc[k]);
      acc[W] += g[r][i];
    }
    if (r == R - 1) {
#pragma unroll
      for (int m = 0; m < H; ++m) xl[m] = xw[V + m];
    }
  }
  // g of the H steps past each run: the next lane's first ones (for the tail lane: lane 0's next run).
  float gn[R][H];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < H; ++m) gn[r][m] = __shfl_sync(kFullMask, g[r][m], ps.ls + 1, ps.seg);
  }
  float gm[H];  // past the segment (tail lane)
  if (tail) {
#pragma unroll
    for (int m = 0; m < H; ++m) {  // the inputs of step next + m: xl's last H - m, then xa's first m + 1
      float y = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) y = tap(tk.live(k), w[k], m + k < H ? xl[m + k] : xa[m + k - H], y);
      gm[m] = da[m] * dact(y, p.silu);  // past L: dout 0
    }
  }
  T* xrow = static_cast<T*>(p.dx.p) + b * p.dx.s[0] + d * p.dx.s[1];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float ge[V + H];
#pragma unroll
    for (int i = 0; i < V; ++i) ge[i] = g[r][i];
#pragma unroll
    for (int m = 0; m < H; ++m) ge[V + m] = !tail ? gn[r][m] : (r + 1 < R ? gn[r + 1][m] : gm[m]);
    const int64_t t0 = ps.first + r * ps.stride;
    float dx[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float a = 0.f;
#pragma unroll
      for (int k = 0; k < W; ++k) a = tap(tk.live(k), w[k], ge[i + H - k], a);
      dx[i] = a;
    }
    if (p.dfin.p != nullptr && t0 + V > L - H) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (t0 + i < L) dx[i] += dfin_at<T>(p, b, d, t0 + i, L);
    }
    if (ps.q.live) store_run<T, V>(xrow, t0, L, p.dx.s[2], plan.vec, dx);
  }
  row_part<W>(p, tk, plan, ws, ps.q, acc);
}

// ---------------------------------------------------------------------------------------------- channel-last
// A thread walks steps [tb, te + W-1): at step t it computes g(t) (inputs of the W-1 steps before in registers),
// and once W-1 steps are behind, dx(t - (W-1)) from g(t - (W-1) .. t) (also in registers).
// The channel-last walks' histories (inputs and g of the H steps before the current one) move one step on: the
// current step's inputs xv and g gc join them last.
template <int H, int C>
__device__ __forceinline__ void push_history(float (&xh)[H][C], float (&gh)[H][C], const float* xv, const float* gc) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int k = 0; k + 1 < H; ++k) {
      xh[k][c] = xh[k + 1][c];
      gh[k][c] = gh[k + 1][c];
    }
    xh[H - 1][c] = xv[c];
    gh[H - 1][c] = gc[c];
  }
}

// One step of a plain call's channel-last walk: g at step tt from its inputs (xv, dv) and the W-1 inputs before
// (xh); the partial sums when `sum` (steps before q.te); the dx of step tt - (W-1) when `emit` (it is complete:
// g of tt and of the W-1 steps before, gh), stored at xq (that step's channels). Then both histories shift.
template <typename T, int W, int C>
__device__ __forceinline__ void cl_bwd_step(const Conv1d& p, const ClSpot& q, int64_t tt, const float* xv,
                                            const float* dv, bool sum, bool emit, bool vec, T* xq, const T* fr,
                                            const float (&w)[W][C], const float (&bias)[C], float (&xh)[W - 1][C],
                                            float (&gh)[W - 1][C], float (&acc)[C][W + 1]) {
  constexpr int H = W - 1;
  float gc[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float y = fmaf(w[H][c], xv[c], bias[c]);
#pragma unroll
    for (int k = 0; k < H; ++k) y = fmaf(w[k][c], xh[k][c], y);
    gc[c] = dv[c] * dact(y, p.silu);  // steps past L: dout 0
  }
  if (sum) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int k = 0; k < H; ++k) acc[c][k] = fmaf(gc[c], xh[k][c], acc[c][k]);
      acc[c][H] = fmaf(gc[c], xv[c], acc[c][H]);
      acc[c][W] += gc[c];
    }
  }
  if (emit) {
    const int64_t tq = tt - H, L = p.seqlen;
    float o[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float a = w[0][c] * gc[c];
#pragma unroll
      for (int k = 1; k <= H; ++k) a = fmaf(w[k][c], gh[H - k][c], a);
      o[c] = a;
    }
    if (fr != nullptr && tq >= L - H) {
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (c < q.nc) o[c] += ldt(fr, (tq - (L - H)) * p.dfin.s[2] + c * p.dfin.s[1]);
    }
    st_step<T, C>(xq, 0, p.dx.s[2], p.dx.s[1], q.nc, vec, o);
  }
  push_history<H, C>(xh, gh, xv, gc);
}

// A plain call's element-IO walk (any strides) over steps [q.tb, q.te + W-1), in groups of W-1 steps whose loads go
// out first (one memory latency a group, not one a step).
template <typename T, int W, int C>
__device__ __forceinline__ void cl_bwd_walk(const Conv1d& p, const ClSpot& q, const T* xr, const T* dr, T* xo,
                                            const float (&w)[W][C], const float (&bias)[C], float (&xh)[W - 1][C],
                                            float (&gh)[W - 1][C], float (&acc)[C][W + 1]) {
  constexpr int H = W - 1, G = H;
  const int64_t L = p.seqlen, tend = q.te + H;
  const int64_t xts = p.x.s[2], xcs = p.x.s[1], dts = p.dout.s[2], dcs = p.dout.s[1], ots = p.dx.s[2];
  // dfinal_states' row, only where this walk reaches the last W-1 steps.
  const T* fr = p.dfin.p != nullptr && q.te > L - H
                    ? static_cast<const T*>(p.dfin.p) + q.r * p.dfin.s[0] + q.d0 * p.dfin.s[1]
                    : nullptr;
  for (int64_t t0 = q.tb; t0 < tend; t0 += G) {
    float xv[G][C], dv[G][C];
#pragma unroll
    for (int u = 0; u < G; ++u) {
      if (t0 + u < tend && t0 + u < L) {
        ld_step<T, C>(xr, t0 + u, xts, xcs, q.nc, false, xv[u]);
        ld_step<T, C>(dr, t0 + u, dts, dcs, q.nc, false, dv[u]);
      } else {
#pragma unroll
        for (int c = 0; c < C; ++c) xv[u][c] = dv[u][c] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < G; ++u) {
      const int64_t tt = t0 + u;
      if (tt < tend)
        cl_bwd_step<T, W, C>(p, q, tt, xv[u], dv[u], tt < q.te, tt - H >= q.tb, false, xo + (tt - H) * ots, fr, w,
                             bias, xh, gh, acc);
    }
  }
}

// The raw x and dout of U steps from px / pd (element stride xts / dts): the first n of them (n may be <= 0), zeros
// for the rest (steps past L, or past the walk).
template <typename T, int C, int U>
__device__ __forceinline__ void cl_bwd_load(const T* px, const T* pd, int64_t xts, int64_t dts, int n,
                                            ClRaw<T, C> (&xg)[U], ClRaw<T, C> (&dg)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u < n) {
      xg[u] = cl_ldraw<T, C>(px + u * xts);
      dg[u] = cl_ldraw<T, C>(pd + u * dts);
    } else {
#pragma unroll
      for (int i = 0; i < ClRaw<T, C>::kWords; ++i) xg[u].w[i] = dg[u].w[i] = 0u;
    }
  }
}

// A plain call's vector walk over steps [q.tb, q.te + W-1), every step in groups of U, software-pipelined from the
// first group to the last: the next group's loads go out before the current group computes, so a short walk (the
// small rows: 7-19 steps) costs about one memory latency, not one per group. Per-step conditions: the first W-1
// steps emit no dx, the last W-1 add nothing to the sums, steps past L read zeros. Steps counted from q.tb in 32
// bits (a walk is at most plan.chunk + W-1 steps). xc, dc: the first group, loaded by the caller (cl_bwd_load)
// before the weights' barrier.
template <typename T, int W, int C, int U>
__device__ __forceinline__ void cl_bwd_walk_vec(const Conv1d& p, const ClSpot& q, const T* xr, const T* dr, T* xo,
                                                const float (&w)[W][C], const float (&bias)[C],
                                                float (&xh)[W - 1][C], float (&gh)[W - 1][C],
                                                float (&acc)[C][W + 1], ClRaw<T, C> (&xc)[U],
                                                ClRaw<T, C> (&dc)[U]) {
  constexpr int H = W - 1;
  const int64_t L = p.seqlen, xts = p.x.s[2], dts = p.dout.s[2], ots = p.dx.s[2];
  const T* fr = p.dfin.p != nullptr && q.te > L - H
                    ? static_cast<const T*>(p.dfin.p) + q.r * p.dfin.s[0] + q.d0 * p.dfin.s[1]
                    : nullptr;
  const int ns = static_cast<int>(q.te - q.tb), n = ns + H;            // steps that sum; steps walked
  const int nl = static_cast<int>((q.te + H < L ? q.te + H : L) - q.tb);  // steps with inputs
  const T* px = xr + (q.tb + U) * xts;  // the next group
  const T* pd = dr + (q.tb + U) * dts;
  T* po = xo + (q.tb - H) * ots;  // the dx of the current step
  ClRaw<T, C> xn[U], dn[U];
  for (int i = 0; i < n; i += U, px += U * xts, pd += U * dts) {
    if (i + U < n) cl_bwd_load<T, C, U>(px, pd, xts, dts, nl - (i + U), xn, dn);
#pragma unroll
    for (int u = 0; u < U; ++u, po += ots) {
      if (i + u >= n) break;
      float xv[C], dv[C];
      cl_unpack<T, C>(xc[u], xv);
      cl_unpack<T, C>(dc[u], dv);
      cl_bwd_step<T, W, C>(p, q, q.tb + i + u, xv, dv, i + u < ns, i + u >= H, true, po, fr, w, bias, xh, gh, acc);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) xc[u] = xn[u], dc[u] = dn[u];
  }
}

// One value of a block's sums for channel d: dweight[d, k] (k < width) or dbias[d] (k = width) in their dtype when
// the call has one part per channel (plan.direct), else its part of the workspace ([part][width + 1][D] floats, as
// put_part).
__device__ __forceinline__ void put_one(const Conv1d& p, const Conv1dPlan& plan, float* ws, int64_t part, int64_t d,
                                        int k, float v) {
  if (plan.direct) {
    if (k < p.width) st_dtype(p.dwtype, p.dweight.p, d * p.dweight.s[0] + k * p.dweight.s[1], v);
    else if (p.dbias.p != nullptr) st_dtype(p.dwtype, p.dbias.p, d * p.dbias.s[0], v);
    return;
  }
  ws[(part * (p.width + 1) + k) * p.dim + d] = v;
}

// A block: kClBwdLanes lanes of kClBwdItems channels by 8 time groups. At most 102 registers (5 blocks per SM):
// 80-96 at every itype and width, no spills (ptxas -v, sm_90); capped at 80 (6 blocks), W = 4 spilled.
template <typename T>
__global__ void __launch_bounds__(kThreads, 5) bwd_cl(const Conv1d p, const Conv1dPlan plan, float* ws) {
  constexpr int C = cuda::conv1d::kClBwdItems, W = kMaxW, H = W - 1;
  const Taps tk = taps_of(p.width);
  __shared__ __align__(16) float sw[W + 1][kClCh];
  const ClSpot q = cl_spot<C>(p, plan);
  const int64_t L = p.seqlen;
  const bool vec = plan.vec;
  const bool plain = p.plain_bwd();
  const T* xr = static_cast<const T*>(p.x.p) + q.r * p.x.s[0] + q.d0 * p.x.s[1];
  const T* dr = static_cast<const T*>(p.dout.p) + q.r * p.dout.s[0] + q.d0 * p.dout.s[1];
  T* xo = static_cast<T*>(p.dx.p) + q.r * p.dx.s[0] + q.d0 * p.dx.s[1];
  const int64_t xts = p.x.s[2], xcs = p.x.s[1], dts = p.dout.s[2], dcs = p.dout.s[1];
  const int64_t ots = p.dx.s[2], ocs = p.dx.s[1];

  // A plain call's halo and first group of loads go out before the weights' loads and barrier: the latencies
  // overlap.
  constexpr int U = cuda::conv1d::kClBwdBytes / (C * static_cast<int>(sizeof(T)));
  float xh[H][C], gh[H][C];  // inputs and g of the H steps before the current one
  ClRaw<T, C> xc[U], dc[U];
  if (plain && q.live) {
    cl_halo<T, W, C>(p, all_live(), q, xr, xts, xcs, vec, xh);
    if (vec) {
      const int64_t nl = (q.te + H < L ? q.te + H : L) - q.tb;
      cl_bwd_load<T, C, U>(xr + q.tb * xts, dr + q.tb * dts, xts, dts, static_cast<int>(nl < U ? nl : U), xc, dc);
    }
  }
  cl_stage_weights(p, tk, q, plan.row_threads * C, sw);
  __syncthreads();
  float acc[C][W + 1];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k <= W; ++k) acc[c][k] = 0.f;

  if (q.live) {
    const int64_t tend = q.te + H;  // steps walked
    float w[W][C], bias[C];
    cl_read_weights<W, C>(sw, q.lane, w, bias);
#pragma unroll
    for (int m = 0; m < H; ++m)
#pragma unroll
      for (int c = 0; c < C; ++c) gh[m][c] = 0.f;

    if (plain) {
      // Conv1d::plain_bwd: width kMaxW, every tap live
      if (vec) cl_bwd_walk_vec<T, W, C, U>(p, q, xr, dr, xo, w, bias, xh, gh, acc, xc, dc);
      else cl_bwd_walk<T, W, C>(p, q, xr, dr, xo, w, bias, xh, gh, acc);
    } else {
      // seq_idx, packed sequences, dense rows of narrower widths: one step at a time; tags are seq_idx values or
      // sequence numbers (a dense call's row).
      int th[H];  // tags of the H steps before the current one
      const bool si = (p.seq_idx.p != nullptr), pk = p.varlen;
      int64_t sb = si || !pk ? q.r : seq_of(p, q.tb);
      int64_t s = si || !pk ? 0 : cu_at(p, sb), e = si || !pk ? L : cu_at(p, sb + 1);
      Start<T> st;
      if (!si) st = seq_start<T>(p, sb, q.d0);
      cl_history<T, W, C>(q, tk, xr, xts, xcs, vec, Start<T>{}, xh);
#pragma unroll
      for (int m = 0; m < H; ++m) {
        const int64_t pos = q.tb - H + m;
        th[m] = si ? seq_tag(p, q.r, pos) : (pos >= 0 ? static_cast<int>(pk ? seq_of(p, pos) : q.r) : INT_MIN);
      }
      for (int64_t tt = q.tb; tt < tend; ++tt) {
        float xv[C], dv[C], gc[C], v[W][C];
        int tc = INT_MIN;
        bool in = false;
        if (tt < L) {
          ld_step<T, C>(xr, tt, xts, xcs, q.nc, vec, xv);
          ld_step<T, C>(dr, tt, dts, dcs, q.nc, vec, dv);
          if (si) {
            tc = seq_tag(p, q.r, tt);
            in = tc >= 0;
          } else {
            if (pk && tt >= e && sb + 1 < p.batch) {
              while (tt >= e && sb + 1 < p.batch) {
                ++sb;
                s = cu_at(p, sb), e = cu_at(p, sb + 1);
              }
              st = seq_start<T>(p, sb, q.d0);
            }
            tc = static_cast<int>(sb);
            in = tt >= s && tt < e;
          }
        } else {
#pragma unroll
          for (int c = 0; c < C; ++c) xv[c] = dv[c] = 0.f;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
          float y = bias[c];
#pragma unroll
          for (int k = 0; k < H; ++k) {
            const int64_t pos = tt - H + k;  // a live tap's pos - s is >= -(width-1): inside the state
            if (!tk.live(k)) v[k][c] = 0.f;
            else if (si) v[k][c] = th[k] == tc ? xh[k][c] : 0.f;
            else v[k][c] = pos >= s ? xh[k][c] : (c < q.nc ? st.at(pos - s, c) : 0.f);
            y = tap(tk.live(k), w[k][c], v[k][c], y);
          }
          v[H][c] = xv[c];
          y = fmaf(w[H][c], xv[c], y);
          gc[c] = in ? dv[c] * dact(y, p.silu) : 0.f;
        }
        if (tt < q.te) {
#pragma unroll
          for (int c = 0; c < C; ++c) {
#pragma unroll
            for (int k = 0; k < W; ++k) acc[c][k] = fmaf(gc[c], v[k][c], acc[c][k]);
            acc[c][W] += gc[c];
          }
        }
        const int64_t tq = tt - H;
        if (tq >= q.tb) {
          const int tg = th[0];  // the tag of step tq
          float o[C];
#pragma unroll
          for (int c = 0; c < C; ++c) {
            float a = tk.live(0) && tc == tg ? w[0][c] * gc[c] : 0.f;
#pragma unroll
            for (int k = 1; k <= H; ++k) a = tap(tk.live(k) && th[H - k] == tg, w[k][c], gh[H - k][c], a);
            o[c] = a;
          }
          if (p.dfin.p != nullptr && !si && tg >= 0) {
            const int64_t qs = pk ? cu_at(p, tg) : 0, qe = pk ? cu_at(p, tg + 1) : L;
            if (tq >= qs && tq < qe && tq >= qe - H) {
#pragma unroll
              for (int c = 0; c < C; ++c)
                if (c < q.nc) o[c] += dfin_at<T>(p, tg, q.d0 + c, tq, qe);
            }
          }
          st_step<T, C>(xo, tq, ots, ocs, q.nc, vec, o);
        }
#pragma unroll
        for (int k = 0; k + 1 < H; ++k) th[k] = th[k + 1];
        th[H - 1] = tc;
        push_history<H, C>(xh, gh, xv, gc);
      }
    }
  }

  // The block's partial per channel: its time groups summed in order (group 0 first), one value a thread (the
  // workspace's writes coalesced). Rows of C (W + 1) + 1 floats: an odd stride, no bank conflicts.
  constexpr int S = C * (W + 1) + 1;
  __shared__ float red[kThreads][S];
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int k = 0; k <= W; ++k) red[tid][c * (W + 1) + k] = acc[c][k];
  __syncthreads();
  const int lanes = plan.row_threads, nch = lanes * C, wd = static_cast<int>(p.width);
  const int64_t part = q.r * plan.tiles + q.tile;
  for (int o = tid; o < nch * (wd + 1); o += kThreads) {
    // k: dweight's column (or dbias at k = width); kp: its padded tap in acc
    const int k = o / nch, j = o - k * nch, lane = j / C, c = j - lane * C, kp = k == wd ? W : k + tk.k0;
    const int64_t d = q.dblk + j;
    if (d >= p.dim) continue;
    float v = red[lane][c * (W + 1) + kp];
    for (int g = lanes + lane; g < kThreads; g += lanes) v += red[g][c * (W + 1) + kp];
    put_one(p, plan, ws, part, d, k, v);
  }
}

// ---------------------------------------------------------------------------------------------- finalize
// bwd_finalize reads no itype tensor: its one instance is in launch.cu (finalize_dweight).
Status finalize_dweight(const Conv1d& p, int64_t parts, const float* ws, cudaStream_t s);

// ---------------------------------------------------------------------------------------------- dinitial
template <typename T>
__global__ void __launch_bounds__(kThreads) bwd_dinit(const Conv1d p) {
  constexpr int kMaxH = 3;
  const int H = static_cast<int>(p.width) - 1;
  const int64_t n = p.batch * p.dim;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t b = idx / p.dim, d = idx - b * p.dim;
    int64_t s = 0, e = p.seqlen;
    if (p.varlen) {
      s = cu_at(p, b), e = cu_at(p, b + 1);
      if (e < s) e = s;
    }
    const int64_t len = e - s, row = p.varlen ? 0 : b;
    const T* xr = static_cast<const T*>(p.x.p) + row * p.x.s[0] + d * p.x.s[1] + s * p.x.s[2];
    const T* dr = static_cast<const T*>(p.dout.p) + row * p.dout.s[0] + d * p.dout.s[1] + s * p.dout.s[2];
    T* di = static_cast<T*>(p.dinit.p) + b * p.dinit.s[0] + d * p.dinit.s[1];
    const Start<T> st = seq_start<T>(p, b, d);
    if (st.st == nullptr) {  // the sequence started from zero: its initial state was not read
      for (int j = 0; j < H; ++j) di[j * p.dinit.s[2]] = from_f32<T>(0.f);
      continue;
    }
    float w[kMaxH + 1], bias = (p.bias.p != nullptr) ? ld_dtype(p.wtype, p.bias.p, d * p.bias.s[0]) : 0.f;
    for (int k = 0; k <= H; ++k) w[k] = ld_dtype(p.wtype, p.weight.p, d * p.weight.s[0] + k * p.weight.s[1]);
    float g[kMaxH] = {0.f, 0.f, 0.f};
    for (int t = 0; t < H && t < len; ++t) {
      float y = bias;
      for (int k = 0; k <= H; ++k) {
        const int64_t pos = t - H + k;
        y = fmaf(w[k], pos >= 0 ? ldt(xr, pos * p.x.s[2]) : st.at(pos), y);
      }
      g[t] = ldt(dr, t * p.dout.s[2]) * dact(y, p.silu);
    }
    for (int j = 0; j < H; ++j) {
      float v = 0.f;
      for (int k = 0; k <= j; ++k)
        if (j - k < len) v = fmaf(w[k], g[j - k], v);
      if (p.dfin.p != nullptr && j >= len) v += dfin_at<T>(p, b, d, j - len, H);  // dfinal_states[j - len]
      di[j * p.dinit.s[2]] = from_f32<T>(v);
    }
  }
}

}  // namespace selscan::kern::conv1d
