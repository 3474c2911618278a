// Host tensors for tests: caller-owned storage in the tensor's own dtype, any non-negative strides, guard
// bytes around (and between) the elements, and selscan_tensor_t descriptors over them. Host storage is the
// canonical copy; a device runner copies `storage` to the device whole (guards included) and back.
#pragma once

#include <complex>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "selscan/selscan.h"
#include "support/abi.h"
#include "support/dtype.h"
#include "support/reference.h"
#include "support/rng.h"
#include "support/spec.h"

namespace selscan_test {

// The tests speak the support library's vocabulary (CaseSpec, the float64 reference, the dtype conversions).
using namespace selscan_support;

constexpr unsigned char kPoison = 0xFF;  // NaN in every float format we use
constexpr unsigned char kGuard = 0xA5;   // bytes outside the elements of an input / around an output
constexpr int64_t kGuardElems = 8;       // guard elements before and after the span

struct Tensor {
  int32_t dtype = SELSCAN_DTYPE_FLOAT32;
  std::vector<int64_t> sizes, strides;  // elements of dtype
  int64_t offset = 0;                   // elements before element 0 (the leading guard)
  std::vector<unsigned char> storage;   // guard + span + guard (empty = absent tensor)

  bool present() const { return !storage.empty(); }
  int ndim() const { return static_cast<int>(sizes.size()); }
  int64_t numel() const;
  int64_t esize() const { return dtype_size(dtype); }
  // Element offset (in elements, relative to element 0) of the multi-index idx.
  int64_t index(const std::vector<int64_t>& idx) const;
  // Descriptor whose data points at element 0 of `base` (storage copied elsewhere, e.g. on a device); an
  // absent tensor gives data = NULL.
  selscan_tensor_t desc(void* base) const;
  selscan_tensor_t desc() { return desc(present() ? storage.data() : nullptr); }

  // Element values as double (real dtypes) or complex (complex64; real dtypes give imag 0).
  double get(const std::vector<int64_t>& idx) const;
  cd getc(const std::vector<int64_t>& idx) const;
  // Stores v rounded to the dtype (RNE).
  void set(const std::vector<int64_t>& idx, double v);
  void setc(const std::vector<int64_t>& idx, cd v);

  // Every element in C order (real: one double each; complex: re, im interleaved).
  std::vector<double> values() const;

  // Fill every byte with `byte` (poison for outputs).
  void fill_bytes(unsigned char byte);
  // Empty string if every element byte differs from an all-`poison` element (i.e. was written) and every
  // non-element byte still equals `guard`; else a description of the first problem.
  std::string check_written(unsigned char poison, unsigned char guard) const;
  // Empty string if every non-element byte still equals `guard`.
  std::string check_guards(unsigned char guard) const;
  // Element-by-element equality of the bytes of two tensors with the same shape (bitwise reproducibility).
  bool same_bytes(const Tensor& other) const;

 private:
  void for_each_offset(const std::function<void(int64_t)>& f) const;
  std::vector<char> element_mask() const;  // 1 for bytes that belong to an element
};

// Layout of a new tensor: dimension order from innermost to outermost, and extra elements of padding added
// after each dimension's extent (pad[k] for order[k]). Empty order = C order, no padding.
struct Layout {
  std::vector<int> order;
  std::vector<int64_t> pad;
};

// A tensor of the given shape, every byte set to `fill` (kGuard for inputs before they are written).
Tensor make_tensor(int32_t dtype, const std::vector<int64_t>& sizes, const Layout& layout = {},
                   unsigned char fill = kGuard);
// The same with explicit non-negative strides (0 = broadcast; gaps between elements are guard bytes).
Tensor make_strided(int32_t dtype, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                    unsigned char fill = kGuard);
// Sets every element, in C order of the indices, to gen() rounded to the dtype.
void fill_values(Tensor& t, const std::function<double()>& gen);

}  // namespace selscan_test
