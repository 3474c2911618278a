// `selscan bench`: median forward/backward times of the benchmark shapes (support/bench_shapes.def) or given
// ones, on a GPU when one is usable and on the CPU otherwise (shapes scaled down so the run takes seconds). The
// calls are prepared and timed by the harness the Google Benchmark suite uses (support/bench.h).
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cli.h"
#include "json.h"

namespace selscan_cli {

namespace {

const char* kBenchHelp =
    "usage: selscan bench [--device cpu|cuda|cuda:N] [--shape BtxDxL:N[:G] ...] [--dtype bf16|fp16|fp32]\n"
    "                     [--iters N] [--warmup N] [--threads N] [--const-B] [--const-C] [--no-D] [--no-z]\n"
    "                     [--no-bias] [--no-softplus] [--deterministic] [--json]\n"
    "Times forward and backward (median of --iters calls after --warmup) for each shape and prints a table of\n"
    "milliseconds and achieved GB/s (bytes every call must move; docs/cli.md). Default shapes: the project's\n"
    "benchmark table (bf16 unless noted, fp32 weights, variable B/C, D, z, delta_bias, softplus); on the CPU\n"
    "they are scaled down to at most 2^23 state updates per call. --dtype applies to every shape.\n";

struct Row {
  CaseSpec spec;
  std::string scaled_from;                    // the original shape when scaled for the CPU
  double upstream_fwd = 0, upstream_bwd = 0;  // upstream selective_scan_cuda on an H200 (ms), default rows only
  std::vector<double> fwd, bwd;               // per-call ms
  int fwd_sets = 0, bwd_sets = 0;
  std::string error;
};

// Halves batch, then channels (keeping whole groups), then length until the call is <= `budget` updates.
void scale_for_cpu(Row* r, double budget) {
  CaseSpec& s = r->spec;
  const std::string orig = s.shape_text();
  while (s.state_updates() > budget) {
    if (s.batch > 1) s.batch = (s.batch + 1) / 2;
    else if (s.dim / s.groups > 1) s.dim = s.groups * std::max<int64_t>(1, s.dim / s.groups / 2);
    else if (s.seqlen > 1) s.seqlen = (s.seqlen + 1) / 2;
    else break;
  }
  if (s.shape_text() != orig) r->scaled_from = orig;
}

double min_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
  CaseSpec flags;
  std::vector<std::string> shapes;
  std::string device, dtype;
  int64_t iters = -1, warmup = -1, threads = 0;
  bool json = false;
  Options opt(args);
  std::string name;
  while (opt.next(&name)) {
    if (name == "--help" || name == "-h") {
      fmt::print("{}", kBenchHelp);
      return kExitOk;
    }
    std::string v;
    if (name == "--device") opt.value(&device);
    else if (name == "--shape") {
      if (opt.value(&v)) shapes.push_back(v);
    } else if (name == "--dtype") opt.value(&dtype);
    else if (name == "--iters") opt.int_value(1, 100000, &iters);
    else if (name == "--warmup") opt.int_value(0, 100000, &warmup);
    else if (name == "--threads") opt.int_value(0, 4096, &threads);
    else if (name == "--json") json = true;
    else if (!case_flag(name, &flags)) opt.set_error(fmt::format("unknown option {}", name));
  }
  int32_t dt = SELSCAN_DTYPE_BFLOAT16;
  if (opt.error().empty() && !dtype.empty() && !parse_dtype(dtype, &dt))
    opt.set_error(fmt::format("bad --dtype '{}': expected bf16, fp16 or fp32", dtype));
  std::vector<Row> rows;
  if (shapes.empty()) {
    for (const BenchShape& b : bench_shapes("gpu")) {
      Row r;
      r.spec = b.spec;
      r.upstream_fwd = b.upstream_fwd_ms;
      r.upstream_bwd = b.upstream_bwd_ms;
      rows.push_back(r);
    }
  } else {
    for (const std::string& sh : shapes) {
      Row r;
      r.spec = case_spec(1, 1, 1, 1, SELSCAN_DTYPE_BFLOAT16);
      std::string err;
      if (!parse_shape(sh, &r.spec, &err)) opt.set_error(err);
      rows.push_back(r);
    }
  }
  if (!opt.error().empty()) {
    fmt::print(stderr, "selscan bench: {}\n{}", opt.error(), kBenchHelp);
    return kExitUsage;
  }
  for (Row& r : rows) {
    const CaseSpec& sz = r.spec;
    CaseSpec s = flags;
    s.batch = sz.batch;
    s.dim = sz.dim;
    s.seqlen = sz.seqlen;
    s.dstate = sz.dstate;
    s.groups = sz.groups;
    s.itype = dtype.empty() ? sz.itype : dt;
    if (!dtype.empty() && s.itype != sz.itype) r.upstream_fwd = r.upstream_bwd = 0;  // not upstream's row
    r.spec = s;
  }
  // --dtype on the default table can make two rows equal; keep the first.
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t k = i + 1; k < rows.size();)
      if (rows[k].spec.shape_text() == rows[i].spec.shape_text() && rows[k].spec.itype == rows[i].spec.itype &&
          shapes.empty())
        rows.erase(rows.begin() + long(k));
      else
        ++k;

  Target target;
  std::string label, note, err;
  if (!pick_target(device, &target, &label, &note, &err)) {
    fmt::print(stderr, "selscan bench: {}\n", err);
    return kExitUsage;
  }
  target.num_threads = int32_t(threads);
  const bool gpu = target.kind == SELSCAN_DEVICE_CUDA;
  if (iters < 0) iters = gpu ? 20 : 5;
  if (warmup < 0) warmup = gpu ? 3 : 1;
  bool scaled = false;
  if (!gpu) {
    for (Row& r : rows) {
      scale_for_cpu(&r, double(1 << 23));
      scaled = scaled || !r.scaled_from.empty();
    }
  }
  if (!note.empty()) fmt::print(stderr, "selscan bench: {}\n", note);
  if (scaled)
    fmt::print(stderr, "selscan bench: shapes scaled down for the CPU (at most 2^23 state updates per call)\n");

  bool is_h200 = false;
  if (gpu)
    for (const DeviceInfo& d : list_devices())
      if (d.index == target.index) is_h200 = d.name.find("H200") != std::string::npos;
  const bool tty = isatty(2) != 0;
  int failed = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    const std::string what = fmt::format("[{}/{}] {} {}", i + 1, rows.size(), r.spec.shape_text(),
                                         dtype_name(r.spec.itype));
    // One direction: fresh buffer sets (BenchRun::init warms each up once), then --warmup untimed calls and
    // --iters timed ones.
    auto time = [&](Mode m, const char* dir, std::vector<double>* ms, int* sets) {
      if (!r.error.empty()) return;
      fmt::print(stderr, tty ? "\r{}: {} preparing...   " : "{}: {}\n", what, dir);
      std::fflush(stderr);
      BenchRun b;
      std::string err;
      bool ok = b.init(r.spec, m, target, &err);
      for (int64_t k = 0; ok && k < warmup; ++k) ok = b.call(&err);
      for (int64_t k = 0; ok && k < iters; ++k) {
        double t = 0;
        ok = b.timed_call(&t, &err);
        ms->push_back(t);
        if (tty) fmt::print(stderr, "\r{}: {} {}/{}   ", what, dir, k + 1, iters);
      }
      *sets = b.sets();
      if (!ok) r.error = err;
    };
    time(Mode::fwd, "fwd", &r.fwd, &r.fwd_sets);
    time(r.spec.deterministic ? Mode::bwd_det : Mode::bwd, "bwd", &r.bwd, &r.bwd_sets);
    if (!r.error.empty()) ++failed;
    if (tty) fmt::print(stderr, "\r{}: {}{}\n", what, r.error.empty() ? "done" : "FAILED: ", r.error);
    else if (!r.error.empty()) fmt::print(stderr, "  FAILED: {}\n", r.error);
  }

  const bool show_upstream = gpu && is_h200;
  if (json) {
    Json j;
    j.object().str("device", target.name()).str("device_label", label).str("library", selscan_build_info());
    j.integer("iters", iters).integer("warmup", warmup).boolean("scaled_for_cpu", scaled);
    j.array("rows");
    for (const Row& r : rows) {
      const CaseSpec& s = r.spec;
      j.object().str("shape", s.shape_text()).str("dtype", dtype_name(s.itype)).integer("batch", s.batch)
          .integer("dim", s.dim).integer("seqlen", s.seqlen).integer("dstate", s.dstate).integer("groups", s.groups)
          .str("flags", s.flags_text());
      if (!r.scaled_from.empty()) j.str("scaled_from", r.scaled_from);
      if (!r.error.empty()) {
        j.str("error", r.error).end();
        continue;
      }
      const double fm = median(r.fwd), bm = median(r.bwd);
      const double fb = min_bytes(s, Mode::fwd), bb = min_bytes(s, Mode::bwd);
      j.num("fwd_ms", fm).num("fwd_ms_min", min_of(r.fwd)).num("bwd_ms", bm).num("bwd_ms_min", min_of(r.bwd))
          .num("fwd_bytes", fb).num("bwd_bytes", bb).num("fwd_gb_per_s", fb / fm * 1e-6)
          .num("bwd_gb_per_s", bb / bm * 1e-6).num("fwd_state_updates_per_s", s.state_updates() / fm * 1e3)
          .num("bwd_state_updates_per_s", s.state_updates() / bm * 1e3).integer("fwd_sets", r.fwd_sets)
          .integer("bwd_sets", r.bwd_sets);
      if (r.upstream_fwd > 0 && show_upstream)
        j.num("upstream_h200_fwd_ms", r.upstream_fwd).num("upstream_h200_bwd_ms", r.upstream_bwd);
      j.end();
    }
    j.end().end();
    fmt::print("{}", j.text());
  } else {
    fmt::print("selscan bench on {} ({})\n", label, selscan_build_info());
    fmt::print("median of {} calls after {} warm-up; {}; GB/s = minimum bytes moved / time\n", iters, warmup,
               rows.empty() ? "" : rows[0].spec.flags_text());
    if (scaled) fmt::print("CPU: shapes scaled down from the GPU table (original in brackets)\n");
    auto shape_col = [](const Row& r) {
      return r.scaled_from.empty() ? r.spec.shape_text() : r.spec.shape_text() + " [" + r.scaled_from + "]";
    };
    size_t w = 5;
    for (const Row& r : rows) w = std::max(w, shape_col(r).size());
    fmt::print("{:<{}} {:<5} {:>10} {:>9} {:>10} {:>9} {:>11}{}\n", "shape", w, "dtype", "fwd ms", "fwd GB/s",
               "bwd ms", "bwd GB/s", "fwd Gupd/s", show_upstream ? "   speed-up vs upstream (H200) fwd / bwd" : "");
    for (const Row& r : rows) {
      const std::string sh = shape_col(r);
      if (!r.error.empty()) {
        fmt::print("{:<{}} {:<5} FAILED: {}\n", sh, w, dtype_name(r.spec.itype), r.error);
        continue;
      }
      const double fm = median(r.fwd), bm = median(r.bwd);
      std::string up;
      if (show_upstream && r.upstream_fwd > 0)
        up = fmt::format("   {:.2f}x / {:.2f}x", r.upstream_fwd / fm, r.upstream_bwd / bm);
      fmt::print("{:<{}} {:<5} {:>10.4f} {:>9.4g} {:>10.4f} {:>9.4g} {:>11.3g}{}\n", sh, w, dtype_name(r.spec.itype),
                 fm, min_bytes(r.spec, Mode::fwd) / fm * 1e-6, bm, min_bytes(r.spec, Mode::bwd) / bm * 1e-6,
                 r.spec.state_updates() / fm * 1e-6, up);
    }
  }
  return failed == 0 ? kExitOk : kExitFail;
}

}  // namespace selscan_cli
