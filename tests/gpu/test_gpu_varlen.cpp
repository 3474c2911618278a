// Serving calls on the GPU (docs/serving.md): packed sequences (cu_seqlens read on the device), initial states from
// h0 rows or a state pool, padding entries, forward and backward (both reduction modes), against the float64
// oracle run sequence by sequence (tests/common/varlen_case.h) and against the CPU path; bad offsets stay inside
// the tensors; a slot outside the pool gives NaN outputs; a captured CUDA graph follows new index contents on replay.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compare.h"
#include "cuda_memory.h"
#include "gpu_gate.h"
#include "grad_terms.h"
#include "varlen_case.h"

namespace selscan_test {
namespace {

// Forward and backward on the GPU against the oracle; `det` picks the backward's reduction mode.
void check_on_gpu(const VarlenSpec& s, bool det) {
  const DeviceMemory dm = cuda_memory();
  VarlenCase c = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(c, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  ASSERT_EQ(run_varlen_bwd(c, cuda_exec(), det, &dm), SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  check_varlen(c, varlen_reference(c), true);
  // Padding sequences: exactly zero outputs and gradients.
  for (int64_t b = 0; b < s.batch(); ++b) {
    if (!s.pad(b)) continue;
    const int64_t row = s.packed ? 0 : b;
    for (const Tensor* t : {&c.out, &c.du, &c.ddelta})
      for (int64_t d = 0; d < s.dim; ++d)
        for (int64_t l = 0; l < s.lens[static_cast<size_t>(b)]; ++l)
          ASSERT_EQ(t->get({row, d, c.start(b) + l}), 0.0) << s.str() << ": padding sequence " << b;
  }
}

TEST(GpuVarlen, PackedMatchesOracle) {
  REQUIRE_GPU();
  uint64_t seed = 900;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (int bc = 0; bc < 3; ++bc)
      for (InitFrom init : {InitFrom::none, InitFrom::h0})
        for (bool det : {true, false}) {
          VarlenSpec s;
          // Odd lengths: sequences start at offsets that are not multiples of a 16-byte vector.
          s.lens = {5, 0, 301, 17, 1, 64, 0, 129};
          s.dim = 24, s.dstate = 16, s.groups = 2;
          s.itype = it, s.init = init, s.var_B = bc != 1, s.var_C = bc != 2, s.seed = seed++;
          s.cu_dtype = seed % 2 ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
          check_on_gpu(s, det);
        }
}

// Sequences longer than a chunk of x (chunk slots, seeds), starting mid-chunk; dstate above a warp's 32 lanes.
TEST(GpuVarlen, LongSequences) {
  REQUIRE_GPU();
  for (int64_t N : {16, 40}) check_on_gpu(long_sequences_spec(N), true);
}

// The run's record of the case above (docs/numerics.md, "Reduced gradients of packed calls"): every gradient of the
// GPU's backward (both reduction modes) against float64, as its worst error over upstream's tolerance, over
// check_varlen's limit, over u cond (the reference's first-order bound) and, for the reduced gradients, over
// u Σ|T| and u Σ|T| sqrt(n) of their float64 terms (tests/common/grad_terms.h); the float32 re-summations of the
// exact terms as rows of comparison. Fails where check_varlen would.
TEST(GpuVarlen, LongSequencesConditionReport) {
  REQUIRE_GPU();
  const DeviceMemory dm = cuda_memory();
  for (int64_t N : {16, 40})
    for (bool det : {true, false}) {
      const VarlenSpec s = long_sequences_spec(N);
      VarlenCase c = make_varlen_case(s);
      ASSERT_EQ(run_varlen_fwd(c, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      ASSERT_EQ(run_varlen_bwd(c, cuda_exec(), det, &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      const VarlenRef r = varlen_reference(c);
      const GradTerms t = grad_terms(c);
      const std::vector<GradCondition> rows = gradient_conditions(c, r, &t, true);
      std::printf("[ REPORT   ] GPU, %s, %s backward\n%s", s.str().c_str(), det ? "deterministic" : "atomic",
                  format_conditions(rows).c_str());
      for (const GradCondition& m : rows) EXPECT_LE(m.over_check, 1.0) << s.str() << " " << m.name;
    }
}

TEST(GpuVarlen, PoolSlotsAndPadding) {
  REQUIRE_GPU();
  for (bool packed : {true, false})
    for (bool det : {true, false}) {
      VarlenSpec s;
      s.lens = packed ? std::vector<int64_t>{9, 14, 0, 30, 6, 77} : std::vector<int64_t>(6, 33);
      s.packed = packed;
      s.dim = 16, s.dstate = 16, s.groups = 2;
      s.init = InitFrom::pool, s.slots = 11;
      s.cache_indices = {5, -1, 2, 0, 7, 10};
      s.pad_slot_id = -1;
      s.has_init = {1, 1, 0, 1, 0, 1};
      s.idx_dtype = packed ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
      s.init_dtype = packed ? SELSCAN_DTYPE_BOOL : SELSCAN_DTYPE_INT32;
      s.seed = packed ? 70 : 71;
      check_on_gpu(s, det);
    }
}

// The same packed call on the GPU and on the CPU path.
TEST(GpuVarlen, MatchesCpuPath) {
  REQUIRE_GPU();
  VarlenSpec s;
  s.lens = {33, 0, 250, 7, 1000};
  s.dim = 32, s.dstate = 16, s.groups = 4, s.init = InitFrom::h0, s.seed = 5;
  const DeviceMemory dm = cuda_memory();
  VarlenCase g = make_varlen_case(s), c = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(g, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(run_varlen_bwd(g, cuda_exec(), true, &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(run_varlen_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(run_varlen_bwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const Tolerances t = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  EXPECT_TRUE(allclose("out", g.out.values(), c.out.values(), t.out));
  EXPECT_TRUE(allclose("last_state", g.last_state.values(), c.last_state.values(), t.last_state));
  EXPECT_TRUE(allclose("du", g.du.values(), c.du.values(), t.du));
  EXPECT_TRUE(allclose("ddelta", g.ddelta.values(), c.ddelta.values(), t.ddelta));
  EXPECT_TRUE(allclose("dA", g.dA.values(), c.dA.values(), t.dA));
  EXPECT_TRUE(allclose("dB", g.dB.values(), c.dB.values(), t.dB));
  EXPECT_TRUE(allclose("dh0", g.dh0.values(), c.dh0.values(), t.dh0));
}

// Offsets the host cannot check: decreasing, negative, past the end. The kernels clamp them: the call succeeds
// (values undefined) and nothing outside the tensors is written (guard bytes intact).
TEST(GpuVarlen, BadOffsetsStayInBounds) {
  REQUIRE_GPU();
  VarlenSpec s;
  s.lens = {10, 20, 30, 40};
  s.init = InitFrom::pool, s.slots = 6, s.cache_indices = {0, 9, -5, 3}, s.pad_slot_id = 5;  // 9, -5: outside
  s.seed = 3;
  const DeviceMemory dm = cuda_memory();
  VarlenCase c = make_varlen_case(s);
  for (int64_t b = 0; b <= 4; ++b) c.cu_seqlens.set({b}, std::vector<double>{-7, 60, 15, 1000, 80}[static_cast<size_t>(b)]);
  ASSERT_EQ(run_varlen_fwd(c, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(run_varlen_bwd(c, cuda_exec(), true, &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (Tensor* t : c.all())  // every guard byte as the tensor's first one (kGuard for inputs, kPoison for outputs)
    if (t->present()) EXPECT_TRUE(t->check_guards(t->storage[0]).empty()) << t->check_guards(t->storage[0]);
  // Slots 1, 2, 4 and 5 are named by nobody valid: untouched.
  for (int64_t k : {1, 2, 4, 5})
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t n = 0; n < s.dstate; ++n) ASSERT_EQ(c.pool.get({k, d, n}), c.pool_in.get({k, d, n}));
}

// A cache index outside the pool, which the host cannot see: that sequence's outputs are NaN and no slot is touched;
// the others run normally.
TEST(GpuVarlen, SlotOutsideThePoolGivesNaN) {
  REQUIRE_GPU();
  VarlenSpec s;
  s.lens = {9, 20, 14};
  s.dim = 16, s.dstate = 16;
  s.init = InitFrom::pool, s.slots = 4, s.cache_indices = {1, 7, 2}, s.pad_slot_id = -1;  // 7: outside
  s.seed = 13;
  const DeviceMemory dm = cuda_memory();
  VarlenCase g = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(g, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (int64_t b = 0; b < s.batch(); ++b)
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t l = 0; l < s.lens[static_cast<size_t>(b)]; ++l)
        for (const Tensor* t : {&g.out, &g.out_z})
          ASSERT_EQ(std::isnan(t->get({0, d, g.start(b) + l})), b == 1) << "sequence " << b;
  for (int64_t k : {0, 3})  // named by nobody
    for (int64_t d = 0; d < s.dim; ++d)
      for (int64_t n = 0; n < s.dstate; ++n) ASSERT_EQ(g.pool.get({k, d, n}), g.pool_in.get({k, d, n}));
  for (Tensor* t : g.all())
    if (t->present()) EXPECT_TRUE(t->check_guards(t->storage[0]).empty()) << t->check_guards(t->storage[0]);
}

// A forward captured in a CUDA graph reads cu_seqlens and cache_indices on the device at replay: new contents
// written between replays (same pointers) give the new call's results.
TEST(GpuVarlen, GraphReplayFollowsIndexContents) {
  REQUIRE_GPU();
  VarlenSpec s;
  s.lens = {40, 24, 0, 64};
  s.init = InitFrom::pool, s.slots = 4, s.cache_indices = {3, 1, -1, 0}, s.pad_slot_id = -1, s.seed = 12;
  VarlenSpec s2 = s;  // same total length, other split and slots
  s2.lens = {8, 56, 64, 0};
  s2.cache_indices = {0, -1, 2, 1};
  VarlenCase c = make_varlen_case(s), want = make_varlen_case(s2);
  std::vector<std::pair<Tensor*, void*>> dev;
  for (Tensor* t : c.all()) {
    if (!t->present()) continue;
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, t->storage.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(p, t->storage.data(), t->storage.size(), cudaMemcpyHostToDevice), cudaSuccess);
    dev.emplace_back(t, p);
  }
  auto ptr = [&](Tensor& t) -> void* {
    for (auto& tp : dev)
      if (tp.first == &t) return tp.second;
    return nullptr;
  };
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
  selscan_exec_t e = cuda_exec();
  e.stream = st;
  const selscan_fwd_args_t a = c.fwd_args(ptr);
  // A first call outside the capture (per-device setup), then the pool as it was.
  ASSERT_EQ(selscan_fwd(&a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ptr(c.pool), c.pool_in.storage.data(), c.pool_in.storage.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exe;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(selscan_fwd(&a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exe, graph, 0), cudaSuccess);
  // New index contents and the second case's pool, then replay.
  ASSERT_EQ(cudaMemcpy(ptr(c.cu_seqlens), want.cu_seqlens.storage.data(), want.cu_seqlens.storage.size(),
                       cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ptr(c.cache_indices), want.cache_indices.storage.data(), want.cache_indices.storage.size(),
                       cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exe, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  for (auto& tp : dev) ASSERT_EQ(cudaMemcpy(tp.first->storage.data(), tp.second, tp.first->storage.size(),
                                            cudaMemcpyDeviceToHost), cudaSuccess);
  // The replay computed the second case: same inputs (same seed), its split and slots.
  want.pool = want.pool_in;
  const DeviceMemory dm = cuda_memory();
  ASSERT_EQ(run_varlen_fwd(want, cuda_exec(), &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const Tol tol = tol_out(s.itype);
  EXPECT_TRUE(allclose("replayed out", c.out.values(), want.out.values(), tol));
  EXPECT_TRUE(allclose("replayed pool", c.pool.values(), want.pool.values(), tol));
  cudaGraphExecDestroy(exe);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  for (auto& tp : dev) cudaFree(tp.second);
}

}  // namespace
}  // namespace selscan_test
