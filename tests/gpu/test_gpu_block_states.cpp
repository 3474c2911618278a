// Block-wise state caching on the GPU (docs/serving.md): the warp-scan kernel's serving variant writes the state at
// every block end into the slot the block table names (read on the device), against the float64 oracle
// (tests/common/varlen_case.h: each boundary state is the final state of the prefix ending there) and against the
// CPU path; bad entries give NaN outputs and touch no slot.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "compare.h"
#include "cuda_memory.h"
#include "gpu_gate.h"
#include "varlen_case.h"

namespace selscan_test {
namespace {

// Sequence b owns slots b M + j of a pool of Bt M slots.
VarlenSpec block_spec(std::vector<int64_t> lens, std::vector<int64_t> ctx, int64_t K, int64_t M) {
  VarlenSpec s;
  s.lens = std::move(lens);
  s.context_lens = std::move(ctx);
  s.init = InitFrom::pool, s.pad_slot_id = -1, s.with_dh0 = false;
  s.block_size = K;
  const int64_t Bt = s.batch();
  s.slots = Bt * M;
  s.block_table.assign(static_cast<size_t>(Bt), {});
  for (int64_t b = 0; b < Bt; ++b)
    for (int64_t j = 0; j < M; ++j) s.block_table[static_cast<size_t>(b)].push_back(b * M + j);
  return s;
}

// The GPU call against the oracle (every named slot, unnamed slots bit for bit) and against the CPU path.
void check_on_gpu(const VarlenSpec& s) {
  const DeviceMemory dm = cuda_memory();
  VarlenCase g = make_varlen_case(s), c = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(g, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  check_varlen(g, varlen_reference(g), false);
  ASSERT_EQ(run_varlen_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  const Tolerances t = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  EXPECT_TRUE(allclose(s.str() + " out vs CPU", g.out.values(), c.out.values(), t.out));
  EXPECT_TRUE(allclose(s.str() + " pool vs CPU", g.pool.values(), c.pool.values(), t.last_state));
}

// Block sizes below, at and above a lane's steps and a warp's piece; boundaries at the last token; sequences
// shorter than a block, empty ones, resumed mid-block; all itypes; constant and variable B/C.
TEST(GpuBlockStates, MatchesOracleAndCpu) {
  REQUIRE_GPU();
  uint64_t seed = 1500;
  for (int64_t K : {1, 3, 16, 100, 512})
    for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
      for (int bc = 0; bc < 3; ++bc) {
        VarlenSpec s = block_spec({5, 0, 301, 17, 64, 129}, {0, 9, 7, 200, 64, 1}, K, 1 + (200 + 129) / K + 1);
        s.dim = 24, s.dstate = 16, s.groups = 2;
        s.itype = it, s.var_B = bc != 1, s.var_C = bc != 2, s.seed = seed++;
        s.table_dtype = seed % 2 ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
        check_on_gpu(s);
      }
}

// Long sequences across chunks of x, dstate above a warp's 32 lanes, pad entries in the table, a padding sequence,
// has_initial_state, a dense (Bt, D, L) batch.
TEST(GpuBlockStates, LongPadsAndDenseBatch) {
  REQUIRE_GPU();
  for (int64_t N : {16, 40}) {
    VarlenSpec s = block_spec({2500, 700, 33, 4097}, {100, 0, 5, 3000}, 256, 30);
    s.dim = 16, s.dstate = N, s.groups = 1, s.slow_decay = true, s.seed = 20 + N;
    s.block_table[0][3] = -1;                          // a boundary state nobody keeps
    for (auto& e : s.block_table[2]) e = -1;           // sequence 2 is padding
    s.has_init = {1, 1, 1, 0};                         // sequence 3 starts from zero although c > 0
    check_on_gpu(s);
  }
  VarlenSpec s = block_spec({40, 40, 40}, {0, 13, 32}, 8, 10);
  s.packed = false, s.seed = 31;
  check_on_gpu(s);
}

// Fresh prefills without context_lens (every sequence starts at 0), the bench's case: with a block size 16 divides
// only the aligned instance is launched, with one it does not only the unaligned one. Block ends mid-piece and at
// piece ends, several per piece (K = 32), a pad entry that drops one boundary state, a sequence ending on a block end,
// dstate above a state tile (a partial second tile).
TEST(GpuBlockStates, FreshPrefillWithoutContext) {
  REQUIRE_GPU();
  uint64_t seed = 1700;
  for (int64_t K : {32, 256, 48, 100})
    for (int64_t N : {16, 40}) {
      const std::vector<int64_t> lens{1100, 256, 31, 0, 513};
      VarlenSpec s = block_spec(lens, {}, K, (1100 + K - 1) / K);
      s.dim = 16, s.dstate = N, s.groups = 2, s.slow_decay = true, s.seed = seed++;
      s.itype = seed % 2 ? SELSCAN_DTYPE_BFLOAT16 : SELSCAN_DTYPE_FLOAT32;
      s.block_table[0][1] = -1;  // the state after block 1 of sequence 0 is not kept
      check_on_gpu(s);
    }
}

// Entries the host cannot check (a slot outside the pool, a starting entry that is pad_slot_id, a negative context):
// that sequence's outputs are NaN and no slot is touched; the others run normally.
TEST(GpuBlockStates, BadEntriesGiveNaNAndTouchNoSlot) {
  REQUIRE_GPU();
  VarlenSpec s = block_spec({20, 20, 20, 20}, {0, 4, 6, 0}, 4, 8);
  s.block_table[0][2] = 99;   // a boundary entry outside the pool
  s.block_table[1][0] = -1;   // sequence 1 resumes at 4 from block 0: pad
  s.context_lens[2] = -3;
  s.seed = 8;
  const DeviceMemory dm = cuda_memory();
  VarlenCase g = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(g, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t l = 0; l < 20; ++l) ASSERT_TRUE(std::isnan(g.out.get({0, d, g.start(b) + l}))) << "sequence " << b;
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t d = 0; d < s.dim; ++d)
        for (int64_t n = 0; n < s.dstate; ++n)
          ASSERT_EQ(g.pool.get({b * 8 + j, d, n}), g.pool_in.get({b * 8 + j, d, n})) << "slot of sequence " << b;
  }
  for (int64_t d = 0; d < s.dim; ++d)  // sequence 3 ran
    for (int64_t l = 0; l < 20; ++l) ASSERT_FALSE(std::isnan(g.out.get({0, d, g.start(3) + l})));
  for (Tensor* t : g.all())
    if (t->present()) EXPECT_TRUE(t->check_guards(t->storage[0]).empty()) << t->check_guards(t->storage[0]);
}

}  // namespace
}  // namespace selscan_test
