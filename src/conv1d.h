// The causal depthwise convolution (selscan_conv1d_fwd / _bwd / _update) below the API layer: the one internal
// description of a call, built by validate_conv1d.cpp from the public structs, and the implementations that consume
// it (src/cpu/conv1d.cpp, kernels/conv1d/). POD, so the CUDA launchers pass it by value as a kernel parameter. No
// CUDA or fmt headers here.
//
// Every (b, d, t) tensor keeps its caller's strides, in elements of its own dtype: s[0] batch row, s[1] channel,
// s[2] time. The layout flags below only say which fast path a kernel may take; the generic path serves any
// strides.
#pragma once

#include <cstdint>

#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"

namespace selscan {

enum class Layout : int32_t {
  channel_first,  // x, out (and dout, dx) have stride 1 over time
  channel_last,   // ... stride 1 over channels
  strided         // anything else
};

struct Conv1d {
  // sizes
  int64_t batch;      // Bt: sequences (packed: cu_seqlens' entries - 1)
  int64_t dim;        // D
  int64_t seqlen;     // L of a batch row (packed: total_L)
  int64_t width;      // W in {2, 3, 4}
  int64_t state_len;  // conv_states' last dim (0 without a pool)
  int64_t slots;      // conv_states' first dim (0 without a pool)
  Dtype itype;        // x, out, dout, dx, initial/final states and their gradients, conv_states
  Dtype wtype;        // weight, bias (f32 or itype)
  Dtype dwtype;       // dweight, dbias (f32 or wtype); backward only
  bool silu;
  bool deterministic;  // backward only
  Layout layout;       // of x and out (forward), of x, dout and dx (backward; strided unless all three agree)

  // inputs
  View x, weight, bias, seq_idx, init;  // init: initial_states (b, d, j)
  // forward outputs
  View out, fin;  // fin: final_states (b, d, j)
  // backward: gradients in and out
  View dout, dfin, dx, dweight, dbias, dinit;  // dweight (d, k): s[0], s[1]; dbias (d): s[0]

  // Serving: packed sequences (cu_seqlens, rows() == 1), and the forward's state pool.
  bool varlen;           // cu_seqlens given
  bool cu_i64, idx_i64;  // cu_seqlens, cache_indices hold int64 (else int32)
  bool init_i32;         // has_init holds int32 (else one byte per entry)
  int64_t pad_slot_id;
  View cu_seqlens, conv_states, cache_indices, has_init;  // conv_states (slot, d, j): s[0], s[1], s[2]

  SELSCAN_HD int64_t rows() const { return varlen ? 1 : batch; }
};

// The decode update: T tokens per sequence advance that sequence's window of past inputs.
struct Conv1dUpdate {
  int64_t batch, dim, tokens, width, state_len, slots;
  Dtype itype, wtype, state_t;  // state_t: conv_state's dtype (f32 or itype)
  bool silu;
  bool seqlens_i64, idx_i64;
  int64_t pad_slot_id;
  View x, weight, bias, out;  // x, out (b, d, t): s[0], s[1], s[2] (s[2] = 0 when T = 1 without a T dim)
  View conv_state;            // (slot, d, j)
  View cache_seqlens;         // (b): s[0]
  View indices;               // conv_state_indices (b): s[0]
};

// ------------------------------------------------------------------------------------------ the route
// api.cpp -> make_conv1d_* (src/validate_conv1d.cpp: every check and message, once) -> dispatch.cpp -> the CPU path
// (src/cpu/conv1d.cpp) or the plan chosen in src/cuda/select.cpp and its launcher (kernels/conv1d/).

// Validate an argument struct of any accepted struct_size and describe the call; every failure records a message
// naming the argument and the value given. Allocates and formats nothing unless it fails.
Status make_conv1d_fwd(const selscan_conv1d_fwd_args_t* args, Conv1d* out);
Status make_conv1d_bwd(const selscan_conv1d_bwd_args_t* args, Conv1d* out);
Status make_conv1d_update(const selscan_conv1d_update_args_t* args, Conv1dUpdate* out);
// The contents of index tensors in host memory, for CPU calls (a CUDA call cannot read them): cu_seqlens starts
// at 0, never decreases and ends at the packed length; cache_indices / conv_state_indices entries are pad_slot_id
// or a slot in range, no slot serves two sequences; cache_seqlens >= 0.
Status check_host_conv1d(const Conv1d& p);
Status check_host_conv1d_update(const Conv1dUpdate& p);

namespace cpu {
// Synchronous, on up to num_threads workers (0 = all hardware threads; small calls run on the caller's thread).
Status conv1d_fwd(const Conv1d& p, int num_threads);
Status conv1d_bwd(const Conv1d& p, int num_threads);
Status conv1d_update(const Conv1dUpdate& p, int num_threads);
}  // namespace cpu

}  // namespace selscan
