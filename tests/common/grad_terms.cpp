#include "grad_terms.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "compare.h"
#include "positions.h"

namespace selscan_test {

namespace {

constexpr int64_t kChunk = 2048;
constexpr int64_t kBlockChannels = 8;  // variable dB/dC: a warp-scan block's channels

// Running sums of one reduced gradient; each element's blocked sum flushes its block when a term of another block
// arrives.
struct Sums {
  bool cplx = false;
  std::vector<double> sum, abs;
  std::vector<int64_t> n, block;
  std::vector<float> one, part, blocked;

  void init(size_t elements, bool c) {
    cplx = c;
    const size_t k = elements * (c ? 2 : 1);
    sum.assign(k, 0.0), abs.assign(k, 0.0), n.assign(k, 0), block.assign(k, -1);
    one.assign(k, 0.f), part.assign(k, 0.f), blocked.assign(k, 0.f);
  }
  void add1(size_t i, double v, int64_t blk) {
    sum[i] += v;
    abs[i] += std::fabs(v);
    ++n[i];
    const float f = static_cast<float>(v);
    one[i] += f;
    if (block[i] != blk) {
      blocked[i] += part[i];
      part[i] = 0.f;
      block[i] = blk;
    }
    part[i] += f;
  }
  void add(int64_t e, cd v, int64_t blk) {
    if (cplx) {
      add1(static_cast<size_t>(2 * e), v.real(), blk);
      add1(static_cast<size_t>(2 * e + 1), v.imag(), blk);
    } else {
      add1(static_cast<size_t>(e), v.real(), blk);
    }
  }
  TermSums finish() {
    TermSums t;
    for (size_t i = 0; i < sum.size(); ++i) blocked[i] += part[i];
    t.sum = sum, t.abs_sum = abs, t.count = n;
    t.f32_one.assign(one.begin(), one.end());
    t.f32_blocked.assign(blocked.begin(), blocked.end());
    return t;
  }
};

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

const TermSums& GradTerms::of(const std::string& name) const {
  if (name == "dA") return dA;
  if (name == "dB") return dB;
  if (name == "dC") return dC;
  if (name == "dD") return dD;
  if (name == "ddelta_bias") return ddelta_bias;
  throw std::invalid_argument("GradTerms::of: not a reduced gradient: " + name);
}

GradTerms grad_terms(const VarlenCase& c, ChunkFault fault) {
  const VarlenSpec& s = c.spec;
  const int64_t D = s.dim, N = s.dstate, T = c.T(), rows = c.rows();
  const bool cx = s.complex;
  const double kappa = cx ? 2.0 : 1.0;
  const int64_t G = (s.var_B || s.var_C) ? s.groups : 1;
  Sums sA, sB, sC, sD, sbias;
  sA.init(static_cast<size_t>(D * N), cx);
  sB.init(static_cast<size_t>(s.var_B ? rows * G * N * T : D * N), cx);
  sC.init(static_cast<size_t>(s.var_C ? rows * G * N * T : D * N), cx);
  sD.init(static_cast<size_t>(D), false);
  sbias.init(static_cast<size_t>(D), false);

  for (int64_t b = 0; b < s.batch(); ++b) {
    const int64_t L = s.lens[static_cast<size_t>(b)];
    if (s.pad(b) || L == 0) continue;
    std::vector<double> dout;
    const RefProblem p = sequence_problem(c, b, &dout);
    const int64_t t0 = c.start(b), row = s.packed ? 0 : b;
    const bool here = fault.kind != ChunkFault::none && fault.seq == b;
    const int64_t fc0 = fault.chunk * kChunk, fc1 = std::min(L, fc0 + kChunk);  // the faulty chunk's steps
    // Block ids (each element starts a new block where the id of its next term differs): (sequence, chunk, state)
    // for the sums over time; the channel's block of kBlockChannels for variable dB/dC.
    auto tblock = [&](int64_t t, int64_t n) { return (b * ((T + kChunk - 1) / kChunk + 1) + t / kChunk) * N + n; };
    std::vector<double> dt(static_cast<size_t>(L)), sp(static_cast<size_t>(L)), dy(static_cast<size_t>(L));
    std::vector<cd> hist(static_cast<size_t>(L + 1));
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t t = 0; t < L; ++t) {
        const size_t i = static_cast<size_t>(p.bdl(0, d, t));
        const double v = p.delta[i] + (p.has_bias ? p.bias[static_cast<size_t>(d)] : 0.0);
        dt[static_cast<size_t>(t)] = p.softplus ? (v <= 20.0 ? std::log1p(std::exp(v)) : v) : v;
        sp[static_cast<size_t>(t)] = p.softplus ? (v <= 20.0 ? sigmoid(v) : 1.0) : 1.0;
        dy[static_cast<size_t>(t)] = p.has_z ? dout[i] * p.z[i] * sigmoid(p.z[i]) : dout[i];
      }
      auto factor = [&](int64_t t) {
        return here && fault.kind == ChunkFault::scale && t >= fc0 && t < fc1 ? fault.factor : 1.0;
      };
      if (p.has_D)
        for (int64_t t = L - 1; t >= 0; --t)
          sD.add(d, factor(t) * dy[at(t)] * p.u[at(p.bdl(0, d, t))], tblock(t, 0));
      for (int64_t n = 0; n < N; ++n) {
        const cd A = p.A[at(p.dn(d, n))];
        auto Bv = [&](int64_t t) { return p.var_B ? p.B[at(p.bgnl(0, p.group(d), n, t))] : p.B[at(p.dn(d, n))]; };
        auto Cv = [&](int64_t t) { return p.var_C ? p.C[at(p.bgnl(0, p.group(d), n, t))] : p.C[at(p.dn(d, n))]; };
        auto uu = [&](int64_t t) { return p.u[at(p.bdl(0, d, t))]; };
        auto abar = [&](int64_t t) { return std::exp(dt[at(t)] * A); };
        // h after step t from h before it (hist[t + 1] from hist[t]).
        auto step = [&](const std::vector<cd>& h, int64_t t) {
          return abar(t) * h[at(t)] + Bv(t) * (dt[at(t)] * uu(t));
        };
        hist[0] = p.has_h0 ? p.h0[at(p.bdn(0, d, n))] : cd(0.0);
        for (int64_t t = 0; t < L; ++t) hist[at(t + 1)] = step(hist, t);
        // The states the backward recomputes: a wrong seed changes them inside the faulty chunk only (the next
        // chunk is seeded from x again).
        std::vector<cd> hb = hist;
        if (here && fc0 > 0 && fc0 < L &&
            (fault.kind == ChunkFault::zero_seed || fault.kind == ChunkFault::next_seed)) {
          hb[at(fc0)] = fault.kind == ChunkFault::zero_seed ? cd(0.0) : hist[at(fc1)];
          for (int64_t t = fc0; t < fc1; ++t) hb[at(t + 1)] = step(hb, t);
        }
        cd carry = 0.0;
        for (int64_t t = L - 1; t >= 0; --t) {
          if (here && fault.kind == ChunkFault::no_carry && fc0 > 0 && t == fc0 - 1) carry = 0.0;
          const size_t ts = static_cast<size_t>(t);
          const cd a = abar(t), Bt = Bv(t);
          const cd dh = kappa * dy[ts] * std::conj(Cv(t)) + carry;
          const double f = factor(t);
          const int64_t blk = tblock(t, n);
          sA.add(p.dn(d, n), f * std::conj(dt[ts] * a) * dh * std::conj(hb[ts]), blk);
          const cd tB = f * dh * (dt[ts] * uu(t));
          const cd tC = f * kappa * dy[ts] * std::conj(hb[ts + 1]);
          const int64_t vi = ((row * G + p.group(d)) * N + n) * T + t0 + t;  // variable dB/dC element
          if (p.var_B) sB.add(vi, tB, d / kBlockChannels);
          else sB.add(p.dn(d, n), tB, blk);
          if (p.var_C) sC.add(vi, tC, d / kBlockChannels);
          else sC.add(p.dn(d, n), tC, blk);
          if (p.has_bias) {
            sbias.add(d, f * sp[ts] * (dh * std::conj(Bt)).real() * uu(t), blk);
            sbias.add(d, f * sp[ts] * (std::conj(A * a) * dh * std::conj(hb[ts])).real(), blk);
          }
          carry = std::conj(a) * dh;
        }
      }
    }
  }
  GradTerms g;
  g.dA = sA.finish();
  g.dB = sB.finish();
  g.dC = sC.finish();
  if (s.has_D) g.dD = sD.finish();
  if (s.has_delta_bias) g.ddelta_bias = sbias.finish();
  return g;
}

namespace {

// `reduced`: check_varlen's limit includes k u cond.
GradCondition measure(const std::string& name, const std::vector<double>& got, const std::vector<double>& ref,
                      Tol tol, const std::vector<double>& cond, const TermSums* t, bool reduced) {
  GradCondition m;
  m.name = name;
  m.elements = static_cast<int64_t>(got.size());
  double worst_up = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    const double up = tol.atol + tol.rtol * std::fabs(ref[i]);
    const double uc = kU32 * cond[i];
    m.max_err = std::max(m.max_err, err);
    m.over_upstream = std::max(m.over_upstream, err / up);
    m.over_check = std::max(m.over_check, err / (reduced ? std::max(up, kCondK * uc) : up));
    if (uc > 0) m.over_cond = std::max(m.over_cond, err / uc);
    if (t != nullptr && t->abs_sum[i] > 0) {
      const double us = kU32 * t->abs_sum[i];
      m.over_abs_sum = std::max(m.over_abs_sum, err / us);
      m.over_sqrt_n = std::max(m.over_sqrt_n, err / (us * std::sqrt(static_cast<double>(t->count[i]))));
    }
    if (err / up > worst_up) {
      worst_up = err / up;
      m.at = static_cast<int64_t>(i), m.got = got[i], m.ref = ref[i], m.cond = cond[i];
      m.abs_sum = t != nullptr ? t->abs_sum[i] : 0.0;
      m.terms = t != nullptr ? t->count[i] : 0;
    }
  }
  return m;
}

}  // namespace

std::vector<GradCondition> gradient_conditions(const VarlenCase& c, const VarlenRef& r, const GradTerms* t,
                                               bool extra) {
  const VarlenSpec& s = c.spec;
  const Tolerances tol = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  std::vector<GradCondition> rows;
  auto per_step = [&](const char* name, const Tensor& got, const std::vector<double>& ref, Tol t,
                      const std::vector<double>& cond) {
    rows.push_back(measure(name, got.values(), ref, t, cond, nullptr, false));
  };
  per_step("du", c.du, round_to(r.du, s.itype), tol.du, r.cond_du);
  per_step("ddelta", c.ddelta, round_to(r.ddelta, s.itype), tol.ddelta, r.cond_ddelta);
  if (s.has_z) per_step("dz", c.dz, round_to(r.dz, s.itype), tol.dz, r.cond_dz);
  if (c.dh0.present()) per_step("dh0", c.dh0, r.dh0, tol.dh0, r.cond_dh0);
  for (const auto& [name, got] : varlen_reduced(c)) {
    const std::vector<double> ref = varlen_reduced_ref(c, r, name);
    const std::vector<double>& cond = name == "dA"   ? r.cond_dA
                                      : name == "dB" ? r.cond_dB
                                      : name == "dC" ? r.cond_dC
                                      : name == "dD" ? r.cond_dD
                                                     : r.cond_ddelta_bias;
    const TermSums* ts = t != nullptr ? &t->of(name) : nullptr;
    rows.push_back(measure(name, got, ref, tol_of(tol, name), cond, ts, true));
    if (extra && ts != nullptr) {
      rows.push_back(measure(name + " f32 one", ts->f32_one, ts->sum, tol_of(tol, name), cond, ts, true));
      rows.push_back(measure(name + " f32 blocked", ts->f32_blocked, ts->sum, tol_of(tol, name), cond, ts, true));
    }
  }
  return rows;
}

std::string format_conditions(const std::vector<GradCondition>& rows) {
  std::ostringstream os;
  char line[400];
  std::snprintf(line, sizeof line, "%-20s %8s %11s %9s %9s %9s %9s %9s | %7s %12s %12s %11s %11s %6s\n", "gradient",
                "elements", "max|err|", "err/upst", "err/chk", "err/ucond", "err/uS", "err/uSrn", "at", "got", "ref",
                "S=sum|T|", "cond", "n");
  os << line;
  for (const GradCondition& m : rows) {
    std::snprintf(line, sizeof line,
                  "%-20s %8lld %11.4g %9.3g %9.3g %9.3g %9.3g %9.3g | %7lld %12.7g %12.7g %11.4g %11.4g %6lld\n",
                  m.name.c_str(), static_cast<long long>(m.elements), m.max_err, m.over_upstream, m.over_check,
                  m.over_cond, m.over_abs_sum, m.over_sqrt_n, static_cast<long long>(m.at), m.got, m.ref, m.abs_sum,
                  m.cond, static_cast<long long>(m.terms));
    os << line;
  }
  os << "err/upst: |err| / (atol + rtol |ref|); err/chk: / check_varlen's limit (reduced gradients: max(that, k u "
        "cond), k = "
     << kCondK << "); err/ucond: / (u cond); err/uS: / (u sum|T|); err/uSrn: / (u sum|T| sqrt(n)); u = 2^-24; each "
                  "the max over elements; at..n: the element of largest err/upst\n";
  return os.str();
}

}  // namespace selscan_test
