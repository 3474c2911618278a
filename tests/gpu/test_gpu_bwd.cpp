// GPU backward (selscan_bwd on SELSCAN_DEVICE_CUDA) against the float64 reference (support/reference.h; the
// library's CPU path is checked against it on the same inputs) and upstream's golden vectors. Every output is
// poisoned (NaN bytes) before each run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compare.h"
#include "golden.h"
#include "gpu_gate.h"
#include "reduced_cond.h"
#include "selscan/selscan.h"
#include "support/dtype.h"
#include "support/reference.h"

namespace selscan_test {
namespace {


int cw_of(int32_t dt) { return dt == SELSCAN_DTYPE_COMPLEX64 ? 2 : 1; }
int64_t esize(int32_t dt) { return dtype_size(dt); }
// Round a float to the itype and back (inputs are generated exactly representable).
float round_to(int32_t dt, float v) { return static_cast<float>(round_to_dtype(dt, v)); }

// ---------------------------------------------------------------------------------------------- tensors
// A strided tensor with a device allocation and a host mirror of the same bytes (the CPU path runs on the
// mirror). Values travel in logical row-major order as floats (complex: re, im pairs).
struct Tensor {
  int32_t dtype = SELSCAN_DTYPE_FLOAT32;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;  // elements before the first one (a misaligned base when odd)
  size_t bytes = 0;
  void* dev = nullptr;
  std::vector<uint8_t> host;

  Tensor() = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() {
    if (dev) cudaFree(dev);
  }

  int64_t count() const {
    int64_t c = 1;
    for (int64_t s : sizes) c *= s;
    return c;
  }
  // Byte offset of logical element i.
  size_t where(int64_t i) const {
    int64_t off = offset;
    for (int k = static_cast<int>(sizes.size()) - 1; k >= 0; --k) {
      off += (i % sizes[k]) * strides[k];
      i /= sizes[k];
    }
    return static_cast<size_t>(off * esize(dtype));
  }
  selscan_tensor_t desc(bool on_device) {
    selscan_tensor_t t{};
    t.data = (on_device ? static_cast<uint8_t*>(dev) : host.data()) + offset * esize(dtype);
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      t.sizes[k] = sizes[k];
      t.strides[k] = strides[k];
    }
    return t;
  }
};

bool g_host_only = false;  // tensors without a device copy (CPU-path-only checks)

void make_tensor(Tensor& t, int32_t dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                 int64_t offset = 0) {
  t.dtype = dtype;
  t.sizes = std::move(sizes);
  if (strides.empty()) {  // contiguous
    strides.assign(t.sizes.size(), 1);
    for (int k = static_cast<int>(t.sizes.size()) - 2; k >= 0; --k) strides[k] = strides[k + 1] * t.sizes[k + 1];
  }
  t.strides = std::move(strides);
  t.offset = offset;
  int64_t span = offset + 1;
  for (size_t k = 0; k < t.sizes.size(); ++k) span += (t.sizes[k] - 1) * t.strides[k];
  t.bytes = static_cast<size_t>(span * esize(dtype));
  t.host.assign(t.bytes, 0xFF);  // NaN bytes in every dtype
  if (!g_host_only) ASSERT_EQ(cudaMalloc(&t.dev, t.bytes), cudaSuccess);
}

void upload(Tensor& t, const std::vector<float>& v) {
  const int cw = cw_of(t.dtype);
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.count() * cw);
  for (int64_t i = 0; i < t.count(); ++i) {
    uint8_t* dst = t.host.data() + t.where(i);
    if (cw == 2) {
      std::memcpy(dst, &v[2 * i], 8);
    } else {
      store_real(t.dtype, dst, v[i]);
    }
  }
  if (t.dev) ASSERT_EQ(cudaMemcpy(t.dev, t.host.data(), t.bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

void poison(Tensor& t) {
  std::fill(t.host.begin(), t.host.end(), 0xFF);
  ASSERT_EQ(cudaMemset(t.dev, 0xFF, t.bytes), cudaSuccess);
}

std::vector<float> read_values(const Tensor& t, const std::vector<uint8_t>& raw) {
  const int cw = cw_of(t.dtype);
  std::vector<float> v(static_cast<size_t>(t.count() * cw));
  for (int64_t i = 0; i < t.count(); ++i) {
    const uint8_t* src = raw.data() + t.where(i);
    if (cw == 2) std::memcpy(&v[2 * i], src, 8);
    else v[i] = static_cast<float>(load_real(t.dtype, src));
  }
  return v;
}
std::vector<uint8_t> device_bytes(const Tensor& t) {
  std::vector<uint8_t> raw(t.bytes);
  EXPECT_EQ(cudaMemcpy(raw.data(), t.dev, t.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return raw;
}

// ---------------------------------------------------------------------------------------------- problem
// A case (support/spec.h) and its layout: 0 contiguous; 1 unusual strides (d-major inputs, padded outputs/rows);
// 2 misaligned bases. out_z is recomputed by the backward unless asked otherwise.
struct Cfg : CaseSpec {
  int layout = 0;
  explicit Cfg(const CaseSpec& s = CaseSpec()) : CaseSpec(s) { recompute_out_z = true; }
  std::string str() const { return CaseSpec::str() + " layout=" + std::to_string(layout); }
};

// Inputs and the forward's saved tensors in logical order (floats exactly representable in their dtype).
struct Host {
  std::vector<float> u, delta, z, dout, A, B, C, Dv, bias, h0, out, x;
};

struct Ref {  // float64 gradients, logical order (complex as pairs)
  std::vector<double> du, ddelta, dz, outz, dA, dB, dC, dD, dbias, dh0;
  // Condition scales of single elements of the reduced gradients, computed on demand (none for a golden case's
  // stored gradients)
  std::shared_ptr<ReducedCond> rc;
};

int64_t nchunks(int64_t L) { return (L + 2047) / 2048; }

// The forward's saved tensors (out rounded to the itype, x) and every gradient, from the float64 reference
// (support/reference.h) on the stored inputs. dz and out_z come from the rounded out, as the library computes
// them from the out it is given.
void reference(const Cfg& c, Host& h, Ref& r) {
  RefProblem p;
  p.Bt = c.batch, p.D = c.dim, p.L = c.seqlen, p.N = c.dstate, p.G = (c.var_B || c.var_C) ? c.groups : 1;
  p.cplx = c.complex, p.var_B = c.var_B, p.var_C = c.var_C, p.softplus = c.softplus;
  p.has_D = c.has_D, p.has_z = c.has_z, p.has_bias = c.has_delta_bias, p.has_h0 = c.has_h0;
  auto reals = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  auto weights = [&](const std::vector<float>& v) {  // complex values as (re, im) pairs
    std::vector<cd> w(v.size() / (c.complex ? 2 : 1));
    for (size_t i = 0; i < w.size(); ++i) w[i] = c.complex ? cd(v[2 * i], v[2 * i + 1]) : cd(v[i], 0.0);
    return w;
  };
  p.u = reals(h.u);
  p.delta = reals(h.delta);
  if (c.has_z) p.z = reals(h.z);
  p.A = weights(h.A);
  p.B = weights(h.B);
  p.C = weights(h.C);
  if (c.has_D) p.Dv = reals(h.Dv);
  if (c.has_delta_bias) p.bias = reals(h.bias);
  if (c.has_h0) p.h0 = weights(h.h0);
  const RefFwd f = ref_forward(p);
  const RefBwd g = ref_backward(p, reals(h.dout));
  h.out.resize(f.y.size());
  for (size_t i = 0; i < f.y.size(); ++i) h.out[i] = round_to(c.itype, static_cast<float>(f.y[i]));
  const std::vector<double> x = ref_x_values(f, p);
  h.x.assign(x.begin(), x.end());
  r.du = g.du;
  r.ddelta = g.ddelta;
  r.dA = flatten(g.dA, c.complex);
  r.dB = flatten(g.dB, c.complex);
  r.dC = flatten(g.dC, c.complex);
  r.dD = g.dD;
  r.dbias = g.dbias;
  r.dh0 = c.has_h0 ? flatten(g.dh0, c.complex) : std::vector<double>();
  r.dz.assign(c.has_z ? h.out.size() : 0, 0.0);
  r.outz.assign(r.dz.size(), 0.0);
  for (size_t i = 0; i < r.dz.size(); ++i) {
    const double zt = h.z[i], o = h.out[i], sg = 1.0 / (1.0 + std::exp(-zt));
    r.dz[i] = h.dout[i] * o * sg * (1.0 + zt * (1.0 - sg));
    r.outz[i] = o * zt * sg;
  }
  r.rc = std::make_shared<ReducedCond>(c, std::move(p), reals(h.dout));
}

void generate(const Cfg& c, Host& h) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int cw = c.complex ? 2 : 1;
  const int64_t BDL = c.batch * c.dim * c.seqlen;
  auto fill = [&](std::vector<float>& v, int64_t n, int32_t dt, auto gen) {
    v.resize(static_cast<size_t>(n));
    for (auto& e : v) e = round_to(dt, gen());
  };
  const int32_t it = c.itype, f32 = SELSCAN_DTYPE_FLOAT32;
  fill(h.u, BDL, it, [&] { return nd(rng); });
  fill(h.delta, BDL, it, [&] { return 0.5f * ud(rng); });
  fill(h.dout, BDL, it, [&] { return nd(rng); });
  if (c.has_z) fill(h.z, BDL, it, [&] { return nd(rng); });
  h.A.resize(c.dim * c.dstate * cw);
  for (int64_t i = 0; i < c.dim * c.dstate; ++i) {
    h.A[i * cw] = -0.5f * ud(rng);
    if (c.complex) h.A[i * cw + 1] = 2.f * ud(rng) - 1.f;
  }
  const int64_t var_n = c.batch * c.groups * c.dstate * c.seqlen * cw, const_n = c.dim * c.dstate * cw;
  fill(h.B, c.var_B ? var_n : const_n, c.var_B ? it : f32, [&] { return nd(rng); });
  fill(h.C, c.var_C ? var_n : const_n, c.var_C ? it : f32, [&] { return nd(rng); });
  if (c.has_D) fill(h.Dv, c.dim, f32, [&] { return nd(rng); });
  if (c.has_delta_bias) fill(h.bias, c.dim, f32, [&] { return 0.5f * ud(rng); });
  if (c.has_h0) fill(h.h0, c.batch * c.dim * c.dstate * cw, f32, [&] { return nd(rng); });
}

// ---------------------------------------------------------------------------------------------- one call
struct Call {
  Cfg c;
  Tensor u, delta, z, dout, A, B, C, Dv, bias, h0, out, x;
  Tensor du, ddelta, dA, dB, dC, dD, dz, dbias, dh0, outz;
  std::vector<Tensor*> outputs() {
    std::vector<Tensor*> o{&du, &ddelta, &dA, &dB, &dC};
    if (c.has_D) o.push_back(&dD);
    if (c.has_z) o.push_back(&dz);
    if (c.has_delta_bias) o.push_back(&dbias);
    if (c.has_h0) o.push_back(&dh0);
    if (c.has_z && c.recompute_out_z) o.push_back(&outz);
    return o;
  }
};

// Builds the tensors of `c` in its layout and uploads the host values.
void build(Call& k, const Host& h) {
  const Cfg& c = k.c;
  const int64_t Bt = c.batch, D = c.dim, L = c.seqlen, N = c.dstate, G = c.groups, nc = nchunks(L);
  const int32_t it = c.itype, wt = c.complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const int64_t Lbc = c.complex ? 2 * L : L;
  const bool odd = c.layout == 2;
  // (Bt, D, L): layout 1 gives inputs mamba_inner_fn's d-major strides and outputs a 2x batch stride.
  auto bdl_in = [&](Tensor& t, const std::vector<float>& v, bool misalign) {
    if (c.layout == 1) make_tensor(t, it, {Bt, D, L}, {L, Bt * L, 1});
    else make_tensor(t, it, {Bt, D, L}, {}, misalign ? 1 : 0);
    upload(t, v);
  };
  auto bdl_out = [&](Tensor& t, bool misalign) {
    if (c.layout == 1) make_tensor(t, it, {Bt, D, L}, {2 * D * L, L, 1});
    else make_tensor(t, it, {Bt, D, L}, {}, misalign ? 1 : 0);
  };
  bdl_in(k.u, h.u, odd);
  bdl_in(k.delta, h.delta, false);
  bdl_in(k.dout, h.dout, odd);
  if (c.has_z) {
    bdl_in(k.z, h.z, false);
    bdl_in(k.out, h.out, odd);
  }
  auto dn = [&](Tensor& t, const std::vector<float>* v) {
    if (c.layout == 1) make_tensor(t, wt, {D, N}, {1, D});
    else make_tensor(t, wt, {D, N}, {});
    if (v) upload(t, *v);
  };
  auto var = [&](Tensor& t, const std::vector<float>* v) {
    if (c.layout == 1) make_tensor(t, it, {Bt, G, N, Lbc}, {G * N * (Lbc + 3), N * (Lbc + 3), Lbc + 3, 1});
    else make_tensor(t, it, {Bt, G, N, Lbc}, {}, odd ? 1 : 0);
    if (v) upload(t, *v);
  };
  dn(k.A, &h.A);
  if (c.var_B) var(k.B, &h.B);
  else dn(k.B, &h.B);
  if (c.var_C) var(k.C, &h.C);
  else dn(k.C, &h.C);
  auto vecD = [&](Tensor& t, const std::vector<float>* v) {
    make_tensor(t, SELSCAN_DTYPE_FLOAT32, {D}, {c.layout == 1 ? 2 : 1});
    if (v) upload(t, *v);
  };
  if (c.has_D) vecD(k.Dv, &h.Dv);
  if (c.has_delta_bias) vecD(k.bias, &h.bias);
  auto bdn = [&](Tensor& t, const std::vector<float>* v) {
    if (c.layout == 1) make_tensor(t, wt, {Bt, D, N}, {1, Bt, Bt * D});
    else make_tensor(t, wt, {Bt, D, N}, {});
    if (v) upload(t, *v);
  };
  if (c.has_h0) bdn(k.h0, &h.h0);
  make_tensor(k.x, wt, {Bt, D, nc, 2 * N}, {});
  upload(k.x, h.x);
  bdl_out(k.du, odd);
  bdl_out(k.ddelta, false);
  dn(k.dA, nullptr);
  if (c.var_B) var(k.dB, nullptr);
  else dn(k.dB, nullptr);
  if (c.var_C) var(k.dC, nullptr);
  else dn(k.dC, nullptr);
  if (c.has_D) vecD(k.dD, nullptr);
  if (c.has_delta_bias) vecD(k.dbias, nullptr);
  if (c.has_h0) bdn(k.dh0, nullptr);
  if (c.has_z) {
    bdl_out(k.dz, false);
    if (c.recompute_out_z) bdl_out(k.outz, false);
  }
}

selscan_bwd_args_t args_of(Call& k, bool dev) {
  const Cfg& c = k.c;
  selscan_bwd_args_t a{};
  a.struct_size = sizeof(a);
  auto opt = [&](Tensor& t, bool on) {
    selscan_tensor_t d{};
    if (on) d = t.desc(dev);
    return d;
  };
  a.u = k.u.desc(dev);
  a.delta = k.delta.desc(dev);
  a.A = k.A.desc(dev);
  a.B = k.B.desc(dev);
  a.C = k.C.desc(dev);
  a.D = opt(k.Dv, c.has_D);
  a.z = opt(k.z, c.has_z);
  a.delta_bias = opt(k.bias, c.has_delta_bias);
  a.h0 = opt(k.h0, c.has_h0);
  a.delta_softplus = c.softplus;
  a.deterministic = c.deterministic;
  a.dout = k.dout.desc(dev);
  a.x = k.x.desc(dev);
  a.out = opt(k.out, c.has_z);
  a.du = k.du.desc(dev);
  a.ddelta = k.ddelta.desc(dev);
  a.dA = k.dA.desc(dev);
  a.dB = k.dB.desc(dev);
  a.dC = k.dC.desc(dev);
  a.dD = opt(k.dD, c.has_D);
  a.dz = opt(k.dz, c.has_z);
  a.ddelta_bias = opt(k.dbias, c.has_delta_bias);
  a.dh0 = opt(k.dh0, c.has_h0);
  a.out_z = opt(k.outz, c.has_z && c.recompute_out_z);
  return a;
}

// Runs the GPU backward once (outputs poisoned first); returns false (with a test failure) on error.
bool run_gpu(Call& k, cudaStream_t st = nullptr) {
  for (Tensor* t : k.outputs()) poison(*t);
  selscan_bwd_args_t a = args_of(k, true);
  selscan_exec_t e = SELSCAN_EXEC_INIT;
  e.device_kind = SELSCAN_DEVICE_CUDA;
  e.stream = st;
  size_t ws_bytes = 0;
  selscan_status_t s = selscan_bwd_workspace_size(&a, &e, &ws_bytes);
  EXPECT_EQ(s, SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  if (s != SELSCAN_STATUS_SUCCESS) return false;
  void* ws = nullptr;
  if (ws_bytes > 0) EXPECT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  e.workspace = ws;
  e.workspace_bytes = ws_bytes;
  s = selscan_bwd(&a, &e);
  EXPECT_EQ(s, SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const cudaError_t ce = cudaDeviceSynchronize();
  EXPECT_EQ(ce, cudaSuccess) << cudaGetErrorString(ce);
  if (ws) cudaFree(ws);
  return s == SELSCAN_STATUS_SUCCESS && ce == cudaSuccess;
}

// The library's CPU path on the host mirrors (outputs poisoned first).
bool run_cpu(Call& k) {
  for (Tensor* t : k.outputs()) std::fill(t->host.begin(), t->host.end(), 0xFF);
  selscan_bwd_args_t a = args_of(k, false);
  selscan_exec_t e = SELSCAN_EXEC_INIT;
  const selscan_status_t s = selscan_bwd(&a, &e);
  EXPECT_EQ(s, SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  return s == SELSCAN_STATUS_SUCCESS;
}

// |got - ref| <= atol + rtol |ref| elementwise, or bound[i] where that is larger; NaN (an unwritten poisoned element)
// always fails.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                  double rtol, double atol, const std::vector<double>* bound = nullptr) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  if (bound) {
    ASSERT_EQ(bound->size(), ref.size()) << what;
  }
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double lim = limit_at(ref, Tol{rtol, atol}, bound, i);
    const double ratio = std::isnan(got[i]) ? 1e30 : err / lim;
    if (ratio > worst) worst = ratio;
    if (!(ratio <= 1.0)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; first at " << first
                     << " got " << got[first] << " want " << ref[first] << "; worst err/tol " << worst;
}

// Tolerances of upstream's tests (golden/README.md); weight tolerances are raised to the output's with z. The
// reduced gradients (sums over batch and time, variable dB/dC over a group's channels) may also differ by k u cond
// where that is larger (docs/numerics.md, "Conditioning-aware tolerance of the reduced gradients"), as for slowly
// decaying states whose per-batch sums cancel. The scale is computed only for elements outside upstream's
// tolerance, and not for a golden case (its reference is upstream's stored gradients).
void check_all(Call& k, const Ref& r, double scale = 1.0, bool on_device = true) {
  const Cfg& c = k.c;
  const Tol o = tol_out(c.itype);
  auto weight = [&](double rt, double at) {
    return c.has_z ? Tol{std::max(rt, o.rtol), std::max(at, o.atol)} : Tol{rt, at};
  };
  auto got = [&](Tensor& t) { return read_values(t, on_device ? device_bytes(t) : t.host); };
  const std::string tag = std::string(on_device ? " gpu" : " cpu") + " [" + c.str() + "]";
  expect_close("du" + tag, got(k.du), r.du, 2 * o.rtol * scale, 2 * o.atol * scale);
  expect_close("ddelta" + tag, got(k.ddelta), r.ddelta, 5 * o.rtol * scale, 10 * o.atol * scale);
  const Tol tA = weight(1e-3, 5e-3);
  const auto reduced = [&](const char* name, Tensor& t, const std::vector<double>& ref, Tol tol) {
    const std::vector<float> g = got(t);
    const double rt = tol.rtol * scale, at = tol.atol * scale;
    std::vector<double> bound(r.rc ? g.size() : 0, 0.0);
    for (size_t i = 0; i < bound.size() && i < ref.size(); ++i)
      if (!(std::fabs(g[i] - ref[i]) <= limit_at(ref, Tol{rt, at}, nullptr, i)))
        bound[i] = scale * kCondK * kU32 * r.rc->at(name, i);
    expect_close(name + tag, g, ref, rt, at, r.rc ? &bound : nullptr);
  };
  reduced("dA", k.dA, r.dA, tA);
  // Variable dB/dC sum D/G channels that cancel; upstream's test had at most 4 per group.
  const double vs = std::max(1.0, std::sqrt(static_cast<double>(c.dim / c.groups) / 4.0));
  const Tol tB = c.var_B ? Tol{o.rtol * vs, o.atol * vs} : weight(1e-3, 1e-3);
  reduced("dB", k.dB, r.dB, tB);
  const Tol tC = c.var_C ? Tol{o.rtol * vs, o.atol * vs} : weight(1e-3, 1e-3);
  reduced("dC", k.dC, r.dC, tC);
  const Tol tw = weight(1e-3, 1e-3);
  if (c.has_D) reduced("dD", k.dD, r.dD, tw);
  if (c.has_delta_bias) reduced("ddelta_bias", k.dbias, r.dbias, tw);
  if (c.has_z) expect_close("dz" + tag, got(k.dz), r.dz, tw.rtol * scale, tw.atol * scale);
  if (c.has_z && c.recompute_out_z) expect_close("out_z" + tag, got(k.outz), r.outz, o.rtol, o.atol);
  if (c.has_h0) expect_close("dh0" + tag, got(k.dh0), r.dh0, tA.rtol * scale, tA.atol * scale);
}

// Sums over long sequences and many states grow the float32 rounding of the kernels (and of upstream's)
// beyond tolerances chosen for L <= 4096, N = 8; scale them by the reduction length.
// Complex weights double the terms of every sum (2 Re) and add __sincosf's phase error (fast math, as
// upstream); upstream never tested complex gradients, so they get four times the tolerance.
double tol_scale(const Cfg& c) {
  const double terms = static_cast<double>(c.seqlen) * c.dstate / (4096.0 * 16.0);
  return std::max(1.0, std::sqrt(terms)) * (c.complex ? 4.0 : 1.0);
}

void run_case(const Cfg& c) {
  SCOPED_TRACE(c.str());
  Host h;
  generate(c, h);
  Ref r;
  reference(c, h, r);
  Call k;
  k.c = c;
  build(k, h);
  if (::testing::Test::HasFatalFailure()) return;
  if (!run_gpu(k)) return;
  check_all(k, r, tol_scale(c));
  // The CPU path on the same inputs (host mirrors) against the same float64 oracle.
  if (run_cpu(k)) check_all(k, r, tol_scale(c), false);
}

// ---------------------------------------------------------------------------------------------- the matrix
class BwdGpu : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_GPU(); }
};

TEST_F(BwdGpu, SmallFp32AllFlags) {
  Cfg c;
  run_case(c);
}

TEST_F(BwdGpu, SmallFlagsOff) {
  Cfg c;
  c.has_D = c.has_z = c.has_delta_bias = c.softplus = false;
  c.seqlen = 37;
  run_case(c);
}

TEST_F(BwdGpu, OddLengthsAndChunks) {
  for (int64_t L : {1, 31, 255, 257, 2047, 2048, 2049, 4500}) {
    Cfg c;
    c.seqlen = L;
    c.dim = 6;
    c.seed = static_cast<uint32_t>(L);
    run_case(c);
  }
}

TEST_F(BwdGpu, ConstantAndVariableBC) {
  for (int vb = 0; vb < 2; ++vb)
    for (int vc = 0; vc < 2; ++vc)
      for (int h0 = 0; h0 < 2; ++h0) {
        Cfg c;
        c.var_B = vb;
        c.var_C = vc;
        c.has_h0 = h0;
        c.seqlen = 2500;
        c.dim = 5;
        c.seed = 100 + vb * 4 + vc * 2 + h0;
        run_case(c);
      }
}

TEST_F(BwdGpu, Groups) {
  for (int64_t G : {1, 2, 4}) {
    Cfg c;
    c.groups = G;
    c.dim = 24;  // 6 channels per group with G = 4: blocks with idle warps
    c.seqlen = 700;
    c.seed = 7 + G;
    run_case(c);
  }
}

TEST_F(BwdGpu, Complex) {
  for (int vb = 0; vb < 2; ++vb)
    for (int vc = 0; vc < 2; ++vc) {
      Cfg c;
      c.complex = true;
      c.var_B = vb;
      c.var_C = vc;
      c.has_h0 = vb == vc;
      c.groups = (vb && vc) ? 2 : 1;
      c.dim = 8;
      c.seqlen = 2300;
      c.seed = 200 + vb * 2 + vc;
      run_case(c);
    }
}

TEST_F(BwdGpu, HalfTypes) {
  for (int32_t it : {SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (int cp = 0; cp < 2; ++cp) {
      Cfg c;
      c.itype = it;
      c.complex = cp;
      c.dim = 8;
      c.seqlen = 2100;
      c.groups = 2;
      c.seed = 300 + it * 2 + cp;
      run_case(c);
    }
}

TEST_F(BwdGpu, Dstates) {
  for (int64_t N : {1, 16, 64, 256}) {
    Cfg c;
    c.dstate = N;
    c.dim = 4;
    c.batch = 1;
    c.seqlen = N == 256 ? 300 : 1000;
    c.seed = 400 + static_cast<uint32_t>(N);
    run_case(c);
    c.complex = true;
    c.var_B = false;
    run_case(c);
  }
}

// Shapes for the thread-states backward (run with SELSCAN_BWD_KERNEL=ts by the gpu.bwd_ts ctest entries; the
// default choice sends these small grids to the warp-scan kernel): several 32-channel tiles with a partial last
// one, groups that split a tile, every threads-per-channel count (dstate 3, 8, 13, 16), three chunks with a
// partial last tile, h0 with constant B, and the 16-bit itypes.
TEST_F(BwdGpu, ThreadStatesShapes) {
  const int64_t Ns[] = {3, 8, 13, 16};
  for (int i = 0; i < 4; ++i) {
    Cfg c;
    c.dstate = Ns[i];
    c.dim = 70;
    c.groups = i == 1 ? 2 : 1;
    c.batch = 3;
    c.seqlen = i == 2 ? 4100 : 600 + 7 * i;
    c.var_B = i != 3;
    c.var_C = i != 0;
    c.has_h0 = i == 3;
    c.itype = i == 1 ? SELSCAN_DTYPE_BFLOAT16 : i == 2 ? SELSCAN_DTYPE_FLOAT16 : SELSCAN_DTYPE_FLOAT32;
    c.seed = 900 + static_cast<uint32_t>(i);
    run_case(c);
  }
}

// A call the default plan gives to the thread-states backward (at least 1024 warps of 4-thread channels, on the GPUs
// with large shared memory: src/cuda/select.cpp), bf16 with variable B and C, so its fixed-pitch B/C tiles run at the
// default grid, unforced. L ends inside a 16-step tile.
TEST_F(BwdGpu, DefaultPlanThreadStatesBf16) {
  Cfg c(case_spec(2, 4200, 100, 16, SELSCAN_DTYPE_BFLOAT16));
  c.seed = 950;
  run_case(c);
}

// Calls whose rows start on 16 bytes (L a multiple of 8 for 16-bit rows, of 4 for fp32) take the copy-engine
// instance of the thread-states backward where the device runs its sm_90 code (src/cuda/select.cpp,
// bwd_copy_engine): a ragged last tile (zeros past L come from the engine), a last channel tile past D (4200 = 131 x
// 32 + 8), channel tiles that run into the next group (groups of 2100), with and without z, variable and constant B,
// B and C as (Bt, N, L) (no group stride).
TEST_F(BwdGpu, DefaultPlanThreadStatesAlignedRows) {
  uint32_t seed = 960;
  for (int32_t it : {SELSCAN_DTYPE_BFLOAT16, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_FLOAT32}) {
    for (int variant = 0; variant < 4; ++variant) {
      Cfg c(case_spec(2, 4200, 296, 16, it, variant == 2 ? 2 : 1));
      c.has_z = variant != 1;
      c.var_B = variant != 1;
      c.bc_3d = variant == 3;
      c.seed = seed++;
      run_case(c);
    }
  }
}

TEST_F(BwdGpu, UnusualStrides) {
  for (int vb = 0; vb < 2; ++vb) {
    Cfg c;
    c.layout = 1;
    c.var_B = vb;
    c.has_h0 = true;
    c.dim = 6;
    c.seqlen = 300;
    c.seed = 500 + vb;
    run_case(c);
    c.itype = SELSCAN_DTYPE_BFLOAT16;
    c.complex = true;
    run_case(c);
  }
}

TEST_F(BwdGpu, MisalignedPointers) {
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16}) {
    Cfg c;
    c.layout = 2;
    c.itype = it;
    c.dim = 6;
    c.seqlen = 600;
    c.seed = 600 + it;
    run_case(c);
  }
}

TEST_F(BwdGpu, DimBeyondGridLimit) {
  Cfg c(case_spec(1, 70000, 9, 2, SELSCAN_DTYPE_FLOAT32));
  c.var_B = false;
  c.var_C = false;
  c.has_z = false;
  run_case(c);
}

// The deterministic mode gives bitwise-identical outputs run to run (and agrees with the reference).
TEST_F(BwdGpu, DeterministicIsBitwiseReproducible) {
  for (int cp = 0; cp < 2; ++cp) {
    Cfg c;
    c.deterministic = true;
    c.complex = cp;
    c.batch = 2;
    c.dim = 64;
    c.groups = 2;
    c.seqlen = 2600;
    c.seed = 700 + cp;
    SCOPED_TRACE(c.str());
    Host h;
    generate(c, h);
    Ref r;
    reference(c, h, r);
    Call k;
    k.c = c;
    build(k, h);
    ASSERT_TRUE(run_gpu(k));
    check_all(k, r, tol_scale(c));
    std::vector<std::vector<uint8_t>> first;
    for (Tensor* t : k.outputs()) first.push_back(device_bytes(*t));
    ASSERT_TRUE(run_gpu(k));
    const auto outs = k.outputs();
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_EQ(0, std::memcmp(first[i].data(), device_bytes(*outs[i]).data(), first[i].size()))
          << "output " << i << " differs between two deterministic runs";
  }
}

// ---------------------------------------------------------------------------------------------- golden
class BwdGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(BwdGolden, MatchesUpstream) {
  REQUIRE_GPU();
  if (!golden_exists(GetParam())) GTEST_SKIP() << "golden case not found: " << golden_dir() << "/" << GetParam();
  GoldenCase gc;
  const std::string err = load_golden(GetParam(), &gc);
  ASSERT_TRUE(err.empty()) << err;
  Cfg c(gc.spec);
  if (!c.var_B && !c.var_C) c.groups = 1;
  SCOPED_TRACE(c.str());
  Host h;
  auto rd = [&](const char* name, std::vector<float>& v) {
    const auto it = gc.files.find(name);
    ASSERT_TRUE(it != gc.files.end()) << name;
    v = it->second.data;
  };
  rd("u", h.u);
  rd("delta", h.delta);
  rd("dout", h.dout);
  rd("A", h.A);
  rd("B", h.B);
  rd("C", h.C);
  if (c.has_z) rd("z", h.z);
  if (c.has_D) rd("D", h.Dv);
  if (c.has_delta_bias) rd("delta_bias", h.bias);
  // The backward's saved inputs (pre-gate out, chunk states x) come from the float64 forward.
  Ref mine;
  reference(c, h, mine);
  Call k;
  k.c = c;
  build(k, h);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(run_gpu(k));
  Ref g;
  g.du = golden_values(gc, "du");
  g.ddelta = golden_values(gc, "ddelta");
  g.dA = golden_values(gc, "dA");
  g.dB = golden_values(gc, "dB");
  g.dC = golden_values(gc, "dC");
  if (c.has_D) g.dD = golden_values(gc, "dD");
  if (c.has_delta_bias) g.dbias = golden_values(gc, "ddelta_bias");
  if (c.has_z) {
    g.dz = golden_values(gc, "dz");
    g.outz = mine.outz;
  }
  check_all(k, g);
}

INSTANTIATE_TEST_SUITE_P(Upstream, BwdGolden,
                         ::testing::Values("s01_fp32_basic", "s02_fp32_full", "s03_bf16_full", "s04_fp16_groups2",
                                           "s05_fp32_constBC", "s06_bf16_long_2chunks", "s07_fp32_dstate64",
                                           "s08_fp32_complex"));

}  // namespace
}  // namespace selscan_test
