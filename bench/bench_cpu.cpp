// CPU section: the library's CPU path through the public ABI (device_kind = CPU), the "cpu" shapes of
// support/bench_shapes.def, threads 1 and 2. Wall-clock time of the framework's loop of calls; counter
// state_updates_per_s = Bt*D*L*N / time (one decay exp + one FMA per state update).
#include <benchmark/benchmark.h>

#include <string>

#include "bench_common.h"

namespace selscan_bench {
namespace {

void run_cpu(benchmark::State& state, const std::string& key, const CaseSpec& s, Mode m, int threads) {
  Target t;
  t.num_threads = threads;
  std::string err;
  BenchRun* run = cached_run(key, s, m, t, &err);
  if (run == nullptr) {
    state.SkipWithError(err.c_str());
    return;
  }
  for (auto _ : state) {
    if (!run->call(&err)) {
      state.SkipWithError(err.c_str());
      break;
    }
  }
  state.counters["state_updates_per_s"] =
      benchmark::Counter(s.state_updates(), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
  state.SetLabel(benchmark_label(s));
}

}  // namespace

void register_cpu_benchmarks() {
  for (const selscan_support::BenchShape& b : selscan_support::bench_shapes("cpu"))
    for (Mode m : {Mode::fwd, Mode::bwd})
      for (int threads : {1, 2}) {
        const std::string name = benchmark_name("cpu", m, b.spec) + "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), run_cpu, name, b.spec, m, threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
}

}  // namespace selscan_bench
