// selscan_bench: Google Benchmark driver over the public ABI. Standard flags apply (--benchmark_filter,
// --benchmark_format=json, --benchmark_out=FILE, --benchmark_repetitions=N, ...). Sections, by name prefix:
//   cpu/        the CPU path (fp32), threads 1 and 2
//   gpu/        the issue #4 rows: fwd, fwd_infer, bwd, bwd_det
//   gpu_sweep/  Bt=1, D=2048, N=16, bf16, L = 512 .. 65536 (fwd, bwd)
//   gpu_copy/   the device-to-device copy that defines the memory floor
// The shapes are support/bench_shapes.def. Environment: SELSCAN_BENCH_DEVICE = CUDA device ordinal (default 0).
// bench/report.py turns the JSON into the tables and plot of docs/performance.md.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "bench_common.h"
#include "support/dtype.h"

namespace selscan_bench {

std::string benchmark_name(const std::string& section, Mode m, const CaseSpec& s) {
  return section + "/" + selscan_support::mode_name(m) + "/" + selscan_support::dtype_name(s.itype) + "/" +
         s.shape_text();
}

std::string benchmark_label(const CaseSpec& s) {
  return std::string(selscan_support::dtype_name(s.itype)) + " var B/C G=1, D z bias softplus";
}

namespace {
struct Cached {
  std::string key;
  std::unique_ptr<BenchRun> run;
  std::string error;
};
Cached& cache() {
  static Cached c;
  return c;
}
}  // namespace

BenchRun* cached_run(const std::string& key, const CaseSpec& s, Mode m, const Target& t, std::string* err) {
  Cached& c = cache();
  if (c.key != key) {
    c.run.reset();  // free the previous benchmark's buffers first
    c.key = key;
    c.error.clear();
    c.run = std::make_unique<BenchRun>();
    if (!c.run->init(s, m, t, &c.error)) c.run.reset();
  }
  *err = c.error;
  return c.run.get();
}

void release_cached_run() {
  cache().run.reset();
  cache().key.clear();
}

}  // namespace selscan_bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  if (selscan_version() != SELSCAN_VERSION)
    std::fprintf(stderr, "selscan_bench: warning: header version %d, library version %d\n", SELSCAN_VERSION,
                 static_cast<int>(selscan_version()));
  benchmark::AddCustomContext("selscan_version", selscan_version_string());
  benchmark::AddCustomContext("selscan_build", selscan_build_info());

  selscan_bench::register_cpu_benchmarks();
  std::string why;
  if (!selscan_bench::register_gpu_benchmarks(&why)) {
    std::fprintf(stderr, "selscan_bench: GPU benchmarks skipped: %s\n", why.c_str());
    benchmark::AddCustomContext("gpu_skipped", why);
  }

  benchmark::RunSpecifiedBenchmarks();
  selscan_bench::release_cached_run();
  benchmark::Shutdown();
  return 0;
}
