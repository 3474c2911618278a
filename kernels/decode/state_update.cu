// The decode step (selscan_state_update) on CUDA: one kernel, instantiated per state dtype, and per state dtype once
// more for calls with dst_state_batch_indices (kDst: the state is written to another slot than the one read). The
// in-place instances carry no destination code, so a call without destinations runs exactly the kernel it ran
// before destinations existed.
//
// The call is memory-bound: per sequence it reads and writes the slot's H*P*N states and reads only O(H*P + N)
// other values. So the layout serves the state stream:
//   - a channel (h, p) is served by `lanes` adjacent threads (a power of two, N/8 rounded up, at most 32), each
//     owning 8 consecutive states: one 32-byte sector of fp32 state (two 16-byte loads) or one 16-byte load of
//     16-bit state per thread, so a warp's loads and stores cover whole sectors of consecutive channels;
//   - the state is read once with streaming loads (it is not reused before the next decode step, which comes
//     after every other layer's states have passed through L2), kept in registers through the T tokens, and
//     written once with streaming stores; out sums over the channel's lanes with shuffles (no shared memory);
//   - grid.y walks the sequences (kSeqs per thread), so a block's slot lookups and padding branches are
//     uniform; grid.x covers the channels. Nothing depends on the device's SM count, so a launch queries nothing.
// The lanes and the vector paths are decided on the host (plan_state_update, src/cuda/select.cpp).
// dt, x, z, B and C are tiny and read through runtime-dtype loads (FLOAT32 or x's dtype each): the only
// compile-time parameter is the state dtype.
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/io.cuh"
#include "../common/launch.cuh"
#include "../common/math.cuh"
#include "state_update.h"

namespace selscan::kern {
namespace {

constexpr int kThreads = 128;
constexpr int kStatesPerLane = StateUpdatePlan::kStatesPerLane;
constexpr int64_t kMaxGridY = 65535;

// ---------------------------------------------------------------------------------------------- IO
// Eight values of a runtime-dtype tensor from element `off` on, `stride` apart, into floats; values at or past
// `valid` read as 0. `vec`: unit stride and 16-byte aligned (checked on the host), so 16-byte loads.
__device__ __forceinline__ void ld8(Dtype t, const void* p, int64_t off, int64_t stride, int valid, bool vec,
                                    float* out) {
  if (vec) {
    if (t == Dtype::f32) {
      const uint4* q = reinterpret_cast<const uint4*>(static_cast<const float*>(p) + off);
      unpack16<float>(__ldg(q), out);
      unpack16<float>(__ldg(q + 1), out + 4);
    } else {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p) + off));
      if (t == Dtype::f16) unpack16<__half>(raw, out);
      else unpack16<__nv_bfloat16>(raw, out);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kStatesPerLane; ++j) out[j] = j < valid ? ld_dtype(t, p, off + j * stride) : 0.f;
}

// The slot's states, S = the state dtype: streaming loads and stores (evict-first).
template <typename S>
__device__ __forceinline__ void load_state(const S* p, int64_t stride, int valid, bool vec, float* s) {
  if (vec) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
    if constexpr (sizeof(S) == 4) {
      unpack16<float>(__ldcs(q), s);
      unpack16<float>(__ldcs(q + 1), s + 4);
    } else {
      unpack16<S>(__ldcs(q), s);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kStatesPerLane; ++j) s[j] = j < valid ? to_f32(p[j * stride]) : 0.f;
}

template <typename S>
__device__ __forceinline__ void store_state(S* p, int64_t stride, int valid, bool vec, const float* s) {
  if (vec) {
    uint4* q = reinterpret_cast<uint4*>(p);
    if constexpr (sizeof(S) == 4) {
      __stcs(q, pack16<float>(s));
      __stcs(q + 1, pack16<float>(s + 4));
    } else {
      __stcs(q, pack16<S>(s));
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kStatesPerLane; ++j)
    if (j < valid) p[j * stride] = from_f32<S>(s[j]);
}

// ---------------------------------------------------------------------------------------------- kernel
// Sequences per thread: each thread serves its channel (same A, D, dt_bias and offsets) for this many
// sequences, and issues all their state loads before it computes any, so that a resident thread keeps 64 bytes
// of state (fp32: 2 x 32; 16-bit: 4 x 16) in flight. With one sequence per thread, the registers the loop
// needs (about 90) allowed too few resident threads to keep enough state bytes in flight per SM.
template <typename S>
constexpr int kSeqs = sizeof(S) == 4 ? 2 : 4;

// What a sequence of the current step does: update its slot, or only write out (0 for padding, NaN for an index
// outside the pool), or nothing (past the batch).
enum SeqKind : int { kRun = 0, kPad = 1, kBad = 2, kNone = 3 };

template <typename S, bool kDst>
__global__ void __launch_bounds__(kThreads) state_update_kernel(const StateUpdate p, const StateUpdatePlan plan) {
  constexpr int R = kSeqs<S>;
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
  const int n0 = lane * kStatesPerLane;
  const int valid = static_cast<int>(p.dstate) - n0;  // states of this lane: min(valid, 8); none when <= 0

  float a[kStatesPerLane];  // A * log2(e): exp(A dt) = exp2(a dt)
  ld8(Dtype::f32, p.A, h * p.sA[0] + pp * p.sA[1] + n0 * p.sA[2], p.sA[2], valid, plan.vec_A && valid > 0, a);
#pragma unroll
  for (int j = 0; j < kStatesPerLane; ++j) a[j] *= kLog2e;
  const float Dv = p.D != nullptr ? __ldg(static_cast<const float*>(p.D) + h * p.sD[0] + pp * p.sD[1]) : 0.f;
  const float bias =
      p.dt_bias != nullptr ? __ldg(static_cast<const float*>(p.dt_bias) + h * p.sbias[0] + pp * p.sbias[1]) : 0.f;
  const int64_t cx = h * p.sx[2] + pp * p.sx[3], cdt = h * p.sdt[2] + pp * p.sdt[3];
  const int64_t cz = h * p.sz[2] + pp * p.sz[3], co = h * p.sout[2] + pp * p.sout[3];
  const int64_t cB = g * p.sB[2] + n0 * p.sB[3], cC = g * p.sC[2] + n0 * p.sC[3];
  const int64_t cs = h * p.sstate[1] + pp * p.sstate[2] + n0 * p.sstate[3];
  const bool writer = live && lane == 0;
  const bool vec_state = plan.vec_state && valid > 0;

  for (int64_t b0 = static_cast<int64_t>(blockIdx.y) * R; b0 < p.batch; b0 += static_cast<int64_t>(gridDim.y) * R) {
    // The slots, then every slot's loads: all in flight before the first use. Kinds are uniform over the block.
    int kind[R];
    S* sp[R];
    S* dp[R];  // kDst: the slot written; nullptr when dst is pad_slot_id (out only)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t b = b0 + r;
      int64_t slot = b;
      kind[r] = b < p.batch ? kRun : kNone;
      if (kind[r] == kRun && p.idx != nullptr) {
        slot = p.idx64 ? __ldg(static_cast<const long long*>(p.idx) + b * p.sidx)
                       : __ldg(static_cast<const int*>(p.idx) + b * p.sidx);
        if (slot == p.pad_slot) kind[r] = kPad;
        else if (slot < 0 || slot >= p.slots) kind[r] = kBad;
      }
      sp[r] = static_cast<S*>(p.state) + (kind[r] == kRun ? slot * p.sstate[0] + cs : 0);
      if constexpr (kDst) {
        dp[r] = nullptr;
        if (kind[r] == kRun) {  // a destination outside the pool is reported like a source outside it
          const int64_t d = p.dst64 ? __ldg(static_cast<const long long*>(p.dst) + b * p.sdst)
                                    : __ldg(static_cast<const int*>(p.dst) + b * p.sdst);
          if (d != p.pad_slot) {
            if (d < 0 || d >= p.slots) kind[r] = kBad;
            else dp[r] = static_cast<S*>(p.state) + d * p.sstate[0] + cs;
          }
        }
      }
    }
    float s[R][kStatesPerLane];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (kind[r] == kRun) load_state(sp[r], p.sstate[3], valid, vec_state, s[r]);
    }

#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t b = b0 + r;
      if (kind[r] == kPad || kind[r] == kBad) {  // no slot to touch
        if (writer)
          for (int64_t t = 0; t < p.tokens; ++t)
            st_dtype(p.x_t, p.out, b * p.sout[0] + t * p.sout[1] + co, kind[r] == kPad ? 0.f : __int_as_float(0x7fffffff));
      } else if (kind[r] == kRun) {
        for (int64_t t = 0; t < p.tokens; ++t) {
          const float x = ld_dtype(p.x_t, p.x, b * p.sx[0] + t * p.sx[1] + cx);
          float dt = ld_dtype(p.dt_t, p.dt, b * p.sdt[0] + t * p.sdt[1] + cdt) + bias;
          if (p.softplus) dt = softplus(dt);
          float Bv[kStatesPerLane], Cv[kStatesPerLane];
          ld8(p.B_t, p.B, b * p.sB[0] + t * p.sB[1] + cB, p.sB[3], valid, plan.vec_B && valid > 0, Bv);
          ld8(p.C_t, p.C, b * p.sC[0] + t * p.sC[1] + cC, p.sC[3], valid, plan.vec_C && valid > 0, Cv);
          const float dtx = dt * x;
          float y = 0.f;
#pragma unroll
          for (int j = 0; j < kStatesPerLane; ++j)
            if (j < valid) {
              s[r][j] = fmaf(s[r][j], exp2_fast(a[j] * dt), Bv[j] * dtx);
              y = fmaf(s[r][j], Cv[j], y);
            }
          for (int off = plan.lanes >> 1; off > 0; off >>= 1) y += __shfl_xor_sync(kFullMask, y, off);
          if (writer) {
            y = fmaf(Dv, x, y);
            if (p.z != nullptr) y *= silu(ld_dtype(p.z_t, p.z, b * p.sz[0] + t * p.sz[1] + cz));
            st_dtype(p.x_t, p.out, b * p.sout[0] + t * p.sout[1] + co, y);
          }
        }
        if constexpr (kDst) {
          if (live && valid > 0 && dp[r] != nullptr) store_state(dp[r], p.sstate[3], valid, plan.vec_state, s[r]);
        } else {
          if (live && valid > 0) store_state(sp[r], p.sstate[3], valid, plan.vec_state, s[r]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace selscan::kern

namespace selscan::cuda {

Status launch_state_update(const StateUpdate& p, const StateUpdatePlan& plan, void* stream) {
  using namespace kern;
  const int64_t threads = p.channels() * plan.lanes;  // < 2^31 (validated)
  const auto grid = [&](int seqs) {
    const int64_t y = (p.batch + seqs - 1) / seqs;
    return dim3(static_cast<unsigned>((threads + kThreads - 1) / kThreads),
                static_cast<unsigned>(y < kMaxGridY ? y : kMaxGridY));
  };
  const auto s = static_cast<cudaStream_t>(stream);
  const auto launch = [&](auto state_tag) {
    using S = decltype(state_tag);
    if (p.dst != nullptr) state_update_kernel<S, true><<<grid(kSeqs<S>), kThreads, 0, s>>>(p, plan);
    else state_update_kernel<S, false><<<grid(kSeqs<S>), kThreads, 0, s>>>(p, plan);
  };
  switch (p.state_t) {
    case Dtype::f32: launch(float{}); break;
    case Dtype::f16: launch(__half{}); break;
    case Dtype::bf16: launch(__nv_bfloat16{}); break;
    default: return fail(SELSCAN_STATUS_INTERNAL, "state update launcher: state dtype is not f32/f16/bf16");
  }
  return launch_status("selscan_state_update: the kernel's launch");
}

}  // namespace selscan::cuda
