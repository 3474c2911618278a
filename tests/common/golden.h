// The upstream golden vectors (tests/data/golden/<case>/: case.json + .npy files) as test Cases.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "case.h"
#include "npy.h"

namespace selscan_test {

struct GoldenCase {
  std::string name, dir;
  CaseSpec spec;                          // sizes and flags from case.json
  std::map<std::string, NpyArray> files;  // every .npy of the folder, by stem ("u", "dA", ...)
};

// Folder names under golden_dir() that hold a case.json, sorted ("" entries never).
std::vector<std::string> golden_case_names();
// Whether golden_dir()/<name>/case.json exists (a test skips, naming the folder, when it does not).
bool golden_exists(const std::string& name);
// Reads case.json and every .npy of the case; returns "" on success or what went wrong.
std::string load_golden(const std::string& name, GoldenCase* out);
// A Case whose inputs (and dout) are the golden inputs, contiguous, outputs poisoned; x and last_state
// requested. Returns "" or an error (shape mismatch between case.json and the files).
std::string golden_to_case(const GoldenCase& g, Case* out);
// load_golden, then golden_to_case: "" or the first error.
std::string load_golden_case(const std::string& name, GoldenCase* g, Case* c);
// Values of a golden array flattened like Tensor::values() (complex: re, im interleaved).
std::vector<double> golden_values(const GoldenCase& g, const std::string& stem);

}  // namespace selscan_test
