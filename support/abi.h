// Small builders of the public ABI's structs, shared by the tests, the benchmarks and the `selscan` command.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "selscan/selscan.h"

namespace selscan_support {

// C-order (row-major) strides of `sizes`, in elements.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);

// A contiguous (row-major) descriptor over `data`.
selscan_tensor_t contiguous_desc(void* data, int32_t dtype, const std::vector<int64_t>& sizes);

// The backward's struct with the forward's inputs and flags (it takes them again); the caller adds dout, the
// saved tensors and the gradient outputs.
selscan_bwd_args_t bwd_args_with_inputs_of(const selscan_fwd_args_t& f, bool deterministic);

// "invalid argument: <the library's message>" for a status the library returned just now on this thread.
std::string status_text(selscan_status_t st);

}  // namespace selscan_support
