#include "tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace selscan_test {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t Tensor::index(const std::vector<int64_t>& idx) const {
  if (idx.size() != sizes.size()) throw std::invalid_argument("Tensor::index: wrong number of indices");
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i] < 0 || idx[i] >= sizes[i]) throw std::out_of_range("Tensor::index: index out of range");
    off += idx[i] * strides[i];
  }
  return off;
}

selscan_tensor_t Tensor::desc(void* base) const {
  selscan_tensor_t t{};
  t.dtype = dtype;
  t.ndim = ndim();
  for (int i = 0; i < ndim() && i < SELSCAN_MAX_NDIM; ++i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = strides[i];
  }
  t.data = (present() && base != nullptr) ? static_cast<unsigned char*>(base) + offset * esize() : nullptr;
  return t;
}

double Tensor::get(const std::vector<int64_t>& idx) const {
  const unsigned char* p = storage.data() + (offset + index(idx)) * esize();
  return load_real(dtype == SELSCAN_DTYPE_COMPLEX64 ? SELSCAN_DTYPE_FLOAT32 : dtype, p);
}

cd Tensor::getc(const std::vector<int64_t>& idx) const {
  const unsigned char* p = storage.data() + (offset + index(idx)) * esize();
  if (dtype != SELSCAN_DTYPE_COMPLEX64) return {load_real(dtype, p), 0.0};
  return {load_real(SELSCAN_DTYPE_FLOAT32, p), load_real(SELSCAN_DTYPE_FLOAT32, p + 4)};
}

void Tensor::set(const std::vector<int64_t>& idx, double v) {
  if (dtype == SELSCAN_DTYPE_COMPLEX64) return setc(idx, cd(v, 0.0));
  store_real(dtype, storage.data() + (offset + index(idx)) * esize(), v);
}

void Tensor::setc(const std::vector<int64_t>& idx, cd v) {
  unsigned char* p = storage.data() + (offset + index(idx)) * esize();
  if (dtype != SELSCAN_DTYPE_COMPLEX64) return store_real(dtype, p, v.real());
  store_real(SELSCAN_DTYPE_FLOAT32, p, v.real());
  store_real(SELSCAN_DTYPE_FLOAT32, p + 4, v.imag());
}

void Tensor::for_each_offset(const std::function<void(int64_t)>& f) const {
  const int64_t n = numel();
  std::vector<int64_t> idx(sizes.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides[i];
    f(off);
    for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
      if (++idx[i] < sizes[i]) break;
      idx[i] = 0;
    }
  }
}

std::vector<double> Tensor::values() const {
  std::vector<double> v;
  const bool cplx = dtype == SELSCAN_DTYPE_COMPLEX64;
  v.reserve(static_cast<size_t>(numel() * (cplx ? 2 : 1)));
  for_each_offset([&](int64_t off) {
    const unsigned char* p = storage.data() + (offset + off) * esize();
    if (cplx) {
      v.push_back(load_real(SELSCAN_DTYPE_FLOAT32, p));
      v.push_back(load_real(SELSCAN_DTYPE_FLOAT32, p + 4));
    } else {
      v.push_back(load_real(dtype, p));
    }
  });
  return v;
}

void Tensor::fill_bytes(unsigned char byte) { std::fill(storage.begin(), storage.end(), byte); }

std::vector<char> Tensor::element_mask() const {
  std::vector<char> mask(storage.size(), 0);
  const int64_t es = esize();
  for_each_offset([&](int64_t off) {
    for (int64_t b = 0; b < es; ++b) mask[static_cast<size_t>((offset + off) * es + b)] = 1;
  });
  return mask;
}

std::string Tensor::check_guards(unsigned char guard) const {
  const std::vector<char> mask = element_mask();
  for (size_t i = 0; i < storage.size(); ++i)
    if (!mask[i] && storage[i] != guard) {
      std::ostringstream os;
      os << "byte " << i << " outside the elements was modified (storage of " << storage.size() << " bytes)";
      return os.str();
    }
  return {};
}

std::string Tensor::check_written(unsigned char poison, unsigned char guard) const {
  std::string g = check_guards(guard);
  if (!g.empty()) return g;
  const int64_t es = esize();
  std::string err;
  int64_t k = 0;
  for_each_offset([&](int64_t off) {
    if (!err.empty()) return;
    const unsigned char* p = storage.data() + (offset + off) * es;
    bool all_poison = true;
    for (int64_t b = 0; b < es; ++b) all_poison = all_poison && p[b] == poison;
    if (all_poison) {
      std::ostringstream os;
      os << "element " << k << " (C order) was not written";
      err = os.str();
    }
    ++k;
  });
  return err;
}

bool Tensor::same_bytes(const Tensor& other) const {
  if (sizes != other.sizes || dtype != other.dtype) return false;
  const int64_t es = esize();
  std::vector<int64_t> mine, theirs;
  for_each_offset([&](int64_t off) { mine.push_back(off); });
  other.for_each_offset([&](int64_t off) { theirs.push_back(off); });
  for (size_t i = 0; i < mine.size(); ++i)
    if (std::memcmp(storage.data() + (offset + mine[i]) * es, other.storage.data() + (other.offset + theirs[i]) * es,
                    static_cast<size_t>(es)) != 0)
      return false;
  return true;
}

Tensor make_strided(int32_t dtype, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                    unsigned char fill) {
  if (strides.size() != sizes.size()) throw std::invalid_argument("make_strided: one stride per dim");
  Tensor t;
  t.dtype = dtype;
  t.sizes = sizes;
  t.strides = strides;
  int64_t span = 1;
  for (size_t i = 0; i < sizes.size(); ++i) span += (sizes[i] - 1) * strides[i];
  t.offset = kGuardElems;
  t.storage.assign(static_cast<size_t>((span + 2 * kGuardElems) * t.esize()), fill);
  return t;
}

void fill_values(Tensor& t, const std::function<double()>& gen) {
  std::vector<int64_t> idx(t.sizes.size(), 0);
  for (int64_t k = 0, n = t.numel(); k < n; ++k) {
    t.set(idx, gen());
    for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
      if (++idx[static_cast<size_t>(i)] < t.sizes[static_cast<size_t>(i)]) break;
      idx[static_cast<size_t>(i)] = 0;
    }
  }
}

Tensor make_tensor(int32_t dtype, const std::vector<int64_t>& sizes, const Layout& layout, unsigned char fill) {
  Tensor t;
  t.dtype = dtype;
  t.sizes = sizes;
  const int n = static_cast<int>(sizes.size());
  if (layout.order.empty()) {
    t.strides = contiguous_strides(sizes);
  } else {
    if (static_cast<int>(layout.order.size()) != n) throw std::invalid_argument("make_tensor: order size");
    t.strides.assign(static_cast<size_t>(n), 0);
    int64_t next = 1;
    for (int k = 0; k < n; ++k) {
      const int dim = layout.order[static_cast<size_t>(k)];
      t.strides[static_cast<size_t>(dim)] = next;
      const int64_t pad = k < static_cast<int>(layout.pad.size()) ? layout.pad[static_cast<size_t>(k)] : 0;
      next = next * sizes[static_cast<size_t>(dim)] + pad;
    }
  }
  int64_t span = 1;
  for (int i = 0; i < n; ++i) span += (sizes[static_cast<size_t>(i)] - 1) * t.strides[static_cast<size_t>(i)];
  t.offset = kGuardElems;
  t.storage.assign(static_cast<size_t>((span + 2 * kGuardElems) * t.esize()), fill);
  return t;
}

}  // namespace selscan_test
