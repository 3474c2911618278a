// Concurrency and graph capture on the GPU: forward + deterministic backward run from several host threads on
// separate streams, and captured into one CUDA graph, give results bitwise identical to a serial run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "gpu_gate.h"
#include "selscan/selscan.h"

namespace {

constexpr int64_t Bt = 2, D = 64, L = 2500, N = 16;  // two chunks, so x is consumed by the backward


selscan_tensor_t desc(void* p, std::vector<int64_t> sizes) {
  return selscan_test::contiguous_desc(p, SELSCAN_DTYPE_FLOAT32, sizes);
}

// Shared read-only inputs on the device.
struct Inputs {
  float *u, *delta, *A, *B, *C, *Dw, *z, *bias, *dout;
  explicit Inputs(uint32_t seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    auto up = [&](float** p, int64_t n, auto gen) {
      std::vector<float> h(n);
      for (auto& v : h) v = gen();
      EXPECT_EQ(cudaMalloc(p, n * sizeof(float)), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(*p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    };
    up(&u, Bt * D * L, [&] { return nd(g); });
    up(&delta, Bt * D * L, [&] { return 0.5f * ud(g); });
    up(&A, D * N, [&] { return -0.5f * ud(g) - 0.1f; });
    up(&B, Bt * N * L, [&] { return nd(g); });
    up(&C, Bt * N * L, [&] { return nd(g); });
    up(&Dw, D, [&] { return nd(g); });
    up(&z, Bt * D * L, [&] { return nd(g); });
    up(&bias, D, [&] { return 0.5f * ud(g); });
    up(&dout, Bt * D * L, [&] { return nd(g); });
  }
  ~Inputs() {
    for (float* p : {u, delta, A, B, C, Dw, z, bias, dout}) cudaFree(p);
  }
};

// One call's outputs and workspace (one set per concurrent caller).
struct Outputs {
  std::vector<std::pair<float**, int64_t>> list;
  float *out, *out_z, *x, *du, *ddelta, *dA, *dB, *dC, *dD, *dz, *dbias;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  selscan_fwd_args_t fa{};
  selscan_bwd_args_t ba{};

  Outputs(const Inputs& in) {
    const int64_t nc = (L + 2047) / 2048;
    list = {{&out, Bt * D * L}, {&out_z, Bt * D * L}, {&x, Bt * D * nc * 2 * N}, {&du, Bt * D * L},
            {&ddelta, Bt * D * L}, {&dA, D * N}, {&dB, Bt * N * L}, {&dC, Bt * N * L}, {&dD, D},
            {&dz, Bt * D * L}, {&dbias, D}};
    for (auto& [p, n] : list) {
      EXPECT_EQ(cudaMalloc(p, n * sizeof(float)), cudaSuccess);
      EXPECT_EQ(cudaMemset(*p, 0xFF, n * sizeof(float)), cudaSuccess);  // NaN poison
    }
    fa.struct_size = sizeof(fa);
    fa.u = desc(in.u, {Bt, D, L});
    fa.delta = desc(in.delta, {Bt, D, L});
    fa.A = desc(in.A, {D, N});
    fa.B = desc(in.B, {Bt, 1, N, L});
    fa.C = desc(in.C, {Bt, 1, N, L});
    fa.D = desc(in.Dw, {D});
    fa.z = desc(in.z, {Bt, D, L});
    fa.delta_bias = desc(in.bias, {D});
    fa.delta_softplus = 1;
    fa.out = desc(out, {Bt, D, L});
    fa.out_z = desc(out_z, {Bt, D, L});
    fa.x = desc(x, {Bt, D, nc, 2 * N});
    ba = selscan_test::bwd_args_with_inputs_of(fa, true);
    ba.dout = desc(in.dout, {Bt, D, L});
    ba.x = fa.x;
    ba.out = fa.out;
    ba.du = desc(du, {Bt, D, L});
    ba.ddelta = desc(ddelta, {Bt, D, L});
    ba.dA = desc(dA, {D, N});
    ba.dB = desc(dB, {Bt, 1, N, L});
    ba.dC = desc(dC, {Bt, 1, N, L});
    ba.dD = desc(dD, {D});
    ba.dz = desc(dz, {Bt, D, L});
    ba.ddelta_bias = desc(dbias, {D});
    selscan_exec_t e = exec(nullptr);
    size_t f = 0, b = 0;
    EXPECT_EQ(selscan_fwd_workspace_size(&fa, &e, &f), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    EXPECT_EQ(selscan_bwd_workspace_size(&ba, &e, &b), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    ws_bytes = f > b ? f : b;
    if (ws_bytes) {
      EXPECT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
    }
  }
  ~Outputs() {
    for (auto& [p, n] : list) cudaFree(*p);
    if (ws) cudaFree(ws);
  }
  selscan_exec_t exec(cudaStream_t s) const {
    selscan_exec_t e = SELSCAN_EXEC_INIT;
    e.device_kind = SELSCAN_DEVICE_CUDA;
    e.device_index = 0;
    e.stream = s;
    e.workspace = ws;
    e.workspace_bytes = ws_bytes;
    return e;
  }
  selscan_status_t run(cudaStream_t s) {
    const selscan_exec_t e = exec(s);
    selscan_status_t st = selscan_fwd(&fa, &e);
    if (st != SELSCAN_STATUS_SUCCESS) return st;
    return selscan_bwd(&ba, &e);
  }
  std::vector<std::vector<unsigned char>> download() const {
    std::vector<std::vector<unsigned char>> r;
    for (auto& [p, n] : list) {
      r.emplace_back(n * sizeof(float));
      EXPECT_EQ(cudaMemcpy(r.back().data(), *p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return r;
  }
};

void expect_same(const std::vector<std::vector<unsigned char>>& a, const std::vector<std::vector<unsigned char>>& b,
                 const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size()), 0) << what << ": output " << i;
  // Every output was written (no NaN poison left: the inputs are finite).
  for (const auto& v : a) {
    const float* f = reinterpret_cast<const float*>(v.data());
    for (size_t k = 0; k < v.size() / sizeof(float); ++k) ASSERT_FALSE(std::isnan(f[k])) << what << ": unwritten element";
  }
}

TEST(GpuStreams, ConcurrentThreadsAndStreamsMatchSerial) {
  REQUIRE_GPU();
  Inputs in(42);
  Outputs serial(in);
  ASSERT_EQ(serial.run(nullptr), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto want = serial.download();

  constexpr int kThreads = 4, kRepeats = 3;
  std::vector<Outputs*> outs;
  for (int i = 0; i < kThreads; ++i) outs.push_back(new Outputs(in));
  std::vector<selscan_status_t> status(kThreads, SELSCAN_STATUS_SUCCESS);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      cudaStream_t s;
      cudaSetDevice(0);
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      for (int r = 0; r < kRepeats && status[i] == SELSCAN_STATUS_SUCCESS; ++r) status[i] = outs[i]->run(s);
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_EQ(status[i], SELSCAN_STATUS_SUCCESS);
    expect_same(outs[i]->download(), want, "concurrent");
    delete outs[i];
  }
}

TEST(GpuStreams, ForwardAndBackwardCapturedInOneGraph) {
  REQUIRE_GPU();
  Inputs in(7);
  Outputs serial(in);
  ASSERT_EQ(serial.run(nullptr), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto want = serial.download();

  Outputs captured(in);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  const selscan_status_t st = captured.run(s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(st, SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  expect_same(captured.download(), want, "graph replay");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
