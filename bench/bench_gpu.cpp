// GPU section: the issue #4 rows, an L sweep and a device-to-device copy that calibrates the memory floor.
// Each call is prepared and timed by BenchRun (support/bench.h; docs/performance.md, "Method"): manual time
// from events around one call per iteration, buffer sets rotated past L2, an untimed call before each timed
// one so host launch latency stays out. Counters come from the median per-call time of all timed iterations;
// --benchmark_repetitions adds the framework's own mean/median/stddev on top. GPU memory, streams and events go
// through the CUDA driver API (support/cuda_driver.h), so this builds without a CUDA toolkit.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.h"
#include "support/cuda_driver.h"
#include "support/device.h"

namespace selscan_bench {
namespace {

using selscan_support::driver;
using selscan_support::kCudaSuccess;

constexpr double kExpPerClkPerSm = 16.0;  // MUFU.EX2 throughput per SM per clock (sm_80 .. sm_90)
constexpr size_t kCopyBytes = size_t{1} << 30;

struct Gpu {
  Target target;
  selscan_support::DeviceInfo info;
  double exp_per_s = 0;         // kExpPerClkPerSm * SMs * peak clock
  double copy_bytes_per_s = 0;  // measured device-to-device copy, read + write counted
};
Gpu g_gpu;

void run_gpu(benchmark::State& state, const std::string& key, const CaseSpec& s, Mode m) {
  std::string err;
  BenchRun* run = cached_run(key, s, m, g_gpu.target, &err);
  if (run == nullptr) {
    state.SkipWithError(err.c_str());
    return;
  }
  std::vector<double> times;
  times.reserve(1024);
  for (auto _ : state) {
    double ms = 0;
    if (!run->timed_call(&ms, &err)) {
      state.SkipWithError(err.c_str());
      break;
    }
    state.SetIterationTime(ms * 1e-3);
    times.push_back(ms * 1e-3);
  }
  if (times.empty()) return;
  const double t = selscan_support::median(times);
  const double bytes = selscan_support::min_bytes(s, m), nexp = s.state_updates();
  state.counters["ms"] = t * 1e3;
  state.counters["ms_min"] = *std::min_element(times.begin(), times.end()) * 1e3;
  state.counters["bytes"] = bytes;
  state.counters["GB_s"] = bytes / t * 1e-9;
  state.counters["exps"] = nexp;
  state.counters["exp_floor_frac"] = nexp / g_gpu.exp_per_s / t;
  if (g_gpu.copy_bytes_per_s > 0) state.counters["mem_floor_frac"] = bytes / g_gpu.copy_bytes_per_s / t;
  // The framework's bytes_per_second (mean-based, over the same minimum bytes) for tools that read only it.
  state.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(times.size()) * bytes));
  state.counters["sets"] = run->sets();
  state.counters["set_MB"] = run->set_bytes() * 1e-6;
  state.SetLabel(benchmark_label(s));
}

// Device-to-device copies of `bytes` (at most a third of the free memory) between two buffers, on a stream of
// their own: the practical memory floor.
class CopyRun {
 public:
  explicit CopyRun(size_t want) {
    const auto& d = driver();
    if (!selscan_support::make_current(g_gpu.target.index, &error)) return;
    size_t free_b = 0, total_b = 0;
    d.cuMemGetInfo(&free_b, &total_b);
    bytes_ = std::min(want, free_b / 3) & ~size_t{4095};
    if (!ok(d.cuMemAlloc(&src_, bytes_), "cuMemAlloc") || !ok(d.cuMemAlloc(&dst_, bytes_), "cuMemAlloc") ||
        !ok(d.cuMemsetD8(src_, 0x3C, bytes_), "cuMemsetD8") ||
        !ok(d.cuStreamCreate(&stream_, selscan_support::kStreamNonBlocking), "cuStreamCreate") ||
        !ok(d.cuEventCreate(&e0_, 0), "cuEventCreate") || !ok(d.cuEventCreate(&e1_, 0), "cuEventCreate") ||
        !ok(d.cuCtxSynchronize(), "cuCtxSynchronize") ||
        !ok(d.cuMemcpyDtoDAsync(dst_, src_, bytes_, stream_), "copy warm-up") ||
        !ok(d.cuStreamSynchronize(stream_), "copy warm-up"))
      return;
  }
  ~CopyRun() {
    const auto& d = driver();
    if (e0_) d.cuEventDestroy(e0_);
    if (e1_) d.cuEventDestroy(e1_);
    if (stream_) d.cuStreamDestroy(stream_);
    if (src_) d.cuMemFree(src_);
    if (dst_) d.cuMemFree(dst_);
  }
  CopyRun(const CopyRun&) = delete;
  CopyRun& operator=(const CopyRun&) = delete;

  size_t bytes() const { return bytes_; }
  // Seconds of one copy (an untimed copy in the other direction runs just before it), < 0 on error.
  double timed_copy() {
    const auto& d = driver();
    float ms = 0;
    if (!ok(d.cuMemcpyDtoDAsync(src_, dst_, bytes_, stream_), "copy") || !ok(d.cuEventRecord(e0_, stream_), "event") ||
        !ok(d.cuMemcpyDtoDAsync(dst_, src_, bytes_, stream_), "copy") || !ok(d.cuEventRecord(e1_, stream_), "event") ||
        !ok(d.cuEventSynchronize(e1_), "timed copy") || !ok(d.cuEventElapsedTime(&ms, e0_, e1_), "elapsed time"))
      return -1;
    return 1e-3 * static_cast<double>(ms);
  }
  std::string error;

 private:
  bool ok(selscan_support::CUresult r, const char* what) {
    if (r != kCudaSuccess && error.empty()) error = std::string(what) + ": " + driver().error_text(r);
    return r == kCudaSuccess;
  }
  size_t bytes_ = 0;
  selscan_support::CUdeviceptr src_ = 0, dst_ = 0;
  selscan_support::CUstream stream_ = nullptr;
  selscan_support::CUevent e0_ = nullptr, e1_ = nullptr;
};

void run_copy(benchmark::State& state) {
  release_cached_run();
  CopyRun c(kCopyBytes);
  if (!c.error.empty()) {
    state.SkipWithError(c.error.c_str());
    return;
  }
  std::vector<double> times;
  for (auto _ : state) {
    const double t = c.timed_copy();
    if (t < 0) {
      state.SkipWithError(c.error.c_str());
      break;
    }
    state.SetIterationTime(t);
    times.push_back(t);
  }
  if (times.empty()) return;
  const double t = selscan_support::median(times), bytes = 2.0 * static_cast<double>(c.bytes());
  state.counters["ms"] = t * 1e3;
  state.counters["bytes"] = bytes;
  state.counters["GB_s"] = bytes / t * 1e-9;
  state.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(times.size()) * bytes));
  state.SetLabel("device-to-device copy, read + write counted");
}

}  // namespace

bool register_gpu_benchmarks(std::string* why) {
  int dev = 0;
  if (const char* env = std::getenv("SELSCAN_BENCH_DEVICE")) dev = std::atoi(env);
  const std::vector<selscan_support::DeviceInfo> devs = selscan_support::list_devices();
  if (devs.empty()) {
    const auto& st = selscan_support::driver_state();
    *why = st.available ? "the driver shows no CUDA device" : st.message;
    return false;
  }
  if (dev < 0 || dev >= static_cast<int>(devs.size())) {
    *why = fmt::format("SELSCAN_BENCH_DEVICE={}, but there are {} CUDA device(s)", dev, devs.size());
    return false;
  }
  const selscan_support::DeviceInfo& info = devs[static_cast<size_t>(dev)];
  if (!info.usable()) {
    *why = fmt::format("device {} not usable: {}: {}", dev, selscan_status_string(info.check), info.check_message);
    return false;
  }
  g_gpu.target.kind = SELSCAN_DEVICE_CUDA;
  g_gpu.target.index = dev;
  g_gpu.info = info;
  g_gpu.exp_per_s = kExpPerClkPerSm * info.sm_count * 1e3 * info.clock_khz;

  // The memory floor of every GPU benchmark: the copy bandwidth measured now, once.
  {
    CopyRun c(kCopyBytes / 2);
    std::vector<double> t;
    for (int i = 0; i < 10 && c.error.empty(); ++i) {
      const double s = c.timed_copy();
      if (s > 0) t.push_back(s);
    }
    if (!t.empty()) g_gpu.copy_bytes_per_s = 2.0 * static_cast<double>(c.bytes()) / selscan_support::median(t);
    else std::fprintf(stderr, "selscan_bench: copy calibration failed (%s); no mem_floor_frac\n", c.error.c_str());
  }
  benchmark::AddCustomContext("gpu_name", info.name);
  benchmark::AddCustomContext("gpu_index", std::to_string(dev));
  benchmark::AddCustomContext("gpu_sms", std::to_string(info.sm_count));
  benchmark::AddCustomContext("gpu_clock_mhz", fmt::format("{:.0f}", info.clock_khz * 1e-3));
  benchmark::AddCustomContext("gpu_l2_mb", fmt::format("{:.1f}", static_cast<double>(info.l2_bytes) * 1e-6));
  benchmark::AddCustomContext("gpu_exp_per_s", fmt::format("{:.0f}", g_gpu.exp_per_s));
  benchmark::AddCustomContext("gpu_d2d_GB_s", fmt::format("{:.1f}", g_gpu.copy_bytes_per_s * 1e-9));

  auto reg = [](const std::string& name, const CaseSpec& s, Mode m) {
    benchmark::RegisterBenchmark(name.c_str(), run_gpu, name, s, m)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  // The issue #4 rows: forward (training: writes x), forward for inference (last_state, no x), backward, and
  // the deterministic backward.
  for (const selscan_support::BenchShape& b : selscan_support::bench_shapes("gpu"))
    for (Mode m : {Mode::fwd, Mode::fwd_infer, Mode::bwd, Mode::bwd_det})
      reg(benchmark_name("gpu", m, b.spec), b.spec, m);
  // L sweep for the time-vs-L plot.
  const std::vector<selscan_support::BenchShape> sweep = selscan_support::bench_shapes("gpu_sweep");
  for (Mode m : {Mode::fwd, Mode::bwd})
    for (const selscan_support::BenchShape& b : sweep) reg(benchmark_name("gpu_sweep", m, b.spec), b.spec, m);
  benchmark::RegisterBenchmark("gpu_copy/d2d/1GiB", run_copy)->UseManualTime()->Unit(benchmark::kMillisecond);
  return true;
}

}  // namespace selscan_bench
