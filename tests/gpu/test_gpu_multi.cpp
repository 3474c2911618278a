// Two GPUs at once (issue #6), through the public ABI only. Host threads run forward + deterministic backward on
// device 0 and device 1 at the same time, each with its tensors, workspace and stream on its own device, while
// the calling thread's current device is deliberately the other one before every call. Every result must be
// bitwise equal to a serial single-thread run on that device, every call must leave the caller's current device
// as it found it, and (on two devices of the same model) the two devices must agree bitwise as well.
// Skips with the reason when fewer than two usable devices are visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_gate.h"
#include "selscan/selscan.h"
#include "support/abi.h"
#include "support/dtype.h"
#include "support/rng.h"

namespace {

using selscan_support::contiguous_desc;
using selscan_support::dtype_size;
using selscan_support::Rng;
using selscan_support::store_real;

// Two chunks (the backward reads the saved states x), three 8-channel tiles per group, odd tail.
constexpr int64_t Bt = 2, D = 96, L = 2600, N = 16, G = 2;

struct Config {
  const char* name;
  int32_t itype;
  bool cplx, varC, h0;
};

// The calling thread's current device for a scope.
class OnDevice {
 public:
  explicit OnDevice(int d) {
    cudaGetDevice(&prev_);
    cudaSetDevice(d);
  }
  ~OnDevice() { cudaSetDevice(prev_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int prev_ = 0;
};

struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  int device = 0;
  Buffer(int dev, size_t n) : bytes(n), device(dev) {
    OnDevice on(dev);
    if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~Buffer() {
    if (p) {
      OnDevice on(device);
      cudaFree(p);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

struct TSpec {
  std::string name;
  int32_t dtype;
  std::vector<int64_t> sizes;
  bool input;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
};

std::vector<TSpec> tensor_specs(const Config& c) {
  const int32_t it = c.itype, wt = c.cplx ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const int32_t f32 = SELSCAN_DTYPE_FLOAT32;
  const int64_t nc = (L + 2047) / 2048, Lbc = c.cplx ? 2 * L : L;
  const std::vector<int64_t> bdl{Bt, D, L}, dn{D, N}, bgnl{Bt, G, N, Lbc}, bdn{Bt, D, N};
  std::vector<TSpec> v = {
      {"u", it, bdl, true},           {"delta", it, bdl, true},        {"A", wt, dn, true},
      {"B", it, bgnl, true},          {"D", f32, {D}, true},           {"z", it, bdl, true},
      {"delta_bias", f32, {D}, true}, {"dout", it, bdl, true},         {"out", it, bdl, false},
      {"out_z", it, bdl, false},      {"x", wt, {Bt, D, nc, 2 * N}, false}, {"last_state", wt, bdn, false},
      {"du", it, bdl, false},         {"ddelta", it, bdl, false},      {"dA", wt, dn, false},
      {"dB", it, bgnl, false},        {"dD", f32, {D}, false},         {"dz", it, bdl, false},
      {"ddelta_bias", f32, {D}, false}};
  v.push_back({"C", c.varC ? it : wt, c.varC ? bgnl : dn, true});
  v.push_back({"dC", c.varC ? it : wt, c.varC ? bgnl : dn, false});
  if (c.h0) {
    v.push_back({"h0", wt, bdn, true});
    v.push_back({"dh0", wt, bdn, false});
  }
  return v;
}

// Host bytes of every input, from one seed.
std::map<std::string, std::vector<unsigned char>> host_inputs(const Config& c, uint64_t seed) {
  std::map<std::string, std::vector<unsigned char>> m;
  Rng r(seed);
  for (const TSpec& t : tensor_specs(c)) {
    if (!t.input) continue;
    std::vector<unsigned char>& b = m[t.name];
    const int64_t n = t.numel(), es = dtype_size(t.dtype);
    b.resize(static_cast<size_t>(n * es));
    for (int64_t i = 0; i < n; ++i) {
      unsigned char* p = b.data() + i * es;
      if (t.dtype == SELSCAN_DTYPE_COMPLEX64) {
        const bool a = t.name == "A";
        store_real(SELSCAN_DTYPE_FLOAT32, p, a ? -0.02 - 0.48 * r.uniform() : r.normal());
        store_real(SELSCAN_DTYPE_FLOAT32, p + 4, a ? 2.0 * r.normal() : r.normal());
        continue;
      }
      double v = r.normal();
      if (t.name == "delta" || t.name == "delta_bias") v = 0.5 * r.uniform();
      if (t.name == "A") v = -std::exp(std::log(1e-3) * r.uniform());  // some slow states: they cross the chunk
      store_real(t.dtype, p, v);
    }
  }
  return m;
}

selscan_tensor_t desc(const TSpec& t, void* p) { return contiguous_desc(p, t.dtype, t.sizes); }

using Bytes = std::vector<std::vector<unsigned char>>;

// One caller's complete set on one device: the shared inputs (read-only, one copy per device) and its own
// outputs and workspace.
class Call {
 public:
  Call(const Config& c, int device, const std::map<std::string, std::shared_ptr<Buffer>>& inputs)
      : device_(device), specs_(tensor_specs(c)) {
    for (const TSpec& t : specs_) {
      if (t.input) {
        buf_[t.name] = inputs.at(t.name);
      } else {
        buf_[t.name] = std::make_shared<Buffer>(device, static_cast<size_t>(t.numel() * dtype_size(t.dtype)));
        ok_ = ok_ && buf_[t.name]->p != nullptr;
      }
    }
    auto d = [&](const char* name) {
      for (const TSpec& t : specs_)
        if (t.name == name) return desc(t, buf_.at(name)->p);
      return selscan_tensor_t{};  // absent
    };
    fa_.struct_size = sizeof(fa_);
    fa_.u = d("u");
    fa_.delta = d("delta");
    fa_.A = d("A");
    fa_.B = d("B");
    fa_.C = d("C");
    fa_.D = d("D");
    fa_.z = d("z");
    fa_.delta_bias = d("delta_bias");
    fa_.h0 = d("h0");
    fa_.delta_softplus = 1;
    fa_.out = d("out");
    fa_.out_z = d("out_z");
    fa_.x = d("x");
    fa_.last_state = d("last_state");
    ba_ = selscan_support::bwd_args_with_inputs_of(fa_, true);
    ba_.dout = d("dout");
    ba_.x = fa_.x;
    ba_.out = fa_.out;
    ba_.du = d("du");
    ba_.ddelta = d("ddelta");
    ba_.dA = d("dA");
    ba_.dB = d("dB");
    ba_.dC = d("dC");
    ba_.dD = d("dD");
    ba_.dz = d("dz");
    ba_.ddelta_bias = d("ddelta_bias");
    ba_.dh0 = d("dh0");
    const selscan_exec_t e = exec(nullptr);
    size_t f = 0, b = 0;
    ok_ = ok_ && selscan_fwd_workspace_size(&fa_, &e, &f) == SELSCAN_STATUS_SUCCESS &&
          selscan_bwd_workspace_size(&ba_, &e, &b) == SELSCAN_STATUS_SUCCESS;
    const size_t w = f > b ? f : b;
    if (ok_ && w > 0) {
      ws_ = std::make_unique<Buffer>(device, w);
      ok_ = ws_->p != nullptr;
    }
  }
  bool ok() const { return ok_; }
  int device() const { return device_; }

  selscan_exec_t exec(cudaStream_t s) const {
    selscan_exec_t e = SELSCAN_EXEC_INIT;
    e.device_kind = SELSCAN_DEVICE_CUDA;
    e.device_index = device_;
    e.stream = s;
    e.workspace = ws_ ? ws_->p : nullptr;
    e.workspace_bytes = ws_ ? ws_->bytes : 0;
    return e;
  }

  // Poisons the outputs (NaN bytes, on `s`, with this call's device current), then makes `caller_device`
  // current and runs forward + backward. `kept` tells whether each call left `caller_device` current.
  selscan_status_t run(cudaStream_t s, int caller_device, bool* kept, std::string* err) {
    {
      OnDevice on(device_);
      for (const TSpec& t : specs_)
        if (!t.input && cudaMemsetAsync(buf_[t.name]->p, 0xFF, buf_[t.name]->bytes, s) != cudaSuccess) {
          *err = "cudaMemsetAsync failed";
          return SELSCAN_STATUS_CUDA_ERROR;
        }
    }
    cudaSetDevice(caller_device);
    const selscan_exec_t e = exec(s);
    int now = -1;
    selscan_status_t st = selscan_fwd(&fa_, &e);
    cudaGetDevice(&now);
    *kept = *kept && now == caller_device;
    if (st == SELSCAN_STATUS_SUCCESS) {
      st = selscan_bwd(&ba_, &e);
      cudaGetDevice(&now);
      *kept = *kept && now == caller_device;
    }
    if (st != SELSCAN_STATUS_SUCCESS) *err = selscan_last_error();
    return st;
  }

  // Every output's bytes (waits for `s` on this call's device first).
  Bytes download(cudaStream_t s) {
    OnDevice on(device_);
    Bytes r;
    if (cudaStreamSynchronize(s) != cudaSuccess) return r;
    for (const TSpec& t : specs_) {
      if (t.input) continue;
      r.emplace_back(buf_[t.name]->bytes);
      if (cudaMemcpy(r.back().data(), buf_[t.name]->p, r.back().size(), cudaMemcpyDeviceToHost) != cudaSuccess)
        r.back().clear();
    }
    return r;
  }
  std::vector<std::string> output_names() const {
    std::vector<std::string> v;
    for (const TSpec& t : specs_)
      if (!t.input) v.push_back(t.name);
    return v;
  }
  const std::vector<TSpec>& specs() const { return specs_; }

 private:
  int device_;
  std::vector<TSpec> specs_;
  std::map<std::string, std::shared_ptr<Buffer>> buf_;
  std::unique_ptr<Buffer> ws_;
  selscan_fwd_args_t fa_{};
  selscan_bwd_args_t ba_{};
  bool ok_ = true;
};

// The inputs on one device.
std::map<std::string, std::shared_ptr<Buffer>> upload(int device,
                                                      const std::map<std::string, std::vector<unsigned char>>& h) {
  std::map<std::string, std::shared_ptr<Buffer>> m;
  OnDevice on(device);
  for (const auto& [name, bytes] : h) {
    auto b = std::make_shared<Buffer>(device, bytes.size());
    if (b->p == nullptr || cudaMemcpy(b->p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess)
      return {};
    m[name] = b;
  }
  return m;
}

// Bitwise equality per output.
void expect_same(const Bytes& got, const Bytes& want, const std::vector<TSpec>& specs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what << ": outputs could not be read back";
  size_t k = 0;
  for (const TSpec& t : specs) {
    if (t.input) continue;
    const auto& g = got[k];
    const auto& w = want[k++];
    ASSERT_EQ(g.size(), w.size()) << what << ": " << t.name << " could not be read back";
    EXPECT_EQ(std::memcmp(g.data(), w.data(), g.size()), 0) << what << ": " << t.name << " differs bitwise";
  }
}

// No output element left as the all-0xFF poison (the inputs are finite, so every output is).
void expect_written(const Bytes& got, const std::vector<TSpec>& specs, const std::string& what) {
  size_t k = 0;
  for (const TSpec& t : specs) {
    if (t.input) continue;
    ASSERT_LT(k, got.size()) << what << ": outputs could not be read back";
    const auto& g = got[k++];
    const int64_t es = dtype_size(t.dtype);
    int64_t unwritten = 0;
    for (size_t i = 0; i + static_cast<size_t>(es) <= g.size(); i += static_cast<size_t>(es)) {
      bool ff = true;
      for (int64_t b = 0; b < es; ++b) ff = ff && g[i + static_cast<size_t>(b)] == 0xFF;
      unwritten += ff;
    }
    EXPECT_EQ(unwritten, 0) << what << ": " << t.name << " has " << unwritten << " unwritten elements";
  }
}

bool two_gpus(std::string* why) {
  if (!selscan_test::gpu_usable(why)) return false;
  int32_t n = 0;
  selscan_cuda_device_count(&n);
  if (n < 2) {
    *why = "needs 2 CUDA devices, found " + std::to_string(n);
    return false;
  }
  if (selscan_check_device(1) != SELSCAN_STATUS_SUCCESS) {
    *why = std::string("device 1 is not served by this build: ") + selscan_last_error();
    return false;
  }
  return true;
}

void run_config(const Config& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  const auto host = host_inputs(c, seed);
  std::map<std::string, std::shared_ptr<Buffer>> inputs[2] = {upload(0, host), upload(1, host)};
  ASSERT_FALSE(inputs[0].empty() || inputs[1].empty()) << "could not place the inputs on both devices";

  // Serial reference per device: one thread, that device current, its legacy default stream.
  Bytes want[2];
  for (int dev = 0; dev < 2; ++dev) {
    OnDevice on(dev);
    Call ref(c, dev, inputs[dev]);
    ASSERT_TRUE(ref.ok()) << "device " << dev << ": allocation or workspace query failed: " << selscan_last_error();
    bool kept = true;
    std::string err;
    ASSERT_EQ(ref.run(nullptr, dev, &kept, &err), SELSCAN_STATUS_SUCCESS) << err;
    want[dev] = ref.download(nullptr);
    ASSERT_FALSE(want[dev].empty()) << "device " << dev << ": synchronisation failed";
    expect_written(want[dev], ref.specs(), "serial run on device " + std::to_string(dev));
  }
  cudaDeviceProp p0{}, p1{};
  cudaGetDeviceProperties(&p0, 0);
  cudaGetDeviceProperties(&p1, 1);
  if (std::string(p0.name) == p1.name && p0.major == p1.major && p0.minor == p1.minor)
    expect_same(want[1], want[0], tensor_specs(c), "device 1 vs device 0 (same model, same kernels)");

  // Concurrent: 4 threads per device, all started together, 3 repeats each; half of them on their own
  // non-blocking stream, half on the legacy default stream; the current device set to the other device.
  constexpr int kThreads = 8, kRepeats = 3;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kThreads; ++i) {
    calls.push_back(std::make_unique<Call>(c, i % 2, inputs[i % 2]));
    ASSERT_TRUE(calls.back()->ok()) << "thread " << i << ": allocation or workspace query failed";
  }
  std::vector<selscan_status_t> status(kThreads, SELSCAN_STATUS_SUCCESS);
  std::vector<std::string> errors(kThreads);
  std::vector<char> kept(kThreads, 1);
  std::vector<Bytes> got(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      Call& call = *calls[static_cast<size_t>(i)];
      const int dev = call.device(), other = 1 - dev;
      cudaStream_t s = nullptr;
      if ((i / 2) % 2 == 0) {
        OnDevice on(dev);
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      }
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      bool k = true;
      for (int r = 0; r < kRepeats && status[static_cast<size_t>(i)] == SELSCAN_STATUS_SUCCESS; ++r)
        status[static_cast<size_t>(i)] = call.run(s, other, &k, &errors[static_cast<size_t>(i)]);
      kept[static_cast<size_t>(i)] = k;
      got[static_cast<size_t>(i)] = call.download(s);
      if (s) {
        OnDevice on(dev);
        cudaStreamDestroy(s);
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    const size_t u = static_cast<size_t>(i);
    const std::string who = "thread " + std::to_string(i) + " on device " + std::to_string(i % 2) +
                            ((i / 2) % 2 == 0 ? " (own stream)" : " (legacy stream)");
    EXPECT_EQ(status[u], SELSCAN_STATUS_SUCCESS) << who << ": " << errors[u];
    EXPECT_TRUE(kept[u]) << who << ": a call changed the caller's current device";
    expect_same(got[u], want[i % 2], calls[u]->specs(), who + " vs the serial run on its device");
  }
}

TEST(GpuMulti, ConcurrentThreadsOnTwoDevicesMatchSerial) {
  std::string why;
  if (!two_gpus(&why)) GTEST_SKIP() << why;
  run_config({"bf16 real, variable B and C", SELSCAN_DTYPE_BFLOAT16, false, true, false}, 9001);
  run_config({"fp32 complex, variable B, constant C, h0", SELSCAN_DTYPE_FLOAT32, true, false, true}, 9002);
}

}  // namespace
