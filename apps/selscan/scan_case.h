// One selective-scan problem as the tool sees it: its shape and flags (CaseSpec), its tensors on the host as
// floats (HostData), and the same tensors on a device (CPU memory or a CUDA device through the driver
// API) wired into the public argument structs (DeviceCase). Only the public ABI is used.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "selscan/selscan.h"

namespace selscan_cli {

struct CaseSpec {
  int64_t batch = 2, dim = 768, seqlen = 1024, dstate = 16, groups = 1;
  selscan_dtype_t itype = SELSCAN_DTYPE_FLOAT32;
  bool var_B = true, var_C = true;
  bool has_D = true, has_z = true, has_bias = true, softplus = true;
  bool want_x = true;           // pass x to the forward (always done when L > SELSCAN_CHUNK: backward needs it)
  bool want_last_state = true;
  bool deterministic = false;

  int64_t nchunks() const { return (seqlen + SELSCAN_CHUNK - 1) / SELSCAN_CHUNK; }
  bool has_x() const { return want_x || seqlen > SELSCAN_CHUNK; }
  std::string shape_text() const;  // "2x768x1024:16" (":16/G2" when groups > 1)
  std::string flags_text() const;  // "var B/C, D, z, delta_bias, softplus"
  // Bt*D*L*N: the state updates one direction performs.
  double state_updates() const { return double(batch) * double(dim) * double(seqlen) * double(dstate); }
};

// A case of the given shape with every other field at its default.
inline CaseSpec case_spec(int64_t bt, int64_t d, int64_t l, int64_t n, selscan_dtype_t it, int64_t groups = 1) {
  CaseSpec s;
  s.batch = bt;
  s.dim = d;
  s.seqlen = l;
  s.dstate = n;
  s.groups = groups;
  s.itype = it;
  return s;
}

// Tensors of a case, inputs then outputs. Bwd-only inputs/outputs follow the forward ones.
enum Tensor : int {
  kU, kDelta, kA, kB, kC, kD, kZ, kBias,             // forward inputs
  kOut, kOutZ, kX, kLast,                            // forward outputs
  kDout,                                             // backward input
  kDu, kDdelta, kDA, kDB, kDC, kDD, kDz, kDbias,     // backward outputs
  kTensorCount
};
const char* tensor_name(int t);

struct TensorLayout {
  bool present = false;
  selscan_dtype_t dtype = SELSCAN_DTYPE_FLOAT32;
  int32_t ndim = 0;
  std::array<int64_t, 4> sizes{};
  int64_t numel() const;
  size_t bytes() const;
};
TensorLayout layout(const CaseSpec& s, int t);

size_t dtype_size(selscan_dtype_t t);
const char* dtype_name(selscan_dtype_t t);  // "fp32", "fp16", "bf16"
bool parse_dtype(const std::string& s, selscan_dtype_t* out);
// "BtxDxL:N" (optionally ":N:G") -> spec sizes. Returns false with `err` set when malformed.
bool parse_shape(const std::string& text, CaseSpec* s, std::string* err);

// Rounds a value to what the dtype can hold (round to nearest even) and encodes/decodes raw storage.
float round_to(selscan_dtype_t t, float v);
void encode(selscan_dtype_t t, const std::vector<float>& v, std::vector<uint8_t>* bytes);
void decode(selscan_dtype_t t, const std::vector<uint8_t>& bytes, std::vector<float>* v);

// Host copies of the tensors, contiguous. Every dtype the tool uses (fp32, fp16, bf16) is exactly a float.
struct HostData {
  std::array<std::vector<float>, kTensorCount> v;
};
// Random inputs (u, delta, A, B, C, D, z, delta_bias, dout) in the ranges upstream's tests use, rounded to
// each tensor's dtype; seeded. `tiled`: large tensors repeat a pool of ~1M random values (for benchmarks,
// where generating billions of values would dominate; the pool's prime length keeps rows from aligning).
HostData make_inputs(const CaseSpec& s, uint64_t seed, bool tiled = false);

// Where a case runs.
struct Target {
  selscan_device_kind_t kind = SELSCAN_DEVICE_CPU;
  int32_t index = 0;
  int32_t num_threads = 0;  // CPU
  std::string name() const;  // "cpu", "cuda:0"
};

// A case's tensors allocated on a target and the argument structs pointing at them.
class DeviceCase {
 public:
  DeviceCase() = default;
  DeviceCase(const DeviceCase&) = delete;
  DeviceCase& operator=(const DeviceCase&) = delete;
  ~DeviceCase();

  // Allocates every tensor (and the workspace) on `target`, uploads the inputs in `in` and poisons the
  // outputs. For CUDA, exec.stream is `stream` when given (not destroyed here), else a stream created here.
  // Returns false with `err` set on failure.
  bool init(const CaseSpec& s, const Target& target, const HostData& in, std::string* err,
            CUstream stream = nullptr);
  // Fills every output with NaN bytes (0xFF), so an output the library forgot to write cannot pass.
  bool poison_outputs(std::string* err);
  // Enqueue (CUDA) or run (CPU) one call. A non-success status carries the library's message in `err`.
  bool fwd(std::string* err);
  bool bwd(std::string* err);
  bool sync(std::string* err);
  // Copies tensor `t` back into out->v[t].
  bool fetch(int t, HostData* out, std::string* err);
  // Copies host values into tensor `t` (e.g. the reference's dout, or out for the backward).
  bool upload(int t, const std::vector<float>& v, std::string* err);

  const CaseSpec& spec() const { return spec_; }
  const Target& target() const { return target_; }
  CUstream stream() const { return stream_; }
  size_t device_bytes() const { return total_bytes_; }

 private:
  bool alloc(size_t bytes, void** p, std::string* err);
  void release(void* p);
  bool copy_in(void* dst, const void* src, size_t n, std::string* err);
  bool copy_out(void* dst, const void* src, size_t n, std::string* err);
  void build_args();

  CaseSpec spec_;
  Target target_;
  std::array<void*, kTensorCount> ptr_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  size_t total_bytes_ = 0;
  CUstream stream_ = nullptr;
  bool own_stream_ = false;
  selscan_exec_t exec_ = SELSCAN_EXEC_INIT;
  selscan_fwd_args_t fa_{};
  selscan_bwd_args_t ba_{};
};

// "invalid argument: <message>" for a failed call.
std::string status_text(selscan_status_t st);

// Agreement of one tensor with a reference: score = max_i |got_i - ref_i| / (|ref_i| + rms(ref)), i.e. an
// element-wise relative error that does not blow up on the near-zero elements of a tensor. NaN/Inf fail.
struct Agreement {
  std::string name;
  double max_abs = 0;  // max |got - ref|
  double score = 0;
  double tol = 0;
  bool pass = false;
};
Agreement compare(const std::string& name, const std::vector<float>& got, const std::vector<double>& ref,
                  double tol);
Agreement compare(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
                  double tol);
// Tolerance on `score` for results in `itype` (its rounding plus fp32 accumulation over long sequences).
double tolerance(selscan_dtype_t itype);

}  // namespace selscan_cli
