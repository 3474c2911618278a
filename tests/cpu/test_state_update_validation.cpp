// Argument checking of selscan_state_update: every rule gives its status and a message that names the argument
// and prints the value given, and a rejected call writes nothing (out stays poisoned, the pool unchanged).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/select.h"
#include "state_update.h"
#include "state_update_case.h"

namespace selscan_test {
namespace {

struct Fixture {
  StateUpdateCase c;
  std::vector<unsigned char> state0;
  selscan_state_update_args_t a;

  explicit Fixture(StateUpdateSpec s = {}) {
    if (s.pool == 0) s.pool = 5;
    s.has_z = true;
    c = make_state_update_case(s);
    c.out.fill_bytes(kPoison);
    state0 = c.state.storage;
    a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); }, c.idx_storage.data(),
               c.dst_storage.data());
  }
};

// Runs `a` and expects `status` with every fragment in the message, and nothing written.
void expect_rejected(Fixture& f, const selscan_state_update_args_t* a, selscan_status_t status,
                     const std::vector<std::string>& fragments, const selscan_exec_t& exec = cpu_exec(1)) {
  const selscan_status_t got = selscan_state_update(a, &exec);
  const std::string msg = selscan_last_error();
  EXPECT_EQ(got, status) << msg;
  for (const std::string& frag : fragments)
    EXPECT_NE(msg.find(frag), std::string::npos) << "'" << frag << "' not in: " << msg;
  EXPECT_TRUE(f.c.state.storage == f.state0) << "a rejected call changed the state pool: " << msg;
  for (unsigned char byte : f.c.out.storage) ASSERT_EQ(byte, kPoison) << "a rejected call wrote out: " << msg;
}

void expect_rejected(Fixture& f, const std::function<void(selscan_state_update_args_t&)>& mutate,
                     selscan_status_t status, const std::vector<std::string>& fragments) {
  selscan_state_update_args_t a = f.a;
  mutate(a);
  expect_rejected(f, &a, status, fragments);
}

TEST(CpuStateUpdateValidation, TheFixtureIsValid) {
  Fixture f;
  const selscan_exec_t e = cpu_exec(1);
  EXPECT_EQ(selscan_state_update(&f.a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
}

TEST(CpuStateUpdateValidation, StructAndFlags) {
  Fixture f;
  expect_rejected(f, nullptr, SELSCAN_STATUS_INVALID_ARGUMENT, {"selscan_state_update_args", "NULL"});
  expect_rejected(f, [](auto& a) { a.struct_size = 16; }, SELSCAN_STATUS_BAD_STRUCT_SIZE, {"struct_size is 16"});
  expect_rejected(f, [](auto& a) { a.struct_size = size_t{1} << 20; }, SELSCAN_STATUS_BAD_STRUCT_SIZE,
                  {"struct_size is 1048576"});
  expect_rejected(f, [](auto& a) { a.flags = 4; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"flags", "got 4"});
  expect_rejected(f, [](auto& a) { a.dt_softplus = 2; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"dt_softplus", "got 2"});
  // A newer caller's larger struct: accepted while the bytes this library does not know are zero.
  struct Newer {
    selscan_state_update_args_t a;
    int64_t future_field;
  } n{f.a, 0};
  n.a.struct_size = sizeof(Newer);
  const selscan_exec_t e = cpu_exec(1);
  EXPECT_EQ(selscan_state_update(&n.a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  Fixture g;
  Newer m{g.a, 3};
  m.a.struct_size = sizeof(Newer);
  expect_rejected(g, &m.a, SELSCAN_STATUS_UNSUPPORTED, {"not 0", "newer version"});
}

TEST(CpuStateUpdateValidation, ExecContext) {
  Fixture f;
  selscan_exec_t e = cpu_exec(1);
  e.device_kind = 7;
  expect_rejected(f, &f.a, SELSCAN_STATUS_INVALID_ARGUMENT, {"device_kind", "got 7"}, e);
  EXPECT_EQ(selscan_state_update(&f.a, nullptr), SELSCAN_STATUS_INVALID_ARGUMENT);
#if !SELSCAN_WITH_CUDA
  e = cpu_exec(1);
  e.device_kind = SELSCAN_DEVICE_CUDA;
  expect_rejected(f, &f.a, SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"}, e);
#endif
}

TEST(CpuStateUpdateValidation, StateDecidesTheForm) {
  Fixture f;
  expect_rejected(f, [](auto& a) { a.state.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"state", "NULL"});
  expect_rejected(f, [](auto& a) { a.state.ndim = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"state", "got (5, 8)"});
  expect_rejected(f, [](auto& a) { a.state.ndim = 9; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"state", "ndim=9"});
  expect_rejected(f, [](auto& a) { a.state.sizes[1] = 0; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"state", "(5, 0, 16)"});
  expect_rejected(f, [](auto& a) { a.state.dtype = SELSCAN_DTYPE_COMPLEX64; }, SELSCAN_STATUS_DTYPE_MISMATCH,
                  {"state", "complex64"});
  expect_rejected(f, [](auto& a) { a.state.dtype = SELSCAN_DTYPE_FLOAT16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
                  {"state", "x's dtype", "got float16"});
}

TEST(CpuStateUpdateValidation, DstateLimit) {
  StateUpdateSpec s;
  s.dstate = 257;
  Fixture f(s);
  expect_rejected(f, [](auto&) {}, SELSCAN_STATUS_UNSUPPORTED, {"dstate", "got 257"});
}

// The channel limit's message prints the shape rather than heads * headdim, which can overflow int64.
TEST(CpuStateUpdateValidation, ChannelLimit) {
  for (const int64_t heads : {int64_t{1} << 26, INT64_MAX}) {
    Fixture f;
    expect_rejected(f,
                    [heads](selscan_state_update_args_t& a) {
                      a.state.ndim = 4;
                      a.state.sizes[1] = heads;
                      a.state.sizes[2] = 2;
                      a.state.sizes[3] = 4;
                    },
                    SELSCAN_STATUS_UNSUPPORTED,
                    {"state", "at most 67108864 channels", "got shape (5, " + std::to_string(heads) + ", 2, 4)"});
  }
}

TEST(CpuStateUpdateValidation, ShapesOfTheInputs) {
  Fixture f;
  expect_rejected(f, [](auto& a) { a.x.sizes[1] = 9; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"x:", "(8,)", "got (3, 9)"});
  expect_rejected(f, [](auto& a) { a.x.dtype = 42; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"x:", "dtype code 42"});
  expect_rejected(f, [](auto& a) { a.x.sizes[0] = 0; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"x:", "got (0, 8)"});
  expect_rejected(f, [](auto& a) { a.dt.sizes[0] = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"dt:", "(3, 8)", "(2, 8)"});
  expect_rejected(f, [](auto& a) { a.dt.dtype = SELSCAN_DTYPE_BFLOAT16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
                  {"dt:", "got bfloat16"});
  expect_rejected(f, [](auto& a) { a.z.sizes[1] = 4; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"z:", "got (3, 4)"});
  expect_rejected(f, [](auto& a) { a.A.sizes[1] = 15; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"A:", "(8, 16)", "(8, 15)"});
  expect_rejected(f, [](auto& a) { a.A.dtype = SELSCAN_DTYPE_FLOAT16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
                  {"A:", "float16"});
  expect_rejected(f, [](auto& a) { a.D.sizes[0] = 7; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"D:", "(8,)", "(7,)"});
  expect_rejected(f, [](auto& a) { a.dt_bias.dtype = SELSCAN_DTYPE_INT32; }, SELSCAN_STATUS_DTYPE_MISMATCH,
                  {"dt_bias", "int32"});
  expect_rejected(f, [](auto& a) { a.B.sizes[1] = 17; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"B:", "(3, 16)", "(3, 17)"});
  expect_rejected(f, [](auto& a) { a.C.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"C:", "NULL"});
  expect_rejected(f, [](auto& a) { a.out.dtype = SELSCAN_DTYPE_FLOAT16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
                  {"out:", "float16"});
  expect_rejected(f, [](auto& a) { a.out.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"out:", "NULL"});
}

TEST(CpuStateUpdateValidation, Groups) {
  StateUpdateSpec s;
  s.groups = 2;
  Fixture f(s);
  expect_rejected(f, [](auto& a) { a.C.sizes[1] = 4; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"C:", "groups as B (2)", "4"});
  expect_rejected(f, [](auto& a) { a.B.sizes[1] = a.C.sizes[1] = 3; }, SELSCAN_STATUS_SHAPE_MISMATCH,
                  {"groups (3) must divide dim (8)"});
}

TEST(CpuStateUpdateValidation, IndicesAndSlots) {
  Fixture f;
  expect_rejected(f, [](auto& a) { a.state_batch_indices.dtype = SELSCAN_DTYPE_FLOAT32; },
                  SELSCAN_STATUS_DTYPE_MISMATCH, {"state_batch_indices", "int32 or int64", "float32"});
  expect_rejected(f, [](auto& a) { a.state_batch_indices.sizes[0] = 4; }, SELSCAN_STATUS_SHAPE_MISMATCH,
                  {"state_batch_indices", "(3,)", "(4,)"});
  expect_rejected(f, [](auto& a) { a.state_batch_indices.data = nullptr; }, SELSCAN_STATUS_SHAPE_MISMATCH,
                  {"state:", "3 slots", "without state_batch_indices", "(5, 8, 16)"});
}

TEST(CpuStateUpdateValidation, Layouts) {
  Fixture f;
  expect_rejected(f, [](auto& a) { a.x.strides[0] = -8; }, SELSCAN_STATUS_BAD_LAYOUT, {"x:", "negative", "-8"});
  expect_rejected(f, [](auto& a) { a.B.data = static_cast<char*>(a.B.data) + 1; }, SELSCAN_STATUS_BAD_LAYOUT,
                  {"B:", "not aligned"});
  expect_rejected(f, [](auto& a) { a.A.strides[0] = INT64_MAX / 4; }, SELSCAN_STATUS_UNSUPPORTED,
                  {"A:", "64-bit"});
  // An element span that fits int64 but whose byte span does not.
  expect_rejected(f, [](auto& a) { a.A.strides[0] = INT64_MAX / 8; }, SELSCAN_STATUS_UNSUPPORTED, {"A:", "byte"});
  expect_rejected(f, [](auto& a) { a.out.strides[1] = 0; }, SELSCAN_STATUS_BAD_LAYOUT, {"out:", "overlap"});
  expect_rejected(f, [](auto& a) { a.state.strides[1] = 8; }, SELSCAN_STATUS_BAD_LAYOUT,
                  {"state:", "overlap", "stride 8"});
  // Inputs may broadcast (stride 0).
  selscan_state_update_args_t a = f.a;
  a.A.strides[1] = 0;
  a.dt.strides[0] = 0;
  const selscan_exec_t e = cpu_exec(1);
  EXPECT_EQ(selscan_state_update(&a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
}

TEST(CpuStateUpdateValidation, OutputsMayNotAlias) {
  Fixture f;
  expect_rejected(f, [](auto& a) { a.out.data = a.x.data; }, SELSCAN_STATUS_BAD_LAYOUT, {"out", "overlap", "x"});
  // B inside the pool (B is smaller than the pool, so the pool overlaps nothing else whatever the heap holds)
  expect_rejected(f, [](auto& a) { a.B.data = a.state.data; }, SELSCAN_STATUS_BAD_LAYOUT, {"state", "overlap", "B"});
  expect_rejected(f, [&](auto& a) { a.state_batch_indices.data = f.c.out.storage.data() + 64; },
                  SELSCAN_STATUS_BAD_LAYOUT, {"overlap", "state_batch_indices"});
  // Inputs may share memory: B and C as views of one tensor.
  selscan_state_update_args_t a = f.a;
  a.C = a.B;
  const selscan_exec_t e = cpu_exec(1);
  EXPECT_EQ(selscan_state_update(&a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
}

TEST(CpuStateUpdateValidation, HeadsFormShapes) {
  StateUpdateSpec s;
  s.heads = true, s.nheads = 4, s.headdim = 2, s.groups = 2;
  Fixture f(s);
  expect_rejected(f, [](auto& a) { a.x.sizes[2] = 3; }, SELSCAN_STATUS_SHAPE_MISMATCH,
                  {"x:", "heads", "(4, 2)", "got (3, 4, 3)"});
  expect_rejected(f, [](auto& a) { a.A.ndim = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"A:", "(4, 2, 16)"});
  expect_rejected(f, [](auto& a) { a.D.sizes[1] = 1; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"D:", "(4, 2)", "(4, 1)"});
  expect_rejected(f, [](auto& a) { a.B.sizes[1] = a.C.sizes[1] = 3; }, SELSCAN_STATUS_SHAPE_MISMATCH,
                  {"groups (3) must divide heads (4)"});
}

// ------------------------------------------------------------------------------------------ destinations
// A pool of 8 slots, sequences reading `idx` and writing `dst` (dst_state_batch_indices).
Fixture dst_fixture(std::vector<int64_t> idx = {4, 0, 2}, std::vector<int64_t> dst = {1, 3, 2},
                    int32_t idx_dtype = SELSCAN_DTYPE_INT32) {
  StateUpdateSpec s;
  s.pool = 8, s.idx_dtype = idx_dtype, s.indices = std::move(idx), s.dst = std::move(dst);
  return Fixture(s);
}

TEST(CpuStateUpdateValidation, DstTheFixtureIsValid) {
  Fixture f = dst_fixture();
  const selscan_exec_t e = cpu_exec(1);
  EXPECT_EQ(selscan_state_update(&f.a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
}

TEST(CpuStateUpdateValidation, DstTheTensor) {
  Fixture f = dst_fixture();
  selscan_state_update_args_t a = f.a;
  a.state_batch_indices = SELSCAN_TENSOR_INIT;
  a.state.sizes[0] = 3;  // S = Bt: without dst the call would be valid
  expect_rejected(f, &a, SELSCAN_STATUS_INVALID_ARGUMENT, {"dst_state_batch_indices", "without state_batch_indices"});
  a = f.a;
  a.dst_state_batch_indices.dtype = SELSCAN_DTYPE_FLOAT32;
  expect_rejected(f, &a, SELSCAN_STATUS_DTYPE_MISMATCH, {"dst_state_batch_indices", "int32 or int64", "float32"});
  a = f.a;
  a.dst_state_batch_indices.sizes[0] = 4;
  expect_rejected(f, &a, SELSCAN_STATUS_SHAPE_MISMATCH, {"dst_state_batch_indices", "(3,)", "(4,)"});
  a = f.a;
  a.dst_state_batch_indices.ndim = 2;
  expect_rejected(f, &a, SELSCAN_STATUS_SHAPE_MISMATCH, {"dst_state_batch_indices"});
  a = f.a;
  a.dst_state_batch_indices.strides[0] = -1;
  expect_rejected(f, &a, SELSCAN_STATUS_BAD_LAYOUT, {"dst_state_batch_indices", "negative", "-1"});
  a = f.a;
  a.dst_state_batch_indices.data = f.c.out.storage.data() + 64;  // inside an output
  expect_rejected(f, &a, SELSCAN_STATUS_BAD_LAYOUT, {"overlap", "dst_state_batch_indices"});
}

TEST(CpuStateUpdateValidation, DstEntriesOutsideThePool) {
  for (const int64_t bad : {int64_t{8}, int64_t{-2}, int64_t{1} << 40}) {
    Fixture f = dst_fixture({4, 0, 2}, {1, bad, 2}, SELSCAN_DTYPE_INT64);  // INT64, so that 2^40 stays itself
    expect_rejected(f, &f.a, SELSCAN_STATUS_INVALID_ARGUMENT,
                    {"dst_state_batch_indices[1]", "[0, 8)", "pad_slot_id (-1)", "got " + std::to_string(bad)});
  }
}

TEST(CpuStateUpdateValidation, DstTwoSequencesWritingOneSlot) {
  Fixture f = dst_fixture({4, 0, 2}, {1, 6, 1});
  expect_rejected(f, &f.a, SELSCAN_STATUS_INVALID_ARGUMENT,
                  {"dst_state_batch_indices", "sequences 0 and 2", "both write slot 1"});
  Fixture g = dst_fixture({4, 0, 2}, {2, 3, 2});  // one of them in place
  expect_rejected(g, &g.a, SELSCAN_STATUS_INVALID_ARGUMENT, {"sequences 0 and 2", "both write slot 2"});
}

TEST(CpuStateUpdateValidation, DstASlotReadByOneAndWrittenByAnother) {
  Fixture f = dst_fixture({4, 0, 2}, {0, 3, 5});  // sequence 0 writes the slot sequence 1 reads
  expect_rejected(f, &f.a, SELSCAN_STATUS_INVALID_ARGUMENT,
                  {"dst_state_batch_indices[0] = 0", "sequence 0 writes the slot sequence 1 reads",
                   "state_batch_indices[1] = 0"});
  Fixture g = dst_fixture({4, 0, 2}, {1, 2, 0});  // a swap: each reads what another writes
  expect_rejected(g, &g.a, SELSCAN_STATUS_INVALID_ARGUMENT, {"writes the slot sequence"});
}

// dst on CUDA is planned like the in-place call (the same lanes and loads: the destination changes only where the
// state is stored), and through the ABI the call goes on to the device check (a device that does not exist here,
// so nothing runs on host pointers) instead of being refused.
TEST(CpuStateUpdateValidation, DstCudaCallIsPlanned) {
  Fixture f = dst_fixture();
  selscan::StateUpdate with{}, without{};
  ASSERT_EQ(selscan::make_state_update(&f.a, &with), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  selscan_state_update_args_t a = f.a;
  a.dst_state_batch_indices = SELSCAN_TENSOR_INIT;
  ASSERT_EQ(selscan::make_state_update(&a, &without), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_NE(with.dst, nullptr);
  const selscan::StateUpdatePlan p = selscan::cuda::plan_state_update(with);
  const selscan::StateUpdatePlan q = selscan::cuda::plan_state_update(without);
  EXPECT_EQ(p.lanes, q.lanes);
  EXPECT_EQ(p.lane_bits, q.lane_bits);
  EXPECT_EQ(p.vec_state, q.vec_state);
  EXPECT_EQ(p.vec_A, q.vec_A);
  EXPECT_EQ(p.vec_B, q.vec_B);
  EXPECT_EQ(p.vec_C, q.vec_C);
  selscan_exec_t e = cpu_exec(1);
  e.device_kind = SELSCAN_DEVICE_CUDA;
  e.device_index = 1000;
#if SELSCAN_WITH_CUDA
  expect_rejected(f, &f.a, SELSCAN_STATUS_NO_DEVICE, {}, e);
#else
  expect_rejected(f, &f.a, SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"}, e);
#endif
}

}  // namespace
}  // namespace selscan_test
