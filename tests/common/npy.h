// Minimal .npy reader: format 1.0/2.0 headers, C order; little-endian float32 ('<f4') or complex64 ('<c8') as
// floats, or any little-endian 2/4/8-byte number as raw bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace selscan_test {

struct NpyArray {
  std::vector<int64_t> shape;
  bool is_complex = false;
  std::vector<float> data;  // C order; complex: re, im interleaved
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

// Returns "" on success, else what is wrong with the file.
std::string read_npy(const std::string& path, NpyArray* out);

// Any little-endian float, int or uint dtype of 2, 4 or 8 bytes, its elements' bytes as stored (fp16/bf16 kept as
// their 16-bit patterns: the file's '<u2' says nothing about which of the two they are).
struct NpyRaw {
  std::string descr;  // "<f4", "<u2", "<i4", ...
  int esize = 0;      // bytes per element
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;  // C order
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};
std::string read_npy_raw(const std::string& path, NpyRaw* out);

// The golden-vector directory: $SELSCAN_GOLDEN_DIR if set, else the SELSCAN_GOLDEN_DIR compile definition.
std::string golden_dir();

}  // namespace selscan_test
