// Shared pieces of the `selscan` subcommands: option parsing, picking a device, the float64 reference of a
// case and the run-and-compare step used by `doctor` and `run`. Cases, devices, the reference and the benchmark
// harness come from the support library (support/).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "support/bench.h"
#include "support/device.h"
#include "support/dtype.h"
#include "support/reference.h"
#include "support/spec.h"

namespace selscan_cli {

using namespace selscan_support;

constexpr int kExitOk = 0;
constexpr int kExitFail = 1;   // a check failed or results disagree
constexpr int kExitUsage = 2;  // bad command line, or a requested device is not usable

int cmd_doctor(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_run(const std::vector<std::string>& args);

// ------------------------------------------------------------------------------------------- options
// Walks argv-style options: `--name value`, `--name=value` and flags. Unknown options are errors.
class Options {
 public:
  explicit Options(const std::vector<std::string>& args) : args_(args) {}
  // Next option; false at the end. Sets `name` ("--json") and clears `value`.
  bool next(std::string* name);
  // The value of the current option (from "=value" or the next argument); false with err set when missing.
  bool value(std::string* v);
  bool int_value(int64_t lo, int64_t hi, int64_t* v);
  const std::string& error() const { return err_; }
  void set_error(std::string e) { err_ = std::move(e); }

 private:
  std::vector<std::string> args_;
  size_t i_ = 0;
  std::string name_, inline_value_;
  bool has_inline_ = false;
  std::string err_;
};

// The case-shaping flags shared by run and bench (--const-B, --no-z, ...). False when `name` is none of them.
bool case_flag(const std::string& name, CaseSpec* s);

// ------------------------------------------------------------------------------------------- devices
// Resolves --device ("", "auto", "cpu", "cuda", "cuda:N") to a target. For "" / "auto": the first usable
// CUDA device, else the CPU, with `note` saying why the CPU was chosen. False with err set otherwise.
bool pick_target(const std::string& opt, Target* t, std::string* label, std::string* note, std::string* err);

// ------------------------------------------------------------------------------------------- reference
// The float64 reference's outputs and gradients of a case, by TensorId, in the tensors' layouts.
struct Reference {
  std::array<std::vector<double>, kTensorCount> v;
};
// Forward and backward of support/reference.h on `in`, split over `threads` threads.
void reference_forward_backward(const CaseSpec& s, const HostData& in, Reference* ref, int threads);
// The reference's gradients against central finite differences (ref_gradient_check) on a small problem with
// s's flags and groups, so that it stays fast whatever s's size. Expect ~1e-9; the check passes below 1e-5.
double reference_gradient_check(const CaseSpec& s, int directions, uint64_t seed);

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
double tolerance(int32_t itype);

// ------------------------------------------------------------------------------------------- checks
// Runs forward then backward of `s` on `target` once (outputs poisoned first) and compares every output with
// `ref` (float64) and, when `other` is given, with another device's outputs of the same inputs.
struct CaseCheck {
  std::string label;            // a short name of the case
  std::string device;           // "cpu", "cuda:0"
  bool ran = false;             // false: `error` says why it could not run
  std::string error;
  std::vector<Agreement> vs_ref;    // out, out_z, x, last_state, du, ddelta, dA, dB, dC, dD, dz, ddelta_bias
  std::vector<Agreement> vs_other;  // the same against `other`
  HostData outputs;                 // what the library produced (kept for comparing other devices)
  bool pass() const;
};
CaseCheck check_case(const std::string& label, const CaseSpec& s, const Target& target, const HostData& in,
                     const Reference& ref, const HostData* other, const std::string& other_name);

// "1.23e-05" style, or "-" for n/a.
std::string sci(double v);
// "12.3 GiB"
std::string human_bytes(double b);

}  // namespace selscan_cli
