// Condition scales of single reduced-gradient elements (tests/gpu/test_gpu_limits.cpp, test_gpu_bwd.cpp), computed
// on demand.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "case.h"
#include "support/reference.h"

namespace selscan_test {

// Condition scales (RefBwd::cond_*, docs/numerics.md) of single elements of a host problem's reduced gradients,
// each from the float64 reference of just the channels and states that element depends on (restrict_problem):
// one channel and one state for dA and constant dB/dC, one channel for dD and ddelta_bias, a group's channels
// and one state for variable dB/dC. Computed on demand and cached, so that elements within upstream's tolerance
// cost nothing, even at a million tokens.
class ReducedCond {
 public:
  explicit ReducedCond(const Case& c) : s_(c.spec), c_(&c) {}
  // A problem already in float64 form: `dout` is the gradient of its final output (out_z with z, else y).
  ReducedCond(const CaseSpec& s, RefProblem p, std::vector<double> dout)
      : s_(s), p_(std::move(p)), dout_(std::move(dout)) {}

  // Element `i` of values() of output `name` (dA, dB, dC, dD or ddelta_bias).
  double at(const std::string& name, size_t i) {
    const CaseSpec& s = s_;
    const int64_t N = s.dstate, L = s.seqlen;
    const bool var = (name == "dB" && s.var_B) || (name == "dC" && s.var_C);
    if (name == "dD" || name == "ddelta_bias") {  // (D), real
      const RefBwd& g = bwd({static_cast<int64_t>(i)}, iota_states());
      return name == "dD" ? g.cond_dD[0] : g.cond_dbias[0];
    }
    const int64_t e = static_cast<int64_t>(s.complex ? i / 2 : i);  // complex: values() interleaves re, im
    if (!var) {  // (D, N)
      const RefBwd& g = bwd({e / N}, {e % N});
      return name == "dA" ? g.cond_dA[0] : name == "dB" ? g.cond_dB[0] : g.cond_dC[0];
    }
    // Variable (Bt, G, N, L) (complex: interleaved along L, and `e` counts complex elements).
    const int64_t t = e % L, n = (e / L) % N, grp = (e / (L * N)) % s.groups, b = e / (L * N * s.groups);
    const int64_t cpg = s.dim / s.groups;
    std::vector<int64_t> ch;
    for (int64_t k = 0; k < cpg; ++k) ch.push_back(grp * cpg + k);
    const RefBwd& g = bwd(ch, {n});
    return (name == "dB" ? g.cond_dB : g.cond_dC)[static_cast<size_t>(b * L + t)];
  }

 private:
  std::vector<int64_t> iota_states() const {
    std::vector<int64_t> v;
    for (int64_t n = 0; n < s_.dstate; ++n) v.push_back(n);
    return v;
  }
  const RefBwd& bwd(const std::vector<int64_t>& ch, const std::vector<int64_t>& st) {
    auto it = cache_.find({ch, st});
    if (it != cache_.end()) return it->second;
    if (p_.u.empty()) {
      p_ = ref_problem(*c_);
      dout_ = ref_dout(*c_);
    }
    return cache_[{ch, st}] = ref_backward(restrict_problem(p_, ch, st), restrict_bdl(p_, dout_, ch), true);
  }

  CaseSpec s_;
  const Case* c_ = nullptr;  // where p_ and dout_ come from when first needed (the first constructor)
  RefProblem p_;
  std::vector<double> dout_;
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, RefBwd> cache_;
};

}  // namespace selscan_test
