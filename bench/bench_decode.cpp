// decode/ section: the decode step (selscan_state_update) against its memory floor, in both forms. Registers itself
// (no change to bench_main.cpp's list of sections).
//
// Shapes (bf16 x, dt, z, B, C, or fp16 with an fp16 state, which must have x's dtype; fp32 A, D, dt_bias; softplus):
//   Mamba-1 form, as Mamba's step() calls it: D = 5120, N = 16 (Mamba-2.8b's width), state (S, D, N);
//   Mamba-2 form ("m2_"), as Mamba-2 calls it: 80 heads x 64, N = 128, one group, state (S, H, P, N); dt, A, D and
//   dt_bias broadcast over the head dim (stride 0), B and C (Bt, 1, N).
// Rows: decode/<device>/[m2_]<state dtype>[_pool[_dst]]/Bt=<batch>. "_pool": the sequences' slots are scattered
// over the pool through int32 state_batch_indices (continuous batching), instead of slots 0..Bt-1 of a window;
// "_pool_dst": the same, each state written to another slot (dst_state_batch_indices).
//
// Floor: the state is read and written once, 2 * Bt * (slot elements) * sizeof(state) bytes, at the
// device-to-device copy bandwidth measured here (read + write counted, as gpu_copy/d2d). The other inputs (x, dt,
// z, B, C, out: O(Bt * channels); A) are counted in GB_s but not in the floor.
//
// Timing (CUDA): the calls rotate through windows of a state pool of >= 512 MB (> 8x the L2 of H100/H200), so
// no call finds its states in L2. Each iteration enqueues a 256 MB device-to-device copy first, so that the
// GPU is still busy while the host enqueues the timed calls, then kCalls back-to-back decode steps between two
// events: their per-call device time, launch gaps between kernels included, host launch latency excluded.
// The counters come from the median over iterations.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"

#if defined(SELSCAN_WITH_CUDA) && SELSCAN_WITH_CUDA
#  include <cuda_runtime.h>
#endif

namespace selscan_bench {
namespace {

constexpr int64_t kBatches[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
constexpr int64_t kBatchesM2[] = {1, 16, 64, 256};

// A decode shape: the Mamba-1 form is H = D channels of P = 1.
struct Shape {
  bool heads;
  int64_t H, P, N;
  int64_t channels() const { return H * P; }
  int64_t slot_elems() const { return H * P * N; }
};
constexpr Shape kMamba1{false, 5120, 1, 16};
constexpr Shape kMamba2{true, 80, 64, 128};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int64_t state_bytes(const Shape& sh, int64_t batch, selscan_dtype_t state_dtype) {
  return batch * sh.slot_elems() * dtype_size(state_dtype);
}

// Bytes one call moves at least: the state read and written, the per-channel inputs and output, B and C, A, D and
// dt_bias (the broadcast ones once per head).
double call_bytes(const Shape& sh, int64_t batch, selscan_dtype_t state_dtype, selscan_dtype_t itype) {
  const double io = static_cast<double>(batch * sh.channels() * dtype_size(itype));
  const double dt = static_cast<double>(batch * (sh.heads ? sh.H : sh.channels()) * dtype_size(itype));
  const double weights = sh.heads ? 3.0 * 4.0 * static_cast<double>(sh.H)
                                  : 4.0 * static_cast<double>(sh.slot_elems()) + 8.0 * static_cast<double>(sh.H);
  return 2.0 * static_cast<double>(state_bytes(sh, batch, state_dtype)) + 3.0 * io /* x z out */ + dt +
         2.0 * static_cast<double>(batch * sh.N * dtype_size(itype)) + weights;
}

// x, dt, z, B, C and out: bf16, or fp16 with an fp16 state (a 16-bit state has x's dtype).
selscan_dtype_t itype_for(selscan_dtype_t state_dtype) {
  return state_dtype == SELSCAN_DTYPE_FLOAT16 ? SELSCAN_DTYPE_FLOAT16 : SELSCAN_DTYPE_BFLOAT16;
}

// A descriptor with explicit strides.
selscan_tensor_t strided_desc(void* data, selscan_dtype_t t, std::initializer_list<int64_t> sizes,
                              std::initializer_list<int64_t> strides) {
  selscan_tensor_t d = contiguous_desc(data, t, sizes);
  int i = 0;
  for (int64_t st : strides) d.strides[i++] = st;
  return d;
}

// The call's struct over a state pool: sequences use slots [first, first + Bt), or the slots in `idx` (and
// write the slots in `dst` when it is given). in[]: x, dt, z, B, C, A, D, dt_bias; in the Mamba-2 form dt is
// (Bt, H), A, D and dt_bias (H,), broadcast over P here.
selscan_state_update_args_t decode_args(const Shape& sh, void* const* in, void* state, int64_t slots,
                                        selscan_dtype_t state_dtype, int64_t batch, int64_t first, void* idx,
                                        void* out, void* dst = nullptr) {
  const selscan_dtype_t it = itype_for(state_dtype), f32 = SELSCAN_DTYPE_FLOAT32;
  const int64_t H = sh.H, P = sh.P, N = sh.N;
  selscan_state_update_args_t a = SELSCAN_STATE_UPDATE_ARGS_INIT;
  if (sh.heads) {
    a.x = contiguous_desc(in[0], it, {batch, H, P});
    a.dt = strided_desc(in[1], it, {batch, H, P}, {H, 1, 0});
    a.z = contiguous_desc(in[2], it, {batch, H, P});
    a.B = contiguous_desc(in[3], it, {batch, 1, N});
    a.C = contiguous_desc(in[4], it, {batch, 1, N});
    a.A = strided_desc(in[5], f32, {H, P, N}, {1, 0, 0});
    a.D = strided_desc(in[6], f32, {H, P}, {1, 0});
    a.dt_bias = strided_desc(in[7], f32, {H, P}, {1, 0});
    a.out = contiguous_desc(out, it, {batch, H, P});
  } else {
    a.x = contiguous_desc(in[0], it, {batch, H});
    a.dt = contiguous_desc(in[1], it, {batch, H});
    a.z = contiguous_desc(in[2], it, {batch, H});
    a.B = contiguous_desc(in[3], it, {batch, N});
    a.C = contiguous_desc(in[4], it, {batch, N});
    a.A = contiguous_desc(in[5], f32, {H, N});
    a.D = contiguous_desc(in[6], f32, {H});
    a.dt_bias = contiguous_desc(in[7], f32, {H});
    a.out = contiguous_desc(out, it, {batch, H});
  }
  a.dt_softplus = 1;
  const auto state_desc = [&](void* base, int64_t n) {
    return sh.heads ? contiguous_desc(base, state_dtype, {n, H, P, N}) : contiguous_desc(base, state_dtype, {n, H, N});
  };
  if (idx != nullptr) {
    a.state = state_desc(state, slots);
    a.state_batch_indices = contiguous_desc(idx, SELSCAN_DTYPE_INT32, {batch});
    if (dst != nullptr) a.dst_state_batch_indices = contiguous_desc(dst, SELSCAN_DTYPE_INT32, {batch});
  } else {
    unsigned char* window = static_cast<unsigned char*>(state) + first * sh.slot_elems() * dtype_size(state_dtype);
    a.state = state_desc(window, batch);
  }
  return a;
}

// Host buffers of the inputs (values in the benchmark ranges, support/bench.h); in the Mamba-2 form dt is per
// head and A, D, dt_bias are per head (broadcast by the descriptors).
struct HostInputs {
  std::vector<std::vector<unsigned char>> bufs;
  HostInputs(const Shape& sh, int64_t batch, selscan_dtype_t itype) {
    const selscan_dtype_t bf = itype, f32 = SELSCAN_DTYPE_FLOAT32;
    using selscan_support::kB, selscan_support::kBias, selscan_support::kD, selscan_support::kDelta,
        selscan_support::kU, selscan_support::kZ;
    const int64_t ch = sh.channels(), per_head = sh.heads ? sh.H : ch;
    const struct {
      selscan_dtype_t t;
      int64_t n;
      Range r;
    } spec[] = {{bf, batch * ch, input_range(kU)},       {bf, batch * per_head, input_range(kDelta)},
                {bf, batch * ch, input_range(kZ)},       {bf, batch * sh.N, input_range(kB)},
                {bf, batch * sh.N, input_range(kB)},     {f32, sh.heads ? sh.H : ch * sh.N, {-2.f, -0.1f}},
                {f32, per_head, input_range(kD)},        {f32, per_head, input_range(kBias)}};
    uint64_t seed = 11;
    for (const auto& s : spec) {
      bufs.emplace_back(static_cast<size_t>(s.n * dtype_size(s.t)));
      fill_uniform(bufs.back().data(), s.t, s.n, s.r.lo, s.r.hi, ++seed);
    }
  }
};

void set_counters(benchmark::State& st, const Shape& sh, int64_t batch, selscan_dtype_t sd, double t,
                  double floor_bw) {
  const double bytes = call_bytes(sh, batch, sd, itype_for(sd));
  st.counters["us"] = t * 1e6;
  st.counters["bytes"] = bytes;
  st.counters["GB_s"] = bytes / t * 1e-9;
  if (floor_bw > 0) {
    const double floor_t = 2.0 * static_cast<double>(state_bytes(sh, batch, sd)) / floor_bw;
    st.counters["floor_us"] = floor_t * 1e6;
    st.counters["pct_of_floor"] = 100.0 * floor_t / t;
    st.counters["copy_GB_s"] = floor_bw * 1e-9;
  }
}

// ---------------------------------------------------------------------------------------------- CPU
void run_cpu(benchmark::State& st, int64_t batch, int threads) {
  const selscan_dtype_t sd = SELSCAN_DTYPE_FLOAT32;
  const Shape sh = kMamba1;
  HostInputs in(sh, batch, itype_for(sd));
  void* ptrs[8];
  for (int i = 0; i < 8; ++i) ptrs[i] = in.bufs[static_cast<size_t>(i)].data();
  std::vector<float> state(static_cast<size_t>(batch * sh.slot_elems()), 0.5f);
  std::vector<uint16_t> out(static_cast<size_t>(batch * sh.channels()));
  const selscan_state_update_args_t a =
      decode_args(sh, ptrs, state.data(), batch, sd, batch, 0, nullptr, out.data());
  selscan_exec_t ex = SELSCAN_EXEC_INIT;
  ex.num_threads = threads;
  std::vector<double> times;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    const selscan_status_t s = selscan_state_update(&a, &ex);
    const auto t1 = std::chrono::steady_clock::now();
    if (s != SELSCAN_STATUS_SUCCESS) {
      st.SkipWithError(selscan_last_error());
      return;
    }
    const double t = std::chrono::duration<double>(t1 - t0).count();
    st.SetIterationTime(t);
    times.push_back(t);
  }
  set_counters(st, sh, batch, sd, median_of(times), 0);
  st.counters["threads"] = threads;
}

#if defined(SELSCAN_WITH_CUDA) && SELSCAN_WITH_CUDA
// ---------------------------------------------------------------------------------------------- CUDA
constexpr double kMinPoolBytes = 512e6;
constexpr double kLargeSetBytes = 128e6;
constexpr int kCalls = 32;                     // timed back-to-back calls per iteration
constexpr size_t kBusyBytes = size_t{256} << 20;  // the copy that keeps the GPU busy while they are enqueued

std::string cuda_error(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

struct DeviceBuffers {
  std::vector<void*> ptrs;
  std::string error;
  void* alloc(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      if (error.empty()) error = cuda_error("cudaMalloc", e);
      (void)cudaGetLastError();
      return nullptr;
    }
    ptrs.push_back(p);
    return p;
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
};

// Device-to-device copy bandwidth, read + write counted: the median of 10 copies of 1 GiB (measured once).
double copy_bandwidth() {
  static const double bw = [] {
    DeviceBuffers b;
    const size_t n = size_t{1} << 30;
    void* src = b.alloc(n);
    void* dst = b.alloc(n);
    if (!src || !dst) return 0.0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> t;
    for (int i = 0; i < 12; ++i) {
      cudaEventRecord(e0);
      cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (i >= 2) t.push_back(1e-3 * ms);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * static_cast<double>(n) / median_of(t);
  }();
  return bw;
}

void run_cuda(benchmark::State& st, Shape sh, int64_t batch, selscan_dtype_t sd, bool pool, bool dst) {
  DeviceBuffers dev;
  HostInputs in(sh, batch, itype_for(sd));
  void* ptrs[8];
  for (int i = 0; i < 8; ++i) {
    const auto& h = in.bufs[static_cast<size_t>(i)];
    ptrs[i] = dev.alloc(h.size());
    if (ptrs[i]) cudaMemcpy(ptrs[i], h.data(), h.size(), cudaMemcpyHostToDevice);
  }
  const int64_t slot_bytes = sh.slot_elems() * dtype_size(sd);
  const double set_bytes = static_cast<double>(batch * slot_bytes);
  // A set larger than the L2 twice over cannot be found there by the next call: two windows alternate. Smaller
  // sets rotate through more windows than a timed batch has calls.
  const int64_t min_windows = set_bytes >= kLargeSetBytes ? 2 : kCalls + 1;
  const int64_t windows = std::max<int64_t>(min_windows, static_cast<int64_t>(std::ceil(kMinPoolBytes / set_bytes)));
  const int64_t slots = windows * batch;
  void* state = dev.alloc(static_cast<size_t>(slots * slot_bytes));
  void* out = dev.alloc(static_cast<size_t>(batch * sh.channels() * 2));
  void* busy_src = dev.alloc(kBusyBytes);
  void* busy_dst = dev.alloc(kBusyBytes);
  void* idx = pool ? dev.alloc(static_cast<size_t>(windows * batch * 4)) : nullptr;
  if (!dev.error.empty()) {
    st.SkipWithError(dev.error.c_str());
    return;
  }
  {  // state values: a repeated random tile; pool indices: a random permutation of the slots, window by window
    std::vector<unsigned char> tile(static_cast<size_t>(slot_bytes));
    fill_uniform(tile.data(), sd, sh.slot_elems(), -1.f, 1.f, 5);
    cudaMemcpy(state, tile.data(), tile.size(), cudaMemcpyHostToDevice);
    for (int64_t s = 1; s < slots; ++s)
      cudaMemcpy(static_cast<unsigned char*>(state) + s * slot_bytes, state, tile.size(), cudaMemcpyDeviceToDevice);
    if (pool) {
      std::vector<int32_t> perm(static_cast<size_t>(slots));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
      cudaMemcpy(idx, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice);
    }
  }
  std::vector<selscan_state_update_args_t> args;
  for (int64_t w = 0; w < windows; ++w)
    // dst: read this window's slots, write the next window's (as many bytes as in place, other addresses).
    args.push_back(decode_args(sh, ptrs, state, slots, sd, batch, w * batch,
                               pool ? static_cast<int32_t*>(idx) + w * batch : nullptr, out,
                               dst ? static_cast<int32_t*>(idx) + (w + 1) % windows * batch : nullptr));
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  selscan_exec_t ex = SELSCAN_EXEC_INIT;
  ex.device_kind = SELSCAN_DEVICE_CUDA;
  ex.stream = stream;
  for (const auto& a : args)  // warm-up: module load, first touch of every window
    if (selscan_state_update(&a, &ex) != SELSCAN_STATUS_SUCCESS) {
      st.SkipWithError(selscan_last_error());
      return;
    }
  cudaStreamSynchronize(stream);

  std::vector<double> times;
  size_t next = 0;
  for (auto _ : st) {
    cudaMemcpyAsync(busy_dst, busy_src, kBusyBytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(e0, stream);
    for (int k = 0; k < kCalls; ++k) {
      (void)selscan_state_update(&args[next], &ex);
      next = (next + 1) % args.size();
    }
    cudaEventRecord(e1, stream);
    const cudaError_t e = cudaEventSynchronize(e1);
    float ms = 0;
    if (e != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
      st.SkipWithError(cuda_error("timed calls", e).c_str());
      break;
    }
    const double t = 1e-3 * static_cast<double>(ms) / kCalls;
    st.SetIterationTime(t);
    times.push_back(t);
  }
  if (!times.empty()) {
    set_counters(st, sh, batch, sd, median_of(times), copy_bandwidth());
    st.counters["pool_MB"] = static_cast<double>(slots * slot_bytes) * 1e-6;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
}
#endif

const bool registered = [] {
  for (int64_t bt : {1, 16})
    for (int threads : {1, 2})
      benchmark::RegisterBenchmark(
          ("decode/cpu/fp32/Bt=" + std::to_string(bt) + "/threads=" + std::to_string(threads)).c_str(), run_cpu, bt,
          threads)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
#if defined(SELSCAN_WITH_CUDA) && SELSCAN_WITH_CUDA
  int32_t n = 0;
  if (selscan_cuda_device_count(&n) != SELSCAN_STATUS_SUCCESS || n == 0 ||
      selscan_check_device(0) != SELSCAN_STATUS_SUCCESS)
    return false;
  const struct {
    const char* name;
    Shape sh;
    selscan_dtype_t sd;
    bool pool, dst;
  } rows[] = {{"fp32", kMamba1, SELSCAN_DTYPE_FLOAT32, false, false},
              {"fp32_pool", kMamba1, SELSCAN_DTYPE_FLOAT32, true, false},
              {"fp32_pool_dst", kMamba1, SELSCAN_DTYPE_FLOAT32, true, true},
              {"bf16", kMamba1, SELSCAN_DTYPE_BFLOAT16, false, false},
              {"m2_fp32", kMamba2, SELSCAN_DTYPE_FLOAT32, false, false},
              {"m2_fp32_pool", kMamba2, SELSCAN_DTYPE_FLOAT32, true, false},
              {"m2_bf16", kMamba2, SELSCAN_DTYPE_BFLOAT16, false, false},
              {"m2_fp16", kMamba2, SELSCAN_DTYPE_FLOAT16, false, false}};
  for (const auto& r : rows) {
    std::vector<int64_t> batches(std::begin(kBatches), std::end(kBatches));
    if (r.sh.heads) batches.assign(std::begin(kBatchesM2), std::end(kBatchesM2));
    for (int64_t bt : batches)
      benchmark::RegisterBenchmark(("decode/cuda/" + std::string(r.name) + "/Bt=" + std::to_string(bt)).c_str(),
                                   run_cuda, r.sh, bt, r.sd, r.pool, r.dst)
          ->UseManualTime()
          // A fixed count: each iteration is a batch of kCalls steps behind a copy that keeps the GPU busy and
          // ends in a synchronisation, so it costs ~100x the per-step time it reports; left to itself the library
          // would run ~10^5 of them per row.
          ->Iterations(50)
          ->Unit(benchmark::kMicrosecond);
  }
#endif
  return true;
}();

}  // namespace
}  // namespace selscan_bench
