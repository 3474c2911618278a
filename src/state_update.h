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
// CPU). Two kernels (kernels/decode/state_update.cu):
//   - kLean, the common case: one token, a 16-bit state (fp32 states measured faster on kGeneral), at most 65535
//     sequences, dstate = lanes * kLeanStates with lanes a power of two <= 32 (dstate 8, 16, ...,
//     256), the state, B and C (16-bit) contiguous over n and aligned for one load of a lane's values, A constant
//     over n (`a_const`: one exp a thread) or aligned likewise. A thread owns one sequence and 16 bytes of one
//     channel's state.
//   - kGeneral, everything else: `lanes` adjacent threads per channel (a power of two: N / kStatesPerLane rounded
//     up, at most 32), each owning kStatesPerLane consecutive states, several sequences a thread; the vec_* flags
//     say which tensors allow 16-byte loads of a lane's states (unit state stride, dstate a multiple of
//     kStatesPerLane, the base and every other stride on 16-byte boundaries).
// For kLean, lanes/lane_bits count its lanes and the vec_* flags are set for every vector load it makes.
struct StateUpdatePlan {
  static constexpr int kStatesPerLane = 8;  // kGeneral's
  static constexpr int kLeanStates = 8;  // kLean's states a lane: 16 bytes of 16-bit state, 32 of fp32
  enum Kernel : int { kGeneral = 0, kLean = 1 };
  int kernel;
  int lanes, lane_bits;
  bool vec_state, vec_A, vec_B, vec_C;
  bool a_const;  // kLean: A's stride over n is 0, so exp(A dt) is one value a channel
};

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
