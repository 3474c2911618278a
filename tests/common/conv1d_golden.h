// causal-conv1d's golden vectors (tests/data/conv1d_golden: cases.json, one folder of .npy files per case; its
// README.md says how make_goldens.py made them) run through selscan's causal conv1d and compared, for the CPU
// and the GPU golden tests alike: a GPU test passes a DeviceMemory, the CPU test nullptr.
//
// The set is absent until the goldens are generated on a GPU: with no cases.json the tests skip, saying so; a
// cases.json that names a missing or malformed file fails.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "case.h"
#include "json.h"
#include "npy.h"
#include "selscan/selscan.h"

namespace selscan_test {

// $SELSCAN_CONV1D_GOLDEN_DIR if set, else the SELSCAN_CONV1D_GOLDEN_DIR compile definition, else
// tests/data/conv1d_golden (relative to the repository root).
std::string conv1d_golden_dir();

struct Conv1dGoldenTensor {
  int32_t dtype = SELSCAN_DTYPE_FLOAT32;  // from cases.json: fp32, fp16, bf16, int32
  bool output = false;                    // role "output": what selscan must reproduce
  std::vector<int64_t> shape;
  NpyRaw data;  // the file's elements as stored (fp16/bf16: their bit patterns)
  std::vector<double> values() const;  // decoded, C order
};

struct Conv1dGolden {
  std::string name, dir;
  Json params;  // the case's object in cases.json
  bool update = false;  // op "update" (selscan_conv1d_update); else "conv" (forward and backward)
  std::map<std::string, Conv1dGoldenTensor> tensors;

  int64_t num(const char* key) const;  // an integer parameter (a missing key reads 0)
  bool flag(const char* key) const;    // a boolean parameter, or a non-null list (update's index lists)
  std::string text(const char* key) const;
  bool has(const std::string& tensor) const { return tensors.count(tensor) != 0; }
};

// What the golden folder holds.
struct Conv1dGoldenIndex {
  bool present = false;            // cases.json exists
  std::string error;               // cases.json unreadable, files it names missing, or case folders without it
  std::vector<std::string> names;  // the cases, in file order
};
Conv1dGoldenIndex conv1d_golden_index();

// Reads the case and every file cases.json names for it: "" or what is wrong.
std::string load_conv1d_golden(const std::string& name, Conv1dGolden* g);

// Runs the case on `exec` (device copies through `dev`, or host memory) and checks every output with gtest
// assertions: the forward, then the backward with deterministic 0 and 1 ("conv"); or the update.
void check_conv1d_golden(const Conv1dGolden& g, const selscan_exec_t& exec, const DeviceMemory* dev);

// The body of the golden tests: skip, saying why, when there is no cases.json; fail when the folder is broken
// (cases.json unreadable or naming a missing file, case folders without it); else check every case. One test
// over all cases rather than one per case: ctest lists a binary's tests once per build, so cases unpacked after
// the build would not run as tests of their own.
void check_every_conv1d_golden(const selscan_exec_t& exec, const DeviceMemory* dev);

}  // namespace selscan_test
