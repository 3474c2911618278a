// A contiguous problem on a device, through the public ABI only: where it runs (Target), the GPUs there are
// (list_devices), its tensors (TensorId, layout), host values for them (HostData, make_inputs), and the tensors
// allocated on the CPU or on a CUDA device (through the driver API, support/cuda_driver.h) wired into the
// argument structs (DeviceCase). Used by the `selscan` command and the benchmarks.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "selscan/selscan.h"
#include "support/cuda_driver.h"
#include "support/spec.h"

namespace selscan_support {

// Where a case runs.
struct Target {
  selscan_device_kind_t kind = SELSCAN_DEVICE_CPU;
  int32_t index = 0;
  int32_t num_threads = 0;   // CPU workers (0: the library's default)
  std::string name() const;  // "cpu", "cuda:0"
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t total_mem = 0;
  int sm_count = 0;
  int clock_khz = 0;  // peak SM clock
  size_t l2_bytes = 0;
  selscan_status_t check = SELSCAN_STATUS_NO_DEVICE;  // selscan_check_device
  std::string check_message;                          // selscan_last_error() when not SUCCESS
  bool usable() const { return check == SELSCAN_STATUS_SUCCESS; }
};
// Every CUDA device the driver shows (empty without a driver), with whether this build runs on it.
std::vector<DeviceInfo> list_devices();

// The tensors of a contiguous case: inputs, then outputs; the backward's follow the forward's.
enum TensorId : int {
  kU, kDelta, kA, kB, kC, kD, kZ, kBias,          // forward inputs
  kOut, kOutZ, kX, kLast,                         // forward outputs
  kDout,                                          // backward input
  kDu, kDdelta, kDA, kDB, kDC, kDD, kDz, kDbias,  // backward outputs
  kTensorCount
};
const char* tensor_name(int t);  // "u", "delta_bias", "ddelta_bias", ...
bool is_output(int t);

struct TensorLayout {
  bool present = false;
  int32_t dtype = SELSCAN_DTYPE_FLOAT32;
  int32_t ndim = 0;
  std::array<int64_t, 4> sizes{};
  int64_t numel() const;
  size_t bytes() const;
};
// Tensor t of spec s, contiguous (real weights, no h0: what DeviceCase supports). x is present when s.with_x,
// last_state when s.with_last_state.
TensorLayout layout(const CaseSpec& s, int t);

// Host values of every tensor of a case, contiguous, one float each (fp32, fp16 and bf16 values are floats).
struct HostData {
  std::array<std::vector<float>, kTensorCount> v;
};
// Inputs (u, delta, A, B, C, D, z, delta_bias, dout) drawn like upstream's tests (u, B, C, D, z, dout normal;
// delta uniform in the spec's range, 0.5 U(0,1) by default; A -0.5 U(0,1), or log-uniform in [-1, -1e-3] with
// slow_decay; delta_bias 0.5 U(0,1)), each rounded to its tensor's dtype. Seeded.
HostData make_inputs(const CaseSpec& s, uint64_t seed);

// A case's tensors allocated on a target and the argument structs pointing at them.
class DeviceCase {
 public:
  struct Options {
    bool backward = true;       // allocate dout and the gradients (else the forward's tensors only)
    bool own_workspace = true;  // allocate the larger of the two calls' workspaces (else: use_workspace)
    CUstream stream = nullptr;  // CUDA: the stream the calls go to (not destroyed here); null: one created here
  };
  DeviceCase() = default;
  DeviceCase(const DeviceCase&) = delete;
  DeviceCase& operator=(const DeviceCase&) = delete;
  ~DeviceCase();

  // Allocates the tensors of `s` on `target` and poisons the outputs; the inputs are left to upload / fill
  // (or given: the second form uploads every input of `in`). False with `err` set on failure.
  bool init(const CaseSpec& s, const Target& target, const Options& opt, std::string* err);
  bool init(const CaseSpec& s, const Target& target, const HostData& in, std::string* err);
  // Fills every output with NaN bytes (0xFF), so an output the library forgot to write cannot pass.
  bool poison_outputs(std::string* err);
  // Copies host values into tensor t (rounded to its dtype).
  bool upload(int t, const std::vector<float>& v, std::string* err);
  // Fills tensor t by repeating `tile`, bytes of its dtype (a whole number of elements).
  bool fill(int t, const std::vector<unsigned char>& tile, std::string* err);
  // Copies tensor t back into out->v[t]; `bytes` of it from byte `offset` into dst.
  bool fetch(int t, HostData* out, std::string* err);
  bool download(int t, size_t offset, void* dst, size_t bytes, std::string* err);
  // The workspace size the two calls need, and one to use instead of an own one (Options::own_workspace).
  size_t workspace_needed() const { return workspace_needed_; }
  void use_workspace(void* p, size_t bytes);
  // Enqueue (CUDA) or run (CPU) one call. A non-success status carries the library's message in `err`.
  bool fwd(std::string* err);
  bool bwd(std::string* err);
  bool sync(std::string* err);

  const CaseSpec& spec() const { return spec_; }
  const Target& target() const { return target_; }
  bool allocated(int t) const { return ptr_[t] != nullptr; }
  const selscan_fwd_args_t& fwd_args() const { return fa_; }
  const selscan_bwd_args_t& bwd_args() const { return ba_; }
  const selscan_exec_t& exec() const { return exec_; }
  CUstream stream() const { return stream_; }
  size_t device_bytes() const { return total_bytes_; }  // tensors and own workspace

 private:
  bool alloc(size_t bytes, void** p, std::string* err);
  void release(void* p);
  bool copy_in(void* dst, const void* src, size_t n, std::string* err);
  bool current(std::string* err);  // CUDA: make the target's context current
  void build_args();

  CaseSpec spec_;
  Target target_;
  bool backward_ = true;
  std::array<void*, kTensorCount> ptr_{};
  void* workspace_ = nullptr;  // owned
  size_t workspace_needed_ = 0;
  size_t total_bytes_ = 0;
  CUstream stream_ = nullptr;
  bool own_stream_ = false;
  selscan_exec_t exec_ = SELSCAN_EXEC_INIT;
  selscan_fwd_args_t fa_{};
  selscan_bwd_args_t ba_{};
};

}  // namespace selscan_support
