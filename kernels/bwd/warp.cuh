// The warp-scan backward kernel (upstream semantics §2.3 + the fold_B rule of src/problem.h + dh0): it serves every
// call the thread-states kernel (ts.cuh) does not (src/cuda/select.cpp).
//
// Mapping (the forward's warp-scan one): a block = (batch b, up to 8 consecutive channels of one group), one WARP per channel,
// pieces of 32 lanes x K consecutive time steps. Chunks (2048 steps, the layout of x) run in reverse:
//   pass 1: seed the scanned state s from x[b,d,c-1] (h0 / 0 for chunk 0) and walk the chunk's pieces forward,
//           keeping only each piece's incoming state per n in shared memory (one warp scan per piece and state);
//   pass 2: pieces in reverse. Per state n: recompute ā and s inside the piece from the stored carry (warp scan),
//           then the reverse recurrence dh_t = coef_t dout_t + ā_{t+1} dh_{t+1} (warp suffix scan) seeded by
//           g = ā_first dh_first of the piece after it (per state in shared memory). du/ddelta accumulate in
//           registers across states; dA and constant dB/dC go through a warp sum into per-warp shared memory.
// Variable dB/dC are summed over the block's channels in shared memory (fixed order) once per tile of states,
// then added into an fp32 workspace with float atomics (default) or stored as per-block partials
// (deterministic mode: fixed-order second pass). Per-(b,d) partials of dA, dD, ddelta_bias and constant dB/dC
// go to workspace; a second kernel (reduce.cuh) sums them over batch in fixed order. All reductions except the atomics are
// therefore bitwise reproducible.
// Compile-time parameters: only the itype and real/complex; every flag is a uniform run-time branch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/io.cuh"
#include "../common/math.cuh"
#include "../common/serving.cuh"
#include "cuda/plans.h"
#include "problem.h"
#include "reduce.cuh"

namespace selscan::kern::bwd {

using cuda::bwd_warp::kItems;
using cuda::bwd_warp::kMaxWarps;
using cuda::bwd_warp::kPiece;
using cuda::bwd_warp::kPiecesPerChunk;
using cuda::bwd_warp::SmemLayout;
using cuda::bwd_warp::smem_layout;

// Two independent inclusive forward warp scans (warp_scan_fwd, common/math.cuh): cub::WarpScan one after the
// other took 0.89x of the SM time of a hand-written loop that interleaved the two (bench/collectives, complex).
// And a forward (lane order) and a reverse one (lane 31 first), hand-written: CUB has no reverse warp scan, and a
// forward one on mirrored lanes was 1.14x slower for real weights.
template <typename W>
__device__ __forceinline__ void warp_scan_fwd2(W& a0, W& b0, W& a1, W& b1, int lane) {
  warp_scan_fwd(a0, b0, lane);
  warp_scan_fwd(a1, b1, lane);
}
template <typename W>
__device__ __forceinline__ void warp_scan_fwd_rev(W& fa, W& fb, W& ra, W& rb, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const W pa = shfl_up(fa, off), pb = shfl_up(fb, off);
    const W na = shfl_down(ra, off), nb = shfl_down(rb, off);
    if (lane >= off) {
      fb = wfma(fa, pb, fb);
      fa = wmul(fa, pa);
    }
    if (lane + off < 32) {
      rb = wfma(ra, nb, rb);
      ra = wmul(ra, na);
    }
  }
}

// Row (b, d) of a (Bt, D, L) view from time t0 (a packed sequence's offset; 0 in a dense call).
template <typename T>
__device__ __forceinline__ const T* row_of(const View& v, int64_t b, int64_t d, int64_t t0) {
  return static_cast<const T*>(v.p) + b * v.s[0] + d * v.s[1] + t0;
}
template <typename T>
__device__ __forceinline__ T* wrow_of(const View& v, int64_t b, int64_t d, int64_t t0) {
  return static_cast<T*>(v.p) + b * v.s[0] + d * v.s[1] + t0;
}

// Adds (det: stores, or adds to what tile r > 0 of the slot stored) the 4 floats of `v` at img[0..3] where
// img[i] is within the sequence (i < nvalid) one by one: the float4 path needs 16-byte alignment and whole
// vectors, which packed sequences at any offset do not give.
__device__ __forceinline__ void img_put_scalar(float* img, float4 v, int nvalid, bool det, bool first) {
  const float e[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4 && k < nvalid; ++k) {
    if (det) img[k] = first ? e[k] : img[k] + e[k];
    else atomicAdd(img + k, e[k]);
  }
}

// ā = exp(δ A) as the forward builds it: real A pre-scaled by log2 e; complex: only the real part.
template <bool kC>
__device__ __forceinline__ typename Weights<kC>::W decay(float delta, typename Weights<kC>::W a2) {
  if constexpr (kC) return cexp2_fast(delta * a2.x, delta * a2.y);
  else return exp2_fast(delta * a2);
}

template <typename T, bool kC>
struct Stage {
  static constexpr int kCw = Weights<kC>::kCw;
  static constexpr int VE = Vec16<T>::kElems;              // itype elements per 16-byte chunk
  static constexpr int kRowChunks = kPiece * kCw / VE;     // chunks per staged row
  static constexpr int kCpl = kItems * kCw / VE;           // chunks per lane
  static_assert(kItems * kCw % VE == 0, "a 16-byte chunk must stay within one lane's steps");
};

// Variable B or C rows n0..n0+ns-1 of the piece starting at p0 (batch/group base `base`), staged block-wide as
// raw itype into `dst`: chunk c of a row goes to slot (c % kCpl) * 32 + c / kCpl, so each lane reads its own
// K steps (complex: K interleaved pairs) as conflict-free 16-byte loads. Steps past L read as 0; rows that are
// not 16-byte aligned (or the tail) are copied element by element.
template <typename T, bool kC>
__device__ __forceinline__ void stage_rows(uint4* dst, const T* base, int64_t sstride, int64_t n0, int ns,
                                           int64_t p0, int64_t L, bool vec) {
  using S = Stage<T, kC>;
  const int64_t e0 = p0 * S::kCw, lim = L * S::kCw;
  for (int idx = threadIdx.x; idx < ns * S::kRowChunks; idx += blockDim.x) {
    const int sn = idx / S::kRowChunks;
    const int c = idx - sn * S::kRowChunks;
    const int64_t e = e0 + static_cast<int64_t>(c) * S::VE;
    const T* src = base + (n0 + sn) * sstride + e;
    uint4* d = dst + sn * S::kRowChunks + (c % S::kCpl) * 32 + c / S::kCpl;
    if (vec && e + S::VE <= lim) {
      cp_async16(d, src);
    } else {
      uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int j = 0; j < S::VE; ++j) {
        if (e + j >= lim) break;
        if constexpr (sizeof(T) == 4) {
          w[j] = reinterpret_cast<const uint32_t*>(src)[j];
        } else {
          const uint32_t h = reinterpret_cast<const uint16_t*>(src)[j];
          w[j / 2] |= h << (16 * (j % 2));
        }
      }
      *d = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// A lane's K weights of one raw staged row.
template <typename T, bool kC>
__device__ __forceinline__ void read_staged(const uint4* row, int lane, typename Weights<kC>::W (&out)[kItems]) {
  using S = Stage<T, kC>;
  float f[kItems * S::kCw];
#pragma unroll
  for (int j = 0; j < S::kCpl; ++j) unpack16<T>(row[j * 32 + lane], f + j * S::VE);
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    if constexpr (kC) out[k] = make_float2(f[2 * k], f[2 * k + 1]);
    else out[k] = f[k];
  }
}

template <bool kC>
__device__ __forceinline__ float4 pack4(const typename Weights<kC>::W (&v)[kItems], int k) {
  if constexpr (kC) return make_float4(v[k].x, v[k].y, v[k + 1].x, v[k + 1].y);
  else return make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
}


// A padding sequence's share of the backward, for the block of (sequence b, group g, slot): zero du, ddelta, dz and
// out_z over its steps, zero per-(b, d) partials and dh0 rows for the slot's channels, and in deterministic mode
// (whose dB/dC images are stored, not added) zeros at its positions of the slot's images.
template <typename T, bool kC>
__device__ void bwd_skip(const Args& args, int64_t b, int64_t g, int64_t slot, const Seq& sq) {
  using W = typename Weights<kC>::W;
  constexpr int kCw = Weights<kC>::kCw;
  const Problem& p = args.p;
  const int64_t N = p.dstate, D = p.dim, cpg = D / p.groups, L = sq.len;
  const int nwarps = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r = 0; r < args.tiles_per_slot; ++r) {
    const int64_t tile = slot * args.tiles_per_slot + r;
    if (tile >= args.tiles_per_group) break;
    const int64_t dl = tile * nwarps + warp;
    if (dl >= cpg) continue;
    const int64_t d = g * cpg + dl, bd = b * D + d;
    const View* rows[4] = {&p.du, &p.ddelta, &p.dz, &p.out_z};
    for (const View* v : rows) {
      if (v->p == nullptr) continue;
      T* row = wrow_of<T>(*v, sq.row, d, sq.t0);
      for (int64_t t = lane; t < L; t += 32) row[t] = from_f32<T>(0.f);
    }
    if (lane == 0) {
      args.ps[bd] = 0.f;
      args.ps[p.batch * D + bd] = 0.f;
    }
    W* pw = reinterpret_cast<W*>(args.pw);
    for (int64_t n = lane; n < N; n += 32) {
      for (int j = 0; j < args.nacc; ++j) pw[(j * p.batch * D + bd) * N + n] = wzero<W>();
      if (p.dh0.p != nullptr) st_w<kC>(p.dh0.p, b * p.dh0.s[0] + d * p.dh0.s[1] + n * p.dh0.s[2], wzero<W>());
    }
  }
  if (args.det_var) {
    const int64_t len = L * kCw, tw = sq.t0 * kCw;
    float* imgs[2] = {args.vb, args.vc};
    for (float* img : imgs) {
      if (img == nullptr) continue;
      for (int64_t i = threadIdx.x; i < N * len; i += blockDim.x)
        img[slot * args.var_elems + ((sq.row * p.groups + g) * N + i / len) * args.var_row + tw + i % len] = 0.f;
    }
  }
}

// kServing: the variant for serving calls (as the forward's, kernels/fwd/warp.cuh): each sequence's offsets and
// flags read on the device; the dense variant's code is the expressions below with the sequence folded to batch
// row b over [0, seqlen).
template <typename T, bool kC, bool kServing>
__global__ void __launch_bounds__(32 * kMaxWarps, 2) bwd_warp_kernel(const Args args) {
  using W = typename Weights<kC>::W;
  constexpr int K = kItems;
  constexpr int kCw = Weights<kC>::kCw;
  constexpr int kV4 = kPiece * kCw / 4;    // float4 per staged/reduced row
  constexpr float kTwo = kC ? 2.f : 1.f;  // complex: y = 2 Re(s coef)
  const Problem& p = args.p;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int64_t N = p.dstate, Ldense = p.seqlen, D = p.dim, G = p.groups;
  const int64_t cpg = D / G;
  // With fold_B (constant B, no h0) the saved x holds s = h / B; the backward multiplies the seed by B and
  // then runs on the true state h like every other case (the gradients are the same functions of B).
  const bool varB = p.var_B, varC = p.var_C, fold = p.fold_B;
  const int nvar = (varB ? 1 : 0) + (varC ? 1 : 0);
  const int S = args.stile;

  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const SmemLayout lay = smem_layout(N, kC, args.nacc, nvar, args.lane_acc, nwarps, S, sizeof(T));
  W* fc = reinterpret_cast<W*>(smem + warp * lay.per_warp);  // [kPiecesPerChunk][N] incoming state per piece
  W* gcar = fc + kPiecesPerChunk * N;                         // [N] reverse carry
  W* acc = gcar + N;                                          // [nacc][N]
  W* pA = acc + args.nacc * N;                                // [N] A[d, n]
  W* pA2 = pA + N;                                            // [N] A[d, n] pre-scaled for exp2 (real part)
  W* pB = pA2 + N;                                            // [N] constant B[d, n]
  W* pC = pB + N;                                             // [N] constant C[d, n]
  W* lacc = reinterpret_cast<W*>(smem + nwarps * lay.per_warp + warp * lay.lane_acc_per_warp);  // [nacc][N][32]
  uint4* stg = reinterpret_cast<uint4*>(smem + nwarps * (lay.per_warp + lay.lane_acc_per_warp));
  constexpr int kRowChunks = Stage<T, kC>::kRowChunks;
  // staged rows: buffer bf, variable v (0 = B, 1 = C when B is variable too), state sn
  auto stg_row = [&](int bf, int v, int sn) { return stg + ((bf * nvar + v) * S + sn) * kRowChunks; };
  float4* red = reinterpret_cast<float4*>(smem + nwarps * (lay.per_warp + lay.lane_acc_per_warp) + lay.stage);
  float4* redB = red;
  float4* redC = red + (varB ? S * nwarps * kV4 : 0);

  const int64_t nblocks = p.batch * G * args.slots;
  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    const int64_t slot = blk % args.slots;
    const int64_t g = (blk / args.slots) % G;
    const int64_t b = blk / (args.slots * G);
    // The sequence: batch row b over [0, seqlen) in a dense call; a serving call's packed offsets and flags. The
    // per-(b, d) partials and dh0 stay per sequence; the time-major tensors are read at (sq.row, sq.t0).
    Seq sq{};
    if constexpr (kServing) sq = seq_of<kC, false>(p, b);
    const int64_t L = kServing ? sq.len : Ldense, br = kServing ? sq.row : b, ts = kServing ? sq.t0 : 0;
    const int64_t xc0 = kServing ? sq.xc0 : 0;
    const T* Bbase = varB ? static_cast<const T*>(p.B.p) + br * p.B.s[0] + g * p.B.s[1] + ts * kCw : nullptr;
    const T* Cbase = varC ? static_cast<const T*>(p.C.p) + br * p.C.s[0] + g * p.C.s[1] + ts * kCw : nullptr;
    if (kServing && sq.skip != kSeqRun) {  // padding: zero gradients, nothing added to the reductions
      bwd_skip<T, kC>(args, b, g, slot, sq);
      continue;  // uniform over the block
    }
    // Every row of a variable B/C is 16-byte aligned iff the base is and the state stride keeps it so.
    const bool vB = varB && aligned16(Bbase) && ((p.B.s[2] * static_cast<int64_t>(sizeof(T))) % 16 == 0);
    const bool vC = varC && aligned16(Cbase) && ((p.C.s[2] * static_cast<int64_t>(sizeof(T))) % 16 == 0);
    for (int64_t r = 0; r < args.tiles_per_slot; ++r) {
      const int64_t tile = slot * args.tiles_per_slot + r;
      if (tile >= args.tiles_per_group) break;  // uniform over the block
      const int64_t dl = tile * nwarps + warp;
      const bool active = dl < cpg;
      const int64_t d = g * cpg + (active ? dl : 0);
      const int64_t Lv = active ? L : 0;  // an idle warp (past the group's end) sees all-zero input

      const bool hasZ = p.z.p != nullptr;
      const bool hasOz = hasZ && p.out_z.p != nullptr;
      const T* urow = row_of<T>(p.u, br, d, ts);
      const T* drow = row_of<T>(p.delta, br, d, ts);
      const bool vu = aligned16(urow), vd = aligned16(drow);
      const float Dd = (active && p.D.p != nullptr) ? static_cast<const float*>(p.D.p)[d * p.D.s[0]] : 0.f;
      const float bias =
          (active && p.delta_bias.p != nullptr) ? static_cast<const float*>(p.delta_bias.p)[d * p.delta_bias.s[0]]
                                                : 0.f;
      float dD_l = 0.f, ddb_l = 0.f;

      for (int64_t n = lane; n < N; n += 32) {
        gcar[n] = wzero<W>();
        for (int j = 0; j < args.nacc; ++j) acc[j * N + n] = wzero<W>();
        const W Aw = ld_w<kC>(p.A.p, d * p.A.s[0] + n * p.A.s[1]);
        pA[n] = Aw;
        if constexpr (kC) pA2[n] = make_float2(Aw.x * kLog2e, Aw.y);
        else pA2[n] = Aw * kLog2e;
        if (!varB) pB[n] = ld_w<kC>(p.B.p, d * p.B.s[0] + n * p.B.s[1]);
        if (!varC) pC[n] = ld_w<kC>(p.C.p, d * p.C.s[0] + n * p.C.s[1]);
      }
      if (args.lane_acc)
        for (int64_t i = lane; i < args.nacc * N * 32; i += 32) lacc[i] = wzero<W>();
      __syncwarp();

      for (int64_t c = (kServing ? (L + kChunk - 1) / kChunk : p.nchunks) - 1; c >= 0; --c) {
        const int64_t cs = c * kChunk;
        const int64_t clen = (L - cs < kChunk) ? (L - cs) : kChunk;
        const int np = static_cast<int>((clen + kPiece - 1) / kPiece);
        // Seed: the scanned state before the chunk.
        for (int64_t n = lane; n < N; n += 32) {
          W s0 = wzero<W>();
          if (active) {
            if (c > 0) {
              s0 = ld_w<kC>(p.x.p, br * p.x.s[0] + d * p.x.s[1] + (xc0 + c - 1) * p.x.s[2] + 2 * n + 1);
              if (fold) s0 = wmul(s0, pB[n]);
            } else if (kServing ? sq.init.p != nullptr : p.h0.p != nullptr) {
              s0 = kServing ? ld_w<kC>(sq.init.p, d * sq.init.s[1] + n * sq.init.s[2])
                            : ld_w<kC>(p.h0.p, b * p.h0.s[0] + d * p.h0.s[1] + n * p.h0.s[2]);
            }
          }
          fc[n] = s0;
        }
        __syncwarp();

        // ---------------------------------------------------------------- pass 1: piece carries
        for (int pi = 0; pi + 1 < np; ++pi) {
          const int64_t p0 = cs + static_cast<int64_t>(pi) * kPiece;
          const int64_t t0 = p0 + lane * K;
          const int nv = static_cast<int>(Lv - t0 < 0 ? 0 : (Lv - t0 > K ? K : Lv - t0));  // valid steps
          float uu[K], dl[K];
          load_run<T, K>(urow, t0, Lv, vu, uu);
          load_run<T, K>(drow, t0, Lv, vd, dl);
#pragma unroll
          for (int k = 0; k < K; ++k) {
            float v = dl[k] + bias;
            if (p.softplus) v = softplus(v);
            const bool ok = k < nv;
            dl[k] = ok ? v : 0.f;
            uu[k] = ok ? uu[k] * v : 0.f;  // δu
          }
          // Real weights: the decay from step t to the piece's end is exp2(A2 * (sum of δ after t)), so the
          // piece's carry update needs no scan: carry' = exp2(A2 Σδ) carry + Σ_t exp2(A2 e_t) B_t δu_t with
          // e_t = Σ δ after t. The sums are state-independent (once per piece). Complex weights keep the
          // product form (large phase arguments would lose __sincosf's accuracy).
          float dtot = 0.f;
          if constexpr (!kC) {
            float run = 0.f;
#pragma unroll
            for (int k = K - 1; k >= 0; --k) {
              const float v = dl[k];
              dl[k] = run;  // δ after step k within the lane
              run += v;
            }
            float suf = run;  // inclusive suffix sum over lanes
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
              const float v = __shfl_down_sync(kFullMask, suf, off);
              if (lane + off < 32) suf += v;
            }
            float after = __shfl_down_sync(kFullMask, suf, 1);
            if (lane == 31) after = 0.f;
            dtot = __shfl_sync(kFullMask, suf, 0);
#pragma unroll
            for (int k = 0; k < K; ++k) dl[k] += after;
          }
          const int ntiles = static_cast<int>((N + S - 1) / S);
          if (varB) {
            stage_rows<T, kC>(stg_row(0, 0, 0), Bbase, p.B.s[2], 0, static_cast<int>(N < S ? N : S), p0, L, vB);
            cp_async_commit();
          }
          for (int tt = 0; tt < ntiles; ++tt) {
            const int64_t n0 = static_cast<int64_t>(tt) * S;
            const int ns = static_cast<int>((N - n0 < S) ? (N - n0) : S);
            const int bf = tt & 1;
            if (varB) {  // prefetch the next round's rows, wait for this round's
              if (tt + 1 < ntiles) {
                const int64_t n1 = n0 + S;
                stage_rows<T, kC>(stg_row(bf ^ 1, 0, 0), Bbase, p.B.s[2], n1,
                                  static_cast<int>((N - n1 < S) ? (N - n1) : S), p0, L, vB);
              }
              cp_async_commit();
              cp_async_wait_prev();
              __syncthreads();
            }
            auto carries = [&](auto vb_tag) {
              constexpr bool VB = decltype(vb_tag)::value;
              // Two states per round: their warp reductions are independent, so their shuffles overlap.
              for (int sn = 0; sn < ns; sn += 2) {
                W pa[2], pb[2];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                  const int si = (sn + i < ns) ? sn + i : sn;  // an odd tail repeats the state (not stored)
                  const int64_t n = n0 + si;
                  const W a2 = pA2[n];
                  W Bv[K];
                  if constexpr (VB) {
                    read_staged<T, kC>(stg_row(bf, 0, si), lane, Bv);
                  } else {
#pragma unroll
                    for (int k = 0; k < K; ++k) Bv[k] = wone<W>();
                  }
                  pb[i] = wzero<W>();
                  if constexpr (kC) {
                    pa[i] = wone<W>();
#pragma unroll
                    for (int k = 0; k < K; ++k) {
                      const W ab = (k < nv) ? decay<kC>(dl[k], a2) : wone<W>();
                      pb[i] = wfma(ab, pb[i], wscale(Bv[k], uu[k]));
                      pa[i] = wmul(ab, pa[i]);
                    }
                  } else {
#pragma unroll
                    for (int k = 0; k < K; ++k) pb[i] = fmaf(exp2_fast(a2 * dl[k]), Bv[k] * uu[k], pb[i]);
                    pa[i] = exp2_fast(a2 * dtot);
                  }
                  if constexpr (!VB) pb[i] = wmul(pb[i], pB[n]);
                }
                if constexpr (kC) {
                  warp_scan_fwd2(pa[0], pb[0], pa[1], pb[1], lane);
                } else {
#pragma unroll
                  for (int m = 16; m >= 1; m >>= 1) {
                    const float v0 = __shfl_xor_sync(kFullMask, pb[0], m);
                    const float v1 = __shfl_xor_sync(kFullMask, pb[1], m);
                    pb[0] += v0;
                    pb[1] += v1;
                  }
                }
                if (lane == 31) {
                  const int64_t n = n0 + sn;
                  fc[(pi + 1) * N + n] = wfma(pa[0], fc[pi * N + n], pb[0]);
                  if (sn + 1 < ns) fc[(pi + 1) * N + n + 1] = wfma(pa[1], fc[pi * N + n + 1], pb[1]);
                }
              }
            };
            if (varB) carries(std::true_type{});
            else carries(std::false_type{});
            if (varB) __syncthreads();  // the staged rows are overwritten next
          }
          __syncwarp();
        }

        // ---------------------------------------------------------------- pass 2: pieces in reverse
        for (int pi = np - 1; pi >= 0; --pi) {
          const int64_t p0 = cs + static_cast<int64_t>(pi) * kPiece;
          const int64_t t0 = p0 + lane * K;
          const int nv = static_cast<int>(Lv - t0 < 0 ? 0 : (Lv - t0 > K ? K : Lv - t0));  // valid steps
          float uu[K], dl[K], dt[K], du[K], gu_acc[K], gd_acc[K];
          load_run<T, K>(urow, t0, Lv, vu, uu);
          load_run<T, K>(drow, t0, Lv, vd, dl);
          {
            const T* grow = row_of<T>(p.dout, br, d, ts);
            load_run<T, K>(grow, t0, Lv, aligned16(grow), dt);
          }
          if (hasZ) {
            const T* zrow = row_of<T>(p.z, br, d, ts);
            const T* orow = row_of<T>(p.out, br, d, ts);
            T* dzrow = wrow_of<T>(p.dz, br, d, ts);
            T* ozrow = hasOz ? wrow_of<T>(p.out_z, br, d, ts) : nullptr;
            float zz[K], oo[K];
            load_run<T, K>(zrow, t0, Lv, aligned16(zrow), zz);
            load_run<T, K>(orow, t0, Lv, aligned16(orow), oo);
#pragma unroll
            for (int k = 0; k < K; ++k) {
              const float sg = __fdividef(1.f, 1.f + __expf(-zz[k]));
              const float sl = zz[k] * sg;
              zz[k] = dt[k] * oo[k] * sg * (1.f + zz[k] * (1.f - sg));  // dz
              dt[k] = dt[k] * sl;
              oo[k] = oo[k] * sl;  // recomputed out_z
            }
            store_run<T, K>(dzrow, t0, Lv, aligned16(dzrow), zz);
            if (hasOz) store_run<T, K>(ozrow, t0, Lv, aligned16(ozrow), oo);
          }
#pragma unroll
          for (int k = 0; k < K; ++k) {
            float v = dl[k] + bias;
            if (p.softplus) v = softplus(v);
            const bool ok = k < nv;
            dl[k] = ok ? v : 0.f;
            dt[k] = ok ? kTwo * dt[k] : 0.f;  // complex: the 2 of y = 2 Re(.) folded in
            uu[k] = ok ? uu[k] : 0.f;
            du[k] = uu[k] * dl[k];  // δu
            gu_acc[k] = Dd * dt[k] / kTwo;
            gd_acc[k] = 0.f;
            dD_l += dt[k] * uu[k] / kTwo;
          }

          const int ntiles = static_cast<int>((N + S - 1) / S);
          auto stage_round = [&](int bf, int64_t m0) {
            const int ms = static_cast<int>((N - m0 < S) ? (N - m0) : S);
            if (varB) stage_rows<T, kC>(stg_row(bf, 0, 0), Bbase, p.B.s[2], m0, ms, p0, L, vB);
            if (varC) stage_rows<T, kC>(stg_row(bf, varB ? 1 : 0, 0), Cbase, p.C.s[2], m0, ms, p0, L, vC);
            cp_async_commit();
          };
          if (nvar > 0) stage_round(0, 0);
          for (int tt = 0; tt < ntiles; ++tt) {
            const int64_t n0 = static_cast<int64_t>(tt) * S;
            const int ns = static_cast<int>((N - n0 < S) ? (N - n0) : S);
            const int bf = tt & 1;
            if (nvar > 0) {  // prefetch the next round's rows, wait for this round's
              if (tt + 1 < ntiles) stage_round(bf ^ 1, n0 + S);
              else cp_async_commit();
              cp_async_wait_prev();
              __syncthreads();
            }
            // The state loop, specialised for constant/variable B and C (a uniform run-time choice).
            auto states = [&](auto vb_tag, auto vc_tag) {
              constexpr bool VB = decltype(vb_tag)::value;
              constexpr bool VC = decltype(vc_tag)::value;
            for (int sn = 0; sn < ns; ++sn) {
              const int64_t n = n0 + sn;
              const W Aw = pA[n];
              const W a2 = pA2[n];
              W Bv[K], Cv[K];  // the B factor inside b̄ and the output coefficient of h
              if constexpr (VB) {
                read_staged<T, kC>(stg_row(bf, 0, sn), lane, Bv);
              } else {
                const W Bc = pB[n];
#pragma unroll
                for (int k = 0; k < K; ++k) Bv[k] = Bc;
              }
              if constexpr (VC) {
                read_staged<T, kC>(stg_row(bf, varB ? 1 : 0, sn), lane, Cv);
              } else {
                const W Cc = pC[n];
#pragma unroll
                for (int k = 0; k < K; ++k) Cv[k] = Cc;
              }

              // Forward recurrence of h inside the piece (seeded by the stored carry) and the reverse one,
              // dh_t = dt_t conj(coef_t) + conj(ā_{t+1}) dh_{t+1} (seeded by gcar): both lane folds first,
              // then the two independent warp scans together.
              // Steps past L have δ = 0 (ā finite) and zero dout/δu, so their ā never reaches a gradient.
              W ab[K], hs[K];
#pragma unroll
              for (int k = 0; k < K; ++k) ab[k] = decay<kC>(dl[k], a2);
#pragma unroll
              for (int k = 0; k < K; ++k) Cv[k] = wscale(wconj(Cv[k]), dt[k]);  // beta_t = dt conj(coef)
              W an = shfl_down(wconj(ab[0]), 1);
              if (lane == 31) an = wone<W>();  // the piece's last step continues into gcar
              W pa = wone<W>(), pb = wzero<W>();
#pragma unroll
              for (int k = 0; k < K; ++k) {
                pb = wfma(ab[k], pb, wscale(Bv[k], du[k]));
                pa = wmul(ab[k], pa);
              }
              W ra = wone<W>(), rb = wzero<W>();
#pragma unroll
              for (int k = K - 1; k >= 0; --k) {
                const W al = (k == K - 1) ? an : wconj(ab[k + 1]);
                rb = wfma(al, rb, Cv[k]);
                ra = wmul(al, ra);
              }
              warp_scan_fwd_rev(pa, pb, ra, rb, lane);
              const W carry = fc[pi * N + n];
              const W gin = gcar[n];
              W hin = shfl_up(wfma(pa, carry, pb), 1);
              W dh = shfl_down(wfma(ra, gin, rb), 1);
              if (lane == 0) hin = carry;
              if (lane == 31) dh = gin;
              {
                W h = hin;
#pragma unroll
                for (int k = 0; k < K; ++k) {
                  h = wfma(ab[k], h, wscale(Bv[k], du[k]));
                  hs[k] = h;
                }
              }

              W dA_l = wzero<W>(), aB_l = wzero<W>(), aC_l = wzero<W>();
              W dBv[K], dCv[K];
#pragma unroll
              for (int k = K - 1; k >= 0; --k) {
                const W al = (k == K - 1) ? an : wconj(ab[k + 1]);
                dh = wfma(al, dh, Cv[k]);
                const W hprev = (k > 0) ? hs[k - 1] : hin;
                const W x = wmul(dh, wconj(wmul(ab[k], hprev)));  // dh conj(ā_t s_{t-1})
                const float gu = wdotre(dh, Bv[k]);
                gu_acc[k] += gu * dl[k];
                gd_acc[k] += gu * uu[k] + wdotre(x, Aw);   // Re(dh conj(A ā s))
                dA_l = wadd(dA_l, wscale(x, dl[k]));
                const W db = wscale(dh, du[k]);
                const W dc = wscale(wconj(hs[k]), dt[k]);  // dt conj(h): the gradient of the coefficient
                if constexpr (VB) dBv[k] = db;
                else aB_l = wadd(aB_l, db);
                if constexpr (VC) dCv[k] = dc;
                else aC_l = wadd(aC_l, dc);
                constexpr int kPer4 = 4 / kCw;  // steps per float4
                if (k % kPer4 == 0) {           // a whole float4 of this lane's row is done: store it now
                  const int j = k / kPer4;
                  if constexpr (VB) redB[(sn * nwarps + warp) * kV4 + j * 32 + lane] = pack4<kC>(dBv, k);
                  if constexpr (VC) redC[(sn * nwarps + warp) * kV4 + j * 32 + lane] = pack4<kC>(dCv, k);
                }
              }
              // dh is now dh at the lane's first step; lane 0 hands g = conj(ā_first) dh_first to the piece before.
              const W gout = wmul(wconj(ab[0]), dh);
              if (args.lane_acc) {
                W* la = lacc + n * 32 + lane;
                *la = wadd(*la, dA_l);
                if constexpr (!VB) la[args.accB * N * 32] = wadd(la[args.accB * N * 32], aB_l);
                if constexpr (!VC) la[args.accC * N * 32] = wadd(la[args.accC * N * 32], aC_l);
              } else {
                dA_l = warp_sum(dA_l);
                if constexpr (!VB) aB_l = warp_sum(aB_l);
                if constexpr (!VC) aC_l = warp_sum(aC_l);
                if (lane == 0) {
                  acc[n] = wadd(acc[n], dA_l);
                  if constexpr (!VB) acc[args.accB * N + n] = wadd(acc[args.accB * N + n], aB_l);
                  if constexpr (!VC) acc[args.accC * N + n] = wadd(acc[args.accC * N + n], aC_l);
                }
              }
              __syncwarp();  // every lane's read of gcar[n] above precedes lane 0's write (racecheck)
              if (lane == 0) gcar[n] = gout;
            }
            };
            if (varB) {
              if (varC) states(std::true_type{}, std::true_type{});
              else states(std::true_type{}, std::false_type{});
            } else {
              if (varC) states(std::false_type{}, std::true_type{});
              else states(std::false_type{}, std::false_type{});
            }
            if (nvar > 0) {
              // Sum the block's channels in fixed warp order, then one float4 add per 4 steps into the image.
              __syncthreads();
              const int64_t Lr = L * kCw;
              constexpr int kVpl = K * kCw / 4;
              const int items = ns * kV4;  // float4 per variable tensor in this round
              const int64_t row0 = (br * G + g) * N + n0;
              const int64_t tw = ts * kCw;  // the sequence's first float in the image rows
              for (int idx = threadIdx.x; idx < nvar * items; idx += blockDim.x) {
                const bool isC = !varB || idx >= items;
                const int rest = isC && varB ? idx - items : idx;
                const int sn = rest / kV4;
                const int q = rest - sn * kV4;  // position-major: lane ln, float4 j of that lane
                const int ln = q / kVpl, j = q - ln * kVpl;
                const int64_t pos = p0 * kCw + ln * (K * kCw) + 4 * j;
                if (pos >= Lr) continue;
                const float4* src = (isC ? redC : redB) + sn * nwarps * kV4 + j * 32 + ln;
                float4 sum = src[0];
                auto add_w = [&](int w) {
                  const float4 v = src[w * kV4];
                  sum.x += v.x;
                  sum.y += v.y;
                  sum.z += v.z;
                  sum.w += v.w;
                };
                if (nwarps == kMaxWarps) {
#pragma unroll
                  for (int w = 1; w < kMaxWarps; ++w) add_w(w);
                } else {
                  for (int w = 1; w < nwarps; ++w) add_w(w);
                }
                float* img = (isC ? args.vc : args.vb) + (row0 + sn) * args.var_row + tw + pos;
                // A packed sequence at an offset that is not a multiple of 4 floats, or its last partial vector
                // (the floats after it belong to the next sequence): float by float.
                if (kServing && ((tw & 3) != 0 || (p.varlen && pos + 4 > Lr))) {
                  img_put_scalar(args.det_var ? img + slot * args.var_elems : img, sum,
                                 static_cast<int>(Lr - pos < 4 ? Lr - pos : 4), args.det_var, r == 0);
                } else if (args.det_var) {
                  float4* q4 = reinterpret_cast<float4*>(img + slot * args.var_elems);
                  if (r != 0) {
                    const float4 o = *q4;
                    sum.x += o.x;
                    sum.y += o.y;
                    sum.z += o.z;
                    sum.w += o.w;
                  }
                  *q4 = sum;
                } else {
                  add_f4(img, sum);
                }
              }
              __syncthreads();
            }
          }

          // Softplus chain, then the per-step gradients.
          if (p.softplus) {
            float dr[K];
            load_run<T, K>(drow, t0, Lv, vd, dr);
#pragma unroll
            for (int k = 0; k < K; ++k) {
              const float v = dr[k] + bias;
              if (v <= 20.f) gd_acc[k] *= __fdividef(1.f, 1.f + __expf(-v));
            }
          }
#pragma unroll
          for (int k = 0; k < K; ++k) ddb_l += (k < nv) ? gd_acc[k] : 0.f;
          {
            T* durow = wrow_of<T>(p.du, br, d, ts);
            T* ddrow = wrow_of<T>(p.ddelta, br, d, ts);
            store_run<T, K>(durow, t0, Lv, aligned16(durow), gu_acc);
            store_run<T, K>(ddrow, t0, Lv, aligned16(ddrow), gd_acc);
          }
          __syncwarp();
        }
      }

      // Per-(b,d) partials (summed over batch by bwd_finish) and dh0.
      dD_l = warp_sum(dD_l);
      ddb_l = warp_sum(ddb_l);
      if (active) {
        const int64_t bd = b * D + d;
        if (lane == 0) {
          args.ps[bd] = dD_l;
          args.ps[p.batch * D + bd] = ddb_l;
        }
        W* pw = reinterpret_cast<W*>(args.pw);
        for (int64_t n = lane; n < N; n += 32) {
          for (int j = 0; j < args.nacc; ++j) {
            W v = acc[j * N + n];
            if (args.lane_acc) {
              const W* la = lacc + (j * N + n) * 32;
              for (int i = 0; i < 32; ++i) v = wadd(v, la[(i + lane) & 31]);  // rotated: no bank conflicts
            }
            pw[(j * p.batch * D + bd) * N + n] = v;
          }
          // dh0 of a sequence that started from zero (has_initial_state 0) is 0.
          if (p.dh0.p != nullptr)
            st_w<kC>(p.dh0.p, b * p.dh0.s[0] + d * p.dh0.s[1] + n * p.dh0.s[2],
                     (!kServing || sq.init.p != nullptr) ? gcar[n] : wzero<W>());
        }
      }
      __syncwarp();
    }
  }
}

}  // namespace selscan::kern::bwd
