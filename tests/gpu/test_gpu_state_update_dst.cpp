// The decode step with dst_state_batch_indices on CUDA (the kernel's destination instances, one per state dtype)
// against the CPU path and the float64 oracle: distinct, in-place and pad destinations in one batch, both forms,
// groups, T > 1, every state dtype, the vector and the scalar (misaligned) state paths; and a destination outside
// the pool, which only the device sees (the CPU call rejects it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compare.h"
#include "cuda_memory.h"
#include "gpu_gate.h"
#include "state_update_case.h"

namespace selscan_test {
namespace {

const DeviceMemory& device_copies() {
  static const DeviceMemory m = cuda_memory();
  return m;
}

// Sequence b reads slot 2b and writes the fresh slot 2b + 1, or (b % 4 == 1) its source in place, or (b % 4 == 2)
// nothing (pad); every third sequence is padding.
StateUpdateSpec with_destinations(StateUpdateSpec s) {
  s.pool = 2 * s.batch;
  s.indices.clear();
  s.dst.clear();
  for (int64_t b = 0; b < s.batch; ++b) {
    s.indices.push_back(b % 3 == 2 ? -1 : 2 * b);
    s.dst.push_back(b % 4 == 1 ? 2 * b : b % 4 == 2 ? -1 : 2 * b + 1);
  }
  return s;
}

void expect_cuda_matches_cpu(const StateUpdateSpec& spec, bool misalign) {
  const StateUpdateCase before = make_state_update_case(spec);
  StateUpdateCase cpu = before, gpu = before;
  ASSERT_EQ(run_state_update(cpu, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << spec.str() << ": " << selscan_last_error();
  ASSERT_EQ(run_state_update(gpu, cuda_exec(), &device_copies(), misalign), SELSCAN_STATUS_SUCCESS)
      << spec.str() << ": " << selscan_last_error();
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << spec.str();
  expect_state_update_ok(gpu, before);  // the oracle; slots no sequence writes (the sources) bit-identical
  const std::string what = spec.str() + (misalign ? " misaligned" : "");
  EXPECT_TRUE(allclose("out vs CPU (" + what + ")", gpu.out.values(), cpu.out.values(), tol_out(spec.itype)));
  EXPECT_TRUE(allclose("state vs CPU (" + what + ")", gpu.state.values(), cpu.state.values(),
                       tol_out(spec.state_dtype)));
}

std::vector<StateUpdateSpec> dst_gpu_specs() {
  constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;
  std::vector<StateUpdateSpec> v;
  for (const auto& [it, sd] : {std::pair{kF32, kF32}, std::pair{kF16, kF16}, std::pair{kBF16, kBF16}}) {
    StateUpdateSpec s;  // Mamba-1 form
    s.batch = 9, s.nheads = 40, s.dstate = 16, s.itype = it, s.state_dtype = sd, s.has_z = true;
    v.push_back(with_destinations(s));
    StateUpdateSpec h;  // Mamba-2's heads shape: broadcasts, groups, speculative decoding
    h.heads = true, h.batch = 6, h.nheads = 8, h.headdim = 16, h.dstate = 64, h.groups = 2, h.broadcast = true;
    h.tokens = 3, h.itype = it, h.state_dtype = sd, h.has_z = true, h.idx_dtype = SELSCAN_DTYPE_INT64;
    v.push_back(with_destinations(h));
  }
  StateUpdateSpec odd;  // dstate not a multiple of 8, strided INT32 indices, padded layouts: scalar paths only
  odd.heads = true, odd.batch = 5, odd.nheads = 4, odd.headdim = 4, odd.dstate = 12, odd.idx_stride = 2;
  odd.padded = true, odd.itype = kBF16;
  v.push_back(with_destinations(odd));
  uint64_t seed = 3300;
  for (auto& s : v) s.seed = ++seed;
  return v;
}

TEST(GpuStateUpdateDst, MatchesTheCpuPath) {
  REQUIRE_GPU();
  for (const StateUpdateSpec& s : dst_gpu_specs()) expect_cuda_matches_cpu(s, false);
}

TEST(GpuStateUpdateDst, MisalignedMatchesTheCpuPath) {
  REQUIRE_GPU();
  for (const StateUpdateSpec& s : dst_gpu_specs()) expect_cuda_matches_cpu(s, true);
}

TEST(GpuStateUpdateDst, Mamba2HeadsShapeAtWidth) {
  REQUIRE_GPU();
  StateUpdateSpec s;  // Mamba-2 2.7b: 80 heads of 64 channels, dstate 128; 16 sequences
  s.heads = true, s.batch = 16, s.nheads = 80, s.headdim = 64, s.dstate = 128, s.groups = 1, s.groups_dim = true;
  s.itype = SELSCAN_DTYPE_BFLOAT16, s.broadcast = true, s.has_z = true, s.seed = 3400;
  expect_cuda_matches_cpu(with_destinations(s), false);
  s.state_dtype = SELSCAN_DTYPE_BFLOAT16, s.seed = 3401;
  expect_cuda_matches_cpu(with_destinations(s), false);
}

// A destination outside the pool is invisible to the host on CUDA: that sequence's out is NaN and no slot is
// touched, as for a source outside the pool (the oracle's rule); the other sequences run as usual.
TEST(GpuStateUpdateDst, ADestinationOutsideThePoolWritesNaNAndNoSlot) {
  REQUIRE_GPU();
  for (int32_t sd : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16}) {
    StateUpdateSpec s;
    s.batch = 4, s.nheads = 16, s.dstate = 16, s.pool = 8, s.itype = SELSCAN_DTYPE_FLOAT16, s.state_dtype = sd;
    s.indices = {0, 2, 4, 6}, s.dst = {1, 8, -5, 7}, s.seed = 3500 + static_cast<uint64_t>(sd);
    const StateUpdateCase before = make_state_update_case(s);
    StateUpdateCase c = before;
    ASSERT_EQ(run_state_update(c, cuda_exec(), &device_copies()), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    expect_state_update_ok(c, before);
  }
}

}  // namespace
}  // namespace selscan_test
