// conv1d/ section: the causal conv1d (selscan_conv1d_fwd / _bwd / _update) on CUDA against its memory floor, at the
// rows bench/upstream_conv1d.py times causal-conv1d's kernels with (bench/conv1d_table.py puts both side by side).
// Registers itself (no change to bench_main.cpp's list of sections) when the library sees a CUDA device.
//
// Rows (bf16 x, out, dout, dx and state; bf16 weight and bias; SiLU; dweight/dbias fp32, as upstream's accumulators):
//   conv1d/{fwd,bwd}/{cf,cl}/<B>x<D>x<L>/w4/bf16   channel-first (stride 1 over L) or channel-last (stride 1 over D)
//   conv1d/update/bf16/D5120/Bt=<B>                 one token, state (Bt, D, 3) shifting, x and out (Bt, D, 1)
//   conv1d_host/{fwd,bwd}/{cf,cl}/.../bf16, conv1d_host/update/...   CPU time of one C-ABI call, GPU kept busy
// Floor (bytes a call cannot avoid, bench/conv1d_table.py's): forward x read + out written, backward x and dout
// read + dx written, update the state read and written + x + out; over 4.3 TB/s (about what an H200 copies device
// to device, read + write counted; `copy_GB_s` reports this device's own copy rate).
//
// Device time (conv1d/ rows): each row owns complete buffer sets (every tensor of the call), at least 3 and
// together at least 200 MB, so no call finds its operands in L2. A batch of calls rotating over the sets (about
// 2 ms of work, at most 2000 calls) is captured once in a CUDA graph and replayed between two events: the row's
// time is the median over kReplays replays of replay time / calls, so neither host launch cost nor per-iteration
// synchronisation enters it (as upstream_conv1d.py times causal-conv1d). Counters: ms and us (median per call),
// GB_s (floor bytes / time), pct_of_floor, floor_us, ms_min.
//
// Host cost (conv1d_host/ rows): as bench/bench_host.cpp: device memsets queued first keep the GPU busy while
// kHostCalls calls are timed with a steady clock; a batch whose filler ran dry is discarded and the filler doubled.
// Target: <= 5 us per call. Counters: us (median per call), us_min, retries.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "bench_common.h"

#if defined(SELSCAN_WITH_CUDA) && SELSCAN_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

namespace selscan_bench {
namespace {

constexpr int64_t kWidth = 4, kStateLen = kWidth - 1, kUpdateDim = 5120;
constexpr double kFloorBw = 4.3e12;         // bytes/s, read + write
constexpr double kMinRotationBytes = 200e6;
constexpr int kMinSets = 3, kMaxSets = 64;
constexpr double kBatchSeconds = 2e-3;      // about how long one replayed batch runs
constexpr int kMaxBatch = 2000;             // calls per batch at most
constexpr int kReplays = 30;                // timed replays (benchmark iterations) per row
constexpr int kHostCalls = 32;              // timed calls per host-cost batch
constexpr int kHostBatches = 50;
constexpr size_t kFillerBytes = size_t{256} << 20;
constexpr int kMaxFillerOps = 128;

enum class Op { fwd, bwd, update };

struct Row {
  Op op;
  bool cl;        // channel-last (fwd/bwd)
  int64_t B, D, L;  // update: L unused
};

std::string row_name(const char* section, const Row& r) {
  const std::string s(section);
  if (r.op == Op::update) return s + "/update/bf16/D" + std::to_string(r.D) + "/Bt=" + std::to_string(r.B);
  return s + (r.op == Op::fwd ? "/fwd/" : "/bwd/") + (r.cl ? "cl/" : "cf/") + std::to_string(r.B) + "x" +
         std::to_string(r.D) + "x" + std::to_string(r.L) + "/w" + std::to_string(kWidth) + "/bf16";
}

double floor_bytes(const Row& r) {
  if (r.op == Op::update) return static_cast<double>(r.B * r.D * (2 * kStateLen + 2) * 2);
  return static_cast<double>((r.op == Op::fwd ? 2 : 3) * r.B * r.D * r.L * 2);
}

std::string cuda_msg(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

selscan_tensor_t desc(void* p, int32_t dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
  selscan_tensor_t t = SELSCAN_TENSOR_INIT;
  t.data = p, t.dtype = dtype, t.ndim = static_cast<int32_t>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) t.sizes[i] = sizes[i], t.strides[i] = strides[i];
  return t;
}

// One complete set of a row's tensors on the device, and the argument structs over it.
struct Set {
  std::vector<void*> bufs;
  size_t bytes = 0;
  selscan_conv1d_fwd_args_t fwd = SELSCAN_CONV1D_FWD_ARGS_INIT;
  selscan_conv1d_bwd_args_t bwd = SELSCAN_CONV1D_BWD_ARGS_INIT;
  selscan_conv1d_update_args_t upd = SELSCAN_CONV1D_UPDATE_ARGS_INIT;
};

class Fixture {
 public:
  std::string error;
  std::vector<Set> sets;
  size_t set_bytes = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;

  Fixture(const Row& r, int min_sets) : r_(r) { error = setup(min_sets); }
  ~Fixture() {
    for (Set& s : sets)
      for (void* p : s.bufs) cudaFree(p);
    if (workspace) cudaFree(workspace);
    if (stream) cudaStreamDestroy(stream);
  }

  selscan_exec_t exec() const {
    selscan_exec_t ex = SELSCAN_EXEC_INIT;
    ex.device_kind = SELSCAN_DEVICE_CUDA;
    ex.stream = stream;
    ex.workspace = workspace;
    ex.workspace_bytes = workspace_bytes;
    return ex;
  }
  selscan_status_t call(size_t k) const {
    const Set& s = sets[k % sets.size()];
    const selscan_exec_t ex = exec();
    switch (r_.op) {
      case Op::fwd: return selscan_conv1d_fwd(&s.fwd, &ex);
      case Op::bwd: return selscan_conv1d_bwd(&s.bwd, &ex);
      default: return selscan_conv1d_update(&s.upd, &ex);
    }
  }

 private:
  Row r_;

  void* alloc(Set& s, size_t bytes, std::string* err) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      *err = cuda_msg("cudaMalloc", e);
      (void)cudaGetLastError();
      return nullptr;
    }
    s.bufs.push_back(p);
    s.bytes += bytes;
    return p;
  }

  // Uniform values in [-1, 1) (bf16 or fp32), one host fill per buffer size and seed.
  static cudaError_t fill(void* p, int32_t dtype, int64_t n, uint64_t seed) {
    std::vector<unsigned char> h(static_cast<size_t>(n * (dtype == SELSCAN_DTYPE_FLOAT32 ? 4 : 2)));
    fill_uniform(h.data(), dtype, n, -1.0, 1.0, seed);
    return cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice);
  }

  std::string make_set(Set& s, uint64_t seed) {
    const int32_t bf = SELSCAN_DTYPE_BFLOAT16, f32 = SELSCAN_DTYPE_FLOAT32;
    const int64_t B = r_.B, D = r_.D, L = r_.L, W = kWidth;
    std::string err;
    void* w = alloc(s, static_cast<size_t>(D * W * 2), &err);
    void* bias = alloc(s, static_cast<size_t>(D * 2), &err);
    if (!err.empty()) return err;
    cudaError_t e = fill(w, bf, D * W, seed + 1);
    if (e == cudaSuccess) e = fill(bias, bf, D, seed + 2);
    const selscan_tensor_t wd = desc(w, bf, {D, W}, {W, 1}), bd = desc(bias, bf, {D}, {1});
    if (r_.op == Op::update) {
      void* x = alloc(s, static_cast<size_t>(B * D * 2), &err);
      void* state = alloc(s, static_cast<size_t>(B * D * kStateLen * 2), &err);
      void* out = alloc(s, static_cast<size_t>(B * D * 2), &err);
      if (!err.empty()) return err;
      if (e == cudaSuccess) e = fill(x, bf, B * D, seed + 3);
      if (e == cudaSuccess) e = fill(state, bf, B * D * kStateLen, seed + 4);
      s.upd.x = desc(x, bf, {B, D, 1}, {D, 1, 1});
      s.upd.out = desc(out, bf, {B, D, 1}, {D, 1, 1});
      s.upd.conv_state = desc(state, bf, {B, D, kStateLen}, {D * kStateLen, kStateLen, 1});
      s.upd.weight = wd, s.upd.bias = bd, s.upd.activation = SELSCAN_ACTIVATION_SILU;
      return e == cudaSuccess ? "" : cuda_msg("fill", e);
    }
    const int64_t n = B * D * L;
    // (B, D, L): channel-first strides (D L, L, 1), channel-last (L D, 1, D).
    const std::vector<int64_t> st = r_.cl ? std::vector<int64_t>{L * D, 1, D} : std::vector<int64_t>{D * L, L, 1};
    void* x = alloc(s, static_cast<size_t>(n * 2), &err);
    if (!err.empty()) return err;
    if (e == cudaSuccess) e = fill(x, bf, n, seed + 3);
    if (r_.op == Op::fwd) {
      void* out = alloc(s, static_cast<size_t>(n * 2), &err);
      if (!err.empty()) return err;
      s.fwd.x = desc(x, bf, {B, D, L}, st), s.fwd.out = desc(out, bf, {B, D, L}, st);
      s.fwd.weight = wd, s.fwd.bias = bd, s.fwd.activation = SELSCAN_ACTIVATION_SILU;
    } else {
      void* dout = alloc(s, static_cast<size_t>(n * 2), &err);
      void* dx = alloc(s, static_cast<size_t>(n * 2), &err);
      void* dw = alloc(s, static_cast<size_t>(D * W * 4), &err);
      void* db = alloc(s, static_cast<size_t>(D * 4), &err);
      if (!err.empty()) return err;
      if (e == cudaSuccess) e = fill(dout, bf, n, seed + 4);
      s.bwd.x = desc(x, bf, {B, D, L}, st), s.bwd.dout = desc(dout, bf, {B, D, L}, st);
      s.bwd.dx = desc(dx, bf, {B, D, L}, st);
      s.bwd.weight = wd, s.bwd.bias = bd, s.bwd.activation = SELSCAN_ACTIVATION_SILU;
      s.bwd.dweight = desc(dw, f32, {D, W}, {W, 1}), s.bwd.dbias = desc(db, f32, {D}, {1});
    }
    return e == cudaSuccess ? "" : cuda_msg("fill", e);
  }

  std::string setup(int min_sets) {
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_msg("cudaStreamCreate", e);
    sets.emplace_back();
    if (std::string err = make_set(sets[0], 100); !err.empty()) return err;
    set_bytes = sets[0].bytes;
    const int n = std::clamp(static_cast<int>(std::ceil(kMinRotationBytes / static_cast<double>(set_bytes))),
                             min_sets, kMaxSets);
    for (int k = 1; k < n; ++k) {
      sets.emplace_back();
      if (std::string err = make_set(sets.back(), 100 + 10 * static_cast<uint64_t>(k)); !err.empty()) return err;
    }
    if (r_.op == Op::bwd) {
      const selscan_exec_t ex = exec();
      if (selscan_conv1d_bwd_workspace_size(&sets[0].bwd, &ex, &workspace_bytes) != SELSCAN_STATUS_SUCCESS)
        return selscan_last_error();
      if (workspace_bytes > 0 && (e = cudaMalloc(&workspace, workspace_bytes)) != cudaSuccess)
        return cuda_msg("cudaMalloc (workspace)", e);
    }
    // Warm-up: module load, first touch of every set.
    for (size_t k = 0; k < sets.size(); ++k)
      if (call(k) != SELSCAN_STATUS_SUCCESS) return selscan_last_error();
    if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return cuda_msg("warm-up", e);
    return "";
  }
};

void set_floor_counters(benchmark::State& st, const Row& r, double t, double t_min) {
  const double bytes = floor_bytes(r), floor_t = bytes / kFloorBw;
  st.counters["ms"] = t * 1e3;
  st.counters["us"] = t * 1e6;
  st.counters["ms_min"] = t_min * 1e3;
  st.counters["GB_s"] = bytes / t * 1e-9;
  st.counters["floor_us"] = floor_t * 1e6;
  st.counters["pct_of_floor"] = 100.0 * floor_t / t;
}

// ---------------------------------------------------------------------------------------------- device time
void run_device(benchmark::State& st, Row r) {
  Fixture fx(r, kMinSets);
  if (!fx.error.empty()) {
    st.SkipWithError(fx.error.c_str());
    return;
  }
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // A rough per-call time from one eager pass over the sets sizes the batch.
  cudaEventRecord(e0, fx.stream);
  for (size_t k = 0; k < fx.sets.size(); ++k) (void)fx.call(k);
  cudaEventRecord(e1, fx.stream);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  const double est = std::max(1e-7, 1e-3 * ms / static_cast<double>(fx.sets.size()));
  const int batch = std::clamp(static_cast<int>(std::ceil(kBatchSeconds / est)), static_cast<int>(fx.sets.size()),
                               kMaxBatch);
  // The batch, captured once.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t gexec = nullptr;
  selscan_status_t status = SELSCAN_STATUS_SUCCESS;
  cudaError_t e = cudaStreamBeginCapture(fx.stream, cudaStreamCaptureModeThreadLocal);
  for (int k = 0; k < batch && e == cudaSuccess && status == SELSCAN_STATUS_SUCCESS; ++k)
    status = fx.call(static_cast<size_t>(k));
  const cudaError_t end = cudaStreamEndCapture(fx.stream, &graph);
  if (e == cudaSuccess) e = end;
  if (e == cudaSuccess && status == SELSCAN_STATUS_SUCCESS) e = cudaGraphInstantiate(&gexec, graph, 0);
  if (e == cudaSuccess && status == SELSCAN_STATUS_SUCCESS) e = cudaGraphLaunch(gexec, fx.stream);  // warm replay
  if (e == cudaSuccess) e = cudaStreamSynchronize(fx.stream);
  std::vector<double> times;
  if (status != SELSCAN_STATUS_SUCCESS) {
    st.SkipWithError(selscan_last_error());
  } else if (e != cudaSuccess) {
    st.SkipWithError(cuda_msg("graph", e).c_str());
  } else {
    for (auto _ : st) {
      cudaEventRecord(e0, fx.stream);
      cudaGraphLaunch(gexec, fx.stream);
      cudaEventRecord(e1, fx.stream);
      e = cudaEventSynchronize(e1);
      if (e != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
        st.SkipWithError(cuda_msg("replay", e).c_str());
        break;
      }
      const double t = 1e-3 * static_cast<double>(ms) / batch;
      st.SetIterationTime(t);
      times.push_back(t);
    }
  }
  if (!times.empty()) {
    set_floor_counters(st, r, selscan_support::median(times), *std::min_element(times.begin(), times.end()));
    st.counters["calls"] = batch;
    st.counters["sets"] = static_cast<double>(fx.sets.size());
    st.counters["set_MB"] = static_cast<double>(fx.set_bytes) * 1e-6;
  }
  if (gexec) cudaGraphExecDestroy(gexec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// ---------------------------------------------------------------------------------------------- host cost
void run_host(benchmark::State& st, Row r) {
  Fixture fx(r, 1);
  void* filler = nullptr;
  cudaEvent_t busy = nullptr;
  if (fx.error.empty()) {
    if (cudaMalloc(&filler, kFillerBytes) != cudaSuccess || cudaEventCreate(&busy) != cudaSuccess)
      fx.error = "filler allocation failed";
  }
  if (!fx.error.empty()) {
    st.SkipWithError(fx.error.c_str());
    if (filler) cudaFree(filler);
    return;
  }
  int filler_ops = 8, retries = 0;
  std::vector<double> per_call;
  for (auto _ : st) {
    double t = -1;
    for (int attempt = 0; attempt < 6 && t < 0; ++attempt) {
      for (int i = 0; i < filler_ops; ++i) cudaMemsetAsync(filler, i & 0xff, kFillerBytes, fx.stream);
      cudaEventRecord(busy, fx.stream);
      const auto t0 = std::chrono::steady_clock::now();
      selscan_status_t s = SELSCAN_STATUS_SUCCESS;
      for (int k = 0; k < kHostCalls && s == SELSCAN_STATUS_SUCCESS; ++k) s = fx.call(0);
      const auto t1 = std::chrono::steady_clock::now();
      const bool still_busy = cudaEventQuery(busy) == cudaErrorNotReady;
      (void)cudaGetLastError();
      cudaStreamSynchronize(fx.stream);
      if (s != SELSCAN_STATUS_SUCCESS) {
        st.SkipWithError(selscan_last_error());
        break;
      }
      if (still_busy) {
        t = std::chrono::duration<double>(t1 - t0).count() / kHostCalls;
      } else {
        ++retries;
        filler_ops = std::min(2 * filler_ops, kMaxFillerOps);
      }
    }
    if (t < 0) {
      st.SkipWithError("the GPU ran dry before every batch ended: the filler could not keep it busy");
      break;
    }
    st.SetIterationTime(t);
    per_call.push_back(t);
  }
  if (!per_call.empty()) {
    st.counters["us"] = selscan_support::median(per_call) * 1e6;
    st.counters["us_min"] = *std::min_element(per_call.begin(), per_call.end()) * 1e6;
    st.counters["retries"] = retries;
  }
  cudaEventDestroy(busy);
  cudaFree(filler);
}

const bool registered = [] {
  int32_t n = 0;
  if (selscan_cuda_device_count(&n) != SELSCAN_STATUS_SUCCESS || n == 0 ||
      selscan_check_device(0) != SELSCAN_STATUS_SUCCESS) {
    std::fprintf(stderr, "selscan_bench: conv1d benchmarks skipped: no CUDA device served by this build\n");
    return false;
  }
  const struct {
    int64_t B, D, L;
  } shapes[] = {{8, 1536, 2048}, {4, 5120, 2048}, {1, 5120, 512}, {1, 1536, 64}};
  std::vector<Row> rows;
  for (Op op : {Op::fwd, Op::bwd})
    for (bool cl : {false, true})
      for (const auto& s : shapes) rows.push_back({op, cl, s.B, s.D, s.L});
  for (int64_t bt : {1, 16, 64, 256}) rows.push_back({Op::update, false, bt, kUpdateDim, 1});
  for (const Row& r : rows)
    benchmark::RegisterBenchmark(row_name("conv1d", r).c_str(), run_device, r)
        ->UseManualTime()
        // A fixed count: each iteration is one replay of a ~2 ms batch; the setup (hundreds of MB of buffers) is
        // per row.
        ->Iterations(kReplays)
        ->Unit(benchmark::kMicrosecond);
  const Row host_rows[] = {{Op::fwd, false, 4, 5120, 2048}, {Op::fwd, true, 4, 5120, 2048},
                           {Op::bwd, false, 4, 5120, 2048}, {Op::bwd, true, 4, 5120, 2048},
                           {Op::update, false, 64, kUpdateDim, 1}};
  for (const Row& r : host_rows)
    benchmark::RegisterBenchmark(row_name("conv1d_host", r).c_str(), run_host, r)
        ->UseManualTime()
        ->Iterations(kHostBatches)
        ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace selscan_bench

#endif
