#include "checker.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "serving_index.h"

namespace selscan {
namespace {

const char* dtype_name(int32_t d) {
  switch (d) {
    case SELSCAN_DTYPE_FLOAT32: return "float32";
    case SELSCAN_DTYPE_FLOAT16: return "float16";
    case SELSCAN_DTYPE_BFLOAT16: return "bfloat16";
    case SELSCAN_DTYPE_COMPLEX64: return "complex64";
    case SELSCAN_DTYPE_INT32: return "int32";
    case SELSCAN_DTYPE_INT64: return "int64";
    case SELSCAN_DTYPE_BOOL: return "bool";
    default: return nullptr;
  }
}

std::string byte_range(uintptr_t lo, uintptr_t hi) { return fmt::format("[{:#x}, {:#x})", lo, hi); }

}  // namespace

std::string dtype_str(int32_t d) {
  const char* n = dtype_name(d);
  return n ? std::string(n) : fmt::format("dtype code {}", d);
}

int64_t dtype_bytes(int32_t d) {
  switch (d) {
    case SELSCAN_DTYPE_FLOAT16:
    case SELSCAN_DTYPE_BFLOAT16: return 2;
    case SELSCAN_DTYPE_COMPLEX64:
    case SELSCAN_DTYPE_INT64: return 8;
    case SELSCAN_DTYPE_BOOL: return 1;
    default: return 4;
  }
}

std::string shape_str(const int64_t* s, int n) {
  std::string r = "(";
  for (int i = 0; i < n; ++i) r += fmt::format(i ? ", {}" : "{}", s[i]);
  return r + (n == 1 ? ",)" : ")");
}

std::string given_shape(const selscan_tensor_t& t) {
  return t.ndim >= 0 && t.ndim <= SELSCAN_MAX_NDIM ? shape_str(t.sizes, t.ndim) : fmt::format("ndim={}", t.ndim);
}

Status Checker::failf(Status s, std::string msg) {
  if (ok()) status = fail(s, std::move(msg));
  return status;
}

bool Checker::presence(const selscan_tensor_t& t, const char* name, bool required, bool allowed, const char* why) {
  if (!ok()) return false;
  if (required && t.data == nullptr) {
    failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("{}: required{}, but its data pointer is NULL", name, why));
    return false;
  }
  if (!allowed && t.data != nullptr) {
    failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("{}: must be absent (data NULL){}", name, why));
    return false;
  }
  return t.data != nullptr;
}

void Checker::dtype(const selscan_tensor_t& t, const char* name, int32_t want, const char* what, int32_t alt) {
  if (!ok()) return;
  if (t.dtype != want && (alt < 0 || t.dtype != alt))
    failf(SELSCAN_STATUS_DTYPE_MISMATCH,
          fmt::format("{}: expected dtype {}{} ({}), got {}", name, dtype_str(want),
                      alt >= 0 && alt != want ? " or " + dtype_str(alt) : std::string(), what, dtype_str(t.dtype)));
}

void Checker::shape(const selscan_tensor_t& t, const char* name, const int64_t* want, int n, const char* what) {
  if (!ok()) return;
  bool same = t.ndim == n;
  for (int i = 0; same && i < n; ++i) same = t.sizes[i] == want[i];
  if (!same)
    failf(SELSCAN_STATUS_SHAPE_MISMATCH,
          fmt::format("{}: expected shape {} {}, got {}", name, shape_str(want, n), what, given_shape(t)));
}

void Checker::layout(const selscan_tensor_t& t, const char* name, bool unit_last, bool output) {
  if (!ok()) return;
  const int n = t.ndim;
  const int64_t esize = dtype_bytes(t.dtype);
  const int64_t align = t.dtype == SELSCAN_DTYPE_COMPLEX64 ? 4 : esize;  // complex64 is two floats
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  if ((base & static_cast<uintptr_t>(align - 1)) != 0) {  // align is a power of two
    failf(SELSCAN_STATUS_BAD_LAYOUT,
          fmt::format("{}: data pointer {} is not aligned to its {}-byte elements", name, t.data, align));
    return;
  }
  int64_t span = 0;  // largest element offset
  for (int i = 0; i < n; ++i) {
    if (t.strides[i] < 0) {
      failf(SELSCAN_STATUS_BAD_LAYOUT,
            fmt::format("{}: negative strides are not supported (stride[{}] = {})", name, i, t.strides[i]));
      return;
    }
    if (output && t.strides[i] == 0 && t.sizes[i] > 1) {
      failf(SELSCAN_STATUS_BAD_LAYOUT,
            fmt::format("{}: output with stride 0 in dim {} of size {} (elements would overlap)", name, i,
                        t.sizes[i]));
      return;
    }
    // An empty dimension reaches no element; counting it as 0 keeps span >= 0 for the bound below.
    const int64_t extent = t.sizes[i] > 0 ? t.sizes[i] - 1 : 0;
    if (t.strides[i] != 0 && extent > (INT64_MAX - span) / t.strides[i]) {
      failf(SELSCAN_STATUS_UNSUPPORTED, fmt::format("{}: sizes {} with strides {} overflow 64-bit element offsets",
                                                    name, shape_str(t.sizes, n), shape_str(t.strides, n)));
      return;
    }
    span += extent * t.strides[i];
  }
  // The kernels form byte addresses data + offset * esize: the byte span must fit as well, and not wrap.
  if (span > INT64_MAX / esize - 1) {
    failf(SELSCAN_STATUS_UNSUPPORTED,
          fmt::format("{}: sizes {} with strides {} reach element offset {} of {} bytes, beyond 64-bit byte offsets",
                      name, shape_str(t.sizes, n), shape_str(t.strides, n), span, esize));
    return;
  }
  const uintptr_t bytes = static_cast<uintptr_t>((span + 1) * esize);
  if (bytes > UINTPTR_MAX - base) {
    failf(SELSCAN_STATUS_UNSUPPORTED, fmt::format("{}: data pointer {} plus its {} bytes wraps the address space",
                                                  name, t.data, bytes));
    return;
  }
  if (unit_last && n > 0 && t.sizes[n - 1] > 1 && t.strides[n - 1] != 1) {
    failf(SELSCAN_STATUS_BAD_LAYOUT,
          fmt::format("{}: the last dimension must be contiguous (stride 1), got stride {}", name,
                      t.strides[n - 1]));
    return;
  }
  if (output) no_self_overlap(t, name);
  if (!ok()) return;
  if (count_ == kMaxTensors) {
    failf(SELSCAN_STATUS_INTERNAL, fmt::format("{}: more than {} tensors in one call", name, kMaxTensors));
    return;
  }
  extents_[count_++] = Extent{name, base, base + bytes, output};
}

// No output may share a byte with another tensor of the call (input or output): the kernels may read an
// input after writing an output (out over z loses z before out_z reads it; out_z over out loses the pre-gate
// output), and no in-place pair has been validated on both the CPU and CUDA paths. Checked on byte ranges,
// which also rejects interleaved views whose elements happen to be disjoint: conservative, and
// O(tensors^2) with at most 25 tensors.
void Checker::aliases(const char* rule) {
  if (!ok()) return;
  for (int i = 0; i < count_; ++i)
    for (int j = i + 1; j < count_; ++j) {
      const Extent& a = extents_[i];
      const Extent& b = extents_[j];
      if (!(a.output || b.output) || a.hi <= b.lo || b.hi <= a.lo) continue;
      const Extent& o = b.output ? b : a;  // name the later output first
      const Extent& other = b.output ? a : b;
      failf(SELSCAN_STATUS_BAD_LAYOUT,
            fmt::format("{}: output bytes {} overlap {}'s bytes {}; an output must not share memory with any "
                        "other tensor of the call ({})",
                        o.name, byte_range(o.lo, o.hi), other.name, byte_range(other.lo, other.hi), rule));
      return;
    }
}

// Two elements of an output must not share an address, else the result depends on which write lands last.
// A sufficient rule: take the dims of size > 1 in increasing stride order; each stride must exceed the largest
// offset reachable through the dims before it (the sum of (size - 1) * stride over them). Then, by induction,
// the inner dims reach offsets in [0, reach] only, each index of the next dim starts a block of its own, and
// distinct index tuples never meet. Every dense or padded layout in any dim order passes; only exotic
// non-overlapping layouts (dims whose strides interleave) are turned away.
void Checker::no_self_overlap(const selscan_tensor_t& t, const char* name) {
  int order[SELSCAN_MAX_NDIM];
  int m = 0;
  for (int i = 0; i < t.ndim; ++i)
    if (t.sizes[i] > 1) {
      int k = m++;
      for (; k > 0 && t.strides[order[k - 1]] > t.strides[i]; --k) order[k] = order[k - 1];
      order[k] = i;
    }
  int64_t reach = 0;  // largest offset of the dims so far; no overflow: layout() bounded the whole span
  for (int k = 0; k < m; ++k) {
    const int d = order[k];
    if (t.strides[d] <= reach) {
      failf(SELSCAN_STATUS_BAD_LAYOUT,
            fmt::format("{}: output elements would overlap: dim {} (size {}) has stride {}, but the dims with "
                        "smaller strides already reach offset {} (sizes {}, strides {})",
                        name, d, t.sizes[d], t.strides[d], reach, shape_str(t.sizes, t.ndim),
                        shape_str(t.strides, t.ndim)));
      return;
    }
    reach += (t.sizes[d] - 1) * t.strides[d];
  }
}

void reserved_zero(Checker& c, int32_t v, const char* name) {
  if (c.ok() && v != 0)
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("{}: reserved, must be 0, got {}", name, v));
}

View view_of(const selscan_tensor_t& t) {
  View v{t.data, {0, 0, 0, 0}};
  for (int i = 0; i < t.ndim && i < 4; ++i) v.s[i] = t.strides[i];
  return v;
}

void check_entries(Checker& c, const selscan_tensor_t& t, const char* name, int64_t n, int32_t a, int32_t b) {
  c.dtype(t, name, a, "one entry per sequence", b);
  c.shape(t, name, {n}, "(sequences,)");
  c.layout(t, name, false, false);
}

int64_t check_cu_seqlens(Checker& c, const selscan_tensor_t& t) {
  if (!c.presence(t, "cu_seqlens", false, true, "")) return 0;
  c.dtype(t, "cu_seqlens", SELSCAN_DTYPE_INT32, "sequence offsets", SELSCAN_DTYPE_INT64);
  if (!c.ok()) return 0;
  if (t.ndim != 1 || t.sizes[0] < 2) {
    c.failf(SELSCAN_STATUS_SHAPE_MISMATCH,
            fmt::format("cu_seqlens: expected shape (sequences + 1,) with at least one sequence, got {}",
                        given_shape(t)));
    return 0;
  }
  c.layout(t, "cu_seqlens", false, false);
  return c.ok() ? t.sizes[0] - 1 : 0;
}

Status check_host_offsets(const View& cu, bool i64, int64_t seqs, int64_t total, const char* total_is) {
  const int64_t first = index_entry(cu, i64, 0), last = index_entry(cu, i64, seqs);
  if (first != 0)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("cu_seqlens: must start at 0, got cu_seqlens[0] = {}", first));
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t lo = index_entry(cu, i64, b), hi = index_entry(cu, i64, b + 1);
    if (hi < lo)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("cu_seqlens: must be non-decreasing, got cu_seqlens[{}] = {} > cu_seqlens[{}] = {}", b,
                              lo, b + 1, hi));
  }
  if (last != total)
    return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                fmt::format("cu_seqlens: must end at the packed length {} ({}), got cu_seqlens[{}] = {}", total,
                            total_is, seqs, last));
  return SELSCAN_STATUS_SUCCESS;
}

Status check_host_slots(const View& idx, bool i64, int64_t n, int64_t pad_slot_id, int64_t slots, const char* name,
                        const char* pool) {
  std::vector<std::pair<int64_t, int64_t>> used;  // (slot, sequence)
  for (int64_t b = 0; b < n; ++b) {
    const int64_t v = index_entry(idx, i64, b);
    if (v == pad_slot_id) continue;
    if (v < 0 || v >= slots)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("{}[{}]: expected a slot of {} in [0, {}) or pad_slot_id ({}), got {}", name, b, pool,
                              slots, pad_slot_id, v));
    used.emplace_back(v, b);
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i)
    if (used[i].first == used[i - 1].first)
      return fail(SELSCAN_STATUS_INVALID_ARGUMENT,
                  fmt::format("{}: sequences {} and {} both name slot {}; a slot serves one sequence per call", name,
                              used[i - 1].second, used[i].second, used[i].first));
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace selscan
