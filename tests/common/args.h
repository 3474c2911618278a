// Small builders of ABI structs shared by the tests.
#pragma once

#include <cstdint>
#include <vector>

#include "selscan/selscan.h"

namespace selscan_test {

// A contiguous (row-major) descriptor over `data`.
inline selscan_tensor_t contiguous_desc(void* data, int32_t dtype, const std::vector<int64_t>& sizes) {
  selscan_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(sizes.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.sizes[i] = sizes[static_cast<size_t>(i)];
    t.strides[i] = stride;
    stride *= sizes[static_cast<size_t>(i)];
  }
  return t;
}

// The backward's struct with the forward's inputs and flags (it takes them again); the caller adds dout, the
// saved tensors and the gradient outputs.
inline selscan_bwd_args_t bwd_args_with_inputs_of(const selscan_fwd_args_t& f, bool deterministic) {
  selscan_bwd_args_t b{};
  b.struct_size = sizeof(b);
  b.u = f.u;
  b.delta = f.delta;
  b.A = f.A;
  b.B = f.B;
  b.C = f.C;
  b.D = f.D;
  b.z = f.z;
  b.delta_bias = f.delta_bias;
  b.h0 = f.h0;
  b.delta_softplus = f.delta_softplus;
  b.deterministic = deterministic ? 1 : 0;
  return b;
}

}  // namespace selscan_test
