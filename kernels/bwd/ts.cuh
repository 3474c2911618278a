// The thread-states backward, for real weights and dstate <= 16, in the forward's thread-states mapping
// (fwd/ts.cuh): every thread owns kS = 4 states of one channel and runs their recurrences sequentially in time, so
// there is no scan across threads. src/cuda/select.cpp says which calls it serves.
//
// Why: the warp-scan backward (warp.cuh) spends about 50 instructions per state update on scans, folds and
// per-state barriers. Here an update costs about 10 in the reverse sweep (ex2 argument, ex2, dh, ā dh, dA, dB,
// dC, the du/ddelta sums) plus about 4 for each forward recomputation, and a cross-channel reduction of
// variable dB/dC.
//
// Mapping: a block = (batch b, kCh = 32 consecutive channels of one group); warp k holds states 4k..4k+3 and lane
// c channel c (so a warp reads one B/C float4 per step, broadcast, and reduces dB/dC over its 32 lanes). Time
// runs chunk by chunk (the chunks of x) in reverse; per chunk:
//   pass A: from the chunk's seed (x of the previous chunk, h0 or 0) forward over the chunk, storing the state
//           at every kTT-step tile start in the workspace (only this block's current chunk: [grid][tiles][threads]);
//   pass B: tiles in reverse. Recompute the tile forward from its checkpoint keeping every step's state in
//           registers (kTT x kS), then sweep it backwards: dh = dout C + g, g = ā dh (the carry into the step
//           before), dA and constant dB/dC summed per tile in registers and then into per-thread shared-memory
//           sums (short fp32 chains at any L), the du/ddelta sums over the thread's states per step to shared
//           memory (summed over the block's warps in the epilogue), variable dB/dC per step through a
//           per-warp shared buffer summed over the 32 channels every four steps, then one float4 atomic per
//           (state, 4 steps) and block into the fp32 image (deterministic mode: a plain store into the image of
//           the block's channel tile; the conversion kernel adds the images in tile order).
// Inputs of a tile are copied raw into shared memory with cp.async while the previous tile computes, then
// converted once (softplus, the z gate, dz and out_z) by the thread that owns those (channel, 4 steps).
// Per-(b,d) partials of dA, constant dB/dC, dD and ddelta_bias go to the workspace like the warp-scan
// kernel's and are summed over batch by bwd_finish (reduce.cuh) in fixed order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../common/io.cuh"
#include "../common/math.cuh"
#include "cuda/plans.h"
#include "cuda/tile_map.h"
#include "problem.h"
#include "reduce.cuh"
#include "ts_maps.h"

namespace selscan::kern::bwd::ts {

using cuda::bwd_ts::kBcPitch;
using cuda::bwd_ts::kMaxTpc;
using cuda::bwd_ts::kS;
using cuda::bwd_ts::Layout;
using cuda::bwd_ts::layout;

// What the kernel reads of its plan (src/cuda/plans.h), at the parameter offsets it was tuned with: where these fields
// sat when the kernel took the whole backward plan after Args. The compiler's register allocation follows the offsets
// of the parameters a kernel reads (a tidier layout compiled to a different SASS), so the unused bytes stay until a
// layout change is measured.
struct Shape {
  unsigned char unused0_[116];
  int tpc;        // warps per block (threads per channel)
  int unused1_;
  int ntc;        // tiles per chunk
  int64_t tiles;  // channel tiles per group
  int64_t items;  // work items (b, g, tile)
  unsigned char unused2_[24];
};
static_assert(offsetof(Shape, tpc) == 116 && offsetof(Shape, ntc) == 124 && offsetof(Shape, tiles) == 128 &&
                  offsetof(Shape, items) == 136 && sizeof(Shape) == 168,
              "the parameter offsets the kernel was tuned with");
inline Shape shape_of(const cuda::bwd_ts::Plan& pl) {
  Shape s{};
  s.tpc = pl.tpc;
  s.ntc = pl.ntc;
  s.tiles = pl.tiles;
  s.items = pl.items;
  return s;
}

using cuda::bwd_ts::kTmaStaticSmem;
static_assert(8 + 4 * kCh * kMaxTpc <= kTmaStaticSmem, "the copy-engine instance's static shared memory");

// The raw tiles' tensor maps, in cuda::bwd_tile_map_specs's slots (src/cuda/tile_map.h). Unused ones stay zero.
struct TileMaps {
  cuda::TileMap m[cuda::kBwdTileMaps];
};
// Fills tm for the call; false where the driver cannot encode a map the kernel would read (the plan's
// bwd_copy_engine checked everything else), so that the call copies by cp.async instead.
inline bool tile_maps(const Problem& p, TileMaps* tm) {
  cuda::TileMapSpec specs[cuda::kBwdTileMaps];
  cuda::bwd_tile_map_specs(p, specs);
  return cuda::encode_tile_maps(tm->m, specs);
}

// 4 consecutive itype values of a raw shared-memory row as floats.
template <typename T>
__device__ __forceinline__ void raw4(const unsigned char* q, float (&o)[4]) {
  if constexpr (sizeof(T) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(q);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(q);
    const uint4 w = make_uint4(v.x, v.y, 0u, 0u);
    float f[8];
    unpack16<T>(w, f);
    o[0] = f[0]; o[1] = f[1]; o[2] = f[2]; o[3] = f[3];
  }
}

// 4 values into a row at time t (t a multiple of 4): one vector store when aligned and inside L; else per element.
template <typename T>
__device__ __forceinline__ void store4(T* row, int64_t t, int64_t L, const float (&v)[4]) {
  T* q = row + t;
  if (t + 4 <= L && (reinterpret_cast<uintptr_t>(q) & (4 * sizeof(T) - 1)) == 0) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(q) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      float f[8] = {v[0], v[1], v[2], v[3], 0.f, 0.f, 0.f, 0.f};
      const uint4 w = pack16<T>(f);
      *reinterpret_cast<uint2*>(q) = make_uint2(w.x, w.y);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (t + j < L) q[j] = from_f32<T>(v[j]);
}

__device__ __forceinline__ float4 ld4(const float* q) { return *reinterpret_cast<const float4*>(q); }
__device__ __forceinline__ void st4(float* q, const float (&v)[4]) {
  *reinterpret_cast<float4*>(q) = make_float4(v[0], v[1], v[2], v[3]);
}

// kTmaCopies: the instance that copies raw tiles with the copy engine (sm_90 code; launched where the plan chose it,
// src/cuda/select.cpp's bwd_copy_engine, and tile_maps succeeded). An instance of its own, so that the other keeps
// its register allocation and this one carries no cp.async path.
template <typename T, bool kTmaCopies>
__global__ void __launch_bounds__(kCh * kMaxTpc, 3) bwd_ts_kernel(const Args args, const Shape pl, float4* ck,
                                                                 const __grid_constant__ TileMaps tm) {
  constexpr int isz = static_cast<int>(sizeof(T));
  constexpr int VE = 16 / isz;   // itype elements per 16-byte chunk
  constexpr int QPR = kTT / VE;  // chunks per raw tile row
  constexpr int kGrp = kTT / 4;  // groups of 4 steps per tile row
  constexpr float kLn2 = 0.6931471805599453f;
  const Problem& p = args.p;
  extern __shared__ __align__(128) float4 smem4[];  // 128: the copy engine's boxes land at raw (lay.raw: 1024-aligned)
  float* sm = reinterpret_cast<float*>(smem4);
  const int TPC = pl.tpc, NT = kCh * TPC, NP = TPC * kS;
  const Layout lay = layout(TPC, isz);
  float* sDl = sm + lay.dl;
  float* sDu = sm + lay.du;
  float* sDt = sm + lay.dt;
  float* sU = sm + lay.u;
  float* sSp = sm + lay.sp;
  float* sB = sm + lay.sB;
  float* sC = sm + lay.sC;
  float* sGu = sm + lay.gu;
  float* sAq = sm + lay.aq;
  float* sDB = sm + lay.dB;
  float* sDC = sm + lay.dC;
  float* sE = sm + lay.eD;
  unsigned char* raw = reinterpret_cast<unsigned char*>(sm + lay.raw);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, k = tid >> 5;
  float* red = sm + lay.red + k * kRedWarp;
  float* myacc = sm + lay.acc + tid * kS;  // [3][NT][kS]: constant-B, constant-C and dA sums of this thread, one
                                           // tile's partial added per tile (short fp32 chains at any L)
  const int64_t L = p.seqlen, N = p.dstate, G = p.groups, D = p.dim, Bt = p.batch;
  const int64_t cpg = D / G;
  const bool varB = p.var_B, varC = p.var_C;
  const bool hasZ = p.z.p != nullptr, hasOz = hasZ && p.out_z.p != nullptr;
  float4* myck = ck + static_cast<int64_t>(blockIdx.x) * pl.ntc * NT + tid;  // [tile][NT]

  // Raw tiles by the copy engine (the kTmaCopies instance, sm_90 code; the host filled tm): one lane a warp asks for
  // whole boxes, one per tensor and tile (channel rows in channel order, zeros past L and D), completing on tma_bar,
  // instead of every thread issuing 16-byte cp.async copies with their address arithmetic and tests. Each thread
  // keeps the barrier's phase parity in its own shared word, not in a register across the sweep (all are taken).
#if defined(SELSCAN_TILE_COPIES) && __CUDA_ARCH__ == 900
  constexpr bool kTma = kTmaCopies;
#else
  constexpr bool kTma = false;
#endif
  // In code for other archs the copy-engine instance is a stub, never launched: the host launches it only where the
  // device runs sm_90 code. Its work loop has no items, so the compiler drops the body.
  constexpr bool kStub = kTmaCopies && !kTma;
  if constexpr (kStub) __trap();
  __shared__ uint64_t tma_bar;
  __shared__ unsigned tma_parity[kCh * kMaxTpc];
  if constexpr (kTma) {
    if (tid == 0) mbar_init(&tma_bar);
    tma_parity[tid] = 0;
    __syncthreads();
  }

  // Padded state columns (n >= N) of sB/sC stay 0: staging writes only n < N.
  for (int i = tid; i < 2 * kTT * kBcPitch; i += NT) sB[i] = 0.f;  // sB and sC are adjacent

  for (int64_t item = blockIdx.x; item < (kStub ? 0 : pl.items); item += gridDim.x) {
    const int64_t tile = item % pl.tiles;
    const int64_t g = (item / pl.tiles) % G;
    const int64_t b = item / (pl.tiles * G);
    const int64_t c0 = g * cpg + tile * kCh;  // first channel of the block
    const int nch = static_cast<int>(cpg - tile * kCh < kCh ? cpg - tile * kCh : kCh);
    const bool cact = lane < nch;
    const int64_t d = c0 + (cact ? lane : 0);

    // ---- compute role: states n = k*kS + s of channel d (lane). Only what every tile needs stays in registers;
    // constant B/C are re-read per tile (L1) and their gradient sums live in shared memory (myacc).
    float a2[kS], gc[kS];
    bool live[kS];  // n < N: padded states must not reach the sums over states (0 * Inf would make NaN)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const int64_t n = static_cast<int64_t>(k) * kS + s;
      live[s] = n < N;
      a2[s] = (cact && n < N) ? __ldg(static_cast<const float*>(p.A.p) + d * p.A.s[0] + n * p.A.s[1]) * kLog2e : 0.f;
      gc[s] = 0.f;
      myacc[s] = myacc[NT * kS + s] = myacc[2 * NT * kS + s] = 0.f;
    }
    const auto load_const = [&](const View& v, float (&out)[kS]) {
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const int64_t n = static_cast<int64_t>(k) * kS + s;
        out[s] = (cact && n < N) ? __ldg(static_cast<const float*>(v.p) + d * v.s[0] + n * v.s[1]) : 0.f;
      }
    };

    // ---- staging / epilogue role: items it = tid + m*NT (item_at: channel c, 4 steps q), 4 consecutive lanes on one
    // channel, so a warp's itype stores cover whole 32-byte sectors. The assignment is fixed, so the dD /
    // ddelta_bias shares (sE, slot c*kGrp + q) are summed in a fixed order.
    for (int it = tid; it < kCh * kGrp; it += NT) sE[it] = sE[kCh * kGrp + it] = 0.f;

    // ---- staging: the raw tile at t0 into shared memory (async). Pass B also needs dout, z, out and C. The two
    // element-wise fallbacks below stay written out: one shared helper added spills and measured slower.
    // The chunks are dealt so that every warp issues its share (the barrier after the sweep waits for the slowest
    // warp): where the block has at least two threads per chunk of a tensor (16-bit rows: 64 chunks, 128 threads),
    // its groups of kCpt threads take the tensors in turn, and the B/C rows go first to the group with fewer of them.
    // Dealt from thread 0 per tensor, warp 0 issued 7 chunks of a 16-bit pass-B tile and warps 2 and 3 none.
    const auto issue_async = [&](int64_t t0, bool full) {
      constexpr int kCpt = kCh * QPR;  // chunks of one tensor's rows
      const int nten = full ? (hasZ ? 5 : 3) : 2;
      const int grps = NT >= 2 * kCpt ? NT / kCpt : 1;
      const int sub = grps > 1 ? tid / kCpt : 0;  // this thread's group (grps * kCpt == NT when grps > 1)
      for (int ten = sub; ten < nten; ten += grps) {
        const View& v = ten == 0 ? p.u : ten == 1 ? p.delta : ten == 2 ? p.dout : ten == 3 ? p.z : p.out;
        for (int i = tid - sub * kCpt; i < kCpt; i += NT) {
          const int c = i / QPR, q = i % QPR;
          const int64_t e = t0 + q * VE;
          unsigned char* dst = raw + ((ten * kCh + raw_slot(c)) * kTT + q * VE) * isz;
          const T* src = static_cast<const T*>(v.p) + b * v.s[0] + (c0 + c) * v.s[1] + e;
          if (c < nch && e + VE <= L && aligned16(src)) {
            cp_async16(dst, src);
          } else {
            uint32_t w[4] = {0u, 0u, 0u, 0u};
            if (c < nch) {
#pragma unroll
              for (int j = 0; j < VE; ++j) {
                if (e + j >= L) break;
                if constexpr (isz == 4) w[j] = __float_as_uint(src[j]);
                else w[j / 2] |= static_cast<uint32_t>(bits16(src[j])) << (16 * (j % 2));
              }
            }
            *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
          }
        }
      }
      // B's first chunk, rotated to start at the group with fewer tensors (C's continues where B's ends); fp32 blocks
      // deal B and C from thread 0 as before: the rotated deal moved spills into its tile loop (ptxas, sm_90).
      constexpr bool kRotate = isz == 2;
      int first = kRotate ? tid - (nten % grps) * kCpt : tid;
      for (int isC = 0; isC < 2; ++isC) {
        if (isC ? !(full && varC) : !varB) continue;
        const View& v = isC ? p.C : p.B;
        const int nq = static_cast<int>(N) * QPR;
        if (kRotate && first < 0) first += NT;
        for (int i = first; i < nq; i += NT) {
          const int n = i / QPR, q = i % QPR;
          const int64_t e = t0 + q * VE;
          unsigned char* dst = raw + ((5 * kCh + isC * NP + n) * kTT + q * VE) * isz;
          const T* src = static_cast<const T*>(v.p) + b * v.s[0] + g * v.s[1] + n * v.s[2] + e;
          if (e + VE <= L && aligned16(src)) {
            cp_async16(dst, src);
          } else {
            uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int j = 0; j < VE; ++j) {
              if (e + j >= L) break;
              if constexpr (isz == 4) w[j] = __float_as_uint(src[j]);
              else w[j / 2] |= static_cast<uint32_t>(bits16(src[j])) << (16 * (j % 2));
            }
            *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
          }
        }
        if constexpr (kRotate) first -= nq;
      }
      cp_async_commit();
    };

    // The copy engine's form of `issue` (the kTmaCopies instance).
    const auto issue_tma = [&](int64_t t0, bool full) {
      const int nten = full ? (hasZ ? 5 : 3) : 2;
      // Lane 0 of warp k asks for boxes k, k + TPC, ...: the issue cost is spread over the warps that wait at the
      // next barrier. Warp 0 also posts the bytes of them all (boxes may land before that: the phase completes only
      // once the arrival is in and the count is back to zero).
      if (lane == 0) {
        constexpr unsigned kRowBytes = kTT * isz;
        const bool bB = varB, bC = full && varC;
        if (k == 0) mbar_arrive_expect(&tma_bar, (nten * kCh + (bB + bC) * static_cast<unsigned>(N)) * kRowBytes);
        const int x = static_cast<int>(t0), bb = static_cast<int>(b);
        const int nbox = nten + bB + bC;
        for (int j = k; j < nbox; j += TPC) {
          if (j < nten) {
            tile_load(raw + j * kCh * kRowBytes, &tm.m[j], x, static_cast<int>(c0), bb, &tma_bar);
          } else {
            const int isC = (j > nten || !bB) ? 1 : 0;
            tile_load(raw + (5 * kCh + isC * NP) * kRowBytes, &tm.m[5 + isC], x, 0, static_cast<int>(g), bb,
                      &tma_bar);
          }
        }
      }
    };
    const auto issue = [&](int64_t t0, bool full) {
      if constexpr (kTma) issue_tma(t0, full);
      else issue_async(t0, full);
    };

    // The issued tile has landed in shared memory, for this thread (the barrier after the wait makes it the block's).
    const auto wait_tile = [&]() {
      if constexpr (kTma) {
        mbar_wait(&tma_bar, tma_parity[tid]);
        tma_parity[tid] ^= 1u;
      } else {
        cp_async_wait_all();
      }
    };

    // Steps of the tile at t0 (< L) that lie inside L, at most kTT. For s < kTT, t0 + s < L exactly when
    // s < tile_rem(t0), so a per-element test is a 32-bit compare against one block-uniform count.
    const auto tile_rem = [&](int64_t t0) { return static_cast<int>(L - t0 < kTT ? L - t0 : kTT); };

    // ---- conversion of the landed raw tile (softplus, the z gate, dz, out_z) into float rows; rem = tile_rem(t0)
    const auto prep = [&](int64_t t0, int rem, bool full) {
      for (int it = tid; it < kCh * kGrp; it += NT) {
        int c, q;
        item_at(it, c, q);
        const int tl = q * 4, rc = kTma ? c : raw_slot(c);  // the copy engine writes rows in channel order
        const bool cok = c < nch;
        const int64_t dc = c0 + (cok ? c : 0);
        const float bias = (cok && p.delta_bias.p != nullptr)
                               ? __ldg(static_cast<const float*>(p.delta_bias.p) + dc * p.delta_bias.s[0])
                               : 0.f;
        float uu[4], dl[4], dt[4], zz[4], oo[4], du[4], sp[4], dz[4];
        raw4<T>(raw + ((0 * kCh + rc) * kTT + tl) * isz, uu);
        raw4<T>(raw + ((1 * kCh + rc) * kTT + tl) * isz, dl);
        if (full) {
          raw4<T>(raw + ((2 * kCh + rc) * kTT + tl) * isz, dt);
          if (hasZ) {
            raw4<T>(raw + ((3 * kCh + rc) * kTT + tl) * isz, zz);
            raw4<T>(raw + ((4 * kCh + rc) * kTT + tl) * isz, oo);
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool ok = cok && tl + j < rem;
          float v = dl[j] + bias;
          sp[j] = 1.f;
          if (p.softplus) v = softplus(v, full ? &sp[j] : nullptr);
          if (full && hasZ) {
            const float sg = __fdividef(1.f, 1.f + __expf(-zz[j]));
            const float sl = zz[j] * sg;
            dz[j] = dt[j] * oo[j] * sg * (1.f + zz[j] * (1.f - sg));
            dt[j] *= sl;
            oo[j] *= sl;  // recomputed out_z
          }
          dl[j] = ok ? v : 0.f;
          uu[j] = ok ? uu[j] : 0.f;
          du[j] = dl[j] * uu[j];
          if (full) {
            dt[j] = ok ? dt[j] : 0.f;
            sp[j] = ok ? sp[j] : 0.f;
          }
        }
        const int o = c * kRow + tl;
        st4(sDl + o, dl);
        st4(sDu + o, du);
        if (full) {
          st4(sDt + o, dt);
          st4(sU + o, uu);
          st4(sSp + o, sp);
          if (hasZ && cok) {
            store4<T>(static_cast<T*>(p.dz.p) + b * p.dz.s[0] + dc * p.dz.s[1], t0 + tl, L, dz);
            if (hasOz) store4<T>(static_cast<T*>(p.out_z.p) + b * p.out_z.s[0] + dc * p.out_z.s[1], t0 + tl, L, oo);
          }
        }
      }
      // variable B (and C in pass B) transposed to [t][state]
      const int nB = varB ? static_cast<int>(N) : 0;
      const int nC = (full && varC) ? static_cast<int>(N) : 0;
      for (int i = tid; i < (nB + nC) * kGrp; i += NT) {
        int n = i / kGrp;
        const int tl = (i - n * kGrp) * 4;
        const bool isC = n >= nB;
        if (isC) n -= nB;
        float v[4];
        raw4<T>(raw + ((5 * kCh + (isC ? NP : 0) + n) * kTT + tl) * isz, v);
        float* dstp = (isC ? sC : sB) + tl * kBcPitch + n;
#pragma unroll
        for (int j = 0; j < 4; ++j) dstp[j * kBcPitch] = v[j];
      }
    };

    // B of this thread's states at step j of the staged tile (variable: shared memory; constant: bc).
    const auto b_at = [&](auto vb_tag, int j, const float (&bc)[kS], float (&bv)[kS]) {
      if constexpr (decltype(vb_tag)::value) {
        const float4 q = ld4(sB + j * kBcPitch + k * kS);
        bv[0] = q.x; bv[1] = q.y; bv[2] = q.z; bv[3] = q.w;
      } else {
#pragma unroll
        for (int s = 0; s < kS; ++s) bv[s] = bc[s];
      }
    };

    // ---- pass A compute: advance h over the staged tile. The same loop as the start of `sweep`, written twice on
    // purpose: one shared loop (with a compile-time "keep the history" flag) changed register allocation and
    // measured slower.
    const auto advance = [&](auto vb_tag, float (&h)[kS]) {
      float bc[kS];
      if constexpr (!decltype(vb_tag)::value) load_const(p.B, bc);
#pragma unroll
      for (int j4 = 0; j4 < kTT; j4 += 4) {
        const float4 dl4 = ld4(sDl + lane * kRow + j4), du4 = ld4(sDu + lane * kRow + j4);
        const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w}, du[4] = {du4.x, du4.y, du4.z, du4.w};
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          float bv[kS];
          b_at(vb_tag, j4 + jj, bc, bv);
#pragma unroll
          for (int s = 0; s < kS; ++s) h[s] = fmaf(exp2_fast(dl[jj] * a2[s]), h[s], bv[s] * du[jj]);
        }
      }
    };

    // ---- pass B compute: recompute the tile with its history, then the reverse sweep
    const auto sweep = [&](auto vb_tag, auto vc_tag, const float4 hin) {
      constexpr bool VB = decltype(vb_tag)::value;
      constexpr bool VC = decltype(vc_tag)::value;
      constexpr int V = 4 * ((VB ? 1 : 0) + (VC ? 1 : 0));  // dB/dC values per lane and step
      float bc[kS], cc[kS], aB[kS], aC[kS], dA[kS];  // this tile's partial sums
#pragma unroll
      for (int s = 0; s < kS; ++s) aB[s] = aC[s] = dA[s] = 0.f;
      if constexpr (!VB) load_const(p.B, bc);
      if constexpr (!VC) load_const(p.C, cc);
      float hs[kTT][kS];
      const float h0s[kS] = {hin.x, hin.y, hin.z, hin.w};
      {
        float h[kS] = {h0s[0], h0s[1], h0s[2], h0s[3]};
#pragma unroll
        for (int j4 = 0; j4 < kTT; j4 += 4) {
          const float4 dl4 = ld4(sDl + lane * kRow + j4), du4 = ld4(sDu + lane * kRow + j4);
          const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w}, du[4] = {du4.x, du4.y, du4.z, du4.w};
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            float bv[kS];
            b_at(vb_tag, j4 + jj, bc, bv);
#pragma unroll
            for (int s = 0; s < kS; ++s) {
              h[s] = fmaf(exp2_fast(dl[jj] * a2[s]), h[s], bv[s] * du[jj]);
              hs[j4 + jj][s] = h[s];
            }
          }
        }
      }
#pragma unroll
      for (int j4 = kTT - 4; j4 >= 0; j4 -= 4) {
        const float4 dl4 = ld4(sDl + lane * kRow + j4), du4 = ld4(sDu + lane * kRow + j4);
        const float4 dt4 = ld4(sDt + lane * kRow + j4);
        const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w}, du[4] = {du4.x, du4.y, du4.z, du4.w};
        const float dt[4] = {dt4.x, dt4.y, dt4.z, dt4.w};
        float gu4[4], aq4[4];
#pragma unroll
        for (int jj = 3; jj >= 0; --jj) {
          const int j = j4 + jj;
          float bv[kS], cv[kS];
          b_at(vb_tag, j, bc, bv);
          if constexpr (VC) {
            const float4 q = ld4(sC + j * kBcPitch + k * kS);
            cv[0] = q.x; cv[1] = q.y; cv[2] = q.z; cv[3] = q.w;
          } else {
#pragma unroll
            for (int s = 0; s < kS; ++s) cv[s] = cc[s];
          }
          float gu = 0.f, aq = 0.f, vals[8];
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            const float a = exp2_fast(dl[jj] * a2[s]);
            const float dh = fmaf(dt[jj], cv[s], gc[s]);
            gc[s] = a * dh;                               // carried into step t-1
            const float q = gc[s] * (j > 0 ? hs[j - 1][s] : h0s[s]);  // dh ā_t h_{t-1}
            dA[s] = fmaf(dl[jj], q, dA[s]);
            if (live[s]) {
              aq = fmaf(a2[s], q, aq);  // A log2(e) q; the epilogue multiplies by ln 2
              gu = fmaf(dh, bv[s], gu);
            }
            const float db = dh * du[jj];
            const float dc = dt[jj] * hs[j][s];
            if constexpr (VB) vals[s] = db;
            else aB[s] += db;
            if constexpr (VC) vals[(VB ? 4 : 0) + s] = dc;
            else aC[s] += dc;
          }
          gu4[jj] = gu;
          aq4[jj] = aq;
          if constexpr (V > 0) {
            // Four steps of V values per lane, then each output (value, step) summed over the 32 channels by
            // P = 32 / (4V) lanes (one output per lane when B and C are both variable).
            // The row's two halves, each where red_at puts it (swapped in swizzled rows).
            *reinterpret_cast<float4*>(red + red_at(j & 3, lane, 0)) = make_float4(vals[0], vals[1], vals[2], vals[3]);
            if constexpr (V == 8)
              *reinterpret_cast<float4*>(red + red_at(j & 3, lane, 4)) = make_float4(vals[4], vals[5], vals[6], vals[7]);
            if ((j & 3) == 0) {
              __syncwarp();
              constexpr int O = 4 * V, P = 32 / O, CNT = 32 / P;
              const int o = lane / P, part = lane % P;
              const int tt = o / V, v = o % V;
              const int base = red_at(tt, part * CNT, v);
              float s4[4] = {0.f, 0.f, 0.f, 0.f};  // four chains: the adds overlap
#pragma unroll
              for (int i = 0; i < CNT; ++i) s4[i & 3] += red[red_read(base, i)];
              float sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
#pragma unroll
              for (int m = 1; m < P; m <<= 1) sum += __shfl_xor_sync(kFullMask, sum, m);
              if (part == 0) {
                const bool isC = !VB || v >= 4;
                (isC ? sDC : sDB)[(k * kS + (v & 3)) * kTT + j + tt] = sum;
              }
              __syncwarp();
            }
          }
        }
        st4(sGu + (k * kCh + lane) * kRow + j4, gu4);
        st4(sAq + (k * kCh + lane) * kRow + j4, aq4);
      }
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        if constexpr (!VB) myacc[s] += aB[s];
        if constexpr (!VC) myacc[NT * kS + s] += aC[s];
        myacc[2 * NT * kS + s] += dA[s];
      }
    };

    // ---- epilogue of a pass-B tile: du, ddelta (itype), dD/ddelta_bias shares, dB/dC atomics
    const auto epilogue = [&](int64_t t0) {
      for (int it = tid; it < kCh * kGrp; it += NT) {
        int c, q;
        item_at(it, c, q);
        const int tl = q * 4, o = c * kRow + tl, slot = c * kGrp + q;  // slot: this item's dD/ddelta_bias share
        const bool cok = c < nch;
        const int64_t dc = c0 + (cok ? c : 0);
        const float Dd = (cok && p.D.p != nullptr) ? __ldg(static_cast<const float*>(p.D.p) + dc * p.D.s[0]) : 0.f;
        const float4 dl = ld4(sDl + o), dt = ld4(sDt + o), uu = ld4(sU + o), sp = ld4(sSp + o);
        float4 gu = ld4(sGu + o), aq = ld4(sAq + o);
        for (int kk = 1; kk < TPC; ++kk) {
          const float4 x = ld4(sGu + kk * kCh * kRow + o), y = ld4(sAq + kk * kCh * kRow + o);
          gu.x += x.x; gu.y += x.y; gu.z += x.z; gu.w += x.w;
          aq.x += y.x; aq.y += y.y; aq.z += y.z; aq.w += y.w;
        }
        const float vdl[4] = {dl.x, dl.y, dl.z, dl.w}, vdt[4] = {dt.x, dt.y, dt.z, dt.w};
        const float vu[4] = {uu.x, uu.y, uu.z, uu.w}, vsp[4] = {sp.x, sp.y, sp.z, sp.w};
        const float vgu[4] = {gu.x, gu.y, gu.z, gu.w}, vaq[4] = {aq.x, aq.y, aq.z, aq.w};
        float du[4], dd[4], eD = sE[slot], eB = sE[kCh * kGrp + slot];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          du[j] = fmaf(vdl[j], vgu[j], Dd * vdt[j]);
          dd[j] = fmaf(vu[j], vgu[j], vaq[j] * kLn2) * vsp[j];
          eD = fmaf(vdt[j], vu[j], eD);
          eB += dd[j];
        }
        sE[slot] = eD;
        sE[kCh * kGrp + slot] = eB;
        if (cok) {
          store4<T>(static_cast<T*>(p.du.p) + b * p.du.s[0] + dc * p.du.s[1], t0 + tl, L, du);
          store4<T>(static_cast<T*>(p.ddelta.p) + b * p.ddelta.s[0] + dc * p.ddelta.s[1], t0 + tl, L, dd);
        }
      }
      const int nB = varB ? static_cast<int>(N) : 0;
      const int nC = varC ? static_cast<int>(N) : 0;
      for (int i = tid; i < (nB + nC) * kGrp; i += NT) {
        int n = i / kGrp;
        const int tl = (i - n * kGrp) * 4;
        if (t0 + tl >= L) continue;
        const bool isC = n >= nB;
        if (isC) n -= nB;
        const float4 v = ld4((isC ? sDC : sDB) + n * kTT + tl);
        float* img = (isC ? args.vc : args.vb) + ((b * G + g) * N + n) * args.var_row + t0 + tl;
        if (args.det_var) *reinterpret_cast<float4*>(img + tile * args.var_elems) = v;  // this tile's image
        else add_f4(img, v);
      }
    };

    for (int64_t c = p.nchunks - 1; c >= 0; --c) {
      const int64_t cs = c * kChunk;
      const int64_t clen = (L - cs < kChunk) ? (L - cs) : kChunk;
      const int nt = static_cast<int>((clen + kTT - 1) / kTT);
      float h[kS];
      {
        float bf[kS];
        if (c > 0 && p.fold_B) load_const(p.B, bf);
#pragma unroll
        for (int s = 0; s < kS; ++s) {
          const int64_t n = static_cast<int64_t>(k) * kS + s;
          h[s] = 0.f;
          if (cact && n < N) {
            if (c > 0) {
              h[s] = static_cast<const float*>(p.x.p)[b * p.x.s[0] + d * p.x.s[1] + (c - 1) * p.x.s[2] + 2 * n + 1];
              if (p.fold_B) h[s] *= bf[s];  // the saved x holds h / B; the backward runs on the true state
            } else if (p.h0.p != nullptr) {
              h[s] = static_cast<const float*>(p.h0.p)[b * p.h0.s[0] + d * p.h0.s[1] + n * p.h0.s[2]];
            }
          }
        }
      }
      myck[0] = make_float4(h[0], h[1], h[2], h[3]);
      issue(cs, nt == 1);
      // pass A: checkpoints at the start of tiles 1 .. nt-1
      for (int i = 0; i + 1 < nt; ++i) {
        wait_tile();
        __syncthreads();
        prep(cs + static_cast<int64_t>(i) * kTT, kTT, false);  // never the chunk's last tile: all kTT steps in L
        __syncthreads();
        if (i + 2 < nt) issue(cs + static_cast<int64_t>(i + 1) * kTT, false);
        else issue(cs + static_cast<int64_t>(nt - 1) * kTT, true);
        if (varB) advance(std::true_type{}, h);
        else advance(std::false_type{}, h);
        myck[static_cast<int64_t>(i + 1) * NT] = make_float4(h[0], h[1], h[2], h[3]);
      }
      // pass B: tiles in reverse
      for (int i = nt - 1; i >= 0; --i) {
        const int64_t t0 = cs + static_cast<int64_t>(i) * kTT;
        // The checkpoint is this thread's own (pass A wrote it): no barrier orders it. For float tiles it is read
        // before the barriers and the conversion, whose time hides its latency (-2.3% on fp32 8x1536x2048:16);
        // the 16-bit instances read it where it is used, since the early read made them slower (+0.9%, run 122).
        float4 hin;
        if constexpr (isz == 4) hin = myck[static_cast<int64_t>(i) * NT];
        wait_tile();
        __syncthreads();
        prep(t0, tile_rem(t0), true);
        __syncthreads();
        if (i > 0) issue(t0 - kTT, true);
        if constexpr (isz != 4) hin = myck[static_cast<int64_t>(i) * NT];
        if (varB) {
          if (varC) sweep(std::true_type{}, std::true_type{}, hin);
          else sweep(std::true_type{}, std::false_type{}, hin);
        } else {
          if (varC) sweep(std::false_type{}, std::true_type{}, hin);
          else sweep(std::false_type{}, std::false_type{}, hin);
        }
        __syncthreads();
        epilogue(t0);
      }
    }

    // ---- per-(b,d) partials (summed over batch by bwd_finish) and dh0
    const int64_t bd = b * D + d;
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const int64_t n = static_cast<int64_t>(k) * kS + s;
      if (!cact || n >= N) continue;
      args.pw[bd * N + n] = myacc[2 * NT * kS + s];
      if (args.accB >= 0) args.pw[(args.accB * Bt * D + bd) * N + n] = myacc[s];
      if (args.accC >= 0) args.pw[(args.accC * Bt * D + bd) * N + n] = myacc[NT * kS + s];
      if (p.dh0.p != nullptr)
        static_cast<float*>(p.dh0.p)[b * p.dh0.s[0] + d * p.dh0.s[1] + n * p.dh0.s[2]] = gc[s];
    }
    __syncthreads();  // every epilogue share is in sE
    if (tid < kCh && tid < nch) {
      float sD = 0.f, sb = 0.f;
      for (int q = 0; q < kGrp; ++q) {
        sD += sE[tid * kGrp + q];
        sb += sE[kCh * kGrp + tid * kGrp + q];
      }
      const int64_t bdc = b * D + c0 + tid;
      args.ps[bdc] = sD;
      args.ps[Bt * D + bdc] = sb;
    }
    __syncthreads();  // sE and myacc are reset by the next item
  }
}

}  // namespace selscan::kern::bwd::ts
