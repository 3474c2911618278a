#include "cuda/arch.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

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

struct Cached {
  Status status;
  Family family;
  std::string message;
};

std::mutex g_mutex;
std::map<int, Cached> g_cache;

// sm_90 and sm_100 parts have about 227 KB of shared memory per block; sm_80 164 KB; sm_86/89 and the consumer
// Blackwell parts (sm_120) 99 KB, so those take the sm80 family's smaller shared-memory budgets.
Family family_for(int cc) {
  if (cc >= 90 && cc < 120) return Family::sm90;
  return cc >= 80 ? Family::sm80 : Family::generic;
}

Cached decide(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (err == cudaErrorInsufficientDriver)
      return {SELSCAN_STATUS_NO_DEVICE, Family::generic,
              fmt::format("the NVIDIA driver is older than the CUDA runtime this library was built with "
                          "(CUDA {}): update the driver, or rebuild libselscan with an older toolkit preset",
                          SELSCAN_CUDA_VERSION)};
    return {SELSCAN_STATUS_NO_DEVICE, Family::generic,
            fmt::format("no usable CUDA device: {} ({})", cudaGetErrorString(err), static_cast<int>(err))};
  }
  if (device >= count)
    return {SELSCAN_STATUS_NO_DEVICE, Family::generic,
            fmt::format("device {} does not exist: {} CUDA device(s) visible", device, count)};
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return {SELSCAN_STATUS_CUDA_ERROR, Family::generic,
            fmt::format("cudaGetDeviceProperties({}) failed: {}", device, cudaGetErrorString(err))};
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
    return {SELSCAN_STATUS_ARCH_MISMATCH, Family::generic,
            fmt::format("device {} is sm_{} ({}); {}; {}", device, cc, prop.name, carried, rebuild)};

  // Ask the driver which image it really loads (a PTX newer than the driver understands fails here).
  DeviceGuard guard(device);
  if (guard.status() != SELSCAN_STATUS_SUCCESS)
    return {guard.status(), Family::generic, last_error_message()};
  int bin = 0, ptxv = 0;
  const int perr = probe_image(&bin, &ptxv);
  if (perr != cudaSuccess)
    return {SELSCAN_STATUS_ARCH_MISMATCH, Family::generic,
            fmt::format("device {} is sm_{} ({}); {}; the driver could not load a kernel image: {}; {}{}", device,
                        cc, prop.name, carried, cudaGetErrorString(static_cast<cudaError_t>(perr)), rebuild,
                        best_sass < 0 ? " (or update the driver so it can JIT-compile the PTX)" : "")};
  return {SELSCAN_STATUS_SUCCESS, family_for(bin > 0 ? bin : cc), ""};
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

Status select_family(int device, Family* family) {
  Cached c;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_cache.find(device);
    if (it == g_cache.end()) it = g_cache.emplace(device, decide(device)).first;
    c = it->second;
  }
  *family = c.family;
  if (c.status != SELSCAN_STATUS_SUCCESS) return fail(c.status, c.message);
  return SELSCAN_STATUS_SUCCESS;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
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
