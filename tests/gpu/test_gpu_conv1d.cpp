// The causal conv1d on CUDA (kernels/conv1d/) against the float64 oracle (tests/common/conv1d_case.h), through the
// public ABI on device copies of every tensor (guards included, checked after): the CPU suites' matrices
// (forward, backward with its second run compared byte for byte, the decode update, pool entries outside the
// pool), shapes that take the kernels' fast paths and tilings (vector IO, short rows sharing a block, rows over
// several blocks, channel tiles with a partial last one, the channel-last walk's step groups, packed sequences
// and seq_idx on those paths), larger deterministic backwards, a non-default stream, CUDA-graph capture of a
// forward, a backward and an update replayed twice, and (DISABLED_, like tests/gpu/test_gpu_limits.cpp's size
// tests) tensors past 2^31 elements.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "conv1d_case.h"
#include "cuda_memory.h"
#include "gpu_gate.h"
#include "support/dtype.h"

namespace selscan_test {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kBF16 = SELSCAN_DTYPE_BFLOAT16, kF16 = SELSCAN_DTYPE_FLOAT16;

const DeviceMemory& device_copies() {
  static const DeviceMemory m = cuda_memory();
  return m;
}

// ------------------------------------------------------------------------------------------ the shared matrices
class GpuConv1dMatrix : public ::testing::TestWithParam<NamedConv1dSpec> {};

TEST_P(GpuConv1dMatrix, ForwardAndBackwardMatchReference) {
  REQUIRE_GPU();
  check_conv1d(GetParam().spec, cuda_exec(), &device_copies());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Conv1d, GpuConv1dMatrix, ::testing::ValuesIn(conv1d_matrix()),
                         [](const ::testing::TestParamInfo<NamedConv1dSpec>& i) { return i.param.name; });

// Pool entries naming no slot: NaN out for those sequences, no slot touched (the case's checks expect it).
class GpuConv1dOutOfPool : public ::testing::TestWithParam<NamedConv1dSpec> {};

TEST_P(GpuConv1dOutOfPool, NanOutAndNoSlotTouched) {
  REQUIRE_GPU();
  const Conv1dCase before = make_conv1d_case(GetParam().spec);
  Conv1dCase c = before;
  ASSERT_EQ(run_conv1d_fwd(c, cuda_exec(), &device_copies()), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  expect_conv1d_fwd_ok(c, before);
}

INSTANTIATE_TEST_SUITE_P(Conv1d, GpuConv1dOutOfPool, ::testing::ValuesIn(conv1d_out_of_pool_specs()),
                         [](const ::testing::TestParamInfo<NamedConv1dSpec>& i) { return i.param.name; });

void check_update(const Conv1dUpdateSpec& spec, const selscan_exec_t& exec) {
  const Conv1dUpdateCase before = make_conv1d_update_case(spec);
  Conv1dUpdateCase c = before;
  ASSERT_EQ(run_conv1d_update(c, exec, &device_copies()), SELSCAN_STATUS_SUCCESS)
      << spec.str() << ": " << selscan_last_error();
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << spec.str();
  expect_conv1d_update_ok(c, before);
}

class GpuConv1dUpdateMatrix : public ::testing::TestWithParam<NamedConv1dUpdateSpec> {};

TEST_P(GpuConv1dUpdateMatrix, MatchesReference) {
  REQUIRE_GPU();
  check_update(GetParam().spec, cuda_exec());
}

INSTANTIATE_TEST_SUITE_P(Conv1d, GpuConv1dUpdateMatrix, ::testing::ValuesIn(conv1d_update_matrix()),
                         [](const ::testing::TestParamInfo<NamedConv1dUpdateSpec>& i) { return i.param.name; });

class GpuConv1dUpdateOutOfPool : public ::testing::TestWithParam<NamedConv1dUpdateSpec> {};

TEST_P(GpuConv1dUpdateOutOfPool, NanOutAndNoSlotTouched) {
  REQUIRE_GPU();
  check_update(GetParam().spec, cuda_exec());
}

INSTANTIATE_TEST_SUITE_P(Conv1d, GpuConv1dUpdateOutOfPool, ::testing::ValuesIn(conv1d_update_out_of_pool_specs()),
                         [](const ::testing::TestParamInfo<NamedConv1dUpdateSpec>& i) { return i.param.name; });

// ------------------------------------------------------------------------------------------ the kernels' paths
// The matrix's small shapes mostly take the element-IO paths; these take the vector paths (16-byte aligned device
// copies, rows of whole vectors, channel counts of whole vectors) and every tiling of src/cuda/select.cpp's plans:
//   channel-first rows of 16/32 threads (L 256), 64 threads (L 1000, 16-bit), several blocks a row (L 4100), with
//   the W-1 halo crossing lanes, warps and blocks;
//   channel-last tiles of 128 (forward) and 32 (backward) channels with a partial last one (D 520), 4-step groups
//   with remainders (L 250), many channels (D 1536) and channel-last rows across blocks in time; the H200 plan's
//   long channel-last walks (long_walks_*: 64 steps, the backward's in 4 time tiles of partials); channel-last
//   element IO (cl_odd*: D 13).
std::vector<NamedConv1dSpec> fast_path_specs() {
  std::vector<NamedConv1dSpec> m;
  uint64_t seed = 7000;
  auto add = [&](std::string name, Conv1dSpec s) {
    s.seed = ++seed;
    m.push_back({std::move(name), s});
  };
  struct Shape {
    const char* name;
    int64_t B, D, L;
    ConvLayout layout;
  };
  const Shape shapes[] = {{"cf_2x64x256", 2, 64, 256, ConvLayout::channel_first},
                          {"cf_1x16x1000", 1, 16, 1000, ConvLayout::channel_first},
                          {"cf_1x8x4100", 1, 8, 4100, ConvLayout::channel_first},
                          {"cl_2x64x256", 2, 64, 256, ConvLayout::channel_last},
                          {"cl_1x520x250", 1, 520, 250, ConvLayout::channel_last},
                          {"cl_1x1536x96", 1, 1536, 96, ConvLayout::channel_last}};
  int alt = 0;
  for (int32_t it : {kF32, kBF16, kF16})
    for (const Shape& sh : shapes)
      for (int64_t W : {2, 3, 4}) {
        if (it == kF16 && W != 4) continue;
        Conv1dSpec s;
        s.itype = it, s.wtype = alt % 2 ? it : kF32, s.width = W, s.layout = sh.layout;
        s.batch = sh.B, s.dim = sh.D, s.seqlen = sh.L, s.bias = alt % 3 != 1, s.silu = alt % 4 != 3;
        ++alt;
        add(std::string(dtype_name(it)) + "_" + sh.name + "_W" + std::to_string(W), s);
      }
  for (ConvLayout l : {ConvLayout::channel_first, ConvLayout::channel_last}) {
    const std::string ln = layout_name(l);
    Conv1dSpec s;  // initial and final states and their gradients on the vector paths
    s.layout = l, s.itype = kBF16, s.batch = 2, s.dim = 64, s.seqlen = 256, s.initial_states = s.final_states = true;
    s.dinitial_states = s.dfinal_states = true;
    add("states_" + ln, s);
    Conv1dSpec q;  // seq_idx segments and padding on the vector paths
    q.layout = l, q.itype = kBF16, q.batch = 2, q.dim = 64, q.seqlen = 512, q.seq_idx = true;
    add("seq_idx_" + ln, q);
    Conv1dSpec p;  // packed sequences over several blocks, empty and one-step ones among them
    p.layout = l, p.itype = kBF16, p.dim = 64, p.lens = {700, 0, 1500, 33, 1, 2100};
    p.initial_states = p.final_states = p.dinitial_states = p.dfinal_states = true;
    p.has_init = {1, 1, 0, 1, 1, 0};
    add("packed_states_" + ln, p);
    Conv1dSpec pool;  // the pool on the vector paths, padding entries and has_initial_state
    pool.layout = l, pool.itype = kBF16, pool.dim = 64, pool.lens = {300, 0, 1200, 7}, pool.slots = 6;
    pool.state_len = 5, pool.cache_indices = {4, 1, -1, 0}, pool.has_init = {1, 1, 1, 0};
    add("packed_pool_" + ln, pool);
  }
  // The channel-last walks a large call gets on 132 SMs (src/cuda/select.cpp): 64 steps, the backward's in 4 time
  // tiles of partials: the pipelined walks' many groups, with the states on their first and last steps.
  for (int32_t it : {kBF16, kF32}) {
    Conv1dSpec s;
    s.layout = ConvLayout::channel_last, s.itype = it, s.width = it == kF32 ? 3 : 4;
    s.batch = 8, s.dim = 1536, s.seqlen = 2048, s.initial_states = s.final_states = true;
    s.dinitial_states = s.dfinal_states = true;
    add(std::string("long_walks_") + dtype_name(it), s);
  }
  // Channel-last channels that no thread's vector divides (D 13): the element-IO walks (plain, seq_idx, packed).
  for (int64_t W : {2, 4}) {
    Conv1dSpec s;
    s.layout = ConvLayout::channel_last, s.itype = W == 2 ? kF32 : kBF16, s.width = W, s.batch = 3, s.dim = 13;
    s.seqlen = 300, s.initial_states = s.final_states = s.dinitial_states = s.dfinal_states = true;
    add("cl_odd_W" + std::to_string(W), s);
  }
  Conv1dSpec q;
  q.layout = ConvLayout::channel_last, q.itype = kBF16, q.batch = 2, q.dim = 13, q.seqlen = 300, q.seq_idx = true;
  add("seq_idx_cl_odd", q);
  Conv1dSpec pk;
  pk.layout = ConvLayout::channel_last, pk.itype = kF32, pk.dim = 13, pk.lens = {100, 0, 250, 3};
  pk.initial_states = pk.final_states = pk.dinitial_states = pk.dfinal_states = true;
  add("packed_cl_odd", pk);
  return m;
}

class GpuConv1dFastPaths : public ::testing::TestWithParam<NamedConv1dSpec> {};

TEST_P(GpuConv1dFastPaths, ForwardAndBackwardMatchReference) {
  REQUIRE_GPU();
  check_conv1d(GetParam().spec, cuda_exec(), &device_copies());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Conv1d, GpuConv1dFastPaths, ::testing::ValuesIn(fast_path_specs()),
                         [](const ::testing::TestParamInfo<NamedConv1dSpec>& i) { return i.param.name; });

// The decode update at serving widths: Mamba-2.8b's channels, a padded batch, both state dtypes, the circular
// buffer.
TEST(GpuConv1dUpdateShapes, ServingWidths) {
  REQUIRE_GPU();
  Conv1dUpdateSpec s;
  s.batch = 64, s.dim = 5120, s.state_len = 3, s.itype = kBF16, s.state_dtype = kBF16, s.slots = 80, s.seed = 7300;
  for (int64_t b = 0; b < s.batch; ++b) s.indices.push_back(b % 11 == 3 ? -1 : (b * 37) % 80);
  check_update(s, cuda_exec());
  s.state_dtype = kF32, s.tokens = 4, s.state_len = 6, s.seed = 7301;
  for (int64_t b = 0; b < s.batch; ++b) s.cache_seqlens.push_back(b * 5);
  check_update(s, cuda_exec());
}

// ------------------------------------------------------------------------------------------ reproducibility
// Backwards of many blocks (hundreds of partial sums per channel), deterministic: two runs give the same bytes and
// match the oracle (check_conv1d compares a second run byte for byte).
TEST(GpuConv1dDeterministic, LargeBackwardsAreBitwiseReproducible) {
  REQUIRE_GPU();
  for (ConvLayout l : {ConvLayout::channel_first, ConvLayout::channel_last}) {
    Conv1dSpec s;
    s.layout = l, s.itype = kBF16, s.batch = 4, s.dim = 256, s.seqlen = 4096, s.deterministic = true, s.seed = 7400;
    check_conv1d(s, cuda_exec(), &device_copies());
    s.dwtype = kBF16, s.wtype = kBF16, s.lens = {3000, 9000, 1, 4000}, s.seed = 7401;
    check_conv1d(s, cuda_exec(), &device_copies());
  }
}

// ------------------------------------------------------------------------------------------ streams and graphs
TEST(GpuConv1dStreams, NonDefaultStream) {
  REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<NamedConv1dSpec> specs = fast_path_specs();
  for (size_t i = 0; i < specs.size(); i += 5) check_conv1d(specs[i].spec, cuda_exec(stream), &device_copies());
  Conv1dUpdateSpec u;
  u.batch = 8, u.dim = 256, u.tokens = 2, u.slots = 10, u.indices = {9, -1, 0, 3, 4, 5, 6, 7}, u.seed = 7500;
  check_update(u, cuda_exec(stream));
  CUDA_OK(cudaStreamDestroy(stream));
}

// Device copies of a set of host tensors that outlive one call (graph capture needs fixed addresses).
struct DeviceCopies {
  std::vector<std::pair<Tensor*, void*>> copies;
  explicit DeviceCopies(const std::vector<Tensor*>& ts) {
    for (Tensor* t : ts) {
      if (!t->present()) continue;
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, t->storage.size()), cudaSuccess);
      copies.push_back({t, p});
    }
    upload();
  }
  void upload() {
    for (auto& [t, p] : copies)
      EXPECT_EQ(cudaMemcpy(p, t->storage.data(), t->storage.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void download() {
    for (auto& [t, p] : copies)
      EXPECT_EQ(cudaMemcpy(t->storage.data(), p, t->storage.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  Case::PtrMap map() const {
    return [this](Tensor& t) -> void* {
      for (const auto& [host, dev] : copies)
        if (host == &t) return dev;
      return nullptr;
    };
  }
  ~DeviceCopies() {
    for (auto& [t, p] : copies) cudaFree(p);
  }
};

// A forward, a backward and a decode update captured into one CUDA graph on a non-default stream, replayed twice
// (the update's state restored in between): every output byte for byte as the eager calls give.
TEST(GpuConv1dGraph, ForwardBackwardUpdateReplayAsEager) {
  REQUIRE_GPU();
  Conv1dSpec s;
  s.itype = kBF16, s.layout = ConvLayout::channel_last, s.batch = 2, s.dim = 128, s.seqlen = 300, s.seed = 7600;
  s.initial_states = s.final_states = s.dinitial_states = s.dfinal_states = true;
  Conv1dUpdateSpec us;
  us.batch = 4, us.dim = 128, us.tokens = 1, us.itype = kBF16, us.slots = 6, us.indices = {5, -1, 2, 0};
  us.seed = 7601;

  struct Run {
    static Conv1dCase poisoned(Conv1dCase c) {
      poison({&c.out, &c.fin, &c.dx, &c.dweight, &c.dbias, &c.dinit});
      return c;
    }
    static Conv1dUpdateCase poisoned(Conv1dUpdateCase u) {
      poison({&u.out});
      return u;
    }
    Conv1dCase c;
    Conv1dUpdateCase u;
    DeviceCopies conv, upd;
    void* ws = nullptr;
    size_t ws_bytes = 0;
    selscan_conv1d_fwd_args_t fa;
    selscan_conv1d_bwd_args_t ba;
    selscan_conv1d_update_args_t ua;
    Run(const Conv1dCase& c0, const Conv1dUpdateCase& u0)
        : c(poisoned(c0)), u(poisoned(u0)), conv(c.all()), upd(u.all()) {
      fa = c.fwd_args(conv.map());
      ba = c.bwd_args(conv.map());
      ua = u.args(upd.map());
      const selscan_exec_t ex = cuda_exec();
      EXPECT_EQ(selscan_conv1d_bwd_workspace_size(&ba, &ex, &ws_bytes), SELSCAN_STATUS_SUCCESS)
          << selscan_last_error();
      if (ws_bytes > 0) EXPECT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
    }
    selscan_status_t enqueue(cudaStream_t stream) {
      selscan_exec_t ex = cuda_exec(stream);
      if (selscan_status_t st = selscan_conv1d_fwd(&fa, &ex); st != SELSCAN_STATUS_SUCCESS) return st;
      ex.workspace = ws, ex.workspace_bytes = ws_bytes;
      if (selscan_status_t st = selscan_conv1d_bwd(&ba, &ex); st != SELSCAN_STATUS_SUCCESS) return st;
      ex.workspace = nullptr, ex.workspace_bytes = 0;
      return selscan_conv1d_update(&ua, &ex);
    }
    ~Run() { cudaFree(ws); }
  };
  const Conv1dCase c0 = make_conv1d_case(s);
  const Conv1dUpdateCase u0 = make_conv1d_update_case(us);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  Run eager(c0, u0);
  ASSERT_EQ(eager.enqueue(stream), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  eager.conv.download(), eager.upd.download();
  expect_conv1d_update_ok(eager.u, u0);

  Run graph(c0, u0);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const selscan_status_t captured = graph.enqueue(stream);
  CUDA_OK(cudaStreamEndCapture(stream, &g));
  ASSERT_EQ(captured, SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  for (int replay = 0; replay < 2; ++replay) {
    if (replay > 0) {  // the update's state back to its initial contents (the download replaced the host copy)
      graph.u.state.storage = u0.state.storage;
      graph.upd.upload();
    }
    CUDA_OK(cudaGraphLaunch(ge, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    graph.conv.download(), graph.upd.download();
    const std::pair<const Tensor*, const Tensor*> pairs[] = {
        {&graph.c.out, &eager.c.out},         {&graph.c.fin, &eager.c.fin},     {&graph.c.dx, &eager.c.dx},
        {&graph.c.dweight, &eager.c.dweight}, {&graph.c.dbias, &eager.c.dbias}, {&graph.c.dinit, &eager.c.dinit}};
    for (const auto& [got, want] : pairs) EXPECT_TRUE(got->same_bytes(*want)) << "replay " << replay;
    EXPECT_TRUE(graph.u.out.same_bytes(eager.u.out)) << "replay " << replay;
    EXPECT_TRUE(graph.u.state.same_bytes(eager.u.state)) << "replay " << replay;
  }
  CUDA_OK(cudaGraphExecDestroy(ge));
  CUDA_OK(cudaGraphDestroy(g));
  CUDA_OK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------------------------------ past 2^31 elements
// One (1, D, L) bf16 tensor of more than 2^31 elements (channel-first: through the time offset of a row past 2^30
// and the channel offset; channel-last: through the time offset), forward and backward. The inputs repeat a
// prime-length pattern over the flat storage (doubled on the device), every output is poisoned (NaN bytes) first;
// afterwards every out and dx element must be finite, sampled ones (both ends of every channel, around 2^31, and
// random ones) within tolerance of a float64 evaluation, and dweight/dbias within 1e-2 of the sum of their terms'
// magnitudes (computed on the host over every step).
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

uint16_t bf16_bits(double v) { return selscan_support::float_to_bf16(static_cast<float>(v)); }
double bf16_val(uint16_t b) { return static_cast<double>(selscan_support::bf16_to_float(b)); }

void big_case(int64_t D, int64_t L, bool channel_last) {
  const int64_t n = D * L, W = 4, H = W - 1;
  ASSERT_GT(n, int64_t{1} << 31);
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  const double need = 4.0 * static_cast<double>(n) * 2 + 1.0 * kGiB;
  if (static_cast<double>(free_b) < need) GTEST_SKIP() << "needs " << need / kGiB << " GiB of device memory";

  // Patterns of prime lengths over the flat storage: element i is pattern[i % P].
  const int64_t P = 10007, Q = 10009;
  std::vector<uint16_t> px(static_cast<size_t>(P)), pd(static_cast<size_t>(Q));
  for (int64_t i = 0; i < P; ++i) px[static_cast<size_t>(i)] = bf16_bits(std::sin(0.37 * static_cast<double>(i)));
  for (int64_t i = 0; i < Q; ++i) pd[static_cast<size_t>(i)] = bf16_bits(std::cos(0.11 * static_cast<double>(i)));
  std::vector<float> weight(static_cast<size_t>(D * W)), bias(static_cast<size_t>(D));
  for (int64_t i = 0; i < D * W; ++i) weight[static_cast<size_t>(i)] = static_cast<float>(0.3 * std::sin(1.3 * i));
  for (int64_t d = 0; d < D; ++d) bias[static_cast<size_t>(d)] = static_cast<float>(0.1 * std::cos(0.7 * d));

  // The pattern, then doubling copies (the filled prefix stays a whole number of periods), then the rest.
  auto fill = [&](uint16_t* dst, const std::vector<uint16_t>& pat) {
    const int64_t per = static_cast<int64_t>(pat.size());
    EXPECT_EQ(cudaMemcpy(dst, pat.data(), per * 2, cudaMemcpyHostToDevice), cudaSuccess);
    int64_t have = per;
    for (; 2 * have <= n; have *= 2)
      EXPECT_EQ(cudaMemcpy(dst + have, dst, have * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
    if (have < n) EXPECT_EQ(cudaMemcpy(dst + have, dst, (n - have) * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
  };
  uint16_t *x = nullptr, *out = nullptr, *dout = nullptr, *dx = nullptr;
  float *w = nullptr, *b = nullptr, *dw = nullptr, *db = nullptr;
  CUDA_OK(cudaMalloc(&x, n * 2));
  CUDA_OK(cudaMalloc(&out, n * 2));
  CUDA_OK(cudaMalloc(&dout, n * 2));
  CUDA_OK(cudaMalloc(&dx, n * 2));
  CUDA_OK(cudaMalloc(&w, D * W * 4));
  CUDA_OK(cudaMalloc(&b, D * 4));
  CUDA_OK(cudaMalloc(&dw, D * W * 4));
  CUDA_OK(cudaMalloc(&db, D * 4));
  fill(x, px);
  fill(dout, pd);
  CUDA_OK(cudaMemcpy(w, weight.data(), D * W * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(b, bias.data(), D * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(out, 0xff, n * 2));
  CUDA_OK(cudaMemset(dx, 0xff, n * 2));
  CUDA_OK(cudaMemset(dw, 0xff, D * W * 4));
  CUDA_OK(cudaMemset(db, 0xff, D * 4));

  // (1, D, L): channel-first strides (D L, L, 1), channel-last (D L, 1, D).
  const int64_t s1 = channel_last ? 1 : L, s2 = channel_last ? D : 1;
  auto big = [&](void* p) {
    selscan_tensor_t t = SELSCAN_TENSOR_INIT;
    t.data = p, t.dtype = SELSCAN_DTYPE_BFLOAT16, t.ndim = 3;
    t.sizes[0] = 1, t.sizes[1] = D, t.sizes[2] = L;
    t.strides[0] = n, t.strides[1] = s1, t.strides[2] = s2;
    return t;
  };
  auto vec = [&](void* p, int64_t a, int64_t c) {
    selscan_tensor_t t = SELSCAN_TENSOR_INIT;
    t.data = p, t.dtype = SELSCAN_DTYPE_FLOAT32, t.ndim = c > 0 ? 2 : 1;
    t.sizes[0] = a, t.strides[0] = c > 0 ? c : 1;
    if (c > 0) t.sizes[1] = c, t.strides[1] = 1;
    return t;
  };
  selscan_conv1d_fwd_args_t fa = SELSCAN_CONV1D_FWD_ARGS_INIT;
  fa.x = big(x), fa.weight = vec(w, D, W), fa.bias = vec(b, D, 0), fa.out = big(out);
  fa.activation = SELSCAN_ACTIVATION_SILU;
  selscan_exec_t ex = cuda_exec();
  ASSERT_EQ(selscan_conv1d_fwd(&fa, &ex), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  selscan_conv1d_bwd_args_t ba = SELSCAN_CONV1D_BWD_ARGS_INIT;
  ba.x = fa.x, ba.weight = fa.weight, ba.bias = fa.bias, ba.activation = fa.activation, ba.deterministic = 1;
  ba.dout = big(dout), ba.dx = big(dx), ba.dweight = vec(dw, D, W), ba.dbias = vec(db, D, 0);
  size_t ws_bytes = 0;
  ASSERT_EQ(selscan_conv1d_bwd_workspace_size(&ba, &ex, &ws_bytes), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  void* ws = nullptr;
  if (ws_bytes > 0) CUDA_OK(cudaMalloc(&ws, ws_bytes));
  ex.workspace = ws, ex.workspace_bytes = ws_bytes;
  ASSERT_EQ(selscan_conv1d_bwd(&ba, &ex), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> hout(static_cast<size_t>(n)), hdx(static_cast<size_t>(n));
  std::vector<float> hdw(static_cast<size_t>(D * W)), hdb(static_cast<size_t>(D));
  CUDA_OK(cudaMemcpy(hout.data(), out, n * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hdx.data(), dx, n * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hdw.data(), dw, D * W * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hdb.data(), db, D * 4, cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(x), static_cast<void*>(out), static_cast<void*>(dout), static_cast<void*>(dx),
                  static_cast<void*>(w), static_cast<void*>(b), static_cast<void*>(dw), static_cast<void*>(db), ws})
    cudaFree(p);

  // The float64 model: element (d, t) of a tensor sits at flat index d s1 + t s2.
  auto xv = [&](int64_t d, int64_t t) {
    return t < 0 ? 0.0 : bf16_val(px[static_cast<size_t>((d * s1 + t * s2) % P)]);
  };
  auto dv = [&](int64_t d, int64_t t) { return bf16_val(pd[static_cast<size_t>((d * s1 + t * s2) % Q)]); };
  auto y = [&](int64_t d, int64_t t) {
    double a = bias[static_cast<size_t>(d)];
    for (int64_t k = 0; k < W; ++k) a += weight[static_cast<size_t>(d * W + k)] * xv(d, t - H + k);
    return a;
  };
  auto g = [&](int64_t d, int64_t t) {
    if (t >= L) return 0.0;
    const double v = y(d, t), s = 1.0 / (1.0 + std::exp(-v));
    return dv(d, t) * s * (1.0 + v * (1.0 - s));
  };
  int64_t nonfinite = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i)
    nonfinite += !std::isfinite(bf16_val(hout[i])) + !std::isfinite(bf16_val(hdx[i]));
  EXPECT_EQ(nonfinite, 0) << "out/dx elements left unwritten or not finite";
  std::vector<std::pair<int64_t, int64_t>> samples;
  for (int64_t d = 0; d < D; d += (D > 64 ? D / 61 : 1))
    for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{2}, L / 2, L - 2, L - 1}) samples.push_back({d, t});
  for (int64_t f = (int64_t{1} << 31) - 3; f <= (int64_t{1} << 31) + 3; ++f)  // around flat index 2^31
    samples.push_back({channel_last ? f % D : f / L, channel_last ? f / D : f % L});
  uint64_t r = 12345;
  for (int i = 0; i < 2000; ++i) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    samples.push_back({static_cast<int64_t>((r >> 33) % static_cast<uint64_t>(D)),
                       static_cast<int64_t>((r >> 7) % static_cast<uint64_t>(L))});
  }
  int64_t bad = 0;
  for (const auto& [d, t] : samples) {
    const size_t at = static_cast<size_t>(d * s1 + t * s2);
    const double v = y(d, t), want_out = v / (1.0 + std::exp(-v));
    double want_dx = 0.0, mag = 0.0;
    for (int64_t k = 0; k < W; ++k) {
      const double term = weight[static_cast<size_t>(d * W + k)] * g(d, t + H - k);
      want_dx += term, mag += std::fabs(term);
    }
    const double got_out = bf16_val(hout[at]), got_dx = bf16_val(hdx[at]);
    if (std::fabs(got_out - want_out) > 2e-2 * (1.0 + std::fabs(want_out))) ++bad;
    if (std::fabs(got_dx - want_dx) > 2e-2 * (1.0 + mag)) ++bad;
    if (bad > 0 && bad < 5)
      ADD_FAILURE() << "d=" << d << " t=" << t << " out " << got_out << " want " << want_out << ", dx " << got_dx
                    << " want " << want_dx;
  }
  EXPECT_EQ(bad, 0) << "of " << samples.size() << " sampled (channel, step) pairs";
  for (int64_t d = 0; d < D; ++d) {
    double sum[5] = {0, 0, 0, 0, 0}, mag[5] = {0, 0, 0, 0, 0};
    for (int64_t t = 0; t < L; ++t) {
      const double gt = g(d, t);
      for (int64_t k = 0; k < W; ++k) {
        const double term = gt * xv(d, t - H + k);
        sum[k] += term, mag[k] += std::fabs(term);
      }
      sum[W] += gt, mag[W] += std::fabs(gt);
    }
    for (int64_t k = 0; k <= W; ++k) {
      const double got = k < W ? hdw[static_cast<size_t>(d * W + k)] : hdb[static_cast<size_t>(d)];
      EXPECT_LE(std::fabs(got - sum[k]), 1e-2 * mag[k] + 1e-6)
          << "channel " << d << (k < W ? " dweight " : " dbias ") << k << ": " << got << " vs " << sum[k];
    }
  }
}

TEST(GpuConv1dLimits, DISABLED_ChannelFirstBeyond2e31Elements) {
  REQUIRE_GPU();
  big_case(2, (int64_t{1} << 30) + 37, false);
}

TEST(GpuConv1dLimits, DISABLED_ChannelLastBeyond2e31Elements) {
  REQUIRE_GPU();
  big_case(1024, (int64_t{1} << 21) + 5, true);
}

}  // namespace
}  // namespace selscan_test
