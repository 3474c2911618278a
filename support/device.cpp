#include "support/device.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "support/abi.h"
#include "support/dtype.h"
#include "support/rng.h"

namespace selscan_support {

std::string Target::name() const {
  return kind == SELSCAN_DEVICE_CUDA ? fmt::format("cuda:{}", index) : std::string("cpu");
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  const DriverState& st = driver_state();
  if (!st.available) return out;
  const Driver& d = driver();
  for (int i = 0; i < st.device_count; ++i) {
    DeviceInfo info;
    info.index = i;
    CUdevice dev = 0;
    if (d.cuDeviceGet(&dev, i) == kCudaSuccess) {
      char name[256] = {};
      if (d.cuDeviceGetName(name, int(sizeof(name)) - 1, dev) == kCudaSuccess) info.name = name;
      d.cuDeviceGetAttribute(&info.sm_major, kAttrComputeMajor, dev);
      d.cuDeviceGetAttribute(&info.sm_minor, kAttrComputeMinor, dev);
      d.cuDeviceGetAttribute(&info.sm_count, kAttrMultiprocessorCount, dev);
      d.cuDeviceGetAttribute(&info.clock_khz, kAttrClockRate, dev);
      int l2 = 0;
      d.cuDeviceGetAttribute(&l2, kAttrL2CacheSize, dev);
      info.l2_bytes = size_t(l2);
      d.cuDeviceTotalMem(&info.total_mem, dev);
    }
    info.check = selscan_check_device(i);
    if (info.check != SELSCAN_STATUS_SUCCESS) info.check_message = selscan_last_error();
    out.push_back(std::move(info));
  }
  return out;
}

// ------------------------------------------------------------------------------------------- tensors
const char* tensor_name(int t) {
  static const char* names[kTensorCount] = {"u",  "delta", "A",  "B",      "C",  "D",  "z",
                                            "delta_bias", "out", "out_z", "x", "last_state", "dout",
                                            "du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias"};
  return (t >= 0 && t < kTensorCount) ? names[t] : "?";
}

bool is_output(int t) { return (t >= kOut && t <= kLast) || t >= kDu; }

int64_t TensorLayout::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= sizes[i];
  return n;
}

size_t TensorLayout::bytes() const { return size_t(numel()) * size_t(dtype_size(dtype)); }

TensorLayout layout(const CaseSpec& s, int t) {
  TensorLayout l;
  auto set = [&](bool present, int32_t dt, std::initializer_list<int64_t> sz) {
    l.present = present;
    l.dtype = dt;
    l.ndim = int32_t(sz.size());
    int i = 0;
    for (int64_t v : sz) l.sizes[i++] = v;
  };
  const int32_t it = s.itype, f32 = SELSCAN_DTYPE_FLOAT32;
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
      set(s.has_delta_bias, f32, {s.dim});
      break;
    case kX:
      set(s.with_x, f32, {s.batch, s.dim, s.nchunks(), 2 * s.dstate});
      break;
    case kLast:
      set(s.with_last_state, f32, {s.batch, s.dim, s.dstate});
      break;
    default:
      break;
  }
  return l;
}

HostData make_inputs(const CaseSpec& s, uint64_t seed) {
  HostData h;
  auto fill = [&](int t, auto draw) {
    const TensorLayout l = layout(s, t);
    if (!l.present) return;
    Rng rng(seed * 1000003ull + uint64_t(t) * 7919ull);  // one stream per tensor: adding one leaves the others
    std::vector<float>& v = h.v[t];
    v.resize(size_t(l.numel()));
    for (float& x : v) x = float(round_to_dtype(l.dtype, draw(rng)));
  };
  // Upstream's test_selective_scan: decays in (e^-0.5, 1] per unit delta, so long sequences keep a long memory
  // and exercise the chunk carry.
  fill(kU, [](Rng& r) { return r.normal(); });
  fill(kDelta, [&](Rng& r) { return r.uniform(s.delta_lo, s.delta_hi); });
  fill(kA, [&](Rng& r) { return s.slow_decay ? -std::exp(std::log(1e-3) * r.uniform()) : -0.5 * r.uniform(); });
  fill(kB, [](Rng& r) { return r.normal(); });
  fill(kC, [](Rng& r) { return r.normal(); });
  fill(kD, [](Rng& r) { return r.normal(); });
  fill(kZ, [](Rng& r) { return r.normal(); });
  fill(kBias, [](Rng& r) { return 0.5 * r.uniform(); });
  fill(kDout, [](Rng& r) { return r.normal(); });
  return h;
}

// ------------------------------------------------------------------------------------------- DeviceCase
DeviceCase::~DeviceCase() {
  std::string ignored;
  // Frees go to the device's own context, whichever device the caller used last.
  if (target_.kind == SELSCAN_DEVICE_CUDA) current(&ignored);
  for (void*& p : ptr_) {
    release(p);
    p = nullptr;
  }
  release(workspace_);
  if (own_stream_) driver().cuStreamDestroy(stream_);
}

bool DeviceCase::current(std::string* err) {
  return target_.kind != SELSCAN_DEVICE_CUDA || make_current(target_.index, err);
}

bool DeviceCase::alloc(size_t bytes, void** p, std::string* err) {
  *p = nullptr;
  if (bytes == 0) return true;
  if (target_.kind == SELSCAN_DEVICE_CPU) {
    // The workspace alignment the ABI asks for, for every buffer (tensors only need their element's).
    *p = ::operator new(bytes, std::align_val_t(SELSCAN_WORKSPACE_ALIGNMENT), std::nothrow);
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
  if (target_.kind == SELSCAN_DEVICE_CPU) ::operator delete(p, std::align_val_t(SELSCAN_WORKSPACE_ALIGNMENT));
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

bool DeviceCase::download(int t, size_t offset, void* dst, size_t n, std::string* err) {
  if (n == 0) return true;
  const unsigned char* src = static_cast<const unsigned char*>(ptr_[t]) + offset;
  if (target_.kind == SELSCAN_DEVICE_CPU) {
    std::memcpy(dst, src, n);
    return true;
  }
  if (!current(err) || !sync(err)) return false;
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
    const TensorLayout l = layout(spec_, t);
    if (!l.present || ptr_[t] == nullptr) return selscan_tensor_t{};
    return contiguous_desc(ptr_[t], l.dtype, std::vector<int64_t>(l.sizes.begin(), l.sizes.begin() + l.ndim));
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

  ba_ = bwd_args_with_inputs_of(fa_, spec_.deterministic);
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

bool DeviceCase::init(const CaseSpec& s, const Target& target, const Options& opt, std::string* err) {
  if (s.complex || s.has_h0 || s.bc_3d || s.strides != Strides::contiguous || s.recompute_out_z) {
    *err = "DeviceCase holds contiguous real-weight cases without h0, bc_3d or a recomputed out_z: " + s.str();
    return false;
  }
  spec_ = s;
  target_ = target;
  backward_ = opt.backward;
  exec_ = selscan_exec_t SELSCAN_EXEC_INIT;
  exec_.device_kind = target.kind;
  exec_.device_index = target.index;
  exec_.num_threads = target.num_threads;
  if (target.kind == SELSCAN_DEVICE_CUDA) {
    if (!current(err)) return false;
    stream_ = opt.stream;
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
    if (!l.present || (!backward_ && t >= kDout)) continue;
    if (!alloc(l.bytes(), &ptr_[t], err)) return false;
  }
  build_args();
  size_t fws = 0, bws = 0;
  selscan_status_t st = selscan_fwd_workspace_size(&fa_, &exec_, &fws);
  if (st != SELSCAN_STATUS_SUCCESS) {
    *err = "selscan_fwd_workspace_size: " + status_text(st);
    return false;
  }
  if (backward_) {
    st = selscan_bwd_workspace_size(&ba_, &exec_, &bws);
    if (st != SELSCAN_STATUS_SUCCESS) {
      *err = "selscan_bwd_workspace_size: " + status_text(st);
      return false;
    }
  }
  workspace_needed_ = std::max(fws, bws);
  if (opt.own_workspace) {
    if (!alloc(workspace_needed_, &workspace_, err)) return false;
    use_workspace(workspace_, workspace_needed_);
  }
  return poison_outputs(err);
}

bool DeviceCase::init(const CaseSpec& s, const Target& target, const HostData& in, std::string* err) {
  if (!init(s, target, Options{}, err)) return false;
  for (int t = 0; t < kTensorCount; ++t)
    if (!is_output(t) && layout(s, t).present && !upload(t, in.v[t], err)) return false;
  return true;
}

void DeviceCase::use_workspace(void* p, size_t bytes) {
  exec_.workspace = p;
  exec_.workspace_bytes = bytes;
}

bool DeviceCase::upload(int t, const std::vector<float>& v, std::string* err) {
  const TensorLayout l = layout(spec_, t);
  if (int64_t(v.size()) != l.numel() || ptr_[t] == nullptr) {
    *err = fmt::format("internal: host tensor {} has {} values, expected {}", tensor_name(t), v.size(), l.numel());
    return false;
  }
  if (!current(err)) return false;
  if (l.dtype == SELSCAN_DTYPE_FLOAT32) return copy_in(ptr_[t], v.data(), v.size() * 4, err);
  const size_t es = size_t(dtype_size(l.dtype));
  std::vector<unsigned char> bytes(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) store_real(l.dtype, bytes.data() + i * es, v[i]);
  return copy_in(ptr_[t], bytes.data(), bytes.size(), err);
}

bool DeviceCase::fill(int t, const std::vector<unsigned char>& tile, std::string* err) {
  const TensorLayout l = layout(spec_, t);
  if (ptr_[t] == nullptr || tile.empty()) {
    *err = fmt::format("internal: nothing to fill tensor {} with", tensor_name(t));
    return false;
  }
  if (!current(err)) return false;
  unsigned char* dst = static_cast<unsigned char*>(ptr_[t]);
  for (size_t off = 0; off < l.bytes(); off += tile.size())
    if (!copy_in(dst + off, tile.data(), std::min(tile.size(), l.bytes() - off), err)) return false;
  return true;
}

bool DeviceCase::poison_outputs(std::string* err) {
  if (!current(err)) return false;
  for (int t = 0; t < kTensorCount; ++t) {
    const TensorLayout l = layout(spec_, t);
    if (!is_output(t) || ptr_[t] == nullptr) continue;
    if (target_.kind == SELSCAN_DEVICE_CPU) {
      std::memset(ptr_[t], 0xFF, l.bytes());
    } else {
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
  if (!current(err)) return false;
  const selscan_status_t st = selscan_fwd(&fa_, &exec_);
  if (st != SELSCAN_STATUS_SUCCESS) *err = "selscan_fwd: " + status_text(st);
  return st == SELSCAN_STATUS_SUCCESS;
}

bool DeviceCase::bwd(std::string* err) {
  if (!backward_) {
    *err = "internal: this DeviceCase holds the forward's tensors only";
    return false;
  }
  if (!current(err)) return false;
  const selscan_status_t st = selscan_bwd(&ba_, &exec_);
  if (st != SELSCAN_STATUS_SUCCESS) *err = "selscan_bwd: " + status_text(st);
  return st == SELSCAN_STATUS_SUCCESS;
}

bool DeviceCase::fetch(int t, HostData* out, std::string* err) {
  const TensorLayout l = layout(spec_, t);
  if (!l.present || ptr_[t] == nullptr) {
    out->v[t].clear();
    return true;
  }
  std::vector<unsigned char> bytes(l.bytes());
  if (!download(t, 0, bytes.data(), bytes.size(), err)) return false;
  const size_t es = size_t(dtype_size(l.dtype));
  out->v[t].resize(size_t(l.numel()));
  for (size_t i = 0; i < out->v[t].size(); ++i) out->v[t][i] = float(load_real(l.dtype, bytes.data() + i * es));
  return true;
}

}  // namespace selscan_support
