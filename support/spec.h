// One selective-scan problem as the tests, the benchmarks and the `selscan` command describe it: sizes,
// dtypes, which optional inputs and outputs are present, and how the tests lay out and draw its tensors.
#pragma once

#include <cstdint>
#include <string>

#include "selscan/selscan.h"

namespace selscan_support {

// Tensor layouts of the tests' strided cases (tests/common/case.h); everything else is contiguous.
enum class Strides {
  contiguous,
  mamba_inner,  // as mamba_inner_fn passes them: delta/out/dout/du/ddelta (L, Bt*L, 1); z/dz/out_z batch 2*D*L
  padded,       // every tensor padded between dims, weights transposed, (Bt, D, N) states channel-fastest
};

struct CaseSpec {
  int64_t batch = 2, dim = 4, seqlen = 64, dstate = 8, groups = 1;
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  bool complex = false;
  bool var_B = true, var_C = true;
  bool has_D = true, has_z = true, has_delta_bias = true, softplus = true, has_h0 = false;
  bool with_x = true, with_last_state = true;  // optional forward outputs requested
  bool with_dh0 = true;                        // request dh0 when h0 is given
  bool recompute_out_z = false;                // request out_z from the backward (needs z)
  bool deterministic = false;                  // the backward's deterministic mode
  bool bc_3d = false;                          // variable B/C as (Bt, N, L) (groups must be 1)
  Strides strides = Strides::contiguous;
  bool slow_decay = false;  // A close to 0 so that states carry far (across chunks)
  double delta_lo = 0.0, delta_hi = 0.5;  // delta ~ uniform[lo, hi) (upstream: 0.5 * rand)
  uint64_t seed = 1;

  int64_t nchunks() const { return (seqlen + SELSCAN_CHUNK - 1) / SELSCAN_CHUNK; }
  int64_t btl() const { return batch * dim * seqlen; }                 // elements of one (Bt, D, L) tensor
  int64_t bc_numel() const { return batch * groups * dstate * seqlen; }  // elements of one variable B or C
  // Bt*D*L*N: the state updates (one decay exp and one FMA each) of one direction.
  double state_updates() const {
    return static_cast<double>(batch) * static_cast<double>(dim) * static_cast<double>(seqlen) *
           static_cast<double>(dstate);
  }
  std::string str() const;         // every field, for test messages
  std::string shape_text() const;  // "2x768x1024:16", ":16:2" with groups (parse_shape's notation)
  std::string flags_text() const;  // "var B/C, D, z, delta_bias, softplus"
};

// A problem of the given sizes with every other field at its default.
CaseSpec case_spec(int64_t batch, int64_t dim, int64_t seqlen, int64_t dstate, int32_t itype, int64_t groups = 1);
// "BtxDxL:N" or "BtxDxL:N:G" (positive integers, G dividing D) into the spec's sizes. False with `err` set
// when malformed.
bool parse_shape(const std::string& text, CaseSpec* s, std::string* err);

}  // namespace selscan_support
