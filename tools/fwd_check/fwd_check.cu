// Standalone check of the CUDA forward launcher (selscan::cuda::launch_fwd) on hand-built Problems, without
// the API layer: a float64 recurrence on every row (sampled rows for the big shapes), poisoned outputs with
// untouched-gap checks, run-to-run determinism, the golden vectors, and CUDA-event timings (median of 25
// after 5 warm-ups) of the shipped configuration and of tuning variants (K steps per lane, occupancy hint).
// Build and run from the repository root (sm_90 shown):
//   nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90 -Isrc -Iinclude tools/fwd_check/fwd_check.cu \
//        kernels/fwd_f32.cu kernels/fwd_f16.cu kernels/fwd_bf16.cu kernels/launch_fwd.cu -o /tmp/fwd_check
//   /tmp/fwd_check [golden_dir|-] [name_filter,name_filter,...]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cuda/launch.h"
#include "../../kernels/fwd.cuh"

namespace selscan {
Status fail(Status s, std::string m) {
  std::fprintf(stderr, "fail(%d): %s\n", (int)s, m.c_str());
  return s;
}
}  // namespace selscan

using namespace selscan;
using cd = std::complex<double>;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

static uint16_t bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}
static float bf16_val(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
static uint16_t f16_bits(float f) {
  __half h = __float2half_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
static float f16_val(uint16_t b) {
  __half h;
  std::memcpy(&h, &b, 2);
  return __half2float(h);
}

// A strided device tensor with its logical host values (float; complex: 2 floats per element).
struct T {
  std::vector<int64_t> size, stride;
  int kind = 0;  // 0 f32, 1 f16, 2 bf16, 3 c64
  int64_t off = 0, span = 0;
  char* base = nullptr;
  std::vector<float> val;
  int esize() const { return kind == 3 ? 8 : (kind == 0 ? 4 : 2); }
  int ncomp() const { return kind == 3 ? 2 : 1; }
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : size) n *= s;
    return n;
  }
  bool present() const { return base != nullptr; }
  void* ptr() const { return base ? base + off * esize() : nullptr; }
  View view() const {
    View v{};
    v.p = ptr();
    for (size_t i = 0; i < stride.size(); ++i) v.s[i] = stride[i];
    return v;
  }
  int64_t phys(int64_t lin) const {  // logical linear (C order) -> physical element offset
    int64_t o = 0;
    for (int i = (int)size.size() - 1; i >= 0; --i) {
      o += (lin % size[i]) * stride[i];
      lin /= size[i];
    }
    return o;
  }
};

static std::vector<int64_t> contig(const std::vector<int64_t>& sz) {
  std::vector<int64_t> st(sz.size());
  int64_t s = 1;
  for (int i = (int)sz.size() - 1; i >= 0; --i) {
    st[i] = s;
    s *= sz[i];
  }
  return st;
}

// Allocates; inputs get their values uploaded (rounded to the dtype, val updated to the rounded value),
// outputs are poisoned with 0xFF bytes (NaN in every dtype). full_check: keep host copy of whole buffer.
static void make(T& t, std::vector<int64_t> sz, std::vector<int64_t> st, int kind, int64_t off, bool input) {
  t.size = sz;
  t.stride = st;
  t.kind = kind;
  t.off = off;
  int64_t span = 1;
  for (size_t i = 0; i < sz.size(); ++i) span += (sz[i] - 1) * st[i];
  t.span = span;
  const size_t bytes = (size_t)(off + span) * t.esize() + 64;
  CK(cudaMalloc(&t.base, bytes));
  if (!input) {
    CK(cudaMemset(t.base, 0xFF, bytes));
    return;
  }
  std::vector<char> h(bytes, 0);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    char* dst = h.data() + (off + t.phys(i)) * t.esize();
    for (int c = 0; c < t.ncomp(); ++c) {
      float& v = t.val[i * t.ncomp() + c];
      if (kind == 0 || kind == 3) {
        std::memcpy(dst + 4 * c, &v, 4);
      } else if (kind == 1) {
        uint16_t b = f16_bits(v);
        v = f16_val(b);
        std::memcpy(dst, &b, 2);
      } else {
        uint16_t b = bf16_bits(v);
        v = bf16_val(b);
        std::memcpy(dst, &b, 2);
      }
    }
  }
  CK(cudaMemcpy(t.base, h.data(), bytes, cudaMemcpyHostToDevice));
}

static void release(T& t) {
  if (t.base) cudaFree(t.base);
  t.base = nullptr;
}

static std::vector<char> fetch_all(const T& t) {
  const size_t bytes = (size_t)(t.off + t.span) * t.esize() + 64;
  std::vector<char> h(bytes);
  CK(cudaMemcpy(h.data(), t.base, bytes, cudaMemcpyDeviceToHost));
  return h;
}
static double get_elem(const T& t, const char* buf_at_phys0, int comp) {
  if (t.kind == 0 || t.kind == 3) {
    float f;
    std::memcpy(&f, buf_at_phys0 + 4 * comp, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, buf_at_phys0, 2);
  return t.kind == 1 ? f16_val(b) : bf16_val(b);
}
// Reads logical element lin (component comp) from the device, one small copy (for sampled checks of big runs).
static double read_dev(const T& t, int64_t lin, int comp) {
  char b[8];
  CK(cudaMemcpy(b, t.base + (t.off + t.phys(lin)) * t.esize(), t.esize(), cudaMemcpyDeviceToHost));
  return get_elem(t, b, comp);
}

struct Cfg {
  int64_t Bt = 2, D = 4, L = 64, N = 16, G = 1;
  int itype = 0;
  bool cplx = false, varB = true, varC = true, hasD = true, hasZ = true, bias = true, sp = true, h0 = false;
  bool x = true, last = true;
  int layout = 0;  // 0 contiguous, 1 odd padded strides, 2 transposed batch/channel (mamba_inner's delta)
  bool misalign = false;
  bool bcast_A = false;  // A stored once with channel stride 0 (keeps the huge-D case small)
  int sample_rows = 0;  // 0: check every row and the guard bytes; else this many random rows
  bool time = false;
  Status (*launch)(const Problem&, cudaStream_t) = nullptr;  // a specific kernel configuration (tuning)
  uint64_t seed = 1;
  std::string name;
};

struct Err {
  double worst = 0;   // max |got-ref| / (atol + rtol |ref|)
  double maxabs = 0;  // max |got-ref|
  int64_t bad = 0, nan = 0;
  void add(double got, double ref, double rtol, double atol) {
    if (std::isnan(got) != std::isnan(ref)) {
      ++nan;
      ++bad;
      return;
    }
    if (std::isnan(ref)) return;
    const double e = std::fabs(got - ref);
    maxabs = std::max(maxabs, e);
    const double r = e / (atol + rtol * std::fabs(ref));
    worst = std::max(worst, r);
    if (r > 1) ++bad;
  }
};

static int g_failed = 0;

struct Inputs {
  T u, delta, A, B, C, Dv, z, bias, h0;
  T out, outz, x, last;
};

static double now_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

static void run_case(const Cfg& c) {
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int64_t Bt = c.Bt, D = c.D, L = c.L, N = c.N, G = c.G, nc = (L + 2047) / 2048;
  const int cw = c.cplx ? 2 : 1;
  const int wk = c.cplx ? 3 : 0;
  const int64_t mis = c.misalign ? 1 : 0;
  Inputs in;
  auto fill = [&](T& t, int64_t n, auto gen) {
    t.val.resize(n);
    for (auto& v : t.val) v = gen();
  };
  auto bdl_strides = [&]() -> std::vector<int64_t> {
    if (c.layout == 1) return {D * (L + 3) + 5, L + 3, 1};
    if (c.layout == 2) return {L, Bt * L, 1};
    return {D * L, L, 1};
  };
  auto mk_bdl = [&](T& t, bool input, auto gen) {
    if (input) fill(t, Bt * D * L, gen);
    make(t, {Bt, D, L}, bdl_strides(), c.itype, mis, input);
  };
  auto randn = [&]() { return nd(rng); };
  mk_bdl(in.u, true, randn);
  mk_bdl(in.delta, true, [&]() { return 0.5f * ud(rng); });
  // A: real negative; complex: negative real part, random imaginary part.
  const int64_t DA = c.bcast_A ? 1 : D;
  fill(in.A, DA * N * cw, [&]() { return 0.f; });
  for (int64_t i = 0; i < DA * N; ++i) {
    in.A.val[i * cw] = -0.5f * ud(rng) - 0.05f;
    if (c.cplx) in.A.val[i * cw + 1] = nd(rng);
  }
  make(in.A, {DA, N}, c.layout == 1 ? std::vector<int64_t>{1, DA} : std::vector<int64_t>{N, 1}, wk, 0, true);
  auto mk_bc = [&](T& t, bool var) {
    if (var) {
      const int64_t Lr = L * cw;
      fill(t, Bt * G * N * Lr, randn);
      std::vector<int64_t> st = c.layout == 1 ? std::vector<int64_t>{G * N * (Lr + 1) + 3, N * (Lr + 1), Lr + 1, 1}
                                              : contig({Bt, G, N, Lr});
      make(t, {Bt, G, N, Lr}, st, c.itype, mis, true);
    } else {
      fill(t, D * N * cw, randn);
      make(t, {D, N}, c.layout == 1 ? std::vector<int64_t>{1, D} : std::vector<int64_t>{N, 1}, wk, 0, true);
    }
  };
  mk_bc(in.B, c.varB);
  mk_bc(in.C, c.varC);
  const std::vector<int64_t> vst = {c.layout == 1 ? 2 : 1};
  if (c.hasD) {
    fill(in.Dv, D, randn);
    make(in.Dv, {D}, vst, 0, 0, true);
  }
  if (c.bias) {
    fill(in.bias, D, [&]() { return 0.5f * ud(rng); });
    make(in.bias, {D}, vst, 0, 0, true);
  }
  if (c.hasZ) mk_bdl(in.z, true, randn);
  const std::vector<int64_t> hst = c.layout == 1 ? std::vector<int64_t>{1, Bt, Bt * D} : contig({Bt, D, N});
  if (c.h0) {
    fill(in.h0, Bt * D * N * cw, randn);
    make(in.h0, {Bt, D, N}, hst, wk, 0, true);
  }
  mk_bdl(in.out, false, randn);
  if (c.hasZ) mk_bdl(in.outz, false, randn);
  if (c.x) make(in.x, {Bt, D, nc, 2 * N}, contig({Bt, D, nc, 2 * N}), wk, 0, false);
  if (c.last) make(in.last, {Bt, D, N}, hst, wk, 0, false);

  Problem p{};
  p.batch = Bt;
  p.dim = D;
  p.seqlen = L;
  p.dstate = N;
  p.groups = G;
  p.nchunks = nc;
  p.itype = (Dtype)c.itype;
  p.is_complex = c.cplx;
  p.var_B = c.varB;
  p.var_C = c.varC;
  p.softplus = c.sp;
  p.fold_B = !c.varB && !c.h0;
  p.u = in.u.view();
  p.delta = in.delta.view();
  p.A = in.A.view();
  if (c.bcast_A) p.A.s[0] = 0;
  p.B = in.B.view();
  p.C = in.C.view();
  p.D = in.Dv.view();
  p.z = in.z.view();
  p.delta_bias = in.bias.view();
  p.h0 = in.h0.view();
  p.out = in.out.view();
  p.out_z = in.outz.view();
  p.x = in.x.view();
  p.last_state = in.last.view();

  auto launch = [&]() {
    return c.launch ? c.launch(p, nullptr) : cuda::launch_fwd(p, cuda::Family::sm90, nullptr, nullptr, 0);
  };
  Status s = launch();
  CK(cudaDeviceSynchronize());
  if (s != SELSCAN_STATUS_SUCCESS) {
    std::printf("FAIL %-40s launch status %d\n", c.name.c_str(), (int)s);
    ++g_failed;
    return;
  }

  // Reference rows.
  std::vector<int64_t> rows;
  if (c.sample_rows == 0) {
    for (int64_t r = 0; r < Bt * D; ++r) rows.push_back(r);
  } else {
    std::uniform_int_distribution<int64_t> rd(0, Bt * D - 1);
    rows.push_back(Bt * D - 1);
    rows.push_back(0);
    while ((int)rows.size() < c.sample_rows) rows.push_back(rd(rng));
  }
  const double rtol = c.itype == 0 ? 6e-4 : (c.itype == 1 ? 3e-3 : 3e-2);
  const double atol = c.itype == 0 ? 2e-3 : (c.itype == 1 ? 5e-3 : 5e-2);
  Err eo, ez, ex, el;
  std::vector<char> hout, houtz, hx, hlast;
  const bool full = c.sample_rows == 0;
  if (full) {
    hout = fetch_all(in.out);
    if (c.hasZ) houtz = fetch_all(in.outz);
    if (c.x) hx = fetch_all(in.x);
    if (c.last) hlast = fetch_all(in.last);
  }
  auto got = [&](const T& t, const std::vector<char>& h, int64_t lin, int comp) -> double {
    if (!full) return read_dev(t, lin, comp);
    return get_elem(t, h.data() + (t.off + t.phys(lin)) * t.esize(), comp);
  };
  const int64_t cpg = D / G;
  std::vector<double> y(L), dl(L), du(L);
  std::vector<cd> hs(N);
  for (int64_t r : rows) {
    const int64_t b = r / D, d = r % D, g = d / cpg;
    const double bias = c.bias ? in.bias.val[d] : 0.0;
    const double Dd = c.hasD ? in.Dv.val[d] : 0.0;
    for (int64_t t = 0; t < L; ++t) {
      const int64_t i = (b * D + d) * L + t;
      double v = in.delta.val[i] + bias;
      if (c.sp) v = v <= 20.0 ? std::log1p(std::exp(v)) : v;
      dl[t] = v;
      du[t] = v * in.u.val[i];
      y[t] = Dd * in.u.val[i];
    }
    auto wget = [&](const T& t, int64_t lin) { return c.cplx ? cd(t.val[2 * lin], t.val[2 * lin + 1]) : cd(t.val[lin], 0); };
    auto vget = [&](const T& t, int64_t n, int64_t tt) {
      const int64_t base = ((b * G + g) * N + n) * L * cw;
      return c.cplx ? cd(t.val[base + 2 * tt], t.val[base + 2 * tt + 1]) : cd(t.val[base + tt], 0);
    };
    for (int64_t n = 0; n < N; ++n) {
      const cd A = wget(in.A, (c.bcast_A ? 0 : d) * N + n);
      const cd Bc = c.varB ? cd(1) : wget(in.B, d * N + n);
      const cd Cc = c.varC ? cd(1) : wget(in.C, d * N + n);
      const bool fold = !c.varB && !c.h0;
      cd h = c.h0 ? wget(in.h0, (b * D + d) * N + n) : cd(0);
      cd P = 1;
      for (int64_t t = 0; t < L; ++t) {
        const cd a = c.cplx ? std::exp(dl[t] * A) : cd(std::exp(dl[t] * A.real()), 0);
        const cd bb = (c.varB ? vget(in.B, n, t) : (fold ? cd(1) : Bc)) * du[t];
        h = a * h + bb;
        P *= a;
        const cd coef = (c.varC ? vget(in.C, n, t) : Cc) * (fold ? Bc : cd(1));
        y[t] += c.cplx ? 2.0 * (h * coef).real() : (h * coef).real();
        if (c.x && ((t + 1) % 2048 == 0 || t == L - 1)) {
          const int64_t ch = t / 2048;
          const int64_t xl = ((b * D + d) * nc + ch) * 2 * N + 2 * n;
          for (int comp = 0; comp < cw; ++comp) {
            ex.add(got(in.x, hx, xl, comp), comp ? P.imag() : P.real(), 6e-4, 2e-3);
            ex.add(got(in.x, hx, xl + 1, comp), comp ? h.imag() : h.real(), 6e-4, 2e-3);
          }
        }
      }
      if (c.last) {
        const cd hl = fold ? Bc * h : h;
        for (int comp = 0; comp < cw; ++comp)
          el.add(got(in.last, hlast, (b * D + d) * N + n, comp), comp ? hl.imag() : hl.real(), 6e-4, 2e-3);
      }
    }
    for (int64_t t = 0; t < L; ++t) {
      const int64_t i = (b * D + d) * L + t;
      eo.add(got(in.out, hout, i, 0), y[t], rtol, atol);
      if (c.hasZ) {
        const double zz = in.z.val[i];
        ez.add(got(in.outz, houtz, i, 0), y[t] * zz / (1 + std::exp(-zz)), rtol, atol);
      }
    }
  }
  // Guard: every byte of an output buffer that is not a logical element must still be poison.
  int64_t guard_bad = 0;
  if (full) {
    auto guard = [&](const T& t, const std::vector<char>& h) {
      if (!t.present()) return;
      std::vector<char> used(h.size(), 0);
      for (int64_t i = 0; i < t.numel(); ++i)
        std::memset(used.data() + (t.off + t.phys(i)) * t.esize(), 1, t.esize());
      for (size_t k = 0; k < h.size(); ++k)
        if (!used[k] && (unsigned char)h[k] != 0xFF) ++guard_bad;
    };
    guard(in.out, hout);
    if (c.hasZ) guard(in.outz, houtz);
    if (c.x) guard(in.x, hx);
    if (c.last) guard(in.last, hlast);
  }
  // Determinism: a second run must give the same bytes.
  bool det = true;
  if (full) {
    CK(cudaMemset(in.out.base, 0xFF, (in.out.off + in.out.span) * in.out.esize()));
    launch();
    CK(cudaDeviceSynchronize());
    det = fetch_all(in.out) == hout;
  }
  const bool ok = eo.bad == 0 && ez.bad == 0 && ex.bad == 0 && el.bad == 0 && guard_bad == 0 && det;
  if (!ok) ++g_failed;
  std::printf("%s %-44s out %.2e(%.2f) outz %.2e(%.2f) x %.2e(%.2f) last %.2e(%.2f) bad %lld/%lld/%lld/%lld nan %lld guard %lld det %d\n",
              ok ? "ok  " : "FAIL", c.name.c_str(), eo.maxabs, eo.worst, ez.maxabs, ez.worst, ex.maxabs, ex.worst,
              el.maxabs, el.worst, (long long)eo.bad, (long long)ez.bad, (long long)ex.bad, (long long)el.bad,
              (long long)(eo.nan + ez.nan + ex.nan + el.nan), (long long)guard_bad, (int)det);

  if (c.time) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 5; ++i) launch();
    std::vector<double> ts;
    for (int i = 0; i < 25; ++i) {
      CK(cudaEventRecord(e0));
      launch();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      ts.push_back(now_ms(e0, e1));
    }
    std::sort(ts.begin(), ts.end());
    std::printf("TIME %-44s median %.4f ms  min %.4f ms\n", c.name.c_str(), ts[ts.size() / 2], ts[0]);
  }
  for (T* t : {&in.u, &in.delta, &in.A, &in.B, &in.C, &in.Dv, &in.z, &in.bias, &in.h0, &in.out, &in.outz, &in.x, &in.last})
    release(*t);
}

// ------------------------------------------------------------------------------------------ golden (npy)
static bool load_npy(const std::string& path, std::vector<float>& out, std::vector<int64_t>& shape, bool& cplx) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  char magic[8];
  f.read(magic, 8);
  uint16_t hl = 0;
  f.read((char*)&hl, 2);
  std::string hdr(hl, ' ');
  f.read(&hdr[0], hl);
  cplx = hdr.find("<c8") != std::string::npos;
  shape.clear();
  auto lp = hdr.find('(');
  auto rp = hdr.find(')');
  std::string sh = hdr.substr(lp + 1, rp - lp - 1);
  int64_t n = 1;
  size_t pos = 0;
  while (pos < sh.size()) {
    while (pos < sh.size() && (sh[pos] == ' ' || sh[pos] == ',')) ++pos;
    if (pos >= sh.size()) break;
    int64_t v = std::strtoll(sh.c_str() + pos, nullptr, 10);
    shape.push_back(v);
    n *= v;
    while (pos < sh.size() && sh[pos] != ',') ++pos;
  }
  out.resize(n * (cplx ? 2 : 1));
  f.read((char*)out.data(), out.size() * 4);
  return (bool)f;
}

static std::string json_str(const std::string& j, const std::string& key) {
  auto k = j.find("\"" + key + "\"");
  if (k == std::string::npos) return "";
  auto c = j.find(':', k);
  auto e = j.find_first_of(",}\n", c);
  std::string v = j.substr(c + 1, e - c - 1);
  v.erase(std::remove_if(v.begin(), v.end(), [](char ch) { return ch == ' ' || ch == '"'; }), v.end());
  return v;
}

static void run_golden(const std::string& dir) {
  std::ifstream jf(dir + "/case.json");
  if (!jf) {
    std::printf("golden: %s missing\n", dir.c_str());
    ++g_failed;
    return;
  }
  std::string j((std::istreambuf_iterator<char>(jf)), std::istreambuf_iterator<char>());
  const int64_t Bt = std::stoll(json_str(j, "batch")), D = std::stoll(json_str(j, "dim")),
                L = std::stoll(json_str(j, "seqlen")), N = std::stoll(json_str(j, "dstate")),
                G = json_str(j, "groups") == "null" ? 1 : std::stoll(json_str(j, "groups"));
  const std::string it = json_str(j, "itype");
  const int itype = it == "fp32" ? 0 : (it == "fp16" ? 1 : 2);
  const bool cplx = json_str(j, "wtype") == "complex64";
  const bool varB = json_str(j, "variable_B") == "true", varC = json_str(j, "variable_C") == "true";
  const bool hasD = json_str(j, "has_D") == "true", hasZ = json_str(j, "has_z") == "true";
  const bool hasBias = json_str(j, "has_delta_bias") == "true", sp = json_str(j, "delta_softplus") == "true";
  const int wk = cplx ? 3 : 0;
  const int64_t nc = (L + 2047) / 2048;
  auto ld = [&](const std::string& name, T& t, int kind, bool req) {
    std::vector<int64_t> shape;
    bool c2;
    if (!load_npy(dir + "/" + name + ".npy", t.val, shape, c2)) {
      if (req) std::printf("golden %s: missing %s\n", dir.c_str(), name.c_str());
      return false;
    }
    make(t, shape, contig(shape), kind, 0, true);
    return true;
  };
  Inputs in;
  ld("u", in.u, itype, true);
  ld("delta", in.delta, itype, true);
  ld("A", in.A, wk, true);
  ld("B", in.B, varB ? itype : wk, true);
  ld("C", in.C, varC ? itype : wk, true);
  if (hasD) ld("D", in.Dv, 0, true);
  if (hasZ) ld("z", in.z, itype, true);
  if (hasBias) ld("delta_bias", in.bias, 0, true);
  make(in.out, {Bt, D, L}, contig({Bt, D, L}), itype, 0, false);
  if (hasZ) make(in.outz, {Bt, D, L}, contig({Bt, D, L}), itype, 0, false);
  make(in.x, {Bt, D, nc, 2 * N}, contig({Bt, D, nc, 2 * N}), wk, 0, false);
  make(in.last, {Bt, D, N}, contig({Bt, D, N}), wk, 0, false);
  Problem p{};
  p.batch = Bt;
  p.dim = D;
  p.seqlen = L;
  p.dstate = N;
  p.groups = G;
  p.nchunks = nc;
  p.itype = (Dtype)itype;
  p.is_complex = cplx;
  p.var_B = varB;
  p.var_C = varC;
  p.softplus = sp;
  p.fold_B = !varB;
  p.u = in.u.view();
  p.delta = in.delta.view();
  p.A = in.A.view();
  p.B = in.B.view();
  p.C = in.C.view();
  p.D = in.Dv.view();
  p.z = in.z.view();
  p.delta_bias = in.bias.view();
  p.out = in.out.view();
  p.out_z = in.outz.view();
  p.x = in.x.view();
  p.last_state = in.last.view();
  if (varB || varC) {  // (Bt, G, N, L) rows: the views above were made from the npy shapes (4-D)
  }
  Status s = cuda::launch_fwd(p, cuda::Family::sm90, nullptr, nullptr, 0);
  CK(cudaDeviceSynchronize());
  std::vector<float> ref, lref;
  std::vector<int64_t> shape;
  bool c2;
  load_npy(dir + "/out.npy", ref, shape, c2);
  load_npy(dir + "/last_state.npy", lref, shape, c2);
  const double rtol = itype == 0 ? 6e-4 : (itype == 1 ? 3e-3 : 3e-2);
  const double atol = itype == 0 ? 2e-3 : (itype == 1 ? 5e-3 : 5e-2);
  Err eo, el;
  const T& o = hasZ ? in.outz : in.out;
  auto ho = fetch_all(o);
  for (int64_t i = 0; i < Bt * D * L; ++i) eo.add(get_elem(o, ho.data() + o.phys(i) * o.esize(), 0), ref[i], rtol, atol);
  auto hl = fetch_all(in.last);
  for (int64_t i = 0; i < Bt * D * N; ++i)
    for (int comp = 0; comp < (cplx ? 2 : 1); ++comp)
      el.add(get_elem(in.last, hl.data() + in.last.phys(i) * in.last.esize(), comp), lref[i * (cplx ? 2 : 1) + comp], rtol, atol);
  const bool ok = s == SELSCAN_STATUS_SUCCESS && eo.bad == 0 && el.bad == 0;
  if (!ok) ++g_failed;
  std::printf("%s golden %-36s out %.2e(%.2f) last %.2e(%.2f) bad %lld/%lld\n", ok ? "ok  " : "FAIL", dir.c_str(),
              eo.maxabs, eo.worst, el.maxabs, el.worst, (long long)eo.bad, (long long)el.bad);
  for (T* t : {&in.u, &in.delta, &in.A, &in.B, &in.C, &in.Dv, &in.z, &in.bias, &in.h0, &in.out, &in.outz, &in.x, &in.last})
    release(*t);
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::vector<Cfg> cases;
  uint64_t seed = 100;
  auto add = [&](Cfg c, const std::string& name) {
    c.name = name;
    c.seed = ++seed;
    cases.push_back(c);
  };
  const char* itn[] = {"f32", "f16", "bf16"};
  // The matrix: itype x real/complex x var/const B,C, odd lengths, several chunks, groups, dstate, h0, layouts.
  for (int it = 0; it < 3; ++it)
    for (int cx = 0; cx < 2; ++cx)
      for (int vb = 0; vb < 2; ++vb)
        for (int vc = 0; vc < 2; ++vc) {
          Cfg c;
          c.itype = it;
          c.cplx = cx;
          c.varB = vb;
          c.varC = vc;
          c.Bt = 2;
          c.D = 6;
          c.G = (vb || vc) ? 2 : 1;
          c.L = 300 + 37 * (it + 3 * vb);
          c.N = 16;
          c.h0 = (it + vb + vc) % 2;
          c.layout = (it + cx + vc) % 3;
          add(c, std::string(itn[it]) + (cx ? "_cplx" : "_real") + (vb ? "_varB" : "_cB") + (vc ? "_varC" : "_cC") +
                     (c.h0 ? "_h0" : "") + "_lay" + std::to_string(c.layout));
        }
  for (int it = 0; it < 3; ++it) {
    Cfg c;
    c.itype = it;
    c.L = 4500;
    c.D = 8;
    c.G = 4;
    c.N = 16;
    add(c, std::string("multichunk_L4500_G4_") + itn[it]);
    c.cplx = true;
    c.N = 8;
    c.h0 = true;
    add(c, std::string("multichunk_cplx_h0_") + itn[it]);
  }
  for (int64_t n : {1, 16, 64, 256}) {
    Cfg c;
    c.N = n;
    c.L = 777;
    c.D = 9;
    c.G = 3;
    c.itype = 2;
    add(c, "dstate" + std::to_string(n) + "_bf16");
    c.cplx = true;
    c.itype = 0;
    c.varB = false;
    add(c, "dstate" + std::to_string(n) + "_cplx_cB_f32");
  }
  for (int64_t L : {1, 2, 7, 31, 255, 256, 257, 2047, 2048, 2049}) {
    Cfg c;
    c.L = L;
    c.itype = L % 3;
    c.varC = L % 2;
    add(c, "L" + std::to_string(L) + "_" + itn[c.itype]);
  }
  {
    Cfg c;
    c.misalign = true;
    c.L = 512;
    for (int it = 0; it < 3; ++it) {
      c.itype = it;
      add(c, std::string("misaligned_") + itn[it]);
    }
    c.misalign = false;
    c.layout = 1;
    c.itype = 2;
    c.cplx = true;
    add(c, "padded_strides_cplx_bf16");
    Cfg e;
    e.hasD = e.hasZ = e.bias = e.sp = e.x = e.last = false;
    e.L = 100;
    add(e, "minimal_no_optionals");
    Cfg f;
    f.D = 13;
    f.G = 1;
    f.L = 129;
    add(f, "D13_partial_tile");
  }
  // Large: grid and 64-bit offsets (x has > 2^31 elements), sampled rows.
  {
    Cfg c;
    c.Bt = 1;
    c.D = 70000;
    c.L = 3;
    c.N = 4;
    c.sample_rows = 40;
    c.itype = 2;
    add(c, "D70000");
    c.D = (1LL << 22) + 8;
    c.N = 256;
    c.L = 1;
    c.bcast_A = true;
    c.hasZ = false;
    c.sample_rows = 12;
    add(c, "x_over_2^31_elements");
  }
  // Benchmark shapes (sampled rows check + timing).
  for (int it : {2, 0}) {
    Cfg c;
    c.Bt = 8;
    c.D = 1536;
    c.L = 2048;
    c.N = 16;
    c.itype = it;
    c.sample_rows = 24;
    c.time = true;
    add(c, std::string("bench_Bt8_D1536_L2048_N16_") + itn[it]);
  }
  {  // Tuning variants on the bench shape: K steps per lane, launch-bounds min blocks.
    using namespace selscan::kern;
    struct V {
      int it;
      Status (*f)(const Problem&, cudaStream_t);
      const char* name;
    };
    const V vs[] = {
        {2, &launch_fwd_cfg<__nv_bfloat16, false, 8, 2>, "bf16_K8_MB2"},
        {2, &launch_fwd_cfg<__nv_bfloat16, false, 8, 3>, "bf16_K8_MB3"},
        {2, &launch_fwd_cfg<__nv_bfloat16, false, 16, 1>, "bf16_K16_MB1"},
        {0, &launch_fwd_cfg<float, false, 8, 2>, "f32_K8_MB2"},
        {3, &launch_fwd_cfg<float, true, 8, 1>, "f32cplx_K8_MB1"},
        {3, &launch_fwd_cfg<float, true, 8, 2>, "f32cplx_K8_MB2"},
    };
    for (const V& v : vs) {
      Cfg c;
      c.Bt = 8;
      c.D = 1536;
      c.L = 2048;
      c.N = 16;
      c.itype = v.it == 3 ? 0 : v.it;
      c.cplx = v.it == 3;
      c.sample_rows = 6;
      c.time = true;
      c.launch = v.f;
      add(c, std::string("tune_") + v.name);
    }
  }
  // argv[2]: comma-separated name filters (substring match); empty: all cases.
  std::vector<std::string> only;
  if (argc > 2) {
    std::string f = argv[2];
    for (size_t a = 0, b; a <= f.size(); a = b + 1) {
      b = f.find(',', a);
      if (b == std::string::npos) b = f.size();
      only.push_back(f.substr(a, b - a));
    }
  }
  for (auto& c : cases) {
    bool want = only.empty();
    for (auto& o : only) want = want || c.name.find(o) != std::string::npos;
    if (want) run_case(c);
  }
  if (argc > 1 && std::string(argv[1]) != "-") {
    for (const char* g : {"s01_fp32_basic", "s02_fp32_full", "s03_bf16_full", "s04_fp16_groups2", "s05_fp32_constBC",
                          "s06_bf16_long_2chunks", "s07_fp32_dstate64", "s08_fp32_complex"})
      run_golden(std::string(argv[1]) + "/" + g);
  }
  std::printf("%s: %d failed\n", g_failed ? "FAILED" : "PASSED", g_failed);
  return g_failed ? 1 : 0;
}
