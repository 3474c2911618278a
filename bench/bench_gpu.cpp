// GPU section: the issue #4 rows, an L sweep and a device-to-device copy that calibrates the memory floor.
//
// Timing method (docs/performance.md, "Method"):
//   - manual time from CUDA events around exactly one library call per iteration; right before it an untimed
//     call on another buffer set keeps the GPU busy while the timed call is enqueued, so host-side launch
//     latency is not in the measurement (the GPU goes from one kernel straight into the timed one);
//   - inputs and outputs rotate among >= 3 complete buffer sets totalling >= 200 MB (>3x the 50-60 MB L2 of
//     H100/H200), so no timed call finds its operands in L2 from a previous call;
//   - warm-up: every set is run once before timing (module load, first-touch, clocks);
//   - counters are computed from the median per-call time of all timed iterations (robust to stragglers);
//     --benchmark_repetitions adds the framework's own mean/median/stddev on top.
#include <benchmark/benchmark.h>

#include <string>

#include "bench_common.h"

#if defined(SELSCAN_WITH_CUDA) && SELSCAN_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

namespace selscan_bench {
namespace {

constexpr double kMinRotationBytes = 200e6;  // total of all buffer sets
constexpr int kMinSets = 3;
constexpr int kMaxSets = 64;
constexpr double kExpPerClkPerSm = 16.0;  // MUFU.EX2 throughput per SM per clock (sm_80 .. sm_90)

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sms = 0;
  double clock_hz = 0;       // peak SM clock
  double l2_bytes = 0;
  double exp_per_s = 0;      // kExpPerClkPerSm * sms * clock_hz
  double copy_bytes_per_s = 0;  // measured D2D cudaMemcpy, read + write counted
};
DeviceInfo g_dev;

std::string cuda_msg(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = 0.5 * (m + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
  return m;
}

// Device allocations of one fixture, freed together.
struct DeviceArena {
  std::vector<void*> ptrs;
  std::string error;
  void* alloc(int64_t bytes) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (e != cudaSuccess) {
      if (error.empty()) error = cuda_msg("cudaMalloc", e);
      cudaGetLastError();  // clear the sticky-free allocation error
      return nullptr;
    }
    ptrs.push_back(p);
    return p;
  }
  ~DeviceArena() {
    for (void* p : ptrs) cudaFree(p);
  }
};

// Copies `n` elements to `dst` by repeating a random host tile (values only need a realistic range).
cudaError_t upload_tiled(void* dst, const std::vector<unsigned char>& tile, int64_t n, int64_t elem_bytes) {
  const int64_t total = n * elem_bytes;
  const int64_t tile_bytes = static_cast<int64_t>(tile.size());
  for (int64_t off = 0; off < total; off += tile_bytes) {
    const int64_t len = std::min(tile_bytes, total - off);
    cudaError_t e = cudaMemcpy(static_cast<unsigned char*>(dst) + off, tile.data(), static_cast<size_t>(len),
                               cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

std::vector<unsigned char> random_tile(selscan_dtype_t t, int64_t n, Range r, uint64_t seed) {
  const int64_t elems = std::min<int64_t>(n, int64_t{1} << 22);
  std::vector<unsigned char> tile(static_cast<size_t>(elems * dtype_bytes(t)));
  fill_uniform(tile.data(), t, elems, r.lo, r.hi, seed);
  return tile;
}

// Bytes of one buffer set for a mode (what each set allocates).
int64_t set_bytes(const Shape& s, Mode m) {
  const Sizes z(s);
  int64_t in = 3 * z.btl + 2 * z.bc + z.dn + 2 * z.dvec;
  if (!is_bwd(m)) return in + 2 * z.btl + (m == Mode::fwd ? z.x : z.state);
  // + dout, out, x; grads du ddelta dz dB dC dA dD dbias
  return in + 2 * z.btl + z.x + 3 * z.btl + 2 * z.bc + z.dn + 2 * z.dvec;
}

class GpuFixture {
 public:
  Shape s;
  Mode m;
  std::string error;  // non-empty: setup failed
  int nsets = 0;
  int64_t bytes_per_set = 0;

  GpuFixture(const Shape& shape, Mode mode) : s(shape), m(mode) { error = setup(); }
  ~GpuFixture() {
    if (e0_) cudaEventDestroy(e0_);
    if (e1_) cudaEventDestroy(e1_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Enqueues the benchmarked call on set `k`.
  selscan_status_t call(int k) {
    const Set& st = sets_[static_cast<size_t>(k)];
    return is_bwd(m) ? selscan_bwd(&st.bwd, &ex_) : selscan_fwd(&st.fwd, &ex_);
  }

  // One timed call (after an untimed one on the previous set); returns seconds, or < 0 with `error` set.
  double timed_call() {
    selscan_status_t st = call(next_set());
    if (st == SELSCAN_STATUS_SUCCESS) {
      cudaEventRecord(e0_, stream_);
      st = call(next_set());
      cudaEventRecord(e1_, stream_);
    }
    if (st != SELSCAN_STATUS_SUCCESS) {
      error = status_message(st);
      return -1;
    }
    cudaError_t e = cudaEventSynchronize(e1_);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0_, e1_);
    if (e != cudaSuccess) {
      error = cuda_msg("timed call", e);
      return -1;
    }
    return 1e-3 * static_cast<double>(ms);
  }

 private:
  struct Set {
    Buffers b;
    selscan_fwd_args_t fwd;
    selscan_bwd_args_t bwd;
  };
  DeviceArena arena_;
  std::vector<Set> sets_;
  selscan_exec_t ex_ = SELSCAN_EXEC_INIT;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  int cursor_ = 0;

  int next_set() {
    const int k = cursor_;
    cursor_ = (cursor_ + 1) % nsets;
    return k;
  }

  std::string setup() {
    cudaError_t e = cudaSetDevice(g_dev.index);
    if (e != cudaSuccess) return cuda_msg("cudaSetDevice", e);
    bytes_per_set = set_bytes(s, m);
    nsets = static_cast<int>(std::ceil(kMinRotationBytes / static_cast<double>(bytes_per_set)));
    nsets = std::min(std::max(nsets, kMinSets), kMaxSets);
    size_t free_b = 0, total_b = 0;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) return cuda_msg("cudaMemGetInfo", e);
    // Sets that exceed L2 on their own can rotate with fewer of them; keep headroom for the workspace.
    while (nsets > 2 && static_cast<double>(nsets) * bytes_per_set > 0.8 * static_cast<double>(free_b)) --nsets;
    if (static_cast<double>(nsets) * bytes_per_set > 0.8 * static_cast<double>(free_b))
      return "not enough device memory for 2 buffer sets of " + std::to_string(bytes_per_set >> 20) + " MiB";

    const Sizes z(s);
    const bool bwd = is_bwd(m);
    void* scratch_out_z = bwd ? arena_.alloc(z.btl) : nullptr;  // the untimed forward that feeds backward
    sets_.resize(static_cast<size_t>(nsets));
    for (Set& st : sets_) {
      Buffers& b = st.b;
      b.u = arena_.alloc(z.btl);
      b.delta = arena_.alloc(z.btl);
      b.z = arena_.alloc(z.btl);
      b.B = arena_.alloc(z.bc);
      b.C = arena_.alloc(z.bc);
      b.A = arena_.alloc(z.dn);
      b.D = arena_.alloc(z.dvec);
      b.bias = arena_.alloc(z.dvec);
      b.out = arena_.alloc(z.btl);
      if (!bwd) {
        b.out_z = arena_.alloc(z.btl);
        if (m == Mode::fwd) b.x = arena_.alloc(z.x);
        else b.last_state = arena_.alloc(z.state);
      } else {
        b.out_z = scratch_out_z;
        b.x = arena_.alloc(z.x);
        b.dout = arena_.alloc(z.btl);
        b.du = arena_.alloc(z.btl);
        b.ddelta = arena_.alloc(z.btl);
        b.dz = arena_.alloc(z.btl);
        b.dB = arena_.alloc(z.bc);
        b.dC = arena_.alloc(z.bc);
        b.dA = arena_.alloc(z.dn);
        b.dD = arena_.alloc(z.dvec);
        b.dbias = arena_.alloc(z.dvec);
      }
      if (!arena_.error.empty()) return arena_.error;
    }

    // Inputs: one random tile per tensor kind, uploaded into every set.
    struct Fill {
      void* Buffers::*field;
      selscan_dtype_t t;
      int64_t n;
      Range r;
    };
    const Fill fills[] = {
        {&Buffers::u, s.itype, s.btl(), range_u()},
        {&Buffers::delta, s.itype, s.btl(), range_delta()},
        {&Buffers::z, s.itype, s.btl(), range_z()},
        {&Buffers::B, s.itype, s.bc_numel(), range_bc()},
        {&Buffers::C, s.itype, s.bc_numel(), range_bc()},
        {&Buffers::D, SELSCAN_DTYPE_FLOAT32, s.dim, range_D()},
        {&Buffers::bias, SELSCAN_DTYPE_FLOAT32, s.dim, range_bias()},
        {&Buffers::dout, s.itype, s.btl(), range_dout()},
    };
    uint64_t seed = 1;
    for (const Fill& f : fills) {
      const std::vector<unsigned char> tile = random_tile(f.t, f.n, f.r, seed++);
      for (Set& st : sets_) {
        void* dst = st.b.*(f.field);
        if (!dst) continue;
        if ((e = upload_tiled(dst, tile, f.n, dtype_bytes(f.t))) != cudaSuccess) return cuda_msg("upload", e);
      }
    }
    std::vector<float> a(static_cast<size_t>(s.dim * s.dstate));
    fill_A(a.data(), s);
    for (Set& st : sets_) {
      if ((e = cudaMemcpy(st.b.A, a.data(), static_cast<size_t>(z.dn), cudaMemcpyHostToDevice)) != cudaSuccess)
        return cuda_msg("upload A", e);
    }
    // Poison every output (0xFF bytes: NaN in each dtype) so an unwritten one fails the check after warm-up.
    e = poison_outputs(z);
    if (e != cudaSuccess) return cuda_msg("poison", e);

    if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess)
      return cuda_msg("cudaStreamCreate", e);
    if ((e = cudaEventCreate(&e0_)) != cudaSuccess || (e = cudaEventCreate(&e1_)) != cudaSuccess)
      return cuda_msg("cudaEventCreate", e);
    ex_.device_kind = SELSCAN_DEVICE_CUDA;
    ex_.device_index = g_dev.index;
    ex_.stream = stream_;

    for (Set& st : sets_) {
      st.fwd = fwd_args(s, st.b, m == Mode::fwd || bwd, m == Mode::fwd_infer);
      st.bwd = bwd_args(s, st.b, m == Mode::bwd_det);
    }
    // One workspace serves every set: the calls are serialised on one stream.
    size_t ws_fwd = 0, ws_bwd = 0;
    selscan_status_t stt = selscan_fwd_workspace_size(&sets_[0].fwd, &ex_, &ws_fwd);
    if (stt != SELSCAN_STATUS_SUCCESS) return "selscan_fwd_workspace_size: " + status_message(stt);
    if (bwd) {
      stt = selscan_bwd_workspace_size(&sets_[0].bwd, &ex_, &ws_bwd);
      if (stt != SELSCAN_STATUS_SUCCESS) return "selscan_bwd_workspace_size: " + status_message(stt);
    }
    const size_t ws = std::max(ws_fwd, ws_bwd);
    void* wsp = ws ? arena_.alloc(static_cast<int64_t>(ws)) : nullptr;
    if (!arena_.error.empty()) return arena_.error;
    ex_.workspace = wsp;
    ex_.workspace_bytes = ws;

    // Backward inputs out and x come from a real forward on each set (untimed).
    if (bwd) {
      for (Set& st : sets_) {
        stt = selscan_fwd(&st.fwd, &ex_);
        if (stt != SELSCAN_STATUS_SUCCESS) return "selscan_fwd (producing backward inputs): " + status_message(stt);
      }
    }
    // Warm-up: every set once.
    for (int k = 0; k < nsets; ++k) {
      stt = call(k);
      if (stt != SELSCAN_STATUS_SUCCESS) return std::string(bwd ? "selscan_bwd: " : "selscan_fwd: ") + status_message(stt);
    }
    if ((e = cudaStreamSynchronize(stream_)) != cudaSuccess) return cuda_msg("warm-up", e);
    for (int k : {0, nsets - 1}) {
      std::string why = check_output(sets_[static_cast<size_t>(k)].b);
      if (!why.empty()) return "set " + std::to_string(k) + ": " + why;
    }
    return "";
  }

  cudaError_t poison_outputs(const Sizes& z) {
    for (Set& st : sets_) {
      const Buffers& b = st.b;
      const std::pair<void*, int64_t> outs[] = {
          {b.out, z.btl}, {b.out_z, z.btl}, {b.x, z.x}, {b.last_state, z.state}, {b.du, z.btl},
          {b.ddelta, z.btl}, {b.dz, z.btl}, {b.dB, z.bc}, {b.dC, z.bc}, {b.dA, z.dn}, {b.dD, z.dvec},
          {b.dbias, z.dvec}};
      for (const auto& o : outs) {
        if (!o.first) continue;
        cudaError_t e = cudaMemset(o.first, 0xFF, static_cast<size_t>(o.second));
        if (e != cudaSuccess) return e;
      }
    }
    return cudaDeviceSynchronize();
  }

  // Samples the head, middle and tail of the mode's primary (Bt, D, L) output: all written, all finite.
  std::string check_output(const Buffers& b) {
    const int64_t n = s.btl();
    const int64_t eb = dtype_bytes(s.itype);
    const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 20);
    std::vector<unsigned char> h(static_cast<size_t>(chunk * eb));
    const unsigned char* base = static_cast<const unsigned char*>(primary_output(b, m));
    for (int64_t start : {int64_t{0}, (n - chunk) / 2, n - chunk}) {
      cudaError_t e = cudaMemcpy(h.data(), base + start * eb, h.size(), cudaMemcpyDeviceToHost);
      if (e != cudaSuccess) return cuda_msg("read back", e);
      if (!all_finite(h.data(), s.itype, chunk))
        return std::string(is_bwd(m) ? "du" : "out_z") + " not written or not finite (elements from " +
               std::to_string(start) + ")";
    }
    return "";
  }
};

// The fixture of the benchmark that ran last: the framework calls a benchmark function several times while
// sizing the iteration count, and the setup (GBs of uploads, warm-up) should happen once per benchmark.
struct Cache {
  std::string key;
  std::unique_ptr<GpuFixture> fx;
};
Cache& cache() {
  static Cache c;
  return c;
}

void run_gpu(benchmark::State& state, const std::string& key, Shape s, Mode m) {
  Cache& c = cache();
  if (c.key != key || !c.fx) {
    c.fx.reset();  // free the previous benchmark's buffers first
    c.fx = std::make_unique<GpuFixture>(s, m);
    c.key = key;
  }
  GpuFixture& fx = *c.fx;
  if (!fx.error.empty()) {
    state.SkipWithError(fx.error.c_str());
    return;
  }
  std::vector<double> times;
  times.reserve(1024);
  for (auto _ : state) {
    const double t = fx.timed_call();
    if (t < 0) {
      state.SkipWithError(fx.error.c_str());
      break;
    }
    state.SetIterationTime(t);
    times.push_back(t);
  }
  if (times.empty()) return;
  const double t = median(times);
  const double bytes = static_cast<double>(min_bytes(s, m));
  const double nexp = exps(s);
  state.counters["ms"] = t * 1e3;
  state.counters["ms_min"] = *std::min_element(times.begin(), times.end()) * 1e3;
  state.counters["bytes"] = bytes;
  state.counters["GB_s"] = bytes / t * 1e-9;
  state.counters["exps"] = nexp;
  state.counters["exp_floor_frac"] = nexp / g_dev.exp_per_s / t;
  if (g_dev.copy_bytes_per_s > 0) state.counters["mem_floor_frac"] = bytes / g_dev.copy_bytes_per_s / t;
  // The framework's bytes_per_second (mean-based, over the same minimum bytes) for tools that read only it.
  state.SetBytesProcessed(static_cast<int64_t>(times.size()) * min_bytes(s, m));
  state.counters["sets"] = fx.nsets;
  state.counters["set_MB"] = static_cast<double>(fx.bytes_per_set) * 1e-6;
  state.SetLabel(std::string(dtype_name(s.itype)) + " var B/C G=1, D z bias softplus");
}

// Device-to-device cudaMemcpy of `bytes`; returns the median read+write bandwidth over `reps` timed copies.
struct CopyFixture {
  DeviceArena arena;
  void *src = nullptr, *dst = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  std::string error;

  explicit CopyFixture(size_t want) {
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(g_dev.index);
    cudaMemGetInfo(&free_b, &total_b);
    bytes = std::min(want, free_b / 3);
    bytes &= ~static_cast<size_t>(4095);
    src = arena.alloc(static_cast<int64_t>(bytes));
    dst = arena.alloc(static_cast<int64_t>(bytes));
    if (!arena.error.empty()) {
      error = arena.error;
      return;
    }
    cudaError_t e = cudaMemset(src, 0x3C, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);  // warm-up
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) error = cuda_msg("copy setup", e);
  }
  ~CopyFixture() {
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (stream) cudaStreamDestroy(stream);
  }
  // Seconds of one copy (an untimed copy in the other direction runs just before it), < 0 on error.
  double timed_copy() {
    cudaError_t e = cudaMemcpyAsync(src, dst, bytes, cudaMemcpyDeviceToDevice, stream);
    if (e == cudaSuccess) e = cudaEventRecord(e0, stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
    if (e == cudaSuccess) e = cudaEventRecord(e1, stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(e1);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
    if (e != cudaSuccess) {
      error = cuda_msg("timed copy", e);
      return -1;
    }
    return 1e-3 * static_cast<double>(ms);
  }
};

constexpr size_t kCopyBytes = size_t{1} << 30;

void run_copy(benchmark::State& state) {
  cache().fx.reset();
  cache().key.clear();
  CopyFixture cf(kCopyBytes);
  if (!cf.error.empty()) {
    state.SkipWithError(cf.error.c_str());
    return;
  }
  std::vector<double> times;
  for (auto _ : state) {
    const double t = cf.timed_copy();
    if (t < 0) {
      state.SkipWithError(cf.error.c_str());
      break;
    }
    state.SetIterationTime(t);
    times.push_back(t);
  }
  if (times.empty()) return;
  const double t = median(times);
  state.counters["ms"] = t * 1e3;
  state.counters["bytes"] = 2.0 * static_cast<double>(cf.bytes);
  state.counters["GB_s"] = 2.0 * static_cast<double>(cf.bytes) / t * 1e-9;
  state.SetBytesProcessed(static_cast<int64_t>(times.size()) * 2 * static_cast<int64_t>(cf.bytes));
  state.SetLabel("cudaMemcpy D2D, read + write counted");
}

std::string fmt_double(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", prec, v);
  return buf;
}

Shape make(int64_t bt, int64_t d, int64_t l, int64_t n, selscan_dtype_t t) {
  Shape s;
  s.batch = bt;
  s.dim = d;
  s.seqlen = l;
  s.dstate = n;
  s.itype = t;
  return s;
}

}  // namespace

bool register_gpu_benchmarks(std::string* why) {
  int32_t count = 0;
  selscan_cuda_device_count(&count);
  if (count < 1) {
    *why = "no CUDA device visible (selscan_cuda_device_count = 0)";
    return false;
  }
  int dev = 0;
  if (const char* env = std::getenv("SELSCAN_BENCH_DEVICE")) dev = std::atoi(env);
  selscan_status_t st = selscan_check_device(dev);
  if (st != SELSCAN_STATUS_SUCCESS) {
    *why = "device " + std::to_string(dev) + " not usable: " + status_message(st);
    return false;
  }
  cudaDeviceProp prop;
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
  int clock_khz = 0;
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
  if (e != cudaSuccess) {
    *why = cuda_msg("device query", e);
    return false;
  }
  g_dev.index = dev;
  g_dev.name = prop.name;
  g_dev.sms = prop.multiProcessorCount;
  g_dev.clock_hz = 1e3 * clock_khz;
  g_dev.l2_bytes = static_cast<double>(prop.l2CacheSize);
  g_dev.exp_per_s = kExpPerClkPerSm * g_dev.sms * g_dev.clock_hz;

  // The memory floor of every GPU benchmark: D2D copy bandwidth measured now, once.
  {
    CopyFixture cf(kCopyBytes / 2);
    std::vector<double> t;
    for (int i = 0; i < 10 && cf.error.empty(); ++i) {
      const double s = cf.timed_copy();
      if (s > 0) t.push_back(s);
    }
    if (!t.empty()) g_dev.copy_bytes_per_s = 2.0 * static_cast<double>(cf.bytes) / median(t);
    else std::fprintf(stderr, "selscan_bench: D2D copy calibration failed (%s); no mem_floor_frac\n", cf.error.c_str());
  }
  benchmark::AddCustomContext("gpu_name", g_dev.name);
  benchmark::AddCustomContext("gpu_index", std::to_string(dev));
  benchmark::AddCustomContext("gpu_sms", std::to_string(g_dev.sms));
  benchmark::AddCustomContext("gpu_clock_mhz", fmt_double(g_dev.clock_hz * 1e-6, 0));
  benchmark::AddCustomContext("gpu_l2_mb", fmt_double(g_dev.l2_bytes * 1e-6, 1));
  benchmark::AddCustomContext("gpu_exp_per_s", fmt_double(g_dev.exp_per_s, 0));
  benchmark::AddCustomContext("gpu_d2d_GB_s", fmt_double(g_dev.copy_bytes_per_s * 1e-9, 1));

  // The issue #4 rows: forward (training: writes x), forward for inference (last_state, no x), backward, and
  // the deterministic backward.
  const Shape rows[] = {
      make(8, 1536, 2048, 16, SELSCAN_DTYPE_BFLOAT16), make(4, 5120, 2048, 16, SELSCAN_DTYPE_BFLOAT16),
      make(1, 2048, 65536, 16, SELSCAN_DTYPE_BFLOAT16), make(1, 5120, 512, 16, SELSCAN_DTYPE_BFLOAT16),
      make(8, 1536, 2048, 16, SELSCAN_DTYPE_FLOAT32),   make(4, 2048, 2048, 64, SELSCAN_DTYPE_BFLOAT16),
  };
  auto reg = [](const std::string& name, const Shape& s, Mode m) {
    benchmark::RegisterBenchmark(name.c_str(), run_gpu, name, s, m)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  for (const Shape& s : rows)
    for (Mode m : {Mode::fwd, Mode::fwd_infer, Mode::bwd, Mode::bwd_det})
      reg(std::string("gpu/") + mode_name(m) + "/" + dtype_name(s.itype) + "/" + shape_name(s), s, m);
  // L sweep for the time-vs-L plot.
  for (Mode m : {Mode::fwd, Mode::bwd})
    for (int64_t l = 512; l <= 65536; l *= 2) {
      const Shape s = make(1, 2048, l, 16, SELSCAN_DTYPE_BFLOAT16);
      reg(std::string("gpu_sweep/") + mode_name(m) + "/" + dtype_name(s.itype) + "/" + shape_name(s), s, m);
    }
  benchmark::RegisterBenchmark("gpu_copy/d2d/1GiB", run_copy)->UseManualTime()->Unit(benchmark::kMillisecond);
  return true;
}

void release_gpu_resources() {
  cache().fx.reset();
  cache().key.clear();
}

}  // namespace selscan_bench

#else  // no CUDA in this build

namespace selscan_bench {
bool register_gpu_benchmarks(std::string* why) {
  *why = "selscan_bench was built without CUDA (SELSCAN_WITH_CUDA off)";
  return false;
}
void release_gpu_resources() {}
}  // namespace selscan_bench

#endif
