// Host reads of a serving call's index tensors (cu_seqlens, cache_indices, has_initial_state, block_table,
// context_lens), for the CPU call's checks (validate.cpp) and the CPU path (cpu/serving.cpp). The CUDA kernels
// read them on the device (kernels/common/serving.cuh).
#pragma once

#include <cstdint>

#include "problem.h"

namespace selscan {

// Entry i of a 1-D int32 / int64 view.
inline int64_t index_entry(const View& v, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(v.p)[i * v.s[0]] : static_cast<const int32_t*>(v.p)[i * v.s[0]];
}

// Entry b of a has_initial_state view (int32, or one byte per entry) as a flag; absent: true.
inline bool flag_entry(const View& v, bool i32, int64_t b) {
  if (!v.present()) return true;
  return i32 ? static_cast<const int32_t*>(v.p)[b * v.s[0]] != 0
             : static_cast<const unsigned char*>(v.p)[b * v.s[0]] != 0;
}

// Whether sequence b starts from its h0 row or slot as far as has_initial_state says (absent: yes).
inline bool has_initial_state(const Problem& p, int64_t b) { return flag_entry(p.has_init, p.init_i32, b); }

// Block mode: the tokens of sequence b processed by earlier calls (context_lens absent: 0).
inline int64_t context_len(const Problem& p, int64_t b) {
  return p.context_lens.present() ? index_entry(p.context_lens, p.ctx_i64, b) : 0;
}

// Entry [b][j] of the (batch, M) block table.
inline int64_t table_entry(const Problem& p, int64_t b, int64_t j) {
  const int64_t i = b * p.block_table.s[0] + j * p.block_table.s[1];
  return p.table_i64 ? static_cast<const int64_t*>(p.block_table.p)[i]
                     : static_cast<const int32_t*>(p.block_table.p)[i];
}

}  // namespace selscan
