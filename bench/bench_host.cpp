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
//
// The section registers itself when the library sees a CUDA device (SELSCAN_BENCH_DEVICE picks it, default 0);
// otherwise it says why on stderr and registers nothing.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_common.h"

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

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench_device() {
  const char* env = std::getenv("SELSCAN_BENCH_DEVICE");
  return env != nullptr ? std::atoi(env) : 0;
}

// One shape's buffers (a single set: the timed calls all use it), its stream and the GPU filler.
class HostFixture {
 public:
  std::string error;  // non-empty: setup failed

  HostFixture(const Shape& s, bool bwd) : s_(s), bwd_(bwd) { error = setup(); }
  ~HostFixture() {
    if (busy_) cudaEventDestroy(busy_);
    if (stream_) cudaStreamDestroy(stream_);
    for (void* p : ptrs_) cudaFree(p);
  }

  selscan_status_t call() { return bwd_ ? selscan_bwd(&bwd_args_, &ex_) : selscan_fwd(&fwd_args_, &ex_); }
  selscan_status_t query(size_t* bytes) {
    return bwd_ ? selscan_bwd_workspace_size(&bwd_args_, &ex_, bytes)
                : selscan_fwd_workspace_size(&fwd_args_, &ex_, bytes);
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
        error = status_message(st);
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
  Shape s_;
  bool bwd_;
  std::vector<void*> ptrs_;
  void* filler_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t busy_ = nullptr;
  selscan_exec_t ex_ = SELSCAN_EXEC_INIT;
  selscan_fwd_args_t fwd_args_{};
  selscan_bwd_args_t bwd_args_{};
  int filler_ops_ = 8;
  double op_seconds_ = 1e-4;  // one filler memset, measured in setup

  void* alloc(int64_t bytes, std::string* err) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (e != cudaSuccess) {
      if (err->empty()) *err = cuda_msg("cudaMalloc", e);
      return nullptr;
    }
    ptrs_.push_back(p);
    if (cudaMemset(p, 0, static_cast<size_t>(std::max<int64_t>(bytes, 1))) != cudaSuccess && err->empty())
      *err = "cudaMemset failed";
    return p;
  }

  std::string setup() {
    cudaError_t e = cudaSetDevice(bench_device());
    if (e != cudaSuccess) return cuda_msg("cudaSetDevice", e);
    std::string err;
    const Sizes z(s_);
    Buffers b;
    for (void** p : {&b.u, &b.delta, &b.z, &b.out, &b.out_z}) *p = alloc(z.btl, &err);
    for (void** p : {&b.B, &b.C}) *p = alloc(z.bc, &err);
    b.A = alloc(z.dn, &err);
    for (void** p : {&b.D, &b.bias}) *p = alloc(z.dvec, &err);
    b.x = alloc(z.x, &err);
    if (bwd_) {
      for (void** p : {&b.dout, &b.du, &b.ddelta, &b.dz}) *p = alloc(z.btl, &err);
      for (void** p : {&b.dB, &b.dC}) *p = alloc(z.bc, &err);
      b.dA = alloc(z.dn, &err);
      for (void** p : {&b.dD, &b.dbias}) *p = alloc(z.dvec, &err);
    }
    filler_ = alloc(static_cast<int64_t>(kFillerBytes), &err);
    if (!err.empty()) return err;
    if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess)
      return cuda_msg("cudaStreamCreate", e);
    if ((e = cudaEventCreate(&busy_)) != cudaSuccess) return cuda_msg("cudaEventCreate", e);

    fwd_args_ = fwd_args(s_, b, /*with_x=*/true, /*with_last_state=*/false);
    bwd_args_ = bwd_args(s_, b, /*deterministic=*/false);
    ex_.device_kind = SELSCAN_DEVICE_CUDA;
    ex_.device_index = bench_device();
    ex_.stream = stream_;
    size_t ws = 0;
    if (const selscan_status_t st = query(&ws); st != SELSCAN_STATUS_SUCCESS)
      return "workspace query: " + status_message(st);
    ex_.workspace = ws ? alloc(static_cast<int64_t>(ws), &err) : nullptr;
    ex_.workspace_bytes = ws;
    if (!err.empty()) return err;

    // Warm-up: module load, the device's first-call checks, the kernels' shared-memory limits.
    for (int i = 0; i < 3; ++i)
      if (const selscan_status_t st = call(); st != SELSCAN_STATUS_SUCCESS) return status_message(st);
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
  state.counters["us"] = median_of(per_call) * 1e6;
  state.counters["us_min"] = *std::min_element(per_call.begin(), per_call.end()) * 1e6;
  state.counters["calls"] = kCalls;
}

void run_calls(benchmark::State& state, Shape s, bool bwd) {
  HostFixture fx(s, bwd);
  int retries = 0;
  run(state, fx, [&] { return fx.timed_batch(&retries); });
  state.counters["retries"] = retries;
  state.SetLabel(std::string(dtype_name(s.itype)) + " var B/C G=1, D z bias softplus; GPU kept busy");
}

// The workspace-size query: validation and kernel choice, no launch.
void run_query(benchmark::State& state, Shape s, bool bwd) {
  HostFixture fx(s, bwd);
  run(state, fx, [&] {
    size_t bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    selscan_status_t st = SELSCAN_STATUS_SUCCESS;
    for (int k = 0; k < kCalls && st == SELSCAN_STATUS_SUCCESS; ++k) st = fx.query(&bytes);
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(bytes);
    if (st != SELSCAN_STATUS_SUCCESS) {
      fx.error = status_message(st);
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
  // The shapes of issues #4 and #12 (bf16, variable B/C, D, z, delta_bias, softplus).
  constexpr selscan_dtype_t bf16 = SELSCAN_DTYPE_BFLOAT16;
  const Shape shapes[] = {{8, 1536, 2048, 16, bf16}, {1, 1536, 64, 16, bf16}, {1, 5120, 512, 16, bf16},
                          {4, 2048, 2048, 64, bf16}};
  for (const char* section : {"host", "host_query"})
    for (const Shape& s : shapes)
      for (const bool bwd : {false, true}) {
        const std::string name =
            std::string(section) + (bwd ? "/bwd/" : "/fwd/") + dtype_name(s.itype) + "/" + shape_name(s);
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
