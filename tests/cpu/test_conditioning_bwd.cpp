// The conditioning-aware tolerance of the reduced gradients (docs/numerics.md, tests/common/compare.h,
// RefBwd::cond_*): dA, dB, dC, dD and ddelta_bias may differ from the float64 reference by
// max(upstream's tolerance, k u cond), and GPU from CPU path by max(upstream's tolerance, 2 k u cond). These
// tests pin both sides of that rule: the recorded H200 failures of tests/gpu/test_gpu_limits.cpp are within
// the bound, a 1% error in one element still fails, and upstream-style problems are compared exactly as before.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "limit_inputs.h"
#include "positions.h"
#include "reduced_cond.h"

namespace selscan_test {
namespace {

// A tolerance as the GPU limits test widens it for sums over Bt*L terms (run_limit's sum_tol).
Tol sum_tol(Tol t, int64_t Bt, int64_t L) {
  return {t.rtol, t.atol * std::max(1.0, std::sqrt(static_cast<double>(Bt * L) / 4096.0))};
}

// One recorded GPU-vs-CPU-path disagreement of the H200 run: element `index` of values() of `output`.
struct Recorded {
  const char* output;
  int64_t index;
  double cpu, gpu;  // as the failure message printed them (6 significant digits)
  Tol tol;          // the tolerance the GPU test applied
};

// The recorded disagreement is outside upstream's tolerance but within 2 k u cond; the float64 reference at
// that element is within k u cond of the recorded CPU value (which also shows that `cond` is the right element's).
void expect_recorded_within_bound(const Recorded& r, double ref, double cond) {
  SCOPED_TRACE(std::string(r.output) + "[" + std::to_string(r.index) + "]");
  const double diff = std::fabs(r.gpu - r.cpu), lim = r.tol.atol + r.tol.rtol * std::fabs(r.cpu);
  const double bound2 = 2.0 * kCondK * kU32 * cond, bound1 = kCondK * kU32 * cond;
  std::printf("[ recorded ] %s[%lld]: GPU %.6g, CPU %.6g, float64 %.6g; |GPU - CPU| %.4g = %.3gx upstream's limit "
              "%.4g, %.3g of 2 k u cond = %.4g (cond/|ref| %.3g); |CPU - float64| %.3g of k u cond\n",
              r.output, static_cast<long long>(r.index), r.gpu, r.cpu, ref, diff, diff / lim, lim, diff / bound2,
              bound2, cond / std::fabs(ref), std::fabs(r.cpu - ref) / bound1);
  EXPECT_GT(diff, lim) << "the recorded failure is within upstream's tolerance after all";
  EXPECT_LE(diff, bound2) << "the recorded GPU/CPU difference exceeds 2 k u cond";
  EXPECT_LE(std::fabs(r.cpu - ref), bound1) << "the recorded CPU value is not within k u cond of the reference";
}

// GpuLimitsNonFinite.ExplosiveAAtCpuPositions, its third case (L = 64, fp32, complex, variable B and C, the
// atomic backward; seed 67003): GPU -9.91033e+23 vs CPU -9.89631e+23 (dB), -1.44527e+15 vs -1.44151e+15 and
// -9.78171e+21 vs -9.79201e+21 (dC). Explosive states (|ā| up to e^5.5 per step) make the terms of a variable
// dB/dC element huge; the channel sum cancels them, and the dh/h errors carried through 64 steps dominate.
TEST(CpuConditioningBwd, RecordedExplosiveFailuresWithinBound) {
  const CaseSpec s = explosive_cases()[2].spec;  // tests/common/positions.h
  Case c = make_case(s);
  set_explosive_A(c);
  const RefBwd g = ref_backward(ref_problem(c), ref_dout(c), /*with_cond=*/true);
  const Tol tol = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C).dB;  // variable: the output's
  const std::vector<double> rB = flatten(g.dB, true), rC = flatten(g.dC, true);
  const std::vector<double> cB = flatten_cond(g.cond_dB, true), cC = flatten_cond(g.cond_dC, true);
  for (const Recorded& r : {Recorded{"dB", 597, -9.89631e+23, -9.91033e+23, tol},
                            Recorded{"dC", 174, -1.44151e+15, -1.44527e+15, tol},
                            Recorded{"dC", 309, -9.79201e+21, -9.78171e+21, tol}}) {
    const bool b = std::string(r.output) == "dB";
    expect_recorded_within_bound(r, (b ? rB : rC)[r.index], (b ? cB : cC)[r.index]);
  }
}

// GpuLimits.Dstate256, rebuilt from run_limit's seeded input patterns (tests/common/limit_inputs.h). Only the
// float64 reference of the one channel and state each element depends on is computed (restrict_problem).
struct LimitProblem {
  int64_t Bt, D, L, N, G;
  int32_t itype;
  bool cplx, varB, varC, hasZ, hasH0;  // run_limit's defaults otherwise: D, delta_bias and softplus on
  uint64_t seed;
};

Tensor patterned(int32_t dtype, const std::vector<int64_t>& sizes, Dist dist, uint64_t seed) {
  Tensor t = make_tensor(dtype, sizes);
  const std::vector<unsigned char> h = limit_pattern(dtype, dist, t.numel(), seed);
  std::memcpy(t.storage.data() + t.offset * t.esize(), h.data(), h.size());
  return t;
}

// The inputs and dout of run_limit for `s` (contiguous; every channel sampled), in run_limit's seed order.
Case limit_case(const LimitProblem& s) {
  const int32_t it = s.itype, wt = s.cplx ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const int64_t Bt = s.Bt, D = s.D, L = s.L, N = s.N, G = s.G, Lbc = s.cplx ? 2 * L : L;
  Case c;
  CaseSpec& ss = c.spec;
  ss.batch = Bt, ss.dim = D, ss.seqlen = L, ss.dstate = N, ss.groups = G;
  ss.itype = it, ss.complex = s.cplx, ss.var_B = s.varB, ss.var_C = s.varC;
  ss.has_D = true, ss.has_z = s.hasZ, ss.has_delta_bias = true, ss.softplus = true, ss.has_h0 = s.hasH0;
  uint64_t seed = s.seed * 1000;
  auto bc = [&](bool var, uint64_t sd) {
    return var ? patterned(it, {Bt, G, N, Lbc}, Dist::normal, sd) : patterned(wt, {D, N}, Dist::normal, sd);
  };
  c.u = patterned(it, {Bt, D, L}, Dist::normal, ++seed);
  c.delta = patterned(it, {Bt, D, L}, Dist::delta, ++seed);
  c.A = patterned(wt, {D, N}, Dist::decay, ++seed);
  c.B = bc(s.varB, ++seed);
  c.C = bc(s.varC, ++seed);
  c.D = patterned(SELSCAN_DTYPE_FLOAT32, {D}, Dist::normal, ++seed);
  ++seed;
  if (s.hasZ) c.z = patterned(it, {Bt, D, L}, Dist::normal, seed);
  c.delta_bias = patterned(SELSCAN_DTYPE_FLOAT32, {D}, Dist::bias, ++seed);
  ++seed;
  if (s.hasH0) c.h0 = patterned(wt, {Bt, D, N}, Dist::normal, seed);
  c.dout = patterned(it, {Bt, D, L}, Dist::normal, ++seed);
  return c;
}

// The first and third cases of GpuLimits.Dstate256 (slowly decaying real states, |A| down to 1e-3, over 2500
// steps; damped complex rotations with h0 over 2100 steps): dA[1953] GPU -212.145 vs CPU -212.441, and
// dA[3882] (the real part of element (7, 149)) GPU 75.8892 vs CPU 75.7061. dA[d, n] sums Bt*L terms
// δ ā dh h whose h and dh carry errors over the states' memory.
TEST(CpuConditioningBwd, RecordedDstate256FailuresWithinBound) {
  struct Run {
    LimitProblem p;
    Recorded r;
  };
  const Tolerances t32 = upstream_tolerances(SELSCAN_DTYPE_FLOAT32, true, true, true);
  const Tolerances t16 = upstream_tolerances(SELSCAN_DTYPE_FLOAT16, false, false, false);
  for (const Run& run :
       {Run{{2, 16, 2500, 256, 2, SELSCAN_DTYPE_FLOAT32, false, true, true, true, true, 81},
            {"dA", 1953, -212.441, -212.145, sum_tol(t32.dA, 2, 2500)}},
        Run{{1, 8, 2100, 256, 1, SELSCAN_DTYPE_FLOAT16, true, false, false, false, true, 83},
            {"dA", 3882, 75.7061, 75.8892, sum_tol(t16.dA, 1, 2100)}}}) {
    SCOPED_TRACE("seed " + std::to_string(run.p.seed));
    const Case c = limit_case(run.p);
    const RefProblem rp = ref_problem(c);
    const int64_t e = run.p.cplx ? run.r.index / 2 : run.r.index, d = e / run.p.N, n = e % run.p.N;
    const RefBwd g = ref_backward(restrict_problem(rp, {d}, {n}), restrict_bdl(rp, ref_dout(c), {d}), true);
    const double ref = run.p.cplx && run.r.index % 2 ? g.dA[0].imag() : g.dA[0].real();
    expect_recorded_within_bound(run.r, ref, g.cond_dA[0]);
  }
}

// ReducedCond (what the GPU limits test uses: each element's scale from the reference of just the channels and
// states it depends on) equals the full reference's scale, element by element, for every reduced gradient.
TEST(CpuConditioningBwd, PerElementScalesMatchFullReference) {
  uint64_t seed = 1330;
  for (bool cx : {false, true})
    for (int vb = 0; vb < 2; ++vb)
      for (int vc = 0; vc < 2; ++vc) {
        CaseSpec s;
        s.batch = 2, s.dim = 6, s.seqlen = 23, s.dstate = 5, s.groups = vb || vc ? 3 : 1;
        s.complex = cx, s.var_B = vb, s.var_C = vc, s.has_h0 = vc, s.seed = seed++;
        SCOPED_TRACE(s.str());
        const Case c = make_case(s);
        const RefBwd g = ref_backward(ref_problem(c), ref_dout(c), true);
        ReducedCond rc(c);
        struct Out {
          const char* name;
          std::vector<double> cond;
          size_t values;
        };
        for (const Out& o : {Out{"dA", flatten_cond(g.cond_dA, cx), c.dA.values().size()},
                             Out{"dB", flatten_cond(g.cond_dB, cx), c.dB.values().size()},
                             Out{"dC", flatten_cond(g.cond_dC, cx), c.dC.values().size()},
                             Out{"dD", g.cond_dD, c.dD.values().size()},
                             Out{"ddelta_bias", g.cond_dbias, c.ddelta_bias.values().size()}}) {
          ASSERT_EQ(o.cond.size(), o.values) << o.name;
          for (size_t i = 0; i < o.values; ++i)
            ASSERT_NEAR(rc.at(o.name, i), o.cond[i], 1e-12 * o.cond[i]) << o.name << "[" << i << "]";
        }
      }
}

// ---------------------------------------------------------------------------------------------- power
// The CPU path's reduced gradients of a case, the float64 reference and k u cond, output by output.
struct Reduced {
  std::string name;
  std::vector<double> got, ref, bound;
  Tol tol;
};
std::vector<Reduced> reduced_of(const CaseSpec& s) {
  Case c = make_case(s);
  EXPECT_EQ(run_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  EXPECT_EQ(run_bwd(c, cpu_exec(2), true), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const RefBwd g = ref_backward(ref_problem(c), ref_dout(c), true);
  const Tolerances t = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  const bool cx = s.complex;
  const int32_t it = s.itype;
  return {
      {"dA", c.dA.values(), flatten(g.dA, cx), cond_bound(flatten_cond(g.cond_dA, cx)), t.dA},
      {"dB", c.dB.values(), s.var_B ? round_to(flatten(g.dB, cx), it) : flatten(g.dB, cx),
       cond_bound(flatten_cond(g.cond_dB, cx)), t.dB},
      {"dC", c.dC.values(), s.var_C ? round_to(flatten(g.dC, cx), it) : flatten(g.dC, cx),
       cond_bound(flatten_cond(g.cond_dC, cx)), t.dC},
      {"dD", c.dD.values(), g.dD, cond_bound(g.cond_dD), t.dD},
      {"ddelta_bias", c.ddelta_bias.values(), g.dbias, cond_bound(g.cond_dbias), t.ddelta_bias},
  };
}

// Upstream-style problems (A = -0.5 rand, delta = 0.5 rand, 301 steps), real weights, each itype, constant and
// variable B/C.
std::vector<CaseSpec> representative_specs() {
  std::vector<CaseSpec> v;
  uint64_t seed = 1300;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (bool var : {false, true}) {
      CaseSpec s;
      s.dim = 8, s.seqlen = 301, s.dstate = 16, s.itype = it, s.var_B = var, s.var_C = var, s.seed = seed++;
      v.push_back(s);
    }
  return v;
}

// A 1% error in one reduced-gradient element fails the comparison: at the largest element of each output, with
// exactly that element reported. Over all elements, a 1% error is caught wherever upstream's tolerance
// catches it. (fp32 and fp16: with z, bf16's upstream tolerance of the reduced gradients is bf16's output
// tolerance, rtol 3e-2, which a 1% error passes by itself.)
TEST(CpuConditioningBwd, OnePercentErrorInOneElementFails) {
  for (const CaseSpec& s : representative_specs()) {
    if (s.itype == SELSCAN_DTYPE_BFLOAT16) continue;
    for (const Reduced& o : reduced_of(s)) {
      SCOPED_TRACE(o.name + "; " + s.str());
      ASSERT_TRUE(allclose(o.name, o.got, o.ref, o.tol, &o.bound));  // unmodified: passes
      const Caught caught = expect_one_percent_error_caught(o.name, o.got, o.ref, o.tol, &o.bound);
      EXPECT_EQ(caught.with_bound, caught.upstream);
    }
  }
}

// The same on a slowly decaying problem over 4500 steps (CpuMatrix.LongMultiChunk's kind), where the bound is in
// force at some elements: a 1% error at each output's largest element still fails; prints at how many
// positions a 1% error is caught, with and without the bound.
TEST(CpuConditioningBwd, OnePercentErrorOnSlowDecays) {
  uint64_t seed = 1320;
  for (bool cx : {false, true})
    for (bool var : {false, true}) {
      CaseSpec s;
      s.batch = 1, s.dim = 3, s.seqlen = 4500, s.dstate = 4, s.complex = cx, s.var_B = var, s.var_C = var;
      s.slow_decay = true, s.softplus = false, s.seed = seed++;
      for (const Reduced& o : reduced_of(s)) {
        SCOPED_TRACE(o.name + "; " + s.str());
        EXPECT_TRUE(allclose(o.name, o.got, o.ref, o.tol, &o.bound));
        const size_t big = largest_at(o.ref);
        std::vector<double> bad = o.got;
        bad[big] = o.ref[big] * 1.01;
        EXPECT_FALSE(allclose(o.name, bad, o.ref, o.tol, &o.bound)) << "a 1% error at the largest element passed";
        int64_t caught = 0, caught_upstream = 0, loosened = 0;
        for (size_t i = 0; i < o.ref.size(); ++i) {
          const double err = 0.01 * std::fabs(o.ref[i]);
          caught += err > limit_at(o.ref, o.tol, &o.bound, i);
          caught_upstream += err > limit_at(o.ref, o.tol, nullptr, i);
          loosened += o.bound[i] > limit_at(o.ref, o.tol, nullptr, i);
        }
        std::printf("[ power    ] %s %s %s B/C: bound in force at %lld of %zu elements; a 1%% error is caught at %lld "
                    "positions (upstream's tolerance alone: %lld); worst error/limit %.3g\n",
                    o.name.c_str(), cx ? "complex" : "real", var ? "variable" : "constant",
                    static_cast<long long>(loosened), o.ref.size(), static_cast<long long>(caught),
                    static_cast<long long>(caught_upstream), worst_ratio(o.got, o.ref, o.tol, &o.bound));
      }
    }
}

// For upstream-style problems with real weights the rule is upstream's tolerance but for the odd element whose
// terms cancel: of the 59424 reduced-gradient elements of these six cases, k u cond exceeds upstream's limit
// at two (dA[42] of seed 1300 by 1.08x: a slowly decaying state; ddelta_bias[0] of seed 1301 by 2.04x: the
// sum of 9632 terms cancels to -0.84). Pinned, so that a change of the rule that loosens more shows here.
// Complex weights (fast rotations: exp's condition number |δ A| reaches several units) are printed, not pinned.
TEST(CpuConditioningBwd, WellConditionedUnchanged) {
  std::vector<CaseSpec> specs = representative_specs();
  uint64_t seed = 1310;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (bool var : {false, true}) {
      CaseSpec s;
      s.dim = 8, s.seqlen = 301, s.dstate = 16, s.itype = it, s.var_B = var, s.var_C = var, s.seed = seed++;
      s.complex = true, s.has_h0 = true;
      specs.push_back(s);
    }
  int64_t real_loosened = 0, real_total = 0;
  double real_max_raise = 0.0;
  for (const CaseSpec& s : specs) {
    int64_t loosened = 0, total = 0;
    double max_raise = 0.0;
    for (const Reduced& o : reduced_of(s)) {
      SCOPED_TRACE(o.name + "; " + s.str());
      EXPECT_TRUE(allclose(o.name, o.got, o.ref, o.tol, &o.bound));
      for (size_t i = 0; i < o.ref.size(); ++i) {
        const double raise = o.bound[i] / limit_at(o.ref, o.tol, nullptr, i);
        loosened += raise > 1.0;
        max_raise = std::max(max_raise, raise);
        ++total;
      }
    }
    std::printf("[ loosened ] %s: %lld of %lld reduced-gradient elements (k u cond / upstream's limit up to %.3g)\n",
                s.str().c_str(), static_cast<long long>(loosened), static_cast<long long>(total), max_raise);
    if (!s.complex) {
      real_loosened += loosened, real_total += total;
      real_max_raise = std::max(real_max_raise, max_raise);
    }
  }
  std::printf("[ loosened ] real weights: %lld of %lld elements, limit raised up to %.3gx\n",
              static_cast<long long>(real_loosened), static_cast<long long>(real_total), real_max_raise);
  EXPECT_LE(real_loosened, 2);
  EXPECT_LT(real_max_raise, 2.1);
}

}  // namespace
}  // namespace selscan_test
