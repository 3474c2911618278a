// The decode step (selscan_state_update) below the API layer: the one internal description of a call, built by
// validate_state_update.cpp from the public struct, and the two implementations that consume it (dispatch.cpp
// picks one, like the scan's). POD, so the CUDA
// launcher passes it by value as a kernel parameter. No CUDA or fmt headers here.
//
// Both public forms arrive here as the heads form (b, t, h, p, n): the Mamba-1 form is H = D heads of P = 1
// channel, with the P strides 0. Every tensor keeps its caller's strides (in elements of its own dtype); a
// broadcast input has stride 0 there.
#pragma once

#include <cstdint>

#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"

namespace selscan {

struct StateUpdate {
  // sizes
  int64_t batch, tokens, heads, headdim, dstate, groups, slots;
  int64_t heads_per_group;  // heads / groups: head h reads group h / heads_per_group
  int64_t pad_slot;         // state_batch_indices entry meaning "padding"
  // dtypes: out has x's; state is f32 or x's
  Dtype x_t, dt_t, B_t, C_t, z_t, state_t;
  bool softplus;
  bool idx64;  // state_batch_indices is INT64 (else INT32)

  // data (absent optional inputs: nullptr)
  const void *x, *dt, *A, *B, *C, *D, *z, *dt_bias, *idx;
  void *state, *out;
  // strides
  int64_t sx[4], sdt[4], sz[4], sout[4];  // (b, t, h, p)
  int64_t sB[4], sC[4];                   // (b, t, g, n)
  int64_t sA[3];                          // (h, p, n)
  int64_t sD[2], sbias[2];                // (h, p)
  int64_t sstate[4];                      // (slot, h, p, n)
  int64_t sidx;                           // (b)
  // dst_state_batch_indices (since 0.4), after every older field so that the kernel instances without it keep
  // their parameter offsets: the slot each sequence writes (nullptr: the slot it reads).
  const void* dst;
  int64_t sdst;  // (b)
  bool dst64;    // INT64 (else INT32)

  int64_t channels() const { return heads * headdim; }
};

// Entry b of a (b,) slot index tensor (state_batch_indices or dst_state_batch_indices) in host memory.
inline int64_t slot_entry(const void* t, bool i64, int64_t stride, int64_t b) {
  return i64 ? static_cast<const int64_t*>(t)[b * stride] : static_cast<const int32_t*>(t)[b * stride];
}

// How the CUDA kernel serves a call, decided on the host by plan_state_update (src/cuda/select.h; tested on the
// CPU). Three kernels (kernels/decode/state_update.cu):
//   - kLean, the common case: one token, any state dtype, at most 65535 sequences, dstate = lanes * kLeanStates
//     with lanes a power of two <= 32 (dstate 8, 16, ..., 256), the state, B and C (16-bit) contiguous over n and
//     aligned for one load of a lane's values, A constant over n (`a_const`: one exp a thread) or aligned
//     likewise. A thread owns one sequence and 8 states of one channel (16 bytes of 16-bit state, 32 of fp32).
//   - kGeneral, everything else: `lanes` adjacent threads per channel (a power of two: N / kStatesPerLane rounded
//     up, at most 32), each owning kStatesPerLane consecutive states, several sequences a thread; the vec_* flags
//     say which tensors allow 16-byte loads of a lane's states (unit state stride, dstate a multiple of
//     kStatesPerLane, the base and every other stride on 16-byte boundaries).
//   - kSmall, kLean's calls when the whole step is a small grid (at most kSmallGridStates states, or forced): the
//     lean kernel's work with a short critical path, for a step whose time is one thread's chain of dependent
//     instructions rather than the state bytes: no integer division (h = c / P and g = h / (H / G) by the
//     multiply-shifts below), 32-bit per-channel offsets (the plan checks that every channel's elements lie within
//     2^32 of its sequence's row), the state stored before the out reduction. `small_states` states a lane: the
//     lean kernel's 8, or 4 where asked (SELSCAN_DECODE_KERNEL=small4).
// For kLean and kSmall, lanes/lane_bits count its lanes and the vec_* flags are set for every vector load it makes.
struct StateUpdatePlan {
  static constexpr int kStatesPerLane = 8;  // kGeneral's
  static constexpr int kLeanStates = 8;  // kLean's states a lane: 16 bytes of 16-bit state, 32 of fp32
  // kSmall by default up to this many states in the call (batch * heads * headdim * dstate): 4 MB of fp32 state,
  // 128K threads at 8 states a lane, half of what 132 SMs hold at once. Mamba-2 2.7b's step at Bt 1 (655,360)
  // is under it; Mamba-1 2.8b's at Bt 16 (1,310,720) and every larger call keep kLean.
  static constexpr int64_t kSmallGridStates = int64_t{1} << 20;
  enum Kernel : int { kGeneral = 0, kLean = 1, kSmall = 2 };
  int kernel;
  int lanes, lane_bits;
  bool vec_state, vec_A, vec_B, vec_C;
  bool a_const;  // kLean, kSmall: A's stride over n is 0, so exp(A dt) is one value a channel
  // kSmall only (after the fields the other kernels read, so their parameter offsets stay): states a lane (8 or
  // 4), and c / headdim and h / heads_per_group as fast_div(c, mul, shift).
  int small_states;
  uint32_t p_mul, g_mul;
  int p_shift, g_shift;
};

// n / d for n < 2^31 as ((uint64) n * mul) >> shift, with (mul, shift) = fast_divisor(d), d in [1, 2^31): shift =
// 31 + ceil(log2 d), mul = ceil(2^shift / d) < 2^32. Exact: mul * d - 2^shift = e < d <= 2^(shift - 31), so the
// product exceeds n / d * 2^shift by n * e < 2^shift, less than the gap to the next integer. constexpr, so device
// code calls it too (--expt-relaxed-constexpr).
constexpr uint32_t fast_div(uint32_t n, uint32_t mul, int shift) {
  return static_cast<uint32_t>((static_cast<uint64_t>(n) * mul) >> shift);
}
constexpr void fast_divisor(uint32_t d, uint32_t* mul, int* shift) {
  int l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  *shift = 31 + l;
  *mul = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
}

// Validates the public struct (any accepted struct_size) and fills `out`; every failure records a message that
// names the argument and the value given. Allocates and formats nothing unless it fails.
Status make_state_update(const selscan_state_update_args_t* args, StateUpdate* out);

// The CPU call's check of dst_state_batch_indices' contents (a CUDA call cannot read them): every entry a slot
// or pad_slot_id, no slot written by two sequences, none read by one sequence and written by another.
Status check_host_dst(const StateUpdate& p);

namespace cpu {
// Synchronous, on up to num_threads workers (0 = all hardware threads; small calls run on the caller's thread).
Status state_update(const StateUpdate& p, int num_threads);
}  // namespace cpu

namespace cuda {
// Defined in kernels/decode/: enqueues the kernel with `plan` on `stream` (a cudaStream_t) on the current device.
// No allocation, no synchronisation, no device query. SUCCESS or CUDA_ERROR (with the runtime's text).
Status launch_state_update(const StateUpdate& p, const StateUpdatePlan& plan, void* stream);
}  // namespace cuda

}  // namespace selscan
