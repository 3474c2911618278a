// Minimal .npy reader: format 1.0/2.0 headers, little-endian float32 ('<f4') or complex64 ('<c8'), C order.
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

// The golden-vector directory: $SELSCAN_GOLDEN_DIR if set, else the SELSCAN_GOLDEN_DIR compile definition.
std::string golden_dir();

}  // namespace selscan_test
