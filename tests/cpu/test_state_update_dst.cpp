// The decode step with dst_state_batch_indices on the CPU path: the state read from slot idx[b] and written to slot
// dst[b]. Against the in-place call (bit for bit: the same arithmetic, only the slot written differs) and the
// float64 oracle, and every rule of the host check.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "state_update_case.h"

namespace selscan_test {
namespace {

// The bytes of slot `slot` of the (dense, unpadded) state pool.
std::vector<unsigned char> slot_bytes(const StateUpdateCase& c, int64_t slot) {
  const StateUpdateSpec& s = c.spec;
  const size_t n = static_cast<size_t>(s.nheads * s.headdim * s.dstate * c.state.esize());
  const unsigned char* p = c.state.storage.data() + (c.state.offset * c.state.esize()) + slot * n;
  return std::vector<unsigned char>(p, p + n);
}

// The specs every equivalence test runs: both forms, groups, T > 1, 16-bit state, INT64 strided indices.
std::vector<StateUpdateSpec> dst_specs() {
  std::vector<StateUpdateSpec> v;
  StateUpdateSpec s;
  s.batch = 3, s.nheads = 8, s.dstate = 16, s.pool = 8, s.has_z = true;
  v.push_back(s);
  StateUpdateSpec t = s;  // speculative decoding: T = 3 tokens, one state read and one written
  t.tokens = 3, t.itype = SELSCAN_DTYPE_BFLOAT16, t.state_dtype = SELSCAN_DTYPE_BFLOAT16;
  v.push_back(t);
  StateUpdateSpec h;  // heads form, groups, broadcast inputs, INT64 indices with a stride
  h.heads = true, h.batch = 3, h.nheads = 4, h.headdim = 4, h.dstate = 16, h.groups = 2, h.broadcast = true;
  h.pool = 9, h.tokens = 2, h.idx_dtype = SELSCAN_DTYPE_INT64, h.idx_stride = 3, h.has_z = true;
  v.push_back(h);
  StateUpdateSpec f = h;  // float16 state, odd dstate (no vector path on the GPU)
  f.itype = f.state_dtype = SELSCAN_DTYPE_FLOAT16, f.dstate = 12, f.tokens = 1, f.idx_dtype = SELSCAN_DTYPE_INT32;
  v.push_back(f);
  uint64_t seed = 3100;
  for (auto& x : v) x.seed = ++seed;
  return v;
}

// Runs the case, expecting success.
StateUpdateCase run_ok(const StateUpdateSpec& spec) {
  StateUpdateCase c = make_state_update_case(spec);
  const selscan_status_t s = run_state_update(c, cpu_exec(1));
  EXPECT_EQ(s, SELSCAN_STATUS_SUCCESS) << spec.str() << ": " << selscan_last_error();
  return c;
}

TEST(CpuStateUpdateDst, DstEqualToTheSourceIsTheInPlaceCall) {
  for (StateUpdateSpec s : dst_specs()) {
    s.indices = {5, 0, 2};
    const StateUpdateCase in_place = run_ok(s);
    s.dst = s.indices;
    const StateUpdateCase before = make_state_update_case(s);
    const StateUpdateCase with_dst = run_ok(s);
    EXPECT_TRUE(with_dst.out.storage == in_place.out.storage) << s.str() << ": out";
    EXPECT_TRUE(with_dst.state.storage == in_place.state.storage) << s.str() << ": state";
    expect_state_update_ok(with_dst, before);
  }
}

TEST(CpuStateUpdateDst, DistinctDstKeepsTheSourceAndWritesTheInPlaceState) {
  for (StateUpdateSpec s : dst_specs()) {
    // Sequences 0 and 1 move to fresh slots; sequence 2 updates in place.
    s.indices = {5, 0, 2};
    const StateUpdateCase in_place = run_ok(s);
    s.dst = {7, 3, 2};
    const StateUpdateCase before = make_state_update_case(s);
    const StateUpdateCase c = run_ok(s);
    EXPECT_TRUE(c.out.storage == in_place.out.storage) << s.str() << ": out";
    EXPECT_TRUE(slot_bytes(c, 5) == slot_bytes(before, 5)) << s.str() << ": the source slot 5 changed";
    EXPECT_TRUE(slot_bytes(c, 0) == slot_bytes(before, 0)) << s.str() << ": the source slot 0 changed";
    EXPECT_TRUE(slot_bytes(c, 7) == slot_bytes(in_place, 5)) << s.str() << ": slot 7";
    EXPECT_TRUE(slot_bytes(c, 3) == slot_bytes(in_place, 0)) << s.str() << ": slot 3";
    EXPECT_TRUE(slot_bytes(c, 2) == slot_bytes(in_place, 2)) << s.str() << ": slot 2";
    expect_state_update_ok(c, before);  // every other slot bit-identical, inputs and guards intact
  }
}

TEST(CpuStateUpdateDst, TwoSequencesMayReadOneSlot) {
  // A shared prefix forks: both read slot 1, each writes its own.
  StateUpdateSpec s = dst_specs()[2];
  s.indices = {1, 1, 4};
  s.dst = {6, 8, 0};
  const StateUpdateCase before = make_state_update_case(s);
  const StateUpdateCase c = run_ok(s);
  expect_state_update_ok(c, before);
  EXPECT_TRUE(slot_bytes(c, 1) == slot_bytes(before, 1));
}

TEST(CpuStateUpdateDst, PadDstComputesOutAndWritesNoState) {
  for (StateUpdateSpec s : dst_specs()) {
    s.indices = {5, -1, 2};  // sequence 1 is padding: its dst is not looked at
    const StateUpdateCase in_place = run_ok(s);
    s.dst = {-1, 123456, -1};
    const StateUpdateCase before = make_state_update_case(s);
    const StateUpdateCase c = run_ok(s);
    EXPECT_TRUE(c.out.storage == in_place.out.storage) << s.str() << ": out";
    EXPECT_TRUE(c.state.storage == before.state.storage) << s.str() << ": a pad destination wrote the pool";
    expect_state_update_ok(c, before);
  }
}

TEST(CpuStateUpdateDst, ACustomPadSlotId) {
  StateUpdateSpec s = dst_specs()[0];
  s.pad_slot = 7;  // slot 7 cannot be used: 7 means padding in both index tensors
  s.indices = {5, 7, 2};
  s.dst = {7, 3, 6};
  const StateUpdateCase before = make_state_update_case(s);
  const StateUpdateCase c = run_ok(s);
  expect_state_update_ok(c, before);
  EXPECT_TRUE(slot_bytes(c, 5) == slot_bytes(before, 5));
  EXPECT_TRUE(slot_bytes(c, 3) == slot_bytes(before, 3)) << "sequence 1 is padding: its destination is ignored";
}

// ------------------------------------------------------------------------------------------ rejections
struct DstFixture {
  StateUpdateCase c;
  std::vector<unsigned char> state0;
  selscan_state_update_args_t a;
  explicit DstFixture(std::vector<int64_t> idx = {4, 0, 2}, std::vector<int64_t> dst = {1, 3, 2},
                      int32_t idx_dtype = SELSCAN_DTYPE_INT32) {
    StateUpdateSpec s = dst_specs()[0];
    s.idx_dtype = idx_dtype;
    s.indices = std::move(idx);
    s.dst = std::move(dst);
    c = make_state_update_case(s);
    state0 = c.state.storage;
    a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); }, c.idx_storage.data(),
               c.dst_storage.data());
  }
  void expect_rejected(const selscan_state_update_args_t& call, selscan_status_t status,
                       const std::vector<std::string>& fragments, const selscan_exec_t& exec = cpu_exec(1)) {
    c.out.fill_bytes(kPoison);
    const selscan_status_t got = selscan_state_update(&call, &exec);
    const std::string msg = selscan_last_error();
    EXPECT_EQ(got, status) << msg;
    for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    EXPECT_TRUE(c.state.storage == state0) << "a rejected call changed the pool: " << msg;
    for (unsigned char byte : c.out.storage) ASSERT_EQ(byte, kPoison) << "a rejected call wrote out: " << msg;
  }
};

TEST(CpuStateUpdateDstValidation, TheFixtureIsValid) {
  DstFixture f;
  const selscan_exec_t e = cpu_exec(1);
  EXPECT_EQ(selscan_state_update(&f.a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
}

TEST(CpuStateUpdateDstValidation, TheTensor) {
  DstFixture f;
  selscan_state_update_args_t a = f.a;
  a.state_batch_indices = SELSCAN_TENSOR_INIT;
  a.state.sizes[0] = 3;  // S = Bt: without dst the call would be valid
  f.expect_rejected(a, SELSCAN_STATUS_INVALID_ARGUMENT, {"dst_state_batch_indices", "without state_batch_indices"});
  a = f.a;
  a.dst_state_batch_indices.dtype = SELSCAN_DTYPE_FLOAT32;
  f.expect_rejected(a, SELSCAN_STATUS_DTYPE_MISMATCH, {"dst_state_batch_indices", "int32 or int64", "float32"});
  a = f.a;
  a.dst_state_batch_indices.sizes[0] = 4;
  f.expect_rejected(a, SELSCAN_STATUS_SHAPE_MISMATCH, {"dst_state_batch_indices", "(3,)", "(4,)"});
  a = f.a;
  a.dst_state_batch_indices.ndim = 2;
  f.expect_rejected(a, SELSCAN_STATUS_SHAPE_MISMATCH, {"dst_state_batch_indices"});
  a = f.a;
  a.dst_state_batch_indices.strides[0] = -1;
  f.expect_rejected(a, SELSCAN_STATUS_BAD_LAYOUT, {"dst_state_batch_indices", "negative", "-1"});
  a = f.a;
  a.dst_state_batch_indices.data = f.c.out.storage.data() + 64;  // inside an output
  f.expect_rejected(a, SELSCAN_STATUS_BAD_LAYOUT, {"overlap", "dst_state_batch_indices"});
}

TEST(CpuStateUpdateDstValidation, EntriesOutsideThePool) {
  for (const int64_t bad : {int64_t{8}, int64_t{-2}, int64_t{1} << 40}) {
    DstFixture f({4, 0, 2}, {1, bad, 2}, SELSCAN_DTYPE_INT64);  // INT64, so that 2^40 stays itself
    f.expect_rejected(f.a, SELSCAN_STATUS_INVALID_ARGUMENT,
                      {"dst_state_batch_indices[1]", "[0, 8)", "pad_slot_id (-1)", "got " + std::to_string(bad)});
  }
}

TEST(CpuStateUpdateDstValidation, TwoSequencesWritingOneSlot) {
  DstFixture f({4, 0, 2}, {1, 6, 1});
  f.expect_rejected(f.a, SELSCAN_STATUS_INVALID_ARGUMENT,
                    {"dst_state_batch_indices", "sequences 0 and 2", "both write slot 1"});
  DstFixture g({4, 0, 2}, {2, 3, 2});  // one of them in place
  g.expect_rejected(g.a, SELSCAN_STATUS_INVALID_ARGUMENT, {"sequences 0 and 2", "both write slot 2"});
}

TEST(CpuStateUpdateDstValidation, ASlotReadByOneAndWrittenByAnother) {
  DstFixture f({4, 0, 2}, {0, 3, 5});  // sequence 0 writes the slot sequence 1 reads
  f.expect_rejected(f.a, SELSCAN_STATUS_INVALID_ARGUMENT,
                    {"dst_state_batch_indices[0] = 0", "sequence 0 writes the slot sequence 1 reads",
                     "state_batch_indices[1] = 0"});
  DstFixture g({4, 0, 2}, {1, 2, 0});  // a swap: each reads what another writes
  g.expect_rejected(g.a, SELSCAN_STATUS_INVALID_ARGUMENT, {"writes the slot sequence"});
}

// A destination slot that only a padding or out-of-pool sequence names is nobody's read: allowed.
TEST(CpuStateUpdateDstValidation, SlotsOfSequencesThatReadNothingDoNotConflict) {
  StateUpdateSpec s = dst_specs()[0];
  s.indices = {-1, 0, 2};
  s.dst = {0, 3, 5};  // sequence 0 is padding: its destination 0 is ignored, so sequence 1 may read slot 0
  const StateUpdateCase before = make_state_update_case(s);
  const StateUpdateCase c = run_ok(s);
  expect_state_update_ok(c, before);
}

// dst on CUDA stays off until the destination instances have passed their GPU tests. Host pointers are fine: the
// call must stop before any device work.
TEST(CpuStateUpdateDstValidation, CudaIsOptIn) {
  const char* opt_in = std::getenv("SELSCAN_CUDA_SERVING");
  if (opt_in != nullptr && std::string(opt_in) == "1") GTEST_SKIP() << "SELSCAN_CUDA_SERVING=1 is set";
  DstFixture f;
  selscan_exec_t e = cpu_exec(1);
  e.device_kind = SELSCAN_DEVICE_CUDA;
#if SELSCAN_WITH_CUDA
  f.expect_rejected(f.a, SELSCAN_STATUS_UNSUPPORTED,
                    {"dst_state_batch_indices", "on CUDA", "SELSCAN_CUDA_SERVING=1", "CPU path"}, e);
#else
  f.expect_rejected(f.a, SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"}, e);
#endif
}

}  // namespace
}  // namespace selscan_test
