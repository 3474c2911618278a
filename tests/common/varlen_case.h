// Serving test cases (docs/serving.md): sequences packed along time with cu_seqlens, initial states from h0 rows or
// a state pool chosen by cache_indices, padding entries, has_initial_state. Device-agnostic like case.h: a GPU test
// passes a DeviceMemory and the case runs on device copies of all its tensors.
//
// The oracle of a serving call is the float64 reference run sequence by sequence (a RefProblem of batch 1 each),
// with the weight gradients summed over the sequences; the library's separate dense calls of the same sequences
// are the other comparison (case.h's Case, inputs copied from the packed tensors).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "case.h"
#include "support/reference.h"
#include "selscan/selscan.h"
#include "tensor.h"

namespace selscan_test {

enum class InitFrom { none, h0, pool };

struct VarlenSpec {
  std::vector<int64_t> lens = {5, 0, 33, 12};  // sequence lengths; 0 allowed
  bool packed = true;  // cu_seqlens and (1, D, total) tensors; false: a dense (Bt, D, L) batch (all lens equal)
  int64_t dim = 4, dstate = 8, groups = 2;
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  bool complex = false, var_B = true, var_C = true;
  bool has_D = true, has_z = true, has_delta_bias = true, softplus = true;
  InitFrom init = InitFrom::none;
  std::vector<int> has_init;            // per sequence (empty: the tensor is absent)
  std::vector<int64_t> cache_indices;   // per sequence (empty: absent)
  int64_t slots = 0;                    // pool slots (InitFrom::pool)
  int64_t pad_slot_id = 0;              // with cache_indices
  int32_t cu_dtype = SELSCAN_DTYPE_INT32, idx_dtype = SELSCAN_DTYPE_INT32, init_dtype = SELSCAN_DTYPE_BOOL;
  // Block-wise state caching (block_size > 0, with init = pool and no cache_indices): block_table[b] names the
  // slots of sequence b's blocks, context_lens[b] its tokens before this call (empty: the tensor is absent).
  int64_t block_size = 0;
  std::vector<std::vector<int64_t>> block_table;
  std::vector<int64_t> context_lens;
  int32_t table_dtype = SELSCAN_DTYPE_INT32, ctx_dtype = SELSCAN_DTYPE_INT64;
  bool with_x = true, with_last_state = true;  // last_state: not with a pool
  bool with_dh0 = true;
  bool slow_decay = false;
  uint64_t seed = 1;

  std::string str() const;
  int64_t batch() const { return static_cast<int64_t>(lens.size()); }
  int64_t total() const;
  bool pad(int64_t b) const;
  int64_t ctx(int64_t b) const { return context_lens.empty() ? 0 : context_lens[static_cast<size_t>(b)]; }
  // Block mode: the (block, slot) pairs sequence b writes (boundaries and its final block; pad entries skipped),
  // in order; the last pair is the final state's.
  std::vector<std::pair<int64_t, int64_t>> written_blocks(int64_t b) const;
  // The pool slot sequence b starts from (when starts_from_state(b)).
  int64_t initial_slot(int64_t b) const;
  // Sequence b starts from its h0 row or slot (not padding, has_initial_state set or absent, a source given).
  bool starts_from_state(int64_t b) const;
};

struct VarlenCase {
  VarlenSpec spec;
  Tensor u, delta, A, B, C, D, z, delta_bias, h0;  // inputs: (rows, D, T), B/C (rows, G, N, T or 2T), h0 (Bt, D, N)
  Tensor cu_seqlens, cache_indices, has_initial_state, block_table, context_lens;
  Tensor pool;      // ssm_states (S, D, N): in and out
  Tensor pool_in;   // the pool before the forward (for the oracle and the untouched-slot checks)
  Tensor out, out_z, x, last_state, dout;
  Tensor du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0;
  Tensor bwd_h0;    // the backward's h0: h0, or the pool rows the sequences started from (gathered)

  int64_t start(int64_t b) const;  // offset of sequence b along T (b * L for a dense batch)
  int64_t rows() const { return spec.packed ? 1 : spec.batch(); }
  int64_t T() const { return spec.packed ? spec.total() : spec.lens[0]; }

  selscan_fwd_args_t fwd_args(const Case::PtrMap& ptr);
  selscan_bwd_args_t bwd_args(const Case::PtrMap& ptr, bool deterministic = true);
  std::vector<Tensor*> all();
};

VarlenCase make_varlen_case(const VarlenSpec& spec);

// GpuVarlen.LongSequences' spec for dstate N (seed 10 + N), shared with the CPU tests that rebuild it
// (tests/cpu/test_varlen_numerics.cpp): five packed sequences, two of them longer than a chunk of x and one empty,
// slowly decaying states from h0 rows, fp32.
VarlenSpec long_sequences_spec(int64_t dstate);

// Poison the outputs (the pool keeps its contents) and run through the public ABI, on host pointers or on device
// copies of every tensor (all copied back afterwards).
selscan_status_t run_varlen_fwd(VarlenCase& c, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr);
selscan_status_t run_varlen_bwd(VarlenCase& c, const selscan_exec_t& exec, bool deterministic = true,
                                const DeviceMemory* dev = nullptr);

// The float64 oracle, laid out like the case's tensors' values().
struct VarlenRef {
  std::vector<double> out, out_z, last_state, pool, du, ddelta, dz, dA, dB, dC, dD, ddelta_bias, dh0;
  std::vector<double> x;  // only the chunk slots of real chunks are meaningful: x_mask says which
  std::vector<char> x_mask;
  // The gradients' condition scales in units of u = 2^-24 (RefBwd::cond_*, docs/numerics.md), laid out like
  // the gradients: the reduced ones summed over the sequences (their errors are independent, so their bounds
  // add), the per-step ones and dh0 per sequence.
  std::vector<double> cond_du, cond_ddelta, cond_dz, cond_dh0, cond_dA, cond_dB, cond_dC, cond_dD, cond_ddelta_bias;
};
VarlenRef varlen_reference(const VarlenCase& c);

// Sequence b's float64 problem (batch 1, the case's stored inputs at its offsets, h0 where it starts from a
// state) and, when `dout` is given, its dout.
RefProblem sequence_problem(const VarlenCase& c, int64_t b, std::vector<double>* dout = nullptr);

// The reduced gradients of a case's backward, by name, as values(): dA, dB, dC, and dD, ddelta_bias where present.
std::vector<std::pair<std::string, std::vector<double>>> varlen_reduced(const VarlenCase& c);
// The oracle's values of one of them as they are compared (variable dB/dC rounded to the itype, like the output).
std::vector<double> varlen_reduced_ref(const VarlenCase& c, const VarlenRef& r, const std::string& name);

// check_varlen's comparison of one reduced gradient's values `got` with the oracle: upstream's tolerance, or
// tol_scale k u cond where larger (varlen_reduced_bound).
::testing::AssertionResult varlen_reduced_close(const VarlenCase& c, const VarlenRef& r, const std::string& name,
                                                const std::vector<double>& got, double tol_scale = 1.0);

// The condition bound check_varlen gives a reduced gradient (dA, dB, dC, dD or ddelta_bias), element by element:
// scale k u cond with k = kCondK (compare.h; docs/numerics.md, "Reduced gradients of packed calls"); allclose takes
// the larger of it and upstream's atol + rtol |ref|. scale 1: a float32 result against float64; 2: two float32
// results against each other.
std::vector<double> varlen_reduced_bound(const VarlenRef& r, const std::string& name, double scale = 1.0);

// Gives sequence dst_b of `dst` the inputs of sequence src_b of `src` from its token `from` on (dst's length of
// them), and src's weights (A, D, delta_bias): a piece of a longer sequence, e.g. one chunk of a chunked prefill.
void copy_sequence_inputs(const VarlenCase& src, int64_t src_b, int64_t from, VarlenCase& dst, int64_t dst_b);

// Sequence b as a dense case (batch 1) with the same inputs (a zero-length sequence has none: not callable).
Case sequence_case(const VarlenCase& c, int64_t b);

// Compare every output of the case with the oracle at upstream's tolerances (scaled), the reduced gradients with
// tol_scale k u cond where larger (varlen_reduced_close); the padding rows must be exactly 0; x only at real chunk
// slots. `bwd`: the gradients too.
void check_varlen(VarlenCase& c, const VarlenRef& r, bool bwd, double tol_scale = 1.0);

}  // namespace selscan_test
