// The causal depthwise convolution (selscan_conv1d_fwd / _bwd / _update) below the API layer: the one internal
// description of a call, built by validate_conv1d.cpp from the public structs, and the implementations that consume
// it (src/cpu/conv1d.cpp, kernels/conv1d/). POD, so the CUDA launchers pass it by value as a kernel parameter. No
// CUDA or fmt headers here.
//
// Every (b, d, t) tensor keeps its caller's strides, in elements of its own dtype: s[0] batch row, s[1] channel,
// s[2] time. The layout flags below only say which fast path a kernel may take; the generic path serves any
// strides.
//
// Semantics both paths implement (the header's section 5c, pinned where it leaves a choice):
//   - Sequence b of a call: row b and time [0, seqlen) of a dense call; row 0 and time [cu[b], cu[b+1]) of a packed
//     one (varlen). A packed sequence may be empty (length 0): it has no out/dout/dx elements; its final_states
//     row is still written (its initial states, or zeros: final_states[j] = xe(len - (W-1) + j)), and, like the
//     scan's block-wise caching, it reads and writes no conv_states slot.
//   - Its history xe(t) for t < 0: initial_states[b, d, W-1+t] for t >= -(W-1) when `init` is present; the slot's
//     column state_len + t for t >= -state_len when conv_states is present; 0 elsewhere, and everywhere when
//     has_init says 0 for b (the row or slot is then not read) or b is padding.
//   - Padding (cache_indices[b] == pad_slot_id): out 0 over the sequence's time, final_states row 0, no slot read or
//     written. Without cache_indices no sequence is padding and pad_slot_id is not read.
//   - The pool: a non-padding sequence of length len >= 1 writes its slot's column j (j < state_len) with
//     xe(len - state_len + j), every column (older inputs shift left; zeros where it started from zero).
//   - seq_idx (dense calls only, not with init/fin/dfin): the term of position t' = t-(W-1)+k in y(t) counts only
//     if t' >= 0 and seq_idx[b, t'] == seq_idx[b, t]; a position with seq_idx < 0 is padding: out 0, its dout
//     ignored (g = 0), and its dx is 0 (no non-padding output reads it).
//   - Backward: g(t) = dout(t) * silu'(y(t)) (y recomputed; dout(t) without SILU); dx(t) = sum_k w[k] g(t+(W-1)-k)
//     over the sequence (and segment), plus dfin[j] where t = len-(W-1)+j; dinit[j] = sum_k w[k] g(j-k) over
//     0 <= j-k < len, plus dfin[j-len] where j >= len; dweight[d,k] = sum over sequences and t of
//     g(t) xe(t-(W-1)+k); dbias[d] = sum g. dweight and dbias are overwritten (dwtype: both have it).
#pragma once

#include <cstdint>

#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"

namespace selscan {

// Literal strides, whatever the sizes: channel_first when s[2] == 1 for every streamed tensor (even where L == 1),
// else channel_last when s[1] == 1 for every one, else strided.
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
  Dtype dwtype;       // dweight, dbias (f32 or wtype; dbias has dweight's dtype); backward only (forward: wtype)
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
  int64_t pad_slot_id;   // read only with cache_indices (0 without)
  View cu_seqlens, conv_states, cache_indices, has_init;  // conv_states (slot, d, j): s[0], s[1], s[2]
  // has_init (forward only) applies to `init` or to conv_states, whichever is given. cache_indices without
  // conv_states only marks padding (its other entries are not read).

  static constexpr int64_t kMaxWidth = 4;  // the widest filter the kernels serve

  SELSCAN_HD int64_t rows() const { return varlen ? 1 : batch; }
  // Calls without per-step sequence logic (dense rows, at most initial_states) at the widest width: the
  // channel-first kernels have a lean kernel for them (kernels/conv1d/: fwd_plain, bwd_plain) and the channel-last
  // kernels a pipelined walk, both built with every tap live (narrower widths run the general code with idle taps:
  // kernels/conv1d/common.cuh, "width"), and the plan gives the lean row kernel longer runs.
  SELSCAN_HD bool plain_fwd() const {
    return width == kMaxWidth && !varlen && seq_idx.p == nullptr && cache_indices.p == nullptr &&
           conv_states.p == nullptr;
  }
  SELSCAN_HD bool plain_bwd() const { return width == kMaxWidth && !varlen && seq_idx.p == nullptr; }
};

// The decode update: T tokens per sequence advance that sequence's window of past inputs.
struct Conv1dUpdate {
  int64_t batch, dim, tokens, width, state_len, slots;
  Dtype itype, wtype, state_t;  // state_t: conv_state's dtype (f32 or itype)
  bool silu;
  bool seqlens_i64, idx_i64;
  int64_t pad_slot_id;
  View x, weight, bias, out;  // x, out (b, d, t): s[0], s[1], s[2] (s[2] = 0 when T = 1 without a T dim)
  View conv_state;            // (slot, d, j), state_t; with cache_seqlens a circular buffer (see the header)
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
