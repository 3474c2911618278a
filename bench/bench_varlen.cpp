// Varlen prefill (docs/serving.md): a batch of sequences of mixed lengths packed along time with cu_seqlens,
// against the same sequences padded to the longest one in a dense (Bt, D, Lmax) call. Both count only the real
// tokens (counter tokens_per_s), so the ratio is what packing saves. Sections, by name prefix:
//   gpu_varlen/{fwd_infer,bwd}/packed/<mix>   selscan_fwd (out, out_z, last_state) / selscan_bwd on the packed call
//   gpu_varlen/{fwd_infer,bwd}/padded/<mix>   the dense call over the padded batch
//   gpu_varlen/fwd_infer/pool/<mix>           the packed forward with a state pool (ssm_states, cache_indices)
//                                             in place of last_state
//   gpu_varlen/fwd_infer/blocks256/<mix>      the same with block-wise state caching, K = 256 (state_block_size,
//                                             block_table): what writing every block's state costs over pool/
// Mixes: lengths drawn from a fixed list (no randomness between runs); D = 5120 (Mamba-2.8b), N = 16, bf16,
// variable B/C with one group, D, z, delta_bias, softplus. Environment: SELSCAN_BENCH_DEVICE as bench_gpu.cpp.
#if SELSCAN_WITH_CUDA

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "selscan/selscan.h"
#include "support/abi.h"

namespace {

using selscan_support::contiguous_desc;

constexpr int64_t kDim = 5120, kN = 16;

// Sequence lengths of a mix: `count` sequences cycling through `pattern`.
std::vector<int64_t> mix(const std::vector<int64_t>& pattern, int count) {
  std::vector<int64_t> v;
  for (int i = 0; i < count; ++i) v.push_back(pattern[static_cast<size_t>(i) % pattern.size()]);
  return v;
}

// Device buffers of one call, freed on destruction; bf16 inputs filled with small values (0x3c00..: about 0.008).
struct Buffers {
  std::vector<void*> owned;
  cudaError_t err = cudaSuccess;
  void* alloc(size_t bytes, unsigned char fill) {
    void* p = nullptr;
    if (err == cudaSuccess) err = cudaMalloc(&p, bytes);
    if (err == cudaSuccess) err = cudaMemset(p, fill, bytes);
    owned.push_back(p);
    return p;
  }
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }
};

// How the sequences are passed: padded to the longest (dense), packed, packed with a state pool, packed with a
// state pool and block-wise state caching.
enum class Layout { padded, packed, pool, blocks };
constexpr int64_t kBlock = 256;

void run(benchmark::State& state, std::vector<int64_t> lens, Layout layout, bool bwd) {
  const bool packed = layout != Layout::padded;
  int dev = 0;
  if (const char* env = std::getenv("SELSCAN_BENCH_DEVICE")) dev = std::atoi(env);
  int32_t count = 0;
  if (selscan_cuda_device_count(&count) != SELSCAN_STATUS_SUCCESS || count <= dev ||
      selscan_check_device(dev) != SELSCAN_STATUS_SUCCESS) {
    state.SkipWithError("no usable CUDA device");
    return;
  }
  cudaSetDevice(dev);
  const int64_t Bt = static_cast<int64_t>(lens.size());
  const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  const int64_t Lmax = *std::max_element(lens.begin(), lens.end());
  const int64_t rows = packed ? 1 : Bt, T = packed ? total : Lmax;
  const selscan_dtype_t bf = SELSCAN_DTYPE_BFLOAT16, f32 = SELSCAN_DTYPE_FLOAT32;
  const size_t io = static_cast<size_t>(rows * kDim * T) * 2, bc = static_cast<size_t>(rows * kN * T) * 2;
  Buffers m;
  std::vector<int64_t> shape{rows, kDim, T}, bcs{rows, 1, kN, T};
  selscan_fwd_args_t f = SELSCAN_FWD_ARGS_INIT;
  f.u = contiguous_desc(m.alloc(io, 0x3c), bf, shape);
  f.delta = contiguous_desc(m.alloc(io, 0x3c), bf, shape);
  f.z = contiguous_desc(m.alloc(io, 0x3c), bf, shape);
  f.B = contiguous_desc(m.alloc(bc, 0x3c), bf, bcs);
  f.C = contiguous_desc(m.alloc(bc, 0x3c), bf, bcs);
  f.A = contiguous_desc(m.alloc(kDim * kN * 4, 0xbc), f32, {kDim, kN});  // 0xbcbcbcbc: about -0.023
  f.D = contiguous_desc(m.alloc(kDim * 4, 0x3c), f32, {kDim});
  f.delta_bias = contiguous_desc(m.alloc(kDim * 4, 0x3c), f32, {kDim});
  f.delta_softplus = 1;
  f.out = contiguous_desc(m.alloc(io, 0), bf, shape);
  f.out_z = contiguous_desc(m.alloc(io, 0), bf, shape);
  if (layout == Layout::pool || layout == Layout::blocks) {
    // One slot per sequence (pool) or per K-token block of each sequence (blocks), in order.
    std::vector<int32_t> slots;
    int64_t cols = 1, S = 0;
    for (int64_t len : lens) cols = std::max(cols, layout == Layout::blocks ? (len + kBlock - 1) / kBlock : 1);
    for (int64_t len : lens) {
      const int64_t used = layout == Layout::blocks ? (len + kBlock - 1) / kBlock : 1;
      for (int64_t j = 0; j < cols; ++j) slots.push_back(j < used ? static_cast<int32_t>(S + j) : -1);
      S += used;
    }
    f.ssm_states = contiguous_desc(m.alloc(static_cast<size_t>(S * kDim * kN) * 4, 0), f32, {S, kDim, kN});
    void* d = m.alloc(slots.size() * 4, 0);
    if (m.err == cudaSuccess) m.err = cudaMemcpy(d, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice);
    f.pad_slot_id = -1;
    if (layout == Layout::blocks) {
      f.state_block_size = kBlock;
      f.block_table = contiguous_desc(d, SELSCAN_DTYPE_INT32, {Bt, cols});
    } else {
      f.cache_indices = contiguous_desc(d, SELSCAN_DTYPE_INT32, {Bt});
    }
  } else {
    f.last_state = contiguous_desc(m.alloc(static_cast<size_t>(Bt * kDim * kN) * 4, 0), f32, {Bt, kDim, kN});
  }
  if (packed) {
    std::vector<int32_t> cu(static_cast<size_t>(Bt + 1), 0);
    for (int64_t b = 0; b < Bt; ++b) cu[static_cast<size_t>(b + 1)] = cu[static_cast<size_t>(b)] + static_cast<int32_t>(lens[static_cast<size_t>(b)]);
    void* d = m.alloc(cu.size() * 4, 0);
    if (m.err == cudaSuccess) m.err = cudaMemcpy(d, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice);
    f.cu_seqlens = contiguous_desc(d, SELSCAN_DTYPE_INT32, {Bt + 1});
  }
  selscan_bwd_args_t g = SELSCAN_BWD_ARGS_INIT;
  if (bwd) {
    g.u = f.u, g.delta = f.delta, g.A = f.A, g.B = f.B, g.C = f.C, g.D = f.D, g.z = f.z, g.delta_bias = f.delta_bias;
    g.delta_softplus = 1, g.cu_seqlens = f.cu_seqlens;
    g.dout = contiguous_desc(m.alloc(io, 0x3c), bf, shape);
    g.out = f.out;
    const int64_t nc = packed ? T / SELSCAN_CHUNK + Bt : (T + SELSCAN_CHUNK - 1) / SELSCAN_CHUNK;
    g.x = contiguous_desc(m.alloc(static_cast<size_t>(rows * kDim * nc * 2 * kN) * 4, 0), f32, {rows, kDim, nc, 2 * kN});
    f.x = g.x;
    g.du = contiguous_desc(m.alloc(io, 0), bf, shape);
    g.ddelta = contiguous_desc(m.alloc(io, 0), bf, shape);
    g.dz = contiguous_desc(m.alloc(io, 0), bf, shape);
    g.dA = contiguous_desc(m.alloc(kDim * kN * 4, 0), f32, {kDim, kN});
    g.dB = contiguous_desc(m.alloc(bc, 0), bf, bcs);
    g.dC = contiguous_desc(m.alloc(bc, 0), bf, bcs);
    g.dD = contiguous_desc(m.alloc(kDim * 4, 0), f32, {kDim});
    g.ddelta_bias = contiguous_desc(m.alloc(kDim * 4, 0), f32, {kDim});
  }
  cudaStream_t st = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (m.err == cudaSuccess) m.err = cudaStreamCreate(&st);
  if (m.err == cudaSuccess) m.err = cudaEventCreate(&e0);
  if (m.err == cudaSuccess) m.err = cudaEventCreate(&e1);
  selscan_exec_t ex = SELSCAN_EXEC_INIT;
  ex.device_kind = SELSCAN_DEVICE_CUDA;
  ex.device_index = dev;
  ex.stream = st;
  size_t ws = 0;
  selscan_status_t s = SELSCAN_STATUS_SUCCESS;
  if (m.err == cudaSuccess && bwd) {
    s = selscan_fwd(&f, &ex);  // the chunk states and out the backward reads
    if (s == SELSCAN_STATUS_SUCCESS) s = selscan_bwd_workspace_size(&g, &ex, &ws);
    if (s == SELSCAN_STATUS_SUCCESS && ws > 0) ex.workspace = m.alloc(ws, 0), ex.workspace_bytes = ws;
  }
  if (m.err != cudaSuccess || s != SELSCAN_STATUS_SUCCESS) {
    state.SkipWithError(m.err != cudaSuccess ? cudaGetErrorString(m.err) : selscan_last_error());
    return;
  }
  for (auto _ : state) {
    cudaEventRecord(e0, st);
    s = bwd ? selscan_bwd(&g, &ex) : selscan_fwd(&f, &ex);
    cudaEventRecord(e1, st);
    float ms = 0.f;
    if (s != SELSCAN_STATUS_SUCCESS || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
      state.SkipWithError(s != SELSCAN_STATUS_SUCCESS ? selscan_last_error() : "CUDA event failure");
      break;
    }
    state.SetIterationTime(1e-3 * ms);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = static_cast<double>(total);
  state.counters["padded_tokens"] = static_cast<double>(Bt * Lmax);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
}

// Two mixes of chat-like prompts: many short with a few long, and a flatter spread.
const std::vector<int64_t> kSkewed = mix({48, 112, 2000, 64, 300, 96, 32, 800}, 32);
const std::vector<int64_t> kSpread = mix({256, 384, 512, 640, 768, 896, 1024, 128}, 32);

int register_all() {
  const std::pair<Layout, const char*> layouts[] = {
      {Layout::packed, "packed/"}, {Layout::padded, "padded/"}, {Layout::pool, "pool/"}, {Layout::blocks, "blocks256/"}};
  for (bool bwd : {false, true})
    for (const auto& [layout, tag] : layouts) {
      if (bwd && (layout == Layout::pool || layout == Layout::blocks)) continue;  // forward-only serving rows
      for (const auto& m : {std::make_pair("skewed32", &kSkewed), std::make_pair("spread32", &kSpread)}) {
        const std::string name = std::string("gpu_varlen/") + (bwd ? "bwd" : "fwd_infer") + "/" + tag + m.first;
        const std::vector<int64_t> lens = *m.second;
        const Layout lay = layout;
        benchmark::RegisterBenchmark(name.c_str(), [lens, lay, bwd](benchmark::State& st) {
          run(st, lens, lay, bwd);
        })->UseManualTime()->Unit(benchmark::kMillisecond);
      }
    }
  return 0;
}
const int kRegistered = register_all();

}  // namespace

#endif  // SELSCAN_WITH_CUDA
