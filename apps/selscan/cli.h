// Shared pieces of the `selscan` subcommands: option parsing, device discovery, timing and the
// run-and-compare step used by `doctor` and `run`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference.h"
#include "scan_case.h"

namespace selscan_cli {

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
struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t total_mem = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  selscan_status_t check = SELSCAN_STATUS_NO_DEVICE;  // selscan_check_device
  std::string check_message;                          // selscan_last_error() when not SUCCESS
  bool usable() const { return check == SELSCAN_STATUS_SUCCESS; }
};
// Every CUDA device the driver shows (empty without a driver), with whether this build runs on it.
std::vector<DeviceInfo> list_devices();

// Resolves --device ("", "auto", "cpu", "cuda", "cuda:N") to a target. For "" / "auto": the first usable
// CUDA device, else the CPU, with `note` saying why the CPU was chosen. False with err set otherwise.
bool pick_target(const std::string& opt, Target* t, std::string* label, std::string* note, std::string* err);

// ------------------------------------------------------------------------------------------- timing
// Median (and all samples) of `iters` calls after `warmup` calls; on CUDA timed with driver events on the
// case's stream, on the CPU with a steady clock. `cases` are used round-robin (L2 rotation on the GPU).
struct Timing {
  std::vector<double> ms;
  double median = 0, min = 0;
};
// `progress(done, total)` is called after each call when given.
bool time_calls(const std::vector<DeviceCase*>& cases, bool forward, int warmup, int iters, Timing* out,
                std::string* err, const std::function<void(int, int)>& progress = nullptr);

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
