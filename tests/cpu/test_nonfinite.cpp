// NaN and Inf through the CPU path: one non-finite element in u, delta, B, C, z (and D, delta_bias, h0, dout),
// and an explosive A (positive, large delta) whose states overflow float32 but not float64. Every output is
// compared with the float64 oracle position by position: where the oracle is finite the library must agree
// within upstream's tolerances; where it is NaN the library must be NaN; where it is +-Inf the library must be
// the same infinity; where it is finite but beyond the output dtype's range the library must be non-finite.
// Nothing may hang or crash, and every output element is written (no poison left).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"

namespace selscan_test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Largest finite value of an output dtype (fp32 for weights and complex).
double max_finite(int32_t dtype) {
  switch (dtype) {
    case SELSCAN_DTYPE_FLOAT16: return 65504.0;
    case SELSCAN_DTYPE_BFLOAT16: return 3.3895313892515355e38;
    default: return std::numeric_limits<float>::max();
  }
}

struct Tally {
  int64_t finite = 0, nan = 0, inf = 0, overflow = 0;
  int64_t other_kind = 0;  // non-finite where the oracle is, but NaN for Inf or the other way round
};

// Positions compared in the current test (printed at its end, for docs/reliability.md).
Tally& totals() {
  static Tally t;
  return t;
}
struct PrintTotals {
  PrintTotals() { totals() = Tally{}; }
  ~PrintTotals() {
    const Tally& t = totals();
    std::printf("[ positions ] finite %lld, NaN %lld, Inf %lld, beyond float32/itype range %lld; non-finite of the "
                "other kind (NaN for Inf or back) %lld\n",
                static_cast<long long>(t.finite), static_cast<long long>(t.nan), static_cast<long long>(t.inf),
                static_cast<long long>(t.overflow), static_cast<long long>(t.other_kind));
  }
};

// Position-by-position comparison (`pairs`: complex values stored re, im; a complex value counts as non-finite
// when either part is, as in C's Annex G: a NaN in one part legitimately reaches both parts of a product).
// `big`: with an explosive A, float32 intermediates overflow long before float64 ones, so where the oracle's
// magnitude is beyond `big` the library may be non-finite (of either kind: +inf + -inf is NaN in float32 where
// float64 still sums two finite values), and finite values must still be close.
::testing::AssertionResult compare(const std::string& what, const std::vector<double>& got,
                                   const std::vector<double>& ref, Tol tol, int32_t dtype, Tally& tally,
                                   double big = kInf, bool pairs = false) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, oracle " << ref.size();
  const double top = max_finite(dtype);
  int64_t bad = 0;
  std::ostringstream os;
  auto note = [&](size_t i, const char* why) {
    if (++bad <= 5) os << "\n  [" << i << "] got " << got[i] << ", oracle " << ref[i] << ": " << why;
  };
  const size_t step = pairs ? 2 : 1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    const size_t i0 = i - i % step;
    bool ref_nonfinite = false, got_nonfinite = false;
    for (size_t k = i0; k < i0 + step && k < got.size(); ++k) {
      ref_nonfinite = ref_nonfinite || !std::isfinite(ref[k]);
      got_nonfinite = got_nonfinite || !std::isfinite(got[k]);
    }
    if (pairs && ref_nonfinite) {
      ++(std::isinf(r) ? tally.inf : tally.nan);
      if (!got_nonfinite) note(i, "oracle's complex value non-finite, library's finite");
      else if (std::isnan(r) != std::isnan(g) || (std::isinf(g) && g != r)) ++tally.other_kind;
    } else if (!std::isfinite(r)) {
      ++(std::isnan(r) ? tally.nan : tally.inf);
      if (std::isfinite(g)) note(i, "oracle non-finite, library finite");
      else if (std::isnan(r) != std::isnan(g) || (std::isinf(g) && g != r)) {
        if (++tally.other_kind <= 3 && std::getenv("SELSCAN_NONFINITE_VERBOSE"))
          std::printf("  %s[%zu]: library %g, oracle %g\n", what.c_str(), i, g, r);
      }
    } else if (std::fabs(r) > top) {
      ++tally.overflow;
      if (std::isfinite(g)) note(i, "oracle beyond the dtype's range, library finite");
    } else if (std::fabs(r) > big) {
      ++tally.overflow;  // float32 intermediates overflowed: any value, finite ones must still be close
      if (std::isfinite(g) && !(std::fabs(g - r) <= tol.atol + tol.rtol * std::fabs(r))) note(i, "finite but far");
    } else {
      ++tally.finite;
      if (!(std::fabs(g - r) <= tol.atol + tol.rtol * std::fabs(r))) note(i, "outside tolerance");
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " positions disagree"
                                       << os.str();
}

// What a test does to a fresh case before running it (inject a value; change A and delta).
using Edit = std::function<void(Case&)>;

// Runs fwd + bwd through the public ABI and compares every output with the oracle. Returns the tallies so a
// test can insist that non-finite values really occurred.
// `values` = false: only run and check that every output is written (for inputs whose float64 meaning is not
// the float32 recurrence's; see ComplexInfiniteDelta).
Tally run_and_compare(const CaseSpec& spec, const Edit& edit, double big = kInf, bool values = true) {
  SCOPED_TRACE(spec.str());
  Case c = make_case(spec);
  edit(c);
  const selscan_exec_t exec = cpu_exec(2);
  Tally tally;
  EXPECT_EQ(run_fwd(c, exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (auto& [name, t] : c.named_fwd_outputs()) {
    const std::string err = t->check_written(kPoison, kPoison);
    EXPECT_TRUE(err.empty()) << name << ": " << err;
  }
  const RefProblem rp = ref_problem(c);
  const RefFwd f = ref_forward(rp);
  Tolerances tol = upstream_tolerances(spec.itype, spec.has_z, spec.var_B, spec.var_C);
  const int32_t it = spec.itype, wt = spec.complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const bool cx = spec.complex;
  if (!values) {
    EXPECT_EQ(run_bwd(c, exec, true), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    for (auto& [name, t] : c.named_bwd_outputs()) {
      const std::string err = t->check_written(kPoison, kPoison);
      EXPECT_TRUE(err.empty()) << name << ": " << err;
    }
    return tally;
  }
  struct AddToTotals {
    Tally& t;
    ~AddToTotals() {
      Tally& a = totals();
      a.finite += t.finite, a.nan += t.nan, a.inf += t.inf, a.overflow += t.overflow, a.other_kind += t.other_kind;
    }
  } add_to_totals{tally};
  EXPECT_TRUE(compare("out", c.out.values(), f.y, tol.out, it, tally, big));
  if (spec.has_z) EXPECT_TRUE(compare("out_z", c.out_z.values(), f.out_z, tol.out, it, tally, big));
  if (spec.with_last_state)
    EXPECT_TRUE(compare("last_state", c.last_state.values(), flatten(f.last_state, cx), tol.last_state, wt, tally, big, cx));
  if (spec.with_x) EXPECT_TRUE(compare("x", c.x.values(), ref_x_values(f, c), tol.x, wt, tally, big, cx));

  EXPECT_EQ(run_bwd(c, exec, true), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (auto& [name, t] : c.named_bwd_outputs()) {
    const std::string err = t->check_written(kPoison, kPoison);
    EXPECT_TRUE(err.empty()) << name << ": " << err;
  }
  const RefBwd g = ref_backward(rp, ref_dout(c));
  EXPECT_TRUE(compare("du", c.du.values(), g.du, tol.du, it, tally, big));
  EXPECT_TRUE(compare("ddelta", c.ddelta.values(), g.ddelta, tol.ddelta, it, tally, big));
  EXPECT_TRUE(compare("dA", c.dA.values(), flatten(g.dA, cx), tol.dA, wt, tally, big, cx));
  EXPECT_TRUE(compare("dB", c.dB.values(), flatten(g.dB, cx), tol.dB, spec.var_B ? it : wt, tally, big, cx));
  EXPECT_TRUE(compare("dC", c.dC.values(), flatten(g.dC, cx), tol.dC, spec.var_C ? it : wt, tally, big, cx));
  if (spec.has_D) EXPECT_TRUE(compare("dD", c.dD.values(), g.dD, tol.dD, SELSCAN_DTYPE_FLOAT32, tally, big));
  if (spec.has_delta_bias)
    EXPECT_TRUE(compare("ddelta_bias", c.ddelta_bias.values(), g.dbias, tol.ddelta_bias, SELSCAN_DTYPE_FLOAT32, tally, big));
  if (spec.has_z) {
    // dz is formed from the forward's stored `out` (itype), as upstream: where y is beyond the itype's range
    // that input is infinite, so the library's dz is non-finite where the oracle (float64 y) is not.
    std::vector<double> dz_ref = g.dz;
    for (size_t i = 0; i < dz_ref.size(); ++i)
      if (std::isfinite(f.y[i]) && std::fabs(f.y[i]) > max_finite(it)) dz_ref[i] = kInf;
    EXPECT_TRUE(compare("dz", c.dz.values(), dz_ref, tol.dz, it, tally, big));
  }
  if (c.dh0.present()) EXPECT_TRUE(compare("dh0", c.dh0.values(), flatten(g.dh0, cx), tol.dh0, wt, tally, big, cx));
  return tally;
}

CaseSpec base_spec(uint64_t seed) {
  CaseSpec s;
  s.batch = 2, s.dim = 4, s.seqlen = 40, s.dstate = 8, s.groups = 2;
  s.seed = seed;
  return s;
}

const char* value_name(double v) { return std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

// One element of u, delta, z or dout (b = 1, d = 2, t = 13) set to NaN / +Inf / -Inf, with and without softplus
// and z, real and complex weights, each itype.
TEST(NonFinite, ActivationsAndDout) {
  PrintTotals print_totals;
  uint64_t seed = 9100;
  for (const char* which : {"u", "delta", "z", "dout"})
    for (double v : {kNaN, kInf, -kInf})
      for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16})
        for (bool cx : {false, true})
          for (bool sp : {false, true}) {
            CaseSpec s = base_spec(seed++);
            s.itype = it, s.complex = cx, s.softplus = sp;
            s.has_z = true;
            SCOPED_TRACE(std::string(which) + " = " + value_name(v));
            const bool values = !(cx && std::string(which) == "delta" && v > 0);  // see ComplexInfiniteDelta
            const Tally t = run_and_compare(
                s,
                [&](Case& c) {
                  Tensor& x = std::string(which) == "u" ? c.u : std::string(which) == "delta" ? c.delta
                              : std::string(which) == "z" ? c.z : c.dout;
                  x.set({1, 2, 13}, v);
                },
                kInf, values);
            // softplus(-inf) = 0: a step with delta 0, everything finite (and compared above).
            const bool finite_expected = std::string(which) == "delta" && v < 0 && sp;
            if (values && !finite_expected) EXPECT_GT(t.nan + t.inf, 0) << which << ": no non-finite value reached any output";
            if (finite_expected) EXPECT_EQ(t.nan + t.inf, 0);
            if (::testing::Test::HasFailure()) return;
          }
}

// Variable B and C (one element of group 1, state 3, step 21; complex: the real or imaginary half), and
// constant B and C (channel 1, state 2).
TEST(NonFinite, BAndC) {
  PrintTotals print_totals;
  uint64_t seed = 9200;
  for (const char* which : {"B", "C"})
    for (bool var : {true, false})
      for (double v : {kNaN, kInf, -kInf})
        for (bool cx : {false, true}) {
          CaseSpec s = base_spec(seed++);
          s.complex = cx;
          s.var_B = std::string(which) == "B" ? var : true;
          s.var_C = std::string(which) == "C" ? var : true;
          if (!s.var_B && !s.var_C) s.groups = 1;
          // x holds h / B for constant B (upstream's convention): the oracle divides its infinite h by the
          // infinite B (NaN) where the library never multiplied by B. That quotient is not defined; skip x.
          if (!s.var_B) s.with_x = false;
          SCOPED_TRACE(std::string(which) + (var ? " variable = " : " constant = ") + value_name(v));
          const Tally t = run_and_compare(s, [&](Case& c) {
            Tensor& x = std::string(which) == "B" ? c.B : c.C;
            if (var) x.set({1, 1, 3, cx ? 2 * 21 + 1 : 21}, v);
            else if (cx) x.setc({1, 2}, cd(v, 0.5));
            else x.set({1, 2}, v);
          });
          EXPECT_GT(t.nan + t.inf, 0) << which << ": no non-finite value reached any output";
          if (::testing::Test::HasFailure()) return;
        }
}

// The (D,) and (Bt, D, N) inputs: D, delta_bias, h0, and A itself.
TEST(NonFinite, WeightsAndInitialState) {
  PrintTotals print_totals;
  uint64_t seed = 9300;
  for (const char* which : {"D", "delta_bias", "h0", "A"})
    for (double v : {kNaN, kInf, -kInf})
      for (bool cx : {false, true}) {
        CaseSpec s = base_spec(seed++);
        s.complex = cx, s.has_h0 = true, s.softplus = std::string(which) != "delta_bias" || v != -kInf;
        SCOPED_TRACE(std::string(which) + " = " + value_name(v));
        const bool values = !(cx && std::string(which) == "delta_bias" && v > 0);  // see ComplexInfiniteDelta
        const Tally t = run_and_compare(
            s,
            [&](Case& c) {
              const std::string w = which;
              if (w == "D") c.D.set({1}, v);
              else if (w == "delta_bias") c.delta_bias.set({3}, v);
              else if (w == "h0") c.h0.setc({0, 1, 2}, cd(v, 0.0));
              else c.A.setc({2, 1}, cx ? cd(v, 1.0) : cd(v, 0.0));
            },
            kInf, values);
        if (values) EXPECT_GT(t.nan + t.inf, 0) << which << ": no non-finite value reached any output";
        if (::testing::Test::HasFailure()) return;
      }
}

// An explosive A: positive decay rates with large delta grow the state by up to e^5.5 per step, so float32
// overflows within a few dozen steps while float64 stays finite (e^(5.5*64) << e^709). Where the oracle is
// within float32's range (early steps, late-step gradients) the library must agree; beyond it, non-finite.
TEST(NonFinite, ExplosiveA) {
  PrintTotals print_totals;
  uint64_t seed = 9400;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16})
    for (bool cx : {false, true})
      for (bool var : {true, false}) {
        CaseSpec s;
        s.batch = 1, s.dim = 3, s.seqlen = 64, s.dstate = 8;
        s.itype = it, s.complex = cx, s.var_B = var, s.var_C = var;
        s.softplus = false, s.has_delta_bias = false;
        s.delta_lo = 4.0, s.delta_hi = 8.0;
        s.seed = seed++;
        // Finite float32 results computed through overflowing neighbours are not comparable to the oracle
        // beyond ~1e30 (a float32 sum next to an infinity): those positions must merely be written.
        const Tally t = run_and_compare(
            s,
            [&](Case& c) {
              for (int64_t d = 0; d < s.dim; ++d)
                for (int64_t n = 0; n < s.dstate; ++n)
                  c.A.setc({d, n}, cd(0.25 + 0.0625 * n, cx ? 1.0 : 0.0));
            },
            1e30);
        EXPECT_GT(t.overflow, 0) << "the states never left float32's range";
        EXPECT_GT(t.finite, 0) << "no position was comparable";
        if (::testing::Test::HasFailure()) return;
      }
}

// Non-finite values across a chunk boundary (L > 2048, x carries the states into the backward) and with many
// threads: NaN from step 2040 of one channel must reach every later step of that channel only.
TEST(NonFinite, AcrossChunks) {
  PrintTotals print_totals;
  for (double v : {kNaN, kInf}) {
    CaseSpec s;
    s.batch = 1, s.dim = 3, s.seqlen = 2100, s.dstate = 8, s.slow_decay = true, s.seed = 9500;
    SCOPED_TRACE(value_name(v));
    const Tally t = run_and_compare(s, [&](Case& c) { c.u.set({0, 1, 2040}, v); });
    EXPECT_GT(t.nan + t.inf, 0);
    if (::testing::Test::HasFailure()) return;
  }
}

// Complex A with delta = +Inf: the library forms the decay as upstream does, 2^(delta Re A log2 e) times
// (cos, sin)(delta Im A) = 0 * NaN = NaN, where float64 complex exp (C Annex G) gives the limit 0. So the
// oracle is not the reference here; what must hold is that the NaN stays in that channel and every output
// is written: other channels agree with the oracle.
TEST(NonFinite, ComplexInfiniteDelta) {
  PrintTotals print_totals;
  CaseSpec s = base_spec(9700);
  s.complex = true, s.softplus = true, s.has_z = true;
  Case c = make_case(s);
  c.delta.set({1, 2, 13}, kInf);
  ASSERT_EQ(run_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(run_bwd(c, cpu_exec(2), true), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (auto& [name, t] : c.named_bwd_outputs()) EXPECT_TRUE(t->check_written(kPoison, kPoison).empty()) << name;
  const RefProblem rp = ref_problem(c);
  const RefFwd f = ref_forward(rp);
  const RefBwd g = ref_backward(rp, ref_dout(c));
  const Tolerances tol = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  // Per-(b, d) rows of out and du: every row but (1, 2) finite and close; row (1, 2) NaN from step 13 on.
  const std::vector<double> out = c.out.values(), du = c.du.values();
  Tally tally;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t d = 0; d < s.dim; ++d) {
      const size_t r0 = static_cast<size_t>((b * s.dim + d) * s.seqlen), r1 = r0 + static_cast<size_t>(s.seqlen);
      const std::vector<double> o(out.begin() + r0, out.begin() + r1), fo(f.y.begin() + r0, f.y.begin() + r1);
      const std::vector<double> u(du.begin() + r0, du.begin() + r1), gu(g.du.begin() + r0, g.du.begin() + r1);
      if (b == 1 && d == 2) {
        for (int64_t t = 13; t < s.seqlen; ++t) EXPECT_TRUE(std::isnan(o[static_cast<size_t>(t)])) << "out step " << t;
        continue;
      }
      EXPECT_TRUE(compare("out row", o, fo, tol.out, s.itype, tally));
      EXPECT_TRUE(compare("du row", u, gu, tol.du, s.itype, tally));
    }
}

// dstate not a multiple of 8: the CPU kernels pad the states to 8-lane vectors. Those padding lanes must stay
// inert: an infinite delta*u (B = 0 there: 0 * inf = NaN) or an infinite delta (A = 0 there: inf * 0 = NaN)
// must not turn the real lanes' +-inf into NaN or, worse, reach finite positions through the backward's sums.
TEST(NonFinite, PaddedStatesStayInert) {
  PrintTotals print_totals;
  uint64_t seed = 9600;
  for (int64_t N : {5, 12})
    for (const char* which : {"u", "delta"})
      for (bool cx : {false, true}) {
        if (cx && std::string(which) == "delta") continue;  // see ComplexInfiniteDelta
        CaseSpec s = base_spec(seed++);
        s.dstate = N, s.complex = cx, s.softplus = false;
        SCOPED_TRACE(std::string(which) + " = +Inf, dstate " + std::to_string(N));
        run_and_compare(s, [&](Case& c) { (std::string(which) == "u" ? c.u : c.delta).set({1, 2, 13}, kInf); });
      }
}

}  // namespace
}  // namespace selscan_test
