// Block-wise state caching on the CPU (docs/serving.md, "Block-wise state caching"): states written at every block
// boundary into the slots a block table names, calls resuming mid-block from context_lens, prefix-cache hits,
// padding and unnamed slots untouched, against the float64 oracle (each boundary state is the final state of the
// prefix ending there) and against the library's own call without blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compare.h"
#include "cuda/select.h"
#include "validate.h"
#include "varlen_case.h"

namespace selscan_test {
namespace {

// A block-mode spec: the pool has `slots` slots, every sequence's table row given.
VarlenSpec block_spec(std::vector<int64_t> lens, int64_t K, std::vector<std::vector<int64_t>> table,
                      std::vector<int64_t> ctx, int64_t slots) {
  VarlenSpec s;
  s.lens = std::move(lens);
  s.init = InitFrom::pool, s.slots = slots, s.pad_slot_id = -1;
  s.block_size = K, s.block_table = std::move(table), s.context_lens = std::move(ctx);
  s.with_dh0 = false;
  return s;
}

// The same call without blocks: each sequence from the same initial state (h0 rows gathered from the pool, zero
// rows where it starts from zero), its final state in last_state.
VarlenCase without_blocks(const VarlenCase& c) {
  VarlenSpec s = c.spec;
  s.block_size = 0, s.block_table.clear(), s.context_lens.clear(), s.pad_slot_id = 0, s.has_init.clear();
  s.init = InitFrom::h0;
  VarlenCase w = make_varlen_case(s);
  w.u = c.u, w.delta = c.delta, w.A = c.A, w.B = c.B, w.C = c.C, w.D = c.D, w.z = c.z, w.delta_bias = c.delta_bias;
  for (int64_t b = 0; b < s.batch(); ++b)
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t n = 0; n < s.dstate; ++n)
        w.h0.setc({b, d, n}, c.spec.starts_from_state(b) ? c.pool_in.getc({c.spec.initial_slot(b), d, n}) : cd(0.0));
  return w;
}

// The block call against the oracle, and out / out_z / x / final states bit for bit against the call without blocks.
void check_block_call(VarlenCase& c, int threads = 2) {
  const VarlenSpec& s = c.spec;
  ASSERT_EQ(run_varlen_fwd(c, cpu_exec(threads)), SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  check_varlen(c, varlen_reference(c), false);
  VarlenCase w = without_blocks(c);
  ASSERT_EQ(run_varlen_fwd(w, cpu_exec(threads)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (int64_t b = 0; b < s.batch(); ++b) {
    if (s.pad(b)) continue;
    const int64_t L = s.lens[static_cast<size_t>(b)];
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t t = c.start(b) + l;
        ASSERT_EQ(c.out.get({0, d, t}), w.out.get({0, d, t})) << s.str() << " out, sequence " << b;
        ASSERT_EQ(c.out_z.get({0, d, t}), w.out_z.get({0, d, t})) << s.str() << " out_z, sequence " << b;
      }
    const auto blocks = s.written_blocks(b);
    if (blocks.empty() || blocks.back().first != (s.ctx(b) + L - 1) / s.block_size) continue;
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t n = 0; n < s.dstate; ++n)
        ASSERT_EQ(c.pool.get({blocks.back().second, d, n}), w.last_state.get({b, d, n}))
            << s.str() << " final state, sequence " << b;
  }
  bool any_pad = false;  // a padding sequence's chunk slots of x are not written (the call without blocks has none)
  for (int64_t b = 0; b < s.batch(); ++b) any_pad = any_pad || s.pad(b);
  if (c.x.present() && !any_pad) EXPECT_TRUE(c.x.same_bytes(w.x)) << s.str() << ": x differs from the call without blocks";
}

// (a) Every boundary state is the final state of the prefix ending there; block sizes below, at and above the
// CPU path's time block, boundaries at the last token, sequences shorter than a block.
TEST(BlockStates, BoundaryStatesEqualTruncatedScans) {
  uint64_t seed = 1200;
  for (int64_t K : {1, 4, 7, 16, 300})
    for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16}) {
      // Each sequence owns its blocks' slots b M + j.
      const std::vector<int64_t> lens = {33, 5, 48, 2};
      std::vector<std::vector<int64_t>> table(4);
      const int64_t M = 48 / K + 1;
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t j = 0; j < M; ++j) table[static_cast<size_t>(b)].push_back(b * M + j);
      VarlenSpec s = block_spec(lens, K, table, {}, 4 * M);
      s.itype = it, s.seed = seed++;
      s.table_dtype = seed % 2 ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
      VarlenCase c = make_varlen_case(s);
      check_block_call(c);
    }
}

// (b) A prefill split into two calls at a mid-block position (context_lens) equals one call: outputs, every
// boundary state and the final state; also a split exactly at a block end and a dense (not packed) batch.
TEST(BlockStates, SplitPrefillEqualsOneCall) {
  const int64_t K = 8;
  for (int64_t split : {13, 16, 1}) {
    const std::vector<int64_t> total = {45, 30};
    std::vector<std::vector<int64_t>> table = {{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}};
    VarlenSpec whole = block_spec(total, K, table, {}, 12);
    whole.seed = 300 + split;
    VarlenCase w = make_varlen_case(whole);
    ASSERT_EQ(run_varlen_fwd(w, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

    Tensor pool;
    VarlenCase parts[2];
    for (int k = 0; k < 2; ++k) {
      const std::vector<int64_t> lens = k == 0 ? std::vector<int64_t>{split, split}
                                               : std::vector<int64_t>{total[0] - split, total[1] - split};
      VarlenSpec s = block_spec(lens, K, table, k == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{split, split},
                                12);
      s.seed = whole.seed;
      s.ctx_dtype = SELSCAN_DTYPE_INT32;
      VarlenCase c = make_varlen_case(s);
      for (int64_t b = 0; b < 2; ++b)  // this part's inputs: the whole sequence's, from where it stopped
        copy_sequence_inputs(w, b, k == 0 ? 0 : split, c, b);
      c.pool_in = k == 0 ? w.pool_in : pool;
      ASSERT_EQ(run_varlen_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      check_varlen(c, varlen_reference(c), false);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t d = 0; d < s.dim; ++d)
          for (int64_t l = 0; l < lens[static_cast<size_t>(b)]; ++l) {
            const double got = c.out_z.get({0, d, c.start(b) + l});
            const double want = w.out_z.get({0, d, w.start(b) + (k == 0 ? 0 : split) + l});
            EXPECT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << "split " << split << " part " << k << " seq " << b;
          }
      pool = c.pool;
    }
    // Every slot the two calls wrote last holds what the single call wrote (the partial block of the first call
    // was completed, and overwritten, by the second).
    for (int64_t slot = 0; slot < 12; ++slot)
      for (int64_t d = 0; d < whole.dim; ++d)
        for (int64_t n = 0; n < whole.dstate; ++n)
          EXPECT_NEAR(pool.get({slot, d, n}), w.pool.get({slot, d, n}), 1e-5 * (1 + std::fabs(w.pool.get({slot, d, n}))))
              << "split " << split << " slot " << slot;
  }
}

// (c) A prefix-cache hit: a second request shares the first m full blocks' slots with the first and starts at
// c = m K from the state the first left there; it equals one scan of the full sequence.
TEST(BlockStates, PrefixCacheHitEqualsOneScan) {
  const int64_t K = 6, m = 3;
  const std::vector<int64_t> full = {40};
  VarlenSpec ws = block_spec(full, K, {{0, 1, 2, 3, 4, 5, 6}}, {}, 16);
  ws.seed = 71;
  VarlenCase w = make_varlen_case(ws);
  ASSERT_EQ(run_varlen_fwd(w, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  // Request 2: slots 0..2 shared with request 1 (computed), its own slots for the rest. It runs the suffix only.
  VarlenSpec s = block_spec({40 - m * K}, K, {{0, 1, 2, 10, 11, 12, 13}}, {m * K}, 16);
  s.seed = 71;
  VarlenCase c = make_varlen_case(s);
  copy_sequence_inputs(w, 0, m * K, c, 0);
  c.pool_in = w.pool;
  ASSERT_EQ(run_varlen_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  check_varlen(c, varlen_reference(c), false);
  for (int64_t d = 0; d < s.dim; ++d)
    for (int64_t l = 0; l < 40 - m * K; ++l) {
      const double want = w.out_z.get({0, d, m * K + l});
      EXPECT_NEAR(c.out_z.get({0, d, l}), want, 1e-5 * (1 + std::fabs(want))) << "d " << d << " l " << l;
    }
  // Request 2's blocks hold request 1's states for the same blocks; the shared slots are untouched.
  for (int64_t j = m; j < 7; ++j)
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t n = 0; n < s.dstate; ++n) {
        const double want = w.pool.get({j, d, n});
        EXPECT_NEAR(c.pool.get({10 + j - m, d, n}), want, 1e-5 * (1 + std::fabs(want))) << "block " << j;
      }
  for (int64_t slot = 0; slot < m; ++slot)
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t n = 0; n < s.dstate; ++n) EXPECT_EQ(c.pool.get({slot, d, n}), w.pool.get({slot, d, n}));
}

// (d) Pad entries: boundary states not kept, a padding sequence (final entry pad) reads and writes nothing and has
// zero outputs; slots nobody names keep their bytes (check_varlen compares every unnamed slot bit for bit).
TEST(BlockStates, PadEntriesAndUnnamedSlotsUntouched) {
  VarlenSpec s = block_spec({20, 9, 17}, 4,
                            {{-1, 3, -1, 5, 6, -1, -1}, {-1, -1, -1, -1, -1, -1, -1}, {9, 8, -1, -1, 7, 2, 1}}, {0, 0, 3},
                            12);
  s.has_init = {1, 1, 0};  // sequence 2 starts from zero although c > 0
  s.init_dtype = SELSCAN_DTYPE_INT32;
  s.seed = 5;
  VarlenCase c = make_varlen_case(s);
  ASSERT_TRUE(s.pad(1));
  check_block_call(c);
  for (int64_t d = 0; d < s.dim; ++d)
    for (int64_t l = 0; l < 9; ++l) {
      EXPECT_EQ(c.out.get({0, d, c.start(1) + l}), 0.0);
      EXPECT_EQ(c.out_z.get({0, d, c.start(1) + l}), 0.0);
    }
}

// (e) A pack with mixed context lengths and lengths: empty sequences (nothing read or written, even with c > 0),
// sequences shorter than a block, starting mid-block and ending on a block end, int32/int64 indices, a dense
// batch, several thread counts.
TEST(BlockStates, MixedPack) {
  uint64_t seed = 40;
  for (int threads : {1, 3}) {
    VarlenSpec s = block_spec({0, 3, 21, 0, 12, 5, 40}, 5,
                              {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
                               {10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
                               {20, 21, 22, 23, 24, 25, 26, 27, 28, 29},
                               {30, 31, 32, 33, 34, 35, 36, 37, 38, 39},
                               {40, 41, 42, 43, 44, 45, 46, 47, 48, 49},
                               {50, 51, 52, 53, 54, 55, 56, 57, 58, 59},
                               {60, 61, 62, 63, 64, 65, 66, 67, 68, 69}},
                              {7, 2, 13, 0, 3, 10, 0}, 72);
    s.seed = seed++;
    s.dim = 6, s.groups = 3;
    VarlenCase c = make_varlen_case(s);
    check_block_call(c, threads);
  }
  {  // dense (Bt, D, L) batch: every sequence has L tokens in this call
    VarlenSpec s = block_spec({10, 10, 10}, 4, {{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}, {10, 11, 12, 13, 14}}, {0, 6, 8}, 15);
    s.packed = false, s.seed = 3;
    s.table_dtype = SELSCAN_DTYPE_INT64;
    VarlenCase c = make_varlen_case(s);
    ASSERT_EQ(run_varlen_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    check_varlen(c, varlen_reference(c), false);
  }
}

// A long sequence crossing chunks of x with blocks that do not divide the chunk length.
TEST(BlockStates, LongSequenceAcrossChunks) {
  std::vector<int64_t> row;
  for (int64_t j = 0; j < 12; ++j) row.push_back(j);
  VarlenSpec s = block_spec({2600, 7}, 300, {row, {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}}, {100, 3000}, 24);
  s.dim = 2, s.dstate = 4, s.groups = 1, s.slow_decay = true, s.seed = 9;
  VarlenCase c = make_varlen_case(s);
  check_block_call(c, 2);
}

// ----------------------------------------------------------------------------------------------- validation
void expect_fail(selscan_status_t got, selscan_status_t want, const std::vector<std::string>& parts) {
  EXPECT_EQ(got, want) << selscan_last_error();
  const std::string msg = selscan_last_error();
  for (const std::string& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << msg << "' lacks '" << part << "'";
}

VarlenSpec small_spec() {
  // Sequence 0: tokens 4..9, resumes from block 0, writes block 1 (boundary) and block 2 (final); sequence 1:
  // tokens 0..8, writes blocks 0 and 1 (boundaries) and 2 (final); their blocks 3 are never read.
  return block_spec({6, 9}, 4, {{0, 1, 2, 3}, {4, 5, 6, 7}}, {4, 0}, 8);
}

struct Call {
  VarlenCase c;
  selscan_fwd_args_t f;
  selscan_exec_t e = cpu_exec(1);
  explicit Call(const VarlenSpec& s, const std::function<void(VarlenCase&)>& edit = nullptr)
      : c(make_varlen_case(s)) {
    if (edit) edit(c);
    f = c.fwd_args(host_ptr);
  }
  selscan_status_t fwd() { return selscan_fwd(&f, &e); }
};

TEST(BlockStatesValidation, Fields) {
  {
    Call k{small_spec()};
    k.f.state_block_size = -2;
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"state_block_size: expected >= 0", "got -2"});
  }
  {
    Call k{small_spec()};
    k.f.state_block_size = 0;
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table: only read with state_block_size > 0", "got state_block_size 0"});
  }
  {
    Call k{small_spec()};
    k.f.state_block_size = 0, k.f.block_table.data = nullptr;
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"context_lens: only read with state_block_size > 0"});
  }
  {
    Call k{small_spec()};
    k.f.block_table.data = nullptr;
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"block_table: required with state_block_size > 0 (got 4)"});
  }
  {
    Call k{small_spec()};
    k.f.ssm_states.data = nullptr;
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"ssm_states: required with state_block_size > 0 (got 4)"});
  }
  {
    Call k{small_spec()};
    Tensor idx = make_tensor(SELSCAN_DTYPE_INT32, {2});
    k.f.cache_indices = idx.desc();
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"cache_indices: must be absent with block_table", "got both"});
  }
  {
    Call k{small_spec()};
    k.f.block_table.dtype = SELSCAN_DTYPE_FLOAT32;
    expect_fail(k.fwd(), SELSCAN_STATUS_DTYPE_MISMATCH,
                {"block_table: expected dtype int32 or int64 (slot indices), got float32"});
  }
  {
    Call k{small_spec()};
    k.f.block_table.sizes[0] = 3;
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"block_table: expected shape (2, blocks)", "got (3, 4)"});
  }
  {
    Call k{small_spec()};
    k.f.block_table.ndim = 1;
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"block_table: expected shape (2, blocks)", "got (2,)"});
  }
  {
    Call k{small_spec()};
    k.f.context_lens.sizes[0] = 5;
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"context_lens: expected shape (2,)", "got (5,)"});
  }
  {
    Call k{small_spec()};
    k.f.context_lens.dtype = SELSCAN_DTYPE_BOOL;
    expect_fail(k.fwd(), SELSCAN_STATUS_DTYPE_MISMATCH, {"context_lens: expected dtype int32 or int64", "got bool"});
  }
  {
    Call k{small_spec()};
    k.f.block_table.data = k.f.ssm_states.data;  // the pool is written: it may not share bytes with an input
    expect_fail(k.fwd(), SELSCAN_STATUS_BAD_LAYOUT, {"overlap"});
  }
  {
    VarlenSpec s = small_spec();
    s.complex = true;
    Call k{s};
    expect_fail(k.fwd(), SELSCAN_STATUS_UNSUPPORTED, {"A: complex weights with serving fields"});
  }
  {  // pad_slot_id is read with block_table: a non-zero value is accepted there
    VarlenSpec s = small_spec();
    s.pad_slot_id = 99;
    Call k{s};
    EXPECT_EQ(k.fwd(), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  }
}

// Host calls read the block table and context lengths: every bad value is named.
TEST(BlockStatesValidation, HostContents) {
  auto table = [](int64_t b, int64_t j, double v) { return [=](VarlenCase& c) { c.block_table.set({b, j}, v); }; };
  {
    Call k{small_spec(), [](VarlenCase& c) { c.context_lens.set({1}, -1); }};
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"context_lens[1]: expected >= 0", "got -1"});
  }
  {  // both sequences end in block 2: a table of 2 columns is too narrow
    VarlenSpec s = small_spec();
    s.block_table = {{0, 1}, {4, 5}};
    Call k{s};
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table: sequence 0 (context 4, 6 tokens, block size 4) ends in block 2", "has 2 blocks"});
  }
  {
    Call k{small_spec(), table(0, 1, 8)};  // a boundary block
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table[0][1]: expected a slot of ssm_states in [0, 8) or pad_slot_id (-1)", "got 8"});
  }
  {
    Call k{small_spec(), table(0, 0, -1)};  // the block sequence 0 resumes from
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table[0][0]: sequence 0 resumes at position 4", "got pad_slot_id (-1)"});
  }
  {
    Call k{small_spec(), table(0, 0, 12)};
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table[0][0]: expected a slot of ssm_states in [0, 8) (the state a resumed", "got 12"});
  }
  {
    Call k{small_spec(), table(1, 2, 1)};  // sequence 1's final block is sequence 0's boundary block
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table: slot 1 is written twice, by sequence 0 block 1 and by sequence 1 block 2"});
  }
  {
    Call k{small_spec(), table(1, 0, 0)};  // sequence 1 writes the slot sequence 0 resumes from
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table: slot 0 is read by sequence 0 (block 0) and written by sequence 1 (block 0)"});
  }
  {  // entries past the last block a sequence uses are never read: garbage there is fine
    Call k{small_spec(), [](VarlenCase& c) { c.block_table.set({1, 3}, 1e6); }};
    EXPECT_EQ(k.fwd(), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  }
  {  // the workspace query validates the same way
    Call k{small_spec(), table(0, 2, -7)};
    size_t ws = 0;
    expect_fail(selscan_fwd_workspace_size(&k.f, &k.e, &ws), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"block_table[0][2]", "got -7"});
  }
}

// A caller of the 0.3 struct passes its smaller struct_size: the block fields, whatever bytes follow, are not read.
TEST(BlockStatesValidation, V0_3StructSizeUnaffected) {
  VarlenSpec s;
  s.lens = {3, 5, 4};
  s.init = InitFrom::pool, s.slots = 4, s.cache_indices = {1, -1, 3}, s.pad_slot_id = -1, s.seed = 12;
  VarlenCase a = make_varlen_case(s), b = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(a, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  selscan_fwd_args_t f = b.fwd_args(host_ptr);
  f.struct_size = offsetof(selscan_fwd_args_t, state_block_size);
  std::memset(&f.state_block_size, 0x5a, sizeof(f) - offsetof(selscan_fwd_args_t, state_block_size));
  const selscan_exec_t e = cpu_exec(1);
  ASSERT_EQ(selscan_fwd(&f, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  EXPECT_TRUE(a.out.same_bytes(b.out));
  EXPECT_TRUE(a.pool.same_bytes(b.pool));
}

// Block mode is planned on CUDA like every serving call: the warp-scan forward's plan for an H200, and through the
// ABI the device check (a device that does not exist here, so nothing runs on host pointers), not a refusal.
TEST(BlockStatesValidation, CudaCallsArePlanned) {
  Call k{small_spec()};
  selscan::Problem p{};
  ASSERT_EQ(selscan::make_fwd_problem(&k.f, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_TRUE(p.serving);
  selscan::cuda::FwdPlan plan;
  EXPECT_EQ(selscan::cuda::plan_fwd(p, selscan::cuda::DeviceProps{0, 90, 132, 232448}, selscan::cuda::Force::none,
                                    &plan),
            SELSCAN_STATUS_SUCCESS)
      << selscan_last_error();
  EXPECT_EQ(plan.kernel, selscan::cuda::Kernel::warp);
  k.e.device_kind = SELSCAN_DEVICE_CUDA;
  k.e.device_index = 1000;
#if SELSCAN_WITH_CUDA
  expect_fail(k.fwd(), SELSCAN_STATUS_NO_DEVICE, {});
#else
  expect_fail(k.fwd(), SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"});
#endif
  for (int64_t s = 0; s < k.c.pool.sizes[0]; ++s)  // nothing written
    for (int64_t d = 0; d < k.c.pool.sizes[1]; ++d)
      for (int64_t n = 0; n < k.c.pool.sizes[2]; ++n) ASSERT_EQ(k.c.pool.get({s, d, n}), k.c.pool_in.get({s, d, n}));
}

}  // namespace
}  // namespace selscan_test
