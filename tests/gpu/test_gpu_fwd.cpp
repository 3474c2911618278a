// GPU forward (selscan_fwd on SELSCAN_DEVICE_CUDA) through the public ABI against the float64 recurrence
// (support/reference.h), the library's CPU path on the same inputs, and upstream's golden vectors.
// Every output buffer (guards and gaps included) is poisoned with NaN bytes before each run and checked
// afterwards: every element written, every other byte untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "case.h"
#include "compare.h"
#include "golden.h"
#include "gpu_gate.h"

namespace selscan_test {
namespace {


// Device copies of a Case's tensors. Each tensor's whole host storage (guards included) is copied to a fresh
// cudaMalloc base, or with `misalign` one element past it: element-aligned (as the ABI requires) but with
// no row 16-byte aligned, which must take the kernels' scalar IO path.
class DeviceCopy {
 public:
  DeviceCopy(Case& c, bool misalign) : c_(c), misalign_(misalign) {
    for (Tensor* t : all()) {
      if (!t->present()) continue;
      void* p = nullptr;
      ok_ = ok_ && cudaMalloc(&p, t->storage.size() + 16) == cudaSuccess;
      if (!ok_) return;
      base_[t] = static_cast<unsigned char*>(p);
    }
    upload();
  }
  ~DeviceCopy() {
    for (auto& kv : base_) cudaFree(kv.second);
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  bool ok() const { return ok_; }
  void* ptr(Tensor& t) { return t.present() ? base_.at(&t) + shift(t) : nullptr; }
  // Host -> device for every tensor (outputs carry their poison).
  void upload() {
    for (auto& kv : base_)
      ok_ = ok_ && cudaMemcpy(kv.second + shift(*kv.first), kv.first->storage.data(), kv.first->storage.size(),
                              cudaMemcpyHostToDevice) == cudaSuccess;
  }
  // Device -> host for the forward outputs.
  void download_outputs() {
    for (Tensor* t : c_.fwd_outputs())
      ok_ = ok_ && cudaMemcpy(t->storage.data(), base_.at(t) + shift(*t), t->storage.size(),
                              cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  selscan_fwd_args_t args() {
    return c_.fwd_args([this](Tensor& t) { return ptr(t); });
  }

 private:
  std::vector<Tensor*> all() {
    std::vector<Tensor*> v = c_.inputs();
    for (Tensor* t : c_.fwd_outputs()) v.push_back(t);
    return v;
  }
  size_t shift(const Tensor& t) const { return misalign_ ? static_cast<size_t>(t.esize()) : 0; }
  Case& c_;
  bool misalign_;
  bool ok_ = true;
  std::map<Tensor*, unsigned char*> base_;
};

// Poisons the outputs, runs selscan_fwd on the GPU and brings the outputs back into c's host storage.
selscan_status_t run_gpu(Case& c, DeviceCopy& dev) {
  poison(c.fwd_outputs());
  dev.upload();
  const selscan_fwd_args_t a = dev.args();
  selscan_exec_t e = cuda_exec();
  size_t ws = 0;
  selscan_status_t s = selscan_fwd_workspace_size(&a, &e, &ws);
  if (s != SELSCAN_STATUS_SUCCESS) return s;
  void* wsp = nullptr;
  if (ws > 0 && cudaMalloc(&wsp, ws) != cudaSuccess) return SELSCAN_STATUS_CUDA_ERROR;
  e.workspace = wsp;
  e.workspace_bytes = ws;
  s = selscan_fwd(&a, &e);
  if (cudaDeviceSynchronize() != cudaSuccess) s = SELSCAN_STATUS_CUDA_ERROR;
  if (wsp) cudaFree(wsp);
  dev.download_outputs();
  return s;
}

void expect_all_written(Case& c) {
  for (auto& [name, t] : c.named_fwd_outputs()) {
    const std::string err = t->check_written(kPoison, kPoison);
    EXPECT_TRUE(err.empty()) << name << ": " << err;
  }
}

// out / out_z: upstream's tolerance, or k u cond where larger (tests/common/compare.h, docs/numerics.md), so
// ill-conditioned elements (slowly decaying states whose terms cancel) are held to what fp32 can deliver.
void expect_matches_reference(Case& c, const RefFwd& f) {
  const CaseSpec& s = c.spec;
  const Tolerances tol = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  const std::vector<double> ay = cond_bound(f.cond_y);
  EXPECT_TRUE(allclose("out vs float64", c.out.values(), f.y, tol.out, &ay));
  if (s.has_z) {
    const std::vector<double> az = cond_bound(f.cond_out_z);
    EXPECT_TRUE(allclose("out_z vs float64", c.out_z.values(), f.out_z, tol.out, &az));
  }
  if (s.with_last_state) {
    EXPECT_TRUE(allclose("last_state vs float64", c.last_state.values(), flatten(f.last_state, s.complex),
                         tol.last_state));
  }
  if (s.with_x) {
    EXPECT_TRUE(allclose("x vs float64", c.x.values(), ref_x_values(f, c), tol.x));
  }
}
void expect_matches_reference(Case& c) { expect_matches_reference(c, ref_forward(ref_problem(c), true)); }

// GPU outputs vs the CPU path's on the same inputs (both fp32 arithmetic: they agree to the output tolerance;
// out / out_z also within 2 k u cond where larger, as each side may be k u cond away from the float64 `f`).
void expect_matches_cpu(Case& gpu, const RefFwd& f) {
  Case cpu = gpu;
  ASSERT_EQ(run_fwd(cpu, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const Tol t = tol_out(gpu.spec.itype);
  const std::vector<double> ay = cond_bound(f.cond_y, 2.0);
  const std::vector<double> az = gpu.spec.has_z ? cond_bound(f.cond_out_z, 2.0) : std::vector<double>();
  for (auto& [name, g] : gpu.named_fwd_outputs()) {
    Tensor* ct = nullptr;
    for (auto& [cn, cten] : cpu.named_fwd_outputs())
      if (std::string(cn) == name) ct = cten;
    ASSERT_NE(ct, nullptr) << name;
    const std::string n(name);
    const std::vector<double>* bound = n == "out" ? &ay : n == "out_z" ? &az : nullptr;
    EXPECT_TRUE(allclose(n + " vs CPU path", g->values(), ct->values(), t, bound));
  }
}

// One full check of a spec: reference, CPU path, poison/guards, bitwise determinism of a second run.
void check_spec(const CaseSpec& spec, bool misalign = false) {
  SCOPED_TRACE(spec.str() + (misalign ? " misaligned" : ""));
  Case c = make_case(spec);
  DeviceCopy dev(c, misalign);
  ASSERT_TRUE(dev.ok()) << "device allocation/copy failed";
  ASSERT_EQ(run_gpu(c, dev), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  expect_all_written(c);
  const RefFwd f = ref_forward(ref_problem(c), /*with_cond=*/true);
  expect_matches_reference(c, f);
  expect_matches_cpu(c, f);
  std::vector<Tensor> first;
  for (Tensor* t : c.fwd_outputs()) first.push_back(*t);
  ASSERT_EQ(run_gpu(c, dev), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  size_t i = 0;
  for (auto& [name, t] : c.named_fwd_outputs())
    EXPECT_TRUE(t->same_bytes(first[i++])) << name << " differs between two identical runs";
}

// ---------------------------------------------------------------------------------------------- the matrix
struct Named {
  std::string name;
  CaseSpec spec;
  bool misalign = false;
};
// gtest prints a parameter in test listings; without this it dumps the struct's bytes into every ctest name.
void PrintTo(const Named& n, std::ostream* os) { *os << n.name; }

std::vector<Named> matrix() {
  std::vector<Named> v;
  uint64_t seed = 1000;
  const int32_t itypes[] = {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16};
  const char* itn[] = {"f32", "f16", "bf16"};
  // itype x real/complex x variable/constant B and C, with odd lengths, groups, h0 and the three layouts.
  for (int it = 0; it < 3; ++it)
    for (int cx = 0; cx < 2; ++cx)
      for (int vb = 0; vb < 2; ++vb)
        for (int vc = 0; vc < 2; ++vc) {
          CaseSpec s;
          s.itype = itypes[it];
          s.complex = cx;
          s.var_B = vb;
          s.var_C = vc;
          s.batch = 2;
          s.dim = 8;
          s.groups = (vb || vc) ? (it == 2 ? 4 : 2) : 1;
          s.seqlen = 301 + 64 * it + 7 * vb;
          s.dstate = 16;
          s.has_h0 = (it + vb + vc) % 2;
          s.strides = static_cast<Strides>((it + cx + vc) % 3);
          s.seed = ++seed;
          v.push_back({std::string(itn[it]) + (cx ? "_cplx" : "_real") + (vb ? "_varB" : "_constB") +
                           (vc ? "_varC" : "_constC") + (s.has_h0 ? "_h0" : "") + "_strides" +
                           std::to_string(static_cast<int>(s.strides)),
                       s});
        }
  // Several chunks (x has nc = 3), groups 1/2/4, slow decay so states cross chunk boundaries.
  for (int64_t g : {1, 2, 4}) {
    CaseSpec s;
    s.seqlen = 4500;
    s.dim = 8;
    s.groups = g;
    s.dstate = 16;
    s.itype = g == 4 ? SELSCAN_DTYPE_BFLOAT16 : SELSCAN_DTYPE_FLOAT32;
    s.slow_decay = true;
    s.seed = ++seed;
    v.push_back({"L4500_groups" + std::to_string(g), s});
  }
  v.push_back({"L4500_complex_h0_f16", l4500_complex_h0_f16(++seed)});
  for (int64_t n : {1, 16, 64, 256}) {
    CaseSpec s;
    s.dstate = n;
    s.seqlen = 333;
    s.dim = 6;
    s.groups = 3;
    s.itype = SELSCAN_DTYPE_BFLOAT16;
    s.seed = ++seed;
    v.push_back({"dstate" + std::to_string(n), s});
    s.complex = true;
    s.var_B = false;
    s.itype = SELSCAN_DTYPE_FLOAT32;
    s.seed = ++seed;
    v.push_back({"dstate" + std::to_string(n) + "_complex_constB", s});
  }
  for (int64_t L : {1, 2, 31, 255, 256, 257, 2047, 2048, 2049}) {
    CaseSpec s;
    s.seqlen = L;
    s.itype = itypes[L % 3];
    s.var_C = L % 2;
    s.seed = ++seed;
    v.push_back({"L" + std::to_string(L), s});
  }
  for (int it = 0; it < 3; ++it) {  // every row base off 16-byte alignment: the scalar IO path
    CaseSpec s;
    s.seqlen = 512;
    s.itype = itypes[it];
    s.seed = ++seed;
    v.push_back({std::string("misaligned_") + itn[it], s, true});
  }
  {
    CaseSpec s;
    s.has_D = s.has_z = s.has_delta_bias = s.softplus = false;
    s.with_x = s.with_last_state = false;
    s.seqlen = 100;
    s.seed = ++seed;
    v.push_back({"no_optionals", s});
    CaseSpec t;
    t.bc_3d = true;
    t.dim = 13;  // not a multiple of the block's channel tile
    t.seqlen = 129;
    t.seed = ++seed;
    v.push_back({"bc3d_dim13", t});
    CaseSpec w;
    w.strides = Strides::mamba_inner;
    w.batch = 3;
    w.seqlen = 640;
    w.itype = SELSCAN_DTYPE_BFLOAT16;
    w.seed = ++seed;
    v.push_back({"mamba_inner_strides_bf16", w});
  }
  // Every threads-per-channel count of the thread-states kernel (4 states per thread: dstate 3 -> 1 thread with
  // a padded state, 8 -> 2, 13 -> 4 with padding, 24 and 32 -> 8), real weights, both constant and variable B/C.
  for (int64_t n : {3, 8, 13, 24, 32}) {
    CaseSpec s;
    s.dstate = n;
    s.seqlen = 2100;
    s.dim = 10;
    s.groups = 2;
    s.itype = n % 2 ? SELSCAN_DTYPE_FLOAT32 : SELSCAN_DTYPE_BFLOAT16;
    s.var_B = n != 13;
    s.var_C = n != 24;
    s.has_h0 = n == 8 || n == 32;
    s.seed = ++seed;
    v.push_back({"ts_dstate" + std::to_string(n), s});
  }
  return v;
}

class GpuFwdMatrix : public ::testing::TestWithParam<Named> {};

TEST_P(GpuFwdMatrix, MatchesReferenceAndCpu) {
  REQUIRE_GPU();
  check_spec(GetParam().spec, GetParam().misalign);
}

INSTANTIATE_TEST_SUITE_P(Small, GpuFwdMatrix, ::testing::ValuesIn(matrix()),
                         [](const ::testing::TestParamInfo<Named>& i) { return i.param.name; });

// More channels than a 16-bit grid dimension holds; blocks are indexed in gridDim.x with 64-bit math.
TEST(GpuFwd, DimBeyond65535) {
  REQUIRE_GPU();
  CaseSpec s = case_spec(1, 70000, 3, 4, SELSCAN_DTYPE_BFLOAT16);
  s.seed = 77;
  check_spec(s);
}

// A call the default plan gives to the thread-states forward (at least 8 warps per SM of 4-thread channels on GPUs of
// up to 150 SMs, src/cuda/select.cpp), 16-bit with variable B and C: the packed B/C instance (kernels/fwd/launch.cuh)
// at the block and tile shapes of the 8x1536x2048:16 on an H200 (64 threads, 32-step tiles), which the small
// shapes above reach only with the kernel forced. L ends inside a tile. fp16 widens its half words
// (kernels/common/io.cuh, unpack16) where bf16 shifts them.
TEST(GpuFwd, DefaultPlanThreadStates16Bit) {
  REQUIRE_GPU();
  uint64_t seed = 78;
  for (const int32_t itype : {SELSCAN_DTYPE_BFLOAT16, SELSCAN_DTYPE_FLOAT16}) {
    CaseSpec s = case_spec(2, 4800, 100, 16, itype);
    s.seed = seed++;
    check_spec(s);
  }
}

// The other two launch-bounds variants of the dense thread-states forward, at grids that select them on this GPU
// (src/cuda/select.cpp): 14 warps per SM of 4-thread channels take the 4-blocks-per-SM instances, 20 the 5-blocks
// ones (the call above and the small forced test shapes take the 3-blocks variant). bf16 runs the packed B/C instance,
// fp32 the float tiles.
TEST(GpuFwd, DefaultPlanOtherLaunchBounds) {
  REQUIRE_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  uint64_t seed = 80;
  for (const int64_t warps_per_sm : {14, 20})
    for (const int32_t itype : {SELSCAN_DTYPE_BFLOAT16, SELSCAN_DTYPE_FLOAT32}) {
      CaseSpec s = case_spec(1, 8 * warps_per_sm * sms, 40, 16, itype);  // 8 channels a warp
      s.seed = seed++;
      check_spec(s);
    }
}

// The 5-blocks slots instance in both of its forms (src/cuda/select.cpp, fwd_copy_engine; kernels/fwd/ts.cuh, kTma):
// on an H200, L a multiple of 8 (16-bit rows on 16 bytes) takes the copy-engine form, L = 41 the cp.async one. Groups
// of 10,576 channels, whose last channel tile is half full, so the copy engine's boxes reach into the next group's
// channels (unused); ragged last tiles; L = 2104 without z: two chunks of x, the last tile 24 steps.
TEST(GpuFwd, DefaultPlanSlotsInstanceBothForms) {
  REQUIRE_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int64_t dim = 8 * 20 * sms + 32;  // 20 warps per SM of 4-thread channels: the 5-blocks variant
  uint64_t seed = 90;
  for (const int32_t itype : {SELSCAN_DTYPE_BFLOAT16, SELSCAN_DTYPE_FLOAT16})
    for (const int64_t L : {40, 41}) {
      CaseSpec s = case_spec(1, dim, L, 16, itype, 2);
      s.seed = seed++;
      check_spec(s);
    }
  CaseSpec s = case_spec(1, dim, 2104, 16, SELSCAN_DTYPE_BFLOAT16, 2);
  s.has_z = false;
  s.seed = seed++;
  check_spec(s);
}

// The call only enqueues work on the given stream: it can be captured into a CUDA graph and replayed.
TEST(GpuFwd, CapturedInCudaGraph) {
  REQUIRE_GPU();
  CaseSpec s;
  s.seqlen = 700;
  s.itype = SELSCAN_DTYPE_BFLOAT16;
  s.seed = 78;
  Case c = make_case(s);
  DeviceCopy dev(c, false);
  ASSERT_TRUE(dev.ok());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const selscan_fwd_args_t a = dev.args();
  const selscan_exec_t e = cuda_exec(stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const selscan_status_t st = selscan_fwd(&a, &e);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(st, SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  dev.download_outputs();
  expect_all_written(c);
  expect_matches_reference(c);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---------------------------------------------------------------------------------------------- golden
// Upstream's own outputs for the same inputs (tests/data/golden). out.npy is the final output (out_z with z).
class GpuFwdGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuFwdGolden, MatchesUpstream) {
  REQUIRE_GPU();
  if (!golden_exists(GetParam()))
    GTEST_SKIP() << "golden vectors not found at " << golden_dir() << "/" << GetParam() << " (set SELSCAN_GOLDEN_DIR)";
  // Shapes and output buffers from make_case; inputs replaced by the golden arrays.
  GoldenCase g;
  Case c;
  const std::string err = load_golden_case(GetParam(), &g, &c);
  ASSERT_TRUE(err.empty()) << err;
  const CaseSpec& s = c.spec;
  SCOPED_TRACE(GetParam() + ": " + s.str());
  DeviceCopy dev(c, false);
  ASSERT_TRUE(dev.ok());
  ASSERT_EQ(run_gpu(c, dev), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  expect_all_written(c);
  const Tol t = tol_out(s.itype);
  EXPECT_TRUE(allclose("out", (s.has_z ? c.out_z : c.out).values(), golden_values(g, "out"), t));
  EXPECT_TRUE(allclose("last_state", c.last_state.values(), golden_values(g, "last_state"), t));
  expect_matches_reference(c);
}

INSTANTIATE_TEST_SUITE_P(Golden, GpuFwdGolden,
                         ::testing::Values("s01_fp32_basic", "s02_fp32_full", "s03_bf16_full", "s04_fp16_groups2",
                                           "s05_fp32_constBC", "s06_bf16_long_2chunks", "s07_fp32_dstate64",
                                           "s08_fp32_complex"));

}  // namespace
}  // namespace selscan_test
