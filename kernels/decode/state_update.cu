// The decode step (selscan_state_update) on CUDA: two kernels, each instantiated per state dtype, and per state dtype
// once more: the general one for calls with dst_state_batch_indices (kDst: the state is written to another slot than
// the one read; its in-place instances carry no destination code), the lean one for A constant over n (kAConst).
// plan_state_update (src/cuda/select.cpp) picks the kernel.
//
// The call is memory-bound: per sequence it reads and writes the slot's H*P*N states and reads only O(H*P + N)
// other values. Both kernels serve the state stream the same way: a channel (h, p) is served by `lanes` adjacent
// threads (a power of two), each owning consecutive states; the state is read once with streaming loads (it is not
// reused before the next decode step, which comes after every other layer's states have passed through L2) and
// written once with streaming stores; out sums over the channel's lanes with shuffles (no shared memory); a block
// row of the grid (grid.y) serves one sequence (or kSeqs), so a block's slot lookups and padding branches are
// uniform, and grid.x covers the channels. Nothing depends on the device's SM count, so a launch queries nothing.
//
// state_update_lean, the common case (one token, contiguous aligned state, B and C; see StateUpdatePlan): a thread
// owns one sequence and 8 states (16 bytes of 16-bit state, 32 of fp32) and issues all its loads before it converts
// any, so it needs 32-40 registers (ptxas) and the SM holds 1536-2048 threads: the bytes in flight come from the
// number of threads (mamba_ssm's Triton kernel's strategy), not from work per thread. When A is constant over n
// (Mamba-2's per-head A), exp(A dt) is one exp a thread.
// state_update_kernel, everything else (several tokens, strided or misaligned tensors, dstate not a whole number
// of lean lanes): 8 states a lane (one 32-byte sector of fp32 state, one 16-byte load of 16-bit), kSeqs sequences
// a thread, kept in registers through the T tokens.
// dt, x, z, B and C are tiny and read through runtime-dtype loads (FLOAT32 or x's dtype each): the only
// compile-time dtype is the state's, except in the small-grid kernel, whose chain of dependent instructions is the
// step's time: it is instantiated per input dtype too (see state_update_small).
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

// ---------------------------------------------------------------------------------------------- lean kernel
// StateUpdatePlan::kLeanStates = 8 states a lane: 16 bytes of 16-bit state, 32 of fp32 (two 16-byte accesses). The
// bytes in flight per SM are what the call's speed follows (mamba_ssm's Triton kernel: 8 bytes a thread with 16-bit
// state at ~2000 resident threads). An fp32 form with 4 states a lane measured slower than the general kernel (run
// 45: the fixed work a thread does per sequence spread over half the bytes); with 8 a lane it covers as many states
// as the 16-bit form. The plan gives it fp32 state only when asked (SELSCAN_DECODE_KERNEL=lean) until measured.
constexpr int kLeanStates = StateUpdatePlan::kLeanStates;

// The lean kernel issues every load before it converts any value: a runtime-dtype load converted where it is
// loaded makes the thread wait for it before the next load issues (one round trip per input). So the loads below
// return raw bits (a 32-bit word, or 16-bit values in the low halves) and the conversions come after.
__device__ __forceinline__ float half_bits_f32(uint32_t v, bool f16) {  // f16 or bf16 bits in the low half of v
  return f16 ? __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xffffu))) : __uint_as_float(v << 16);
}

__device__ __forceinline__ uint32_t ld_raw(Dtype t, const void* p, int64_t off) {
  return t == Dtype::f32 ? __ldg(static_cast<const unsigned*>(p) + off)
                         : static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(p) + off));
}

__device__ __forceinline__ float raw_f32(Dtype t, uint32_t v) {
  return t == Dtype::f32 ? __uint_as_float(v) : half_bits_f32(v, t == Dtype::f16);
}

// A lane's 8 consecutive 16-bit values of B or C from element `off` on (16-byte aligned: checked by the plan).
__device__ __forceinline__ uint4 ld_raw_lane(const void* p, int64_t off) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p) + off));
}

__device__ __forceinline__ void raw_lane_f32(Dtype t, uint4 r, float* out) {
  const bool f16 = t == Dtype::f16;
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = half_bits_f32(w[i], f16);
    out[2 * i + 1] = half_bits_f32(w[i] >> 16, f16);
  }
}

// The slot entry of sequence b in a (b,) index tensor.
__device__ __forceinline__ int64_t slot_at(const void* idx, bool i64, int64_t stride, int64_t b) {
  return i64 ? __ldg(static_cast<const long long*>(idx) + b * stride)
             : static_cast<int64_t>(__ldg(static_cast<const int*>(idx) + b * stride));
}

// kAConst: A's stride over n is 0 (plan.a_const), one exp a thread; otherwise a lane's A in 16-byte loads and an
// exp a state. Separate instances because the per-state A costs 4-6 registers (ptxas), and registers are what
// limits the resident threads. Destinations are a uniform branch: they cost no register.
// Resident blocks of 128 asked of ptxas: 12 for 16-bit state (40 registers; left to itself it takes 46-48); 10 for
// fp32 (48), whose state holds 8 registers more between its load and its use. Capped at what an SM holds: sm_75
// keeps 1024 threads (8 blocks), where a larger ask is out of range and ignored with a warning.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kSmBlocks = 1024 / kThreads;
#else
constexpr int kSmBlocks = 1536 / kThreads;  // sm_86, sm_89, sm_120 (sm_80, sm_90, sm_100: 2048)
#endif
template <typename S>
constexpr int kLeanAsk = sizeof(S) == 4 ? 10 : 12;
template <typename S>
constexpr int kLeanMinBlocks = kLeanAsk<S> < kSmBlocks ? kLeanAsk<S> : kSmBlocks;
// 16-byte accesses a lane's state takes: 1 (16-bit), 2 (fp32).
template <typename S>
constexpr int kStateVecs = static_cast<int>(sizeof(S)) * kLeanStates / 16;

// A lean-family thread's lane and channel. Threads past the last channel still take part in the shuffles (every
// lane of a warp must), on a copy of the last channel (live false: they store nothing).
struct LaneChannel {
  unsigned lane, c;
  bool live;
};
__device__ __forceinline__ LaneChannel lane_channel(const StateUpdate& p, const StateUpdatePlan& plan) {
  const unsigned channels = static_cast<unsigned>(p.heads) * static_cast<unsigned>(p.headdim);
  const unsigned gtid = blockIdx.x * kThreads + threadIdx.x;
  const unsigned c = gtid >> plan.lane_bits;
  const bool live = c < channels;
  return {gtid & (plan.lanes - 1), live ? c : channels - 1, live};
}

template <typename S, bool kAConst>
__global__ void __launch_bounds__(kThreads, kLeanMinBlocks<S>) state_update_lean(const StateUpdate p,
                                                                                const StateUpdatePlan plan) {
  constexpr int L = kLeanStates;
  constexpr int V = kStateVecs<S>;
  const unsigned P = static_cast<unsigned>(p.headdim);
  const LaneChannel lc = lane_channel(p, plan);
  const unsigned lane = lc.lane, c = lc.c;
  const bool live = lc.live;
  const unsigned h = c / P, pp = c - h * P;
  const unsigned n0 = lane * L;
  const bool writer = live && lane == 0;
  const int64_t b = blockIdx.y;  // the plan keeps batch within grid.y's limit

  // The slot lookups first (the state's address waits for them), then every input while they are in flight.
  const int64_t slot = p.idx != nullptr ? slot_at(p.idx, p.idx64, p.sidx, b) : b;
  const int64_t dslot = p.dst != nullptr ? slot_at(p.dst, p.dst64, p.sdst, b) : slot;
  const uint32_t x_raw = ld_raw(p.x_t, p.x, b * p.sx[0] + h * p.sx[2] + pp * p.sx[3]);
  const uint32_t dt_raw = ld_raw(p.dt_t, p.dt, b * p.sdt[0] + h * p.sdt[2] + pp * p.sdt[3]);
  const unsigned g = h / static_cast<unsigned>(p.heads_per_group);
  const uint4 B_raw = ld_raw_lane(p.B, b * p.sB[0] + g * p.sB[2] + n0);
  const uint4 C_raw = ld_raw_lane(p.C, b * p.sC[0] + g * p.sC[2] + n0);

  // Uniform over the block: padding (out 0) or a slot outside the pool (out NaN) touch no slot; so does a
  // destination that is padding, but it writes out.
  int kind = kRun;
  if (p.idx != nullptr) {
    if (slot == p.pad_slot) kind = kPad;
    else if (slot < 0 || slot >= p.slots) kind = kBad;
  }
  const bool to_dst = p.dst != nullptr && dslot != p.pad_slot;  // else the slot read, or none
  if (kind == kRun && to_dst && (dslot < 0 || dslot >= p.slots)) kind = kBad;
  const int64_t co = b * p.sout[0] + h * p.sout[2] + pp * p.sout[3];
  if (kind != kRun) {
    if (writer) st_dtype(p.x_t, p.out, co, kind == kPad ? 0.f : __int_as_float(0x7fffffff));
    return;
  }
  const int64_t cs = h * p.sstate[1] + pp * p.sstate[2] + n0;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const S*>(p.state) + slot * p.sstate[0] + cs);
  uint4 s_raw[V];
#pragma unroll
  for (int i = 0; i < V; ++i) s_raw[i] = __ldcs(src + i);
  // The per-channel weights and the writer's z, issued with the state: they arrive before it (L2 hits), and issued
  // before the slot lookup they would hold registers through it.
  const float* A = static_cast<const float*>(p.A) + h * p.sA[0] + pp * p.sA[1];
  float a[kAConst ? 1 : L];
  if constexpr (kAConst) a[0] = __ldg(A);
  else
#pragma unroll
    for (int i = 0; i < L / 4; ++i) unpack16<float>(__ldg(reinterpret_cast<const uint4*>(A + n0) + i), a + 4 * i);
  const float bias =
      p.dt_bias != nullptr ? __ldg(static_cast<const float*>(p.dt_bias) + h * p.sbias[0] + pp * p.sbias[1]) : 0.f;
  // Only a channel's first lane writes out: its D and z.
  const float Dv =
      writer && p.D != nullptr ? __ldg(static_cast<const float*>(p.D) + h * p.sD[0] + pp * p.sD[1]) : 0.f;
  const uint32_t z_raw = writer && p.z != nullptr ? ld_raw(p.z_t, p.z, b * p.sz[0] + h * p.sz[2] + pp * p.sz[3]) : 0u;

  const float x = raw_f32(p.x_t, x_raw);
  float dt = raw_f32(p.dt_t, dt_raw) + bias;
  if (p.softplus) dt = softplus(dt);
  float s[L], Bv[L], Cv[L];
#pragma unroll
  for (int i = 0; i < V; ++i) unpack16<S>(s_raw[i], s + i * (L / V));
  raw_lane_f32(p.B_t, B_raw, Bv);
  raw_lane_f32(p.C_t, C_raw, Cv);
  const float dtx = dt * x;
  float y = 0.f;
  if constexpr (kAConst) {
    const float dA = exp2_fast(a[0] * kLog2e * dt);
#pragma unroll
    for (int j = 0; j < L; ++j) s[j] = fmaf(s[j], dA, Bv[j] * dtx);
  } else {
#pragma unroll
    for (int j = 0; j < L; ++j) s[j] = fmaf(s[j], exp2_fast(a[j] * kLog2e * dt), Bv[j] * dtx);
  }
#pragma unroll
  for (int j = 0; j < L; ++j) y = fmaf(s[j], Cv[j], y);
  for (int off = plan.lanes >> 1; off > 0; off >>= 1) y += __shfl_xor_sync(kFullMask, y, off);
  if (writer) {
    y = fmaf(Dv, x, y);
    if (p.z != nullptr) y *= silu(raw_f32(p.z_t, z_raw));
    st_dtype(p.x_t, p.out, co, y);
  }
  if (live && (p.dst == nullptr || to_dst)) {
    uint4* dstp = reinterpret_cast<uint4*>(static_cast<S*>(p.state) + dslot * p.sstate[0] + cs);
#pragma unroll
    for (int i = 0; i < V; ++i) __stcs(dstp + i, pack16<S>(s + i * (L / V)));
  }
}

// ---------------------------------------------------------------------------------------------- small-grid kernel
// state_update_small (kSmall): the lean kernel's call when the whole step is a grid of under a wave (decode at Bt
// 1: 80 blocks for Mamba-1 2.8b, 640 for Mamba-2 2.7b). Such a step takes one thread's chain of dependent
// instructions (issue, the loads' round trip, the update, the reduction, the stores) plus the launch, not the
// state's bytes over the bandwidth, so this form shortens the chain and the instructions a thread issues:
// - no integer division: the lean kernel's c / P and h / (H / G) are two ~20-instruction chains (I2F, MUFU.RCP,
//   correction steps) ahead of every load; here each is one multiply-shift (fast_div, constants from the plan);
// - per-channel offsets in 32 bits (the plan checks they fit), so each address is one IMAD.WIDE.U32 onto the
//   sequence's row pointer, which the uniform datapath computes once per block;
// - every load issued before any loaded value is read, the state (the DRAM miss) first where no slot lookup comes
//   before it (the order and why: in the kernel); the state stored as soon as it is updated, before the reduction
//   of out; out's sum over the lane's states in two chains instead of one;
// - the input dtype I (x's: f16 or bf16) an instance parameter, besides the state's S: B, C and out are I too (the
//   plan gives kSmall 16-bit B and C, which validation allows only as fp32 or x's dtype), so their conversions and
//   out's store carry no runtime-dtype pairs or branches; dt and z (fp32 or I) are one uniform select each. The
//   (S, I) pairs: (fp32, bf16), (fp32, f16), (bf16, bf16), (f16, f16) (a 16-bit state is x's dtype);
// - D and z loaded by every lane of a channel (one address, so no more traffic), not under a divergent branch.
// L states a lane: 8 (the lean kernel's), or 4 when forced (twice the threads, half the work a thread).
template <int W, bool kStream>
__device__ __forceinline__ void ld_words(const void* p, uint32_t* w) {
  if constexpr (W == 2) {
    const uint2* q = static_cast<const uint2*>(p);
    const uint2 v = kStream ? __ldcs(q) : __ldg(q);
    w[0] = v.x, w[1] = v.y;
  } else {
    static_assert(W % 4 == 0, "2 words or whole 16-byte vectors");
    const uint4* q = static_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < W / 4; ++i) {
      const uint4 v = kStream ? __ldcs(q + i) : __ldg(q + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  }
}

template <int W>
__device__ __forceinline__ void st_words_cs(void* p, const uint32_t* w) {
  if constexpr (W == 2) {
    __stcs(static_cast<uint2*>(p), make_uint2(w[0], w[1]));
  } else {
#pragma unroll
    for (int i = 0; i < W / 4; ++i)
      __stcs(static_cast<uint4*>(p) + i, make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]));
  }
}

// L values of S (fp32, or 16-bit two a word) <-> their raw words.
template <typename S, int L>
__device__ __forceinline__ void words_f32(const uint32_t* w, float* out) {
#pragma unroll
  for (int j = 0; j < L; ++j) {
    if constexpr (sizeof(S) == 4) {
      out[j] = __uint_as_float(w[j]);
    } else {
      const uint32_t h = (j & 1) ? w[j / 2] >> 16 : w[j / 2] & 0xffffu;
      if constexpr (std::is_same_v<S, __half>) out[j] = __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
      else out[j] = __uint_as_float(h << 16);
    }
  }
}

template <typename S, int L>
__device__ __forceinline__ void f32_words(const float* v, uint32_t* w) {
#pragma unroll
  for (int j = 0; j < L; ++j) {
    if constexpr (sizeof(S) == 4) {
      w[j] = __float_as_uint(v[j]);
    } else {
      const uint32_t h = bits16(from_f32<S>(v[j]));
      w[j / 2] = (j & 1) ? w[j / 2] | (h << 16) : h;
    }
  }
}

// The small kernel's input dtype I (f16 or bf16): the value whose bits are the low half of v.
template <typename I>
__device__ __forceinline__ float half_f32(uint32_t v) {
  if constexpr (std::is_same_v<I, __half>)
    return __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xffffu)));
  else
    return __uint_as_float(v << 16);
}

// A lane's L values of I (B or C) from their raw words, two a word.
template <typename I, int L>
__device__ __forceinline__ void half_words_f32(const uint32_t* w, float* out) {
#pragma unroll
  for (int j = 0; j < L; ++j) out[j] = half_f32<I>((j & 1) ? w[j / 2] >> 16 : w[j / 2]);
}

// One value of dt or z, whose dtype is fp32 or x's (I), uniform over the call (`f32`), at element `off` of a row
// that starts `row` elements into p: the row's address is uniform over the block, and the 32-bit offset adds onto
// it in one IMAD.WIDE.U32. Raw bits, converted by f32_or after every load has issued.
__device__ __forceinline__ uint32_t ld_raw_row(bool f32, const void* p, int64_t row, unsigned off) {
  return f32 ? __ldg(static_cast<const unsigned*>(p) + row + off)
             : static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(p) + row + off));
}
template <typename I>
__device__ __forceinline__ float f32_or(bool f32, uint32_t v) {
  return f32 ? __uint_as_float(v) : half_f32<I>(v);
}

// Resident blocks of 128 asked of ptxas: the grids it serves by default fill under half of what SMs hold (640
// blocks for Mamba-2 at Bt 1 with 8 states a lane, ~5 an SM), so 8 blocks (64 registers) leave ptxas room to keep
// the loads in flight without a spill (the lean kernel's 40-register cap spilled 12 bytes in the bf16 instance
// with A per state); with 4 states a lane twice the blocks, so 12 (40 registers, which every such instance fits).
template <int L>
constexpr int kSmallMinBlocks = (L == 4 ? 12 : 8) < kSmBlocks ? (L == 4 ? 12 : 8) : kSmBlocks;

// kSmall's kernel parameters, packed by the launcher from StateUpdate and the plan: 240 bytes (StateUpdate and the
// plan together are 544). A launch's parameters are a fresh copy in memory, so at the kernel's start every constant
// line it reads is a miss on every SM, and a warp stalls at issue on each one, one after another. So the block is
// small and ordered by first use, in 64-byte lines:
// - [0x210, 0x240), with the global-memory descriptor at 0x208: all the no-index path reads before the state's
//   load (`direct` is a flag, so idx and dst are not read for it), then x;
// - [0x240, 0x300): the other inputs in the order the kernel loads them, while the state is in flight. out's fields
//   sit among them, before z's: ptxas computes out's address after the reduction, so its line must already be
//   cached by then. The index path's fields come last.
// Strides and channel offsets in elements, 32-bit: plan_small checks every channel offset and every row stride of
// a dimension with more than one entry fits (a dimension of one entry is packed as 0). Products with the sequence
// or slot index stay 64-bit.
struct SmallArgs {
  void* state;
  uint32_t s_row, s_h, s_p;  // state: slot, head, head-dim strides
  uint32_t channels, P;      // heads * headdim, headdim
  uint32_t p_mul, g_mul;     // c / P and h / heads_per_group by fast_div
  uint8_t lane_bits, p_shift, g_shift, flags;  // flags: kSmall* below
  const void* x;
  uint32_t x_row, x_h, x_p, dt_row;
  const void* dt;
  uint32_t dt_h, dt_p;
  const void *B, *C;
  uint32_t B_row, B_g, C_row, C_g;
  const float* A;
  uint32_t A_h, A_p;
  const float* dt_bias;
  uint32_t bias_h, bias_p;
  const float* D;
  uint32_t D_h, D_p;
  void* out;
  uint32_t out_row, out_h, out_p, z_row;
  const void* z;
  uint32_t z_h, z_p;
  const void *idx, *dst;
  int64_t pad_slot, slots;
  uint32_t idx_row, dst_row;
};
static_assert(sizeof(SmallArgs) == 240, "kSmall's parameter block: one 256-byte span from 0x210 on");
constexpr uint8_t kSmallDirect = 1, kSmallDtF32 = 2, kSmallZF32 = 4, kSmallSoftplus = 8, kSmallIdx64 = 16,
                  kSmallDst64 = 32;

template <typename S, typename I, bool kAConst, int L>
__global__ void __launch_bounds__(kThreads, kSmallMinBlocks<L>) state_update_small(const SmallArgs p) {
  static_assert(sizeof(I) == 2 && (sizeof(S) == 4 || std::is_same_v<S, I>), "16-bit inputs; a 16-bit state is x's");
  constexpr int WS = L * static_cast<int>(sizeof(S)) / 4;  // words of a lane's state
  constexpr int WH = L / 2;                                 // words of a lane's 16-bit B or C
  const unsigned P = p.P;
  const unsigned gtid = blockIdx.x * kThreads + threadIdx.x;
  const unsigned lane = gtid & ((1u << p.lane_bits) - 1u);
  // Threads past the last channel serve a copy of the last one (every lane takes part in the shuffles) and store
  // nothing.
  const bool live = (gtid >> p.lane_bits) < p.channels;
  const unsigned c = live ? gtid >> p.lane_bits : p.channels - 1;
  const unsigned h = fast_div(c, p.p_mul, p.p_shift);
  const unsigned pp = c - h * P;
  const unsigned g = fast_div(h, p.g_mul, p.g_shift);
  const unsigned n0 = lane * L;
  const bool writer = live && lane == 0;
  const int64_t b = blockIdx.y;  // the plan keeps batch within grid.y's limit
  // A channel's offset within its row: unsigned 32-bit products (the plan checked the largest fits).
  const auto off = [&](unsigned sh, unsigned sp) { return h * sh + pp * sp; };

  // The order of the loads is the critical path's. ptxas tracks all these loads on one scoreboard, so the first
  // instruction that reads a loaded register waits for every load issued before it, the state's included. So: the
  // slot lookups first (with indices the state's address waits for them, and every other input is issued while
  // they are in flight); then, without indices, the state; then every other input; and no loaded register is read
  // until all are issued. The merge of a conditional load's result reads it: the lookups' results merge before the
  // state's issue, and no input is loaded under a branch that opens between the state's issue and the last load
  // (before this order, z's load sat behind such a merge and made a second round trip after the state's).
  // Tracking the state apart (cp.async into shared memory) measured slower: ptxas issued it after the other loads.
  const unsigned cs = off(p.s_h, p.s_p) + n0;
  const bool direct = p.flags & kSmallDirect;
  int64_t slot = b, dslot = b;
  if (!direct) {
    if (p.idx != nullptr) slot = slot_at(p.idx, p.flags & kSmallIdx64, p.idx_row, b);
    dslot = p.dst != nullptr ? slot_at(p.dst, p.flags & kSmallDst64, p.dst_row, b) : slot;
  }
  uint32_t s_raw[WS];
  if (direct) ld_words<WS, true>(static_cast<const S*>(p.state) + b * p.s_row + cs, s_raw);
  const uint32_t x_raw = __ldg(static_cast<const unsigned short*>(p.x) + b * p.x_row + off(p.x_h, p.x_p));
  const bool dt_f32 = p.flags & kSmallDtF32, z_f32 = p.flags & kSmallZF32;
  const uint32_t dt_raw = ld_raw_row(dt_f32, p.dt, b * p.dt_row, off(p.dt_h, p.dt_p));
  const unsigned ob = n0 + g * p.B_g;
  const unsigned oc = n0 + g * p.C_g;
  uint32_t B_raw[WH], C_raw[WH];
  ld_words<WH, false>(static_cast<const unsigned short*>(p.B) + b * p.B_row + ob, B_raw);
  ld_words<WH, false>(static_cast<const unsigned short*>(p.C) + b * p.C_row + oc, C_raw);
  const float* A = p.A + off(p.A_h, p.A_p);
  float a[kAConst ? 1 : L];
  if constexpr (kAConst) {
    a[0] = __ldg(A);
  } else {
    uint32_t aw[L];
    ld_words<L, false>(A + n0, aw);
#pragma unroll
    for (int j = 0; j < L; ++j) a[j] = __uint_as_float(aw[j]);
  }
  const float bias = p.dt_bias != nullptr ? __ldg(p.dt_bias + off(p.bias_h, p.bias_p)) : 0.f;
  // Only a channel's first lane writes out, but every lane loads its D and z: the same address, so the same
  // transaction, and no branch on the lane.
  const float Dv = p.D != nullptr ? __ldg(p.D + off(p.D_h, p.D_p)) : 0.f;
  const uint32_t z_raw = p.z != nullptr ? ld_raw_row(z_f32, p.z, b * p.z_row, off(p.z_h, p.z_p)) : 0u;
  I* const out = static_cast<I*>(p.out) + b * p.out_row + off(p.out_h, p.out_p);

  S* dst;             // the slot written (formed for a padding destination too, but then never used)
  bool store = live;  // whether this thread writes its states
  if (direct) {
    dst = static_cast<S*>(p.state) + b * p.s_row + cs;
  } else {
    // Uniform over the block: padding (out 0) or a slot outside the pool (out NaN) touch no slot; so does a
    // destination that is padding, but it writes out.
    int kind = kRun;
    if (p.idx != nullptr) {
      if (slot == p.pad_slot) kind = kPad;
      else if (slot < 0 || slot >= p.slots) kind = kBad;
    }
    const bool to_dst = p.dst != nullptr && dslot != p.pad_slot;  // else the slot read, or none
    if (kind == kRun && to_dst && (dslot < 0 || dslot >= p.slots)) kind = kBad;
    if (kind != kRun) {
      if (writer) *out = from_f32<I>(kind == kPad ? 0.f : __int_as_float(0x7fffffff));
      return;
    }
    ld_words<WS, true>(static_cast<const S*>(p.state) + slot * p.s_row + cs, s_raw);
    dst = static_cast<S*>(p.state) + dslot * p.s_row + cs;
    store = live && (p.dst == nullptr || to_dst);
  }

  // The dt path, then the update: both after every load has arrived (the one scoreboard), so their order is ptxas's.
  const float x = half_f32<I>(x_raw);
  float dt = f32_or<I>(dt_f32, dt_raw) + bias;
  if (p.flags & kSmallSoftplus) dt = softplus(dt);
  float Bv[L], Cv[L], dA[kAConst ? 1 : L];
  half_words_f32<I, L>(B_raw, Bv);
  half_words_f32<I, L>(C_raw, Cv);
  const float dtx = dt * x;
#pragma unroll
  for (int j = 0; j < L; ++j) Bv[j] *= dtx;
#pragma unroll
  for (int j = 0; j < (kAConst ? 1 : L); ++j) dA[j] = exp2_fast(a[j] * kLog2e * dt);
  const float xD = Dv * x;
  const float gate = p.z != nullptr ? silu(f32_or<I>(z_f32, z_raw)) : 1.f;

  float s[L];
  words_f32<S, L>(s_raw, s);
#pragma unroll
  for (int j = 0; j < L; ++j) s[j] = fmaf(s[j], dA[kAConst ? 0 : j], Bv[j]);
  if (store) {
    uint32_t w[WS];
    f32_words<S, L>(s, w);
    st_words_cs<WS>(dst, w);
  }
  // Every lane of the warp reaches this (the index path's early returns are uniform over the block). It keeps the
  // state's stores ahead of the reduction: without it ptxas sank them below the shuffles.
  __syncwarp();
  float y0 = 0.f, y1 = 0.f;
#pragma unroll
  for (int j = 0; j < L; j += 2) {
    y0 = fmaf(s[j], Cv[j], y0);
    y1 = fmaf(s[j + 1], Cv[j + 1], y1);
  }
  float y = y0 + y1;
  for (unsigned o = (1u << p.lane_bits) >> 1; o > 0; o >>= 1) y += __shfl_xor_sync(kFullMask, y, o);
  if (writer) *out = from_f32<I>((y + xD) * gate);
}

// kSmall's parameter block from the call and its plan; false where a stride plan_small should have kept off kSmall
// needs 64 bits (a dimension of one entry has index 0: its stride is packed as 0, whatever it is).
bool pack_small(const StateUpdate& p, const StateUpdatePlan& plan, SmallArgs* a) {
  bool fits = true;
  const auto u32 = [&](int64_t count, int64_t stride) {
    if (count <= 1) return 0u;
    if (stride < 0 || stride > int64_t{UINT32_MAX}) fits = false;
    return static_cast<uint32_t>(stride);
  };
  const int64_t H = p.heads, P = p.headdim, rows = p.batch;
  const int64_t slots = p.slots > p.batch ? p.slots : p.batch;
  *a = SmallArgs{};
  a->state = p.state;
  a->s_row = u32(slots, p.sstate[0]), a->s_h = u32(H, p.sstate[1]), a->s_p = u32(P, p.sstate[2]);
  a->channels = static_cast<uint32_t>(H * P), a->P = static_cast<uint32_t>(P);
  a->p_mul = plan.p_mul, a->g_mul = plan.g_mul;
  a->lane_bits = static_cast<uint8_t>(plan.lane_bits);
  a->p_shift = static_cast<uint8_t>(plan.p_shift), a->g_shift = static_cast<uint8_t>(plan.g_shift);
  a->flags = static_cast<uint8_t>((p.idx == nullptr && p.dst == nullptr ? kSmallDirect : 0) |
                                  (p.dt_t == Dtype::f32 ? kSmallDtF32 : 0) | (p.z_t == Dtype::f32 ? kSmallZF32 : 0) |
                                  (p.softplus ? kSmallSoftplus : 0) | (p.idx64 ? kSmallIdx64 : 0) |
                                  (p.dst64 ? kSmallDst64 : 0));
  a->x = p.x, a->x_row = u32(rows, p.sx[0]), a->x_h = u32(H, p.sx[2]), a->x_p = u32(P, p.sx[3]);
  a->dt = p.dt, a->dt_row = u32(rows, p.sdt[0]), a->dt_h = u32(H, p.sdt[2]), a->dt_p = u32(P, p.sdt[3]);
  a->B = p.B, a->B_row = u32(rows, p.sB[0]), a->B_g = u32(p.groups, p.sB[2]);
  a->C = p.C, a->C_row = u32(rows, p.sC[0]), a->C_g = u32(p.groups, p.sC[2]);
  a->A = static_cast<const float*>(p.A), a->A_h = u32(H, p.sA[0]), a->A_p = u32(P, p.sA[1]);
  a->dt_bias = static_cast<const float*>(p.dt_bias);
  if (p.dt_bias != nullptr) a->bias_h = u32(H, p.sbias[0]), a->bias_p = u32(P, p.sbias[1]);
  a->D = static_cast<const float*>(p.D);
  if (p.D != nullptr) a->D_h = u32(H, p.sD[0]), a->D_p = u32(P, p.sD[1]);
  a->z = p.z;
  if (p.z != nullptr) a->z_row = u32(rows, p.sz[0]), a->z_h = u32(H, p.sz[2]), a->z_p = u32(P, p.sz[3]);
  a->out = p.out, a->out_row = u32(rows, p.sout[0]), a->out_h = u32(H, p.sout[2]), a->out_p = u32(P, p.sout[3]);
  a->idx = p.idx, a->dst = p.dst, a->pad_slot = p.pad_slot, a->slots = p.slots;
  if (p.idx != nullptr) a->idx_row = u32(rows, p.sidx);
  if (p.dst != nullptr) a->dst_row = u32(rows, p.sdst);
  return fits;
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
  // kSmall's instances exist for 16-bit x with B and C of x's dtype and the state fp32 or x's: what the plan
  // (16-bit B and C) and validation (B, C and the state fp32 or x's dtype) leave it.
  if (plan.kernel == StateUpdatePlan::kSmall &&
      ((p.x_t != Dtype::f16 && p.x_t != Dtype::bf16) || p.B_t != p.x_t || p.C_t != p.x_t ||
       (p.state_t != Dtype::f32 && p.state_t != p.x_t)))
    return fail(SELSCAN_STATUS_INTERNAL, "state update launcher: the small-grid kernel needs 16-bit x, B and C of "
                                         "x's dtype, and the state fp32 or x's dtype");
  SmallArgs args;
  if (plan.kernel == StateUpdatePlan::kSmall && !pack_small(p, plan, &args))
    return fail(SELSCAN_STATUS_INTERNAL, "state update launcher: a stride of the small-grid kernel's call needs 64 "
                                         "bits (the plan should have kept it on the lean kernel)");
  const auto launch = [&](auto state_tag) {
    using S = decltype(state_tag);
    if (plan.kernel == StateUpdatePlan::kSmall) {
      // One sequence a block row, as the lean kernel; 8 or 4 states a lane; x's dtype (I) the input dtype of the
      // instance (checked above: B, C and a 16-bit state are x's).
      const auto small = [&](auto in_tag, auto states) {
        using I = decltype(in_tag);
        constexpr int L = decltype(states)::value;
        if (plan.a_const) state_update_small<S, I, true, L><<<grid(1), kThreads, 0, s>>>(args);
        else state_update_small<S, I, false, L><<<grid(1), kThreads, 0, s>>>(args);
      };
      const auto small_in = [&](auto states) {
        if constexpr (sizeof(S) == 2) small(S{}, states);
        else if (p.x_t == Dtype::f16) small(__half{}, states);
        else small(__nv_bfloat16{}, states);
      };
      if (plan.small_states == 4) small_in(std::integral_constant<int, 4>{});
      else small_in(std::integral_constant<int, StateUpdatePlan::kLeanStates>{});
      return;
    }
    if (plan.kernel == StateUpdatePlan::kLean) {
      // One sequence a block row (the plan keeps batch <= 65535).
      if (plan.a_const) state_update_lean<S, true><<<grid(1), kThreads, 0, s>>>(p, plan);
      else state_update_lean<S, false><<<grid(1), kThreads, 0, s>>>(p, plan);
      return;
    }
    if (p.dst != nullptr) {
      state_update_kernel<S, true><<<grid(kSeqs<S>), kThreads, 0, s>>>(p, plan);
    } else {
      state_update_kernel<S, false><<<grid(kSeqs<S>), kThreads, 0, s>>>(p, plan);
    }
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
