#include "support/abi.h"

namespace selscan_support {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> s(sizes.size(), 1);
  for (int i = static_cast<int>(sizes.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * sizes[i + 1];
  return s;
}

selscan_tensor_t contiguous_desc(void* data, int32_t dtype, const std::vector<int64_t>& sizes) {
  selscan_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(sizes.size());
  const std::vector<int64_t> strides = contiguous_strides(sizes);
  for (int i = 0; i < t.ndim && i < SELSCAN_MAX_NDIM; ++i) {
    t.sizes[i] = sizes[static_cast<size_t>(i)];
    t.strides[i] = strides[static_cast<size_t>(i)];
  }
  return t;
}

selscan_bwd_args_t bwd_args_with_inputs_of(const selscan_fwd_args_t& f, bool deterministic) {
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

std::string status_text(selscan_status_t st) {
  std::string s = selscan_status_string(st);
  const char* msg = selscan_last_error();
  if (msg != nullptr && *msg != '\0') s += std::string(": ") + msg;
  return s;
}

}  // namespace selscan_support
