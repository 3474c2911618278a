// Bad input gets the documented status and a message naming the argument, expected vs actual; nothing is
// written to the outputs of a rejected call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "selscan/selscan.h"

namespace {

selscan_tensor_t tensor(void* data, selscan_dtype_t dt, std::vector<int64_t> sizes) {
  return selscan_test::contiguous_desc(data, dt, sizes);
}

// A small valid fp32 problem (Bt=2, D=4, L=8, N=3, variable B/C, z) whose pieces each test breaks in one way.
struct Fixture {
  static constexpr int64_t Bt = 2, D = 4, L = 8, N = 3;
  std::vector<float> u, delta, A, B, C, z, out, out_z, dout, du, ddelta, dA, dB, dC, dz;
  selscan_fwd_args_t fwd{};
  selscan_bwd_args_t bwd{};
  selscan_exec_t exec = SELSCAN_EXEC_INIT;

  Fixture()
      : u(Bt * D * L, 0.5f), delta(Bt * D * L, 0.1f), A(D * N, -1.f), B(Bt * N * L, 0.3f), C(Bt * N * L, 0.2f),
        z(Bt * D * L, 1.f), out(Bt * D * L, NAN), out_z(Bt * D * L, NAN), dout(Bt * D * L, 1.f),
        du(Bt * D * L, NAN), ddelta(Bt * D * L, NAN), dA(D * N, NAN), dB(Bt * N * L, NAN), dC(Bt * N * L, NAN),
        dz(Bt * D * L, NAN) {
    const auto f32 = SELSCAN_DTYPE_FLOAT32;
    fwd.struct_size = sizeof(fwd);
    fwd.u = tensor(u.data(), f32, {Bt, D, L});
    fwd.delta = tensor(delta.data(), f32, {Bt, D, L});
    fwd.A = tensor(A.data(), f32, {D, N});
    fwd.B = tensor(B.data(), f32, {Bt, 1, N, L});
    fwd.C = tensor(C.data(), f32, {Bt, 1, N, L});
    fwd.z = tensor(z.data(), f32, {Bt, D, L});
    fwd.out = tensor(out.data(), f32, {Bt, D, L});
    fwd.out_z = tensor(out_z.data(), f32, {Bt, D, L});

    bwd = selscan_test::bwd_args_with_inputs_of(fwd, false);
    bwd.dout = tensor(dout.data(), f32, {Bt, D, L});
    bwd.out = tensor(u.data(), f32, {Bt, D, L});
    bwd.du = tensor(du.data(), f32, {Bt, D, L});
    bwd.ddelta = tensor(ddelta.data(), f32, {Bt, D, L});
    bwd.dA = tensor(dA.data(), f32, {D, N});
    bwd.dB = tensor(dB.data(), f32, {Bt, 1, N, L});
    bwd.dC = tensor(dC.data(), f32, {Bt, 1, N, L});
    bwd.dz = tensor(dz.data(), f32, {Bt, D, L});
  }

  bool fwd_outputs_untouched() const {
    for (float v : out) if (!std::isnan(v)) return false;
    for (float v : out_z) if (!std::isnan(v)) return false;
    return true;
  }
};

// Expects `status` and a message that contains every fragment.
void expect_error(selscan_status_t got, selscan_status_t want, std::vector<std::string> fragments) {
  EXPECT_EQ(got, want) << "status " << selscan_status_string(got) << ": " << selscan_last_error();
  const std::string msg = selscan_last_error();
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: '" << msg << "' lacks '" << f << "'";
}

TEST(Validation, ValidProblemRunsOnCpu) {
  Fixture f;
  ASSERT_EQ(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (float v : f.out) EXPECT_TRUE(std::isfinite(v));
  ASSERT_EQ(selscan_bwd(&f.bwd, &f.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (float v : f.dA) EXPECT_TRUE(std::isfinite(v));
}

TEST(Validation, NullPointers) {
  Fixture f;
  expect_error(selscan_fwd(nullptr, &f.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"selscan_fwd_args", "NULL"});
  expect_error(selscan_fwd(&f.fwd, nullptr), SELSCAN_STATUS_INVALID_ARGUMENT, {"selscan_exec", "NULL"});
  f.fwd.delta.data = nullptr;
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"delta", "required"});
  Fixture g;
  g.fwd.out.data = nullptr;
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"out", "required"});
  Fixture h;
  h.bwd.du.data = nullptr;
  expect_error(selscan_bwd(&h.bwd, &h.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"du"});
  size_t bytes = 0;
  expect_error(selscan_fwd_workspace_size(&h.fwd, &h.exec, nullptr), SELSCAN_STATUS_INVALID_ARGUMENT, {"bytes"});
  (void)bytes;
  EXPECT_TRUE(g.fwd_outputs_untouched());
}

TEST(Validation, StructSizeTooSmall) {
  Fixture f;
  f.fwd.struct_size = offsetof(selscan_fwd_args_t, cu_seqlens) - 8;  // inside the first version's last field
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_BAD_STRUCT_SIZE, {"struct_size"});
  Fixture g;
  g.exec.struct_size = 4;
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_BAD_STRUCT_SIZE, {"selscan_exec", "struct_size is 4"});
  Fixture h;
  h.bwd.struct_size = 0;
  expect_error(selscan_bwd(&h.bwd, &h.exec), SELSCAN_STATUS_BAD_STRUCT_SIZE, {"selscan_bwd_args"});
  EXPECT_TRUE(f.fwd_outputs_untouched());
}

TEST(Validation, DtypeMismatch) {
  Fixture f;
  f.fwd.u.dtype = SELSCAN_DTYPE_COMPLEX64;
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_DTYPE_MISMATCH, {"u:", "complex64"});
  Fixture g;
  g.fwd.delta.dtype = SELSCAN_DTYPE_FLOAT16;
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_DTYPE_MISMATCH, {"delta", "float32", "float16"});
  Fixture h;
  h.fwd.A.dtype = SELSCAN_DTYPE_BFLOAT16;
  expect_error(selscan_fwd(&h.fwd, &h.exec), SELSCAN_STATUS_DTYPE_MISMATCH, {"A:", "bfloat16"});
  Fixture k;
  k.fwd.u.dtype = 17;
  expect_error(selscan_fwd(&k.fwd, &k.exec), SELSCAN_STATUS_DTYPE_MISMATCH, {"u:", "got dtype code 17"});
  Fixture m;
  m.fwd.delta.dtype = 7;
  expect_error(selscan_fwd(&m.fwd, &m.exec), SELSCAN_STATUS_DTYPE_MISMATCH,
               {"delta: expected dtype float32 (u's dtype), got dtype code 7"});
  EXPECT_TRUE(f.fwd_outputs_untouched());
}

TEST(Validation, ShapeMismatch) {
  Fixture f;
  f.fwd.delta.sizes[2] = 9;
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"delta", "(2, 4, 8)", "(2, 4, 9)"});
  Fixture g;
  g.fwd.A.sizes[0] = 5;
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"A:", "(4, dstate)"});
  Fixture h;
  h.fwd.C.sizes[2] = 2;  // dstate 2 vs A's 3
  expect_error(selscan_fwd(&h.fwd, &h.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"C:", "(2, 1, 3, 8)"});
  Fixture k;
  k.fwd.u.ndim = 7;
  expect_error(selscan_fwd(&k.fwd, &k.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"u:", "ndim=7"});
  EXPECT_TRUE(f.fwd_outputs_untouched());
}

TEST(Validation, ZeroSizeDims) {
  for (int dim = 0; dim < 3; ++dim) {
    Fixture f;
    f.fwd.u.sizes[dim] = 0;
    expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"u:", ">= 1"});
  }
  Fixture g;
  g.fwd.A.sizes[1] = 0;
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"dstate", "got 0"});
}

TEST(Validation, GroupsMustDivideDim) {
  Fixture f;
  std::vector<float> B3(f.Bt * 3 * f.N * f.L), C3(B3.size());
  f.fwd.B = tensor(B3.data(), SELSCAN_DTYPE_FLOAT32, {f.Bt, 3, f.N, f.L});
  f.fwd.C = tensor(C3.data(), SELSCAN_DTYPE_FLOAT32, {f.Bt, 3, f.N, f.L});
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"groups (3)", "dim (4)"});
  Fixture g;  // B with 2 groups, C with 1
  std::vector<float> B2(g.Bt * 2 * g.N * g.L);
  g.fwd.B = tensor(B2.data(), SELSCAN_DTYPE_FLOAT32, {g.Bt, 2, g.N, g.L});
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"C:", "same number of groups"});
  EXPECT_TRUE(f.fwd_outputs_untouched());
}

TEST(Validation, DstateLimit) {
  Fixture f;
  std::vector<float> A(f.D * 257);
  f.fwd.A = tensor(A.data(), SELSCAN_DTYPE_FLOAT32, {f.D, 257});
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_UNSUPPORTED, {"dstate", "256", "257"});
}

TEST(Validation, Layouts) {
  Fixture f;
  f.fwd.u.strides[2] = 2;
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_BAD_LAYOUT, {"u:", "contiguous", "stride 2"});
  Fixture g;
  g.fwd.out.strides[1] = 0;
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_BAD_LAYOUT, {"out:", "stride 0"});
  Fixture h;
  h.fwd.A.strides[0] = -1;
  expect_error(selscan_fwd(&h.fwd, &h.exec), SELSCAN_STATUS_BAD_LAYOUT, {"A:", "negative"});
  Fixture k;
  k.fwd.u.data = reinterpret_cast<char*>(k.u.data()) + 1;
  expect_error(selscan_fwd(&k.fwd, &k.exec), SELSCAN_STATUS_BAD_LAYOUT, {"u:", "aligned"});
  Fixture m;
  m.fwd.delta.strides[1] = INT64_MAX / 2;  // 3 * (INT64_MAX / 2) overflows
  expect_error(selscan_fwd(&m.fwd, &m.exec), SELSCAN_STATUS_UNSUPPORTED,
               {"delta: sizes (2, 4, 8) with strides (32, 4611686018427387903, 1) overflow 64-bit element offsets"});
  EXPECT_TRUE(f.fwd_outputs_untouched());
}

TEST(Validation, OptionalPairs) {
  Fixture f;
  f.fwd.out_z.data = nullptr;  // z given, out_z missing
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"out_z", "when z is given"});
  Fixture g;
  g.fwd.z.data = nullptr;  // out_z given, z missing
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"out_z", "when z is absent"});
  Fixture h;
  h.bwd.out.data = nullptr;
  expect_error(selscan_bwd(&h.bwd, &h.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"out", "pre-gate"});
  Fixture k;
  std::vector<float> dD(k.D);
  k.bwd.dD = tensor(dD.data(), SELSCAN_DTYPE_FLOAT32, {k.D});
  expect_error(selscan_bwd(&k.bwd, &k.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"dD", "when D is absent"});
  Fixture m;
  m.fwd.delta_softplus = 2;
  expect_error(selscan_fwd(&m.fwd, &m.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"delta_softplus", "got 2"});
  Fixture n;
  n.fwd.flags = 1;
  expect_error(selscan_fwd(&n.fwd, &n.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"flags"});
}

TEST(Validation, LongSequenceBackwardNeedsChunkStates) {
  const int64_t L = 2049;
  std::vector<float> big(2 * 4 * L, 0.1f), bc(2 * 3 * L, 0.1f);
  Fixture f;
  for (auto* t : {&f.bwd.u, &f.bwd.delta, &f.bwd.z, &f.bwd.dout, &f.bwd.out, &f.bwd.du, &f.bwd.ddelta, &f.bwd.dz})
    *t = tensor(big.data(), SELSCAN_DTYPE_FLOAT32, {2, 4, L});
  for (auto* t : {&f.bwd.B, &f.bwd.C, &f.bwd.dB, &f.bwd.dC}) *t = tensor(bc.data(), SELSCAN_DTYPE_FLOAT32, {2, 1, 3, L});
  expect_error(selscan_bwd(&f.bwd, &f.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"x:", "seqlen > 2048"});
}

TEST(Validation, ExecContext) {
  Fixture f;
  f.exec.device_kind = 7;
  expect_error(selscan_fwd(&f.fwd, &f.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"device_kind", "got 7"});
  Fixture g;
  g.exec.num_threads = -3;
  expect_error(selscan_fwd(&g.fwd, &g.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"num_threads"});
  Fixture h;  // CUDA request: either not built, or (no GPU here) no device; with a GPU, a host pointer fails later
  h.exec.device_kind = SELSCAN_DEVICE_CUDA;
  int32_t count = -1;
  ASSERT_EQ(selscan_cuda_device_count(&count), SELSCAN_STATUS_SUCCESS);
  if (count == 0) {
    const selscan_status_t s = selscan_fwd(&h.fwd, &h.exec);
    EXPECT_TRUE(s == SELSCAN_STATUS_CUDA_NOT_BUILT || s == SELSCAN_STATUS_NO_DEVICE) << selscan_status_string(s);
    EXPECT_GT(std::strlen(selscan_last_error()), 10u);
    EXPECT_TRUE(h.fwd_outputs_untouched());
  }
}

TEST(Validation, CpuWorkspaceIsZero) {
  Fixture f;
  size_t bytes = 123;
  ASSERT_EQ(selscan_fwd_workspace_size(&f.fwd, &f.exec, &bytes), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(selscan_bwd_workspace_size(&f.bwd, &f.exec, &bytes), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(bytes, 0u);
}

TEST(Validation, ErrorsStayWithTheirThread) {
  std::string msg_a, msg_b;
  std::thread a([&] {
    Fixture f;
    f.fwd.u.dtype = SELSCAN_DTYPE_COMPLEX64;
    for (int i = 0; i < 200; ++i) (void)selscan_fwd(&f.fwd, &f.exec);
    msg_a = selscan_last_error();
  });
  std::thread b([&] {
    Fixture f;
    f.fwd.delta.sizes[0] = 5;
    for (int i = 0; i < 200; ++i) (void)selscan_fwd(&f.fwd, &f.exec);
    msg_b = selscan_last_error();
  });
  a.join();
  b.join();
  EXPECT_NE(msg_a.find("u:"), std::string::npos) << msg_a;
  EXPECT_NE(msg_b.find("delta"), std::string::npos) << msg_b;
}

TEST(Validation, StatusStringsAndVersion) {
  for (int s = 0; s < SELSCAN_STATUS_COUNT; ++s) {
    const std::string str = selscan_status_string(static_cast<selscan_status_t>(s));
    EXPECT_FALSE(str.empty());
    EXPECT_NE(str, "unknown status") << s;
  }
  EXPECT_STREQ(selscan_status_string(SELSCAN_STATUS_COUNT), "unknown status");
  EXPECT_STREQ(selscan_status_string(static_cast<selscan_status_t>(999)), "unknown status");
  EXPECT_EQ(selscan_version(), SELSCAN_VERSION);
  const std::string v = selscan_version_string();
  EXPECT_EQ(v, std::to_string(SELSCAN_VERSION_MAJOR) + "." + std::to_string(SELSCAN_VERSION_MINOR) + "." +
                   std::to_string(SELSCAN_VERSION_PATCH));
  EXPECT_EQ(v, SELSCAN_VERSION_STRING);
  const std::string info = selscan_build_info();
  EXPECT_NE(info.find("libselscan " + v), std::string::npos) << info;
  EXPECT_NE(info.find("CUDA"), std::string::npos) << info;
}

}  // namespace
