// Test cases of the causal conv1d (selscan_conv1d_fwd / _bwd / _update; header section 5c, src/conv1d.h): random
// inputs of any dtype combination, width and layout, with the optional inputs, seq_idx segments (padding ids < 0
// included), packed sequences (empty ones included), the conv_states pool (cache_indices with padding entries,
// has_initial_state), and the backward's options; the decode update with circular or shifting states, slot indices
// (padding and out-of-pool entries) and either state dtype. The oracle is support/reference_conv1d.h, run sequence
// by sequence; the checks poison every output, compare within tolerances derived from the oracle's fp32 error
// scales, and verify that no byte outside the outputs' elements changed.
//
// Device-agnostic like case.h: a GPU test passes a DeviceMemory and the same case runs on device copies of every
// tensor (guards included), all copied back before the checks.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "case.h"
#include "selscan/selscan.h"
#include "tensor.h"

namespace selscan_test {

// How the (rows, D, L) tensors (and the states, weight, pool) are laid out.
enum class ConvLayout {
  channel_first,  // C order: stride 1 over time
  channel_last,   // stride 1 over channels (time, then batch outside): Mamba's layout
  strided         // gaps everywhere: neither time nor channels has stride 1
};
const char* layout_name(ConvLayout l);

struct Conv1dSpec {
  int64_t batch = 2, dim = 8, seqlen = 37, width = 4;  // batch / seqlen: of a dense call (packed: from lens)
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  int32_t wtype = SELSCAN_DTYPE_FLOAT32;  // weight and bias: float32 or itype
  ConvLayout layout = ConvLayout::channel_first;
  bool bias = true, silu = true;
  bool seq_idx = false;  // dense only: random segments per row, some with negative (padding) ids
  bool initial_states = false, final_states = false;
  // Packed sequences: non-empty lens gives cu_seqlens and (1, D, sum) tensors; lengths may be 0 (not all).
  std::vector<int64_t> lens;
  int32_t cu_dtype = SELSCAN_DTYPE_INT32;
  // The pool (forward): slots > 0 gives conv_states (slots, D, state_len).
  int64_t slots = 0;
  int64_t state_len = 0;                // 0: width - 1
  std::vector<int64_t> cache_indices;   // per sequence (empty: absent, sequence b uses slot b)
  int64_t pad_slot_id = -1;
  int32_t idx_dtype = SELSCAN_DTYPE_INT32;
  std::vector<int> has_init;            // per sequence (empty: absent)
  int32_t init_dtype = SELSCAN_DTYPE_BOOL;
  // Backward.
  bool dfinal_states = false, dinitial_states = false, deterministic = true;
  int32_t dwtype = SELSCAN_DTYPE_FLOAT32;  // dweight and dbias: float32 or wtype
  uint64_t seed = 1;

  std::string str() const;
  bool packed() const { return !lens.empty(); }
  int64_t seqs() const { return packed() ? static_cast<int64_t>(lens.size()) : batch; }
  int64_t total() const;  // the time axis: seqlen, or the sum of lens
  int64_t len(int64_t b) const { return packed() ? lens[static_cast<size_t>(b)] : seqlen; }
  int64_t hist_len() const { return slots > 0 ? (state_len > 0 ? state_len : width - 1) : width - 1; }
};

struct Conv1dCase {
  Conv1dSpec spec;
  Tensor x, weight, bias, seq_idx, init;            // inputs (init: initial_states)
  Tensor cu_seqlens, cache_indices, has_init;        // serving inputs
  Tensor pool, pool_in;                              // conv_states (in and out), and as it was before the call
  Tensor out, fin;                                   // forward outputs (fin: final_states)
  Tensor bwd_init;   // the backward's initial_states: what each sequence started from (pool slot columns gathered)
  Tensor dout, dfin;                                 // backward inputs
  Tensor dx, dweight, dbias, dinit;                  // backward outputs

  int64_t rows() const { return spec.packed() ? 1 : spec.batch; }
  int64_t start(int64_t b) const;  // along the time axis
  int64_t row(int64_t b) const { return spec.packed() ? 0 : b; }
  bool pad(int64_t b) const;       // a padding sequence (cache_indices entry == pad_slot_id)
  // Its cache_indices entry names no slot of the pool (not pad_slot_id, outside [0, slots)): CUDA writes NaN to its
  // out and touches no slot; CPU calls reject the call.
  bool out_of_pool(int64_t b) const;
  int64_t slot(int64_t b) const;   // its pool slot (-1: none)
  bool from_state(int64_t b) const;  // it starts from its initial_states row or slot

  selscan_conv1d_fwd_args_t fwd_args(const Case::PtrMap& ptr);
  selscan_conv1d_bwd_args_t bwd_args(const Case::PtrMap& ptr);
  std::vector<Tensor*> all();
};

Conv1dCase make_conv1d_case(const Conv1dSpec& spec);

// Poison the outputs (the pool gets its initial contents back), then run through the public ABI on host pointers, or
// (dev != nullptr) on device copies of every tensor, all copied back afterwards. The backward asks for its
// workspace and allocates it through `dev` (a host call needs none).
selscan_status_t run_conv1d_fwd(Conv1dCase& c, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr);
selscan_status_t run_conv1d_bwd(Conv1dCase& c, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr);

// The oracle, laid out like the case's tensors' values(), with the fp32 error scales of each result.
struct Conv1dRef {
  std::vector<double> out, cond_out, fin, pool;
  std::vector<double> dx, cond_dx, dweight, cond_dweight, dbias, cond_dbias, dinit, cond_dinit;
};
Conv1dRef conv1d_reference(const Conv1dCase& c);

// Every check of a finished call: each output element written and within tolerance of the oracle (final_states and
// pool slots exactly, they are copies), padding exactly 0, pool slots no sequence writes bit-identical to `before`,
// inputs unchanged, every guard byte intact. `before` is the case as built.
void expect_conv1d_fwd_ok(const Conv1dCase& after, const Conv1dCase& before);
void expect_conv1d_bwd_ok(const Conv1dCase& after, const Conv1dCase& before);

// The forward and the backward of `spec` on `exec`, each checked; the backward once more (deterministic specs) and
// compared byte for byte.
void check_conv1d(const Conv1dSpec& spec, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr);

// The shared matrix (CPU and GPU run the same cases), each with a test name: dtypes x weight dtype x width x
// layout, the optional inputs, seq_idx, short sequences, packed sequences, the pool, the backward's options.
struct NamedConv1dSpec {
  std::string name;
  Conv1dSpec spec;
};
inline void PrintTo(const NamedConv1dSpec& s, std::ostream* os) { *os << s.spec.str(); }
std::vector<NamedConv1dSpec> conv1d_matrix();
// Pool calls with cache_indices entries outside the pool: for the GPU suites (CPU calls reject them).
std::vector<NamedConv1dSpec> conv1d_out_of_pool_specs();

// ------------------------------------------------------------------------------------------ the decode update
struct Conv1dUpdateSpec {
  int64_t batch = 3, dim = 8, tokens = 1, width = 4, state_len = 3;
  bool tokens_dim = false;  // x and out (Bt, D, T) even for T = 1 (forced when tokens > 1)
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  int32_t wtype = SELSCAN_DTYPE_FLOAT32;
  int32_t state_dtype = SELSCAN_DTYPE_FLOAT32;  // float32 or itype
  bool bias = true, silu = true;
  std::vector<int64_t> cache_seqlens;  // per sequence (empty: absent, the state shifts)
  int32_t seqlens_dtype = SELSCAN_DTYPE_INT32;
  // Slots: 0 = no conv_state_indices (S = batch); else S slots and one entry per sequence.
  int64_t slots = 0;
  std::vector<int64_t> indices;  // explicit entries; empty: distinct random slots
  int64_t pad_slot_id = -1;
  int32_t idx_dtype = SELSCAN_DTYPE_INT32;
  bool strided = false;  // gaps in x, out, weight and the state (else contiguous)
  uint64_t seed = 1;

  std::string str() const;
};

struct Conv1dUpdateCase {
  Conv1dUpdateSpec spec;
  Tensor x, weight, bias, state, state_in, out, cache_seqlens, indices;

  int64_t slots() const { return spec.slots > 0 ? spec.slots : spec.batch; }
  // The slot sequence b uses: -1 padding, -2 an entry outside the pool (CUDA: NaN out, nothing touched).
  int64_t slot_of(int64_t b) const;
  selscan_conv1d_update_args_t args(const Case::PtrMap& ptr);
  std::vector<Tensor*> all();
};

Conv1dUpdateCase make_conv1d_update_case(const Conv1dUpdateSpec& spec);
// Poison out, restore the state, run (host pointers or device copies, as run_conv1d_fwd).
selscan_status_t run_conv1d_update(Conv1dUpdateCase& c, const selscan_exec_t& exec,
                                   const DeviceMemory* dev = nullptr);
struct Conv1dUpdateRef {
  std::vector<double> out, cond_out;  // (Bt, D, T) in C order
  std::vector<double> state;          // the whole conv_state (S, D, state_len) in C order
};
Conv1dUpdateRef conv1d_update_reference(const Conv1dUpdateCase& c);
// out within tolerance (padding exactly 0, out-of-pool NaN), the slots used exactly the oracle's, every other slot
// bit-identical, inputs unchanged, guards intact.
void expect_conv1d_update_ok(const Conv1dUpdateCase& after, const Conv1dUpdateCase& before);

struct NamedConv1dUpdateSpec {
  std::string name;
  Conv1dUpdateSpec spec;
};
inline void PrintTo(const NamedConv1dUpdateSpec& s, std::ostream* os) { *os << s.spec.str(); }
std::vector<NamedConv1dUpdateSpec> conv1d_update_matrix();
// Updates whose conv_state_indices name slots outside the pool: for the GPU suites (CPU calls reject them).
std::vector<NamedConv1dUpdateSpec> conv1d_update_out_of_pool_specs();

}  // namespace selscan_test
