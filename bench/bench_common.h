// Shared pieces of the benchmark suite. The shapes, the buffer sets, the input values, the timing method and the
// byte counts are the harness of support/bench.h, which `selscan bench` uses too; this suite adds Google
// Benchmark's registration, counters and JSON output.
#pragma once

#include <memory>
#include <string>

#include "support/abi.h"
#include "support/bench.h"
#include "support/dtype.h"

namespace selscan_bench {

using selscan_support::BenchRun;
using selscan_support::CaseSpec;
using selscan_support::contiguous_desc;
using selscan_support::dtype_size;
using selscan_support::fill_uniform;
using selscan_support::input_range;
using selscan_support::Mode;
using selscan_support::Range;
using selscan_support::Target;

// Benchmark names are "<section>/<mode>/<itype>/<shape>[/...]"; bench/report.py parses them back, so keep the
// two in step.
std::string benchmark_name(const std::string& section, Mode m, const CaseSpec& s);
// "bf16 var B/C G=1, D z bias softplus": the label every benchmark row carries.
std::string benchmark_label(const CaseSpec& s);

// The prepared call of the benchmark that ran last. The framework calls a benchmark function several times while
// it sizes the iteration count, and the setup (gigabytes of uploads, warm-up) should happen once per benchmark.
// Null with `err` set when the setup failed.
BenchRun* cached_run(const std::string& key, const CaseSpec& s, Mode m, const Target& t, std::string* err);
// Frees it (before a benchmark that needs the memory, and before exit).
void release_cached_run();

// Registration entry points (bench_cpu.cpp, bench_gpu.cpp).
void register_cpu_benchmarks();
// Registers the GPU benchmarks, or returns false with `why` set when they cannot run here.
bool register_gpu_benchmarks(std::string* why);

}  // namespace selscan_bench
