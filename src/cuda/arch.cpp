#include "cuda/arch.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "build_info.h"

namespace selscan::cuda {
namespace {

struct Target {
  int num = 0;            // 90 for sm_90 / 90a
  bool specific = false;  // the 'a' suffix: runs only on exactly that compute capability
  std::string name;       // "90a"
};

std::vector<Target> parse_targets(const char* list) {
  std::vector<Target> out;
  std::string s(list);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(';', pos);
    if (end == std::string::npos) end = s.size();
    std::string tok = s.substr(pos, end - pos);
    if (!tok.empty()) {
      Target t;
      t.name = tok;
      t.specific = tok.back() == 'a' || tok.back() == 'f';
      t.num = std::atoi(tok.c_str());
      if (tok.back() == 'f') t.specific = false;  // family targets run on the same major, >= minor
      out.push_back(t);
    }
    pos = end + 1;
  }
  return out;
}

std::string join(const std::vector<Target>& ts, const char* prefix) {
  std::string r;
  for (const auto& t : ts) r += fmt::format("{}{}{}", r.empty() ? "" : ", ", prefix, t.name);
  return r;
}

bool sass_runs(const Target& t, int cc) {
  if (t.specific) return t.num == cc;
  return t.num / 10 == cc / 10 && t.num <= cc;
}

// One device's decision, made once. The table covers the ordinals any machine has; ordinals past it are looked up
// in g_far under the lock (a slow path no real configuration takes).
struct Entry {
  std::atomic<bool> ready{false};
  Status status = SELSCAN_STATUS_SUCCESS;
  std::string message;
  DeviceProps props;
};
constexpr int kTableDevices = 64;
Entry g_table[kTableDevices];
std::mutex g_mutex;  // held only while a device is decided (and on the slow path)
std::map<int, Entry> g_far;

// "13.0" from 13000.
std::string cuda_version_text(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }

// How to get a build that this driver (supporting CUDA `driver_major`.x) runs.
std::string older_build_hint(int driver_major) {
  if (driver_major >= 12)
    return fmt::format("CUDA 12.x builds run on R{}+ drivers: `cmake --workflow --preset cuda-12.4` (or cuda-12.8), "
                       "or `pip install` from source with a CUDA 12.x nvcc on PATH", driver_floor(12));
  if (driver_major == 11)
    return fmt::format("CUDA 11.8 builds run on R{}+ drivers: `cmake --workflow --preset cuda-11.8`, or `pip install` "
                       "from source with CUDA 11.8's nvcc on PATH", driver_floor(11));
  return fmt::format("the oldest build this project supports, CUDA 11.8, needs R{}+", driver_floor(11));
}

// The message for a failed cudaGetDeviceCount. The runtime says "insufficient driver" both when libcuda cannot be
// loaded at all and when the driver is older than the runtime; cudaDriverGetVersion tells them apart (0: no driver).
std::string no_device_message(cudaError_t err) {
  int dv = 0;
  if (cudaDriverGetVersion(&dv) != cudaSuccess) {
    (void)cudaGetLastError();
    dv = 0;
  }
  const int floor = driver_floor(CUDART_VERSION / 1000);
  const std::string need = floor > 0 ? fmt::format("an NVIDIA driver of branch R{} or newer", floor)
                                     : std::string("a newer NVIDIA driver");
  if (dv <= 0 && (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice))
    return fmt::format("no NVIDIA driver found (libcuda.so.1 could not be loaded): this libselscan was built with the "
                       "CUDA {} runtime and needs {}; the CPU path (SELSCAN_DEVICE_CPU) needs none",
                       SELSCAN_CUDA_VERSION, need);
  if (err == cudaErrorInsufficientDriver)
    return fmt::format("the NVIDIA driver supports CUDA {} but this libselscan was built with the CUDA {} runtime, "
                       "which needs {}: update the driver, or build libselscan for this driver ({})",
                       cuda_version_text(dv), SELSCAN_CUDA_VERSION, need, older_build_hint(dv / 1000));
  return fmt::format("no usable CUDA device: {} ({})", cudaGetErrorString(err), static_cast<int>(err));
}

// Whether this build serves `device`, and its properties. Runs once per device.
void decide(int device, Entry* e) {
  const auto reject = [&](Status s, std::string msg) {
    e->status = s;
    e->message = std::move(msg);
  };
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return reject(SELSCAN_STATUS_NO_DEVICE, no_device_message(err));
  }
  if (device < 0 || device >= count)
    return reject(SELSCAN_STATUS_NO_DEVICE,
                  fmt::format("device {} does not exist: {} CUDA device(s) visible", device, count));
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return reject(SELSCAN_STATUS_CUDA_ERROR,
                  fmt::format("cudaGetDeviceProperties({}) failed: {}", device, cudaGetErrorString(err)));
  }
  const int cc = prop.major * 10 + prop.minor;
  const auto sass = parse_targets(SELSCAN_CUDA_SASS);
  const auto ptx = parse_targets(SELSCAN_CUDA_PTX);
  int best_sass = -1, best_ptx = -1;
  for (const auto& t : sass)
    if (sass_runs(t, cc) && t.num > best_sass) best_sass = t.num;
  for (const auto& t : ptx)
    if ((t.specific ? t.num == cc : t.num <= cc) && t.num > best_ptx) best_ptx = t.num;

  const std::string carried =
      fmt::format("this library carries {}{} and {}", sass.empty() ? "no SASS" : "", join(sass, "sm_"),
                  best_ptx < 0 ? (ptx.empty() ? "no PTX" : fmt::format("no usable PTX ({})", join(ptx, "compute_")))
                               : fmt::format("PTX {}", join(ptx, "compute_")));
  const std::string rebuild = fmt::format("rebuild with SELSCAN_CUDA_ARCH_LIST='{}.{}'", prop.major, prop.minor);
  if (best_sass < 0 && best_ptx < 0)
    return reject(SELSCAN_STATUS_ARCH_MISMATCH,
                  fmt::format("device {} is sm_{} ({}); {}; {}", device, cc, prop.name, carried, rebuild));

  // Ask the driver which image it really loads (a PTX newer than the driver understands fails here).
  DeviceGuard guard(device);
  if (guard.status() != SELSCAN_STATUS_SUCCESS) return reject(guard.status(), last_error_message());
  int bin = 0, ptxv = 0;
  const int perr = probe_image(&bin, &ptxv);
  if (perr != cudaSuccess)
    return reject(SELSCAN_STATUS_ARCH_MISMATCH,
                  fmt::format("device {} is sm_{} ({}); {}; the driver could not load a kernel image: {}; {}{}",
                              device, cc, prop.name, carried, cudaGetErrorString(static_cast<cudaError_t>(perr)),
                              rebuild, best_sass < 0 ? " (or update the driver so it can JIT-compile the PTX)" : ""));
  e->status = SELSCAN_STATUS_SUCCESS;
  e->props.ordinal = device;
  e->props.cc = cc;
  e->props.sms = prop.multiProcessorCount;
  e->props.smem_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  e->props.ptx = ptxv;
}

Status read(const Entry& e, const DeviceProps** props) {
  if (e.status != SELSCAN_STATUS_SUCCESS) return fail(e.status, e.message);
  *props = &e.props;
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  cudaError_t err = cudaGetDevice(&previous_);
  if (err == cudaSuccess && previous_ != device) {
    err = cudaSetDevice(device);
    switched_ = err == cudaSuccess;
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    status_ = fail(SELSCAN_STATUS_CUDA_ERROR,
                   fmt::format("could not make CUDA device {} current: {}", device, cudaGetErrorString(err)));
  }
}

DeviceGuard::~DeviceGuard() {
  if (switched_) (void)cudaSetDevice(previous_);
}

Status device_props(int device, const DeviceProps** props) {
  if (device >= 0 && device < kTableDevices) {
    Entry& e = g_table[device];
    if (!e.ready.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (!e.ready.load(std::memory_order_relaxed)) {
        decide(device, &e);
        e.ready.store(true, std::memory_order_release);
      }
    }
    return read(e, props);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  Entry& e = g_far[device];
  if (!e.ready.load(std::memory_order_relaxed)) {
    decide(device, &e);
    e.ready.store(true, std::memory_order_relaxed);
  }
  return read(e, props);
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

int driver_floor(int cuda_major) {
  switch (cuda_major) {
    case 13: return 580;
    case 12: return 525;
    case 11: return 450;
    default: return 0;
  }
}

std::string carried_targets() {
  const auto sass = parse_targets(SELSCAN_CUDA_SASS);
  const auto ptx = parse_targets(SELSCAN_CUDA_PTX);
  std::string r = "SASS";
  for (const auto& t : sass) r += " sm_" + t.name;
  if (sass.empty()) r += " none";
  r += "; PTX";
  for (const auto& t : ptx) r += " compute_" + t.name;
  if (ptx.empty()) r += " none";
  return r;
}

}  // namespace selscan::cuda
