// The benchmark harness shared by the Google Benchmark suite (bench/) and `selscan bench`: the shapes and
// upstream's figures (bench_shapes.def), the minimum bytes a call moves, and BenchRun, which prepares a call
// and times it the way docs/performance.md ("Method") describes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "support/device.h"
#include "support/spec.h"

namespace selscan_support {

// Which call is timed, and which tensors it touches.
enum class Mode {
  fwd,        // training forward: out, out_z, x (upstream's selective_scan_cuda.fwd)
  fwd_infer,  // prefill / inference forward: out, out_z, last_state; no chunk states x
  bwd,        // backward (non-deterministic reductions allowed)
  bwd_det     // backward with deterministic = 1
};
const char* mode_name(Mode m);  // "fwd", "fwd_infer", "bwd", "bwd_det"
bool is_bwd(Mode m);
// The spec as a call of mode m uses it: x for the training forward and the backward, last_state for the
// inference forward, deterministic for bwd_det.
CaseSpec spec_for(CaseSpec s, Mode m);

// The least traffic of a call: every input it needs read once, every output written once (the backward reads x
// only when L > 2048). docs/performance.md, "Counters".
double min_bytes(const CaseSpec& s, Mode m);

// The benchmark values of input tensor t (TensorId): u and z in +-2; delta in [-3, -1] with delta_bias in
// [-1, 0] through softplus (delta 0.02-0.3, Mamba's dt range); B, C and dout in +-1; D in [0.5, 1.5]. (A is
// -(n + 1), S4D-real style.) Realistic and finite, so that a non-finite output means a broken call.
struct Range {
  double lo, hi;
};
Range input_range(int t);
// n values of `dtype` (fp32, fp16, bf16) at dst, uniform in [lo, hi), seeded.
void fill_uniform(void* dst, int32_t dtype, int64_t n, double lo, double hi, uint64_t seed);

// Fills every input of `c` with the benchmark values (input_range; docs/performance.md, "Method"). The backward's
// out and x come from a forward, not from here.
bool fill_bench_inputs(DeviceCase& c, std::string* err);

// One row of bench_shapes.def.
struct BenchShape {
  std::string section;  // "gpu", "gpu_sweep", "cpu"
  CaseSpec spec;
  double upstream_fwd_ms = 0, upstream_bwd_ms = 0;  // 0: not measured upstream
};
// The rows of `section`, in the table's order.
std::vector<BenchShape> bench_shapes(const std::string& section);

// A benchmarked call on a target. On a GPU it owns complete, independent buffer sets (every tensor of the call)
// that rotate, at least kMinSets of them and together at least kMinRotationBytes, so that no call finds its
// operands in L2 from an earlier one; one workspace and one non-blocking stream serve them all. On the CPU it
// owns one set.
class BenchRun {
 public:
  static constexpr double kMinRotationBytes = 200e6;  // > 3x the 50-60 MB L2 of an H100 / H200
  static constexpr int kMinSets = 3;
  static constexpr int kMaxSets = 64;

  BenchRun() = default;
  BenchRun(const BenchRun&) = delete;
  BenchRun& operator=(const BenchRun&) = delete;
  ~BenchRun();

  // Allocates the sets, fills the inputs (realistic finite values: docs/performance.md, "Method"), poisons
  // the outputs, runs the forward on every set for the backward modes (out and x), runs the call once on every
  // set, and checks the head, middle and tail of its primary output (out_z, or out without z, for the forward;
  // du for the backward) on the first and last set: written and finite. False with `err` set otherwise.
  bool init(const CaseSpec& spec, Mode mode, const Target& target, std::string* err);

  // The benchmarked call on the next set: enqueued on a GPU, run on the CPU.
  bool call(std::string* err);
  // One timed call in milliseconds. GPU: an untimed call on one set keeps the GPU busy while the timed one, on
  // the next set, is enqueued between two events (host launch latency stays out of the time). CPU: a steady
  // clock around one call.
  bool timed_call(double* ms, std::string* err);

  const CaseSpec& spec() const { return spec_; }
  Mode mode() const { return mode_; }
  int sets() const { return static_cast<int>(sets_.size()); }
  double set_bytes() const { return set_bytes_; }  // device bytes of one set

 private:
  bool enqueue(DeviceCase& c, std::string* err);
  std::string check_output(DeviceCase& c);

  CaseSpec spec_;
  Mode mode_ = Mode::fwd;
  Target target_;
  std::vector<std::unique_ptr<DeviceCase>> sets_;
  size_t cursor_ = 0;
  double set_bytes_ = 0;
  void* workspace_ = nullptr;
  CUstream stream_ = nullptr;
  CUevent start_ = nullptr, stop_ = nullptr;
};

// Median of a sample (the mean of the two middle values for an even count); 0 when empty.
double median(std::vector<double> v);

}  // namespace selscan_support
