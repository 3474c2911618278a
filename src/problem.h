// The one internal description of a selective-scan call, built by validate.cpp from the public structs.
// Everything below the API layer (CPU path, CUDA launchers, kernels) sees only this. It is a POD so it can be
// passed by value as a kernel parameter. No CUDA or fmt headers here.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SELSCAN_HD __host__ __device__
#else
#define SELSCAN_HD
#endif

namespace selscan {

enum class Dtype : int32_t { f32 = 0, f16 = 1, bf16 = 2, c64 = 3 };

// Bytes of one element of a real dtype (f32, f16, bf16): the input/output, conv1d and decode-state tensors.
SELSCAN_HD constexpr int real_bytes(Dtype t) { return t == Dtype::f32 ? 4 : 2; }

constexpr int64_t kChunk = 2048;   // chunk length of the saved states x (upstream's layout)
constexpr int64_t kMaxDstate = 256;

// A strided view. Strides are in elements of the tensor's dtype; unused strides are 0.
// Meaning of s[] per tensor kind (validate.cpp fills them so):
//   (Bt, D, L) tensors  : s[0] batch, s[1] channel, s[2] == 1 (time is always unit stride)
//   A, constant B/C, dA, constant dB/dC (D, N): s[0] channel, s[1] state
//   variable B/C, dB/dC (Bt, G, N, L or 2L)    : s[0] batch, s[1] group, s[2] state, s[3] == 1
//   D, delta_bias, dD, ddelta_bias (D,)         : s[0]
//   h0, last_state, dh0 (Bt, D, N)              : s[0] batch, s[1] channel, s[2] state
//   x (Bt, D, nc, 2N) contiguous                : s[0] batch, s[1] channel, s[2] chunk, s[3] == 1
// For complex wtype, x/A/constant B,C/h0/last_state/dA/dB/dC/dh0 hold complex64 (float2) elements;
// variable B/C (and their grads) hold 2L real itype elements per row, Re/Im interleaved.
struct View {
  void* p;       // nullptr = absent
  int64_t s[4];
  bool present() const { return p != nullptr; }
};

struct Problem {
  // sizes
  int64_t batch, dim, seqlen, dstate, groups;
  int64_t nchunks;        // ceil(seqlen / kChunk)
  Dtype itype;            // u, delta, z, out..., variable B/C
  bool is_complex;        // wtype == c64 (else f32)
  bool var_B, var_C;
  bool softplus;
  bool deterministic;     // backward only
  // When true the scan runs without B (upstream's convention for constant B): the scanned state is h / B[d,n]
  // and B enters through the output coefficient. True iff !var_B && !h0.present(). Otherwise the scan tracks
  // the true state h (constant B is then applied inside b̄ = B * delta * u).
  bool fold_B;

  // inputs (both directions)
  View u, delta, A, B, C, D, z, delta_bias, h0;
  // forward outputs (out is also a backward input, required there iff z)
  View out, out_z, x, last_state;
  // backward inputs / outputs
  View dout;
  View du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0;
  // backward: out_z (recompute) lives in `out_z` above.

  // Serving (docs/serving.md); all off and absent for a dense call. With cu_seqlens (`varlen`) the (Bt, D, L)
  // tensors and variable B/C, dB/dC are packed as one batch row over seqlen = total_L and `batch` counts the
  // sequences; x has nchunks = total_L / kChunk + batch chunk slots (seq_chunk0()). The index tensors are 1-D
  // (s[0] is their stride) and hold int32 or int64 (has_init: bool bytes or int32) as the flags say.
  bool serving;           // any serving field given: fold_B is off; the warp-scan kernels serve the call (the
                          // thread-states forward when forced: src/cuda/select.cpp)
  bool varlen;            // cu_seqlens given
  bool cu_i64, idx_i64;   // cu_seqlens, cache_indices hold int64 (else int32)
  bool init_i32;          // has_init holds int32 (else one byte per entry)
  int64_t pad_slot_id;    // with cache_indices: the entry marking a padding sequence
  int64_t slots;          // S of ssm_states (0 when absent)
  View cu_seqlens, ssm_states, cache_indices, has_init;
  // Block-wise state caching (forward only): with block_size K > 0 the slots come from block_table (batch, M)
  // (s[0] sequence, s[1] block) instead of cache_indices, and context_lens (optional, 1-D) gives each sequence's
  // absolute start; see seq_block_* below and docs/serving.md.
  int64_t block_size;     // K (0: off)
  int64_t table_cols;     // M
  bool table_i64, ctx_i64;
  View block_table, context_lens;

  int64_t channels_per_group() const { return dim / groups; }
  // Batch rows of the (Bt, D, L) tensors and of variable B/C: 1 when the sequences are packed.
  SELSCAN_HD int64_t rows() const { return varlen ? 1 : batch; }
};

// x's chunk slot of the first chunk of a sequence starting at packed offset `start`, sequence index b: distinct
// sequences' chunks never share a slot, and every slot is below total_L / kChunk + batch.
SELSCAN_HD inline int64_t seq_chunk0(int64_t start, int64_t b) { return start / kChunk + b; }

// Block-wise state caching: a sequence with `ctx` earlier tokens and `len` tokens in this call (len >= 1) starts
// from block (ctx - 1) / K (when ctx > 0), writes the state after each block end strictly inside (ctx, ctx + len)
// into blocks [ctx / K, last), and its final state into block `last` = (ctx + len - 1) / K.
SELSCAN_HD inline int64_t seq_block_first(int64_t ctx, int64_t K) { return ctx / K; }
SELSCAN_HD inline int64_t seq_block_last(int64_t ctx, int64_t len, int64_t K) { return (ctx + len - 1) / K; }
// The local position (0-based, in this call) of the first token that ends a block at or after local position t.
SELSCAN_HD inline int64_t next_block_end(int64_t ctx, int64_t t, int64_t K) { return ((ctx + t) / K + 1) * K - 1 - ctx; }

}  // namespace selscan
