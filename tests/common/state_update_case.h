// Test cases of the decode step (selscan_state_update): random inputs in either form, with optional inputs,
// tokens, groups, a state pool with indices (padding and out-of-pool entries included), broadcast (stride-0)
// inputs and padded layouts; a float64 oracle written from the math (include/selscan/selscan.h, section 5b);
// and the checks every test applies. Device-agnostic like case.h: a GPU test passes a DeviceMemory and the
// same case runs on device copies of its storages.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "case.h"
#include "selscan/selscan.h"
#include "tensor.h"

namespace selscan_test {

struct StateUpdateSpec {
  bool heads = false;        // heads form (state (S, H, P, N)) or Mamba-1 form (state (S, D, N))
  int64_t batch = 3;
  int64_t tokens = 1;
  bool tokens_dim = false;   // x has a tokens dim (forced when tokens > 1)
  int64_t nheads = 8;        // H (the Mamba-1 form's D)
  int64_t headdim = 1;       // P (forced to 1 in the Mamba-1 form)
  int64_t dstate = 16;
  int64_t groups = 1;
  bool groups_dim = false;   // B and C have a groups dim (forced when groups > 1)
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  int32_t state_dtype = SELSCAN_DTYPE_FLOAT32;
  int32_t dt_dtype = -1, bc_dtype = -1, z_dtype = -1;  // -1: itype
  bool has_D = true, has_z = false, has_bias = true, softplus = true;
  // State pool: 0 = no state_batch_indices (S = batch); else S slots and one index per sequence.
  int64_t pool = 0;
  int32_t idx_dtype = SELSCAN_DTYPE_INT32;
  int64_t idx_stride = 1;
  std::vector<int64_t> indices;  // explicit entries; empty: distinct random slots of the pool
  int64_t pad_slot = -1;
  // dst_state_batch_indices' entries (idx_dtype, idx_stride apart); empty: absent (the in-place update).
  std::vector<int64_t> dst;
  // Mamba-2's broadcasts: A (H, P, N) with strides (1, 0, 0), and dt, D and dt_bias with stride 0 over P (the
  // Mamba-1 form: A (D, N) with strides (1, 0)).
  bool broadcast = false;
  // Non-contiguous layouts everywhere (padding between dims, state slots padded): the kernels' scalar paths.
  bool padded = false;
  uint64_t seed = 1;

  std::string str() const;
};

struct StateUpdateCase {
  StateUpdateSpec spec;
  Tensor x, dt, A, B, C, D, z, dt_bias, state, out;
  std::vector<int64_t> indices;             // the entries, as given
  std::vector<unsigned char> idx_storage;   // state_batch_indices in its dtype (empty: absent)
  std::vector<unsigned char> dst_storage;   // dst_state_batch_indices in the same dtype (empty: absent)

  int64_t slots() const { return spec.pool > 0 ? spec.pool : spec.batch; }
  // The slot sequence b reads: -1 for a pad entry, -2 for an entry (source or destination) outside the pool.
  int64_t slot_of(int64_t b) const;
  // The slot sequence b writes: its destination (its source without dst), -1 when it writes none.
  int64_t dst_of(int64_t b) const;
  std::vector<Tensor*> tensors();  // every present Tensor
  // The struct over storages at the addresses `ptr` gives (host: storage.data(); device: its copy), the
  // indices at `idx` and the destinations at `dst` (when the case has them).
  selscan_state_update_args_t args(const Case::PtrMap& ptr, void* idx, void* dst = nullptr);
};

StateUpdateCase make_state_update_case(const StateUpdateSpec& spec);

// The shared test matrix (CPU and GPU run the same cases): both forms x dtypes x gate, groups and broadcasts,
// grouped B/C, every combination of the optional inputs, T > 1, the dstate range, mixed input dtypes, pools
// with int32/int64 strided indices, padding and out-of-pool entries, padded layouts. Each with a test name.
struct NamedStateUpdateSpec {
  std::string name;
  StateUpdateSpec spec;
};
// How GoogleTest prints a matrix entry (its spec, not the bytes).
inline void PrintTo(const NamedStateUpdateSpec& s, std::ostream* os) { *os << s.spec.str(); }
std::vector<NamedStateUpdateSpec> state_update_matrix();

// Poisons out, then runs selscan_state_update on `exec`: on the host storages, or (dev != nullptr) on device
// copies of every storage (guards included), which all come back. `misalign` places every device copy one
// element past an aligned base (element-aligned as the ABI requires, never 16-byte aligned). `call`, when given,
// runs instead of selscan_state_update on the same arguments (a GPU test forcing one decode kernel).
using StateUpdateCall = std::function<selscan_status_t(const selscan_state_update_args_t&, const selscan_exec_t&)>;
selscan_status_t run_state_update(StateUpdateCase& c, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr,
                                  bool misalign = false, const StateUpdateCall& call = {});

// The oracle, from the inputs of `before` (the case as built, before any call).
struct StateUpdateRef {
  std::vector<double> out;    // (Bt, T, H, P) in C order
  std::vector<double> state;  // the whole pool (S, H, P, N) in C order
};
StateUpdateRef ref_state_update(const StateUpdateCase& before);

// Every check of a finished call against the oracle: out and the updated slots within the tolerances of the
// dtypes; padding sequences' out exactly 0 and out-of-pool ones NaN; slots no sequence updates bit-identical
// to `before`; inputs unchanged; no byte outside any tensor's elements written.
void expect_state_update_ok(const StateUpdateCase& after, const StateUpdateCase& before);

// Serving's equivalence: a prefill of L tokens with the scan (selscan_fwd with last_state), then `steps` tokens
// through selscan_state_update from that state (`tokens_per_call` at a time, x/dt/z/B/C as strided views into
// the scan's own (Bt, D, L + steps) inputs), gives the outputs and the final state of one scan of L + steps.
struct PrefillDecodeSpec {
  int64_t batch = 2, dim = 16, dstate = 16, groups = 1, prefill = 40, steps = 6, tokens_per_call = 1;
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  bool has_D = true, has_z = true, has_bias = true, softplus = true;
  uint64_t seed = 7;
  std::string str() const;
};
void expect_prefill_then_decode_equals_scan(const PrefillDecodeSpec& spec, const selscan_exec_t& exec,
                                            const DeviceMemory* dev = nullptr);

}  // namespace selscan_test
