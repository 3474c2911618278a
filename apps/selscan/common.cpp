#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>

#include "cli.h"
#include "cuda_driver.h"

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
std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  const DriverState& st = driver_state();
  if (!st.available) return out;
  const Driver& d = driver();
  for (int i = 0; i < st.device_count; ++i) {
    DeviceInfo info;
    info.index = i;
    CUdevice dev = 0;
    if (d.cuDeviceGet(&dev, i) == kCudaSuccess) {
      char name[256] = {};
      if (d.cuDeviceGetName(name, int(sizeof(name)) - 1, dev) == kCudaSuccess) info.name = name;
      d.cuDeviceGetAttribute(&info.sm_major, kAttrComputeMajor, dev);
      d.cuDeviceGetAttribute(&info.sm_minor, kAttrComputeMinor, dev);
      d.cuDeviceGetAttribute(&info.sm_count, kAttrMultiprocessorCount, dev);
      int l2 = 0;
      d.cuDeviceGetAttribute(&l2, kAttrL2CacheSize, dev);
      info.l2_bytes = size_t(l2);
      d.cuDeviceTotalMem(&info.total_mem, dev);
    }
    info.check = selscan_check_device(i);
    if (info.check != SELSCAN_STATUS_SUCCESS) info.check_message = selscan_last_error();
    out.push_back(std::move(info));
  }
  return out;
}

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

// ------------------------------------------------------------------------------------------- timing
bool time_calls(const std::vector<DeviceCase*>& cases, bool forward, int warmup, int iters, Timing* out,
                std::string* err, const std::function<void(int, int)>& progress) {
  out->ms.clear();
  const bool gpu = cases[0]->target().kind == SELSCAN_DEVICE_CUDA;
  auto call = [&](int i) {
    DeviceCase& c = *cases[size_t(i) % cases.size()];
    const bool ok = forward ? c.fwd(err) : c.bwd(err);
    if (progress) progress(i + 1, warmup + iters);
    return ok;
  };
  for (int i = 0; i < warmup; ++i)
    if (!call(i)) return false;
  if (!gpu) {
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!call(warmup + i)) return false;
      const auto t1 = std::chrono::steady_clock::now();
      out->ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  } else {
    const Driver& d = driver();
    std::vector<CUevent> ev(size_t(2 * iters), nullptr);
    bool ok = true;
    for (CUevent& e : ev) {
      const CUresult r = d.cuEventCreate(&e, 0);
      if (r != kCudaSuccess) {
        *err = fmt::format("cuEventCreate: {}", d.error_text(r));
        ok = false;
        break;
      }
    }
    for (int i = 0; ok && i < iters; ++i) {
      DeviceCase& c = *cases[size_t(warmup + i) % cases.size()];
      d.cuEventRecord(ev[size_t(2 * i)], c.stream());
      ok = call(warmup + i);
      d.cuEventRecord(ev[size_t(2 * i + 1)], c.stream());
    }
    if (ok) {
      const CUresult r = d.cuEventSynchronize(ev.back());
      if (r != kCudaSuccess) {
        *err = fmt::format("cuEventSynchronize: {}", d.error_text(r));
        ok = false;
      }
    }
    for (int i = 0; ok && i < iters; ++i) {
      float ms = 0;
      const CUresult r = d.cuEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]);
      if (r != kCudaSuccess) {
        *err = fmt::format("cuEventElapsedTime: {}", d.error_text(r));
        ok = false;
      }
      out->ms.push_back(double(ms));
    }
    for (CUevent e : ev)
      if (e != nullptr) d.cuEventDestroy(e);
    if (!ok) return false;
  }
  std::vector<double> s = out->ms;
  std::sort(s.begin(), s.end());
  out->min = s.empty() ? 0 : s.front();
  out->median = s.empty() ? 0 : (s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]));
  return true;
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
