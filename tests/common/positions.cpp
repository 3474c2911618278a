#include "positions.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace selscan_test {

std::vector<ExplosiveCase> explosive_cases() {
  std::vector<ExplosiveCase> v;
  uint64_t seed = 67000;
  int k = 0;
  for (int64_t L : {64, 2100})
    for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16})
      for (bool cx : {false, true})
        for (bool var : {true, false}) {
          ++k;
          CaseSpec s;
          s.batch = 1, s.dim = 3, s.seqlen = L, s.dstate = 8;
          s.itype = it, s.complex = cx, s.var_B = var, s.var_C = var;
          s.softplus = false, s.has_delta_bias = false;
          s.delta_lo = 4.0, s.delta_hi = 8.0;
          s.seed = ++seed;
          v.push_back({s, k % 2 == 0});
        }
  return v;
}

void set_explosive_A(Case& c) {
  const CaseSpec& s = c.spec;
  for (int64_t d = 0; d < s.dim; ++d)
    for (int64_t n = 0; n < s.dstate; ++n)
      c.A.setc({d, n}, cd(s.seqlen == 64 ? 0.25 + 0.0625 * n : 0.0125, s.complex ? 1.0 : 0.0));
}

::testing::AssertionResult same_positions(const std::string& what, const std::vector<double>& gpu,
                                          const std::vector<double>& cpu, Tol tol, bool pairs,
                                          const std::vector<double>* band, Outcome& o,
                                          const std::vector<double>* bound) {
  if (gpu.size() != cpu.size())
    return ::testing::AssertionFailure() << what << ": GPU " << gpu.size() << " values, CPU " << cpu.size();
  if (band && band->size() != gpu.size())
    return ::testing::AssertionFailure() << what << ": oracle " << band->size() << " values, GPU " << gpu.size();
  if (bound && bound->size() != gpu.size())
    return ::testing::AssertionFailure() << what << ": bound " << bound->size() << " values, GPU " << gpu.size();
  const size_t step = pairs ? 2 : 1;
  int64_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i + step <= gpu.size(); i += step) {
    bool gnf = false, cnf = false, skip = false, kind = false;
    for (size_t k = i; k < i + step; ++k) {
      gnf = gnf || !std::isfinite(gpu[k]);
      cnf = cnf || !std::isfinite(cpu[k]);
      kind = kind || (std::isnan(gpu[k]) != std::isnan(cpu[k])) || (std::isinf(gpu[k]) && gpu[k] != cpu[k]);
      if (band && std::isfinite((*band)[k]) && std::fabs((*band)[k]) > kBig) skip = true;
    }
    if (skip) {
      ++o.indeterminate;
      continue;
    }
    if (gnf != cnf) {
      if (++bad <= 5)
        os << "\n  [" << i << "] GPU " << gpu[i] << (pairs ? "," + std::to_string(gpu[i + 1]) : "") << ", CPU "
           << cpu[i] << (pairs ? "," + std::to_string(cpu[i + 1]) : "") << ": non-finite on one path only";
      continue;
    }
    if (gnf) {
      ++o.nonfinite;
      if (kind) ++o.kind_differs;
      continue;
    }
    ++o.finite;
    for (size_t k = i; k < i + step; ++k) {
      const double lim = tol.atol + tol.rtol * std::fabs(cpu[k]);
      if (!(std::fabs(gpu[k] - cpu[k]) <= (bound ? std::max(lim, (*bound)[k]) : lim))) {
        if (++bad <= 5) {
          os << "\n  [" << k << "] GPU " << gpu[k] << ", CPU " << cpu[k] << ": outside tolerance";
          if (bound) os << " (2 k u cond " << (*bound)[k] << ")";
        }
        break;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " positions disagree" << os.str();
}

Tol tol_of(const Tolerances& t, const std::string& name) {
  if (name == "x") return t.x;
  if (name == "last_state") return t.last_state;
  if (name == "du") return t.du;
  if (name == "ddelta") return t.ddelta;
  if (name == "dA") return t.dA;
  if (name == "dB") return t.dB;
  if (name == "dC") return t.dC;
  if (name == "dD") return t.dD;
  if (name == "dz") return t.dz;
  if (name == "ddelta_bias") return t.ddelta_bias;
  if (name == "dh0") return t.dh0;
  return t.out;  // out, out_z, out_z(bwd)
}

std::vector<double> oracle_of(const std::string& name, const Case& c, const RefFwd& f, const RefBwd& g) {
  const bool cx = c.spec.complex;
  std::vector<double> v;
  if (name == "out") v = f.y;
  else if (name == "out_z" || name == "out_z(bwd)") v = f.out_z;
  else if (name == "x") v = ref_x_values(f, c);
  else if (name == "last_state") v = flatten(f.last_state, cx);
  else if (name == "du") v = g.du;
  else if (name == "ddelta") v = g.ddelta;
  else if (name == "dA") v = flatten(g.dA, cx);
  else if (name == "dB") v = flatten(g.dB, cx);
  else if (name == "dC") v = flatten(g.dC, cx);
  else if (name == "dD") v = g.dD;
  else if (name == "ddelta_bias") v = g.dbias;
  else if (name == "dz") v = g.dz;
  else if (name == "dh0") v = flatten(g.dh0, cx);
  if (name == "dz" || name == "out_z" || name == "out_z(bwd)")
    for (size_t i = 0; i < v.size() && i < f.y.size(); ++i)
      if (std::isfinite(f.y[i]) && std::fabs(f.y[i]) > std::fabs(v[i])) v[i] = f.y[i];
  return v;
}

std::vector<double> cond_bound_of(const std::string& name, const Case& c, const RefFwd& f, const RefBwd& g,
                                  double scale) {
  const bool cx = c.spec.complex;
  if (name == "out") return cond_bound(f.cond_y, scale);
  if (name == "out_z" || name == "out_z(bwd)") return cond_bound(f.cond_out_z, scale);
  if (name == "x") return cond_bound(ref_x_cond(f, c), scale);
  if (name == "last_state") return cond_bound(flatten_cond(f.cond_last_state, cx), scale);
  if (name == "du") return cond_bound(g.cond_du, scale);
  if (name == "ddelta") return cond_bound(g.cond_ddelta, scale);
  if (name == "dz") return cond_bound(g.cond_dz, scale);
  if (name == "dh0") return cond_bound(flatten_cond(g.cond_dh0, cx), scale);
  if (name == "dA") return cond_bound(flatten_cond(g.cond_dA, cx), scale);
  if (name == "dB") return cond_bound(flatten_cond(g.cond_dB, cx), scale);
  if (name == "dC") return cond_bound(flatten_cond(g.cond_dC, cx), scale);
  if (name == "dD") return cond_bound(g.cond_dD, scale);
  if (name == "ddelta_bias") return cond_bound(g.cond_dbias, scale);
  throw std::invalid_argument("cond_bound_of: no condition scale for output " + name);
}

}  // namespace selscan_test
