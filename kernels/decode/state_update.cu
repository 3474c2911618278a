// The decode step (selscan_state_update) on CUDA: one kernel, instantiated per state dtype and lane width, and once
// more for calls with dst_state_batch_indices (kDst: the state is written to another slot than the one read). The
// in-place instances carry no destination code.
//
// The call is memory-bound: per sequence it reads and writes the slot's H*P*N states and reads only O(H*P + N)
// other values. So the layout serves the state stream, as many small independent pieces of it in flight as the SMs
// hold:
//   - a channel (h, p) of one sequence is served by `lanes` adjacent threads (a power of two, at most 32), each
//     owning `states_per_lane` consecutive states: 16 bytes of state a thread (4 fp32 or 8 16-bit states; 8 fp32
//     above dstate 128), one vector load and one store, so a warp covers whole sectors of consecutive channels;
//   - a block serves one sequence (grid.y walks the sequences), so its slot lookup and padding branch are uniform,
//     and a thread holds one sequence's states: few registers, many resident warps. Everything a step reads is
//     issued before it is used: the slot, then the states; the channel's x, dt and z and the lane's B and C
//     independently of the slot. (A thread serving several sequences at once, or staging B and C through shared
//     memory, measured slower: validation/optimisation-log.md);
//   - the state is read with streaming loads (it is not reused before the next decode step, which comes after every
//     other layer's states have passed through L2), kept in registers through the T tokens, and written once with
//     streaming stores; out sums over the channel's lanes with shuffles.
// The lanes, the lane width and the vector paths are decided on the host (plan_state_update, src/state_update.cpp).
// dt, x, z, B and C are read through runtime-dtype loads (FLOAT32 or x's dtype each): the compile-time parameters
// are the state dtype, the lane width and whether states go to other slots.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/io.cuh"
#include "../common/launch.cuh"
#include "../common/math.cuh"
#include "state_update.h"

namespace selscan::kern {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxGridY = 65535;

// ---------------------------------------------------------------------------------------------- IO
__device__ __forceinline__ float ld(Dtype t, const void* p, int64_t off) {
  if (t == Dtype::f32) return __ldg(static_cast<const float*>(p) + off);
  const unsigned short v = __ldg(static_cast<const unsigned short*>(p) + off);
  return t == Dtype::f16 ? __half2float(__ushort_as_half(v)) : __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ void st(Dtype t, void* p, int64_t off, float v) {
  if (t == Dtype::f32) static_cast<float*>(p)[off] = v;
  else if (t == Dtype::f16) static_cast<__half*>(p)[off] = from_f32<__half>(v);
  else static_cast<__nv_bfloat16*>(p)[off] = from_f32<__nv_bfloat16>(v);
}

// 8 raw bytes (four 16-bit values) -> floats.
template <typename T>
__device__ __forceinline__ void unpack8(uint2 raw, float* out) {
  float v[8];
  unpack16<T>(make_uint4(raw.x, raw.y, 0u, 0u), v);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = v[i];
}

// kL values of a runtime-dtype tensor from element `off` on, `stride` apart, into floats; values at or past `valid`
// read as 0. `vec`: unit stride and aligned to the run's width (checked on the host), so vector loads.
template <int kL>
__device__ __forceinline__ void ld_run(Dtype t, const void* p, int64_t off, int64_t stride, int valid, bool vec,
                                       float* out) {
  if (vec) {
    if (t == Dtype::f32) {
      const uint4* q = reinterpret_cast<const uint4*>(static_cast<const float*>(p) + off);
#pragma unroll
      for (int i = 0; i < kL / 4; ++i) unpack16<float>(__ldg(q + i), out + 4 * i);
    } else {
      const unsigned short* q = static_cast<const unsigned short*>(p) + off;
      if constexpr (kL == 8) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(q));
        if (t == Dtype::f16) unpack16<__half>(raw, out);
        else unpack16<__nv_bfloat16>(raw, out);
      } else {
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(q));
        if (t == Dtype::f16) unpack8<__half>(raw, out);
        else unpack8<__nv_bfloat16>(raw, out);
      }
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kL; ++j) out[j] = j < valid ? ld(t, p, off + j * stride) : 0.f;
}

// The slot's states, S = the state dtype: streaming loads and stores (evict-first); kL * sizeof(S) is 8, 16 or 32
// bytes on the vector path.
template <typename S, int kL>
__device__ __forceinline__ void load_state(const S* p, int64_t stride, int valid, bool vec, float* s) {
  constexpr int kBytes = kL * static_cast<int>(sizeof(S));
  if (vec) {
    if constexpr (kBytes == 8) {
      const uint2 raw = __ldcs(reinterpret_cast<const uint2*>(p));
      unpack8<S>(raw, s);
    } else {
      const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i) unpack16<S>(__ldcs(q + i), s + i * 16 / static_cast<int>(sizeof(S)));
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kL; ++j) s[j] = j < valid ? to_f32(p[j * stride]) : 0.f;
}

template <typename S, int kL>
__device__ __forceinline__ void store_state(S* p, int64_t stride, int valid, bool vec, const float* s) {
  constexpr int kBytes = kL * static_cast<int>(sizeof(S));
  if (vec) {
    if constexpr (kBytes == 8) {
      float v[8] = {s[0], s[1], s[2], s[3], 0.f, 0.f, 0.f, 0.f};
      const uint4 w = pack16<S>(v);
      __stcs(reinterpret_cast<uint2*>(p), make_uint2(w.x, w.y));
    } else {
      uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i) __stcs(q + i, pack16<S>(s + i * 16 / static_cast<int>(sizeof(S))));
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kL; ++j)
    if (j < valid) p[j * stride] = from_f32<S>(s[j]);
}

// ---------------------------------------------------------------------------------------------- kernel
// What a sequence does: update its slot, or only write out (0 for padding, NaN for an index outside the pool).
enum SeqKind : int { kRun = 0, kPad = 1, kBad = 2 };

// Resident blocks asked of the compiler (SELSCAN_DECODE_MIN_BLOCKS: 0 = no register cap).
#ifndef SELSCAN_DECODE_MIN_BLOCKS
#define SELSCAN_DECODE_MIN_BLOCKS 0
#endif
constexpr int kMinBlocks = SELSCAN_DECODE_MIN_BLOCKS > 0 ? SELSCAN_DECODE_MIN_BLOCKS : 1;

template <typename S, int kL, bool kDst>
__global__ void __launch_bounds__(kThreads, kMinBlocks) state_update_kernel(const StateUpdate p, const StateUpdatePlan plan) {
  const int P = static_cast<int>(p.headdim);
  const int channels = static_cast<int>(p.heads) * P;
  const int gtid = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  const int lane = gtid & (plan.lanes - 1);
  int c = gtid >> plan.lane_bits;
  // Threads past the last channel still take part in the shuffles (every lane of a warp must), on a copy of the
  // last channel, and store nothing.
  const bool live = c < channels;
  if (!live) c = channels - 1;
  const int h = c / P, pp = c - h * P;
  const int64_t g = h / p.heads_per_group;
  const int n0 = lane * kL;
  const int valid = static_cast<int>(p.dstate) - n0;  // states of this lane: min(valid, kL); none when <= 0

  float a[kL];  // A * log2(e): exp(A dt) = exp2(a dt)
  ld_run<kL>(Dtype::f32, p.A, h * p.sA[0] + pp * p.sA[1] + n0 * p.sA[2], p.sA[2], valid, plan.vec_A && valid > 0, a);
#pragma unroll
  for (int j = 0; j < kL; ++j) a[j] *= kLog2e;
  const float Dv = p.D != nullptr ? __ldg(static_cast<const float*>(p.D) + h * p.sD[0] + pp * p.sD[1]) : 0.f;
  const float bias =
      p.dt_bias != nullptr ? __ldg(static_cast<const float*>(p.dt_bias) + h * p.sbias[0] + pp * p.sbias[1]) : 0.f;
  const int64_t cx = h * p.sx[2] + pp * p.sx[3], cdt = h * p.sdt[2] + pp * p.sdt[3];
  const int64_t cz = h * p.sz[2] + pp * p.sz[3], co = h * p.sout[2] + pp * p.sout[3];
  const int64_t cB = g * p.sB[2] + n0 * p.sB[3], cC = g * p.sC[2] + n0 * p.sC[3];
  const int64_t cs = h * p.sstate[1] + pp * p.sstate[2] + n0 * p.sstate[3];
  const bool writer = live && lane == 0;
  const bool vec_state = plan.vec_state && valid > 0;
  const bool vec_B = plan.vec_B && valid > 0, vec_C = plan.vec_C && valid > 0;

  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    // The first token's inputs do not depend on the slot: issued with (not after) the slot lookup.
    float x = ld(p.x_t, p.x, b * p.sx[0] + cx);
    float dt = ld(p.dt_t, p.dt, b * p.sdt[0] + cdt);
    float z = p.z != nullptr && writer ? ld(p.z_t, p.z, b * p.sz[0] + cz) : 0.f;
    float Bv[kL], Cv[kL];
    ld_run<kL>(p.B_t, p.B, b * p.sB[0] + cB, p.sB[3], valid, vec_B, Bv);
    ld_run<kL>(p.C_t, p.C, b * p.sC[0] + cC, p.sC[3], valid, vec_C, Cv);

    int kind = kRun;
    int64_t slot = b;
    if (p.idx != nullptr) {
      slot = p.idx64 ? __ldg(static_cast<const long long*>(p.idx) + b * p.sidx)
                     : __ldg(static_cast<const int*>(p.idx) + b * p.sidx);
      if (slot == p.pad_slot) kind = kPad;
      else if (slot < 0 || slot >= p.slots) kind = kBad;
    }
    S* dp = nullptr;  // the slot written; kDst: nullptr when dst is pad_slot_id (out only)
    if constexpr (kDst) {
      if (kind == kRun) {  // a destination outside the pool is reported like a source outside it
        const int64_t d = p.dst64 ? __ldg(static_cast<const long long*>(p.dst) + b * p.sdst)
                                  : __ldg(static_cast<const int*>(p.dst) + b * p.sdst);
        if (d != p.pad_slot) {
          if (d < 0 || d >= p.slots) kind = kBad;
          else dp = static_cast<S*>(p.state) + d * p.sstate[0] + cs;
        }
      }
    }
    if (kind != kRun) {  // no slot to touch (uniform over the block)
      if (writer)
        for (int64_t t = 0; t < p.tokens; ++t)
          st(p.x_t, p.out, b * p.sout[0] + t * p.sout[1] + co, kind == kPad ? 0.f : __int_as_float(0x7fffffff));
      continue;
    }
    S* sp = static_cast<S*>(p.state) + slot * p.sstate[0] + cs;
    if constexpr (!kDst) dp = sp;
    float s[kL];
    load_state<S, kL>(sp, p.sstate[3], valid, vec_state, s);

    for (int64_t t = 0; t < p.tokens; ++t) {
      if (t > 0) {  // later tokens (speculative decoding): their inputs after the previous token's step
        x = ld(p.x_t, p.x, b * p.sx[0] + t * p.sx[1] + cx);
        dt = ld(p.dt_t, p.dt, b * p.sdt[0] + t * p.sdt[1] + cdt);
        if (p.z != nullptr && writer) z = ld(p.z_t, p.z, b * p.sz[0] + t * p.sz[1] + cz);
        ld_run<kL>(p.B_t, p.B, b * p.sB[0] + t * p.sB[1] + cB, p.sB[3], valid, vec_B, Bv);
        ld_run<kL>(p.C_t, p.C, b * p.sC[0] + t * p.sC[1] + cC, p.sC[3], valid, vec_C, Cv);
      }
      float d = dt + bias;
      if (p.softplus) d = softplus(d);
      const float dtx = d * x;
      float y = 0.f;
#pragma unroll
      for (int j = 0; j < kL; ++j)
        if (j < valid) {
          s[j] = fmaf(s[j], exp2_fast(a[j] * d), Bv[j] * dtx);
          y = fmaf(s[j], Cv[j], y);
        }
      for (int off = plan.lanes >> 1; off > 0; off >>= 1) y += __shfl_xor_sync(kFullMask, y, off);
      if (writer) {
        y = fmaf(Dv, x, y);
        if (p.z != nullptr) y *= silu(z);
        st(p.x_t, p.out, b * p.sout[0] + t * p.sout[1] + co, y);
      }
    }
    if (live && valid > 0 && dp != nullptr) store_state<S, kL>(dp, p.sstate[3], valid, plan.vec_state, s);
  }
}

}  // namespace
}  // namespace selscan::kern

namespace selscan::cuda {

Status launch_state_update(const StateUpdate& p, const StateUpdatePlan& plan, void* stream) {
  using namespace kern;
  const int64_t threads = p.channels() * plan.lanes;  // < 2^31 (validated)
  const dim3 grid(static_cast<unsigned>((threads + kThreads - 1) / kThreads),
                  static_cast<unsigned>(p.batch < kMaxGridY ? p.batch : kMaxGridY));
  const auto s = static_cast<cudaStream_t>(stream);
  const auto launch = [&](auto state_tag, auto lanes_tag) {
    using S = decltype(state_tag);
    constexpr int kL = decltype(lanes_tag)::value;
    if (p.dst != nullptr) state_update_kernel<S, kL, true><<<grid, kThreads, 0, s>>>(p, plan);
    else state_update_kernel<S, kL, false><<<grid, kThreads, 0, s>>>(p, plan);
  };
  using L4 = std::integral_constant<int, 4>;
  using L8 = std::integral_constant<int, 8>;
  const auto launch_lanes = [&](auto state_tag) {
    if (plan.states_per_lane == 4) launch(state_tag, L4{});
    else launch(state_tag, L8{});
  };
  switch (p.state_t) {
    case Dtype::f32: launch_lanes(float{}); break;
    case Dtype::f16: launch_lanes(__half{}); break;
    case Dtype::bf16: launch_lanes(__nv_bfloat16{}); break;
    default: return fail(SELSCAN_STATUS_INTERNAL, "state update launcher: state dtype is not f32/f16/bf16");
  }
  return launch_status("selscan_state_update: the kernel's launch");
}

}  // namespace selscan::cuda
