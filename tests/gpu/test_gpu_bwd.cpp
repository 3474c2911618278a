// GPU backward (selscan_bwd on SELSCAN_DEVICE_CUDA) against an independent float64 recurrence written here (the
// library's CPU path is checked against it on the same inputs) and upstream's golden vectors. Every output is
// poisoned (NaN bytes) before each run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_gate.h"
#include "selscan/selscan.h"

namespace {

using cd = std::complex<double>;


#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// ---------------------------------------------------------------------------------------------- dtype bytes
int64_t esize(int32_t dt) {
  switch (dt) {
    case SELSCAN_DTYPE_FLOAT16:
    case SELSCAN_DTYPE_BFLOAT16: return 2;
    case SELSCAN_DTYPE_COMPLEX64: return 8;
    default: return 4;
  }
}
int cw_of(int32_t dt) { return dt == SELSCAN_DTYPE_COMPLEX64 ? 2 : 1; }

// Round a float to the itype and back (inputs are generated exactly representable).
float round_to(int32_t dt, float v) {
  if (dt == SELSCAN_DTYPE_FLOAT16) return __half2float(__float2half_rn(v));
  if (dt == SELSCAN_DTYPE_BFLOAT16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}
void encode(int32_t dt, float v, uint8_t* dst) {
  if (dt == SELSCAN_DTYPE_FLOAT16) {
    const __half h = __float2half_rn(v);
    std::memcpy(dst, &h, 2);
  } else if (dt == SELSCAN_DTYPE_BFLOAT16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    std::memcpy(dst, &h, 2);
  } else {
    std::memcpy(dst, &v, 4);
  }
}
float decode(int32_t dt, const uint8_t* src) {
  if (dt == SELSCAN_DTYPE_FLOAT16) {
    __half h;
    std::memcpy(&h, src, 2);
    return __half2float(h);
  }
  if (dt == SELSCAN_DTYPE_BFLOAT16) {
    __nv_bfloat16 h;
    std::memcpy(&h, src, 2);
    return __bfloat162float(h);
  }
  float f;
  std::memcpy(&f, src, 4);
  return f;
}

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
      encode(t.dtype, v[i], dst);
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
    else v[i] = decode(t.dtype, src);
  }
  return v;
}
std::vector<uint8_t> device_bytes(const Tensor& t) {
  std::vector<uint8_t> raw(t.bytes);
  EXPECT_EQ(cudaMemcpy(raw.data(), t.dev, t.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return raw;
}

// ---------------------------------------------------------------------------------------------- problem
struct Cfg {
  int64_t Bt = 2, D = 4, L = 64, N = 8, G = 1;
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  bool cplx = false;
  bool varB = true, varC = true, hasD = true, hasZ = true, bias = true, softplus = true;
  bool h0 = false, outz = true, det = false;
  int layout = 0;  // 0 contiguous; 1 unusual strides (d-major inputs, padded outputs/rows); 2 misaligned bases
  uint32_t seed = 1;
  std::string str() const {
    std::ostringstream o;
    o << "Bt=" << Bt << " D=" << D << " L=" << L << " N=" << N << " G=" << G << " itype=" << itype
      << " cplx=" << cplx << " varB=" << varB << " varC=" << varC << " D?=" << hasD << " z?=" << hasZ
      << " bias?=" << bias << " softplus=" << softplus << " h0=" << h0 << " det=" << det << " layout=" << layout;
    return o.str();
  }
};

// Inputs and the forward's saved tensors in logical order (floats exactly representable in their dtype).
struct Host {
  std::vector<float> u, delta, z, dout, A, B, C, Dv, bias, h0, out, x;
};

struct Ref {  // float64 gradients, logical order (complex as pairs)
  std::vector<double> du, ddelta, dz, outz, dA, dB, dC, dD, dbias, dh0;
};

int64_t nchunks(int64_t L) { return (L + 2047) / 2048; }

// The forward (for `out` and `x`) and the backward, sequentially in float64 (docs/numerics.md).
void reference(const Cfg& c, Host& h, Ref& r) {
  const int64_t Bt = c.Bt, D = c.D, L = c.L, N = c.N, G = c.G, nc = nchunks(L), cpg = D / G;
  const int cw = c.cplx ? 2 : 1;
  const double two = c.cplx ? 2.0 : 1.0;
  const bool fold = !c.varB && !c.h0;
  auto W = [&](const std::vector<float>& v, int64_t i) {
    return c.cplx ? cd(v[2 * i], v[2 * i + 1]) : cd(v[i], 0.0);
  };
  auto addW = [&](std::vector<double>& v, int64_t i, cd x) {
    if (c.cplx) {
      v[2 * i] += x.real();
      v[2 * i + 1] += x.imag();
    } else {
      v[i] += x.real();
    }
  };
  h.out.assign(Bt * D * L, 0.f);
  h.x.assign(Bt * D * nc * 2 * N * cw, 0.f);
  r.du.assign(Bt * D * L, 0);
  r.ddelta.assign(Bt * D * L, 0);
  r.dz.assign(c.hasZ ? Bt * D * L : 0, 0);
  r.outz.assign(c.hasZ ? Bt * D * L : 0, 0);
  r.dA.assign(D * N * cw, 0);
  r.dB.assign(c.varB ? Bt * G * N * L * cw : D * N * cw, 0);
  r.dC.assign(c.varC ? Bt * G * N * L * cw : D * N * cw, 0);
  r.dD.assign(D, 0);
  r.dbias.assign(D, 0);
  r.dh0.assign(c.h0 ? Bt * D * N * cw : 0, 0);
  std::vector<double> dl(L), raw(L), y(L), dout(L);
  std::vector<cd> s(L), ab(L);
  for (int64_t b = 0; b < Bt; ++b)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t g = d / cpg, row = (b * D + d) * L;
      const double bias = c.bias ? h.bias[d] : 0.0, Dd = c.hasD ? h.Dv[d] : 0.0;
      for (int64_t t = 0; t < L; ++t) {
        raw[t] = h.delta[row + t] + bias;
        dl[t] = (c.softplus && raw[t] <= 20.0) ? std::log1p(std::exp(raw[t])) : raw[t];
        y[t] = Dd * h.u[row + t];
      }
      auto Bfac = [&](int64_t n, int64_t t) {  // the B factor inside b̄
        if (c.varB) return W(h.B, ((b * G + g) * N + n) * L + t);
        return fold ? cd(1.0) : W(h.B, d * N + n);
      };
      auto coef = [&](int64_t n, int64_t t) {
        const cd cc = c.varC ? W(h.C, ((b * G + g) * N + n) * L + t) : W(h.C, d * N + n);
        return fold ? cc * W(h.B, d * N + n) : cc;
      };
      auto scan = [&](int64_t n) {  // s and ā of state n
        const cd A = W(h.A, d * N + n);
        cd st = c.h0 ? W(h.h0, (b * D + d) * N + n) : cd(0.0);
        for (int64_t t = 0; t < L; ++t) {
          ab[t] = std::exp(dl[t] * A);
          st = ab[t] * st + Bfac(n, t) * (dl[t] * h.u[row + t]);
          s[t] = st;
        }
      };
      // forward
      for (int64_t n = 0; n < N; ++n) {
        scan(n);
        cd P = 1.0;
        for (int64_t t = 0; t < L; ++t) {
          P *= ab[t];
          y[t] += two * (s[t] * coef(n, t)).real();
          if (t % 2048 == 2047 || t == L - 1) {
            const int64_t xi = (((b * D + d) * nc + t / 2048) * 2 * N + 2 * n) * cw;
            h.x[xi] = static_cast<float>(P.real());
            h.x[xi + cw] = static_cast<float>(c.cplx ? s[t].real() : s[t].real());
            if (c.cplx) {
              h.x[xi + 1] = static_cast<float>(P.imag());
              h.x[xi + 3] = static_cast<float>(s[t].imag());
            }
          }
        }
      }
      for (int64_t t = 0; t < L; ++t) h.out[row + t] = round_to(c.itype, static_cast<float>(y[t]));
      // backward
      for (int64_t t = 0; t < L; ++t) {
        double g0 = h.dout[row + t];
        if (c.hasZ) {
          const double zt = h.z[row + t], o = h.out[row + t], sg = 1.0 / (1.0 + std::exp(-zt));
          r.dz[row + t] = g0 * o * sg * (1.0 + zt * (1.0 - sg));
          r.outz[row + t] = o * zt * sg;
          g0 *= zt * sg;
        }
        dout[t] = g0;
        r.du[row + t] = Dd * g0;
        r.dD[d] += g0 * h.u[row + t];
      }
      for (int64_t n = 0; n < N; ++n) {
        scan(n);
        const cd A = W(h.A, d * N + n);
        cd gcar = 0.0;
        for (int64_t t = L - 1; t >= 0; --t) {
          const double g2 = two * dout[t];
          const cd dh = g2 * std::conj(coef(n, t)) + gcar;
          const cd sprev = t > 0 ? s[t - 1] : (c.h0 ? W(h.h0, (b * D + d) * N + n) : cd(0.0));
          const cd at = ab[t] * sprev;
          const cd Bk = Bfac(n, t);
          const double gu = (dh * std::conj(Bk)).real();
          const double uu = h.u[row + t];
          r.du[row + t] += gu * dl[t];
          r.ddelta[row + t] += gu * uu + (dh * std::conj(A * at)).real();
          addW(r.dA, d * N + n, dl[t] * dh * std::conj(at));
          const int64_t vi = ((b * G + g) * N + n) * L + t;
          if (c.varB) addW(r.dB, vi, dh * (dl[t] * uu));
          else if (!fold) addW(r.dB, d * N + n, dh * (dl[t] * uu));
          const cd cv = c.varC ? W(h.C, vi) : W(h.C, d * N + n);
          if (fold) {
            addW(r.dB, d * N + n, g2 * std::conj(s[t] * cv));
            if (c.varC) addW(r.dC, vi, g2 * std::conj(s[t] * W(h.B, d * N + n)));
            else addW(r.dC, d * N + n, g2 * std::conj(s[t] * W(h.B, d * N + n)));
          } else {
            if (c.varC) addW(r.dC, vi, g2 * std::conj(s[t]));
            else addW(r.dC, d * N + n, g2 * std::conj(s[t]));
          }
          gcar = std::conj(ab[t]) * dh;
        }
        if (c.h0) {
          const int64_t i = (b * D + d) * N + n;
          if (c.cplx) {
            r.dh0[2 * i] = gcar.real();
            r.dh0[2 * i + 1] = gcar.imag();
          } else {
            r.dh0[i] = gcar.real();
          }
        }
      }
      for (int64_t t = 0; t < L; ++t) {
        if (c.softplus && raw[t] <= 20.0) r.ddelta[row + t] *= 1.0 / (1.0 + std::exp(-raw[t]));
        r.dbias[d] += r.ddelta[row + t];
      }
    }
}

void generate(const Cfg& c, Host& h) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int cw = c.cplx ? 2 : 1;
  const int64_t BDL = c.Bt * c.D * c.L;
  auto fill = [&](std::vector<float>& v, int64_t n, int32_t dt, auto gen) {
    v.resize(static_cast<size_t>(n));
    for (auto& e : v) e = round_to(dt, gen());
  };
  const int32_t it = c.itype, f32 = SELSCAN_DTYPE_FLOAT32;
  fill(h.u, BDL, it, [&] { return nd(rng); });
  fill(h.delta, BDL, it, [&] { return 0.5f * ud(rng); });
  fill(h.dout, BDL, it, [&] { return nd(rng); });
  if (c.hasZ) fill(h.z, BDL, it, [&] { return nd(rng); });
  h.A.resize(c.D * c.N * cw);
  for (int64_t i = 0; i < c.D * c.N; ++i) {
    h.A[i * cw] = -0.5f * ud(rng);
    if (c.cplx) h.A[i * cw + 1] = 2.f * ud(rng) - 1.f;
  }
  fill(h.B, c.varB ? c.Bt * c.G * c.N * c.L * cw : c.D * c.N * cw, c.varB ? it : f32, [&] { return nd(rng); });
  fill(h.C, c.varC ? c.Bt * c.G * c.N * c.L * cw : c.D * c.N * cw, c.varC ? it : f32, [&] { return nd(rng); });
  if (c.hasD) fill(h.Dv, c.D, f32, [&] { return nd(rng); });
  if (c.bias) fill(h.bias, c.D, f32, [&] { return 0.5f * ud(rng); });
  if (c.h0) fill(h.h0, c.Bt * c.D * c.N * cw, f32, [&] { return nd(rng); });
}

// ---------------------------------------------------------------------------------------------- one call
struct Call {
  Cfg c;
  Tensor u, delta, z, dout, A, B, C, Dv, bias, h0, out, x;
  Tensor du, ddelta, dA, dB, dC, dD, dz, dbias, dh0, outz;
  std::vector<Tensor*> outputs() {
    std::vector<Tensor*> o{&du, &ddelta, &dA, &dB, &dC};
    if (c.hasD) o.push_back(&dD);
    if (c.hasZ) o.push_back(&dz);
    if (c.bias) o.push_back(&dbias);
    if (c.h0) o.push_back(&dh0);
    if (c.hasZ && c.outz) o.push_back(&outz);
    return o;
  }
};

// Builds the tensors of `c` in its layout and uploads the host values.
void build(Call& k, const Host& h) {
  const Cfg& c = k.c;
  const int64_t Bt = c.Bt, D = c.D, L = c.L, N = c.N, G = c.G, nc = nchunks(L);
  const int32_t it = c.itype, wt = c.cplx ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const int64_t Lbc = c.cplx ? 2 * L : L;
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
  if (c.hasZ) {
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
  if (c.varB) var(k.B, &h.B);
  else dn(k.B, &h.B);
  if (c.varC) var(k.C, &h.C);
  else dn(k.C, &h.C);
  auto vecD = [&](Tensor& t, const std::vector<float>* v) {
    make_tensor(t, SELSCAN_DTYPE_FLOAT32, {D}, {c.layout == 1 ? 2 : 1});
    if (v) upload(t, *v);
  };
  if (c.hasD) vecD(k.Dv, &h.Dv);
  if (c.bias) vecD(k.bias, &h.bias);
  auto bdn = [&](Tensor& t, const std::vector<float>* v) {
    if (c.layout == 1) make_tensor(t, wt, {Bt, D, N}, {1, Bt, Bt * D});
    else make_tensor(t, wt, {Bt, D, N}, {});
    if (v) upload(t, *v);
  };
  if (c.h0) bdn(k.h0, &h.h0);
  make_tensor(k.x, wt, {Bt, D, nc, 2 * N}, {});
  upload(k.x, h.x);
  bdl_out(k.du, odd);
  bdl_out(k.ddelta, false);
  dn(k.dA, nullptr);
  if (c.varB) var(k.dB, nullptr);
  else dn(k.dB, nullptr);
  if (c.varC) var(k.dC, nullptr);
  else dn(k.dC, nullptr);
  if (c.hasD) vecD(k.dD, nullptr);
  if (c.bias) vecD(k.dbias, nullptr);
  if (c.h0) bdn(k.dh0, nullptr);
  if (c.hasZ) {
    bdl_out(k.dz, false);
    if (c.outz) bdl_out(k.outz, false);
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
  a.D = opt(k.Dv, c.hasD);
  a.z = opt(k.z, c.hasZ);
  a.delta_bias = opt(k.bias, c.bias);
  a.h0 = opt(k.h0, c.h0);
  a.delta_softplus = c.softplus;
  a.deterministic = c.det;
  a.dout = k.dout.desc(dev);
  a.x = k.x.desc(dev);
  a.out = opt(k.out, c.hasZ);
  a.du = k.du.desc(dev);
  a.ddelta = k.ddelta.desc(dev);
  a.dA = k.dA.desc(dev);
  a.dB = k.dB.desc(dev);
  a.dC = k.dC.desc(dev);
  a.dD = opt(k.dD, c.hasD);
  a.dz = opt(k.dz, c.hasZ);
  a.ddelta_bias = opt(k.dbias, c.bias);
  a.dh0 = opt(k.dh0, c.h0);
  a.out_z = opt(k.outz, c.hasZ && c.outz);
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

// |got - ref| <= atol + rtol |ref| elementwise; NaN (an unwritten poisoned element) always fails.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                  double rtol, double atol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double lim = atol + rtol * std::fabs(ref[i]);
    const double ratio = std::isnan(got[i]) ? 1e30 : err / lim;
    if (ratio > worst) worst = ratio;
    if (!(ratio <= 1.0)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; first at " << first
                     << " got " << got[first] << " want " << ref[first] << "; worst err/tol " << worst;
}

struct Tol {
  double rtol, atol;
};
Tol out_tol(int32_t it) {
  if (it == SELSCAN_DTYPE_FLOAT16) return {3e-3, 5e-3};
  if (it == SELSCAN_DTYPE_BFLOAT16) return {3e-2, 5e-2};
  return {6e-4, 2e-3};
}

// Tolerances of upstream's tests (golden/README.md); weight tolerances are raised to the output's with z.
void check_all(Call& k, const Ref& r, double scale = 1.0, bool on_device = true) {
  const Cfg& c = k.c;
  const Tol o = out_tol(c.itype);
  auto weight = [&](double rt, double at) {
    return c.hasZ ? Tol{std::max(rt, o.rtol), std::max(at, o.atol)} : Tol{rt, at};
  };
  auto got = [&](Tensor& t) { return read_values(t, on_device ? device_bytes(t) : t.host); };
  const std::string tag = std::string(on_device ? " gpu" : " cpu") + " [" + c.str() + "]";
  expect_close("du" + tag, got(k.du), r.du, 2 * o.rtol * scale, 2 * o.atol * scale);
  expect_close("ddelta" + tag, got(k.ddelta), r.ddelta, 5 * o.rtol * scale, 10 * o.atol * scale);
  const Tol tA = weight(1e-3, 5e-3);
  expect_close("dA" + tag, got(k.dA), r.dA, tA.rtol * scale, tA.atol * scale);
  // Variable dB/dC sum D/G channels that cancel; upstream's test had at most 4 per group.
  const double vs = std::max(1.0, std::sqrt(static_cast<double>(c.D / c.G) / 4.0));
  const Tol tB = c.varB ? Tol{o.rtol * vs, o.atol * vs} : weight(1e-3, 1e-3);
  expect_close("dB" + tag, got(k.dB), r.dB, tB.rtol * scale, tB.atol * scale);
  const Tol tC = c.varC ? Tol{o.rtol * vs, o.atol * vs} : weight(1e-3, 1e-3);
  expect_close("dC" + tag, got(k.dC), r.dC, tC.rtol * scale, tC.atol * scale);
  const Tol tw = weight(1e-3, 1e-3);
  if (c.hasD) expect_close("dD" + tag, got(k.dD), r.dD, tw.rtol * scale, tw.atol * scale);
  if (c.bias) expect_close("ddelta_bias" + tag, got(k.dbias), r.dbias, tw.rtol * scale, tw.atol * scale);
  if (c.hasZ) expect_close("dz" + tag, got(k.dz), r.dz, tw.rtol * scale, tw.atol * scale);
  if (c.hasZ && c.outz) expect_close("out_z" + tag, got(k.outz), r.outz, o.rtol, o.atol);
  if (c.h0) expect_close("dh0" + tag, got(k.dh0), r.dh0, tA.rtol * scale, tA.atol * scale);
}

// Sums over long sequences and many states grow the float32 rounding of the kernels (and of upstream's)
// beyond tolerances chosen for L <= 4096, N = 8; scale them by the reduction length.
// Complex weights double the terms of every sum (2 Re) and add __sincosf's phase error (fast math, as
// upstream); upstream never tested complex gradients, so they get four times the tolerance.
double tol_scale(const Cfg& c) {
  const double terms = static_cast<double>(c.L) * c.N / (4096.0 * 16.0);
  return std::max(1.0, std::sqrt(terms)) * (c.cplx ? 4.0 : 1.0);
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
  c.hasD = c.hasZ = c.bias = c.softplus = false;
  c.L = 37;
  run_case(c);
}

TEST_F(BwdGpu, OddLengthsAndChunks) {
  for (int64_t L : {1, 31, 255, 257, 2047, 2048, 2049, 4500}) {
    Cfg c;
    c.L = L;
    c.D = 6;
    c.seed = static_cast<uint32_t>(L);
    run_case(c);
  }
}

TEST_F(BwdGpu, ConstantAndVariableBC) {
  for (int vb = 0; vb < 2; ++vb)
    for (int vc = 0; vc < 2; ++vc)
      for (int h0 = 0; h0 < 2; ++h0) {
        Cfg c;
        c.varB = vb;
        c.varC = vc;
        c.h0 = h0;
        c.L = 2500;
        c.D = 5;
        c.seed = 100 + vb * 4 + vc * 2 + h0;
        run_case(c);
      }
}

TEST_F(BwdGpu, Groups) {
  for (int64_t G : {1, 2, 4}) {
    Cfg c;
    c.G = G;
    c.D = 24;  // 6 channels per group with G = 4: blocks with idle warps
    c.L = 700;
    c.seed = 7 + G;
    run_case(c);
  }
}

TEST_F(BwdGpu, Complex) {
  for (int vb = 0; vb < 2; ++vb)
    for (int vc = 0; vc < 2; ++vc) {
      Cfg c;
      c.cplx = true;
      c.varB = vb;
      c.varC = vc;
      c.h0 = vb == vc;
      c.G = (vb && vc) ? 2 : 1;
      c.D = 8;
      c.L = 2300;
      c.seed = 200 + vb * 2 + vc;
      run_case(c);
    }
}

TEST_F(BwdGpu, HalfTypes) {
  for (int32_t it : {SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (int cp = 0; cp < 2; ++cp) {
      Cfg c;
      c.itype = it;
      c.cplx = cp;
      c.D = 8;
      c.L = 2100;
      c.G = 2;
      c.seed = 300 + it * 2 + cp;
      run_case(c);
    }
}

TEST_F(BwdGpu, Dstates) {
  for (int64_t N : {1, 16, 64, 256}) {
    Cfg c;
    c.N = N;
    c.D = 4;
    c.Bt = 1;
    c.L = N == 256 ? 300 : 1000;
    c.seed = 400 + static_cast<uint32_t>(N);
    run_case(c);
    c.cplx = true;
    c.varB = false;
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
    c.N = Ns[i];
    c.D = 70;
    c.G = i == 1 ? 2 : 1;
    c.Bt = 3;
    c.L = i == 2 ? 4100 : 600 + 7 * i;
    c.varB = i != 3;
    c.varC = i != 0;
    c.h0 = i == 3;
    c.itype = i == 1 ? SELSCAN_DTYPE_BFLOAT16 : i == 2 ? SELSCAN_DTYPE_FLOAT16 : SELSCAN_DTYPE_FLOAT32;
    c.seed = 900 + static_cast<uint32_t>(i);
    run_case(c);
  }
}

TEST_F(BwdGpu, UnusualStrides) {
  for (int vb = 0; vb < 2; ++vb) {
    Cfg c;
    c.layout = 1;
    c.varB = vb;
    c.h0 = true;
    c.D = 6;
    c.L = 300;
    c.seed = 500 + vb;
    run_case(c);
    c.itype = SELSCAN_DTYPE_BFLOAT16;
    c.cplx = true;
    run_case(c);
  }
}

TEST_F(BwdGpu, MisalignedPointers) {
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16}) {
    Cfg c;
    c.layout = 2;
    c.itype = it;
    c.D = 6;
    c.L = 600;
    c.seed = 600 + it;
    run_case(c);
  }
}

TEST_F(BwdGpu, DimBeyondGridLimit) {
  Cfg c;
  c.Bt = 1;
  c.D = 70000;
  c.L = 9;
  c.N = 2;
  c.varB = false;
  c.varC = false;
  c.hasZ = false;
  run_case(c);
}

// The deterministic mode gives bitwise-identical outputs run to run (and agrees with the reference).
TEST_F(BwdGpu, DeterministicIsBitwiseReproducible) {
  for (int cp = 0; cp < 2; ++cp) {
    Cfg c;
    c.det = true;
    c.cplx = cp;
    c.Bt = 2;
    c.D = 64;
    c.G = 2;
    c.L = 2600;
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
// Minimal .npy reader (format 1.0/2.0, little-endian float32 or complex64, C order).
bool read_npy(const std::string& path, std::vector<float>* v, std::vector<int64_t>* shape) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  char magic[8];
  f.read(magic, 8);
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) return false;
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16 = 0;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string hdr(hlen, ' ');
  f.read(hdr.data(), hlen);
  const bool cplx = hdr.find("<c8") != std::string::npos;
  if (!cplx && hdr.find("<f4") == std::string::npos) return false;
  if (hdr.find("'fortran_order': True") != std::string::npos) return false;
  shape->clear();
  const size_t a = hdr.find('(', hdr.find("shape")), b = hdr.find(')', a);
  std::stringstream ss(hdr.substr(a + 1, b - a - 1));
  std::string tok;
  int64_t count = 1;
  while (std::getline(ss, tok, ','))
    if (tok.find_first_of("0123456789") != std::string::npos) {
      shape->push_back(std::stoll(tok));
      count *= shape->back();
    }
  v->resize(static_cast<size_t>(count * (cplx ? 2 : 1)));
  f.read(reinterpret_cast<char*>(v->data()), static_cast<std::streamsize>(v->size() * 4));
  return static_cast<bool>(f);
}

std::string json_value(const std::string& js, const std::string& key) {
  const size_t k = js.find("\"" + key + "\"");
  if (k == std::string::npos) return "";
  size_t p = js.find(':', k) + 1;
  while (js[p] == ' ') ++p;
  size_t e = p;
  while (e < js.size() && js[e] != ',' && js[e] != '\n' && js[e] != '}') ++e;
  std::string v = js.substr(p, e - p);
  v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
  return v;
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

class BwdGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(BwdGolden, MatchesUpstream) {
  REQUIRE_GPU();
  const char* env = std::getenv("SELSCAN_GOLDEN_DIR");  // overrides the configured path (a copied tree)
  const std::string dir = std::string(env && *env ? env : SELSCAN_GOLDEN_DIR) + "/" + GetParam();
  std::ifstream jf(dir + "/case.json");
  if (!jf) GTEST_SKIP() << "golden case not found: " << dir;
  const std::string js((std::istreambuf_iterator<char>(jf)), std::istreambuf_iterator<char>());
  Cfg c;
  c.Bt = std::stoll(json_value(js, "batch"));
  c.D = std::stoll(json_value(js, "dim"));
  c.L = std::stoll(json_value(js, "seqlen"));
  c.N = std::stoll(json_value(js, "dstate"));
  const std::string groups = json_value(js, "groups");  // null when B and C are both constant
  c.G = groups.find_first_of("0123456789") == std::string::npos ? 1 : std::stoll(groups);
  const std::string it = json_value(js, "itype");
  c.itype = it == "bf16" ? SELSCAN_DTYPE_BFLOAT16 : it == "fp16" ? SELSCAN_DTYPE_FLOAT16 : SELSCAN_DTYPE_FLOAT32;
  c.cplx = json_value(js, "wtype") == "complex64";
  c.varB = json_value(js, "variable_B") == "true";
  c.varC = json_value(js, "variable_C") == "true";
  c.hasD = json_value(js, "has_D") == "true";
  c.hasZ = json_value(js, "has_z") == "true";
  c.bias = json_value(js, "has_delta_bias") == "true";
  c.softplus = json_value(js, "delta_softplus") == "true";
  if (!c.varB && !c.varC) c.G = 1;
  SCOPED_TRACE(c.str());
  Host h;
  std::vector<int64_t> shp;
  auto rd = [&](const char* name, std::vector<float>& v) {
    ASSERT_TRUE(read_npy(dir + "/" + name + ".npy", &v, &shp)) << name;
  };
  rd("u", h.u);
  rd("delta", h.delta);
  rd("dout", h.dout);
  rd("A", h.A);
  rd("B", h.B);
  rd("C", h.C);
  if (c.hasZ) rd("z", h.z);
  if (c.hasD) rd("D", h.Dv);
  if (c.bias) rd("delta_bias", h.bias);
  // The backward's saved inputs (pre-gate out, chunk states x) come from the float64 forward.
  Ref mine;
  reference(c, h, mine);
  Call k;
  k.c = c;
  build(k, h);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(run_gpu(k));
  Ref g;
  std::vector<float> v;
  rd("du", v);
  g.du = as_double(v);
  rd("ddelta", v);
  g.ddelta = as_double(v);
  rd("dA", v);
  g.dA = as_double(v);
  rd("dB", v);
  g.dB = as_double(v);
  rd("dC", v);
  g.dC = as_double(v);
  if (c.hasD) {
    rd("dD", v);
    g.dD = as_double(v);
  }
  if (c.bias) {
    rd("ddelta_bias", v);
    g.dbias = as_double(v);
  }
  if (c.hasZ) {
    rd("dz", v);
    g.dz = as_double(v);
    g.outz = mine.outz;
  }
  check_all(k, g);
}

INSTANTIATE_TEST_SUITE_P(Upstream, BwdGolden,
                         ::testing::Values("s01_fp32_basic", "s02_fp32_full", "s03_bf16_full", "s04_fp16_groups2",
                                           "s05_fp32_constBC", "s06_bf16_long_2chunks", "s07_fp32_dstate64",
                                           "s08_fp32_complex"));

// ---------------------------------------------------------------------------------------------- timing
// Issue #4's backward row: Bt=8, D=1536, L=2048, N=16, bf16, variable B/C, D, z, delta_bias, softplus.
// Run with --gtest_also_run_disabled_tests; prints the median of CUDA-event timings (no correctness check).
TEST(BwdGpuTiming, DISABLED_Issue4Row) {
  REQUIRE_GPU();
  for (int det = 0; det < 2; ++det) {
    Cfg c;
    c.Bt = 8;
    c.D = 1536;
    c.L = 2048;
    c.N = 16;
    c.itype = SELSCAN_DTYPE_BFLOAT16;
    c.det = det;
    Host h;
    generate(c, h);
    h.out = h.u;  // any values: timing only
    h.x.assign(c.Bt * c.D * 2 * c.N, 0.f);
    Call k;
    k.c = c;
    build(k, h);
    selscan_bwd_args_t a = args_of(k, true);
    selscan_exec_t e = SELSCAN_EXEC_INIT;
    e.device_kind = SELSCAN_DEVICE_CUDA;
    size_t ws_bytes = 0;
    ASSERT_EQ(selscan_bwd_workspace_size(&a, &e, &ws_bytes), SELSCAN_STATUS_SUCCESS);
    void* ws = nullptr;
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    e.workspace = ws;
    e.workspace_bytes = ws_bytes;
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    std::vector<float> ms;
    for (int i = 0; i < 25; ++i) {
      cudaEventRecord(t0);
      ASSERT_EQ(selscan_bwd(&a, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      cudaEventRecord(t1);
      cudaEventSynchronize(t1);
      float m = 0;
      cudaEventElapsedTime(&m, t0, t1);
      if (i >= 5) ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("bwd timing (Bt=8 D=1536 L=2048 N=16 bf16 varBC D z bias softplus) deterministic=%d: median %.4f ms "
                "(min %.4f), workspace %.1f MB\n",
                det, ms[ms.size() / 2], ms[0], ws_bytes / 1e6);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(ws);
  }
}

}  // namespace
