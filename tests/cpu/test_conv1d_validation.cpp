// Argument checking of selscan_conv1d_fwd / _bwd / _bwd_workspace_size / _update: every rule gives its status and a
// message that names the argument and prints the value given, and a rejected call writes nothing (outputs stay
// poisoned, the pools unchanged, every guard byte intact).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "conv1d_case.h"

namespace selscan_test {
namespace {

constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;
constexpr int32_t kI32 = SELSCAN_DTYPE_INT32, kI64 = SELSCAN_DTYPE_INT64;

// Every byte of every tensor, to compare after a rejected call.
std::vector<std::vector<unsigned char>> snapshot(const std::vector<Tensor*>& ts) {
  std::vector<std::vector<unsigned char>> v;
  for (const Tensor* t : ts) v.push_back(t->storage);
  return v;
}

template <class Args>
void expect_fail_untouched(selscan_status_t got, selscan_status_t want, const std::vector<std::string>& fragments,
                           const std::vector<Tensor*>& ts, const std::vector<std::vector<unsigned char>>& before) {
  const std::string msg = selscan_last_error();
  EXPECT_EQ(got, want) << selscan_status_string(got) << ": " << msg;
  for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_TRUE(ts[i]->storage == before[i]) << "a rejected " << sizeof(Args) << "-byte call changed tensor " << i
                                             << ": " << msg;
}

// A valid forward + backward case and its argument structs (host pointers).
struct ConvFixture {
  Conv1dCase c;
  selscan_conv1d_fwd_args_t f;
  selscan_conv1d_bwd_args_t b;
  std::vector<std::vector<unsigned char>> before;

  explicit ConvFixture(const Conv1dSpec& s) : c(make_conv1d_case(s)) {
    f = c.fwd_args(host_ptr);
    b = c.bwd_args(host_ptr);
    before = snapshot(c.all());
  }
  void fwd(const std::function<void(selscan_conv1d_fwd_args_t&)>& mutate, selscan_status_t want,
           const std::vector<std::string>& fragments, const selscan_exec_t& exec = cpu_exec(1)) {
    selscan_conv1d_fwd_args_t a = f;
    mutate(a);
    expect_fail_untouched<selscan_conv1d_fwd_args_t>(selscan_conv1d_fwd(&a, &exec), want, fragments, c.all(), before);
  }
  void bwd(const std::function<void(selscan_conv1d_bwd_args_t&)>& mutate, selscan_status_t want,
           const std::vector<std::string>& fragments, const selscan_exec_t& exec = cpu_exec(1)) {
    selscan_conv1d_bwd_args_t a = b;
    mutate(a);
    expect_fail_untouched<selscan_conv1d_bwd_args_t>(selscan_conv1d_bwd(&a, &exec), want, fragments, c.all(), before);
    // The size query validates alike.
    size_t bytes = 123;
    const selscan_status_t s = selscan_conv1d_bwd_workspace_size(&a, &exec, &bytes);
    EXPECT_EQ(s, want) << "the workspace query disagrees: " << selscan_last_error();
    EXPECT_EQ(bytes, 0u);
  }
};

Conv1dSpec dense_spec() {
  Conv1dSpec s;
  s.batch = 2, s.dim = 8, s.seqlen = 10, s.width = 4, s.initial_states = s.final_states = true;
  s.dinitial_states = s.dfinal_states = true;
  return s;
}

Conv1dSpec pool_spec() {
  Conv1dSpec s;
  s.lens = {3, 0, 6}, s.dim = 8, s.width = 3, s.slots = 5, s.state_len = 4;
  s.cache_indices = {4, -1, 1}, s.has_init = {1, 0, 1};
  return s;
}

TEST(CpuConv1dValidation, TheFixturesAreValid) {
  for (const Conv1dSpec& s : {dense_spec(), pool_spec()}) {
    ConvFixture fx(s);
    const selscan_exec_t e = cpu_exec(1);
    EXPECT_EQ(selscan_conv1d_fwd(&fx.f, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    size_t bytes = 7;
    EXPECT_EQ(selscan_conv1d_bwd_workspace_size(&fx.b, &e, &bytes), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    EXPECT_EQ(bytes, 0u) << "CPU calls need no workspace";
    EXPECT_EQ(selscan_conv1d_bwd(&fx.b, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  }
}

TEST(CpuConv1dValidation, NullPointers) {
  ConvFixture fx(dense_spec());
  const selscan_exec_t e = cpu_exec(1);
  expect_fail_untouched<int>(selscan_conv1d_fwd(nullptr, &e), SELSCAN_STATUS_INVALID_ARGUMENT,
                             {"selscan_conv1d_fwd_args", "NULL"}, fx.c.all(), fx.before);
  expect_fail_untouched<int>(selscan_conv1d_bwd(nullptr, &e), SELSCAN_STATUS_INVALID_ARGUMENT,
                             {"selscan_conv1d_bwd_args", "NULL"}, fx.c.all(), fx.before);
  expect_fail_untouched<int>(selscan_conv1d_update(nullptr, &e), SELSCAN_STATUS_INVALID_ARGUMENT,
                             {"selscan_conv1d_update_args", "NULL"}, fx.c.all(), fx.before);
  expect_fail_untouched<int>(selscan_conv1d_fwd(&fx.f, nullptr), SELSCAN_STATUS_INVALID_ARGUMENT,
                             {"selscan_exec", "NULL"}, fx.c.all(), fx.before);
  expect_fail_untouched<int>(selscan_conv1d_bwd(&fx.b, nullptr), SELSCAN_STATUS_INVALID_ARGUMENT,
                             {"selscan_exec", "NULL"}, fx.c.all(), fx.before);
  expect_fail_untouched<int>(selscan_conv1d_bwd_workspace_size(&fx.b, &e, nullptr), SELSCAN_STATUS_INVALID_ARGUMENT,
                             {"bytes", "NULL"}, fx.c.all(), fx.before);
  size_t bytes = 5;
  EXPECT_EQ(selscan_conv1d_bwd_workspace_size(nullptr, &e, &bytes), SELSCAN_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(bytes, 0u) << "a failing size query reports 0";
  fx.fwd([](auto& a) { a.x.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"x: required", "NULL"});
  fx.fwd([](auto& a) { a.weight.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"weight: required"});
  fx.fwd([](auto& a) { a.out.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"out: required"});
  fx.bwd([](auto& a) { a.dout.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"dout: required"});
  fx.bwd([](auto& a) { a.dx.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"dx: required"});
  fx.bwd([](auto& a) { a.dweight.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"dweight: required"});
  fx.bwd([](auto& a) { a.dbias.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"dbias: required", "bias"});
}

// struct_size: below the first version, garbage, and a newer caller's larger struct (zero tail accepted, a set
// field of a newer version refused).
template <class Args, class Call>
void check_struct_sizes(Args a, const char* name, Call call, const std::vector<Tensor*>& ts) {
  const auto before = snapshot(ts);
  a.struct_size = sizeof(Args) - 8;
  expect_fail_untouched<Args>(call(&a), SELSCAN_STATUS_BAD_STRUCT_SIZE,
                              {name, "struct_size is " + std::to_string(sizeof(Args) - 8)}, ts, before);
  a.struct_size = size_t{1} << 20;
  expect_fail_untouched<Args>(call(&a), SELSCAN_STATUS_BAD_STRUCT_SIZE, {"struct_size is 1048576"}, ts, before);
  struct Newer {
    Args a;
    int64_t future_field;
  } n{a, 0};
  n.a.struct_size = sizeof(Newer);
  EXPECT_EQ(call(&n.a), SELSCAN_STATUS_SUCCESS) << name << ": " << selscan_last_error();
  const auto after_ok = snapshot(ts);
  n.future_field = 9;
  expect_fail_untouched<Args>(call(&n.a), SELSCAN_STATUS_UNSUPPORTED,
                              {name, "byte " + std::to_string(sizeof(Args)), "0x09", "newer version"}, ts, after_ok);
}

TEST(CpuConv1dValidation, StructSizes) {
  const selscan_exec_t e = cpu_exec(1);
  ConvFixture fx(dense_spec());
  check_struct_sizes(fx.f, "selscan_conv1d_fwd_args", [&](auto* a) { return selscan_conv1d_fwd(a, &e); }, fx.c.all());
  ConvFixture bx(dense_spec());
  check_struct_sizes(bx.b, "selscan_conv1d_bwd_args", [&](auto* a) { return selscan_conv1d_bwd(a, &e); }, bx.c.all());
  Conv1dUpdateCase u = make_conv1d_update_case(Conv1dUpdateSpec{});
  check_struct_sizes(u.args(host_ptr), "selscan_conv1d_update_args",
                     [&](auto* a) { return selscan_conv1d_update(a, &e); }, u.all());
}

TEST(CpuConv1dValidation, FlagsAndEnums) {
  ConvFixture fx(dense_spec());
  fx.fwd([](auto& a) { a.activation = 2; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"activation", "got 2"});
  fx.fwd([](auto& a) { a.flags = 8; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"flags", "must be 0, got 8"});
  fx.bwd([](auto& a) { a.activation = -1; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"activation", "got -1"});
  fx.bwd([](auto& a) { a.deterministic = 2; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"deterministic", "got 2"});
  fx.bwd([](auto& a) { a.flags = 1; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"flags", "got 1"});
  fx.bwd([](auto& a) { a.reserved = 3; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"reserved", "got 3"});
  selscan_exec_t e = cpu_exec(1);
  e.device_kind = 7;
  fx.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"exec.device_kind", "got 7"}, e);
  e = cpu_exec(1);
  e.num_threads = -2;
  fx.bwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"exec.num_threads", "got -2"}, e);
#if !SELSCAN_WITH_CUDA
  fx.fwd([](auto&) {}, SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"}, cuda_exec());
  fx.bwd([](auto&) {}, SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"}, cuda_exec());
#endif
}

TEST(CpuConv1dValidation, InputsDtypesShapes) {
  ConvFixture fx(dense_spec());
  fx.fwd([](auto& a) { a.x.dtype = kI32; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"x: expected dtype", "got int32"});
  fx.fwd([](auto& a) { a.x.ndim = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"x: expected 3 dims", "(2, 8)"});
  fx.fwd([](auto& a) { a.x.sizes[2] = 0; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"x: every size must be >= 1", "(2, 8, 0)"});
  fx.fwd([](auto& a) { a.weight.sizes[1] = 5; }, SELSCAN_STATUS_UNSUPPORTED,
         {"weight: width", "2, 3 or 4", "got 5", "(8, 5)"});
  fx.fwd([](auto& a) { a.weight.sizes[1] = 1; }, SELSCAN_STATUS_UNSUPPORTED, {"weight: width", "got 1"});
  fx.fwd([](auto& a) { a.weight.sizes[1] = 0; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"weight: width", "(8, 0)"});
  fx.fwd([](auto& a) { a.weight.sizes[0] = 9; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"weight: expected shape (8, width)",
                                                                                 "(9, 4)"});
  fx.fwd([](auto& a) { a.weight.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"weight: expected dtype float32",
                                                                                "got float16"});
  fx.fwd([](auto& a) { a.bias.dtype = kBF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"bias", "weight's dtype",
                                                                              "got bfloat16"});
  fx.fwd([](auto& a) { a.bias.sizes[0] = 7; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"bias: expected shape (8,)", "(7,)"});
  fx.fwd([](auto& a) { a.initial_states.sizes[2] = 4; }, SELSCAN_STATUS_SHAPE_MISMATCH,
         {"initial_states: expected shape (2, 8, 3)", "(2, 8, 4)"});
  fx.fwd([](auto& a) { a.initial_states.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
         {"initial_states", "x's dtype", "got float16"});
  fx.fwd([](auto& a) { a.out.dtype = kBF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"out", "got bfloat16"});
  fx.fwd([](auto& a) { a.out.sizes[2] = 9; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"out: expected shape (2, 8, 10)",
                                                                            "(2, 8, 9)"});
  fx.fwd([](auto& a) { a.final_states.sizes[0] = 3; }, SELSCAN_STATUS_SHAPE_MISMATCH,
         {"final_states: expected shape (2, 8, 3)", "(3, 8, 3)"});
  fx.bwd([](auto& a) { a.dout.sizes[1] = 4; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"dout", "(2, 4, 10)"});
  fx.bwd([](auto& a) { a.dx.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"dx", "got float16"});
  fx.bwd([](auto& a) { a.dweight.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
         {"dweight: expected dtype float32", "got float16"});
  fx.bwd([](auto& a) { a.dweight.sizes[1] = 3; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"dweight", "(8, 3)"});
  fx.bwd([](auto& a) { a.dbias.dtype = kBF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"dbias", "dweight's dtype",
                                                                               "got bfloat16"});
  fx.bwd([](auto& a) { a.dfinal_states.sizes[2] = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH,
         {"dfinal_states: expected shape (2, 8, 3)", "(2, 8, 2)"});
  fx.bwd([](auto& a) { a.dinitial_states.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
         {"dinitial_states", "got float16"});
  fx.bwd([](auto& a) { a.initial_states.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT,
         {"dinitial_states: must be absent", "initial_states is absent"});
  fx.bwd([](auto& a) { a.bias.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT,
         {"dbias: must be absent", "bias is absent"});

  // 16-bit x: the weight may be float32 or x's dtype, dweight float32 or the weight's.
  Conv1dSpec s = dense_spec();
  s.itype = kBF16, s.wtype = kBF16, s.dwtype = kBF16;
  ConvFixture h(s);
  h.fwd([](auto& a) { a.weight.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
        {"weight: expected dtype float32 or bfloat16", "got float16"});
  h.bwd([](auto& a) { a.dweight.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
        {"dweight: expected dtype float32 or bfloat16", "got float16"});
}

TEST(CpuConv1dValidation, SeqIdx) {
  Conv1dSpec s = dense_spec();
  s.initial_states = s.final_states = s.dinitial_states = s.dfinal_states = false;
  s.seq_idx = true;
  ConvFixture fx(s);
  fx.fwd([](auto& a) { a.seq_idx.dtype = kI64; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"seq_idx: expected dtype int32",
                                                                                "got int64"});
  fx.fwd([](auto& a) { a.seq_idx.sizes[1] = 11; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"seq_idx: expected shape (2, 10)",
                                                                                 "(2, 11)"});
  ConvFixture st(dense_spec());  // a call with states, given seq_idx too
  const selscan_tensor_t sidx = fx.f.seq_idx;
  st.fwd([&](auto& a) { a.seq_idx = sidx; }, SELSCAN_STATUS_INVALID_ARGUMENT,
         {"initial_states: must be absent with seq_idx"});
  st.fwd([&](auto& a) { a.seq_idx = sidx, a.initial_states = {}; }, SELSCAN_STATUS_INVALID_ARGUMENT,
         {"final_states: must be absent", "with seq_idx"});
  st.bwd([&](auto& a) { a.seq_idx = sidx, a.initial_states = {}, a.dinitial_states = {}; },
         SELSCAN_STATUS_INVALID_ARGUMENT, {"dfinal_states: must be absent", "with seq_idx"});
  ConvFixture pk(pool_spec());
  pk.fwd([&](auto& a) { a.seq_idx = sidx; }, SELSCAN_STATUS_INVALID_ARGUMENT,
         {"seq_idx: must be absent with cu_seqlens"});
}

TEST(CpuConv1dValidation, Layouts) {
  ConvFixture fx(dense_spec());
  fx.fwd([](auto& a) { a.x.strides[2] = -1; }, SELSCAN_STATUS_BAD_LAYOUT, {"x: negative strides", "-1"});
  fx.fwd([](auto& a) { a.weight.data = static_cast<char*>(a.weight.data) + 1; }, SELSCAN_STATUS_BAD_LAYOUT,
         {"weight: data pointer", "not aligned"});
  fx.fwd([](auto& a) { a.out.strides[1] = 0; }, SELSCAN_STATUS_BAD_LAYOUT, {"out: output with stride 0", "dim 1"});
  fx.fwd([](auto& a) { a.out = a.x; }, SELSCAN_STATUS_BAD_LAYOUT, {"out: output bytes", "overlap x's bytes"});
  fx.fwd([](auto& a) { a.final_states.data = a.initial_states.data; }, SELSCAN_STATUS_BAD_LAYOUT,
         {"final_states: output bytes", "initial_states"});
  fx.fwd([](auto& a) { a.out.strides[1] = 3; }, SELSCAN_STATUS_BAD_LAYOUT, {"out: output elements would overlap"});
  fx.bwd([](auto& a) { a.dx = a.dout; }, SELSCAN_STATUS_BAD_LAYOUT, {"dx: output bytes", "overlap dout's"});
  fx.bwd([](auto& a) { a.dbias.data = a.dweight.data; }, SELSCAN_STATUS_BAD_LAYOUT, {"dbias: output bytes",
                                                                                    "dweight"});
  fx.bwd([](auto& a) { a.dinitial_states = a.initial_states; }, SELSCAN_STATUS_BAD_LAYOUT,
         {"dinitial_states: output bytes", "initial_states"});
}

TEST(CpuConv1dValidation, PackedAndPool) {
  ConvFixture fx(pool_spec());
  fx.fwd([](auto& a) { a.cu_seqlens.dtype = kF32; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"cu_seqlens", "got float32"});
  fx.fwd([](auto& a) { a.cu_seqlens.sizes[0] = 1; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"cu_seqlens", "(1,)"});
  fx.fwd([](auto& a) { a.x.sizes[0] = 2, a.out.sizes[0] = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH,
         {"x: with cu_seqlens", "(2, 8, 9)"});
  fx.fwd([](auto& a) { a.conv_states.dtype = kBF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"conv_states", "got bfloat16"});
  fx.fwd([](auto& a) { a.conv_states.sizes[2] = 1; }, SELSCAN_STATUS_SHAPE_MISMATCH,
         {"conv_states", "state_len >= width - 1 = 2", "(5, 8, 1)"});
  fx.fwd([](auto& a) { a.conv_states.sizes[1] = 7; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"conv_states", "(5, 7, 4)"});
  fx.fwd([](auto& a) { a.cache_indices = {}; }, SELSCAN_STATUS_SHAPE_MISMATCH,
         {"conv_states: without cache_indices", "3 slots", "(5, 8, 4)"});
  fx.fwd([](auto& a) { a.cache_indices.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
         {"cache_indices", "got float16"});
  fx.fwd([](auto& a) { a.cache_indices.sizes[0] = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"cache_indices", "(2,)"});
  fx.fwd([](auto& a) { a.has_initial_state.dtype = kI64; }, SELSCAN_STATUS_DTYPE_MISMATCH,
         {"has_initial_state: expected dtype bool or int32", "got int64"});
  fx.fwd([](auto& a) { a.conv_states = {}; }, SELSCAN_STATUS_INVALID_ARGUMENT,
         {"has_initial_state", "both are absent"});
  // x placed inside the pool, not the pool over x: the pool is the larger tensor, so laid over x it would also
  // cover whichever allocation the heap put after x, and the message would name that one.
  ASSERT_LE(fx.c.x.storage.size(), fx.c.pool.storage.size());
  fx.fwd([](auto& a) { a.x.data = a.conv_states.data; }, SELSCAN_STATUS_BAD_LAYOUT, {"conv_states: output bytes",
                                                                                   "overlap x's"});
  ConvFixture d(dense_spec());
  const selscan_tensor_t pool = fx.f.conv_states;
  d.fwd([&](auto& a) { a.conv_states = pool; }, SELSCAN_STATUS_INVALID_ARGUMENT,
        {"initial_states: must be absent with conv_states"});
  d.fwd([&](auto& a) { a.conv_states = pool, a.initial_states = {}; }, SELSCAN_STATUS_INVALID_ARGUMENT,
        {"final_states: must be absent with conv_states"});
}

// The index contents a CPU call reads (a CUDA call cannot): cu_seqlens, cache_indices.
TEST(CpuConv1dValidation, HostContents) {
  Conv1dSpec s = pool_spec();
  auto with = [&](const std::function<void(Conv1dSpec&)>& edit) {
    Conv1dSpec t = s;
    edit(t);
    return t;
  };
  {
    ConvFixture fx(s);
    fx.c.cu_seqlens.set({0}, 1);
    fx.before = snapshot(fx.c.all());
    fx.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"cu_seqlens: must start at 0", "cu_seqlens[0] = 1"});
    fx.bwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"cu_seqlens: must start at 0"});
  }
  {
    ConvFixture fx(s);
    fx.c.cu_seqlens.set({1}, 4);  // 0, 4, 3, 9
    fx.before = snapshot(fx.c.all());
    fx.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"non-decreasing", "cu_seqlens[1] = 4 > cu_seqlens[2] = 3"});
  }
  {
    ConvFixture fx(s);
    fx.c.cu_seqlens.set({3}, 8);
    fx.before = snapshot(fx.c.all());
    fx.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"must end at the packed length 9 (x's last dim)",
                                                           "cu_seqlens[3] = 8"});
    fx.bwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"must end at the packed length 9"});
  }
  ConvFixture oob(with([](Conv1dSpec& t) { t.cache_indices = {4, 5, 1}; }));
  oob.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT,
          {"cache_indices[1]: expected a slot of conv_states in [0, 5) or pad_slot_id (-1), got 5"});
  ConvFixture neg(with([](Conv1dSpec& t) { t.cache_indices = {4, -2, 1}, t.idx_dtype = kI64; }));
  neg.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"cache_indices[1]", "got -2"});
  ConvFixture dup(with([](Conv1dSpec& t) { t.cache_indices = {1, -1, 1}; }));
  dup.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"cache_indices: sequences 0 and 2 both name slot 1"});
}

// The GPU suites' out-of-pool cases (CUDA: NaN out, no slot touched) are rejected by CPU calls, naming the entry.
TEST(CpuConv1dValidation, OutOfPoolEntriesAreRejected) {
  for (const NamedConv1dSpec& n : conv1d_out_of_pool_specs()) {
    ConvFixture fx(n.spec);
    fx.fwd([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"cache_indices[", "expected a slot of conv_states"});
  }
  for (const NamedConv1dUpdateSpec& n : conv1d_update_out_of_pool_specs()) {
    Conv1dUpdateCase c = make_conv1d_update_case(n.spec);
    const auto before = snapshot(c.all());
    const selscan_conv1d_update_args_t a = c.args(host_ptr);
    const selscan_exec_t e = cpu_exec(1);
    expect_fail_untouched<selscan_conv1d_update_args_t>(selscan_conv1d_update(&a, &e), SELSCAN_STATUS_INVALID_ARGUMENT,
                                                        {"conv_state_indices[", "expected a slot of conv_state"},
                                                        c.all(), before);
  }
}

// The failures `check` reports that mention `text` (captured: they do not fail this test).
template <class F>
int failures_mentioning(F&& check, const std::string& text) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    check();
  }
  int n = 0;
  for (int i = 0; i < results.size(); ++i)
    n += std::string(results.GetTestPartResult(i).message()).find(text) != std::string::npos;
  return n;
}

// What the GPU suites expect of those cases, checked here on a stand-in: the CPU result of the same call with the
// out-of-pool entries made padding, with NaN written over those sequences' outputs, passes the checks; leaving the
// padding's zeros there does not.
TEST(CpuConv1dValidation, OutOfPoolExpectationsOnAStandIn) {
  for (const NamedConv1dSpec& n : conv1d_out_of_pool_specs()) {
    const Conv1dCase before = make_conv1d_case(n.spec);
    Conv1dSpec pad = n.spec;
    for (size_t b = 0; b < pad.cache_indices.size(); ++b)
      if (before.out_of_pool(static_cast<int64_t>(b))) pad.cache_indices[b] = pad.pad_slot_id;
    Conv1dCase stand = make_conv1d_case(pad);
    ASSERT_EQ(run_conv1d_fwd(stand, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    Conv1dCase after = before;
    after.out.storage = stand.out.storage;
    after.pool.storage = stand.pool.storage;
    EXPECT_EQ(failures_mentioning([&] { expect_conv1d_fwd_ok(after, before); }, "naming no slot must be NaN"), 1);
    for (int64_t b = 0; b < n.spec.seqs(); ++b)
      if (before.out_of_pool(b))
        for (int64_t d = 0; d < n.spec.dim; ++d)
          for (int64_t t = 0; t < n.spec.len(b); ++t) after.out.set({after.row(b), d, after.start(b) + t}, NAN);
    expect_conv1d_fwd_ok(after, before);
  }
  for (const NamedConv1dUpdateSpec& n : conv1d_update_out_of_pool_specs()) {
    const Conv1dUpdateCase before = make_conv1d_update_case(n.spec);
    Conv1dUpdateSpec pad = before.spec;
    for (size_t b = 0; b < pad.indices.size(); ++b)
      if (before.slot_of(static_cast<int64_t>(b)) == -2) pad.indices[b] = pad.pad_slot_id;
    Conv1dUpdateCase stand = make_conv1d_update_case(pad);
    ASSERT_EQ(run_conv1d_update(stand, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    Conv1dUpdateCase after = before;
    after.out.storage = stand.out.storage;
    after.state.storage = stand.state.storage;
    EXPECT_EQ(failures_mentioning([&] { expect_conv1d_update_ok(after, before); }, "its out must be NaN"), 2);
    for (int64_t b = 0; b < n.spec.batch; ++b)
      if (before.slot_of(b) == -2)
        for (int64_t d = 0; d < n.spec.dim; ++d)
          for (int64_t t = 0; t < n.spec.tokens; ++t) after.out.set({b, d, t}, NAN);
    expect_conv1d_update_ok(after, before);
  }
}

// ------------------------------------------------------------------------------------------ the update
struct UpdateFixture {
  Conv1dUpdateCase c;
  selscan_conv1d_update_args_t a;
  std::vector<std::vector<unsigned char>> before;
  explicit UpdateFixture(const Conv1dUpdateSpec& s) : c(make_conv1d_update_case(s)) {
    a = c.args(host_ptr);
    before = snapshot(c.all());
  }
  void run(const std::function<void(selscan_conv1d_update_args_t&)>& mutate, selscan_status_t want,
           const std::vector<std::string>& fragments, const selscan_exec_t& exec = cpu_exec(1)) {
    selscan_conv1d_update_args_t m = a;
    mutate(m);
    expect_fail_untouched<selscan_conv1d_update_args_t>(selscan_conv1d_update(&m, &exec), want, fragments, c.all(),
                                                        before);
  }
};

Conv1dUpdateSpec update_spec() {
  Conv1dUpdateSpec s;
  s.batch = 3, s.dim = 8, s.tokens = 2, s.width = 4, s.state_len = 5, s.slots = 5, s.indices = {4, -1, 0};
  s.cache_seqlens = {1, 0, 7};
  return s;
}

TEST(CpuConv1dValidation, Update) {
  UpdateFixture f(update_spec());
  const selscan_exec_t e = cpu_exec(1);
  {
    UpdateFixture ok(update_spec());
    EXPECT_EQ(selscan_conv1d_update(&ok.a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  }
  f.run([](auto& a) { a.flags = 2; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"flags", "got 2"});
  f.run([](auto& a) { a.activation = 5; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"activation", "got 5"});
  f.run([](auto& a) { a.x.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"x: required"});
  f.run([](auto& a) { a.x.dtype = kI64; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"x: expected dtype", "got int64"});
  f.run([](auto& a) { a.x.ndim = 4; }, SELSCAN_STATUS_SHAPE_MISMATCH,
        {"x: expected shape (batch, dim)", "(3, 8, 2, 0)"});
  f.run([](auto& a) { a.x.sizes[2] = 0, a.out.sizes[2] = 0; }, SELSCAN_STATUS_SHAPE_MISMATCH,
        {"x: every size must be >= 1", "(3, 8, 0)"});
  f.run([](auto& a) { a.weight.sizes[1] = 6; }, SELSCAN_STATUS_UNSUPPORTED, {"weight: width", "got 6"});
  f.run([](auto& a) { a.bias.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"bias", "got float16"});
  f.run([](auto& a) { a.conv_state.data = nullptr; }, SELSCAN_STATUS_INVALID_ARGUMENT, {"conv_state: required"});
  f.run([](auto& a) { a.conv_state.dtype = kF16; }, SELSCAN_STATUS_DTYPE_MISMATCH,
        {"conv_state: expected dtype float32", "got float16"});
  f.run([](auto& a) { a.conv_state.sizes[2] = 2; }, SELSCAN_STATUS_SHAPE_MISMATCH,
        {"conv_state", "state_len >= width - 1 = 3", "(5, 8, 2)"});
  f.run([](auto& a) { a.conv_state_indices = {}; }, SELSCAN_STATUS_SHAPE_MISMATCH,
        {"conv_state: without conv_state_indices", "3 slots", "(5, 8, 5)"});
  f.run([](auto& a) { a.conv_state_indices.sizes[0] = 4; }, SELSCAN_STATUS_SHAPE_MISMATCH,
        {"conv_state_indices", "(4,)"});
  f.run([](auto& a) { a.cache_seqlens.dtype = kF32; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"cache_seqlens", "got float32"});
  f.run([](auto& a) { a.out.sizes[2] = 3; }, SELSCAN_STATUS_SHAPE_MISMATCH, {"out: expected shape (3, 8, 2)",
                                                                           "(3, 8, 3)"});
  f.run([](auto& a) { a.out.dtype = kBF16; }, SELSCAN_STATUS_DTYPE_MISMATCH, {"out", "got bfloat16"});
  f.run([](auto& a) { a.out.data = a.conv_state.data; }, SELSCAN_STATUS_BAD_LAYOUT, {"output bytes", "conv_state"});
  f.run([](auto& a) { a.conv_state.data = a.weight.data; }, SELSCAN_STATUS_BAD_LAYOUT,
        {"conv_state: output bytes", "weight"});
#if !SELSCAN_WITH_CUDA
  f.run([](auto&) {}, SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"}, cuda_exec());
#endif
  // Host contents.
  Conv1dUpdateSpec s = update_spec();
  s.cache_seqlens = {1, 0, -3};
  UpdateFixture neg(s);
  neg.run([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"cache_seqlens[2]: expected >= 0", "got -3"});
  s = update_spec();
  s.indices = {5, -1, 0}, s.idx_dtype = kI64;
  UpdateFixture oob(s);
  oob.run([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT,
          {"conv_state_indices[0]: expected a slot of conv_state in [0, 5) or pad_slot_id (-1), got 5"});
  s.indices = {2, 0, 2};
  UpdateFixture dup(s);
  dup.run([](auto&) {}, SELSCAN_STATUS_INVALID_ARGUMENT, {"conv_state_indices: sequences 0 and 2 both name slot 2"});
}

}  // namespace
}  // namespace selscan_test
