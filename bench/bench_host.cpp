// Host-cost section: what one selscan_fwd / selscan_bwd call costs the calling CPU thread on the GPU path, measured
// with the GPU kept busy so that only the host side is seen (issue #12's C-ABI targets: 5 us forward, 10 us
// backward). Names: host/<fwd|bwd>/<itype>/<shape> times the calls; host_query/<fwd|bwd>/... times the
// workspace-size query, i.e. validation and kernel choice without a launch.
//
// Method (host/...): each iteration first enqueues filler work on the call's stream (device memsets, long enough to
// outlast the batch), records an event after it, then times kCalls API calls with a steady clock; the iteration's
// time is the batch's mean per call. The event must still be pending when the batch ends: otherwise the GPU ran dry
// and a call may have waited for it, so the batch is discarded and the filler doubled. kCalls stays far below the
// depth of the launch queue (a full queue makes the enqueuing thread wait). Counters: `us`, the median per-call
// microseconds over the iterations (`us_min` the fastest), and `retries`, the discarded batches.
// host_floor/<op> times one bare enqueued operation the same way (an empty kernel through the runtime and through the
// driver, one with an argument as large as the scan kernels', one with 100 KB of dynamic shared memory, a 4 KB and a
// 2 MB memset: bench/host_floor.cu), so a call's time splits into the runtime's launches and
// the library's own work.
//
// The section registers itself when the library sees a CUDA device (SELSCAN_BENCH_DEVICE picks it, default 0);
// otherwise it says why on stderr and registers nothing.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_common.h"
#include "support/abi.h"
#if defined(SELSCAN_WITH_CUDA) && SELSCAN_WITH_CUDA
#  include "host_floor.h"
#endif

#if defined(SELSCAN_WITH_CUDA) && SELSCAN_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace selscan_bench {
namespace {

constexpr int kCalls = 32;                   // API calls per timed batch (a backward enqueues up to 5 operations)
constexpr size_t kFillerBytes = 256u << 20;  // one filler memset
constexpr double kMinBusySeconds = 2e-3;     // the filler outlasts at least this, and 4x the last batch
constexpr int kMaxFillerOps = 128;           // with kCalls, far below the launch queue's depth
constexpr int kMaxRetries = 6;
constexpr int kBatches = 50;                 // timed batches of calls (each batch also runs on the GPU afterwards)
constexpr int kQueryBatches = 1000;          // timed batches of workspace queries

std::string cuda_msg(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

int bench_device() {
  const char* env = std::getenv("SELSCAN_BENCH_DEVICE");
  return env != nullptr ? std::atoi(env) : 0;
}

// One shape's buffers (a single set, support/device.h: the timed calls all use it), its stream and the GPU filler.
class HostFixture {
 public:
  std::string error;  // non-empty: setup failed

  HostFixture(const CaseSpec& s, bool bwd) : s_(s), bwd_(bwd) { error = setup(); }
  // Bare operations instead of library calls (the host_floor rows); the shape's buffers are set up all the same.
  HostFixture(const CaseSpec& s, FloorOp op) : s_(s), bwd_(false), floor_(true), op_(op) { error = setup(); }
  ~HostFixture() {
    if (busy_) cudaEventDestroy(busy_);
    if (stream_) cudaStreamDestroy(stream_);
    if (filler_) cudaFree(filler_);
  }

  selscan_status_t call() {
    if (floor_)
      return floor_op(op_, stream_, filler_) == cudaSuccess ? SELSCAN_STATUS_SUCCESS : SELSCAN_STATUS_CUDA_ERROR;
    return bwd_ ? selscan_bwd(&case_.bwd_args(), &case_.exec()) : selscan_fwd(&case_.fwd_args(), &case_.exec());
  }
  selscan_status_t query(size_t* bytes) {
    return bwd_ ? selscan_bwd_workspace_size(&case_.bwd_args(), &case_.exec(), bytes)
                : selscan_fwd_workspace_size(&case_.fwd_args(), &case_.exec(), bytes);
  }

  // Seconds per call of one batch with the GPU busy; < 0 with `error` set on failure.
  double timed_batch(int* retries) {
    for (int attempt = 0; attempt <= kMaxRetries; ++attempt) {
      for (int i = 0; i < filler_ops_; ++i) cudaMemsetAsync(filler_, i & 0xff, kFillerBytes, stream_);
      cudaEventRecord(busy_, stream_);
      const auto t0 = std::chrono::steady_clock::now();
      selscan_status_t st = SELSCAN_STATUS_SUCCESS;
      for (int k = 0; k < kCalls && st == SELSCAN_STATUS_SUCCESS; ++k) st = call();
      const auto t1 = std::chrono::steady_clock::now();
      const bool still_busy = cudaEventQuery(busy_) == cudaErrorNotReady;
      (void)cudaGetLastError();  // a pending query is not an error
      const cudaError_t e = cudaStreamSynchronize(stream_);
      if (st != SELSCAN_STATUS_SUCCESS) {
        error = selscan_support::status_text(st);
        return -1;
      }
      if (e != cudaSuccess) {
        error = cuda_msg("batch", e);
        return -1;
      }
      const double batch = std::chrono::duration<double>(t1 - t0).count();
      // Next filler: long enough for kMinBusySeconds and for 4x this batch.
      const double want = std::max(kMinBusySeconds, 4 * batch);
      if (still_busy) {
        filler_ops_ = std::clamp(static_cast<int>(std::ceil(want / op_seconds_)), 1, kMaxFillerOps);
        return batch / kCalls;
      }
      ++*retries;
      filler_ops_ = std::min(2 * filler_ops_, kMaxFillerOps);
    }
    error = "the GPU ran dry before every batch ended: the filler could not keep it busy";
    return -1;
  }

 private:
  CaseSpec s_;
  bool bwd_;
  bool floor_ = false;
  FloorOp op_ = FloorOp::empty_launch;
  selscan_support::DeviceCase case_;
  void* filler_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t busy_ = nullptr;
  int filler_ops_ = 8;
  double op_seconds_ = 1e-4;  // one filler memset, measured in setup

  std::string setup() {
    cudaError_t e = cudaSetDevice(bench_device());
    if (e != cudaSuccess) return cuda_msg("cudaSetDevice", e);
    if ((e = cudaMalloc(&filler_, kFillerBytes)) != cudaSuccess) return cuda_msg("cudaMalloc", e);
    if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess)
      return cuda_msg("cudaStreamCreate", e);
    if ((e = cudaEventCreate(&busy_)) != cudaSuccess) return cuda_msg("cudaEventCreate", e);

    // The buffers, the argument structs over them and a workspace for both calls; the calls go to our stream.
    Target target;
    target.kind = SELSCAN_DEVICE_CUDA;
    target.index = bench_device();
    selscan_support::DeviceCase::Options opt;
    opt.backward = bwd_;
    opt.stream = reinterpret_cast<selscan_support::CUstream>(stream_);  // the runtime's and driver's handles agree
    std::string err;
    if (!case_.init(selscan_support::spec_for(s_, bwd_ ? Mode::bwd : Mode::fwd), target, opt, &err) ||
        !selscan_support::fill_bench_inputs(case_, &err))
      return err;
    // The outputs' poison went through the legacy stream, which our non-blocking one does not wait for.
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return cuda_msg("setup", e);
    if (bwd_ && !case_.fwd(&err)) return err;  // the backward's out and x

    // Warm-up: module load, the device's first-call checks, the kernels' shared-memory limits.
    for (int i = 0; i < 3; ++i)
      if (const selscan_status_t st = call(); st != SELSCAN_STATUS_SUCCESS)
        return selscan_support::status_text(st);
    if ((e = cudaStreamSynchronize(stream_)) != cudaSuccess) return cuda_msg("warm-up", e);

    // One filler memset's duration sizes the filler.
    cudaEvent_t e0 = nullptr;
    if ((e = cudaEventCreate(&e0)) != cudaSuccess) return cuda_msg("cudaEventCreate", e);
    constexpr int kCalibrationOps = 8;
    cudaEventRecord(e0, stream_);
    for (int i = 0; i < kCalibrationOps; ++i) cudaMemsetAsync(filler_, i, kFillerBytes, stream_);
    cudaEventRecord(busy_, stream_);
    e = cudaEventSynchronize(busy_);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, busy_);
    cudaEventDestroy(e0);
    if (e != cudaSuccess) return cuda_msg("filler calibration", e);
    op_seconds_ = std::max(1e-6, 1e-3 * ms / kCalibrationOps);
    filler_ops_ = std::clamp(static_cast<int>(std::ceil(kMinBusySeconds / op_seconds_)), 1, kMaxFillerOps);
    return "";
  }
};

// Runs `measure` (seconds per call, < 0 on failure) once per iteration and reports the per-call median. Each
// benchmark runs a fixed number of iterations, so the framework calls it once and its buffers are freed before the
// next one (they would otherwise shrink the GPU section's buffer rotation).
template <typename Measure>
void run(benchmark::State& state, HostFixture& fx, Measure measure) {
  if (!fx.error.empty()) {
    state.SkipWithError(fx.error.c_str());
    return;
  }
  std::vector<double> per_call;
  for (auto _ : state) {
    const double t = measure();
    if (t < 0) {
      state.SkipWithError(fx.error.c_str());
      break;
    }
    state.SetIterationTime(t);
    per_call.push_back(t);
  }
  if (per_call.empty()) return;
  state.counters["us"] = selscan_support::median(per_call) * 1e6;
  state.counters["us_min"] = *std::min_element(per_call.begin(), per_call.end()) * 1e6;
  state.counters["calls"] = kCalls;
}

// Timed batches of the fixture's calls (library calls or bare operations), with the discarded batches counted.
void time_batches(benchmark::State& state, HostFixture& fx, const std::string& label) {
  int retries = 0;
  run(state, fx, [&] { return fx.timed_batch(&retries); });
  state.counters["retries"] = retries;
  state.SetLabel(label);
}

void run_calls(benchmark::State& state, CaseSpec s, bool bwd) {
  HostFixture fx(s, bwd);
  time_batches(state, fx, benchmark_label(s) + "; GPU kept busy");
}

// The workspace-size query: validation and kernel choice, no launch.
void run_query(benchmark::State& state, CaseSpec s, bool bwd) {
  HostFixture fx(s, bwd);
  run(state, fx, [&] {
    size_t bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    selscan_status_t st = SELSCAN_STATUS_SUCCESS;
    for (int k = 0; k < kCalls && st == SELSCAN_STATUS_SUCCESS; ++k) st = fx.query(&bytes);
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(bytes);
    if (st != SELSCAN_STATUS_SUCCESS) {
      fx.error = selscan_support::status_text(st);
      return -1.0;
    }
    return std::chrono::duration<double>(t1 - t0).count() / kCalls;
  });
}

bool register_host_benchmarks() {
  int32_t count = 0;
  if (selscan_cuda_device_count(&count) != SELSCAN_STATUS_SUCCESS || count <= bench_device()) {
    std::fprintf(stderr, "selscan_bench: host-cost benchmarks skipped: CUDA device %d not visible\n", bench_device());
    return false;
  }
  for (const FloorOp op :
       {FloorOp::empty_launch, FloorOp::driver_launch, FloorOp::large_args_launch, FloorOp::smem_launch,
        FloorOp::memset, FloorOp::large_memset}) {
    const CaseSpec s = selscan_support::bench_shapes("host").front().spec;
    benchmark::RegisterBenchmark((std::string("host_floor/") + floor_op_name(op)).c_str(),
                                 [s, op](benchmark::State& state) {
                                   HostFixture fx(s, op);
                                   time_batches(state, fx, "one bare operation; GPU kept busy");
                                 })
        ->UseManualTime()
        ->Iterations(kBatches)
        ->Unit(benchmark::kMicrosecond);
  }
  // The "host" shapes of support/bench_shapes.def (bf16, variable B/C, D, z, delta_bias, softplus).
  for (const char* section : {"host", "host_query"})
    for (const selscan_support::BenchShape& b : selscan_support::bench_shapes("host"))
      for (const bool bwd : {false, true}) {
        const CaseSpec& s = b.spec;
        const std::string name = benchmark_name(section, bwd ? Mode::bwd : Mode::fwd, s);
        const bool calls = std::string(section) == "host";
        benchmark::RegisterBenchmark(name.c_str(), calls ? run_calls : run_query, s, bwd)
            ->UseManualTime()
            ->Iterations(calls ? kBatches : kQueryBatches)
            ->Unit(benchmark::kMicrosecond);
      }
  return true;
}

// Registered before main() runs the framework, like BENCHMARK(); registration asks the library for devices.
const bool g_registered = register_host_benchmarks();

}  // namespace
}  // namespace selscan_bench

#endif  // SELSCAN_WITH_CUDA
