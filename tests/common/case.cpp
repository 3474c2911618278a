#include "case.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace selscan_test {

namespace {

// Fill every element of t (C order) with gen(); real tensors round to their dtype.
template <class F>
void fill(Tensor& t, F gen) {
  std::vector<int64_t> idx(t.sizes.size(), 0);
  const int64_t n = t.numel();
  for (int64_t k = 0; k < n; ++k) {
    t.setc(idx, gen());
    for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
      if (++idx[i] < t.sizes[i]) break;
      idx[i] = 0;
    }
  }
}

Layout bdl_layout(Strides s, const char* which, int64_t D, int64_t L) {
  const std::string w = which;
  if (s == Strides::mamba_inner) {
    if (w == "delta") return {{2, 0, 1}, {}};       // (L, Bt*L, 1)
    if (w == "z") return {{2, 1, 0}, {0, D * L, 0}};  // batch stride 2*D*L (a half of xz)
    return {};
  }
  if (s == Strides::padded) return {{2, 1, 0}, {3, 5, 0}};
  (void)L;
  return {};
}

}  // namespace

std::vector<Tensor*> Case::inputs() { return {&u, &delta, &A, &B, &C, &D, &z, &delta_bias, &h0}; }

std::vector<std::pair<const char*, Tensor*>> Case::named_fwd_outputs() {
  std::vector<std::pair<const char*, Tensor*>> r;
  for (auto nt : std::vector<std::pair<const char*, Tensor*>>{
           {"out", &out}, {"out_z", &out_z}, {"x", &x}, {"last_state", &last_state}})
    if (nt.second->present()) r.push_back(nt);
  return r;
}

std::vector<std::pair<const char*, Tensor*>> Case::named_bwd_outputs() {
  std::vector<std::pair<const char*, Tensor*>> r;
  for (auto nt : std::vector<std::pair<const char*, Tensor*>>{{"du", &du},
                                                              {"ddelta", &ddelta},
                                                              {"dA", &dA},
                                                              {"dB", &dB},
                                                              {"dC", &dC},
                                                              {"dD", &dD},
                                                              {"dz", &dz},
                                                              {"ddelta_bias", &ddelta_bias},
                                                              {"dh0", &dh0},
                                                              {"out_z(bwd)", &out_z_bwd}})
    if (nt.second->present()) r.push_back(nt);
  return r;
}

std::vector<Tensor*> Case::fwd_outputs() {
  std::vector<Tensor*> r;
  for (auto& nt : named_fwd_outputs()) r.push_back(nt.second);
  return r;
}

std::vector<Tensor*> Case::bwd_outputs() {
  std::vector<Tensor*> r;
  for (auto& nt : named_bwd_outputs()) r.push_back(nt.second);
  return r;
}

selscan_fwd_args_t Case::fwd_args(const PtrMap& ptr) {
  auto d = [&](Tensor& t) { return t.present() ? t.desc(ptr(t)) : t.desc(nullptr); };
  selscan_fwd_args_t a{};
  a.struct_size = sizeof(a);
  a.u = d(u);
  a.delta = d(delta);
  a.A = d(A);
  a.B = d(B);
  a.C = d(C);
  a.D = d(D);
  a.z = d(z);
  a.delta_bias = d(delta_bias);
  a.h0 = d(h0);
  a.delta_softplus = spec.softplus ? 1 : 0;
  a.out = d(out);
  a.out_z = d(out_z);
  a.x = d(x);
  a.last_state = d(last_state);
  return a;
}

selscan_bwd_args_t Case::bwd_args(const PtrMap& ptr, bool deterministic) {
  auto d = [&](Tensor& t) { return t.present() ? t.desc(ptr(t)) : t.desc(nullptr); };
  selscan_bwd_args_t a = bwd_args_with_inputs_of(fwd_args(ptr), deterministic);
  a.dout = d(dout);
  a.x = d(x);
  Tensor none;
  a.out = spec.has_z ? d(out) : d(none);
  a.du = d(du);
  a.ddelta = d(ddelta);
  a.dA = d(dA);
  a.dB = d(dB);
  a.dC = d(dC);
  a.dD = d(dD);
  a.dz = d(dz);
  a.ddelta_bias = d(ddelta_bias);
  a.dh0 = d(dh0);
  a.out_z = d(out_z_bwd);
  return a;
}

Case make_case(const CaseSpec& s) {
  if (s.bc_3d && s.groups != 1) throw std::invalid_argument("make_case: bc_3d needs groups == 1");
  if (s.dim % s.groups != 0) throw std::invalid_argument("make_case: groups must divide dim");
  Case c;
  c.spec = s;
  Rng rng(s.seed);
  const int64_t Bt = s.batch, D = s.dim, L = s.seqlen, N = s.dstate, G = s.groups;
  const int32_t it = s.itype, wt = s.complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const bool padded = s.strides == Strides::padded;
  const Layout dn = padded ? Layout{{0, 1}, {2, 0}} : Layout{};      // (D, N): channel-fastest, padded
  const Layout bdn = padded ? Layout{{1, 2, 0}, {1, 3, 0}} : Layout{};  // (Bt, D, N)
  const Layout bgnl = padded ? Layout{{3, 2, 1, 0}, {4, 1, 2, 0}} : Layout{};
  const Layout bnl = padded ? Layout{{2, 1, 0}, {4, 2, 0}} : Layout{};
  const std::vector<int64_t> shape_bdl{Bt, D, L};
  auto real = [&](double v) { return cd(v, 0.0); };

  c.u = make_tensor(it, shape_bdl, bdl_layout(s.strides, "u", D, L));
  fill(c.u, [&] { return real(rng.normal()); });
  c.delta = make_tensor(it, shape_bdl, bdl_layout(s.strides, "delta", D, L));
  fill(c.delta, [&] { return real(s.delta_lo + (s.delta_hi - s.delta_lo) * rng.uniform()); });

  c.A = make_tensor(wt, {D, N}, dn);
  fill(c.A, [&] {
    // Upstream's tests use -0.5 * rand; slow_decay spreads |A| log-uniformly over [1e-3, 1] instead. Complex
    // weights rotate fast here (|A.im| ~ 2) and keep some damping (A.re <= -0.02) unless slow_decay asks for
    // less: undamped fast rotations over thousands of steps make the gradients ill-conditioned in fp32.
    if (s.slow_decay) {
      const double re = -std::exp(std::log(1e-3) * rng.uniform());
      return s.complex ? cd(re, 2.0 * rng.normal()) : real(re);
    }
    return s.complex ? cd(-0.02 - 0.48 * rng.uniform(), 2.0 * rng.normal()) : real(-0.5 * rng.uniform());
  });

  auto make_bc = [&](bool var) {
    Tensor t;
    if (!var) {
      t = make_tensor(wt, {D, N}, dn);
      fill(t, [&] { return s.complex ? cd(rng.normal(), rng.normal()) : real(rng.normal()); });
      return t;
    }
    const int64_t Lbc = s.complex ? 2 * L : L;
    t = s.bc_3d ? make_tensor(it, {Bt, N, Lbc}, bnl) : make_tensor(it, {Bt, G, N, Lbc}, bgnl);
    fill(t, [&] { return real(rng.normal()); });
    return t;
  };
  c.B = make_bc(s.var_B);
  c.C = make_bc(s.var_C);

  if (s.has_D) {
    c.D = make_tensor(SELSCAN_DTYPE_FLOAT32, {D});
    fill(c.D, [&] { return real(rng.normal()); });
  }
  if (s.has_z) {
    c.z = make_tensor(it, shape_bdl, bdl_layout(s.strides, "z", D, L));
    fill(c.z, [&] { return real(rng.normal()); });
  }
  if (s.has_delta_bias) {
    c.delta_bias = make_tensor(SELSCAN_DTYPE_FLOAT32, {D});
    fill(c.delta_bias, [&] { return real(0.5 * rng.uniform()); });
  }
  if (s.has_h0) {
    c.h0 = make_tensor(wt, {Bt, D, N}, bdn);
    fill(c.h0, [&] { return s.complex ? cd(rng.normal(), rng.normal()) : real(rng.normal()); });
  }
  c.dout = make_tensor(it, shape_bdl, bdl_layout(s.strides, "delta", D, L));
  fill(c.dout, [&] { return real(rng.normal()); });

  // Outputs: poisoned everywhere (guards and gaps included).
  auto out = [&](int32_t dt, const std::vector<int64_t>& shape, const Layout& l) {
    return make_tensor(dt, shape, l, kPoison);
  };
  c.out = out(it, shape_bdl, bdl_layout(s.strides, "delta", D, L));
  if (s.has_z) c.out_z = out(it, shape_bdl, bdl_layout(s.strides, "z", D, L));
  if (s.with_x) c.x = out(wt, {Bt, D, c.nchunks(), 2 * N}, {});
  if (s.with_last_state) c.last_state = out(wt, {Bt, D, N}, bdn);

  c.du = out(it, shape_bdl, bdl_layout(s.strides, "u", D, L));
  c.ddelta = out(it, shape_bdl, bdl_layout(s.strides, "delta", D, L));
  c.dA = out(wt, {D, N}, dn);
  c.dB = out(c.B.dtype, c.B.sizes, s.var_B ? (s.bc_3d ? bnl : bgnl) : dn);
  c.dC = out(c.C.dtype, c.C.sizes, s.var_C ? (s.bc_3d ? bnl : bgnl) : dn);
  if (s.has_D) c.dD = out(SELSCAN_DTYPE_FLOAT32, {D}, {});
  if (s.has_z) c.dz = out(it, shape_bdl, bdl_layout(s.strides, "z", D, L));
  if (s.has_delta_bias) c.ddelta_bias = out(SELSCAN_DTYPE_FLOAT32, {D}, {});
  if (s.has_h0 && s.with_dh0) c.dh0 = out(wt, {Bt, D, N}, bdn);
  if (s.has_z && s.recompute_out_z) c.out_z_bwd = out(it, shape_bdl, bdl_layout(s.strides, "z", D, L));
  return c;
}

CaseSpec l4500_complex_h0_f16(uint64_t seed) {
  CaseSpec s = case_spec(2, 4, 4500, 8, SELSCAN_DTYPE_FLOAT16);
  s.complex = s.has_h0 = s.slow_decay = true;
  s.seed = seed;
  return s;
}

selscan_exec_t cuda_exec(void* stream, int32_t device) {
  selscan_exec_t e = SELSCAN_EXEC_INIT;
  e.device_kind = SELSCAN_DEVICE_CUDA;
  e.device_index = device;
  e.stream = stream;
  return e;
}

void* host_ptr(Tensor& t) { return t.present() ? t.storage.data() : nullptr; }

void poison(const std::vector<Tensor*>& ts) {
  for (Tensor* t : ts) t->fill_bytes(kPoison);
}

selscan_exec_t cpu_exec(int threads) {
  selscan_exec_t e = SELSCAN_EXEC_INIT;
  e.device_kind = SELSCAN_DEVICE_CPU;
  e.num_threads = threads;
  return e;
}

namespace {

// Device copies of every present tensor of a case, released on destruction.
class DeviceCopies {
 public:
  DeviceCopies(Case& c, const DeviceMemory& dev) : dev_(dev) {
    for (Tensor* t : all(c)) {
      if (!t->present()) continue;
      void* p = dev_.alloc(t->storage.size());
      if (p == nullptr) throw std::runtime_error("DeviceMemory::alloc returned NULL");
      ptrs_.emplace_back(t, p);
      dev_.to_device(p, t->storage.data(), t->storage.size());
    }
  }
  ~DeviceCopies() {
    for (auto& tp : ptrs_) dev_.release(tp.second);
  }
  void* ptr(Tensor& t) const {
    for (const auto& tp : ptrs_)
      if (tp.first == &t) return tp.second;
    return nullptr;
  }
  void copy_back() {
    dev_.sync();
    for (auto& tp : ptrs_) dev_.to_host(tp.first->storage.data(), tp.second, tp.first->storage.size());
  }

 private:
  static std::vector<Tensor*> all(Case& c) {
    std::vector<Tensor*> v = c.inputs();
    for (Tensor* t : {&c.out, &c.out_z, &c.x, &c.last_state, &c.dout, &c.du, &c.ddelta, &c.dA, &c.dB, &c.dC, &c.dD,
                      &c.dz, &c.ddelta_bias, &c.dh0, &c.out_z_bwd})
      v.push_back(t);
    return v;
  }
  const DeviceMemory& dev_;
  std::vector<std::pair<Tensor*, void*>> ptrs_;
};

}  // namespace

DeviceMemory host_device_memory(int* live) {
  DeviceMemory dev;
  dev.alloc = [live](size_t n) {
    ++*live;
    return std::malloc(n);
  };
  dev.to_device = [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); };
  dev.to_host = [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); };
  dev.release = [live](void* p) {
    --*live;
    std::free(p);
  };
  dev.sync = [] {};
  return dev;
}

selscan_status_t run_with_tensors(const std::vector<Tensor*>& ts, const DeviceMemory* dev,
                                  const std::function<selscan_status_t(const Case::PtrMap&)>& call) {
  if (dev == nullptr) return call(Case::PtrMap(host_ptr));
  struct Copies {  // released however the call ends
    const DeviceMemory& dev;
    std::vector<std::pair<Tensor*, void*>> v;
    ~Copies() {
      for (auto& tp : v) dev.release(tp.second);
    }
  } copies{*dev, {}};
  for (Tensor* t : ts) {
    if (!t->present()) continue;
    void* p = dev->alloc(t->storage.size());
    if (p == nullptr) throw std::runtime_error("DeviceMemory::alloc returned NULL");
    copies.v.emplace_back(t, p);
    dev->to_device(p, t->storage.data(), t->storage.size());
  }
  const selscan_status_t s = call([&](Tensor& t) -> void* {
    for (auto& tp : copies.v)
      if (tp.first == &t) return tp.second;
    return nullptr;
  });
  dev->sync();
  for (auto& tp : copies.v) dev->to_host(tp.first->storage.data(), tp.second, tp.first->storage.size());
  return s;
}

selscan_status_t run_fwd(Case& c, const selscan_exec_t& exec, const DeviceMemory* dev) {
  poison(c.fwd_outputs());
  if (dev == nullptr) {
    const selscan_fwd_args_t a = c.fwd_args(host_ptr);
    return selscan_fwd(&a, &exec);
  }
  DeviceCopies copies(c, *dev);
  const selscan_fwd_args_t a = c.fwd_args([&](Tensor& t) { return copies.ptr(t); });
  const selscan_status_t s = selscan_fwd(&a, &exec);
  copies.copy_back();
  return s;
}

selscan_status_t run_bwd(Case& c, const selscan_exec_t& exec, bool deterministic, const DeviceMemory* dev) {
  poison(c.bwd_outputs());
  if (dev == nullptr) {
    const selscan_bwd_args_t a = c.bwd_args(host_ptr, deterministic);
    return selscan_bwd(&a, &exec);
  }
  DeviceCopies copies(c, *dev);
  const selscan_bwd_args_t a = c.bwd_args([&](Tensor& t) { return copies.ptr(t); }, deterministic);
  const selscan_status_t s = selscan_bwd(&a, &exec);
  copies.copy_back();
  return s;
}

std::vector<double> ref_rows(const RefProblem& p, const Tensor& t, int64_t row0, int64_t t0) {
  std::vector<double> v(static_cast<size_t>(p.Bt * p.D * p.L));
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d = 0; d < p.D; ++d)
      for (int64_t l = 0; l < p.L; ++l) v[p.bdl(b, d, l)] = t.get({row0 + b, d, t0 + l});
  return v;
}

void fill_ref_inputs(RefProblem& p, const RefInputs& in, int64_t row0, int64_t t0) {
  p.G = (in.var_B || in.var_C) ? in.groups : 1;
  p.cplx = in.complex;
  p.var_B = in.var_B;
  p.var_C = in.var_C;
  p.softplus = in.softplus;
  p.has_D = in.has_D;
  p.has_z = in.has_z;
  p.has_bias = in.has_delta_bias;
  const int64_t Bt = p.Bt, D = p.D, L = p.L, N = p.N, G = p.G;
  p.u = ref_rows(p, in.u, row0, t0);
  p.delta = ref_rows(p, in.delta, row0, t0);
  if (in.has_z) p.z = ref_rows(p, in.z, row0, t0);
  p.A.resize(static_cast<size_t>(D * N));
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n) p.A[p.dn(d, n)] = in.A.getc({d, n});
  auto bc = [&](const Tensor& t, bool var, std::vector<cd>& v) {
    if (!var) {
      v.resize(static_cast<size_t>(D * N));
      for (int64_t d = 0; d < D; ++d)
        for (int64_t n = 0; n < N; ++n) v[p.dn(d, n)] = t.getc({d, n});
      return;
    }
    v.resize(static_cast<size_t>(Bt * G * N * L));
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t l = 0; l < L; ++l) {
            const int64_t r = row0 + b, k = t0 + l;  // complex: Re/Im interleaved along time
            auto at = [&](int64_t i) { return in.bc_3d ? t.get({r, n, i}) : t.get({r, g, n, i}); };
            v[p.bgnl(b, g, n, l)] = in.complex ? cd(at(2 * k), at(2 * k + 1)) : cd(at(k), 0.0);
          }
  };
  bc(in.B, in.var_B, p.B);
  bc(in.C, in.var_C, p.C);
  p.Dv.clear();
  p.bias.clear();
  if (in.has_D)
    for (int64_t d = 0; d < D; ++d) p.Dv.push_back(in.D.get({d}));
  if (in.has_delta_bias)
    for (int64_t d = 0; d < D; ++d) p.bias.push_back(in.delta_bias.get({d}));
}

RefProblem ref_problem(const Case& c) {
  const CaseSpec& s = c.spec;
  RefProblem p;
  p.Bt = s.batch;
  p.D = s.dim;
  p.L = s.seqlen;
  p.N = s.dstate;
  fill_ref_inputs(p,
                  RefInputs{c.u, c.delta, c.z, c.A, c.B, c.C, c.D, c.delta_bias, s.var_B, s.var_C, s.complex,
                            s.bc_3d, s.softplus, s.has_D, s.has_z, s.has_delta_bias, s.groups},
                  0, 0);
  p.has_h0 = s.has_h0;
  if (s.has_h0) {
    p.h0.resize(static_cast<size_t>(p.Bt * p.D * p.N));
    for (int64_t b = 0; b < p.Bt; ++b)
      for (int64_t d = 0; d < p.D; ++d)
        for (int64_t n = 0; n < p.N; ++n) p.h0[p.bdn(b, d, n)] = c.h0.getc({b, d, n});
  }
  return p;
}

std::vector<double> ref_dout(const Case& c) {
  RefProblem p;
  p.Bt = c.spec.batch, p.D = c.spec.dim, p.L = c.spec.seqlen;
  return ref_rows(p, c.dout, 0, 0);
}

namespace {
// The sizes ref_x_values / ref_x_cond need.
RefProblem sizes_of(const Case& c) {
  RefProblem p;
  p.Bt = c.spec.batch, p.D = c.spec.dim, p.L = c.spec.seqlen, p.N = c.spec.dstate, p.cplx = c.spec.complex;
  return p;
}
}  // namespace

std::vector<double> ref_x_values(const RefFwd& f, const Case& c) {
  return selscan_support::ref_x_values(f, sizes_of(c));
}

std::vector<double> ref_x_cond(const RefFwd& f, const Case& c) {
  return selscan_support::ref_x_cond(f, sizes_of(c));
}

}  // namespace selscan_test
