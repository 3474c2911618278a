// `selscan bench`: median forward/backward times of the benchmark shapes (issue #4's table) or given ones, on a
// GPU when one is usable (driver events on our own stream, inputs rotated so small shapes are not timed from
// L2) and on the CPU otherwise (shapes scaled down so the run takes seconds).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "cli.h"
#include "cuda_driver.h"
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
  std::string scaled_from;       // the original shape when scaled for the CPU
  double upstream_fwd = 0, upstream_bwd = 0;  // upstream selective_scan_cuda on an H200 (ms), default rows only
  Timing fwd, bwd;
  double fwd_bytes = 0, bwd_bytes = 0;
  int sets = 1;
  std::string error;
};

CaseSpec shape(int64_t bt, int64_t d, int64_t l, int64_t n, selscan_dtype_t it) {
  CaseSpec s = case_spec(bt, d, l, n, it);
  s.want_last_state = false;  // upstream returns only x (last_state is a slice of it)
  return s;
}

std::vector<Row> default_rows() {
  const selscan_dtype_t bf = SELSCAN_DTYPE_BFLOAT16, f32 = SELSCAN_DTYPE_FLOAT32;
  struct {
    CaseSpec s;
    double uf, ub;
  } t[] = {{shape(8, 1536, 2048, 16, bf), 0.453, 1.805},  {shape(4, 5120, 2048, 16, bf), 0.740, 2.915},
           {shape(1, 2048, 65536, 16, bf), 2.965, 11.392}, {shape(1, 5120, 512, 16, bf), 0.065, 0.307},
           {shape(8, 1536, 2048, 16, f32), 0.901, 2.149},  {shape(4, 2048, 2048, 64, bf), 1.022, 4.553}};
  std::vector<Row> rows;
  for (auto& e : t) {
    Row r;
    r.spec = e.s;
    r.upstream_fwd = e.uf;
    r.upstream_bwd = e.ub;
    rows.push_back(r);
  }
  return rows;
}

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

// Bytes a call must move at least: every input read once, every output written once (docs/cli.md).
void count_bytes(Row* r) {
  const CaseSpec& s = r->spec;
  const double isz = double(dtype_size(s.itype)), bdl = double(s.batch) * double(s.dim) * double(s.seqlen);
  const double var = double(s.batch) * double(s.groups) * double(s.dstate) * double(s.seqlen) * isz;
  const double dn = double(s.dim) * double(s.dstate) * 4.0;
  const double x = s.has_x() ? double(s.batch) * double(s.dim) * double(s.nchunks()) * 2.0 * double(s.dstate) * 4 : 0;
  const double z = s.has_z ? 1 : 0;
  const double vecs = double(s.dim) * 4.0 * ((s.has_D ? 1 : 0) + (s.has_bias ? 1 : 0));
  const double bc_in = (s.var_B ? var : dn) + (s.var_C ? var : dn);
  // forward: u, delta, z in; out, out_z, x out.
  r->fwd_bytes = bdl * isz * (2 + z) + bdl * isz * (1 + z) + x + bc_in + dn + vecs;
  // backward: u, delta, dout, z, out (with z), x in; du, ddelta, dz, dB, dC, dA, dD, ddelta_bias out.
  r->bwd_bytes = bdl * isz * (3 + 2 * z) + bdl * isz * (2 + z) + x + 2 * bc_in + 2 * dn + 2 * vecs;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
  CaseSpec flags = shape(1, 1, 1, 1, SELSCAN_DTYPE_BFLOAT16);
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
  selscan_dtype_t dt = SELSCAN_DTYPE_BFLOAT16;
  if (opt.error().empty() && !dtype.empty() && !parse_dtype(dtype, &dt))
    opt.set_error(fmt::format("bad --dtype '{}': expected bf16, fp16 or fp32", dtype));
  std::vector<Row> rows;
  if (shapes.empty()) {
    rows = default_rows();
  } else {
    for (const std::string& sh : shapes) {
      Row r;
      r.spec = shape(1, 1, 1, 1, SELSCAN_DTYPE_BFLOAT16);
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

  size_t l2 = 0;
  bool is_h200 = false;
  if (gpu) {
    for (const DeviceInfo& d : list_devices())
      if (d.index == target.index) {
        l2 = d.l2_bytes;
        is_h200 = d.name.find("H200") != std::string::npos;
      }
  }
  CUstream stream = nullptr;
  if (gpu) {
    if (!make_current(target.index, &err) || driver().cuStreamCreate(&stream, 0) != kCudaSuccess) {
      fmt::print(stderr, "selscan bench: could not create a stream on {}: {}\n", target.name(), err);
      return kExitFail;
    }
  }
  const bool tty = isatty(2) != 0;
  int failed = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    count_bytes(&r);
    const std::string what = fmt::format("[{}/{}] {} {}", i + 1, rows.size(), r.spec.shape_text(),
                                         dtype_name(r.spec.itype));
    auto progress = [&](const char* dir) {
      return [&, dir](int done, int total) {
        if (tty) fmt::print(stderr, "\r{}: {} {}/{}   ", what, dir, done, total);
      };
    };
    fmt::print(stderr, tty ? "\r{}: preparing inputs...   " : "{}\n", what);
    std::fflush(stderr);
    const HostData in = make_inputs(r.spec, 1, /*tiled=*/true);
    // Enough copies that one pass over them overflows L2 twice: each call then reads from HBM, as in a model.
    std::vector<std::unique_ptr<DeviceCase>> sets;
    size_t set_bytes = 0;
    do {
      auto c = std::make_unique<DeviceCase>();
      if (gpu && !sets.empty()) {
        size_t free_b = 0, total_b = 0;
        driver().cuMemGetInfo(&free_b, &total_b);
        if (set_bytes + (size_t(1) << 30) > free_b) break;  // keep 1 GiB spare
      }
      if (!c->init(r.spec, target, in, &err, stream)) {
        if (sets.empty()) r.error = err;
        break;
      }
      set_bytes = c->device_bytes();
      sets.push_back(std::move(c));
    } while (gpu && sets.size() < 8 && double(sets.size()) * double(set_bytes) < 2.0 * double(l2));
    r.sets = int(sets.size());
    if (r.error.empty()) {
      std::vector<DeviceCase*> ptrs;
      for (auto& c : sets) ptrs.push_back(c.get());
      // Each set needs its own forward before its backward (the backward reads out and x).
      bool ok = true;
      for (DeviceCase* c : ptrs) ok = ok && c->fwd(&err);
      ok = ok && time_calls(ptrs, true, int(warmup), int(iters), &r.fwd, &err, progress("fwd")) &&
           time_calls(ptrs, false, int(warmup), int(iters), &r.bwd, &err, progress("bwd"));
      if (!ok) r.error = err;
    }
    if (!r.error.empty()) ++failed;
    if (tty) fmt::print(stderr, "\r{}: {}{}\n", what, r.error.empty() ? "done" : "FAILED: ", r.error);
    else if (!r.error.empty()) fmt::print(stderr, "  FAILED: {}\n", r.error);
  }
  if (stream != nullptr) driver().cuStreamDestroy(stream);

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
      j.num("fwd_ms", r.fwd.median).num("fwd_ms_min", r.fwd.min).num("bwd_ms", r.bwd.median)
          .num("bwd_ms_min", r.bwd.min).num("fwd_bytes", r.fwd_bytes).num("bwd_bytes", r.bwd_bytes)
          .num("fwd_gb_per_s", r.fwd_bytes / r.fwd.median * 1e-6).num("bwd_gb_per_s", r.bwd_bytes / r.bwd.median * 1e-6)
          .num("fwd_state_updates_per_s", s.state_updates() / r.fwd.median * 1e3)
          .num("bwd_state_updates_per_s", s.state_updates() / r.bwd.median * 1e3).integer("input_sets", r.sets);
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
      std::string up;
      if (show_upstream && r.upstream_fwd > 0)
        up = fmt::format("   {:.2f}x / {:.2f}x", r.upstream_fwd / r.fwd.median, r.upstream_bwd / r.bwd.median);
      fmt::print("{:<{}} {:<5} {:>10.4f} {:>9.4g} {:>10.4f} {:>9.4g} {:>11.3g}{}\n", sh, w, dtype_name(r.spec.itype),
                 r.fwd.median, r.fwd_bytes / r.fwd.median * 1e-6, r.bwd.median, r.bwd_bytes / r.bwd.median * 1e-6,
                 r.spec.state_updates() / r.fwd.median * 1e-6, up);
    }
  }
  return failed == 0 ? kExitOk : kExitFail;
}

}  // namespace selscan_cli
