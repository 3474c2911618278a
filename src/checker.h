// The argument checks every entry point shares (validate.cpp for the scan, validate_state_update.cpp for the
// decode step, validate_conv1d.cpp for the conv1d): one tensor against an expected dtype, shape and layout; the byte ranges of a call's tensors against
// each other; the read of a versioned argument struct. Every failure records a message that names the argument
// and prints the value given; a check that passes formats and allocates nothing.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "errors.h"
#include "problem.h"
#include "selscan/selscan.h"

namespace selscan {

// A struct_size above this is garbage rather than a newer version (today's structs are under 2 KiB); it is
// rejected before any byte past this library's struct is read.
constexpr size_t kMaxStructSize = size_t{64} << 10;

// At most this many tensors in one call (the backward's 25).
constexpr int kMaxTensors = 28;

// "float16", or "dtype code 7" for a value outside selscan_dtype_t.
std::string dtype_str(int32_t d);
int64_t dtype_bytes(int32_t d);
// "(2, 4, 9)"; one element: "(4,)".
std::string shape_str(const int64_t* s, int n);
// The shape a caller gave, or "ndim=7" when ndim itself is out of range.
std::string given_shape(const selscan_tensor_t& t);

// The checks of one call: the first failure is kept (later checks do nothing), with its message recorded.
class Checker {
 public:
  Status status = SELSCAN_STATUS_SUCCESS;

  bool ok() const { return status == SELSCAN_STATUS_SUCCESS; }
  Status failf(Status s, std::string msg);

  // Presence rule: required tensors must have data; `allowed == false` ones must not. True if present.
  bool presence(const selscan_tensor_t& t, const char* name, bool required, bool allowed, const char* why);
  // dtype `want`, or `alt` when alt >= 0; `what` says why, in the message.
  void dtype(const selscan_tensor_t& t, const char* name, int32_t want, const char* what, int32_t alt = -1);
  void shape(const selscan_tensor_t& t, const char* name, const int64_t* want, int n, const char* what);
  void shape(const selscan_tensor_t& t, const char* name, std::initializer_list<int64_t> want, const char* what) {
    shape(t, name, want.begin(), static_cast<int>(want.size()), what);
  }
  // Strides >= 0, element-aligned data pointer, the byte span fits in int64 and does not wrap the address space;
  // `unit_last` requires stride 1 on the last dim (unless its size is 1); `output` requires that no two elements
  // share memory. Records the tensor's byte range for aliases(). Needs a validated ndim and sizes >= 1.
  void layout(const selscan_tensor_t& t, const char* name, bool unit_last, bool output);
  // No output may share a byte with another tensor of the call (input or output); `rule` ends the message.
  void aliases(const char* rule = "no in-place use is supported, see docs/abi.md");

 private:
  struct Extent {  // the bytes a validated tensor spans, [lo, hi)
    const char* name;
    uintptr_t lo, hi;
    bool output;
  };
  void no_self_overlap(const selscan_tensor_t& t, const char* name);

  Extent extents_[kMaxTensors];
  int count_ = 0;
};

// The caller's struct as this library reads it. struct_size below the first version's size or above
// kMaxStructSize is rejected. A smaller (older) struct is copied into `local`, zero-filled past struct_size, so
// the fields the caller's header did not have read as absent; nothing past struct_size is read. A larger (newer)
// struct is accepted only while every byte this library does not know is zero: a non-zero one is a field of a
// later version, a request this library cannot honour, and silently ignoring it would compute something else.
// Returns NULL after recording the failure.
template <typename T>
const T* read_struct(Checker& c, const T* a, const char* name, size_t first_version_size, T* local) {
  if (a == nullptr) {
    c.failf(SELSCAN_STATUS_INVALID_ARGUMENT, fmt::format("{}: pointer is NULL", name));
    return nullptr;
  }
  const size_t ss = a->struct_size;
  if (ss < first_version_size || ss > kMaxStructSize) {
    c.failf(SELSCAN_STATUS_BAD_STRUCT_SIZE,
            fmt::format("{}: struct_size is {}, expected sizeof({}_t) of the caller's header: {} in this version "
                        "({}), at least {} (its first version) and at most {}",
                        name, ss, name, sizeof(T), SELSCAN_VERSION_STRING, first_version_size, kMaxStructSize));
    return nullptr;
  }
  if (ss < sizeof(T)) {
    std::memset(static_cast<void*>(local), 0, sizeof(T));
    std::memcpy(static_cast<void*>(local), a, ss);
    return local;
  }
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(a);
  for (size_t i = sizeof(T); i < ss; ++i)
    if (bytes[i] != 0) {
      c.failf(SELSCAN_STATUS_UNSUPPORTED,
              fmt::format("{}: struct_size is {}, larger than this library's {} (libselscan {}), and byte {} past "
                          "its struct is {:#04x}, not 0: the caller sets a field of a newer version that this "
                          "library does not have (upgrade libselscan, or leave the field 0)",
                          name, ss, sizeof(T), SELSCAN_VERSION_STRING, i, bytes[i]));
      return nullptr;
    }
  return a;
}

// A reserved integer field must be 0.
void reserved_zero(Checker& c, int32_t v, const char* name);

// The caller's strides as a View (sizes past ndim contribute stride 0).
View view_of(const selscan_tensor_t& t);

// A 1-D tensor of `n` entries of dtype `a` or `b` (index tensors: cache_indices, has_initial_state, ...).
void check_entries(Checker& c, const selscan_tensor_t& t, const char* name, int64_t n, int32_t a, int32_t b);
// cu_seqlens, before the inputs: the number of sequences it gives (0 when absent) decides their shapes.
int64_t check_cu_seqlens(Checker& c, const selscan_tensor_t& t);

// The contents of index tensors in host memory, for CPU calls (a CUDA call cannot read them).
// cu_seqlens (seqs + 1 entries) starts at 0, never decreases and ends at `total` (`total_is` says what that is).
Status check_host_offsets(const View& cu, bool i64, int64_t seqs, int64_t total, const char* total_is);
// Each of the n entries of `name` is pad_slot_id or a slot of `pool` in [0, slots), and no slot is named twice.
Status check_host_slots(const View& idx, bool i64, int64_t n, int64_t pad_slot_id, int64_t slots, const char* name,
                        const char* pool);

}  // namespace selscan
