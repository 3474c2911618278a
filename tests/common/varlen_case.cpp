#include "varlen_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

#include "compare.h"
#include "positions.h"

namespace selscan_test {

namespace {

int64_t chunks_of(int64_t len) { return (len + 2047) / 2048; }

// The case's own states (h0 rows, pool slots): normal values from a generator of their own.
void fill_states(Tensor& t, bool cplx, std::mt19937_64& g) {
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int64_t i = 0; i < t.sizes[0]; ++i)
    for (int64_t d = 0; d < t.sizes[1]; ++d)
      for (int64_t n = 0; n < t.sizes[2]; ++n) {
        const double re = nd(g);
        t.setc({i, d, n}, cplx ? cd(re, nd(g)) : cd(re, 0.0));
      }
}

Tensor copy_of(const Tensor& t) { return t; }

}  // namespace

int64_t VarlenSpec::total() const {
  int64_t t = 0;
  for (int64_t l : lens) t += l;
  return t;
}

bool VarlenSpec::pad(int64_t b) const {
  const size_t i = static_cast<size_t>(b);
  if (block_size > 0)
    return lens[i] > 0 && block_table[i][static_cast<size_t>((ctx(b) + lens[i] - 1) / block_size)] == pad_slot_id;
  return !cache_indices.empty() && cache_indices[i] == pad_slot_id;
}

bool VarlenSpec::starts_from_state(int64_t b) const {
  if (init == InitFrom::none || pad(b)) return false;
  if (block_size > 0 && (ctx(b) <= 0 || lens[static_cast<size_t>(b)] == 0)) return false;
  return has_init.empty() || has_init[static_cast<size_t>(b)] != 0;
}

std::vector<std::pair<int64_t, int64_t>> VarlenSpec::written_blocks(int64_t b) const {
  std::vector<std::pair<int64_t, int64_t>> w;
  const int64_t l = lens[static_cast<size_t>(b)], c = ctx(b);
  if (block_size == 0 || l == 0 || pad(b)) return w;
  for (int64_t j = c / block_size; j <= (c + l - 1) / block_size; ++j) {
    const int64_t slot = block_table[static_cast<size_t>(b)][static_cast<size_t>(j)];
    if (slot != pad_slot_id) w.emplace_back(j, slot);
  }
  return w;
}

int64_t VarlenSpec::initial_slot(int64_t b) const {
  if (block_size > 0)
    return block_table[static_cast<size_t>(b)][static_cast<size_t>((ctx(b) - 1) / block_size)];
  return cache_indices.empty() ? b : cache_indices[static_cast<size_t>(b)];
}

std::string VarlenSpec::str() const {
  std::ostringstream os;
  os << (packed ? "packed lens=[" : "dense lens=[");
  for (size_t i = 0; i < lens.size(); ++i) os << (i ? "," : "") << lens[i];
  os << "] D=" << dim << " N=" << dstate << " G=" << groups << " itype=" << dtype_name(itype)
     << (complex ? " complex" : " real") << " B=" << (var_B ? "var" : "const") << " C=" << (var_C ? "var" : "const")
     << " init=" << (init == InitFrom::none ? "none" : init == InitFrom::h0 ? "h0" : "pool");
  if (!cache_indices.empty()) {
    os << " idx=[";
    for (size_t i = 0; i < cache_indices.size(); ++i) os << (i ? "," : "") << cache_indices[i];
    os << "] pad=" << pad_slot_id;
  }
  if (!has_init.empty()) {
    os << " has_init=[";
    for (size_t i = 0; i < has_init.size(); ++i) os << (i ? "," : "") << has_init[i];
    os << "]";
  }
  if (block_size > 0) {
    os << " K=" << block_size << " table=[";
    for (size_t i = 0; i < block_table.size(); ++i) {
      os << (i ? ";" : "");
      for (size_t j = 0; j < block_table[i].size(); ++j) os << (j ? "," : "") << block_table[i][j];
    }
    os << "] ctx=[";
    for (size_t i = 0; i < context_lens.size(); ++i) os << (i ? "," : "") << context_lens[i];
    os << "]";
  }
  os << " cu=" << dtype_name(cu_dtype) << " seed=" << seed;
  return os.str();
}

int64_t VarlenCase::start(int64_t b) const {
  if (!spec.packed) return 0;
  int64_t s = 0;
  for (int64_t i = 0; i < b; ++i) s += spec.lens[static_cast<size_t>(i)];
  return s;
}

std::vector<Tensor*> VarlenCase::all() {
  return {&u,   &delta, &A,  &B,  &C,      &D,     &z,          &delta_bias, &h0,  &cu_seqlens, &cache_indices,
          &has_initial_state, &block_table, &context_lens, &pool, &out, &out_z, &x, &last_state, &dout, &du, &ddelta, &dA, &dB, &dC, &dD, &dz,
          &ddelta_bias, &dh0, &bwd_h0};
}

VarlenCase make_varlen_case(const VarlenSpec& s) {
  const int64_t Bt = s.batch();
  if (Bt < 1) throw std::invalid_argument("make_varlen_case: no sequence");
  if (!s.packed)
    for (int64_t l : s.lens)
      if (l != s.lens[0]) throw std::invalid_argument("make_varlen_case: a dense batch needs equal lengths");
  VarlenCase c;
  c.spec = s;
  const int64_t rows = c.rows(), T = c.T(), D = s.dim, N = s.dstate;
  if (T < 1) throw std::invalid_argument("make_varlen_case: no token");
  CaseSpec cs;
  cs.batch = rows, cs.dim = D, cs.seqlen = T, cs.dstate = N, cs.groups = s.groups, cs.itype = s.itype;
  cs.complex = s.complex, cs.var_B = s.var_B, cs.var_C = s.var_C, cs.has_D = s.has_D, cs.has_z = s.has_z;
  cs.has_delta_bias = s.has_delta_bias, cs.softplus = s.softplus, cs.has_h0 = false, cs.with_x = false;
  cs.with_last_state = false, cs.slow_decay = s.slow_decay, cs.seed = s.seed;
  Case base = make_case(cs);
  c.u = base.u, c.delta = base.delta, c.A = base.A, c.B = base.B, c.C = base.C, c.D = base.D, c.z = base.z;
  c.delta_bias = base.delta_bias, c.dout = base.dout, c.out = base.out, c.out_z = base.out_z;
  c.du = base.du, c.ddelta = base.ddelta, c.dA = base.dA, c.dB = base.dB, c.dC = base.dC, c.dD = base.dD;
  c.dz = base.dz, c.ddelta_bias = base.ddelta_bias;

  const int32_t wt = s.complex ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  std::mt19937_64 g(s.seed * 7919 + 13);
  if (s.packed) {
    c.cu_seqlens = make_tensor(s.cu_dtype, {Bt + 1});
    int64_t acc = 0;
    for (int64_t b = 0; b <= Bt; ++b) {
      c.cu_seqlens.set({b}, static_cast<double>(acc));
      if (b < Bt) acc += s.lens[static_cast<size_t>(b)];
    }
  }
  if (!s.cache_indices.empty()) {
    c.cache_indices = make_tensor(s.idx_dtype, {Bt});
    for (int64_t b = 0; b < Bt; ++b) c.cache_indices.set({b}, static_cast<double>(s.cache_indices[static_cast<size_t>(b)]));
  }
  if (!s.has_init.empty()) {
    c.has_initial_state = make_tensor(s.init_dtype, {Bt});
    for (int64_t b = 0; b < Bt; ++b) c.has_initial_state.set({b}, s.has_init[static_cast<size_t>(b)]);
  }
  if (s.block_size > 0) {
    if (static_cast<int64_t>(s.block_table.size()) != Bt || s.block_table[0].empty())
      throw std::invalid_argument("make_varlen_case: block_table needs one non-empty row per sequence");
    const int64_t M = static_cast<int64_t>(s.block_table[0].size());
    c.block_table = make_tensor(s.table_dtype, {Bt, M});
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t j = 0; j < M; ++j)
        c.block_table.set({b, j}, static_cast<double>(s.block_table[static_cast<size_t>(b)].at(static_cast<size_t>(j))));
    if (!s.context_lens.empty()) {
      c.context_lens = make_tensor(s.ctx_dtype, {Bt});
      for (int64_t b = 0; b < Bt; ++b) c.context_lens.set({b}, static_cast<double>(s.ctx(b)));
    }
  }
  if (s.init == InitFrom::h0) {
    c.h0 = make_tensor(wt, {Bt, D, N});
    fill_states(c.h0, s.complex, g);
    c.bwd_h0 = copy_of(c.h0);
  }
  if (s.init == InitFrom::pool) {
    c.pool = make_tensor(wt, {s.slots, D, N});
    fill_states(c.pool, s.complex, g);
    c.pool_in = copy_of(c.pool);
    // The backward's h0: each sequence's slot (random rows where it reads none).
    c.bwd_h0 = make_tensor(wt, {Bt, D, N});
    fill_states(c.bwd_h0, s.complex, g);
    for (int64_t b = 0; b < Bt; ++b) {
      if (s.pad(b) || (s.block_size > 0 && !s.starts_from_state(b))) continue;
      const int64_t slot = s.initial_slot(b);
      if (slot < 0 || slot >= s.slots) continue;  // a bad entry (the GPU tests' NaN cases)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t n = 0; n < N; ++n) c.bwd_h0.setc({b, d, n}, c.pool.getc({slot, d, n}));
    }
  }
  const int64_t nc = s.packed ? T / 2048 + Bt : chunks_of(T);
  if (s.with_x) c.x = make_tensor(wt, {rows, D, nc, 2 * N}, {}, kPoison);
  if (s.with_last_state && s.init != InitFrom::pool) c.last_state = make_tensor(wt, {Bt, D, N}, {}, kPoison);
  if (s.init != InitFrom::none && s.with_dh0) c.dh0 = make_tensor(wt, {Bt, D, N}, {}, kPoison);
  return c;
}

VarlenSpec long_sequences_spec(int64_t dstate) {
  VarlenSpec s;
  s.lens = {700, 2500, 0, 4097, 3};
  s.dim = 16, s.dstate = dstate, s.groups = 1, s.init = InitFrom::h0, s.slow_decay = true, s.seed = 10 + dstate;
  return s;
}

selscan_fwd_args_t VarlenCase::fwd_args(const Case::PtrMap& ptr) {
  auto d = [&](Tensor& t) { return t.present() ? t.desc(ptr(t)) : t.desc(nullptr); };
  selscan_fwd_args_t a = SELSCAN_FWD_ARGS_INIT;
  a.u = d(u), a.delta = d(delta), a.A = d(A), a.B = d(B), a.C = d(C), a.D = d(D), a.z = d(z);
  a.delta_bias = d(delta_bias), a.h0 = d(h0);
  a.delta_softplus = spec.softplus ? 1 : 0;
  a.out = d(out), a.out_z = d(out_z), a.x = d(x), a.last_state = d(last_state);
  a.cu_seqlens = d(cu_seqlens), a.ssm_states = d(pool), a.cache_indices = d(cache_indices);
  a.has_initial_state = d(has_initial_state);
  a.pad_slot_id = spec.cache_indices.empty() && spec.block_size == 0 ? 0 : spec.pad_slot_id;
  a.state_block_size = spec.block_size;
  a.block_table = d(block_table), a.context_lens = d(context_lens);
  return a;
}

selscan_bwd_args_t VarlenCase::bwd_args(const Case::PtrMap& ptr, bool deterministic) {
  auto d = [&](Tensor& t) { return t.present() ? t.desc(ptr(t)) : t.desc(nullptr); };
  selscan_bwd_args_t a = SELSCAN_BWD_ARGS_INIT;
  a.u = d(u), a.delta = d(delta), a.A = d(A), a.B = d(B), a.C = d(C), a.D = d(D), a.z = d(z);
  a.delta_bias = d(delta_bias), a.h0 = d(bwd_h0);
  a.delta_softplus = spec.softplus ? 1 : 0;
  a.deterministic = deterministic ? 1 : 0;
  a.dout = d(dout), a.x = d(x);
  Tensor none;
  a.out = spec.has_z ? d(out) : d(none);
  a.du = d(du), a.ddelta = d(ddelta), a.dA = d(dA), a.dB = d(dB), a.dC = d(dC), a.dD = d(dD), a.dz = d(dz);
  a.ddelta_bias = d(ddelta_bias), a.dh0 = d(dh0);
  a.cu_seqlens = d(cu_seqlens), a.cache_indices = d(cache_indices), a.has_initial_state = d(has_initial_state);
  a.pad_slot_id = spec.cache_indices.empty() ? 0 : spec.pad_slot_id;
  return a;
}

namespace {

// Runs `call` on host pointers, or on device copies of every present tensor (all copied back).
template <class Call>
selscan_status_t run_on(VarlenCase& c, const DeviceMemory* dev, Call call) {
  if (dev == nullptr) return call(Case::PtrMap(host_ptr));
  std::vector<std::pair<Tensor*, void*>> copies;
  for (Tensor* t : c.all()) {
    if (!t->present()) continue;
    void* p = dev->alloc(t->storage.size());
    if (p == nullptr) throw std::runtime_error("DeviceMemory::alloc returned NULL");
    dev->to_device(p, t->storage.data(), t->storage.size());
    copies.emplace_back(t, p);
  }
  const selscan_status_t s = call(Case::PtrMap([&](Tensor& t) -> void* {
    for (auto& tp : copies)
      if (tp.first == &t) return tp.second;
    return nullptr;
  }));
  dev->sync();
  for (auto& tp : copies) dev->to_host(tp.first->storage.data(), tp.second, tp.first->storage.size());
  for (auto& tp : copies) dev->release(tp.second);
  return s;
}

}  // namespace

selscan_status_t run_varlen_fwd(VarlenCase& c, const selscan_exec_t& exec, const DeviceMemory* dev) {
  poison({&c.out, &c.out_z, &c.x, &c.last_state});
  if (c.pool.present()) c.pool = copy_of(c.pool_in);
  return run_on(c, dev, [&](const Case::PtrMap& ptr) {
    const selscan_fwd_args_t a = c.fwd_args(ptr);
    return selscan_fwd(&a, &exec);
  });
}

selscan_status_t run_varlen_bwd(VarlenCase& c, const selscan_exec_t& exec, bool deterministic,
                                const DeviceMemory* dev) {
  poison({&c.du, &c.ddelta, &c.dA, &c.dB, &c.dC, &c.dD, &c.dz, &c.ddelta_bias, &c.dh0});
  return run_on(c, dev, [&](const Case::PtrMap& ptr) -> selscan_status_t {
    const selscan_bwd_args_t a = c.bwd_args(ptr, deterministic);
    size_t ws = 0;
    if (const selscan_status_t s = selscan_bwd_workspace_size(&a, &exec, &ws); s != SELSCAN_STATUS_SUCCESS) return s;
    if (ws == 0) return selscan_bwd(&a, &exec);
    if (dev == nullptr) throw std::runtime_error("run_varlen_bwd: a host call asked for workspace");
    selscan_exec_t e = exec;  // the workspace on exec's device
    e.workspace = dev->alloc(ws);
    e.workspace_bytes = ws;
    const selscan_status_t s = selscan_bwd(&a, &e);
    dev->sync();
    dev->release(e.workspace);
    return s;
  });
}

namespace {

// Sequence b's RefProblem (batch 1) from the case's stored inputs, and its dout.
// `len` >= 0: only its first len tokens (a block boundary's state is the final state of that prefix).
RefProblem seq_ref(const VarlenCase& c, int64_t b, std::vector<double>* dout, int64_t len = -1) {
  const VarlenSpec& s = c.spec;
  RefProblem p;
  const int64_t row = s.packed ? 0 : b, t0 = c.start(b);
  p.Bt = 1, p.D = s.dim, p.L = len >= 0 ? len : s.lens[static_cast<size_t>(b)], p.N = s.dstate;
  fill_ref_inputs(p,
                  RefInputs{c.u, c.delta, c.z, c.A, c.B, c.C, c.D, c.delta_bias, s.var_B, s.var_C, s.complex, false,
                            s.softplus, s.has_D, s.has_z, s.has_delta_bias, s.groups},
                  row, t0);
  if (dout) *dout = ref_rows(p, c.dout, row, t0);
  p.has_h0 = s.starts_from_state(b);
  if (p.has_h0) {
    const Tensor& src = s.init == InitFrom::h0 ? c.h0 : c.pool_in;
    const int64_t r = s.init == InitFrom::h0 ? b : s.initial_slot(b);
    for (int64_t d = 0; d < p.D; ++d)
      for (int64_t n = 0; n < p.N; ++n) p.h0.push_back(src.getc({r, d, n}));
  }
  return p;
}

void put(std::vector<double>& v, int64_t i, cd x, bool cplx) {
  if (cplx) {
    v[static_cast<size_t>(2 * i)] = x.real();
    v[static_cast<size_t>(2 * i + 1)] = x.imag();
  } else {
    v[static_cast<size_t>(i)] = x.real();
  }
}
void add(std::vector<double>& v, int64_t i, cd x, bool cplx) {
  if (cplx) {
    v[static_cast<size_t>(2 * i)] += x.real();
    v[static_cast<size_t>(2 * i + 1)] += x.imag();
  } else {
    v[static_cast<size_t>(i)] += x.real();
  }
}

}  // namespace

RefProblem sequence_problem(const VarlenCase& c, int64_t b, std::vector<double>* dout) { return seq_ref(c, b, dout); }

std::vector<std::pair<std::string, std::vector<double>>> varlen_reduced(const VarlenCase& c) {
  std::vector<std::pair<std::string, std::vector<double>>> v = {
      {"dA", c.dA.values()}, {"dB", c.dB.values()}, {"dC", c.dC.values()}};
  if (c.spec.has_D) v.emplace_back("dD", c.dD.values());
  if (c.spec.has_delta_bias) v.emplace_back("ddelta_bias", c.ddelta_bias.values());
  return v;
}

std::vector<double> varlen_reduced_ref(const VarlenCase& c, const VarlenRef& r, const std::string& name) {
  const VarlenSpec& s = c.spec;
  if (name == "dA") return r.dA;
  if (name == "dB") return s.var_B ? round_to(r.dB, s.itype) : r.dB;
  if (name == "dC") return s.var_C ? round_to(r.dC, s.itype) : r.dC;
  if (name == "dD") return r.dD;
  if (name == "ddelta_bias") return r.ddelta_bias;
  throw std::invalid_argument("varlen_reduced_ref: not a reduced gradient: " + name);
}

std::vector<double> varlen_reduced_bound(const VarlenRef& r, const std::string& name, double scale) {
  const std::vector<double>& cond = name == "dA"   ? r.cond_dA
                                    : name == "dB" ? r.cond_dB
                                    : name == "dC" ? r.cond_dC
                                    : name == "dD" ? r.cond_dD
                                                   : r.cond_ddelta_bias;
  if (name != "dA" && name != "dB" && name != "dC" && name != "dD" && name != "ddelta_bias")
    throw std::invalid_argument("varlen_reduced_bound: not a reduced gradient: " + name);
  return cond_bound(cond, scale);
}

::testing::AssertionResult varlen_reduced_close(const VarlenCase& c, const VarlenRef& r, const std::string& name,
                                                const std::vector<double>& got, double tol_scale) {
  const VarlenSpec& s = c.spec;
  const Tol t = tol_of(upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C), name).scaled(tol_scale, tol_scale);
  const std::vector<double> bound = varlen_reduced_bound(r, name, tol_scale);
  return allclose(s.str() + " " + name, got, varlen_reduced_ref(c, r, name), t, &bound);
}

VarlenRef varlen_reference(const VarlenCase& c) {
  const VarlenSpec& s = c.spec;
  const int64_t Bt = s.batch(), D = s.dim, N = s.dstate, T = c.T(), rows = c.rows(), cw = s.complex ? 2 : 1;
  const int64_t G = (s.var_B || s.var_C) ? s.groups : 1;
  VarlenRef r;
  r.out.assign(static_cast<size_t>(rows * D * T), 0.0);
  if (s.has_z) r.out_z = r.out;
  r.du = r.ddelta = r.out;
  if (s.has_z) r.dz = r.out;
  r.last_state.assign(static_cast<size_t>(Bt * D * N * cw), 0.0);
  r.dh0 = r.last_state;
  if (c.pool.present()) r.pool = c.pool_in.values();
  r.dA.assign(static_cast<size_t>(D * N * cw), 0.0);
  r.dB.assign(static_cast<size_t>(c.dB.numel() * (c.dB.dtype == SELSCAN_DTYPE_COMPLEX64 ? 2 : 1)), 0.0);
  r.dC.assign(static_cast<size_t>(c.dC.numel() * (c.dC.dtype == SELSCAN_DTYPE_COMPLEX64 ? 2 : 1)), 0.0);
  r.dD.assign(static_cast<size_t>(D), 0.0);
  r.ddelta_bias.assign(static_cast<size_t>(D), 0.0);
  r.cond_du = r.cond_ddelta = r.du;
  if (s.has_z) r.cond_dz = r.dz;
  r.cond_dh0 = r.dh0, r.cond_dA = r.dA, r.cond_dB = r.dB, r.cond_dC = r.dC, r.cond_dD = r.dD;
  r.cond_ddelta_bias = r.ddelta_bias;
  if (c.x.present()) {
    r.x.assign(static_cast<size_t>(c.x.numel() * cw), 0.0);
    r.x_mask.assign(r.x.size(), 0);
  }
  for (int64_t b = 0; b < Bt; ++b) {
    if (s.pad(b)) continue;  // all zero; its slot (if any) untouched
    if (s.block_size > 0 && s.lens[static_cast<size_t>(b)] == 0) continue;  // block mode: nothing read or written
    std::vector<double> dout;
    const RefProblem p = seq_ref(c, b, &dout);
    const RefFwd f = ref_forward(p);
    // A zero-length sequence has no terms (its dh0 is exactly 0): condition scales 0.
    const bool cond = p.L > 0;
    RefBwd gr = ref_backward(p, dout, cond);
    if (!cond) {
      gr.cond_dA.assign(gr.dA.size(), 0.0), gr.cond_dB.assign(gr.dB.size(), 0.0);
      gr.cond_dC.assign(gr.dC.size(), 0.0), gr.cond_dD.assign(gr.dD.size(), 0.0);
      gr.cond_dbias.assign(gr.dbias.size(), 0.0), gr.cond_dh0.assign(gr.dh0.size(), 0.0);
    }
    const int64_t L = p.L, t0 = c.start(b), row = s.packed ? 0 : b;
    for (int64_t d = 0; d < D; ++d)
      for (int64_t l = 0; l < L; ++l) {
        const size_t i = static_cast<size_t>((row * D + d) * T + t0 + l), k = static_cast<size_t>(p.bdl(0, d, l));
        r.out[i] = f.y[k];
        if (s.has_z) r.out_z[i] = f.out_z[k], r.dz[i] = gr.dz[k];
        r.du[i] = gr.du[k];
        r.ddelta[i] = gr.ddelta[k];
        r.cond_du[i] = gr.cond_du[k];
        r.cond_ddelta[i] = gr.cond_ddelta[k];
        if (s.has_z) r.cond_dz[i] = gr.cond_dz[k];
      }
    const int64_t slot = s.block_size > 0 ? -1 : s.cache_indices.empty() ? b : s.cache_indices[static_cast<size_t>(b)];
    // Block mode: each block's state is the final state of the prefix ending at the block's end (or at the
    // sequence's end for the last block).
    const auto blocks = s.written_blocks(b);
    for (const auto& [j, bslot] : blocks) {
      const int64_t m = std::min(L, (j + 1) * s.block_size - s.ctx(b));
      const RefFwd fm = m == L ? f : ref_forward(seq_ref(c, b, nullptr, m));
      for (int64_t d = 0; d < D; ++d)
        for (int64_t n = 0; n < N; ++n)
          put(r.pool, (bslot * D + d) * N + n, fm.last_state[static_cast<size_t>(p.bdn(0, d, n))], s.complex);
    }
    for (int64_t d = 0; d < D; ++d)
      for (int64_t n = 0; n < N; ++n) {
        const cd h = f.last_state[static_cast<size_t>(p.bdn(0, d, n))];
        put(r.last_state, (b * D + d) * N + n, h, s.complex);
        if (c.pool.present() && slot >= 0) put(r.pool, (slot * D + d) * N + n, h, s.complex);
        const size_t bdn = static_cast<size_t>(p.bdn(0, d, n)), dn = static_cast<size_t>(p.dn(d, n));
        if (p.has_h0) {
          put(r.dh0, (b * D + d) * N + n, gr.dh0[bdn], s.complex);
          put(r.cond_dh0, (b * D + d) * N + n, cd(gr.cond_dh0[bdn], gr.cond_dh0[bdn]), s.complex);
        }
        add(r.dA, d * N + n, gr.dA[dn], s.complex);
        add(r.cond_dA, d * N + n, cd(gr.cond_dA[dn], gr.cond_dA[dn]), s.complex);
        if (!s.var_B) {
          add(r.dB, d * N + n, gr.dB[dn], s.complex);
          add(r.cond_dB, d * N + n, cd(gr.cond_dB[dn], gr.cond_dB[dn]), s.complex);
        }
        if (!s.var_C) {
          add(r.dC, d * N + n, gr.dC[dn], s.complex);
          add(r.cond_dC, d * N + n, cd(gr.cond_dC[dn], gr.cond_dC[dn]), s.complex);
        }
        // Chunk states: the true state (serving calls never fold B).
        if (c.x.present())
          for (int64_t ch = 0; ch < chunks_of(L); ++ch) {
            const size_t i = static_cast<size_t>((d * chunks_of(L) + ch) * N + n);  // RefFwd's (1, D, nc, N)
            const cd P = f.xP[i];
            cd H = f.xH[i];
            if (p.fold_B()) H *= p.B[static_cast<size_t>(p.dn(d, n))];
            // docs/serving.md: chunk ch of sequence b at slot floor(start / 2048) + b + ch.
            const int64_t slot_c = (s.packed ? t0 / 2048 + b : 0) + ch;
            const int64_t base = ((row * D + d) * c.x.sizes[2] + slot_c) * 2 * N;
            put(r.x, base + 2 * n, P, s.complex);
            put(r.x, base + 2 * n + 1, H, s.complex);
            for (int64_t k = 0; k < cw; ++k) {
              r.x_mask[static_cast<size_t>((base + 2 * n) * cw + k)] = 1;
              r.x_mask[static_cast<size_t>((base + 2 * n + 1) * cw + k)] = 1;
            }
          }
      }
    for (int64_t d = 0; d < D; ++d) {
      const size_t i = static_cast<size_t>(d);
      r.dD[i] += s.has_D ? gr.dD[i] : 0.0;
      r.ddelta_bias[i] += s.has_delta_bias ? gr.dbias[i] : 0.0;
      r.cond_dD[i] += s.has_D ? gr.cond_dD[i] : 0.0;
      r.cond_ddelta_bias[i] += s.has_delta_bias ? gr.cond_dbias[i] : 0.0;
    }
    auto var_grad = [&](bool var, const std::vector<cd>& src, const std::vector<double>& cond,
                        std::vector<double>& dst, std::vector<double>& dst_cond) {
      if (!var) return;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t l = 0; l < L; ++l) {
            const int64_t i = ((row * G + g) * N + n) * T + t0 + l;
            const size_t k = static_cast<size_t>(p.bgnl(0, g, n, l));
            put(dst, i, src[k], s.complex);
            put(dst_cond, i, cd(cond[k], cond[k]), s.complex);
          }
    };
    var_grad(s.var_B, gr.dB, gr.cond_dB, r.dB, r.cond_dB);
    var_grad(s.var_C, gr.dC, gr.cond_dC, r.dC, r.cond_dC);
  }
  return r;
}

void copy_sequence_inputs(const VarlenCase& src, int64_t src_b, int64_t from, VarlenCase& dst, int64_t dst_b) {
  const VarlenSpec& s = dst.spec;
  const int64_t sr = src.spec.packed ? 0 : src_b, dr = s.packed ? 0 : dst_b;
  for (int64_t d = 0; d < s.dim; ++d)
    for (int64_t l = 0; l < s.lens[static_cast<size_t>(dst_b)]; ++l) {
      const int64_t a = src.start(src_b) + from + l, e = dst.start(dst_b) + l;
      dst.u.set({dr, d, e}, src.u.get({sr, d, a}));
      dst.delta.set({dr, d, e}, src.delta.get({sr, d, a}));
      if (s.has_z) dst.z.set({dr, d, e}, src.z.get({sr, d, a}));
      for (int64_t g = 0; g < s.groups; ++g)
        for (int64_t n = 0; n < s.dstate; ++n) {
          if (s.var_B) dst.B.set({dr, g, n, e}, src.B.get({sr, g, n, a}));
          if (s.var_C) dst.C.set({dr, g, n, e}, src.C.get({sr, g, n, a}));
        }
    }
  dst.A = src.A, dst.D = src.D, dst.delta_bias = src.delta_bias;
  if (!s.var_B) dst.B = src.B;
  if (!s.var_C) dst.C = src.C;
}

Case sequence_case(const VarlenCase& c, int64_t b) {
  const VarlenSpec& s = c.spec;
  const int64_t L = s.lens[static_cast<size_t>(b)];
  if (L < 1) throw std::invalid_argument("sequence_case: an empty sequence has no dense call");
  CaseSpec cs;
  cs.batch = 1, cs.dim = s.dim, cs.seqlen = L, cs.dstate = s.dstate, cs.groups = s.groups, cs.itype = s.itype;
  cs.complex = s.complex, cs.var_B = s.var_B, cs.var_C = s.var_C, cs.has_D = s.has_D, cs.has_z = s.has_z;
  cs.has_delta_bias = s.has_delta_bias, cs.softplus = s.softplus, cs.has_h0 = s.starts_from_state(b);
  cs.with_x = true, cs.with_last_state = true, cs.with_dh0 = true, cs.seed = s.seed;
  Case k = make_case(cs);
  std::vector<double> dout;
  const RefProblem p = seq_ref(c, b, &dout);
  const int64_t D = s.dim, N = s.dstate, G = p.G;
  for (int64_t d = 0; d < D; ++d)
    for (int64_t l = 0; l < L; ++l) {
      const size_t i = static_cast<size_t>(p.bdl(0, d, l));
      k.u.set({0, d, l}, p.u[i]);
      k.delta.set({0, d, l}, p.delta[i]);
      if (s.has_z) k.z.set({0, d, l}, p.z[i]);
      k.dout.set({0, d, l}, dout[i]);
    }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n) {
      k.A.setc({d, n}, p.A[static_cast<size_t>(p.dn(d, n))]);
      if (!s.var_B) k.B.setc({d, n}, p.B[static_cast<size_t>(p.dn(d, n))]);
      if (!s.var_C) k.C.setc({d, n}, p.C[static_cast<size_t>(p.dn(d, n))]);
      if (p.has_h0) k.h0.setc({0, d, n}, p.h0[static_cast<size_t>(p.bdn(0, d, n))]);
    }
  auto var = [&](bool v, const std::vector<cd>& src, Tensor& t) {
    if (!v) return;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l) {
          const cd x = src[static_cast<size_t>(p.bgnl(0, g, n, l))];
          if (s.complex) {
            t.set({0, g, n, 2 * l}, x.real());
            t.set({0, g, n, 2 * l + 1}, x.imag());
          } else {
            t.set({0, g, n, l}, x.real());
          }
        }
  };
  var(s.var_B, p.B, k.B);
  var(s.var_C, p.C, k.C);
  for (int64_t d = 0; d < D; ++d) {
    if (s.has_D) k.D.set({d}, p.Dv[static_cast<size_t>(d)]);
    if (s.has_delta_bias) k.delta_bias.set({d}, p.bias[static_cast<size_t>(d)]);
  }
  return k;
}

void check_varlen(VarlenCase& c, const VarlenRef& r, bool bwd, double tol_scale) {
  const VarlenSpec& s = c.spec;
  const Tolerances t = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  auto sc = [&](Tol x) { return x.scaled(tol_scale, tol_scale); };
  const std::string what = s.str();
  EXPECT_TRUE(allclose(what + " out", c.out.values(), r.out, sc(t.out)));
  if (s.has_z) EXPECT_TRUE(allclose(what + " out_z", c.out_z.values(), r.out_z, sc(t.out)));
  for (Tensor* o : {&c.out, &c.out_z, &c.last_state}) {
    if (!o->present()) continue;
    const std::string e = o->check_written(kPoison, kPoison);
    EXPECT_TRUE(e.empty()) << what << ": " << e;
  }
  if (c.last_state.present())
    EXPECT_TRUE(allclose(what + " last_state", c.last_state.values(), r.last_state, sc(t.last_state)));
  if (c.pool.present()) {
    // Slots no sequence names: bit for bit as before. Named ones: the final states.
    const std::vector<double> got = c.pool.values(), before = c.pool_in.values();
    std::vector<char> named(static_cast<size_t>(s.slots), 0);
    for (int64_t b = 0; b < s.batch(); ++b) {
      if (s.block_size > 0) {
        for (const auto& jb : s.written_blocks(b)) named[static_cast<size_t>(jb.second)] = 1;
      } else if (!s.pad(b)) {
        named[static_cast<size_t>(s.cache_indices.empty() ? b : s.cache_indices[static_cast<size_t>(b)])] = 1;
      }
    }
    const size_t per_slot = got.size() / static_cast<size_t>(s.slots);
    for (size_t i = 0; i < got.size(); ++i)
      if (!named[i / per_slot])
        EXPECT_EQ(std::memcmp(&got[i], &before[i], sizeof(double)), 0) << what << ": unnamed slot " << i / per_slot
                                                                        << " changed at " << i;
    EXPECT_TRUE(allclose(what + " ssm_states", got, r.pool, sc(t.last_state)));
    EXPECT_TRUE(c.pool.check_guards(kGuard).empty()) << what << ": " << c.pool.check_guards(kGuard);
  }
  if (c.x.present()) {
    const std::vector<double> got = c.x.values();
    std::vector<double> g2, r2;
    for (size_t i = 0; i < got.size(); ++i)
      if (r.x_mask[i]) g2.push_back(got[i]), r2.push_back(r.x[i]);
    EXPECT_TRUE(allclose(what + " x", g2, r2, sc(t.x)));
    EXPECT_TRUE(c.x.check_guards(kPoison).empty()) << what << ": " << c.x.check_guards(kPoison);
  }
  if (!bwd) return;
  for (Tensor* o : {&c.du, &c.ddelta, &c.dA, &c.dB, &c.dC, &c.dD, &c.dz, &c.ddelta_bias, &c.dh0}) {
    if (!o->present()) continue;
    const std::string e = o->check_written(kPoison, kPoison);
    EXPECT_TRUE(e.empty()) << what << ": " << e;
  }
  EXPECT_TRUE(allclose(what + " du", c.du.values(), round_to(r.du, s.itype), sc(t.du)));
  EXPECT_TRUE(allclose(what + " ddelta", c.ddelta.values(), round_to(r.ddelta, s.itype), sc(t.ddelta)));
  if (s.has_z) EXPECT_TRUE(allclose(what + " dz", c.dz.values(), round_to(r.dz, s.itype), sc(t.dz)));
  // The reduced gradients sum thousands of terms over long sequences: upstream's tolerance, or k u cond where
  // larger (docs/numerics.md, "Reduced gradients of packed calls").
  for (const auto& [name, got] : varlen_reduced(c)) EXPECT_TRUE(varlen_reduced_close(c, r, name, got, tol_scale));
  if (c.dh0.present()) EXPECT_TRUE(allclose(what + " dh0", c.dh0.values(), r.dh0, sc(t.dh0)));
}

}  // namespace selscan_test
