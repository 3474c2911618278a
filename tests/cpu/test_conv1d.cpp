// The causal conv1d's forward and backward on the CPU against the float64 reference (tests/common/conv1d_case.h):
// the shared matrix, the reference's own reverse mode and the CPU backward against central finite differences,
// bitwise-reproducible gradients at any thread count, the device runner on host copies, and a prefill through the
// pool continued by the decode update equal to one forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "compare.h"
#include "conv1d_case.h"
#include "support/reference_conv1d.h"

namespace selscan_test {
namespace {

class CpuConv1dMatrix : public ::testing::TestWithParam<NamedConv1dSpec> {};

TEST_P(CpuConv1dMatrix, ForwardAndBackwardMatchReference) { check_conv1d(GetParam().spec, cpu_exec(2)); }

INSTANTIATE_TEST_SUITE_P(Conv1d, CpuConv1dMatrix, ::testing::ValuesIn(conv1d_matrix()),
                         [](const ::testing::TestParamInfo<NamedConv1dSpec>& i) { return i.param.name; });

// A random float64 problem for the reference's own checks.
RefConv1d random_ref(int64_t Bt, int64_t D, int64_t L, int64_t W, int64_t H, int64_t F, bool silu, bool seq_idx,
                     uint64_t seed) {
  Rng rng(seed);
  RefConv1d p;
  p.Bt = Bt, p.D = D, p.L = L, p.W = W, p.H = H, p.F = F, p.silu = silu, p.has_bias = true;
  auto draw = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = rng.normal();
    return v;
  };
  p.x = draw(Bt * D * L), p.weight = draw(D * W), p.bias = draw(D), p.hist = draw(Bt * D * H);
  if (seq_idx)
    for (int64_t b = 0; b < Bt; ++b) {
      int32_t id = 0;
      for (int64_t t = 0; t < L; ++t) {
        if (rng.uniform() < 0.2) id = rng.uniform() < 0.3 ? -1 : id + 1;  // a new segment, sometimes padding
        p.seq_idx.push_back(id);
      }
    }
  return p;
}

std::vector<double> normals(int64_t n, Rng& rng) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = rng.normal();
  return v;
}

// The reverse mode of the reference against central differences of its forward, over the history and final
// lengths the cases use (none, initial/final states, a pool slot), with SILU and seq_idx.
TEST(CpuConv1d, ReferenceGradientMatchesFiniteDifferences) {
  uint64_t seed = 7000;
  for (int64_t W : {2, 3, 4})
    for (int64_t L : {1, 2, 9})
      for (int hist = 0; hist < 3; ++hist)
        for (bool silu : {false, true}) {
          const int64_t H = hist == 0 ? 0 : hist == 1 ? W - 1 : W + 2;
          const RefConv1d p = random_ref(2, 3, L, W, H, H, silu, false, ++seed);
          Rng rng(seed);
          const std::vector<double> dout = normals(p.Bt * p.D * p.L, rng), dfin = normals(p.Bt * p.D * p.F, rng);
          const double worst = ref_conv1d_gradient_check(p, dout, dfin, 4, seed);
          EXPECT_LT(worst, 1e-7) << "W=" << W << " L=" << L << " H=F=" << H << (silu ? " silu" : "");
        }
  for (bool silu : {false, true}) {
    const RefConv1d p = random_ref(3, 2, 40, 4, 0, 0, silu, true, ++seed);
    Rng rng(seed);
    const double worst = ref_conv1d_gradient_check(p, normals(p.Bt * p.D * p.L, rng), {}, 6, seed);
    EXPECT_LT(worst, 1e-7) << "seq_idx" << (silu ? " silu" : "");
  }
}

// A wrong reverse mode does not pass the check above: the check can fail.
TEST(CpuConv1d, FiniteDifferenceCheckCatchesAWrongGradient) {
  const RefConv1d p = random_ref(1, 2, 6, 3, 2, 2, true, false, 7100);
  Rng rng(7100);
  const std::vector<double> dout = normals(p.Bt * p.D * p.L, rng), dfin = normals(p.Bt * p.D * p.F, rng);
  const RefConv1dBwd g = ref_conv1d_backward(p, dout, dfin);
  std::vector<double> dir(g.dweight.size(), 0.0);
  dir[1] = 1.0;  // the directional derivative along weight[0][1] is dweight[0][1]
  const double fd = ref_conv1d_directional(p, dout, dfin, {}, dir, {}, {});
  EXPECT_NEAR(fd, g.dweight[1], 1e-7 * std::max(1.0, std::fabs(fd)));
  EXPECT_GT(std::fabs(fd - 1.01 * g.dweight[1]), 1e-7 * std::max(1.0, std::fabs(fd)));
}

// The reference problem of a dense case's backward (its inputs as stored, initial states as the backward gets them).
RefConv1d ref_of(const Conv1dCase& c) {
  const Conv1dSpec& s = c.spec;
  RefConv1d p;
  p.Bt = s.batch, p.D = s.dim, p.L = s.seqlen, p.W = s.width, p.silu = s.silu, p.has_bias = s.bias;
  p.H = c.bwd_init.present() ? s.width - 1 : 0;
  p.F = c.dfin.present() ? s.width - 1 : 0;
  p.x = c.x.values(), p.weight = c.weight.values();
  if (s.bias) p.bias = c.bias.values();
  if (p.H > 0) p.hist = c.bwd_init.values();
  if (s.seq_idx)
    for (double v : c.seq_idx.values()) p.seq_idx.push_back(static_cast<int32_t>(v));
  return p;
}

// The CPU backward's directional derivatives against float64 central differences of the float64 forward.
TEST(CpuConv1d, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 7200;
  for (int variant = 0; variant < 6; ++variant) {
    Conv1dSpec s;
    s.batch = 2, s.dim = 5, s.seqlen = variant == 5 ? 2 : 23, s.width = 2 + variant % 3, s.silu = variant % 2 == 0;
    s.seq_idx = variant == 3;
    s.initial_states = s.dinitial_states = s.dfinal_states = !s.seq_idx;
    s.layout = variant % 2 ? ConvLayout::channel_last : ConvLayout::strided;
    s.seed = ++seed;
    Conv1dCase c = make_conv1d_case(s);
    ASSERT_EQ(run_conv1d_bwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    const RefConv1d p = ref_of(c);
    const std::vector<double> dout = c.dout.values(), dfin = c.dfin.present() ? c.dfin.values() : std::vector<double>{};
    Rng rng(seed);
    for (int k = 0; k < 4; ++k) {
      const std::vector<double> vx = normals(p.Bt * p.D * p.L, rng), vw = normals(p.D * p.W, rng),
                                vb = normals(p.D, rng), vh = normals(p.Bt * p.D * p.H, rng);
      double analytic = 0.0;
      const std::pair<const Tensor*, const std::vector<double>*> terms[] = {
          {&c.dx, &vx}, {&c.dweight, &vw}, {&c.dbias, &vb}, {&c.dinit, &vh}};
      for (const auto& [g, v] : terms)
        if (g->present()) {
          const std::vector<double> gv = g->values();
          for (size_t i = 0; i < gv.size(); ++i) analytic += gv[i] * (*v)[i];
        }
      const double fd =
          ref_conv1d_directional(p, dout, dfin, vx, vw, vb, c.dinit.present() ? vh : std::vector<double>{});
      EXPECT_NEAR(analytic, fd, 1e-4 * std::max(1.0, std::fabs(fd))) << s.str() << " direction " << k;
    }
  }
}

// dx, dweight, dbias and dinitial_states do not depend on the thread count, bit for bit (fixed-order sums).
TEST(CpuConv1d, BackwardBitwiseAcrossThreadCounts) {
  for (int variant = 0; variant < 2; ++variant) {
    Conv1dSpec s;
    s.batch = 6, s.dim = 70, s.seqlen = 333, s.itype = SELSCAN_DTYPE_BFLOAT16, s.initial_states = true;
    s.dinitial_states = s.dfinal_states = true, s.seed = 7300 + variant;
    if (variant == 1) s.lens = {100, 0, 17, 250, 3}, s.layout = ConvLayout::channel_last;
    const Conv1dCase base = make_conv1d_case(s);
    Conv1dCase first = base;
    ASSERT_EQ(run_conv1d_bwd(first, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    for (int threads : {2, 3, 7, 0}) {
      Conv1dCase c = base;
      ASSERT_EQ(run_conv1d_bwd(c, cpu_exec(threads)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      EXPECT_TRUE(c.dx.same_bytes(first.dx)) << threads << " threads";
      EXPECT_TRUE(c.dweight.same_bytes(first.dweight)) << threads << " threads";
      EXPECT_TRUE(c.dbias.same_bytes(first.dbias)) << threads << " threads";
      EXPECT_TRUE(c.dinit.same_bytes(first.dinit)) << threads << " threads";
    }
  }
}

// The device runner of tests/common (what the GPU suite uses) with plain host memory as the "device".
TEST(CpuConv1d, DeviceRunnerOnHostCopies) {
  int live = 0;
  const DeviceMemory dev = host_device_memory(&live);
  Conv1dSpec s;
  s.lens = {4, 0, 11}, s.slots = 5, s.state_len = 6, s.cache_indices = {2, 4, -1}, s.dinitial_states = true;
  s.seed = 7400;
  check_conv1d(s, cpu_exec(2), &dev);
  Conv1dSpec q;
  q.seq_idx = true, q.layout = ConvLayout::strided, q.seed = 7401;
  check_conv1d(q, cpu_exec(2), &dev);
  EXPECT_EQ(live, 0);
}

// Serving: a prefill of L tokens through the pool (selscan_conv1d_fwd with conv_states), then K tokens through
// selscan_conv1d_update from that slot, T a call, gives the outputs and the state of one forward of L + K tokens.
// With the shifting state the slot is used as the prefill left it; as a circular buffer the prefill's slot is the
// buffer at position 0 mod state_len.
TEST(CpuConv1d, PrefillThenDecodeEqualsOneForward) {
  constexpr int64_t Bt = 3, D = 6, L = 13, K = 6;
  uint64_t seed = 7500;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16})
    for (int64_t W : {2, 4})
      for (int64_t SL : {W - 1, W + 2})
        for (int64_t T : {1, 2, 3})
          for (bool circular : {false, true}) {
            const std::string what = std::string(dtype_name(it)) + " W=" + std::to_string(W) + " state_len=" +
                                     std::to_string(SL) + " T=" + std::to_string(T) + (circular ? " circular" : "");
            // The whole forward (L + K tokens) and its pool.
            Conv1dSpec s;
            s.batch = Bt, s.dim = D, s.seqlen = L + K, s.width = W, s.itype = it, s.slots = Bt, s.state_len = SL;
            s.seed = ++seed;
            Conv1dCase whole = make_conv1d_case(s);
            ASSERT_EQ(run_conv1d_fwd(whole, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
            // The prefill: views of the first L tokens of the same x, the same pool before the call.
            Conv1dCase pre = make_conv1d_case(s);
            pre.pool = pre.pool_in;
            selscan_conv1d_fwd_args_t f = pre.fwd_args(host_ptr);
            f.x.sizes[2] = f.out.sizes[2] = L;
            const selscan_exec_t e = cpu_exec(2);
            ASSERT_EQ(selscan_conv1d_fwd(&f, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
            // The decode steps on the prefill's pool, reading x's later tokens in place.
            Tensor state = pre.pool;
            Tensor out = make_tensor(it, {Bt, D, K});
            Tensor seqlens = make_tensor(SELSCAN_DTYPE_INT64, {Bt});
            for (int64_t t0 = L; t0 < L + K; t0 += T) {
              const int64_t n = std::min(T, L + K - t0);
              selscan_conv1d_update_args_t u = SELSCAN_CONV1D_UPDATE_ARGS_INIT;
              u.x = pre.x.desc();
              u.x.data = static_cast<unsigned char*>(u.x.data) + t0 * pre.x.strides[2] * pre.x.esize();
              u.x.sizes[2] = n;
              u.weight = pre.weight.desc();
              u.bias = pre.bias.desc();
              u.activation = SELSCAN_ACTIVATION_SILU;
              u.conv_state = state.desc();
              u.out = out.desc();
              u.out.data = static_cast<unsigned char*>(u.out.data) + (t0 - L) * out.strides[2] * out.esize();
              u.out.sizes[2] = n;
              if (circular) {
                for (int64_t b = 0; b < Bt; ++b) seqlens.set({b}, static_cast<double>(SL + t0 - L));
                u.cache_seqlens = seqlens.desc();
              }
              ASSERT_EQ(selscan_conv1d_update(&u, &e), SELSCAN_STATUS_SUCCESS) << what << ": " << selscan_last_error();
            }
            std::vector<double> got, want;
            for (int64_t b = 0; b < Bt; ++b)
              for (int64_t d = 0; d < D; ++d)
                for (int64_t j = 0; j < K; ++j) {
                  got.push_back(out.get({b, d, j}));
                  want.push_back(whole.out.get({b, d, L + j}));
                }
            EXPECT_TRUE(allclose("decode out vs one forward (" + what + ")", got, want, tol_out(it)));
            // The state: the last SL inputs, in order (shift), or rotated by the tokens written (circular).
            std::vector<double> gs, ws;
            for (int64_t b = 0; b < Bt; ++b)
              for (int64_t d = 0; d < D; ++d)
                for (int64_t j = 0; j < SL; ++j) {
                  const int64_t col = circular ? (j + K) % SL : j;  // where the oldest kept input went
                  gs.push_back(state.get({b, d, col}));
                  ws.push_back(whole.pool.get({b, d, j}));
                }
            EXPECT_TRUE(allclose("decode state vs one forward's slot (" + what + ")", gs, ws, Tol{0.0, 0.0}));
          }
}

}  // namespace
}  // namespace selscan_test
