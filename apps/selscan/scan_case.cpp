#include "scan_case.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace selscan_cli {

// ------------------------------------------------------------------------------------------- spec/layout
std::string CaseSpec::shape_text() const {
  std::string s = fmt::format("{}x{}x{}:{}", batch, dim, seqlen, dstate);
  if (groups > 1) s += fmt::format(":{}", groups);
  return s;
}

std::string CaseSpec::flags_text() const {
  std::string s;
  auto add = [&](const std::string& w) { s += (s.empty() ? "" : ", ") + w; };
  if (var_B && var_C) add("var B/C");
  else if (var_B) add("var B, const C");
  else if (var_C) add("const B, var C");
  else add("const B/C");
  if (has_D) add("D");
  if (has_z) add("z");
  if (has_bias) add("delta_bias");
  if (softplus) add("softplus");
  return s;
}

const char* tensor_name(int t) {
  static const char* names[kTensorCount] = {"u",   "delta", "A",      "B",  "C",  "D",   "z",
                                            "delta_bias", "out", "out_z", "x",  "last_state", "dout",
                                            "du",  "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias"};
  return (t >= 0 && t < kTensorCount) ? names[t] : "?";
}

int64_t TensorLayout::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= sizes[i];
  return n;
}

size_t TensorLayout::bytes() const { return size_t(numel()) * dtype_size(dtype); }

TensorLayout layout(const CaseSpec& s, int t) {
  TensorLayout l;
  auto set = [&](bool present, selscan_dtype_t dt, std::initializer_list<int64_t> sz) {
    l.present = present;
    l.dtype = dt;
    l.ndim = int32_t(sz.size());
    int i = 0;
    for (int64_t v : sz) l.sizes[i++] = v;
  };
  const selscan_dtype_t it = s.itype, f32 = SELSCAN_DTYPE_FLOAT32;
  switch (t) {
    case kU: case kDelta: case kOut: case kDout: case kDu: case kDdelta:
      set(true, it, {s.batch, s.dim, s.seqlen});
      break;
    case kZ: case kOutZ: case kDz:
      set(s.has_z, it, {s.batch, s.dim, s.seqlen});
      break;
    case kA: case kDA:
      set(true, f32, {s.dim, s.dstate});
      break;
    case kB: case kDB:
      if (s.var_B) set(true, it, {s.batch, s.groups, s.dstate, s.seqlen});
      else set(true, f32, {s.dim, s.dstate});
      break;
    case kC: case kDC:
      if (s.var_C) set(true, it, {s.batch, s.groups, s.dstate, s.seqlen});
      else set(true, f32, {s.dim, s.dstate});
      break;
    case kD: case kDD:
      set(s.has_D, f32, {s.dim});
      break;
    case kBias: case kDbias:
      set(s.has_bias, f32, {s.dim});
      break;
    case kX:
      set(s.has_x(), f32, {s.batch, s.dim, s.nchunks(), 2 * s.dstate});
      break;
    case kLast:
      set(s.want_last_state, f32, {s.batch, s.dim, s.dstate});
      break;
    default:
      break;
  }
  return l;
}

size_t dtype_size(selscan_dtype_t t) {
  switch (t) {
    case SELSCAN_DTYPE_FLOAT16: case SELSCAN_DTYPE_BFLOAT16: return 2;
    case SELSCAN_DTYPE_COMPLEX64: return 8;
    default: return 4;
  }
}

const char* dtype_name(selscan_dtype_t t) {
  switch (t) {
    case SELSCAN_DTYPE_FLOAT16: return "fp16";
    case SELSCAN_DTYPE_BFLOAT16: return "bf16";
    case SELSCAN_DTYPE_COMPLEX64: return "c64";
    default: return "fp32";
  }
}

bool parse_dtype(const std::string& s, selscan_dtype_t* out) {
  if (s == "fp32" || s == "float32" || s == "float") *out = SELSCAN_DTYPE_FLOAT32;
  else if (s == "fp16" || s == "float16" || s == "half") *out = SELSCAN_DTYPE_FLOAT16;
  else if (s == "bf16" || s == "bfloat16") *out = SELSCAN_DTYPE_BFLOAT16;
  else return false;
  return true;
}

bool parse_shape(const std::string& text, CaseSpec* s, std::string* err) {
  // BtxDxL:N[:G]
  int64_t v[5] = {0, 0, 0, 0, 1};
  const char seps[5] = {'x', 'x', ':', ':', '\0'};
  const char* p = text.c_str();
  int n = 0;
  for (; n < 5; ++n) {
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(p, &end, 10);
    if (end == p || errno != 0 || x < 1) break;
    v[n] = x;
    p = end;
    if (*p == '\0') { ++n; break; }
    if (*p != seps[n]) { n = -1; break; }
    ++p;
  }
  if (n < 4 || *p != '\0') {
    *err = fmt::format("bad shape '{}': expected BtxDxL:N or BtxDxL:N:G with positive integers (e.g. 8x1536x2048:16)",
                       text);
    return false;
  }
  if (v[1] % v[4] != 0) {
    *err = fmt::format("bad shape '{}': the groups G={} must divide D={}", text, v[4], v[1]);
    return false;
  }
  s->batch = v[0];
  s->dim = v[1];
  s->seqlen = v[2];
  s->dstate = v[3];
  s->groups = v[4];
  return true;
}

// ------------------------------------------------------------------------------------------- dtypes
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);  // NaN stays NaN (quiet)
  u += 0x7FFFu + ((u >> 16) & 1u);                                          // round to nearest even
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t h) { return float_of(uint32_t(h) << 16); }

uint16_t to_fp16(float f) {
  uint32_t x = bits_of(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | (x > 0x7F800000u ? 0x7E00u : 0x7C00u);
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {                         // below 2^-14: subnormal half (exact scaling by 2^24)
    const float m = std::nearbyint(float_of(x) * 16777216.0f);
    return uint16_t(sign | uint16_t(m));
  }
  uint32_t h = (((x >> 23) - 112u) << 10) | ((x >> 13) & 0x3FFu);
  const uint32_t rest = x & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is still right
  return uint16_t(sign | h);
}
float from_fp16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * float(m) * (1.0f / 16777216.0f);
  if (e == 31) return float_of(sign | 0x7F800000u | (m << 13));
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace

float round_to(selscan_dtype_t t, float v) {
  switch (t) {
    case SELSCAN_DTYPE_FLOAT16: return from_fp16(to_fp16(v));
    case SELSCAN_DTYPE_BFLOAT16: return from_bf16(to_bf16(v));
    default: return v;
  }
}

void encode(selscan_dtype_t t, const std::vector<float>& v, std::vector<uint8_t>* bytes) {
  bytes->resize(v.size() * dtype_size(t));
  if (t == SELSCAN_DTYPE_FLOAT16 || t == SELSCAN_DTYPE_BFLOAT16) {
    auto* out = reinterpret_cast<uint16_t*>(bytes->data());
    for (size_t i = 0; i < v.size(); ++i) out[i] = t == SELSCAN_DTYPE_FLOAT16 ? to_fp16(v[i]) : to_bf16(v[i]);
  } else if (!v.empty()) {
    std::memcpy(bytes->data(), v.data(), v.size() * 4);
  }
}

void decode(selscan_dtype_t t, const std::vector<uint8_t>& bytes, std::vector<float>* v) {
  const size_t n = bytes.size() / dtype_size(t);
  v->resize(n);
  if (t == SELSCAN_DTYPE_FLOAT16 || t == SELSCAN_DTYPE_BFLOAT16) {
    const auto* in = reinterpret_cast<const uint16_t*>(bytes.data());
    for (size_t i = 0; i < n; ++i) (*v)[i] = t == SELSCAN_DTYPE_FLOAT16 ? from_fp16(in[i]) : from_bf16(in[i]);
  } else if (n > 0) {
    std::memcpy(v->data(), bytes.data(), n * 4);
  }
}

// ------------------------------------------------------------------------------------------- inputs
namespace {

struct Rng {
  uint64_t state;
  uint64_t next() {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double normal() {                                                                 // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace

HostData make_inputs(const CaseSpec& s, uint64_t seed, bool tiled) {
  HostData h;
  const int64_t kPool = 1000003;  // prime
  auto fill = [&](int t, auto draw) {
    const TensorLayout l = layout(s, t);
    if (!l.present) return;
    Rng rng{seed * 1000003ull + uint64_t(t) * 7919ull};
    const int64_t n = l.numel();
    const int64_t distinct = tiled ? std::min(n, kPool) : n;
    std::vector<float>& v = h.v[t];
    v.resize(size_t(n));
    for (int64_t i = 0; i < distinct; ++i) v[size_t(i)] = round_to(l.dtype, float(draw(rng)));
    for (int64_t i = distinct; i < n; ++i) v[size_t(i)] = v[size_t(i - distinct)];
  };
  // The distributions of upstream's test_selective_scan: decays in (e^-0.5, 1] per unit delta, so long
  // sequences keep a long memory and exercise the chunk carry.
  fill(kU, [](Rng& r) { return r.normal(); });
  fill(kDelta, [](Rng& r) { return 0.5 * r.uniform(); });
  fill(kA, [](Rng& r) { return -0.5 * r.uniform(); });
  fill(kB, [](Rng& r) { return r.normal(); });
  fill(kC, [](Rng& r) { return r.normal(); });
  fill(kD, [](Rng& r) { return r.normal(); });
  fill(kZ, [](Rng& r) { return r.normal(); });
  fill(kBias, [](Rng& r) { return 0.5 * r.uniform(); });
  fill(kDout, [](Rng& r) { return r.normal(); });
  return h;
}

// ------------------------------------------------------------------------------------------- targets
std::string Target::name() const {
  return kind == SELSCAN_DEVICE_CUDA ? fmt::format("cuda:{}", index) : std::string("cpu");
}

std::string status_text(selscan_status_t st) {
  const char* msg = selscan_last_error();
  std::string s = selscan_status_string(st);
  if (msg != nullptr && *msg != '\0') s += fmt::format(": {}", msg);
  return s;
}

DeviceCase::~DeviceCase() {
  std::string ignored;
  // Frees go to the device's own context, whichever device the caller used last.
  if (target_.kind == SELSCAN_DEVICE_CUDA) make_current(target_.index, &ignored);
  for (void*& p : ptr_) {
    release(p);
    p = nullptr;
  }
  release(workspace_);
  if (own_stream_) driver().cuStreamDestroy(stream_);
}

bool DeviceCase::alloc(size_t bytes, void** p, std::string* err) {
  *p = nullptr;
  if (bytes == 0) return true;
  if (target_.kind == SELSCAN_DEVICE_CPU) {
    // 64-byte alignment: what a caller's allocator would give; keeps the CPU path on its vector loads.
    *p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (*p == nullptr) {
      *err = fmt::format("out of host memory allocating {} bytes", bytes);
      return false;
    }
  } else {
    CUdeviceptr d = 0;
    const CUresult r = driver().cuMemAlloc(&d, bytes);
    if (r != kCudaSuccess) {
      *err = fmt::format("cuMemAlloc({} bytes) on {}: {}", bytes, target_.name(), driver().error_text(r));
      return false;
    }
    *p = reinterpret_cast<void*>(d);
  }
  total_bytes_ += bytes;
  return true;
}

void DeviceCase::release(void* p) {
  if (p == nullptr) return;
  if (target_.kind == SELSCAN_DEVICE_CPU) std::free(p);
  else driver().cuMemFree(reinterpret_cast<CUdeviceptr>(p));
}

bool DeviceCase::copy_in(void* dst, const void* src, size_t n, std::string* err) {
  if (n == 0) return true;
  if (target_.kind == SELSCAN_DEVICE_CPU) {
    std::memcpy(dst, src, n);
    return true;
  }
  const CUresult r = driver().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, n);
  if (r != kCudaSuccess) *err = fmt::format("cuMemcpyHtoD: {}", driver().error_text(r));
  return r == kCudaSuccess;
}

bool DeviceCase::copy_out(void* dst, const void* src, size_t n, std::string* err) {
  if (n == 0) return true;
  if (target_.kind == SELSCAN_DEVICE_CPU) {
    std::memcpy(dst, src, n);
    return true;
  }
  if (!sync(err)) return false;
  const CUresult r = driver().cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), n);
  if (r != kCudaSuccess) *err = fmt::format("cuMemcpyDtoH: {}", driver().error_text(r));
  return r == kCudaSuccess;
}

bool DeviceCase::sync(std::string* err) {
  if (target_.kind == SELSCAN_DEVICE_CPU) return true;
  const CUresult r = driver().cuStreamSynchronize(stream_);
  if (r != kCudaSuccess) *err = fmt::format("cuStreamSynchronize on {}: {}", target_.name(), driver().error_text(r));
  return r == kCudaSuccess;
}

void DeviceCase::build_args() {
  auto tensor = [&](int t) {
    selscan_tensor_t x{};
    const TensorLayout l = layout(spec_, t);
    if (!l.present) return x;
    x.data = ptr_[t];
    x.dtype = l.dtype;
    x.ndim = l.ndim;
    int64_t stride = 1;
    for (int i = l.ndim - 1; i >= 0; --i) {
      x.sizes[i] = l.sizes[i];
      x.strides[i] = stride;
      stride *= l.sizes[i];
    }
    return x;
  };
  fa_ = selscan_fwd_args_t{};
  fa_.struct_size = sizeof(fa_);
  fa_.u = tensor(kU);
  fa_.delta = tensor(kDelta);
  fa_.A = tensor(kA);
  fa_.B = tensor(kB);
  fa_.C = tensor(kC);
  fa_.D = tensor(kD);
  fa_.z = tensor(kZ);
  fa_.delta_bias = tensor(kBias);
  fa_.delta_softplus = spec_.softplus ? 1 : 0;
  fa_.out = tensor(kOut);
  fa_.out_z = tensor(kOutZ);
  fa_.x = tensor(kX);
  fa_.last_state = tensor(kLast);

  ba_ = selscan_bwd_args_t{};
  ba_.struct_size = sizeof(ba_);
  ba_.u = fa_.u;
  ba_.delta = fa_.delta;
  ba_.A = fa_.A;
  ba_.B = fa_.B;
  ba_.C = fa_.C;
  ba_.D = fa_.D;
  ba_.z = fa_.z;
  ba_.delta_bias = fa_.delta_bias;
  ba_.delta_softplus = fa_.delta_softplus;
  ba_.deterministic = spec_.deterministic ? 1 : 0;
  ba_.dout = tensor(kDout);
  ba_.x = fa_.x;
  if (spec_.has_z) ba_.out = fa_.out;  // the pre-gate output is a backward input only with z
  ba_.du = tensor(kDu);
  ba_.ddelta = tensor(kDdelta);
  ba_.dA = tensor(kDA);
  ba_.dB = tensor(kDB);
  ba_.dC = tensor(kDC);
  ba_.dD = tensor(kDD);
  ba_.dz = tensor(kDz);
  ba_.ddelta_bias = tensor(kDbias);
}

bool DeviceCase::init(const CaseSpec& s, const Target& target, const HostData& in, std::string* err,
                      CUstream stream) {
  spec_ = s;
  target_ = target;
  exec_ = selscan_exec_t SELSCAN_EXEC_INIT;
  exec_.device_kind = target.kind;
  exec_.device_index = target.index;
  exec_.num_threads = target.num_threads;
  if (target.kind == SELSCAN_DEVICE_CUDA) {
    if (!make_current(target.index, err)) return false;
    stream_ = stream;
    if (stream_ == nullptr) {
      const CUresult r = driver().cuStreamCreate(&stream_, 0);  // blocking: ordered after our default-stream copies
      if (r != kCudaSuccess) {
        *err = fmt::format("cuStreamCreate on {}: {}", target.name(), driver().error_text(r));
        return false;
      }
      own_stream_ = true;
    }
    exec_.stream = stream_;
  }
  for (int t = 0; t < kTensorCount; ++t) {
    const TensorLayout l = layout(s, t);
    if (!l.present) continue;
    if (!alloc(l.bytes(), &ptr_[t], err)) return false;
  }
  static const int kInputs[] = {kU, kDelta, kA, kB, kC, kD, kZ, kBias, kDout};
  for (int t : kInputs) {
    if (!layout(s, t).present) continue;
    if (!upload(t, in.v[t], err)) return false;
  }
  build_args();
  size_t fws = 0, bws = 0;
  selscan_status_t st = selscan_fwd_workspace_size(&fa_, &exec_, &fws);
  if (st != SELSCAN_STATUS_SUCCESS) {
    *err = "selscan_fwd_workspace_size: " + status_text(st);
    return false;
  }
  st = selscan_bwd_workspace_size(&ba_, &exec_, &bws);
  if (st != SELSCAN_STATUS_SUCCESS) {
    *err = "selscan_bwd_workspace_size: " + status_text(st);
    return false;
  }
  workspace_bytes_ = std::max(fws, bws);
  if (!alloc(workspace_bytes_, &workspace_, err)) return false;
  exec_.workspace = workspace_;
  exec_.workspace_bytes = workspace_bytes_;
  return poison_outputs(err);
}

bool DeviceCase::upload(int t, const std::vector<float>& v, std::string* err) {
  const TensorLayout l = layout(spec_, t);
  if (int64_t(v.size()) != l.numel()) {
    *err = fmt::format("internal: host tensor {} has {} values, expected {}", tensor_name(t), v.size(), l.numel());
    return false;
  }
  if (target_.kind == SELSCAN_DEVICE_CUDA && !make_current(target_.index, err)) return false;
  if (l.dtype == SELSCAN_DTYPE_FLOAT32) return copy_in(ptr_[t], v.data(), v.size() * 4, err);
  std::vector<uint8_t> bytes;
  encode(l.dtype, v, &bytes);
  return copy_in(ptr_[t], bytes.data(), bytes.size(), err);
}

bool DeviceCase::poison_outputs(std::string* err) {
  static const int kOutputs[] = {kOut, kOutZ, kX, kLast, kDu, kDdelta, kDA, kDB, kDC, kDD, kDz, kDbias};
  for (int t : kOutputs) {
    const TensorLayout l = layout(spec_, t);
    if (!l.present) continue;
    if (target_.kind == SELSCAN_DEVICE_CPU) {
      std::memset(ptr_[t], 0xFF, l.bytes());
    } else {
      if (!make_current(target_.index, err)) return false;
      const CUresult r = driver().cuMemsetD8(reinterpret_cast<CUdeviceptr>(ptr_[t]), 0xFF, l.bytes());
      if (r != kCudaSuccess) {
        *err = fmt::format("cuMemsetD8: {}", driver().error_text(r));
        return false;
      }
    }
  }
  return true;
}

bool DeviceCase::fwd(std::string* err) {
  if (target_.kind == SELSCAN_DEVICE_CUDA && !make_current(target_.index, err)) return false;
  const selscan_status_t st = selscan_fwd(&fa_, &exec_);
  if (st != SELSCAN_STATUS_SUCCESS) *err = "selscan_fwd: " + status_text(st);
  return st == SELSCAN_STATUS_SUCCESS;
}

bool DeviceCase::bwd(std::string* err) {
  if (target_.kind == SELSCAN_DEVICE_CUDA && !make_current(target_.index, err)) return false;
  const selscan_status_t st = selscan_bwd(&ba_, &exec_);
  if (st != SELSCAN_STATUS_SUCCESS) *err = "selscan_bwd: " + status_text(st);
  return st == SELSCAN_STATUS_SUCCESS;
}

bool DeviceCase::fetch(int t, HostData* out, std::string* err) {
  const TensorLayout l = layout(spec_, t);
  if (!l.present) {
    out->v[t].clear();
    return true;
  }
  if (target_.kind == SELSCAN_DEVICE_CUDA && !make_current(target_.index, err)) return false;
  if (l.dtype == SELSCAN_DTYPE_FLOAT32) {
    out->v[t].resize(size_t(l.numel()));
    return copy_out(out->v[t].data(), ptr_[t], l.bytes(), err);
  }
  std::vector<uint8_t> bytes(l.bytes());
  if (!copy_out(bytes.data(), ptr_[t], bytes.size(), err)) return false;
  decode(l.dtype, bytes, &out->v[t]);
  return true;
}

// ------------------------------------------------------------------------------------------- agreement
namespace {

template <typename R>
Agreement compare_impl(const std::string& name, const std::vector<float>& got, const std::vector<R>& ref,
                       double tol) {
  Agreement a;
  a.name = name;
  a.tol = tol;
  if (got.size() != ref.size()) {
    a.score = std::numeric_limits<double>::infinity();
    a.max_abs = a.score;
    return a;
  }
  double ss = 0;
  for (const R& r : ref) ss += double(r) * double(r);
  const double rms = ref.empty() ? 0.0 : std::sqrt(ss / double(ref.size()));
  const double floor = rms > 0 ? rms : 1e-30;
  bool finite = true;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = double(ref[i]);
    if (!std::isfinite(g)) {
      finite = false;
      continue;
    }
    const double e = std::fabs(g - r);
    a.max_abs = std::max(a.max_abs, e);
    a.score = std::max(a.score, e / (std::fabs(r) + floor));
  }
  if (!finite) {
    a.score = std::numeric_limits<double>::infinity();
    a.max_abs = a.score;
  }
  a.pass = finite && a.score <= tol;
  return a;
}

}  // namespace

Agreement compare(const std::string& name, const std::vector<float>& got, const std::vector<double>& ref,
                  double tol) {
  return compare_impl(name, got, ref, tol);
}
Agreement compare(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
                  double tol) {
  return compare_impl(name, got, ref, tol);
}

double tolerance(selscan_dtype_t itype) {
  switch (itype) {
    case SELSCAN_DTYPE_FLOAT16: return 5e-3;   // 2^-11 rounding of every itype output, with room
    case SELSCAN_DTYPE_BFLOAT16: return 3e-2;  // 2^-8 rounding, with room
    default: return 2e-4;                      // fp32 accumulation over long sequences (float64: ~1e-6)
  }
}

}  // namespace selscan_cli
