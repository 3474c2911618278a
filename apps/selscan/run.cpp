// `selscan run`: the main job end to end on one device: forward + backward on a built-in default shape (or a
// given one), the time each takes, and how far every output and gradient is from the tool's float64
// reference (and, on a GPU, from the library's CPU path). Exit 1 on disagreement.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "cli.h"
#include "json.h"

namespace selscan_cli {

namespace {

const char* kRunHelp =
    "usage: selscan run [--device cpu|cuda|cuda:N] [--shape BtxDxL:N[:G]] [--dtype fp32|fp16|bf16]\n"
    "                   [--iters N] [--seed N] [--threads N] [--const-B] [--const-C] [--no-D] [--no-z]\n"
    "                   [--no-bias] [--no-softplus] [--deterministic] [--json]\n"
    "Forward + backward of one selective scan (default 2x768x1024:16 fp32, variable B/C, D, z, delta_bias,\n"
    "softplus) on the device (default: the first usable GPU, else the CPU): prints the median time of each\n"
    "direction and the agreement of every output and gradient with a float64 reference (and with the CPU\n"
    "path when on a GPU). Exits 1 when any tensor is outside its tolerance.\n";

}  // namespace

bool case_flag(const std::string& name, CaseSpec* s) {
  if (name == "--const-B") s->var_B = false;
  else if (name == "--const-C") s->var_C = false;
  else if (name == "--no-D") s->has_D = false;
  else if (name == "--no-z") s->has_z = false;
  else if (name == "--no-bias") s->has_delta_bias = false;
  else if (name == "--no-softplus") s->softplus = false;
  else if (name == "--deterministic") s->deterministic = true;
  else return false;
  return true;
}

int cmd_run(const std::vector<std::string>& args) {
  CaseSpec spec = case_spec(2, 768, 1024, 16, SELSCAN_DTYPE_FLOAT32);  // the README's shape
  std::string device, shape, dtype;
  int64_t iters = -1, seed = 1, threads = 0;
  bool json = false;
  Options opt(args);
  std::string name;
  while (opt.next(&name)) {
    if (name == "--help" || name == "-h") {
      fmt::print("{}", kRunHelp);
      return kExitOk;
    }
    if (name == "--device") opt.value(&device);
    else if (name == "--shape") opt.value(&shape);
    else if (name == "--dtype") opt.value(&dtype);
    else if (name == "--iters") opt.int_value(1, 100000, &iters);
    else if (name == "--seed") opt.int_value(0, INT64_MAX, &seed);
    else if (name == "--threads") opt.int_value(0, 4096, &threads);
    else if (name == "--json") json = true;
    else if (!case_flag(name, &spec)) opt.set_error(fmt::format("unknown option {}", name));
  }
  std::string err;
  if (opt.error().empty() && !shape.empty() && !parse_shape(shape, &spec, &err)) opt.set_error(err);
  if (opt.error().empty() && !dtype.empty() && !parse_dtype(dtype, &spec.itype))
    opt.set_error(fmt::format("bad --dtype '{}': expected fp32, fp16 or bf16", dtype));
  if (!opt.error().empty()) {
    fmt::print(stderr, "selscan run: {}\n{}", opt.error(), kRunHelp);
    return kExitUsage;
  }
  Target target;
  std::string label, note;
  if (!pick_target(device, &target, &label, &note, &err)) {
    fmt::print(stderr, "selscan run: {}\n", err);
    return kExitUsage;
  }
  target.num_threads = int32_t(threads);
  if (iters < 0) iters = target.kind == SELSCAN_DEVICE_CUDA ? 10 : 3;
  if (!note.empty()) fmt::print(stderr, "selscan run: {}\n", note);

  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const auto t0 = std::chrono::steady_clock::now();
  const HostData in = make_inputs(spec, uint64_t(seed));
  Reference ref;
  reference_forward_backward(spec, in, &ref, hw);
  const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double fd = reference_gradient_check(spec, 3, uint64_t(seed) + 100);

  // Correctness: one poisoned run on the target (and on the CPU, to compare a GPU with).
  CaseCheck cpu, dev;
  const std::string case_label = spec.shape_text();
  if (target.kind == SELSCAN_DEVICE_CUDA) {
    Target c;
    c.num_threads = int32_t(threads);
    cpu = check_case(case_label, spec, c, in, ref, nullptr, "");
    dev = check_case(case_label, spec, target, in, ref, cpu.ran ? &cpu.outputs : nullptr, "cpu");
  } else {
    dev = check_case(case_label, spec, target, in, ref, nullptr, "");
  }

  // Timing with the benchmark harness (support/bench.h): fresh buffers, a warm-up call on each.
  double tf = 0, tb = 0;
  bool timed = false;
  if (dev.ran) {
    auto time = [&](Mode m, double* median_ms) {
      BenchRun b;
      std::vector<double> ms(static_cast<size_t>(iters));
      if (!b.init(spec, m, target, &err)) return false;
      for (double& t : ms)
        if (!b.timed_call(&t, &err)) return false;
      *median_ms = median(ms);
      return true;
    };
    timed = time(Mode::fwd, &tf) && time(spec.deterministic ? Mode::bwd_det : Mode::bwd, &tb);
    if (!timed) dev.error = "timing: " + err;
  }
  const bool ok = dev.pass() && timed && fd < 1e-5 && (target.kind == SELSCAN_DEVICE_CPU || cpu.pass());

  if (json) {
    Json j;
    j.object().boolean("ok", ok).str("device", target.name()).str("device_label", label);
    j.str("shape", spec.shape_text()).str("dtype", dtype_name(spec.itype)).str("flags", spec.flags_text());
    j.str("library", selscan_build_info());
    if (!dev.ran || !timed) j.str("error", dev.error);
    j.num("fwd_ms", tf).num("bwd_ms", tb).integer("iters", iters);
    j.num("reference_seconds", ref_s).num("reference_fd_rel_err", fd);
    j.array("tensors");
    for (size_t i = 0; i < dev.vs_ref.size(); ++i) {
      const Agreement& a = dev.vs_ref[i];
      j.object().str("tensor", a.name).num("vs_float64", a.score).num("max_abs", a.max_abs).num("tol", a.tol);
      if (i < dev.vs_other.size()) j.num("vs_cpu", dev.vs_other[i].score);
      j.boolean("pass", a.pass && (i >= dev.vs_other.size() || dev.vs_other[i].pass)).end();
    }
    j.end();
    if (target.kind == SELSCAN_DEVICE_CUDA) j.boolean("cpu_path_pass", cpu.pass());
    j.end();
    fmt::print("{}", j.text());
    return ok ? kExitOk : kExitFail;
  }

  fmt::print("selscan run: {} {} ({}) on {}\n", spec.shape_text(), dtype_name(spec.itype), spec.flags_text(), label);
  fmt::print("  library: {}\n", selscan_build_info());
  if (!dev.ran) {
    fmt::print("  FAILED to run: {}\n", dev.error);
    return kExitFail;
  }
  if (timed) {
    fmt::print("  forward   {:9.3f} ms   (median of {}; {:.3g} G state-updates/s)\n", tf, iters,
               spec.state_updates() / tf * 1e-6);
    fmt::print("  backward  {:9.3f} ms   (median of {})\n", tb, iters);
  } else {
    fmt::print("  FAILED {}\n", dev.error);
  }
  const bool on_gpu = target.kind == SELSCAN_DEVICE_CUDA;
  fmt::print("  agreement: max |got-ref| / (|ref| + rms(ref)) per tensor; tolerance {} for {}\n",
             sci(tolerance(spec.itype)), dtype_name(spec.itype));
  fmt::print("    {:<12} {:>11} {:>11}{}\n", "tensor", "vs float64", "max |err|", on_gpu ? "      vs cpu" : "");
  for (size_t i = 0; i < dev.vs_ref.size(); ++i) {
    const Agreement& a = dev.vs_ref[i];
    bool pass = a.pass;
    std::string other;
    if (i < dev.vs_other.size()) {
      other = fmt::format(" {:>11}", sci(dev.vs_other[i].score));
      pass = pass && dev.vs_other[i].pass;
    }
    fmt::print("    {:<12} {:>11} {:>11}{}{}\n", a.name, sci(a.score), sci(a.max_abs), other, pass ? "" : "   <-- FAIL");
  }
  if (on_gpu && !cpu.pass())
    fmt::print("  the CPU path itself {}\n", cpu.ran ? std::string("disagrees with float64 (see selscan run --device cpu)")
                                                     : "failed: " + cpu.error);
  fmt::print("  float64 reference gradients vs central finite differences: {} (float64 reference took {:.2f} s)\n",
             sci(fd), ref_s);
  fmt::print("{}\n", ok ? "PASS" : "FAIL");
  return ok ? kExitOk : kExitFail;
}

}  // namespace selscan_cli
