#include "support/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "support/abi.h"
#include "support/dtype.h"
#include "support/rng.h"

namespace selscan_support {

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::fwd: return "fwd";
    case Mode::fwd_infer: return "fwd_infer";
    case Mode::bwd: return "bwd";
    case Mode::bwd_det: return "bwd_det";
  }
  return "?";
}

bool is_bwd(Mode m) { return m == Mode::bwd || m == Mode::bwd_det; }

CaseSpec spec_for(CaseSpec s, Mode m) {
  s.with_x = m != Mode::fwd_infer;  // upstream's backward always gets x; it reads it only when L > 2048
  s.with_last_state = m == Mode::fwd_infer;
  s.deterministic = m == Mode::bwd_det;
  return s;
}

double min_bytes(const CaseSpec& s, Mode m) {
  const double it = double(dtype_size(s.itype));
  const double btl = double(s.btl()) * it;
  const double var = double(s.bc_numel()) * it, dn = double(s.dim) * double(s.dstate) * 4.0;
  const double bc = (s.var_B ? var : dn) + (s.var_C ? var : dn);
  const double vecs = double(s.dim) * 4.0 * ((s.has_D ? 1 : 0) + (s.has_delta_bias ? 1 : 0));
  const double x = double(s.batch) * double(s.dim) * double(s.nchunks()) * 2.0 * double(s.dstate) * 4.0;
  const double state = double(s.batch) * double(s.dim) * double(s.dstate) * 4.0;
  const double z = s.has_z ? 1.0 : 0.0;
  if (!is_bwd(m)) {
    // u, delta, z, B, C, A, D, delta_bias in; out, out_z and x (training) or last_state (inference) out.
    return btl * (2 + z) + bc + dn + vecs + btl * (1 + z) + (m == Mode::fwd ? x : state);
  }
  // u, delta, dout, z and out (with z), B, C, A, D, delta_bias and x (L > 2048) in; du, ddelta, dz, dB, dC,
  // dA, dD, ddelta_bias out.
  return btl * (3 + 2 * z) + bc + dn + vecs + (s.nchunks() > 1 ? x : 0.0) + btl * (2 + z) + bc + dn + vecs;
}

std::vector<BenchShape> bench_shapes(const std::string& section) {
  static const BenchShape table[] = {
#define SELSCAN_BENCH_SHAPE(sec, bt, d, l, n, itype, up_fwd, up_bwd) \
  {#sec, case_spec(bt, d, l, n, SELSCAN_DTYPE_##itype), up_fwd, up_bwd},
#include "support/bench_shapes.def"
#undef SELSCAN_BENCH_SHAPE
  };
  std::vector<BenchShape> rows;
  for (const BenchShape& r : table)
    if (r.section == section) rows.push_back(r);
  return rows;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

Range input_range(int t) {
  switch (t) {
    case kU: case kZ: return {-2.0, 2.0};
    case kDelta: return {-3.0, -1.0};
    case kBias: return {-1.0, 0.0};
    case kD: return {0.5, 1.5};
    default: return {-1.0, 1.0};  // B, C, dout
  }
}

void fill_uniform(void* dst, int32_t dtype, int64_t n, double lo, double hi, uint64_t seed) {
  const int64_t es = dtype_size(dtype);
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) store_real(dtype, static_cast<unsigned char*>(dst) + i * es, rng.uniform(lo, hi));
}

namespace {

// Up to 2^22 random elements of tensor t in `dtype`, repeated to fill larger tensors (the values only need a
// realistic range; generating billions would dominate setup). Kept for the process: every benchmark of a
// dtype uses the same tiles.
const std::vector<unsigned char>& input_tile(int t, int32_t dtype, int64_t numel) {
  static std::map<std::tuple<int, int32_t, int64_t>, std::vector<unsigned char>> tiles;
  const int64_t n = std::min<int64_t>(numel, int64_t{1} << 22);
  std::vector<unsigned char>& tile = tiles[{t, dtype, n}];
  if (tile.empty()) {
    const Range r = input_range(t);
    tile.resize(size_t(n * dtype_size(dtype)));
    fill_uniform(tile.data(), dtype, n, r.lo, r.hi, uint64_t(t) + 1);
  }
  return tile;
}

// Bytes of the tensors DeviceCase allocates for one set of `s` (the forward's, plus dout and the gradients).
double tensor_bytes(const CaseSpec& s, bool backward) {
  double b = 0;
  for (int t = 0; t < kTensorCount; ++t)
    if (layout(s, t).present && (backward || t < kDout)) b += double(layout(s, t).bytes());
  return b;
}

bool driver_ok(CUresult r, const char* what, std::string* err) {
  if (r != kCudaSuccess) *err = fmt::format("{}: {}", what, driver().error_text(r));
  return r == kCudaSuccess;
}

}  // namespace

bool fill_bench_inputs(DeviceCase& c, std::string* err) {
  const CaseSpec& s = c.spec();
  std::vector<float> A(size_t(s.dim * s.dstate));
  for (int64_t d = 0; d < s.dim; ++d)
    for (int64_t n = 0; n < s.dstate; ++n) A[size_t(d * s.dstate + n)] = -float(n + 1);
  for (int t = 0; t < kTensorCount; ++t) {
    const TensorLayout l = layout(s, t);
    if (is_output(t) || !l.present || !c.allocated(t)) continue;
    const bool ok = t == kA ? c.upload(t, A, err) : c.fill(t, input_tile(t, l.dtype, l.numel()), err);
    if (!ok) return false;
  }
  return true;
}

BenchRun::~BenchRun() {
  const bool gpu = target_.kind == SELSCAN_DEVICE_CUDA;
  std::string ignored;
  if (gpu) make_current(target_.index, &ignored);
  sets_.clear();
  if (gpu) {
    const Driver& d = driver();
    if (workspace_ != nullptr) d.cuMemFree(reinterpret_cast<CUdeviceptr>(workspace_));
    if (start_ != nullptr) d.cuEventDestroy(start_);
    if (stop_ != nullptr) d.cuEventDestroy(stop_);
    if (stream_ != nullptr) d.cuStreamDestroy(stream_);
  }
}

bool BenchRun::init(const CaseSpec& spec, Mode mode, const Target& target, std::string* err) {
  spec_ = spec_for(spec, mode);
  mode_ = mode;
  target_ = target;
  const bool gpu = target.kind == SELSCAN_DEVICE_CUDA, bwd = is_bwd(mode);
  set_bytes_ = tensor_bytes(spec_, bwd);
  int nsets = 1;
  if (gpu) {
    const Driver& d = driver();
    if (!make_current(target.index, err)) return false;
    size_t free_b = 0, total_b = 0;
    if (!driver_ok(d.cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo", err)) return false;
    nsets = std::clamp(int(std::ceil(kMinRotationBytes / set_bytes_)), kMinSets, kMaxSets);
    // Sets that exceed L2 on their own can rotate with fewer of them; keep headroom for the workspace.
    while (nsets > 2 && double(nsets) * set_bytes_ > 0.8 * double(free_b)) --nsets;
    if (double(nsets) * set_bytes_ > 0.8 * double(free_b)) {
      *err = fmt::format("not enough device memory for 2 buffer sets of {} MiB", int64_t(set_bytes_) >> 20);
      return false;
    }
    if (!driver_ok(d.cuStreamCreate(&stream_, kStreamNonBlocking), "cuStreamCreate", err) ||
        !driver_ok(d.cuEventCreate(&start_, 0), "cuEventCreate", err) ||
        !driver_ok(d.cuEventCreate(&stop_, 0), "cuEventCreate", err))
      return false;
  }
  DeviceCase::Options opt;
  opt.backward = bwd;
  opt.own_workspace = !gpu;
  opt.stream = stream_;
  for (int k = 0; k < nsets; ++k) {
    auto c = std::make_unique<DeviceCase>();
    if (!c->init(spec_, target, opt, err) || !fill_bench_inputs(*c, err)) return false;
    sets_.push_back(std::move(c));
  }
  if (gpu) {
    // One workspace serves every set: the calls are serialised on one stream.
    const size_t ws = sets_[0]->workspace_needed();
    CUdeviceptr p = 0;
    if (ws > 0 && !driver_ok(driver().cuMemAlloc(&p, ws), "cuMemAlloc (workspace)", err)) return false;
    workspace_ = reinterpret_cast<void*>(p);
    for (auto& c : sets_) c->use_workspace(workspace_, ws);
    // The outputs' poison was written on the legacy stream, which a non-blocking stream does not wait for.
    if (!driver_ok(driver().cuCtxSynchronize(), "cuCtxSynchronize", err)) return false;
  }
  // The backward's inputs out and x come from a real forward on each set.
  if (bwd)
    for (auto& c : sets_)
      if (!c->fwd(err)) return false;
  // Warm-up: module load, first touch, clocks.
  for (auto& c : sets_)
    if (!enqueue(*c, err)) return false;
  if (!sets_[0]->sync(err)) return false;
  for (size_t k : {size_t(0), sets_.size() - 1}) {
    const std::string why = check_output(*sets_[k]);
    if (!why.empty()) {
      *err = fmt::format("set {}: {}", k, why);
      return false;
    }
  }
  return true;
}

bool BenchRun::enqueue(DeviceCase& c, std::string* err) {
  const selscan_status_t st =
      is_bwd(mode_) ? selscan_bwd(&c.bwd_args(), &c.exec()) : selscan_fwd(&c.fwd_args(), &c.exec());
  if (st != SELSCAN_STATUS_SUCCESS) {
    *err = std::string(is_bwd(mode_) ? "selscan_bwd: " : "selscan_fwd: ") + status_text(st);
    return false;
  }
  return true;
}

bool BenchRun::call(std::string* err) {
  DeviceCase& c = *sets_[cursor_];
  cursor_ = (cursor_ + 1) % sets_.size();
  return enqueue(c, err);
}

bool BenchRun::timed_call(double* ms, std::string* err) {
  if (target_.kind != SELSCAN_DEVICE_CUDA) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!call(err)) return false;
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return true;
  }
  const Driver& d = driver();
  if (!call(err)) return false;
  if (!driver_ok(d.cuEventRecord(start_, stream_), "cuEventRecord", err) || !call(err) ||
      !driver_ok(d.cuEventRecord(stop_, stream_), "cuEventRecord", err) ||
      !driver_ok(d.cuEventSynchronize(stop_), "timed call", err))
    return false;
  float t = 0;
  if (!driver_ok(d.cuEventElapsedTime(&t, start_, stop_), "cuEventElapsedTime", err)) return false;
  *ms = double(t);
  return true;
}

std::string BenchRun::check_output(DeviceCase& c) {
  const int t = is_bwd(mode_) ? kDu : (spec_.has_z ? kOutZ : kOut);
  const TensorLayout l = layout(spec_, t);
  const int64_t n = l.numel(), es = dtype_size(l.dtype);
  const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 20);
  std::vector<unsigned char> h(size_t(chunk * es));
  std::string err;
  for (int64_t start : {int64_t{0}, (n - chunk) / 2, n - chunk}) {
    if (!c.download(t, size_t(start * es), h.data(), h.size(), &err)) return err;
    for (int64_t i = 0; i < chunk; ++i)
      if (!finite_element(l.dtype, h.data() + i * es))
        return fmt::format("{} not written or not finite (element {})", tensor_name(t), start + i);
  }
  return "";
}

}  // namespace selscan_support
