// The decode step (selscan_state_update) on CUDA against the float64 oracle: the CPU tests' matrix on device
// copies (16-byte aligned: the vector paths and, for one token, the lean kernel; one element off: the general
// kernel's scalar paths; and each with every decode kernel forced), Mamba-2.8b's width with a pool, Mamba-2's heads
// shape (also as the lean kernel and its small-grid form take it),
// serving's prefill-then-decode equivalence with the scan, CUDA-graph capture with the indices changed between
// replays (no host reads of device data), and a non-default stream.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/select.h"
#include "cuda_memory.h"
#include "gpu_gate.h"
#include "state_update.h"
#include "state_update_case.h"

namespace selscan_test {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

const DeviceMemory& device_copies() {
  static const DeviceMemory m = cuda_memory();
  return m;
}

void run_and_check(const StateUpdateSpec& spec, bool misalign) {
  const StateUpdateCase before = make_state_update_case(spec);
  StateUpdateCase c = before;
  ASSERT_EQ(run_state_update(c, cuda_exec(), &device_copies(), misalign), SELSCAN_STATUS_SUCCESS)
      << spec.str() << ": " << selscan_last_error();
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << spec.str();
  expect_state_update_ok(c, before);
}

// As run_and_check, with the decode kernel chosen by `force` instead of SELSCAN_DECODE_KERNEL (read once per
// process): the plan and the launch below the C ABI, on the validated call. Returns the kernel that ran.
int run_forced_and_check(const StateUpdateSpec& spec, bool misalign, selscan::cuda::DecodeForce force) {
  const StateUpdateCase before = make_state_update_case(spec);
  StateUpdateCase c = before;
  int kernel = -1;
  const StateUpdateCall call = [&](const selscan_state_update_args_t& a, const selscan_exec_t& ex) {
    selscan::StateUpdate p{};
    const selscan_status_t st = selscan::make_state_update(&a, &p);
    if (st != SELSCAN_STATUS_SUCCESS) return st;
    const selscan::StateUpdatePlan plan = selscan::cuda::plan_state_update(p, force);
    kernel = plan.kernel;
    return selscan::cuda::launch_state_update(p, plan, ex.stream);
  };
  EXPECT_EQ(run_state_update(c, cuda_exec(), &device_copies(), misalign, call), SELSCAN_STATUS_SUCCESS)
      << spec.str() << ": " << selscan_last_error();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << spec.str();
  expect_state_update_ok(c, before);
  return kernel;
}

// The plan `force` gives the case's call (host addresses: the device copies keep their alignment mod 16).
int planned_kernel(const StateUpdateSpec& spec, selscan::cuda::DecodeForce force) {
  StateUpdateCase c = make_state_update_case(spec);
  selscan_state_update_args_t a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); },
                                         c.idx_storage.data(), c.dst_storage.data());
  selscan::StateUpdate p{};
  EXPECT_EQ(selscan::make_state_update(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  return selscan::cuda::plan_state_update(p, force).kernel;
}

// Every decode kernel forced on one case, against the oracle: the lean kernel (which the small test grids would
// otherwise leave to kSmall), kSmall with 8 and with 4 states a lane, and the general kernel. Where the lean kernel
// serves the call, so must kSmall when forced: the test fails if the variant it names did not run.
void run_every_kernel(const StateUpdateSpec& spec, bool misalign) {
  using selscan::cuda::DecodeForce;
  constexpr int kLean = selscan::StateUpdatePlan::kLean, kSmall = selscan::StateUpdatePlan::kSmall;
  const int lean = run_forced_and_check(spec, misalign, DecodeForce::lean);
  const int small = run_forced_and_check(spec, misalign, DecodeForce::small);
  const int small4 = run_forced_and_check(spec, misalign, DecodeForce::small4);
  EXPECT_EQ(run_forced_and_check(spec, misalign, DecodeForce::general), selscan::StateUpdatePlan::kGeneral);
  if (lean == kLean) {
    EXPECT_EQ(small, kSmall) << spec.str();
    EXPECT_EQ(small4, kSmall) << spec.str();
  } else {
    EXPECT_EQ(small, lean) << spec.str();
    EXPECT_EQ(small4, lean) << spec.str();
  }
}

class GpuStateUpdate : public ::testing::TestWithParam<NamedStateUpdateSpec> {};

TEST_P(GpuStateUpdate, EveryKernelForcedMatchesTheOracle) {
  REQUIRE_GPU();
  run_every_kernel(GetParam().spec, false);  // one element off, every force gives the general kernel (Misaligned*)
}

TEST_P(GpuStateUpdate, MatchesTheOracle) {
  REQUIRE_GPU();
  run_and_check(GetParam().spec, false);
}

TEST_P(GpuStateUpdate, MisalignedMatchesTheOracle) {
  REQUIRE_GPU();
  run_and_check(GetParam().spec, true);
}

INSTANTIATE_TEST_SUITE_P(Matrix, GpuStateUpdate, ::testing::ValuesIn(state_update_matrix()),
                         [](const auto& info) { return info.param.name; });

TEST(GpuStateUpdateShapes, Mamba28bWidthWithAPool) {
  REQUIRE_GPU();
  StateUpdateSpec s;  // D = 5120, N = 16, 64 sequences in a pool of 96 slots, some padding
  s.batch = 64, s.nheads = 5120, s.dstate = 16, s.pool = 96, s.has_z = true, s.seed = 2800;
  for (int64_t b = 0; b < s.batch; ++b) s.indices.push_back(b % 9 == 4 ? -1 : (b * 37) % 96);
  run_and_check(s, false);
  s.itype = SELSCAN_DTYPE_BFLOAT16, s.state_dtype = SELSCAN_DTYPE_BFLOAT16, s.seed = 2801;
  run_and_check(s, false);
}

TEST(GpuStateUpdateShapes, Mamba2HeadsShape) {
  REQUIRE_GPU();
  StateUpdateSpec s;  // Mamba-2 2.7b: 80 heads of 64 channels, dstate 128, 1 group; A, dt, D, dt_bias broadcast
  s.heads = true, s.batch = 8, s.nheads = 80, s.headdim = 64, s.dstate = 128, s.groups = 1, s.groups_dim = true;
  s.itype = SELSCAN_DTYPE_BFLOAT16, s.broadcast = true, s.has_z = true, s.pool = 12, s.seed = 2700;
  run_and_check(s, false);
  s.tokens = 4, s.groups = 8, s.seed = 2701;  // speculative decoding with 8 groups
  run_and_check(s, false);
}

// Mamba-2's call as the lean kernel takes it (StateUpdatePlan.LeanWithAConstantOverN): A, dt, D and dt_bias broadcast
// over the head dim, one token, at dstate 128 (32 lanes a channel) and 16 (4), every state dtype, a pool with
// padding and an index outside it, in place and with destinations (one padding, one outside the pool).
TEST(GpuStateUpdateShapes, Mamba2LeanKernelWithAPool) {
  REQUIRE_GPU();
  constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;
  uint64_t seed = 3600;
  for (int64_t N : {128, 16})
    for (int32_t sd : {kBF16, kF32, kF16})
      for (bool dst : {false, true}) {
        StateUpdateSpec s;
        s.heads = true, s.batch = 12, s.nheads = 80, s.headdim = 64, s.dstate = N, s.groups = 1, s.groups_dim = true;
        s.state_dtype = sd, s.itype = sd == kF32 ? kBF16 : sd, s.broadcast = true, s.has_z = true, s.pool = 32;
        s.indices = {3, -1, 17, 30, 0, 9, -1, 32, 22, 5, 11, 27};
        if (dst) s.dst = {2, 4, 18, -1, 6, 9, 7, 8, 23, 12, 40, 28};
        s.seed = ++seed;
        run_and_check(s, false);
        run_every_kernel(s, false);
      }
}

// Mamba-2 2.7b's step at Bt 1 and 2 and Mamba-1 2.8b's at Bt 1 and 2 (the default plan: kSmall up to 2^20 states),
// every state dtype, bf16 inputs, with and without a pool: every kernel forced, and the default plan.
TEST(GpuStateUpdateShapes, SmallGridsEveryKernel) {
  REQUIRE_GPU();
  constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;
  uint64_t seed = 3700;
  for (bool mamba2 : {true, false})
    for (int32_t sd : {kF32, kBF16, kF16})
      for (int64_t batch : {1, 2}) {
        StateUpdateSpec s;
        if (mamba2) {
          s.heads = true, s.nheads = 80, s.headdim = 64, s.dstate = 128, s.groups = 1, s.groups_dim = true;
          s.broadcast = true;
        } else {
          s.nheads = 5120, s.dstate = 16;
        }
        s.batch = batch, s.state_dtype = sd, s.itype = sd == kF32 ? kBF16 : sd, s.has_z = true;
        if (batch == 2) s.pool = 5, s.indices = {3, 0};
        s.seed = ++seed;
        // Mamba-2 at Bt 2 is 1.3 M states, past kSmallGridStates: the default plan keeps it on the lean kernel.
        const int64_t states = s.batch * s.nheads * s.headdim * s.dstate;
        EXPECT_EQ(planned_kernel(s, selscan::cuda::DecodeForce::none),
                  states <= selscan::StateUpdatePlan::kSmallGridStates ? selscan::StateUpdatePlan::kSmall
                                                                      : selscan::StateUpdatePlan::kLean)
            << s.str();
        run_and_check(s, false);
        run_every_kernel(s, false);
      }
}

// The small-grid kernel's instances (one per state and input dtype: f16 or bf16 x, B, C and out, the state fp32 or
// x's) with each optional input absent or present, dt and z in fp32 beside 16-bit x on half the cases (a uniform
// runtime choice inside an instance), both forms, with and without a pool: kSmall must serve each case when forced,
// and every kernel forced matches the oracle.
TEST(GpuStateUpdateShapes, SmallKernelInputDtypesAndOptionalInputs) {
  REQUIRE_GPU();
  constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;
  uint64_t seed = 3800;
  for (int32_t it : {kF16, kBF16})
    for (int32_t sd : {kF32, it})
      for (int mask = 0; mask < 16; ++mask) {
        StateUpdateSpec s;
        s.heads = ((mask ^ (mask >> 3)) & 1) != 0, s.batch = 3, s.nheads = 6, s.headdim = 4, s.dstate = 16;
        s.itype = it, s.state_dtype = sd;
        s.has_D = mask & 1, s.has_z = mask & 2, s.has_bias = mask & 4, s.softplus = mask & 8;
        s.dt_dtype = s.z_dtype = ((mask ^ (mask >> 1)) & 1) ? kF32 : it;
        if (mask & 4) s.pool = 5;
        s.seed = ++seed;
        EXPECT_EQ(planned_kernel(s, selscan::cuda::DecodeForce::small), selscan::StateUpdatePlan::kSmall) << s.str();
        run_every_kernel(s, false);
      }
}

TEST(GpuStateUpdateEquivalence, PrefillThenDecodeEqualsOneScan) {
  REQUIRE_GPU();
  uint64_t seed = 1300;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16})
    for (int64_t per_call : {1, 3})
      for (int64_t G : {1, 2}) {
        PrefillDecodeSpec s;
        s.itype = it, s.tokens_per_call = per_call, s.groups = G, s.dim = 64, s.seed = ++seed;
        expect_prefill_then_decode_equals_scan(s, cuda_exec(), &device_copies());
      }
  PrefillDecodeSpec s;  // a prefill past the scan's 2048-token chunk, no optional inputs
  s.prefill = 2100, s.has_D = s.has_z = s.has_bias = s.softplus = false, s.seed = ++seed;
  expect_prefill_then_decode_equals_scan(s, cuda_exec(), &device_copies());
}

// A decode step captured once into a CUDA graph and replayed with new indices each time (written to device
// memory on the stream, as a serving engine does): the same results, bit for bit, as eager calls with those
// indices. A call that read the indices on the host would bake the capture-time slots into the graph.
TEST(GpuStateUpdateGraph, ReplaysFollowTheIndicesInDeviceMemory) {
  REQUIRE_GPU();
  StateUpdateSpec s;
  s.batch = 4, s.nheads = 256, s.dstate = 16, s.pool = 6, s.has_z = true, s.seed = 3000;
  s.indices = {0, 1, 2, 3};
  StateUpdateCase graph_case = make_state_update_case(s);
  StateUpdateCase eager_case = graph_case;
  const std::vector<std::vector<int32_t>> steps = {{0, 1, 2, 3}, {5, -1, 2, 4}, {-1, -1, -1, -1}, {3, 0, 5, 1}};

  struct Device {
    std::vector<std::pair<Tensor*, void*>> copies;
    int32_t* idx = nullptr;
    selscan_state_update_args_t args;
    explicit Device(StateUpdateCase& c) {
      for (Tensor* t : c.tensors()) {
        void* p = nullptr;
        EXPECT_EQ(cudaMalloc(&p, t->storage.size()), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(p, t->storage.data(), t->storage.size(), cudaMemcpyHostToDevice), cudaSuccess);
        copies.push_back({t, p});
      }
      EXPECT_EQ(cudaMalloc(&idx, c.spec.batch * sizeof(int32_t)), cudaSuccess);
      args = c.args(
          [&](Tensor& t) {
            for (auto& [host, dev] : copies)
              if (host == &t) return dev;
            return static_cast<void*>(nullptr);
          },
          idx);
    }
    void download() {
      for (auto& [t, p] : copies) (void)cudaMemcpy(t->storage.data(), p, t->storage.size(), cudaMemcpyDeviceToHost);
    }
    ~Device() {
      for (auto& [t, p] : copies) cudaFree(p);
      cudaFree(idx);
    }
  };
  Device g(graph_case), e(eager_case);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const selscan_exec_t ex = cuda_exec(stream);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const selscan_status_t captured = selscan_state_update(&g.args, &ex);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<unsigned char> previous_state = graph_case.state.storage;
  for (size_t k = 0; k < steps.size(); ++k) {
    const std::vector<int32_t>& idx = steps[k];
    const size_t bytes = idx.size() * sizeof(int32_t);
    CUDA_OK(cudaMemcpyAsync(g.idx, idx.data(), bytes, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaMemcpyAsync(e.idx, idx.data(), bytes, cudaMemcpyHostToDevice, stream));
    ASSERT_EQ(selscan_state_update(&e.args, &ex), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    CUDA_OK(cudaStreamSynchronize(stream));
    g.download();
    e.download();
    EXPECT_TRUE(graph_case.state.storage == eager_case.state.storage) << "step " << k << ": state differs";
    EXPECT_TRUE(graph_case.out.storage == eager_case.out.storage) << "step " << k << ": out differs";
    if (k == 2) {  // all padding: nothing updated, every out 0
      EXPECT_TRUE(graph_case.state.storage == previous_state) << "an all-padding replay changed the pool";
      for (double v : graph_case.out.values()) ASSERT_EQ(v, 0.0) << "an all-padding replay wrote a non-zero out";
    }
    previous_state = graph_case.state.storage;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuStateUpdateStreams, NonDefaultStreamAndBadDevice) {
  REQUIRE_GPU();
  StateUpdateSpec s;
  s.batch = 5, s.nheads = 96, s.pool = 9, s.tokens = 2, s.has_z = true, s.seed = 3100;
  const StateUpdateCase before = make_state_update_case(s);
  StateUpdateCase c = before;
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_EQ(run_state_update(c, cuda_exec(stream), &device_copies()), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  expect_state_update_ok(c, before);
  cudaStreamDestroy(stream);

  int32_t n = 0;
  ASSERT_EQ(selscan_cuda_device_count(&n), SELSCAN_STATUS_SUCCESS);
  StateUpdateCase d = before;
  selscan_exec_t bad = cuda_exec();
  bad.device_index = n;  // one past the last device
  selscan_state_update_args_t a =
      d.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); }, d.idx_storage.data());
  EXPECT_EQ(selscan_state_update(&a, &bad), SELSCAN_STATUS_NO_DEVICE);
  EXPECT_NE(std::string(selscan_last_error()).find("does not exist"), std::string::npos) << selscan_last_error();
}

}  // namespace
}  // namespace selscan_test
