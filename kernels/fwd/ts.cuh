// The thread-states forward, for real weights and dstate <= 32: every thread runs the recurrence of kS = 4 states of
// one channel sequentially in time, so there is no scan across threads at all. src/cuda/select.cpp says which calls
// it serves: dense calls and serving calls (packed sequences, state pools, block mode with blocks of a multiple of 16
// steps).
//
// Why: the warp-scan kernel (warp.cuh) pays a thread-local fold, a 5-step shuffle scan and a second pass per state
// and piece (~9.6 instructions per state update, long dependency chains). Here a state update is 5 instructions
// (exp2 argument, ex2, b̄, h = a h + b̄, y += h c) with kS independent chains per thread, so the kernel is
// bound by the ex2 pipe rather than by latency. The price is parallelism: Bt*D*ceil(N/kS) threads.
//
// Mapping: a block = (batch b, CH consecutive channels of one group), TPC = ceil(N/kS) (a power of 2) threads per
// channel. Time runs in tiles of TT steps; per tile:
//   stage   : u/delta of the block's channels -> delta' = softplus(delta + bias) and delta'*u in shared memory
//             (one 16-byte vector per thread and tensor, loaded during the previous tile's compute), variable B/C
//             rows -> shared memory transposed to [t][n], so a thread reads its kS states of a step as one float4
//             (bf16 dense calls with both variable: one raw tile, B and C of a step in one 16-byte read; steps_packed);
//   compute : each thread advances its kS states TT steps and writes its partial y (sum over its states) per step;
//   epilogue: y = sum of the TPC partials + D u, out and out_z = y silu(z), as 16-byte vectors.
// Two barriers per tile. Chunk states x (upstream layout: running product P and scanned state H at each chunk
// end) and last_state are written by the thread that owns the state.
//
// kServing: the instances for serving calls (MINB kMinBlocksFew: src/cuda/select.cpp),
// template parameters so that the dense instances keep their code: one for packed sequences and pools, one for block
// mode (kBlocks = kBlocksAligned: the sequences whose block ends fall on 16-step boundaries), whose block-end stores
// and 16-step pieces would otherwise cost the former 7-9% (validation/optimisation-log.md). The first warp looks the
// block's sequence up (kernels/common/serving.cuh; block mode checks its table entries across the warp) into shared
// memory and every thread reads its fields there where they are used: values live across the time loop would cost
// registers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/io.cuh"
#include "../common/math.cuh"
#include "../common/serving.cuh"
#include "cuda/plans.h"
#include "cuda/tile_map.h"
#include "problem.h"

namespace selscan::kern::fwd::ts {

using cuda::fwd_ts::kBcPad;
using cuda::fwd_ts::kMaxThreads;
using cuda::fwd_ts::kS;
using Cfg = cuda::fwd_ts::Shape;  // the launch shape (src/cuda/plans.h)

// Variable B/C tiles are [t][state] rows of tpc*kS floats. Each group of 2^vs steps (one staging vector: 8 in
// fp16/bf16, 4 in fp32) starts 8 floats after the previous group's end: the staging threads of a warp store 8 states x
// 4 such groups at once, which without the shift land on 8 banks (a 4-way conflict). vs = 0: no shift (the
// register-starved variant, see fwd_ts_kernel). Rows stay 16-byte aligned.
__device__ __forceinline__ int bc_row(int t, int vs, int np) { return t * np + (vs ? (t >> vs) << 3 : 0); }

// The state loop: kS states of one channel over tt steps (a multiple of 4), B and C of step t + j as floats from
// bc(t, j, bv, cv) (t the first of 4 steps), y partials per step into y_row, the delta sum for chunk states if asked
// (the instances without kStageSum, fwd_ts_kernel).
// kPrefetch: delta' and delta'u of the next 4 steps are read before this group's y store, which the compiler cannot
// move the next group's reads above (all are shared memory), so their latency hides behind this group's math; 8
// registers, so for the variants that have them. The read past the last group stays inside the row (a tile's rows
// are its steps + 4 floats: ROW in fwd_ts_kernel) and is not used.
template <bool kPrefetch, typename BcAt>
__device__ __forceinline__ void state_loop(int tt, const float* dl_row, const float* du_row, float* y_row,
                                           float (&h)[kS], const float (&a2)[kS], bool want_sum, float& dsum,
                                           const BcAt& bc) {
  float4 next_dl, next_du;
  if constexpr (kPrefetch) {
    next_dl = *reinterpret_cast<const float4*>(dl_row);
    next_du = *reinterpret_cast<const float4*>(du_row);
  }
  for (int t = 0; t < tt; t += 4) {
    float4 dl4, du4;
    if constexpr (kPrefetch) {
      dl4 = next_dl;
      du4 = next_du;
      next_dl = *reinterpret_cast<const float4*>(dl_row + t + 4);
      next_du = *reinterpret_cast<const float4*>(du_row + t + 4);
    } else {
      dl4 = *reinterpret_cast<const float4*>(dl_row + t);
      du4 = *reinterpret_cast<const float4*>(du_row + t);
    }
    const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w};
    const float du[4] = {du4.x, du4.y, du4.z, du4.w};
    float y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float bv[kS], cv[kS];
      bc(t, j, bv, cv);
      float acc = 0.f;
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const float a = exp2_fast(dl[j] * a2[s]);
        h[s] = fmaf(a, h[s], bv[s] * du[j]);
        acc = fmaf(h[s], cv[s], acc);
      }
      y[j] = acc;
    }
    *reinterpret_cast<float4*>(y_row + t) = make_float4(y[0], y[1], y[2], y[3]);
    if (want_sum) dsum += (dl[0] + dl[1]) + (dl[2] + dl[3]);
  }
}

// The compute phase with float B/C tiles. VB/VC: variable B/C read from shared memory (sBk/sCk point at the thread's
// first state of step 0; rows at bc_row(t, VS, np)); otherwise bs/cc hold the constants. For constant B with variable
// C, `cc` multiplies C (the folded B of upstream's convention, or 1).
template <bool VB, bool VC, int VS, bool kPrefetch>
__device__ __forceinline__ void steps(int tt, const float* dl_row, const float* du_row, const float* sBk,
                                      const float* sCk, int np, float* y_row, float (&h)[kS],
                                      const float (&a2)[kS], const float (&bs)[kS], const float (&cc)[kS],
                                      bool want_sum, float& dsum) {
  state_loop<kPrefetch>(tt, dl_row, du_row, y_row, h, a2, want_sum, dsum, [&](int t, int j, float (&bv)[kS], float (&cv)[kS]) {
    const int pad = bc_row(t, VS, np) - t * np;  // the same for the 4 steps (4 divides V)
    if constexpr (VB) {
      const float4 q = *reinterpret_cast<const float4*>(sBk + (t + j) * np + pad);
      bv[0] = q.x; bv[1] = q.y; bv[2] = q.z; bv[3] = q.w;
    } else {
#pragma unroll
      for (int s = 0; s < kS; ++s) bv[s] = bs[s];
    }
    if constexpr (VC) {
      const float4 q = *reinterpret_cast<const float4*>(sCk + (t + j) * np + pad);
      cv[0] = q.x; cv[1] = q.y; cv[2] = q.z; cv[3] = q.w;
      if constexpr (!VB) {
#pragma unroll
        for (int s = 0; s < kS; ++s) cv[s] *= cc[s];
      }
    } else {
#pragma unroll
      for (int s = 0; s < kS; ++s) cv[s] = cc[s];
    }
  });
}

// steps() with its variable-B/C form chosen at run time (uniform across the block).
template <int VS, bool kPrefetch>
__device__ __forceinline__ void steps_any(bool var_B, bool var_C, int tt, const float* dl_row, const float* du_row,
                                          const float* sBk, const float* sCk, int np, float* y_row, float (&h)[kS],
                                          const float (&a2)[kS], const float (&bs)[kS], const float (&cc)[kS],
                                          bool want_sum, float& dsum) {
  if (var_B) {
    if (var_C) steps<true, true, VS, kPrefetch>(tt, dl_row, du_row, sBk, sCk, np, y_row, h, a2, bs, cc, want_sum, dsum);
    else steps<true, false, VS, kPrefetch>(tt, dl_row, du_row, sBk, sCk, np, y_row, h, a2, bs, cc, want_sum, dsum);
  } else {
    if (var_C) steps<false, true, VS, kPrefetch>(tt, dl_row, du_row, sBk, sCk, np, y_row, h, a2, bs, cc, want_sum, dsum);
    else steps<false, false, VS, kPrefetch>(tt, dl_row, du_row, sBk, sCk, np, y_row, h, a2, bs, cc, want_sum, dsum);
  }
}

// Variable B and C of a 16-bit itype, kept raw in one tile: the entry of (step t, thread k of a channel) is 16 bytes,
// the thread's 4 states of B then of C, at entry pk_entry(t, tpc) + k. Why: the state loop is bound by shared-memory
// wavefronts as much as by the exponentials (a warp's 16-byte read of its 4 threads' entries took 4 wavefronts in ncu,
// for 64 distinct bytes), and one read a step instead of two (B, C as floats) halves them for 8 integer instructions (the roofline's L3 bcpack: -8%).
// Each 8-step group of entries starts two entries after the previous group's end: a warp's 16-bit staging stores
// (4 groups x 2 entries of states at tpc 4) then fall on 8 different banks instead of sharing 2 (a 4-way conflict).
__device__ __forceinline__ int pk_entry(int t, int tpc) { return t * tpc + (t >> 3) * 2; }
static_assert((32 / 8) * 2 * 4 <= kBcPad, "the packed tile's group shift fits the B/C tile's padding (floats)");

// The compute phase for variable B and C in the packed tile (pk: the thread's entry of step 0; tt a multiple of 8 from
// a group start).
template <typename T, bool kPrefetch>
__device__ __forceinline__ void steps_packed(int tt, const float* dl_row, const float* du_row, const uint4* pk, int tpc,
                                             float* y_row, float (&h)[kS], const float (&a2)[kS], bool want_sum,
                                             float& dsum) {
  // kPrefetch: the next group's first entry is read with this group's last (before the y store, see state_loop); past
  // the last group it reads the tile's padding, unused.
  uint4 next{};
  if constexpr (kPrefetch) next = pk[0];
  state_loop<kPrefetch>(tt, dl_row, du_row, y_row, h, a2, want_sum, dsum, [&](int t, int j, float (&bv)[kS], float (&cv)[kS]) {
    float v[2 * kS];  // the entry as raw itype values: B's 4 states, then C's
    uint4 raw;
    if (kPrefetch && j == 0) raw = next;
    else raw = pk[pk_entry(t, tpc) + j * tpc];  // t + j is in t's 8-step group
    if (kPrefetch && j == 3) next = pk[pk_entry(t + 4, tpc)];
    unpack16<T>(raw, v);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      bv[s] = v[s];
      cv[s] = v[kS + s];
    }
  });
}

// The fields of a serving call's sequence (Seq) the kernel reads, in static shared memory. init and fin: its start and
// end states, at element d * s[1] + n * s[2] with the strides of ssm_states for a pool, else of h0 and last_state.
struct SeqFields {
  int64_t row, t0, len, xc0;
  const float* init;
  float* fin;
  int skip;
  int64_t ctx, block;  // block mode: the context and the block size (0: no block mode)
};
// Block mode: a sequence this instance leaves to the warp-scan kernel's unaligned instance (blocks_aligned_ctx,
// kernels/common/serving.cuh).
constexpr int kSeqOther = -1;

// The copy-engine instance's tensor maps (src/cuda/tile_map.h, fwd_tile_map_specs), in its slot order; the other
// instances take an empty parameter in their place.
struct TileMaps {
  cuda::TileMap m[cuda::kFwdTileMaps];
};
struct NoTileMaps {};
// Fills tm for the call; false where the driver cannot encode a map the kernel would read (the plan's
// fwd_copy_engine checked everything else), so that the call takes the cp.async slots instead.
inline bool tile_maps(const Problem& p, TileMaps* tm) {
  cuda::TileMapSpec specs[cuda::kFwdTileMaps];
  cuda::fwd_tile_map_specs(p, specs);
  return cuda::encode_tile_maps(tm->m, specs);
}

// MINB: the launch-bounds occupancy hint, 3 (up to 168 registers), 4 (128, no spills) or 5 (96, spills outside the
// state loop); which one serves a grid is a rule of the kernel choice (src/cuda/select.cpp, kFwdTsRoomyWarpsPerSm and
// kFwdTsManyWarpsPerSm).
// kPackBC: the instance for dense calls of a 16-bit itype with variable B and C (steps_packed); an instance of its
// own, since the float B/C paths beside it in one kernel cost the 128-register variant spills in the tile loop.
// kTma: the slots instance's copy-engine form (src/cuda/select.cpp, fwd_copy_engine), an instance of its own so that
// the cp.async form keeps its register allocation: in sm_90 code every slot row set of the next tile (u, delta, B,
// C) and this tile's z arrives as one tensor-map box, whose rows (32 channels or N states of 32 steps, 16-bit) are
// the 16-byte slots of the block's 128 threads in thread order; no copy instructions, address arithmetic or tail
// tests on the threads (zeros past L and D come from the engine). In code for other archs it is a stub, never
// launched.
template <typename T, int MINB, bool kServing, int kBlocks = kNoBlocks, bool kPackBC = false, bool kTma = false>
__global__ void __launch_bounds__(kMaxThreads, MINB)
    fwd_ts_kernel(const Problem p, const Cfg cfg, const __grid_constant__ std::conditional_t<kTma, TileMaps, NoTileMaps> tm) {
  static_assert(kBlocks == kNoBlocks || (kServing && kBlocks == kBlocksAligned), "block mode: serving, aligned");
  static_assert(!kPackBC || (sizeof(T) == 2 && !kServing), "the packed B/C tile: dense calls, 16-bit itypes");
  static_assert(!kTma || (kPackBC && MINB == cuda::fwd_ts::kMinBlocksMany), "the copy engine fills the slots instance's slots");
#if defined(SELSCAN_TILE_COPIES) && __CUDA_ARCH__ == 900
  constexpr bool kTmaOn = kTma;
#else
  constexpr bool kTmaOn = false;
#endif
  if constexpr (kTma && !kTmaOn) {
    __trap();
    return;
  }
  constexpr int V = Vec16<T>::kElems;  // itype elements per 16-byte vector
  // The 16-bit variant at MINB 4 (128 registers) is register-starved: the branch-free softplus (more live values while
  // 8 are converted) and the B/C group shift (an address term in the state loop) each measured slower there, while
  // the other variants gained from both. So it keeps the serial softplus and no shift. The packed instance has the
  // registers for the branch-free one (no spills) and measured faster with it (validation/optimisation-log.md).
  constexpr bool kLean = sizeof(T) == 2 && MINB == 4 && !kPackBC;
  constexpr int VS = kLean ? 0 : (V == 8 ? 3 : 2);  // log2(V), or 0: no B/C group shift
  // state_loop's early reads where there are registers to spare; not for fp16, whose packed instance measured
  // slower with them (+0.4% on 8x1536x2048:16 where bf16 gained 3.7%, run 121/122).
  constexpr bool kPrefetch = MINB == cuda::fwd_ts::kMinBlocksRoomy && !std::is_same_v<T, __half>;
  // kAsync: the next tile's raw inputs (and this tile's z) travel by cp.async into per-thread shared slots instead of
  // registers held across the tile's recurrence (the same thread reads its own slots back, so no barrier), and this
  // tile's raw u waits there for the epilogue: 24 registers fewer across the state loop. Which instances: raw_slots
  // (src/cuda/plans.h), whose shared memory the plan sizes for them.
#ifdef __CUDA_ARCH__
  constexpr bool kAsync =
      cuda::fwd_ts::raw_slots(MINB, kServing, kPackBC, cuda::fwd_ts::slot_arch(__CUDA_ARCH__ / 10));
#else
  constexpr bool kAsync = false;  // the host pass compiles no kernel code
#endif
  static_assert(V == 8 || V == 4, "16-byte vectors of 2- or 4-byte elements");
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);

  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  // The packed instance serves 4 threads a channel only (kernels/fwd/launch.cuh): a compile-time pitch gives the
  // state loop's reads immediate offsets and unrolls the epilogue's partial sums.
  const int TPC = kPackBC ? cuda::fwd_ts::kPackedTpc : cfg.tpc, CH = cfg.ch, TT = cfg.tt;
  const int NP = TPC * kS;     // padded states
  const int ROW = TT + 4;
  const int64_t N = p.dstate;
  const int64_t cpg = p.dim / p.groups;
  int64_t blk = blockIdx.x;
  const int64_t tile = blk % cfg.tiles_per_group;
  blk /= cfg.tiles_per_group;
  const int64_t g = blk % p.groups;
  const int64_t b = blk / p.groups;
  const int64_t c0 = tile * CH;  // first channel of the block within the group
  const int nch = static_cast<int>(cpg - c0 < CH ? cpg - c0 : CH);
  bool var_B = p.var_B, var_C = p.var_C, fold_B = p.fold_B;
  if constexpr (kPackBC) {  // the packed instance serves variable B and C only (kernels/fwd/launch.cuh)
    var_B = var_C = true;
    fold_B = false;
  }
  // The sequence's length: a dense call's seqlen (a kernel parameter), a serving call's read from shared memory.
  __shared__ SeqFields sq;
  const int64_t L = p.seqlen;
  const auto len = [&]() -> int64_t {
    if constexpr (kServing) return sq.len;
    else return L;
  };
  const bool pool = p.ssm_states.p != nullptr;
  if constexpr (kServing) {
    const auto keep = [&](const Seq& s) {
      sq = SeqFields{s.row, s.t0, s.len, s.xc0, static_cast<const float*>(s.init.p), static_cast<float*>(s.fin.p),
                     s.skip, s.ctx, s.block};
    };
    if constexpr (kBlocks == kNoBlocks) {
      if (tid == 0) keep(seq_of<false, false>(p, b));
    } else if (tid < 32) {  // block mode's lookup checks the sequence's table entries across a warp
      if (!blocks_aligned_ctx(p, b, cuda::fwd_warp::kItemsReal)) {
        if (tid == 0) sq.skip = kSeqOther;
      } else {
        const Seq s = seq_of<false, true>(p, b);
        if (tid == 0) keep(s);
      }
    }
    __syncthreads();
    if (sq.skip == kSeqOther) return;  // the whole block: no barrier below is reached
    if (sq.skip != kSeqRun) {  // padding (0) or a slot outside the pool (NaN): no scan, no slot touched
      // The whole block skips (one sequence): no thread reaches a barrier below.
      const float fill = sq.skip == kSeqPad ? 0.f : __int_as_float(0x7fffffff);
      const int64_t fs1 = pool ? p.ssm_states.s[1] : p.last_state.s[1];
      const int64_t fs2 = pool ? p.ssm_states.s[2] : p.last_state.s[2];
      for (int c = 0; c < nch; ++c) {
        const int64_t dc = g * cpg + c0 + c;
        T* o = static_cast<T*>(p.out.p) + sq.row * p.out.s[0] + dc * p.out.s[1] + sq.t0;
        T* oz = p.z.p != nullptr ? static_cast<T*>(p.out_z.p) + sq.row * p.out_z.s[0] + dc * p.out_z.s[1] + sq.t0
                                 : nullptr;
        for (int64_t t = tid; t < sq.len; t += nthreads) {
          o[t] = from_f32<T>(fill);
          if (oz != nullptr) oz[t] = from_f32<T>(fill);
        }
        if (sq.fin != nullptr)  // last_state's row (cache_indices without a pool), else none
          for (int64_t n = tid; n < N; n += nthreads) sq.fin[dc * fs1 + n * fs2] = fill;
      }
      return;
    }
  }

  float* sDl = smem;                  // [CH][ROW]
  float* sDu = sDl + CH * ROW;        // [CH][ROW]
  float* sB = sDu + CH * ROW;         // [TT][NP], row t at bc_row(t, VS, NP)
  const int BCT = TT * NP + kBcPad;  // floats per B/C tile
  float* sC = sB + (var_B ? BCT : 0);
  float* sY = sC + (var_C ? BCT : 0);  // [threads][ROW]
  float* sUD = sY + nthreads * ROW;        // [CH][ROW]: D u, the skip term of y
  // kAsync: [kRawSlots][threads] 16-byte slots: the next tile's u, delta, B, C; this tile's z and u.
  // 16-bit instances never use sUD (their D u comes from the raw u), so their slots start there.
  uint4* sRaw = reinterpret_cast<uint4*>(sizeof(T) == 4 ? sUD + CH * ROW : sUD);
  if constexpr (kTmaOn) {  // the boxes land on 128 bytes (the plan's kTmaSlack); offset from sRaw, so that the
                           // compiler still sees a shared-memory pointer
    const unsigned a = smem_addr(sRaw);
    sRaw = reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(sRaw) + (((a + 127u) & ~127u) - a));
  }
  __shared__ uint64_t tma_bar;  // kTma: one phase a tile (the boxes issued after its first barrier)
  if constexpr (kTmaOn)
    if (tid == 0) mbar_init(&tma_bar);  // the barrier below makes it the block's
  const auto slot = [&](int i) -> uint4* { return sRaw + i * nthreads + tid; };

  // ---- compute role: channel cc of the block, states n = k*kS + s
  const int cc = tid / TPC, k = tid % TPC;
  const bool cactive = cc < nch;
  const int64_t d = g * cpg + c0 + (cactive ? cc : 0);
  float a2[kS], bs[kS], cf[kS], h[kS], prun[kS];
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const int64_t n = static_cast<int64_t>(k) * kS + s;
    const bool ok = n < N;
    a2[s] = ok ? __ldg(static_cast<const float*>(p.A.p) + d * p.A.s[0] + n * p.A.s[1]) * kLog2e : 0.f;
    const float Bc = (ok && !var_B) ? __ldg(static_cast<const float*>(p.B.p) + d * p.B.s[0] + n * p.B.s[1]) : 0.f;
    const float Cc = (ok && !var_C) ? __ldg(static_cast<const float*>(p.C.p) + d * p.C.s[0] + n * p.C.s[1]) : 0.f;
    // fold_B (constant B, no h0): the scan runs without B, which joins the output coefficient.
    bs[s] = var_B ? 0.f : (fold_B ? (ok ? 1.f : 0.f) : Bc);
    if (var_C) cf[s] = var_B ? 1.f : (fold_B ? Bc : 1.f);
    else cf[s] = (fold_B ? Bc * Cc : Cc);
    if constexpr (kServing)  // a pool slot too goes through the read-only path: only this thread writes it, at the end
      h[s] = (ok && sq.init != nullptr)
                 ? __ldg(sq.init + d * (pool ? p.ssm_states.s[1] : p.h0.s[1]) + n * (pool ? p.ssm_states.s[2] : p.h0.s[2]))
                 : 0.f;
    else
      h[s] = (ok && p.h0.p != nullptr)
                 ? __ldg(static_cast<const float*>(p.h0.p) + b * p.h0.s[0] + d * p.h0.s[1] + n * p.h0.s[2])
                 : 0.f;
    prun[s] = 1.f;
  }
  // Padded state columns of the B/C tiles stay 0 (staging writes only n < N).
  for (int i = tid; i < (var_B ? BCT : 0) + (var_C ? BCT : 0); i += nthreads) sB[i] = 0.f;
  __syncthreads();

  // ---- stage / epilogue role: thread tid owns 16-byte vector tid of the [CH][TT] u/delta tile (row qc, steps
  // qt..) and of the [N][TT] B/C tiles (row qn = qc, the same steps). Row pointers are recomputed per use:
  // registers are the scarce resource here, not integer arithmetic.
  const int vpr = TT / V;  // vectors per row
  const int qc = tid / vpr, qt = (tid % vpr) * V;
  const bool vact = tid < CH * vpr && qc < nch;
  const int64_t dq = g * cpg + c0 + (vact ? qc : 0);
  const bool has_z = p.z.p != nullptr;
  const auto row = [&](const View& v) {
    if constexpr (kServing) return sq.row * v.s[0] + dq * v.s[1] + sq.t0;
    else return b * v.s[0] + dq * v.s[1];
  };
  const T* u_row = static_cast<const T*>(p.u.p) + row(p.u);
  const T* dt_row = static_cast<const T*>(p.delta.p) + row(p.delta);
  const bool vec_in = aligned16(u_row) && aligned16(dt_row);
  const float Dd = (p.D.p != nullptr) ? __ldg(static_cast<const float*>(p.D.p) + dq * p.D.s[0]) : 0.f;
  const float dbias = (p.delta_bias.p != nullptr) ? __ldg(static_cast<const float*>(p.delta_bias.p) + dq * p.delta_bias.s[0]) : 0.f;
  const int qn = qc;  // the same vector index, read as a state row of the B/C tiles
  const bool bact = qn < N;
  const auto bc_base = [&](const View& v) {
    if constexpr (kServing) return sq.row * v.s[0] + g * v.s[1] + qn * v.s[2] + sq.t0;
    else return b * v.s[0] + g * v.s[1] + qn * v.s[2];
  };
  const T* B_row = (var_B && bact) ? static_cast<const T*>(p.B.p) + bc_base(p.B) : nullptr;
  const T* C_row = (var_C && bact) ? static_cast<const T*>(p.C.p) + bc_base(p.C) : nullptr;

  // kLeanStaging: the staging below with the chunk sum staged (kStageSum), one end test a vector and one a tile; not
  // in the MINB 3 instances, which keep the staging they were tuned with: theirs is on the latency-bound path, and
  // these changes measured slower there (+0.6..+1.1% on 8x1536x2048:16 bf16 and fp32, H100 run 139), where the
  // 5-blocks packed instance gained 2.3%.
  constexpr bool kLeanStaging = MINB != cuda::fwd_ts::kMinBlocksRoomy;
  // x's decay products need each chunk's sum of delta'. kStageSum: the staging threads add up the values they convert,
  // once per (channel, step), instead of each of a channel's TPC threads in its state loop (4-6 instructions per 16
  // state updates), into a running sum per staging thread kept in the padding of the channel's delta' and delta'u rows
  // (vpr <= 8 slots: 4 floats after each row's TT steps), which the compute threads add up at a chunk's last tile. Not
  // in the MINB 4 instances with float B/C tiles, where it cost spill loads in the tile loop (ptxas, sm_90).
  constexpr bool kStageSum = kLeanStaging && (MINB != cuda::fwd_ts::kMinBlocksFew || kPackBC);
  const bool want_x = p.x.p != nullptr;
  float* const ssum = sDl + (qt / V >= 4 ? CH * ROW : 0) + qc * ROW + TT + (qt / V) % 4;

  // Where the epilogue finds D u: fp16/bf16 keep the raw u vector in registers (4 registers); fp32 stages D u in
  // shared memory. Each measured faster for its itype, through register allocation rather than by instruction count.
  constexpr bool kUdInSmem = sizeof(T) == 4;
  uint4 ru, rdt, rB, rC, rz, ru_cur;  // the next tile's inputs (loaded during this tile's compute); z, u of this one
  // kAsync: one 16-byte vector of a row into slot i, by cp.async when it is aligned and inside the sequence (`vec`
  // says both with kLeanStaging, only the first without), else read and stored here.
  const auto to_slot = [&](int i, const T* row, int64_t t, bool vec) {
    if (vec && (kLeanStaging || t + V <= len())) cp_async16(slot(i), row + t);
    else *slot(i) = load_row16<T, kServing>(row, t, len(), false);
  };
  // kLeanStaging: the vectors a thread loads for a tile share their steps, so one 64-bit test says whether they lie
  // inside the sequence (the loads test it again only on the element path).
  const auto prefetch = [&](int64_t t0) {
    const bool whole = !kLeanStaging || t0 + qt + V <= len();
    if constexpr (kAsync) {
      if (vact) {
        to_slot(0, u_row, t0 + qt, vec_in && whole);
        to_slot(1, dt_row, t0 + qt, vec_in && whole);
      }
      if (B_row != nullptr) to_slot(2, B_row, t0 + qt, whole && aligned16(B_row));
      if (C_row != nullptr) to_slot(3, C_row, t0 + qt, whole && aligned16(C_row));
      cp_async_commit();
      return;
    }
    if (vact) {
      ru = load_row16<T, kServing>(u_row, t0 + qt, len(), vec_in && whole);
      rdt = load_row16<T, kServing>(dt_row, t0 + qt, len(), vec_in && whole);
    }
    if (B_row != nullptr) rB = load_row16<T, kServing>(B_row, t0 + qt, len(), whole && aligned16(B_row));
    if (C_row != nullptr) rC = load_row16<T, kServing>(C_row, t0 + qt, len(), whole && aligned16(C_row));
  };
  // kTma: one phase's boxes: the tile at t_next's u, delta, B and C (when `next`) and z at t_z (when `with_z`), each
  // into its slot row set. Lane 0 of warp w asks for boxes w, w + 4, ... of those; warp 0 also posts the phase's
  // bytes (boxes may land before that: the phase completes once the arrival is in and the byte count is back at 0).
  const auto tma_issue = [&](int64_t t_next, bool next, int64_t t_z, bool with_z) {
    if constexpr (kTmaOn) {
      if ((tid & 31) != 0 || !(next || with_z)) return;
      constexpr unsigned kRowBytes = cuda::fwd_ts::kTmaTt * sizeof(T);
      const int w = tid >> 5, nw = nthreads >> 5;
      const unsigned ch = static_cast<unsigned>(CH), ns = static_cast<unsigned>(N);
      if (w == 0) mbar_arrive_expect(&tma_bar, ((next ? 2 * (ch + ns) : 0u) + (with_z ? ch : 0u)) * kRowBytes);
      const int y = static_cast<int>(g * cpg + c0), bb = static_cast<int>(b), gg = static_cast<int>(g);
      for (int j = w; j < 5; j += nw) {
        if (j < 4 ? !next : !with_z) continue;
        void* dst = sRaw + j * nthreads;
        if (j == 2 || j == 3)
          tile_load(dst, &tm.m[j], static_cast<int>(t_next), 0, gg, bb, &tma_bar);
        else
          tile_load(dst, &tm.m[j], static_cast<int>(j < 4 ? t_next : t_z), y, bb, &tma_bar);
      }
    }
  };
  // The slots of the tile staged next have landed (kTma: the phase of parity ph).
  const auto slots_landed = [&](unsigned ph) {
    if constexpr (kTmaOn) mbar_wait(&tma_bar, ph);
    else cp_async_wait_all();
  };
  const auto stage = [&](int64_t t0, unsigned ph) {
    if constexpr (kAsync) {
      slots_landed(ph);
      if (vact) {
        ru = *slot(0);
        rdt = *slot(1);
      }
      if (B_row != nullptr) rB = *slot(2);
      if (C_row != nullptr) rC = *slot(3);
    }
    if (vact) {
      float uu[V], dl[V], du[V];
      unpack16<T>(ru, uu);
      unpack16<T>(rdt, dl);
      // Steps of the vector inside the sequence (at most V, negative past it): with kLeanStaging one 64-bit test a
      // vector, not one an element.
      const int64_t left = len() - t0 - qt;
      const int rem = left < V ? static_cast<int>(left) : V;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float v = dl[j] + dbias;
        if (p.softplus) v = kLean ? softplus_serial(v) : softplus(v);
        const bool past = kLeanStaging ? j >= rem : t0 + qt + j >= len();
        if (past) v = 0.f;  // past the end: the identity step (a = 1, b̄ = 0)
        dl[j] = v;
        du[j] = v * uu[j];
      }
      if (kStageSum && want_x) {
        float part[V / 2];
#pragma unroll
        for (int j = 0; j < V / 2; ++j) part[j] = dl[2 * j] + dl[2 * j + 1];
        float sum = part[0] + part[1];
        if constexpr (V == 8) sum += part[2] + part[3];
        *ssum = t0 % kChunk == 0 ? sum : *ssum + sum;  // a chunk's first tile starts the sum
      }
#pragma unroll
      for (int j = 0; j < V; j += 4) {
        const int o = qc * ROW + qt + j;
        *reinterpret_cast<float4*>(sDl + o) = make_float4(dl[j], dl[j + 1], dl[j + 2], dl[j + 3]);
        *reinterpret_cast<float4*>(sDu + o) = make_float4(du[j], du[j + 1], du[j + 2], du[j + 3]);
        if constexpr (kUdInSmem)
          *reinterpret_cast<float4*>(sUD + o) = make_float4(Dd * uu[j], Dd * uu[j + 1], Dd * uu[j + 2], Dd * uu[j + 3]);
      }
      if constexpr (!kUdInSmem) {
        if constexpr (kAsync) *slot(5) = ru;
        else ru_cur = ru;
      }
    }
    if constexpr (kPackBC) {
      if (B_row != nullptr) {  // C_row too (both variable, the same state row)
        unsigned short* const e16 = reinterpret_cast<unsigned short*>(sB) + qn % kS;
        const uint32_t wb[4] = {rB.x, rB.y, rB.z, rB.w}, wc[4] = {rC.x, rC.y, rC.z, rC.w};
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const int e = (pk_entry(qt + j, TPC) + qn / kS) * 8;  // 8 halves an entry: 4 of B, then 4 of C
          e16[e] = static_cast<unsigned short>(wb[j / 2] >> (16 * (j % 2)));
          e16[e + kS] = static_cast<unsigned short>(wc[j / 2] >> (16 * (j % 2)));
        }
      }
      return;
    }
    float v[V];
    if (B_row != nullptr) {
      unpack16<T>(rB, v);
#pragma unroll
      for (int j = 0; j < V; ++j) sB[bc_row(qt, VS, NP) + j * NP + qn] = v[j];
    }
    if (C_row != nullptr) {
      unpack16<T>(rC, v);
#pragma unroll
      for (int j = 0; j < V; ++j) sC[bc_row(qt, VS, NP) + j * NP + qn] = v[j];
    }
  };

  const bool loop_sum = want_x && !kStageSum;  // the delta sum in the state loops
  const int64_t ntiles = (len() + TT - 1) / TT;
  float dsum = 0.f;
  // Block mode: the sequence offset of the next block end, a compare per 16-step piece rather than a 64-bit modulo.
  int64_t next_end = 0;
  if constexpr (kBlocks == kBlocksAligned) next_end = sq.block - sq.ctx % sq.block;
  // kTma's phases: the first tile's inputs are phase 0, those issued in iteration `it` phase it + 1.
  if constexpr (kTmaOn) tma_issue(0, true, 0, false);
  else prefetch(0);
  stage(0, 0u);
  for (int64_t it = 0; it < ntiles; ++it) {
    const int64_t t0 = it * TT;
    const unsigned ph = static_cast<unsigned>(it + 1) & 1u;
    __syncthreads();  // the staged tile is visible; the previous epilogue is done with sY
    if constexpr (kTmaOn) tma_issue(t0 + TT, it + 1 < ntiles, t0, has_z);
    else if (it + 1 < ntiles) prefetch(t0 + TT);
    if (!kTmaOn && has_z && vact) {
      const T* z_row = static_cast<const T*>(p.z.p) + row(p.z);
      if constexpr (kAsync) {
        to_slot(4, z_row, t0 + qt, aligned16(z_row));
        cp_async_commit();
      } else {
        rz = load_row16<T, kServing>(z_row, t0 + qt, len(), aligned16(z_row));
      }
    }
    if (cactive) {
      const float* dl_row = sDl + cc * ROW;
      const float* du_row = sDu + cc * ROW;
      const float* sBk = sB + k * kS;
      const float* sCk = sC + k * kS;
      float* y_row = sY + tid * ROW;
      if constexpr (kBlocks == kBlocksAligned) {
        // The tile runs in pieces of 16 steps, and a block ending with a piece strictly inside the sequence leaves
        // its states in the slot its table entry names (unless pad_slot_id). Block ends fall on piece ends: the
        // context and the block size are multiples of 16 here (src/cuda/select.cpp). Pieces rather than 16-step
        // tiles: those doubled the tile barriers, a third of the stalls (validation/optimisation-log.md).
        constexpr int kPiece = cuda::fwd_warp::kItemsReal;
        for (int t_in = 0; t_in < TT; t_in += kPiece) {
          const int bo = bc_row(t_in, VS, NP);  // the B/C group shift is additive over whole groups
          steps_any<VS, kPrefetch>(var_B, var_C, kPiece, dl_row + t_in, du_row + t_in, sBk + bo, sCk + bo, NP, y_row + t_in, h, a2,
                        bs, cf, loop_sum, dsum);
          const int64_t pend = t0 + t_in + kPiece;
          if (pend == next_end) {
            next_end += sq.block;
            if (pend >= sq.len) continue;  // the sequence's own end: its final state goes out below
            const int64_t slot = table_entry(p, b, (sq.ctx + pend) / sq.block - 1);
            if (slot != p.pad_slot_id) {
              // Spelled out rather than state_row(), whose View copy cost this instance spills (ptxas).
              float* row = static_cast<float*>(p.ssm_states.p) + slot * p.ssm_states.s[0] + d * p.ssm_states.s[1];
#pragma unroll
              for (int s = 0; s < kS; ++s) {
                const int64_t n = static_cast<int64_t>(k) * kS + s;
                if (n < N) row[n * p.ssm_states.s[2]] = h[s];
              }
            }
          }
        }
      } else if constexpr (kPackBC) {  // the tile in one piece
        steps_packed<T, kPrefetch>(TT, dl_row, du_row, reinterpret_cast<const uint4*>(sB) + k, TPC, y_row, h, a2, loop_sum, dsum);
      } else {
        steps_any<VS, kPrefetch>(var_B, var_C, TT, dl_row, du_row, sBk, sCk, NP, y_row, h, a2, bs, cf, loop_sum, dsum);
      }
      const int64_t tend = t0 + TT;
      if (want_x && (tend % kChunk == 0 || tend >= len())) {
        // x[b, d, chunk] = (P, H): P the product of the decays since t = 0, H the scanned state; a packed sequence's
        // chunks from its own slot xc0 of row 0 on.
        float* xr;
        if constexpr (kServing)
          xr = static_cast<float*>(p.x.p) + sq.row * p.x.s[0] + d * p.x.s[1] + (sq.xc0 + t0 / kChunk) * p.x.s[2];
        else
          xr = static_cast<float*>(p.x.p) + b * p.x.s[0] + d * p.x.s[1] + (t0 / kChunk) * p.x.s[2];
        if constexpr (kStageSum) {  // the running sums of the channel's staging threads (stage)
#pragma unroll 1
          for (int v = 0; v < TT / V; ++v) dsum += dl_row[(v >= 4 ? CH * ROW : 0) + TT + v % 4];
        }
#pragma unroll
        for (int s = 0; s < kS; ++s) {
          const int64_t n = static_cast<int64_t>(k) * kS + s;
          prun[s] *= exp2_fast(a2[s] * dsum);
          if (n < N) {
            xr[2 * n] = prun[s];
            xr[2 * n + 1] = h[s];
          }
        }
        dsum = 0.f;
      }
    }
    __syncthreads();  // sY complete; the tile's staged inputs are no longer read
    if (vact) {
      float y[V];
      if constexpr (kUdInSmem) {
#pragma unroll
        for (int j = 0; j < V; j += 4) {
          const float4 v = *reinterpret_cast<const float4*>(sUD + qc * ROW + qt + j);
          y[j] = v.x;
          y[j + 1] = v.y;
          y[j + 2] = v.z;
          y[j + 3] = v.w;
        }
      } else {
        if constexpr (kAsync) ru_cur = *slot(5);
        unpack16<T>(ru_cur, y);
#pragma unroll
        for (int j = 0; j < V; ++j) y[j] *= Dd;
      }
      for (int kk = 0; kk < TPC; ++kk) {
        const float* yr = sY + (qc * TPC + kk) * ROW + qt;
#pragma unroll
        for (int j = 0; j < V; j += 4) {
          const float4 v = *reinterpret_cast<const float4*>(yr + j);
          y[j] += v.x;
          y[j + 1] += v.y;
          y[j + 2] += v.z;
          y[j + 3] += v.w;
        }
      }
      T* out_row = static_cast<T*>(p.out.p) + row(p.out);
      store_row16<T, kServing>(out_row, t0 + qt, len(), aligned16(out_row), y);
      if (has_z) {
        T* oz_row = static_cast<T*>(p.out_z.p) + row(p.out_z);
        float zz[V];
        if constexpr (kAsync) {
          slots_landed(ph);  // z's group or phase (and the next tile's, issued with it)
          rz = *slot(4);
        }
        unpack16<T>(rz, zz);
#pragma unroll
        for (int j = 0; j < V; ++j) zz[j] = y[j] * silu(zz[j]);
        store_row16<T, kServing>(oz_row, t0 + qt, len(), aligned16(oz_row), zz);
      }
    }
    if (it + 1 < ntiles) stage(t0 + TT, ph);
  }

  if constexpr (kServing) {
    // last_state's row or the sequence's pool slot (serving calls have no fold_B)
    if (cactive && sq.fin != nullptr) {
      const int64_t fs1 = pool ? p.ssm_states.s[1] : p.last_state.s[1];
      const int64_t fs2 = pool ? p.ssm_states.s[2] : p.last_state.s[2];
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const int64_t n = static_cast<int64_t>(k) * kS + s;
        if (n < N) sq.fin[d * fs1 + n * fs2] = h[s];
      }
    }
  } else if (cactive && p.last_state.p != nullptr) {
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const int64_t n = static_cast<int64_t>(k) * kS + s;
      if (n >= N) continue;
      float hv = h[s];
      if (fold_B) hv *= __ldg(static_cast<const float*>(p.B.p) + d * p.B.s[0] + n * p.B.s[1]);  // true state = B H
      static_cast<float*>(p.last_state.p)[b * p.last_state.s[0] + d * p.last_state.s[1] + n * p.last_state.s[2]] = hv;
    }
  }
}

}  // namespace selscan::kern::fwd::ts
