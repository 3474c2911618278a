// CPU section: the library's CPU path through the public ABI (device_kind = CPU), fp32, variable B/C.
// Counter state_updates_per_s = Bt*D*L*N / wall time (one decay exp + one FMA per state update).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"

namespace selscan_bench {
namespace {

// Host buffers for one shape; inputs filled once, outputs poisoned (0xFF bytes = NaN) so an output the call
// never wrote is caught by the finiteness check.
struct HostSet {
  Shape s;
  std::vector<std::vector<unsigned char>> store;
  Buffers b;

  void* alloc(int64_t bytes, bool poison) {
    store.emplace_back(static_cast<size_t>(bytes), poison ? 0xFF : 0);
    return store.back().data();
  }

  explicit HostSet(const Shape& shape) : s(shape) {
    const Sizes z(s);
    store.reserve(24);
    b.u = alloc(z.btl, false);
    b.delta = alloc(z.btl, false);
    b.z = alloc(z.btl, false);
    b.dout = alloc(z.btl, false);
    b.B = alloc(z.bc, false);
    b.C = alloc(z.bc, false);
    b.A = alloc(z.dn, false);
    b.D = alloc(z.dvec, false);
    b.bias = alloc(z.dvec, false);
    fill_uniform(b.u, s.itype, s.btl(), range_u().lo, range_u().hi, 1);
    fill_uniform(b.delta, s.itype, s.btl(), range_delta().lo, range_delta().hi, 2);
    fill_uniform(b.z, s.itype, s.btl(), range_z().lo, range_z().hi, 3);
    fill_uniform(b.dout, s.itype, s.btl(), range_dout().lo, range_dout().hi, 4);
    fill_uniform(b.B, s.itype, s.bc_numel(), range_bc().lo, range_bc().hi, 5);
    fill_uniform(b.C, s.itype, s.bc_numel(), range_bc().lo, range_bc().hi, 6);
    fill_A(static_cast<float*>(b.A), s);
    fill_uniform(b.D, SELSCAN_DTYPE_FLOAT32, s.dim, range_D().lo, range_D().hi, 7);
    fill_uniform(b.bias, SELSCAN_DTYPE_FLOAT32, s.dim, range_bias().lo, range_bias().hi, 8);
    b.out = alloc(z.btl, true);
    b.out_z = alloc(z.btl, true);
    b.x = alloc(z.x, true);
    b.last_state = alloc(z.state, true);
    b.du = alloc(z.btl, true);
    b.ddelta = alloc(z.btl, true);
    b.dz = alloc(z.btl, true);
    b.dB = alloc(z.bc, true);
    b.dC = alloc(z.bc, true);
    b.dA = alloc(z.dn, true);
    b.dD = alloc(z.dvec, true);
    b.dbias = alloc(z.dvec, true);
  }
};

// The fixture of the benchmark that ran last: the framework calls a benchmark function several times while it
// sizes the iteration count, and the untimed setup (fill, first forward) should not repeat each time.
struct Cached {
  std::string key;
  std::unique_ptr<HostSet> set;
};
Cached& cache() {
  static Cached c;
  return c;
}

void run_cpu(benchmark::State& state, const std::string& key, Shape s, Mode m, int threads) {
  Cached& c = cache();
  const bool fresh = c.key != key || !c.set;
  if (fresh) {
    c.set.reset();
    c.key.clear();
    try {
      c.set = std::make_unique<HostSet>(s);
    } catch (const std::bad_alloc&) {
      state.SkipWithError("host allocation failed");
      return;
    }
  }
  HostSet* h = c.set.get();
  selscan_exec_t ex = SELSCAN_EXEC_INIT;
  ex.device_kind = SELSCAN_DEVICE_CPU;
  ex.num_threads = threads;
  const selscan_fwd_args_t fa = fwd_args(s, h->b, m == Mode::fwd || is_bwd(m), m == Mode::fwd_infer);
  const selscan_bwd_args_t ba = bwd_args(s, h->b, m == Mode::bwd_det);
  selscan_status_t st = SELSCAN_STATUS_SUCCESS;
  if (fresh) {
    // The backward needs the forward's out and x: produce them once, untimed. Then check that the timed call
    // really writes its output (it was poisoned with NaN).
    st = selscan_fwd(&fa, &ex);
    if (st != SELSCAN_STATUS_SUCCESS) {
      state.SkipWithError(("selscan_fwd: " + status_message(st)).c_str());
      return;
    }
    if (is_bwd(m)) {
      st = selscan_bwd(&ba, &ex);
      if (st != SELSCAN_STATUS_SUCCESS) {
        state.SkipWithError(("selscan_bwd: " + status_message(st)).c_str());
        return;
      }
    }
    if (!all_finite(primary_output(h->b, m), s.itype, s.btl())) {
      state.SkipWithError("output not written or not finite after the first call");
      return;
    }
    c.key = key;
  }
  for (auto _ : state) {
    st = is_bwd(m) ? selscan_bwd(&ba, &ex) : selscan_fwd(&fa, &ex);
    if (st != SELSCAN_STATUS_SUCCESS) {
      state.SkipWithError(status_message(st).c_str());
      break;
    }
  }
  const double updates = static_cast<double>(s.state_updates());
  state.counters["state_updates_per_s"] = benchmark::Counter(updates, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
  state.SetLabel(std::string(dtype_name(s.itype)) + " var B/C G=1, D z bias softplus");
}

}  // namespace

void register_cpu_benchmarks() {
  Shape big;  // the task's CPU reference shape
  big.batch = 1;
  big.dim = 1536;
  big.seqlen = 2048;
  big.dstate = 16;
  big.itype = SELSCAN_DTYPE_FLOAT32;
  Shape small = big;  // a quick one for checking the path runs
  small.dim = 256;
  small.seqlen = 512;
  for (const Shape& s : {small, big}) {
    for (Mode m : {Mode::fwd, Mode::bwd}) {
      for (int threads : {1, 2}) {
        const std::string name = std::string("cpu/") + mode_name(m) + "/" + dtype_name(s.itype) + "/" +
                                 shape_name(s) + "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), run_cpu, name, s, m, threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
}

}  // namespace selscan_bench
