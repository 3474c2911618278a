// The warp-scan forward kernel (upstream semantics §1.3 + the fold_B rule of src/problem.h): it serves every call
// the thread-states kernel (ts.cuh) does not (src/cuda/select.cpp).
//
// Mapping: a block = (batch b, up to 8 consecutive channels of one group), one WARP per channel. A warp walks
// the sequence in pieces of 32 lanes x K consecutive time steps (a piece never straddles a 2048-chunk since
// 32*K divides 2048). Per piece each lane loads its K values of u/delta, then for every state n:
//   K exp2 -> K pairs (a, b) -> a thread-local fold -> a 5-step warp shuffle scan seeded by the running
//   (P, H) of that state (kept in shared memory across pieces) -> h per item with K FMAs -> y += h*coef.
// y accumulates in registers across states. Variable B/C rows of a piece are staged once per block into
// shared memory (converted to fp32), shared by all the channels of the block: they belong to one group.
// The state loop has no block barrier except around that staging (two per tile of kStateTile states).
// Compile-time parameters: only the itype and real/complex. Every flag is a uniform run-time branch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/io.cuh"
#include "../common/math.cuh"
#include "../common/serving.cuh"
#include "cuda/plans.h"
#include "problem.h"

namespace selscan::kern::fwd {

constexpr int kFwdMaxWarps = cuda::fwd_warp::kMaxWarps;  // channels per block
// States of variable B/C staged per barrier pair.
template <bool kComplex>
constexpr int kStateTile = kComplex ? cuda::fwd_warp::kStateTileComplex : cuda::fwd_warp::kStateTileReal;

// Variable B or C rows n0..n0+ns-1 of the piece starting at t0, for (batch row b, group g) and a sequence starting
// at time `toff` of that row, into shared memory as fp32. Layout: float4 index ((nn * kVpl + j) * 32 + lane),
// j < kVpl = K*kCw/4, so a lane's K steps sit in kVpl float4 with lanes adjacent (conflict-free 16-byte reads).
// Steps past L are staged as 0.
template <typename T, bool kComplex, int K>
__device__ __forceinline__ void fwd_stage(float4* dst, const View& v, int64_t b, int64_t g, int64_t toff, int64_t n0,
                                          int ns, int64_t t0, int64_t L) {
  constexpr int kCw = Weights<kComplex>::kCw;
  constexpr int kLaneFloats = K * kCw;  // floats one lane reads per state
  constexpr int kVpl = kLaneFloats / 4;
  constexpr int VE = Vec16<T>::kElems;          // itype elements per 16-byte load
  constexpr int kVecPerRow = 32 * K * kCw / VE;
  static_assert(kLaneFloats % VE == 0, "a 16-byte load must stay within one lane's steps");
  const int64_t row_len = L * kCw;
  const int64_t e0 = t0 * kCw;
  const T* base = static_cast<const T*>(v.p) + b * v.s[0] + g * v.s[1] + toff * kCw;
  const int total = ns * kVecPerRow;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int nn = idx / kVecPerRow;
    const int e = (idx % kVecPerRow) * VE;  // element offset within the piece's row segment
    const T* src = base + (n0 + nn) * v.s[2] + e0 + e;
    float vals[VE];
    if (e0 + e + VE <= row_len && aligned16(src)) {
      load16(src, vals);
    } else {
#pragma unroll
      for (int j = 0; j < VE; ++j) vals[j] = (e0 + e + j < row_len) ? to_f32(src[j]) : 0.f;
    }
#pragma unroll
    for (int q = 0; q < VE / 4; ++q) {
      const int eq = e + 4 * q;
      const int ln = eq / kLaneFloats;
      const int f = eq % kLaneFloats;
      dst[(nn * kVpl + f / 4) * 32 + ln] = make_float4(vals[4 * q], vals[4 * q + 1], vals[4 * q + 2], vals[4 * q + 3]);
    }
  }
}

// Reads a lane's K staged steps of one state row: real -> K floats, complex -> K float2.
template <bool kComplex, int K>
__device__ __forceinline__ void fwd_read_stage(const float4* src, int nn, int lane,
                                               typename Weights<kComplex>::W* out) {
  constexpr int kVpl = K * Weights<kComplex>::kCw / 4;
#pragma unroll
  for (int j = 0; j < kVpl; ++j) {
    const float4 q = src[(nn * kVpl + j) * 32 + lane];
    if constexpr (kComplex) {
      out[2 * j] = make_float2(q.x, q.y);
      out[2 * j + 1] = make_float2(q.z, q.w);
    } else {
      out[4 * j] = q.x;
      out[4 * j + 1] = q.y;
      out[4 * j + 2] = q.z;
      out[4 * j + 3] = q.w;
    }
  }
}

// y += h * coef (real); y += 2 Re(h * coef) (complex weights, conjugate-pair convention).
__device__ __forceinline__ float fwd_out_acc(float h, float c, float y) { return fmaf(h, c, y); }
__device__ __forceinline__ float fwd_out_acc(float2 h, float2 c, float y) { return y + 2.f * (h.x * c.x - h.y * c.y); }

// Per-warp, per-state values kept in shared memory for the whole sequence: the running (P, H) of the scan and
// the constants of the state (A*log2e, the scale of b̄ and the output coefficient), so the state loop reads
// them with broadcast loads instead of strided global loads.
enum FwdSlot : int { kSlotP = 0, kSlotH, kSlotA, kSlotBs, kSlotCc, kSlots };
static_assert(kSlots == cuda::fwd_warp::kSlots, "the host sizes the slots (src/cuda/plans.h)");

// kServing: the variant for serving calls (src/cuda/select.cpp routes every call with serving fields here), which
// reads each sequence's offsets, slot and flags on the device (kernels/common/serving.cuh). A template parameter
// rather than a run-time branch: the dense variant keeps its registers (the branch measured extra spills).
// kBlocks (a BlockMode): the serving variant that also writes block-boundary states (block-wise state caching), in
// two instances of its own so that serving calls without blocks keep their code: one serves the sequences whose
// block ends fall on lanes' last steps (K divides the block size and the context: a fresh prefill, a prefix-cache
// hit, chunks of whole blocks) with no per-step work, the other every other sequence, with a store test per step
// (which costs that instance registers and spills: ptxas -v, validation/optimisation-log.md). A call in block mode
// launches both (the aligned one alone where no sequence has a context); each returns at once from the other's
// sequences.
template <typename T, bool kComplex, int K, int kMinBlocks, bool kServing, int kBlocks>
__global__ void __launch_bounds__(kFwdMaxWarps * 32, kMinBlocks) fwd_warp_kernel(const Problem p,
                                                                                  int64_t tiles_per_group) {
  static_assert(kServing || kBlocks == kNoBlocks, "block mode is a serving call");
  using W = typename Weights<kComplex>::W;
  constexpr int NS = kStateTile<kComplex>;
  constexpr int kVpl = K * Weights<kComplex>::kCw / 4;
  constexpr int kPiece = 32 * K;
  static_assert(kChunk % kPiece == 0, "a piece must not straddle a chunk of x");
  extern __shared__ float4 smem[];

  const int nwarps = static_cast<int>(blockDim.x / 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t N = p.dstate;
  const int64_t cpg = p.dim / p.groups;
  int64_t blk = blockIdx.x;
  const int64_t tile = blk % tiles_per_group;
  blk /= tiles_per_group;
  const int64_t g = blk % p.groups;
  const int64_t b = blk / p.groups;
  const int64_t dl = tile * nwarps + warp;
  // Warps past the group's last channel still stage and meet the barriers; they compute and store nothing.
  const bool active = dl < cpg;
  const int64_t d = g * cpg + (active ? dl : 0);
  const bool var_B = p.var_B, var_C = p.var_C, fold_B = p.fold_B;
  // The sequence: a serving call's packed offsets, slot and flags; in a dense call batch row b over [0, seqlen)
  // (the expressions below then fold to the dense kernel's).
  if constexpr (kBlocks != kNoBlocks)  // the other block-mode instance serves this sequence
    if (blocks_aligned_ctx(p, b, K) != (kBlocks == kBlocksAligned)) return;
  Seq sq{};
  if constexpr (kServing) sq = seq_of<kComplex, kBlocks != kNoBlocks>(p, b);
  const int64_t L = kServing ? sq.len : p.seqlen;

  float4* sB = smem;
  float4* sC = sB + (var_B ? NS * kVpl * 32 : 0);
  W* st = reinterpret_cast<W*>(sC + (var_C ? NS * kVpl * 32 : 0)) + static_cast<int64_t>(warp) * N * kSlots;
  W* sP = st + kSlotP * N;
  W* sH = st + kSlotH * N;
  W* sA = st + kSlotA * N;
  W* sBs = st + kSlotBs * N;
  W* sCc = st + kSlotCc * N;
  // Aligned block mode: this warp's block-end rows, one per block end a piece can hold (NS states each, then the
  // ends' slots), after every warp's slots; as a float index from the shared-memory base (a 32-bit offset, where a
  // pointer would hold two registers).
  const int nends = kBlocks == kBlocksAligned ? cuda::fwd_warp::block_ends_per_piece(p.block_size) : 0;
  int end0 = 0;
  if constexpr (kBlocks == kBlocksAligned)
    end0 = static_cast<int>(reinterpret_cast<float*>(reinterpret_cast<W*>(sC + (var_C ? NS * kVpl * 32 : 0)) +
                                                     nwarps * N * kSlots) -
                            reinterpret_cast<float*>(smem)) +
           warp * nends * (NS + 2);

  const int64_t r = kServing ? sq.row : b, t0s = kServing ? sq.t0 : 0, xc0 = kServing ? sq.xc0 : 0;
  const T* u_row = static_cast<const T*>(p.u.p) + r * p.u.s[0] + d * p.u.s[1] + t0s;
  const T* dt_row = static_cast<const T*>(p.delta.p) + r * p.delta.s[0] + d * p.delta.s[1] + t0s;
  const bool has_z = (p.z.p != nullptr);
  const T* z_row = has_z ? static_cast<const T*>(p.z.p) + r * p.z.s[0] + d * p.z.s[1] + t0s : nullptr;
  T* out_row = static_cast<T*>(p.out.p) + r * p.out.s[0] + d * p.out.s[1] + t0s;
  T* oz_row = has_z ? static_cast<T*>(p.out_z.p) + r * p.out_z.s[0] + d * p.out_z.s[1] + t0s : nullptr;
  if (kServing && sq.skip != kSeqRun) {  // padding (0) or a slot outside the pool (NaN): no scan, no slot touched
    if (!active) return;                 // the whole block skips: no barrier below is reached
    const float fill = sq.skip == kSeqPad ? 0.f : __int_as_float(0x7fffffff);
    for (int64_t t = lane; t < L; t += 32) {
      out_row[t] = from_f32<T>(fill);
      if (has_z) oz_row[t] = from_f32<T>(fill);
    }
    if (sq.fin.p != nullptr)
      for (int64_t n = lane; n < N; n += 32)
        st_w<kComplex>(sq.fin.p, d * sq.fin.s[1] + n * sq.fin.s[2], wscale(wone<W>(), fill));
    return;
  }
  const bool vec_in = aligned16(u_row) && aligned16(dt_row);
  const bool vec_z = has_z && aligned16(z_row) && aligned16(oz_row);
  const bool vec_out = aligned16(out_row);

  const float bias = (p.delta_bias.p != nullptr) ? __ldg(static_cast<const float*>(p.delta_bias.p) + d * p.delta_bias.s[0]) : 0.f;
  const float Dd = (p.D.p != nullptr) ? __ldg(static_cast<const float*>(p.D.p) + d * p.D.s[0]) : 0.f;

  if (active) {
    for (int64_t n = lane; n < N; n += 32) {
      sP[n] = wone<W>();
      if constexpr (kServing)  // a pool slot too goes through the read-only path: only this warp writes it, later
        sH[n] = (sq.init.p != nullptr) ? ldg_w<kComplex>(sq.init.p, d * sq.init.s[1] + n * sq.init.s[2]) : wzero<W>();
      else
        sH[n] = (p.h0.p != nullptr) ? ldg_w<kComplex>(p.h0.p, b * p.h0.s[0] + d * p.h0.s[1] + n * p.h0.s[2])
                                    : wzero<W>();
      const W a = ldg_w<kComplex>(p.A.p, d * p.A.s[0] + n * p.A.s[1]);
      if constexpr (kComplex) sA[n] = make_float2(a.x * kLog2e, a.y);  // only the real part is log2e-scaled
      else sA[n] = a * kLog2e;
      const W cB = var_B ? wone<W>() : ldg_w<kComplex>(p.B.p, d * p.B.s[0] + n * p.B.s[1]);
      const W cC = var_C ? wone<W>() : ldg_w<kComplex>(p.C.p, d * p.C.s[0] + n * p.C.s[1]);
      // fold_B: the scan runs without B and B joins the output coefficient (upstream's constant-B rule);
      // otherwise a constant B scales b̄ = B * delta * u.
      sBs[n] = fold_B ? wone<W>() : cB;
      sCc[n] = fold_B ? wmul(cB, cC) : cC;
    }
    __syncwarp();
  }

  const int64_t npieces = (L + kPiece - 1) / kPiece;
  for (int64_t pc = 0; pc < npieces; ++pc) {
    const int64_t t0 = pc * kPiece;
    const int64_t tl = t0 + static_cast<int64_t>(lane) * K;
    const int64_t tend = t0 + kPiece;
    const bool chunk_end = (tend % kChunk == 0) || tend >= L;
    // Aligned block mode: the slot that takes channel d's states when the lane's last step ends a block strictly
    // inside the sequence (-1: it does not, or the block's entry is pad_slot_id). Its table load is issued before
    // the piece's inputs, so that its latency overlaps theirs.
    int64_t bslot = -1;
    if constexpr (kBlocks == kBlocksAligned) {
      const int64_t last = tl + K - 1;
      if (active && last < L - 1 && (sq.ctx + last + 1) % sq.block == 0) {
        const int64_t slot = table_entry(p, b, (sq.ctx + last) / sq.block);
        if (slot != p.pad_slot_id) bslot = slot;
      }
    }
    // The chunk-carry row this piece writes (its last piece in a chunk of x), resolved once for all states.
    W* xrow = nullptr;
    if (chunk_end && p.x.p != nullptr)
      xrow = static_cast<W*>(p.x.p) + r * p.x.s[0] + d * p.x.s[1] + (xc0 + t0 / kChunk) * p.x.s[2];
    float dlt[K], du[K], y[K];
    float dsum = 0.f;  // sum of the lane's deltas: its decay product is exp2(A2 * dsum) (real weights)
    if (active) {
      load_run<T, K>(u_row, tl, L, vec_in, du);
      load_run<T, K>(dt_row, tl, L, vec_in, dlt);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        float v = dlt[k] + bias;
        if (p.softplus) v = softplus(v);
        // Steps past L become the identity step (a = exp2(0) = 1, b = 0); they are never stored.
        if (tl + k >= L) v = 0.f;
        dlt[k] = v;
        dsum += v;
        y[k] = Dd * du[k];
        du[k] = v * du[k];
      }
    }
    // Unaligned block mode: bit k set where the lane's step k ends a block strictly inside the sequence; the state
    // after it goes to that block's slot.
    unsigned bmask = 0;
    if constexpr (kBlocks == kBlocksUnaligned) {
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (tl + k < L - 1 && (sq.ctx + tl + k + 1) % sq.block == 0) bmask |= 1u << k;
    }
    // Aligned block mode: the lanes whose states go to a slot, and this lane's row among the warp's block-end rows
    // (-1: none). The state loop stores each state there (shared memory, no test of the slot or global address per
    // state); each tile's rows are then copied out with the states across lanes (coalesced).
    unsigned ends = 0;
    int erow = -1;
    if constexpr (kBlocks == kBlocksAligned) {
      ends = __ballot_sync(0xffffffffu, bslot >= 0);
      if (bslot >= 0) {
        const int e = __popc(ends & ((1u << lane) - 1u));
        erow = end0 + e * NS;
        // The slot waits in shared memory too (two 32-bit halves after the rows), so that no register holds it
        // across the state loop.
        int* slots = reinterpret_cast<int*>(smem) + end0 + nends * NS;
        slots[2 * e] = static_cast<int>(bslot & 0xffffffff);
        slots[2 * e + 1] = static_cast<int>(bslot >> 32);
      }
    }
    for (int64_t n0 = 0; n0 < N; n0 += NS) {
      const int ns = static_cast<int>(N - n0 < NS ? N - n0 : NS);
      if (var_B || var_C) {
        __syncthreads();  // the previous tile's readers are done
        if (var_B) fwd_stage<T, kComplex, K>(sB, p.B, r, g, t0s, n0, ns, t0, L);
        if (var_C) fwd_stage<T, kComplex, K>(sC, p.C, r, g, t0s, n0, ns, t0, L);
        __syncthreads();
      }
      if (!active) continue;
      for (int nn = 0; nn < ns; ++nn) {
        const int64_t n = n0 + nn;
        const W A2 = sA[n];
        // Uniform branches on the flags, each with its own unrolled loop: a select per step would cost as much
        // as the arithmetic it picks.
        W a[K], bb[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if constexpr (kComplex) a[k] = cexp2_fast(dlt[k] * A2.x, dlt[k] * A2.y);
          else a[k] = exp2_fast(dlt[k] * A2);
        }
        if (var_B) {
          W bv[K];
          fwd_read_stage<kComplex, K>(sB, nn, lane, bv);
#pragma unroll
          for (int k = 0; k < K; ++k) bb[k] = wscale(bv[k], du[k]);
        } else {
          const W bs = sBs[n];
#pragma unroll
          for (int k = 0; k < K; ++k) bb[k] = wscale(bs, du[k]);
        }
        W Pa, Hb = bb[0];
#pragma unroll
        for (int k = 1; k < K; ++k) Hb = wfma(a[k], Hb, bb[k]);
        if constexpr (kComplex) {
          Pa = a[0];
#pragma unroll
          for (int k = 1; k < K; ++k) Pa = cmul(a[k], Pa);
        } else {
          Pa = exp2_fast(dsum * A2);  // one exp2 instead of K-1 multiplies
        }
        W cH = wzero<W>();
        if (lane == 0) {  // seed with the state carried from the previous pieces
          const W cP = sP[n];
          cH = sH[n];
          Hb = wfma(Pa, cH, Hb);
          Pa = wmul(Pa, cP);
        }
        warp_scan_fwd(Pa, Hb, lane);
        W h = shfl_up(Hb, 1);
        if (lane == 0) h = cH;
        // The lane's K steps; with kStores (the unaligned block-mode instance) each block end among them stores its
        // state.
        const auto steps = [&](auto stores) {
          constexpr bool kStores = decltype(stores)::value;
          if (var_C) {
            W cv[K];
            fwd_read_stage<kComplex, K>(sC, nn, lane, cv);
            if (fold_B) {  // constant B joins the coefficient
              const W cc = sCc[n];
#pragma unroll
              for (int k = 0; k < K; ++k) cv[k] = wmul(cc, cv[k]);
            }
#pragma unroll
            for (int k = 0; k < K; ++k) {
              h = wfma(a[k], h, bb[k]);
              if constexpr (kStores)
                if ((bmask >> k) & 1u) store_block_state<kComplex>(p, sq, b, tl + k, d, n, h);
              y[k] = fwd_out_acc(h, cv[k], y[k]);
            }
          } else {
            const W cc = sCc[n];
#pragma unroll
            for (int k = 0; k < K; ++k) {
              h = wfma(a[k], h, bb[k]);
              if constexpr (kStores)
                if ((bmask >> k) & 1u) store_block_state<kComplex>(p, sq, b, tl + k, d, n, h);
              y[k] = fwd_out_acc(h, cc, y[k]);
            }
          }
        };
        if constexpr (kBlocks == kBlocksUnaligned) {
          steps(std::true_type{});
        } else {
          steps(std::false_type{});
          // Aligned blocks: only the lane's last step can end a block, and its state is the loop's last.
          if constexpr (kBlocks == kBlocksAligned)
            if (erow >= 0) reinterpret_cast<float*>(smem)[erow + nn] = h;
        }
        __syncwarp();  // lane 0's read of this state's carry precedes lane 31's update
        if (lane == 31) {
          sP[n] = Pa;
          sH[n] = Hb;
          if (xrow != nullptr) {
            xrow[2 * n] = Pa;
            xrow[2 * n + 1] = Hb;
          }
        }
      }
      if constexpr (kBlocks == kBlocksAligned) {
        // The tile's block-end rows to their slots, state n0 + nn of end e at index e * ns + nn across the lanes
        // (coalesced along the states). The loop's last __syncwarp made every row visible.
        const int* slots = reinterpret_cast<const int*>(smem) + end0 + nends * NS;
        for (int i = lane; i < __popc(ends) * ns; i += 32) {
          const int e = i / ns, nn = i - e * ns;
          const int64_t slot = static_cast<int64_t>(static_cast<unsigned>(slots[2 * e])) |
                               (static_cast<int64_t>(slots[2 * e + 1]) << 32);
          static_cast<W*>(state_row<kComplex>(p.ssm_states, slot).p)[d * p.ssm_states.s[1] +
                                                                     (n0 + nn) * p.ssm_states.s[2]] =
              reinterpret_cast<const float*>(smem)[end0 + e * NS + nn];
        }
        __syncwarp();  // the rows are read before the next tile rewrites them
      }
    }
    if (!active) continue;
    __syncwarp();  // lane 31's carry writes are visible to lane 0 in the next piece
    store_run<T, K>(out_row, tl, L, vec_out, y);
    if (has_z) {
      float zz[K];
      load_run<T, K>(z_row, tl, L, vec_z, zz);
#pragma unroll
      for (int k = 0; k < K; ++k) zz[k] = y[k] * silu(zz[k]);
      store_run<T, K>(oz_row, tl, L, vec_z, zz);
    }
  }

  if constexpr (kServing) {
    if (active && (sq.fin.p != nullptr))  // last_state's row, or the sequence's pool slot (no fold_B here)
      for (int64_t n = lane; n < N; n += 32) st_w<kComplex>(sq.fin.p, d * sq.fin.s[1] + n * sq.fin.s[2], sH[n]);
  } else if (active && (p.last_state.p != nullptr)) {
    for (int64_t n = lane; n < N; n += 32) {
      W h = sH[n];
      if (fold_B) h = wmul(h, ldg_w<kComplex>(p.B.p, d * p.B.s[0] + n * p.B.s[1]));  // true state = B * H
      static_cast<W*>(p.last_state.p)[b * p.last_state.s[0] + d * p.last_state.s[1] + n * p.last_state.s[2]] = h;
    }
  }
}

}  // namespace selscan::kern::fwd
