#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "cli.h"

namespace selscan_cli {

// ------------------------------------------------------------------------------------------- options
bool Options::next(std::string* name) {
  if (!err_.empty() || i_ >= args_.size()) return false;
  const std::string& a = args_[i_++];
  has_inline_ = false;
  inline_value_.clear();
  if (a.rfind("--", 0) != 0 || a.size() < 3) {
    err_ = fmt::format("unexpected argument '{}'", a);
    return false;
  }
  const size_t eq = a.find('=');
  if (eq != std::string::npos) {
    name_ = a.substr(0, eq);
    inline_value_ = a.substr(eq + 1);
    has_inline_ = true;
  } else {
    name_ = a;
  }
  *name = name_;
  return true;
}

bool Options::value(std::string* v) {
  if (has_inline_) {
    *v = inline_value_;
    has_inline_ = false;
    return true;
  }
  if (i_ >= args_.size() || args_[i_].rfind("--", 0) == 0) {
    err_ = fmt::format("{} needs a value", name_);
    return false;
  }
  *v = args_[i_++];
  return true;
}

bool Options::int_value(int64_t lo, int64_t hi, int64_t* v) {
  std::string s;
  if (!value(&s)) return false;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
    err_ = fmt::format("{} wants an integer in [{}, {}], got '{}'", name_, lo, hi, s);
    return false;
  }
  *v = x;
  return true;
}

// ------------------------------------------------------------------------------------------- devices
namespace {
std::string device_label(const DeviceInfo& d) {
  return fmt::format("cuda:{} ({}, sm_{}{})", d.index, d.name, d.sm_major, d.sm_minor);
}
}  // namespace

bool pick_target(const std::string& opt, Target* t, std::string* label, std::string* note, std::string* err) {
  t->kind = SELSCAN_DEVICE_CPU;
  t->index = 0;
  if (opt == "cpu") {
    *label = "cpu";
    return true;
  }
  const std::vector<DeviceInfo> devs = list_devices();
  if (opt.empty() || opt == "auto" || opt == "cuda") {
    for (const DeviceInfo& d : devs) {
      if (!d.usable()) continue;
      t->kind = SELSCAN_DEVICE_CUDA;
      t->index = d.index;
      *label = device_label(d);
      return true;
    }
    std::string why;
    if (!driver_state().available) why = driver_state().message;
    else if (devs.empty()) why = "the driver shows no CUDA device";
    else why = fmt::format("device {}: {}", devs[0].index, devs[0].check_message);
    if (opt == "cuda") {
      *err = fmt::format("--device cuda: no usable CUDA device ({})", why);
      return false;
    }
    *label = "cpu";
    *note = fmt::format("no usable CUDA device, running on the CPU ({})", why);
    return true;
  }
  if (opt.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    const long idx = std::strtol(opt.c_str() + 5, &end, 10);
    if (end == opt.c_str() + 5 || *end != '\0' || idx < 0) {
      *err = fmt::format("bad --device '{}': expected cpu, cuda or cuda:N", opt);
      return false;
    }
    if (idx >= long(devs.size())) {
      *err = fmt::format("--device {}: there are {} CUDA device(s){}", opt, devs.size(),
                         driver_state().available ? "" : " (" + driver_state().message + ")");
      return false;
    }
    const DeviceInfo& d = devs[size_t(idx)];
    if (!d.usable()) {
      *err = fmt::format("--device {}: {}", opt, d.check_message);
      return false;
    }
    t->kind = SELSCAN_DEVICE_CUDA;
    t->index = int32_t(idx);
    *label = device_label(d);
    return true;
  }
  *err = fmt::format("bad --device '{}': expected cpu, cuda or cuda:N", opt);
  return false;
}

// ------------------------------------------------------------------------------------------- reference
namespace {

// support/reference.h's view of a contiguous case (real weights, no h0).
RefProblem ref_problem(const CaseSpec& s, const HostData& in) {
  RefProblem p;
  p.Bt = s.batch, p.D = s.dim, p.L = s.seqlen, p.N = s.dstate;
  p.G = (s.var_B || s.var_C) ? s.groups : 1;
  p.var_B = s.var_B, p.var_C = s.var_C, p.softplus = s.softplus;
  p.has_D = s.has_D, p.has_z = s.has_z, p.has_bias = s.has_delta_bias;
  auto reals = [&](int t) { return std::vector<double>(in.v[t].begin(), in.v[t].end()); };
  auto complexes = [&](int t) { return std::vector<cd>(in.v[t].begin(), in.v[t].end()); };
  p.u = reals(kU);
  p.delta = reals(kDelta);
  if (s.has_z) p.z = reals(kZ);
  p.A = complexes(kA);
  p.B = complexes(kB);
  p.C = complexes(kC);
  if (s.has_D) p.Dv = reals(kD);
  if (s.has_delta_bias) p.bias = reals(kBias);
  return p;
}

}  // namespace

void reference_forward_backward(const CaseSpec& s, const HostData& in, Reference* ref, int threads) {
  const RefProblem p = ref_problem(s, in);
  const RefFwd f = ref_forward(p, false, threads);
  const RefBwd g = ref_backward(p, std::vector<double>(in.v[kDout].begin(), in.v[kDout].end()), false, threads);
  for (std::vector<double>& v : ref->v) v.clear();
  ref->v[kOut] = f.y;
  ref->v[kOutZ] = f.out_z;
  if (s.with_x) ref->v[kX] = ref_x_values(f, p);
  if (s.with_last_state) ref->v[kLast] = flatten(f.last_state, false);
  ref->v[kDu] = g.du;
  ref->v[kDdelta] = g.ddelta;
  ref->v[kDA] = flatten(g.dA, false);
  ref->v[kDB] = flatten(g.dB, false);
  ref->v[kDC] = flatten(g.dC, false);
  if (s.has_D) ref->v[kDD] = g.dD;
  ref->v[kDz] = g.dz;
  if (s.has_delta_bias) ref->v[kDbias] = g.dbias;
}

double reference_gradient_check(const CaseSpec& full, int directions, uint64_t seed) {
  CaseSpec s = full;
  s.batch = std::min<int64_t>(s.batch, 2);
  s.dim = s.groups * std::min<int64_t>(s.dim / s.groups, 2);
  s.seqlen = std::min<int64_t>(s.seqlen, 150);
  s.dstate = std::min<int64_t>(s.dstate, 4);
  s.itype = SELSCAN_DTYPE_FLOAT32;
  const HostData in = make_inputs(s, seed);
  return ref_gradient_check(ref_problem(s, in), std::vector<double>(in.v[kDout].begin(), in.v[kDout].end()),
                            directions, seed + 1);
}

// ------------------------------------------------------------------------------------------- agreement
namespace {

template <typename R>
Agreement compare_impl(const std::string& name, const std::vector<float>& got, const std::vector<R>& ref,
                       double tol) {
  Agreement a;
  a.name = name;
  a.tol = tol;
  if (got.size() != ref.size()) {
    a.score = std::numeric_limits<double>::infinity();
    a.max_abs = a.score;
    return a;
  }
  double ss = 0;
  for (const R& r : ref) ss += double(r) * double(r);
  const double rms = ref.empty() ? 0.0 : std::sqrt(ss / double(ref.size()));
  const double floor = rms > 0 ? rms : 1e-30;
  bool finite = true;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = double(ref[i]);
    if (!std::isfinite(g)) {
      finite = false;
      continue;
    }
    const double e = std::fabs(g - r);
    a.max_abs = std::max(a.max_abs, e);
    a.score = std::max(a.score, e / (std::fabs(r) + floor));
  }
  if (!finite) {
    a.score = std::numeric_limits<double>::infinity();
    a.max_abs = a.score;
  }
  a.pass = finite && a.score <= tol;
  return a;
}

}  // namespace

Agreement compare(const std::string& name, const std::vector<float>& got, const std::vector<double>& ref,
                  double tol) {
  return compare_impl(name, got, ref, tol);
}
Agreement compare(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
                  double tol) {
  return compare_impl(name, got, ref, tol);
}

double tolerance(int32_t itype) {
  switch (itype) {
    case SELSCAN_DTYPE_FLOAT16: return 5e-3;   // 2^-11 rounding of every itype output, with room
    case SELSCAN_DTYPE_BFLOAT16: return 3e-2;  // 2^-8 rounding, with room
    default: return 2e-4;                      // fp32 accumulation over long sequences (float64: ~1e-6)
  }
}

// ------------------------------------------------------------------------------------------- checks
bool CaseCheck::pass() const {
  if (!ran) return false;
  for (const Agreement& a : vs_ref)
    if (!a.pass) return false;
  for (const Agreement& a : vs_other)
    if (!a.pass) return false;
  return true;
}

CaseCheck check_case(const std::string& label, const CaseSpec& s, const Target& target, const HostData& in,
                     const Reference& ref, const HostData* other, const std::string& other_name) {
  CaseCheck r;
  r.label = label;
  r.device = target.name();
  DeviceCase dc;
  std::string err;
  if (!dc.init(s, target, in, &err) || !dc.fwd(&err) || !dc.bwd(&err) || !dc.sync(&err)) {
    r.error = err;
    return r;
  }
  static const int kChecked[] = {kOut, kOutZ, kX, kLast, kDu, kDdelta, kDA, kDB, kDC, kDD, kDz, kDbias};
  for (int t : kChecked) {
    if (!layout(s, t).present) continue;
    if (!dc.fetch(t, &r.outputs, &err)) {
      r.error = err;
      return r;
    }
  }
  r.ran = true;
  const double tol = tolerance(s.itype);
  for (int t : kChecked) {
    if (!layout(s, t).present) continue;
    r.vs_ref.push_back(compare(tensor_name(t), r.outputs.v[t], ref.v[t], tol));
    if (other != nullptr)
      r.vs_other.push_back(compare(std::string(tensor_name(t)) + " vs " + other_name, r.outputs.v[t],
                                   other->v[t], tol));
  }
  return r;
}

std::string sci(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : "inf";
  return fmt::format("{:.2e}", v);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace selscan_cli
