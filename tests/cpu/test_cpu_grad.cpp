// Gradients: the oracle's reverse mode vs central finite differences of the oracle's forward, the CPU
// backward vs those finite differences, bitwise determinism across thread counts, the portable kernels, and
// the backward's own recomputation of chunk seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "check.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "validate.h"

namespace selscan_test {
namespace {

// One scalar parameter of a RefProblem and the matching entry of its analytic gradient.
struct Param {
  std::string name;
  double* x;
  double grad;
};

// Every real scalar the loss depends on (complex values as their real and imaginary parts).
std::vector<Param> params(RefProblem& p, const RefBwd& g) {
  std::vector<Param> r;
  auto reals = [&](const char* n, std::vector<double>& v, const std::vector<double>& gv) {
    for (size_t i = 0; i < v.size(); ++i) r.push_back({std::string(n) + "[" + std::to_string(i) + "]", &v[i], gv[i]});
  };
  auto cplx = [&](const char* n, std::vector<cd>& v, const std::vector<cd>& gv) {
    for (size_t i = 0; i < v.size(); ++i) {
      double* parts = reinterpret_cast<double*>(&v[i]);  // std::complex<double> is layout-compatible with double[2]
      r.push_back({std::string(n) + ".re[" + std::to_string(i) + "]", &parts[0], gv[i].real()});
      if (p.cplx) r.push_back({std::string(n) + ".im[" + std::to_string(i) + "]", &parts[1], gv[i].imag()});
    }
  };
  reals("u", p.u, g.du);
  reals("delta", p.delta, g.ddelta);
  cplx("A", p.A, g.dA);
  // Variable complex B/C are real tensors upstream; their imaginary parts are still parameters.
  cplx("B", p.B, g.dB);
  cplx("C", p.C, g.dC);
  if (p.has_D) reals("D", p.Dv, g.dD);
  if (p.has_z) reals("z", p.z, g.dz);
  if (p.has_bias) reals("bias", p.bias, g.dbias);
  if (p.has_h0) cplx("h0", p.h0, g.dh0);
  return r;
}

double central_difference(RefProblem& p, const std::vector<double>& dout, double* x) {
  const double x0 = *x, h = 1e-6 * std::max(1.0, std::fabs(x0));
  *x = x0 + h;
  const double lp = ref_loss(p, dout);
  *x = x0 - h;
  const double lm = ref_loss(p, dout);
  *x = x0;
  return (lp - lm) / (2 * h);
}

std::vector<CaseSpec> fd_specs() {
  std::vector<CaseSpec> v;
  uint64_t seed = 2000;
  for (bool cx : {false, true})
    for (int vb = 0; vb < 2; ++vb)
      for (int vc = 0; vc < 2; ++vc)
        for (bool h0 : {false, true}) {
          CaseSpec s;
          s.batch = 2, s.dim = 2, s.seqlen = 6, s.dstate = 2, s.groups = (vb || vc) ? 2 : 1;
          s.complex = cx, s.var_B = vb, s.var_C = vc, s.has_h0 = h0, s.seed = seed++;
          v.push_back(s);
        }
  CaseSpec s;  // no optional inputs, no softplus
  s.batch = 1, s.dim = 2, s.seqlen = 5, s.dstate = 3, s.has_D = s.has_z = s.has_delta_bias = s.softplus = false;
  s.seed = seed++;
  v.push_back(s);
  return v;
}

TEST(CpuGrad, OracleReverseModeMatchesFiniteDifferences) {
  for (const CaseSpec& spec : fd_specs()) {
    SCOPED_TRACE(spec.str());
    const Case c = make_case(spec);
    RefProblem p = ref_problem(c);
    const std::vector<double> dout = ref_dout(c);
    const RefBwd g = ref_backward(p, dout);
    int checked = 0;
    for (const Param& q : params(p, g)) {
      const double fd = central_difference(p, dout, q.x);
      EXPECT_NEAR(q.grad, fd, 1e-6 * (1.0 + std::fabs(fd))) << q.name;
      ++checked;
    }
    EXPECT_GT(checked, 30);
  }
}

// The CPU backward (fp32) against finite differences of the float64 forward, at upstream's tolerances.
TEST(CpuGrad, CpuMatchesFiniteDifferences) {
  for (bool cx : {false, true}) {
    CaseSpec s;
    s.batch = 2, s.dim = 2, s.seqlen = 9, s.dstate = 3, s.groups = 2, s.complex = cx, s.var_C = !cx;
    s.has_h0 = true, s.seed = 2100 + cx;
    SCOPED_TRACE(s.str());
    Case c = make_case(s);
    ASSERT_EQ(run_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    ASSERT_EQ(run_bwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    RefProblem p = ref_problem(c);
    const std::vector<double> dout = ref_dout(c);
    // Finite differences in place of the analytic gradient: swap every entry of `g` for its FD value.
    RefBwd g = ref_backward(p, dout);
    RefBwd fd = g;
    auto fill = [&](std::vector<double>& v, std::vector<double>& out) {
      for (size_t i = 0; i < v.size(); ++i) out[i] = central_difference(p, dout, &v[i]);
    };
    auto fillc = [&](std::vector<cd>& v, std::vector<cd>& out) {
      for (size_t i = 0; i < v.size(); ++i) {
        double* parts = reinterpret_cast<double*>(&v[i]);
        out[i] = cd(central_difference(p, dout, &parts[0]), central_difference(p, dout, &parts[1]));
      }
    };
    fill(p.u, fd.du);
    fill(p.delta, fd.ddelta);
    fillc(p.A, fd.dA);
    fillc(p.B, fd.dB);
    fillc(p.C, fd.dC);
    fill(p.Dv, fd.dD);
    fill(p.z, fd.dz);
    fill(p.bias, fd.dbias);
    fillc(p.h0, fd.dh0);
    if (!cx) {  // real weights: imaginary parts are not parameters
      for (auto* v : {&fd.dA, &fd.dB, &fd.dC, &fd.dh0})
        for (cd& z : *v) z = cd(z.real(), 0.0);
    }
    const Tolerances t = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
    EXPECT_TRUE(allclose("du", c.du.values(), fd.du, t.du));
    EXPECT_TRUE(allclose("ddelta", c.ddelta.values(), fd.ddelta, t.ddelta));
    EXPECT_TRUE(allclose("dA", c.dA.values(), flatten(fd.dA, cx), t.dA));
    EXPECT_TRUE(allclose("dB", c.dB.values(), flatten(fd.dB, cx), t.dB));
    EXPECT_TRUE(allclose("dC", c.dC.values(), flatten(fd.dC, cx), t.dC));
    EXPECT_TRUE(allclose("dD", c.dD.values(), fd.dD, t.dD));
    EXPECT_TRUE(allclose("dz", c.dz.values(), fd.dz, t.dz));
    EXPECT_TRUE(allclose("ddelta_bias", c.ddelta_bias.values(), fd.dbias, t.ddelta_bias));
    EXPECT_TRUE(allclose("dh0", c.dh0.values(), flatten(fd.dh0, cx), t.dh0));
  }
}

// Every output, forward and backward, is bitwise the same whatever the thread count (reductions over batch
// and over the channels of a group run in a fixed order).
TEST(CpuGrad, BitwiseDeterministicAcrossThreadCounts) {
  for (int variant = 0; variant < 3; ++variant) {
    CaseSpec s;
    s.batch = 3, s.dim = 40, s.seqlen = 2100, s.dstate = 5, s.groups = 2;  // 20 channels a group: 2 blocks
    s.var_B = variant != 1, s.var_C = variant != 2, s.complex = variant == 2;
    s.has_h0 = variant == 1, s.seed = 2200 + variant;
    SCOPED_TRACE(s.str());
    Case ref = make_case(s);
    ASSERT_EQ(run_fwd(ref, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    ASSERT_EQ(run_bwd(ref, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    for (int th : {2, 3, 5, 8}) {
      Case c = make_case(s);
      ASSERT_EQ(run_fwd(c, cpu_exec(th)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      ASSERT_EQ(run_bwd(c, cpu_exec(th)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      auto a = ref.named_fwd_outputs(), b = c.named_fwd_outputs();
      auto a2 = ref.named_bwd_outputs(), b2 = c.named_bwd_outputs();
      a.insert(a.end(), a2.begin(), a2.end());
      b.insert(b.end(), b2.begin(), b2.end());
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(a[i].second->same_bytes(*b[i].second)) << a[i].first << " differs with " << th << " threads";
    }
  }
}

// The portable kernels (the AVX2 ones are the default on this machine) over a slice of the matrix.
TEST(CpuGrad, PortableKernels) {
  static const selscan::cpu::KernelTable generic = selscan::cpu::generic::table();
  selscan::cpu::set_kernels_for_testing(&generic);
  uint64_t seed = 2300;
  for (int64_t N : {3, 8, 16, 32, 40})
    for (bool cx : {false, true}) {
      CaseSpec s;
      s.batch = 2, s.dim = 4, s.seqlen = N == 40 ? 2300 : 70, s.dstate = N, s.groups = 2, s.complex = cx;
      s.var_B = N != 8, s.has_h0 = N == 16, s.seed = seed++;
      check_case(s);
    }
  selscan::cpu::set_kernels_for_testing(nullptr);
}

// Without x the backward recomputes its chunk seeds; the result must equal the one seeded from x.
TEST(CpuGrad, BackwardWithoutChunkStatesRecomputesSeeds) {
  for (bool cx : {false, true}) {
    CaseSpec s;
    s.batch = 2, s.dim = 3, s.seqlen = 4200, s.dstate = 16, s.complex = cx, s.slow_decay = true, s.seed = 2400 + cx;
    SCOPED_TRACE(s.str());
    Case c = make_case(s);
    ASSERT_EQ(run_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    ASSERT_EQ(run_bwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    Case d = c;  // same inputs and forward outputs
    poison(d.bwd_outputs());
    const selscan_bwd_args_t a = d.bwd_args(host_ptr);
    selscan::Problem p{};
    ASSERT_EQ(selscan::make_bwd_problem(&a, &p), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    p.x.p = nullptr;  // the ABI requires x here; the CPU path copes without it
    ASSERT_EQ(selscan::cpu::bwd(p, 2), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    auto a1 = c.named_bwd_outputs(), b1 = d.named_bwd_outputs();
    for (size_t i = 0; i < a1.size(); ++i)
      EXPECT_TRUE(a1[i].second->same_bytes(*b1[i].second)) << a1[i].first;
  }
}

}  // namespace
}  // namespace selscan_test
