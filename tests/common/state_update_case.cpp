#include "state_update_case.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "compare.h"

namespace selscan_test {
namespace {

int64_t idx_esize(int32_t dtype) { return dtype == SELSCAN_DTYPE_INT64 ? 8 : 4; }

// C order, or (padded) C order with 3 elements of padding after every dim but the outermost.
Tensor laid_out(int32_t dtype, const std::vector<int64_t>& sizes, bool padded) {
  if (!padded) return make_tensor(dtype, sizes);
  Layout l;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    l.order.push_back(i);
    l.pad.push_back(3);
  }
  return make_tensor(dtype, sizes, l);
}

// Every multi-index of `sizes` in C order.
template <class F>
void for_each_index(const std::vector<int64_t>& sizes, F&& f) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<int64_t> idx(sizes.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    f(idx);
    for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
      if (++idx[static_cast<size_t>(i)] < sizes[static_cast<size_t>(i)]) break;
      idx[static_cast<size_t>(i)] = 0;
    }
  }
}

template <class Gen>
void fill(Tensor& t, Gen&& gen) {
  if (t.present()) for_each_index(t.sizes, [&](const std::vector<int64_t>& i) { t.set(i, gen()); });
}

// Index builders of the two forms.
struct Idx {
  bool heads, tdim, gdim;
  std::vector<int64_t> io(int64_t b, int64_t t, int64_t h, int64_t p) const {  // x, dt, z, out
    std::vector<int64_t> v{b};
    if (tdim) v.push_back(t);
    v.push_back(h);
    if (heads) v.push_back(p);
    return v;
  }
  std::vector<int64_t> ch(int64_t h, int64_t p) const {  // D, dt_bias
    return heads ? std::vector<int64_t>{h, p} : std::vector<int64_t>{h};
  }
  std::vector<int64_t> a(int64_t h, int64_t p, int64_t n) const {
    return heads ? std::vector<int64_t>{h, p, n} : std::vector<int64_t>{h, n};
  }
  std::vector<int64_t> bc(int64_t b, int64_t t, int64_t g, int64_t n) const {
    std::vector<int64_t> v{b};
    if (tdim) v.push_back(t);
    if (gdim) v.push_back(g);
    v.push_back(n);
    return v;
  }
  std::vector<int64_t> st(int64_t s, int64_t h, int64_t p, int64_t n) const {
    return heads ? std::vector<int64_t>{s, h, p, n} : std::vector<int64_t>{s, h, n};
  }
};

Idx idx_of(const StateUpdateSpec& s) {
  return Idx{s.heads, s.tokens_dim || s.tokens > 1, s.groups_dim || s.groups > 1};
}

selscan_tensor_t desc_at(const Tensor& t, const Case::PtrMap& ptr) {
  return t.present() ? t.desc(ptr(const_cast<Tensor&>(t))) : selscan_tensor_t{};
}

}  // namespace

std::string StateUpdateSpec::str() const {
  std::ostringstream os;
  os << (heads ? "heads" : "mamba1") << " Bt=" << batch << " T=" << tokens << (tokens_dim ? "(dim)" : "")
     << " H=" << nheads << " P=" << (heads ? headdim : 1) << " N=" << dstate << " G=" << groups
     << (groups_dim ? "(dim)" : "") << " x=" << dtype_name(itype) << " state=" << dtype_name(state_dtype)
     << (has_D ? " D" : "") << (has_z ? " z" : "") << (has_bias ? " bias" : "") << (softplus ? " softplus" : "")
     << " pool=" << pool << (pool > 0 ? (idx_dtype == SELSCAN_DTYPE_INT64 ? "(i64)" : "(i32)") : "")
     << (dst.empty() ? "" : " dst")
     << (broadcast ? " broadcast" : "") << (padded ? " padded" : "") << " seed=" << seed;
  return os.str();
}

int64_t StateUpdateCase::slot_of(int64_t b) const {
  if (spec.pool == 0) return b;
  const int64_t v = indices[static_cast<size_t>(b)];
  if (v == spec.pad_slot) return -1;
  if (v < 0 || v >= spec.pool) return -2;
  if (!spec.dst.empty()) {
    const int64_t d = spec.dst[static_cast<size_t>(b)];
    if (d != spec.pad_slot && (d < 0 || d >= spec.pool)) return -2;
  }
  return v;
}

int64_t StateUpdateCase::dst_of(int64_t b) const {
  const int64_t src = slot_of(b);
  if (src < 0 || spec.dst.empty()) return src < 0 ? -1 : src;
  const int64_t d = spec.dst[static_cast<size_t>(b)];
  return d == spec.pad_slot ? -1 : d;
}

std::vector<Tensor*> StateUpdateCase::tensors() {
  std::vector<Tensor*> v;
  for (Tensor* t : {&x, &dt, &A, &B, &C, &D, &z, &dt_bias, &state, &out})
    if (t->present()) v.push_back(t);
  return v;
}

selscan_state_update_args_t StateUpdateCase::args(const Case::PtrMap& ptr, void* idx, void* dst) {
  selscan_state_update_args_t a = SELSCAN_STATE_UPDATE_ARGS_INIT;
  a.x = desc_at(x, ptr);
  a.dt = desc_at(dt, ptr);
  a.A = desc_at(A, ptr);
  a.B = desc_at(B, ptr);
  a.C = desc_at(C, ptr);
  a.D = desc_at(D, ptr);
  a.z = desc_at(z, ptr);
  a.dt_bias = desc_at(dt_bias, ptr);
  a.state = desc_at(state, ptr);
  a.out = desc_at(out, ptr);
  if (!idx_storage.empty()) {
    selscan_tensor_t& t = a.state_batch_indices;
    t.data = idx;
    t.dtype = spec.idx_dtype;
    t.ndim = 1;
    t.sizes[0] = spec.batch;
    t.strides[0] = spec.idx_stride;
    if (!dst_storage.empty()) {
      a.dst_state_batch_indices = t;
      a.dst_state_batch_indices.data = dst;
    }
  }
  a.pad_slot_id = spec.pad_slot;
  a.dt_softplus = spec.softplus ? 1 : 0;
  return a;
}

StateUpdateCase make_state_update_case(const StateUpdateSpec& spec_in) {
  StateUpdateCase c;
  StateUpdateSpec& s = c.spec;
  s = spec_in;
  if (!s.heads) s.headdim = 1;
  s.tokens_dim = s.tokens_dim || s.tokens > 1;
  s.groups_dim = s.groups_dim || s.groups > 1;
  const int64_t Bt = s.batch, T = s.tokens, H = s.nheads, P = s.headdim, N = s.dstate, G = s.groups;
  const int32_t it = s.itype;
  auto pick = [&](int32_t d) { return d < 0 ? it : d; };

  std::vector<int64_t> io{Bt};
  if (s.tokens_dim) io.push_back(T);
  io.push_back(H);
  if (s.heads) io.push_back(P);
  std::vector<int64_t> bc{Bt};
  if (s.tokens_dim) bc.push_back(T);
  if (s.groups_dim) bc.push_back(G);
  bc.push_back(N);
  const std::vector<int64_t> ch = s.heads ? std::vector<int64_t>{H, P} : std::vector<int64_t>{H};
  const std::vector<int64_t> an = s.heads ? std::vector<int64_t>{H, P, N} : std::vector<int64_t>{H, N};
  std::vector<int64_t> st = s.heads ? std::vector<int64_t>{c.slots(), H, P, N} : std::vector<int64_t>{c.slots(), H, N};

  c.x = laid_out(it, io, s.padded);
  c.z = s.has_z ? laid_out(pick(s.z_dtype), io, s.padded) : Tensor{};
  c.out = laid_out(it, io, s.padded);
  c.B = laid_out(pick(s.bc_dtype), bc, s.padded);
  c.C = laid_out(pick(s.bc_dtype), bc, s.padded);
  c.state = laid_out(s.state_dtype, st, s.padded);
  if (s.broadcast) {
    // dt: the io shape with stride 0 over P (heads form); A: one value per head (channel).
    std::vector<int64_t> dts = contiguous_strides(io);
    if (s.heads) {
      std::vector<int64_t> lead(io.begin(), io.end() - 1);
      dts = contiguous_strides(lead);
      dts.push_back(0);
    }
    c.dt = make_strided(pick(s.dt_dtype), io, dts);
    c.A = s.heads ? make_strided(SELSCAN_DTYPE_FLOAT32, an, {1, 0, 0})
                  : make_strided(SELSCAN_DTYPE_FLOAT32, an, {1, 0});
    const std::vector<int64_t> chs = s.heads ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{1};
    if (s.has_D) c.D = make_strided(SELSCAN_DTYPE_FLOAT32, ch, chs);
    if (s.has_bias) c.dt_bias = make_strided(SELSCAN_DTYPE_FLOAT32, ch, chs);
  } else {
    c.dt = laid_out(pick(s.dt_dtype), io, s.padded);
    c.A = laid_out(SELSCAN_DTYPE_FLOAT32, an, s.padded);
    if (s.has_D) c.D = laid_out(SELSCAN_DTYPE_FLOAT32, ch, s.padded);
    if (s.has_bias) c.dt_bias = laid_out(SELSCAN_DTYPE_FLOAT32, ch, s.padded);
  }

  // Values as upstream's test: randn state, x, B, C, D, z; A = -rand - 1; with softplus dt randn and
  // dt_bias = rand - 4, without it small positive steps.
  std::mt19937_64 g(s.seed);
  std::normal_distribution<double> randn;
  std::uniform_real_distribution<double> rand01;
  fill(c.state, [&] { return randn(g); });
  fill(c.x, [&] { return randn(g); });
  fill(c.B, [&] { return randn(g); });
  fill(c.C, [&] { return randn(g); });
  fill(c.D, [&] { return randn(g); });
  fill(c.z, [&] { return randn(g); });
  fill(c.A, [&] { return -rand01(g) - 1.0; });
  if (s.softplus) {
    fill(c.dt, [&] { return randn(g); });
    fill(c.dt_bias, [&] { return rand01(g) - 4.0; });
  } else {
    fill(c.dt, [&] { return 0.5 * rand01(g); });
    fill(c.dt_bias, [&] { return 0.1 * rand01(g); });
  }
  c.out.fill_bytes(kPoison);

  if (s.pool > 0) {
    if (!s.indices.empty()) {
      c.indices = s.indices;
    } else {
      std::vector<int64_t> all(static_cast<size_t>(s.pool));
      for (int64_t i = 0; i < s.pool; ++i) all[static_cast<size_t>(i)] = i;
      std::shuffle(all.begin(), all.end(), g);
      c.indices.assign(all.begin(), all.begin() + std::min<int64_t>(Bt, s.pool));
    }
    const int64_t es = idx_esize(s.idx_dtype);
    const auto encode = [&](const std::vector<int64_t>& entries, std::vector<unsigned char>& storage) {
      storage.assign(static_cast<size_t>(((Bt - 1) * s.idx_stride + 1) * es), 0x5A);  // gaps: garbage
      for (int64_t b = 0; b < Bt; ++b) {
        unsigned char* p = storage.data() + b * s.idx_stride * es;
        const int64_t v = entries[static_cast<size_t>(b)];
        if (es == 8) {
          std::memcpy(p, &v, 8);
        } else {
          const int32_t v32 = static_cast<int32_t>(v);
          std::memcpy(p, &v32, 4);
        }
      }
    };
    encode(c.indices, c.idx_storage);
    if (!s.dst.empty()) encode(s.dst, c.dst_storage);
  }
  return c;
}

selscan_status_t run_state_update(StateUpdateCase& c, const selscan_exec_t& exec, const DeviceMemory* dev,
                                  bool misalign, const StateUpdateCall& call) {
  const auto run = [&](const selscan_state_update_args_t& a) {
    return call ? call(a, exec) : selscan_state_update(&a, &exec);
  };
  c.out.fill_bytes(kPoison);
  if (dev == nullptr) {
    selscan_state_update_args_t a = c.args([](Tensor& t) { return static_cast<void*>(t.storage.data()); },
                                           c.idx_storage.data(), c.dst_storage.data());
    return run(a);
  }
  struct Copy {
    std::vector<unsigned char>* host;
    unsigned char* base;
    size_t shift;
  };
  std::vector<Copy> copies;
  std::map<Tensor*, unsigned char*> where;
  unsigned char* idx_dev = nullptr;
  unsigned char* dst_dev = nullptr;
  for (Tensor* t : c.tensors()) {
    auto* base = static_cast<unsigned char*>(dev->alloc(t->storage.size() + 16));
    copies.push_back({&t->storage, base, misalign ? static_cast<size_t>(t->esize()) : 0});
    where[t] = base + copies.back().shift;
  }
  if (!c.idx_storage.empty()) {
    auto* base = static_cast<unsigned char*>(dev->alloc(c.idx_storage.size() + 16));
    copies.push_back({&c.idx_storage, base, misalign ? static_cast<size_t>(idx_esize(c.spec.idx_dtype)) : 0});
    idx_dev = base + copies.back().shift;
  }
  if (!c.dst_storage.empty()) {
    auto* base = static_cast<unsigned char*>(dev->alloc(c.dst_storage.size() + 16));
    copies.push_back({&c.dst_storage, base, misalign ? static_cast<size_t>(idx_esize(c.spec.idx_dtype)) : 0});
    dst_dev = base + copies.back().shift;
  }
  for (const Copy& k : copies) dev->to_device(k.base + k.shift, k.host->data(), k.host->size());
  selscan_state_update_args_t a =
      c.args([&](Tensor& t) { return static_cast<void*>(where.at(&t)); }, idx_dev, dst_dev);
  const selscan_status_t s = run(a);
  dev->sync();
  for (const Copy& k : copies) dev->to_host(k.host->data(), k.base + k.shift, k.host->size());
  for (const Copy& k : copies) dev->release(k.base);
  return s;
}

StateUpdateRef ref_state_update(const StateUpdateCase& c) {
  const StateUpdateSpec& s = c.spec;
  const Idx ix = idx_of(s);
  const int64_t Bt = s.batch, T = s.tokens, H = s.nheads, P = s.headdim, N = s.dstate;
  StateUpdateRef r;
  r.state = c.state.values();
  r.out.assign(static_cast<size_t>(Bt * T * H * P), 0.0);
  std::vector<double> st(static_cast<size_t>(N));
  for (int64_t b = 0; b < Bt; ++b) {
    const int64_t slot = c.slot_of(b);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / s.groups);
      for (int64_t p = 0; p < P; ++p) {
        const size_t o0 = static_cast<size_t>(((b * T) * H + h) * P + p);
        if (slot < 0) {
          for (int64_t t = 0; t < T; ++t)
            r.out[o0 + static_cast<size_t>(t * H * P)] = slot == -1 ? 0.0 : NAN;
          continue;
        }
        for (int64_t n = 0; n < N; ++n) st[static_cast<size_t>(n)] = c.state.get(ix.st(slot, h, p, n));
        const double Dv = c.D.present() ? c.D.get(ix.ch(h, p)) : 0.0;
        const double bias = c.dt_bias.present() ? c.dt_bias.get(ix.ch(h, p)) : 0.0;
        for (int64_t t = 0; t < T; ++t) {
          const double x = c.x.get(ix.io(b, t, h, p));
          double dt = c.dt.get(ix.io(b, t, h, p)) + bias;
          if (s.softplus && dt <= 20.0) dt = std::log1p(std::exp(dt));
          double y = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            double& v = st[static_cast<size_t>(n)];
            v = v * std::exp(c.A.get(ix.a(h, p, n)) * dt) + c.B.get(ix.bc(b, t, g, n)) * dt * x;
            y += v * c.C.get(ix.bc(b, t, g, n));
          }
          y += Dv * x;
          if (c.z.present()) {
            const double z = c.z.get(ix.io(b, t, h, p));
            y *= z / (1.0 + std::exp(-z));
          }
          r.out[o0 + static_cast<size_t>(t * H * P)] = y;
        }
        const int64_t dst = c.dst_of(b);
        if (dst < 0) continue;
        for (int64_t n = 0; n < N; ++n)
          r.state[static_cast<size_t>(((dst * H + h) * P + p) * N + n)] = st[static_cast<size_t>(n)];
      }
    }
  }
  return r;
}

void expect_state_update_ok(const StateUpdateCase& after, const StateUpdateCase& before) {
  const StateUpdateSpec& s = before.spec;
  const std::string what = s.str();
  const StateUpdateRef ref = ref_state_update(before);
  const int64_t Bt = s.batch, T = s.tokens, H = s.nheads, P = s.headdim, N = s.dstate;
  const int64_t per_seq = T * H * P, per_slot = H * P * N;

  // out: every element written; padding exactly 0, out-of-pool NaN, the rest close to the oracle.
  EXPECT_EQ(after.out.check_written(kPoison, kPoison), "") << what;
  const std::vector<double> got = after.out.values();
  std::vector<double> g_run, r_run;
  for (int64_t b = 0; b < Bt; ++b) {
    const int64_t slot = after.slot_of(b);
    for (int64_t i = 0; i < per_seq; ++i) {
      const size_t k = static_cast<size_t>(b * per_seq + i);
      if (slot == -1) {
        ASSERT_EQ(got[k], 0.0) << what << ": sequence " << b << " is padding, its out must be 0";
      } else if (slot == -2) {
        ASSERT_TRUE(std::isnan(got[k])) << what << ": sequence " << b << " names no slot, its out must be NaN";
      } else {
        g_run.push_back(got[k]);
        r_run.push_back(ref.out[k]);
      }
    }
  }
  EXPECT_TRUE(allclose("out (" + what + ")", g_run, r_run, tol_out(s.itype)));

  // state: the updated slots close to the oracle; every other slot bit-identical; guards intact.
  std::set<int64_t> updated;
  for (int64_t b = 0; b < Bt; ++b)
    if (after.dst_of(b) >= 0) updated.insert(after.dst_of(b));
  const std::vector<double> st = after.state.values();
  std::vector<double> g_st, r_st;
  int64_t changed = 0;
  const Idx ix = idx_of(s);
  for (int64_t slot = 0; slot < after.slots(); ++slot) {
    const bool upd = updated.count(slot) > 0;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t n = 0; n < N; ++n) {
          const size_t k = static_cast<size_t>(slot * per_slot + (h * P + p) * N + n);
          if (upd) {
            g_st.push_back(st[k]);
            r_st.push_back(ref.state[k]);
          } else {
            const int64_t off = (after.state.offset + after.state.index(ix.st(slot, h, p, n))) * after.state.esize();
            changed += std::memcmp(after.state.storage.data() + off, before.state.storage.data() + off,
                                   static_cast<size_t>(after.state.esize())) != 0;
          }
        }
  }
  EXPECT_TRUE(allclose("state (" + what + ")", g_st, r_st, tol_out(s.state_dtype)));
  EXPECT_EQ(changed, 0) << what << ": elements of slots that no sequence updates were modified";
  EXPECT_EQ(after.state.check_guards(kGuard), "") << what << ": state";

  // Inputs: not one byte changed.
  const std::pair<const char*, const Tensor*> ins[] = {{"x", &after.x}, {"dt", &after.dt}, {"A", &after.A},
                                                        {"B", &after.B}, {"C", &after.C}, {"D", &after.D},
                                                        {"z", &after.z}, {"dt_bias", &after.dt_bias}};
  const Tensor* ins_before[] = {&before.x, &before.dt, &before.A, &before.B,
                                &before.C, &before.D,  &before.z, &before.dt_bias};
  for (size_t i = 0; i < 8; ++i)
    EXPECT_TRUE(ins[i].second->storage == ins_before[i]->storage) << what << ": input " << ins[i].first << " changed";
  EXPECT_TRUE(after.idx_storage == before.idx_storage) << what << ": state_batch_indices changed";
  EXPECT_TRUE(after.dst_storage == before.dst_storage) << what << ": dst_state_batch_indices changed";
}

std::vector<NamedStateUpdateSpec> state_update_matrix() {
  constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;
  std::vector<NamedStateUpdateSpec> m;
  uint64_t seed = 100;
  auto add = [&](std::string name, StateUpdateSpec s) {
    s.seed = ++seed;
    m.push_back({std::move(name), s});
  };
  // (x dtype, state dtype): the state is float32 or x's dtype
  const std::pair<int32_t, int32_t> dtypes[] = {
      {kF32, kF32}, {kF16, kF32}, {kF16, kF16}, {kBF16, kF32}, {kBF16, kBF16}};
  for (const auto& [it, sd] : dtypes)
    for (bool z : {false, true}) {
      StateUpdateSpec s;
      s.batch = 3, s.nheads = 24, s.dstate = 16, s.itype = it, s.state_dtype = sd, s.has_z = z;
      add(std::string("mamba1_x") + dtype_name(it) + "_state" + dtype_name(sd) + (z ? "_z" : ""), s);
    }
  for (int32_t it : {kF32, kBF16})
    for (int64_t G : {1, 2, 3})
      for (bool bcast : {false, true}) {
        StateUpdateSpec s;
        s.heads = true, s.batch = 2, s.nheads = 6, s.headdim = 8, s.dstate = 16, s.groups = G, s.groups_dim = true;
        s.itype = it, s.has_z = true, s.broadcast = bcast;
        add(std::string("heads_") + dtype_name(it) + "_G" + std::to_string(G) + (bcast ? "_broadcast" : ""), s);
      }
  for (int64_t G : {1, 4}) {
    StateUpdateSpec s;
    s.batch = 2, s.nheads = 24, s.groups = G, s.groups_dim = true, s.has_z = true;
    add("mamba1_grouped_G" + std::to_string(G), s);
  }
  for (int mask = 0; mask < 16; ++mask)
    for (bool heads : {false, true}) {
      StateUpdateSpec s;
      s.heads = heads, s.nheads = 5, s.headdim = 4, s.dstate = 8;
      s.has_D = mask & 1, s.has_z = mask & 2, s.has_bias = mask & 4, s.softplus = mask & 8;
      add(std::string(heads ? "heads" : "mamba1") + "_optional" + std::to_string(mask), s);
    }
  for (bool heads : {false, true})
    for (int64_t T : {1, 2, 5})
      for (int32_t sd : {kF32, kBF16}) {
        StateUpdateSpec s;
        s.heads = heads, s.batch = 3, s.tokens = T, s.tokens_dim = true, s.nheads = 4, s.headdim = 4;
        s.itype = kBF16, s.state_dtype = sd, s.has_z = true, s.groups = 2;
        add(std::string(heads ? "heads" : "mamba1") + "_tokens" + std::to_string(T) + "_state" + dtype_name(sd), s);
      }
  for (int64_t N : {1, 4, 12, 16, 24, 64, 256})
    for (bool heads : {false, true}) {
      StateUpdateSpec s;
      s.heads = heads, s.batch = 2, s.nheads = 3, s.headdim = 2, s.dstate = N, s.has_z = true;
      add(std::string(heads ? "heads" : "mamba1") + "_dstate" + std::to_string(N), s);
    }
  // upstream's test passes B, C (and D) in float32 with 16-bit x; dt and z may be float32 too
  for (int32_t it : {kF16, kBF16})
    for (int mask = 1; mask < 8; ++mask) {
      StateUpdateSpec s;
      s.heads = mask & 1, s.headdim = 4, s.itype = it, s.has_z = true;
      s.bc_dtype = (mask & 1) ? kF32 : it;
      s.dt_dtype = (mask & 2) ? kF32 : it;
      s.z_dtype = (mask & 4) ? kF32 : it;
      add(std::string("mixed_") + dtype_name(it) + "_" + std::to_string(mask), s);
    }
  for (int32_t idt : {SELSCAN_DTYPE_INT32, SELSCAN_DTYPE_INT64})
    for (int64_t stride : {1, 3})
      for (bool heads : {false, true}) {
        StateUpdateSpec s;
        s.heads = heads, s.batch = 5, s.pool = 12, s.idx_dtype = idt, s.idx_stride = stride, s.headdim = 4;
        s.has_z = true;
        add(std::string(heads ? "heads" : "mamba1") + "_pool_" + (idt == SELSCAN_DTYPE_INT64 ? "i64" : "i32") +
                "_stride" + std::to_string(stride),
            s);
      }
  for (bool heads : {false, true}) {
    const std::string f = heads ? "heads" : "mamba1";
    StateUpdateSpec s;
    s.heads = heads, s.batch = 6, s.pool = 8, s.headdim = 4, s.tokens = 2, s.has_z = true;
    s.indices = {3, -1, 7, -1, 0, 5};  // -1: padding (the default pad_slot_id)
    add(f + "_padding", s);
    s.indices = {2, 8, -7, -1, 1, int64_t{1} << 40};  // 8, -7 and 2^40 name no slot: NaN out, nothing touched
    s.idx_dtype = SELSCAN_DTYPE_INT64;
    add(f + "_out_of_pool", s);
    s.indices = {2, 0, 4, 0, 6, 1};  // pad_slot_id 0: slot 0 is a null block (vLLM's null_block_id)
    s.pad_slot = 0, s.idx_dtype = SELSCAN_DTYPE_INT32;
    add(f + "_pad_slot_0", s);
    s.indices = {-1, -1, -1, -1, -1, -1};  // a batch of padding only (a CUDA-graph batch with no live sequence)
    s.pad_slot = -1;
    add(f + "_all_padding", s);
  }
  for (bool heads : {false, true})
    for (int32_t sd : {kF32, kF16}) {
      StateUpdateSpec s;
      s.heads = heads, s.padded = true, s.itype = kF16, s.state_dtype = sd, s.headdim = 4, s.tokens = 3;
      s.pool = 7, s.has_z = true, s.groups = 2;
      add(std::string(heads ? "heads" : "mamba1") + "_padded_state" + dtype_name(sd), s);
    }
  return m;
}

std::string PrefillDecodeSpec::str() const {
  std::ostringstream os;
  os << "Bt=" << batch << " D=" << dim << " N=" << dstate << " G=" << groups << " L=" << prefill << "+" << steps
     << " (" << tokens_per_call << " per call) " << dtype_name(itype) << (has_D ? " D" : "") << (has_z ? " z" : "")
     << (has_bias ? " bias" : "") << (softplus ? " softplus" : "") << " seed=" << seed;
  return os.str();
}

namespace {

// A view of `t` (as stored at `base`) starting `offset` elements past its element 0.
selscan_tensor_t view(const Tensor& t, void* base, int64_t offset, std::vector<int64_t> sizes,
                      std::vector<int64_t> strides) {
  selscan_tensor_t v{};
  v.data = static_cast<unsigned char*>(base) + (t.offset + offset) * t.esize();
  v.dtype = t.dtype;
  v.ndim = static_cast<int32_t>(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    v.sizes[i] = sizes[i];
    v.strides[i] = strides[i];
  }
  return v;
}

}  // namespace

void expect_prefill_then_decode_equals_scan(const PrefillDecodeSpec& s, const selscan_exec_t& exec,
                                            const DeviceMemory* dev) {
  ASSERT_EQ(s.steps % s.tokens_per_call, 0);
  const int64_t Bt = s.batch, D = s.dim, N = s.dstate, G = s.groups, L = s.prefill, K = s.steps, LK = L + K;
  const int64_t T = s.tokens_per_call;
  const int32_t it = s.itype, f32 = SELSCAN_DTYPE_FLOAT32;
  Tensor u = make_tensor(it, {Bt, D, LK}), delta = make_tensor(it, {Bt, D, LK}), z = make_tensor(it, {Bt, D, LK});
  Tensor B = make_tensor(it, {Bt, G, N, LK}), C = make_tensor(it, {Bt, G, N, LK});
  Tensor A = make_tensor(f32, {D, N}), Dv = make_tensor(f32, {D}), bias = make_tensor(f32, {D});
  Tensor out_full = make_tensor(it, {Bt, D, LK}), outz_full = make_tensor(it, {Bt, D, LK});
  Tensor last_full = make_tensor(f32, {Bt, D, N});
  Tensor out_pre = make_tensor(it, {Bt, D, L}), outz_pre = make_tensor(it, {Bt, D, L});
  Tensor state = make_tensor(f32, {Bt, D, N});     // the prefill's last_state, then the decode steps' state
  Tensor dec_out = make_tensor(it, {Bt, K, D});  // the decode steps' outputs, token by token

  std::mt19937_64 g(s.seed);
  std::normal_distribution<double> randn;
  std::uniform_real_distribution<double> rand01;
  fill(u, [&] { return randn(g); });
  fill(z, [&] { return randn(g); });
  fill(B, [&] { return randn(g); });
  fill(C, [&] { return randn(g); });
  fill(Dv, [&] { return randn(g); });
  fill(A, [&] { return -rand01(g) - 0.2; });
  fill(delta, [&] { return s.softplus ? 2.0 * rand01(g) - 3.0 : 0.3 * rand01(g); });
  fill(bias, [&] { return s.softplus ? rand01(g) - 1.0 : 0.05 * rand01(g); });

  Tensor* all[] = {&u, &delta, &z, &B, &C, &A, &Dv, &bias, &out_full, &outz_full, &last_full, &out_pre, &outz_pre,
                   &state, &dec_out};
  std::map<const Tensor*, void*> at;
  for (Tensor* t : all) at[t] = dev ? dev->alloc(t->storage.size()) : static_cast<void*>(t->storage.data());
  if (dev)
    for (Tensor* t : all) dev->to_device(at[t], t->storage.data(), t->storage.size());
  auto whole = [&](Tensor& t) { return t.desc(at[&t]); };

  // The scan of all L + K tokens, and the prefill of the first L (views of the same inputs).
  auto scan = [&](int64_t len, Tensor& out, Tensor& outz, Tensor& last) {
    selscan_fwd_args_t f{};
    f.struct_size = sizeof(f);
    const std::vector<int64_t> bdl{Bt, D, len}, bdl_s{D * LK, LK, 1};
    f.u = view(u, at[&u], 0, bdl, bdl_s);
    f.delta = view(delta, at[&delta], 0, bdl, bdl_s);
    f.A = whole(A);
    f.B = view(B, at[&B], 0, {Bt, G, N, len}, {G * N * LK, N * LK, LK, 1});
    f.C = view(C, at[&C], 0, {Bt, G, N, len}, {G * N * LK, N * LK, LK, 1});
    if (s.has_D) f.D = whole(Dv);
    if (s.has_z) f.z = view(z, at[&z], 0, bdl, bdl_s);
    if (s.has_bias) f.delta_bias = whole(bias);
    f.delta_softplus = s.softplus ? 1 : 0;
    f.out = whole(out);
    if (s.has_z) f.out_z = whole(outz);
    f.last_state = whole(last);
    return selscan_fwd(&f, &exec);
  };
  ASSERT_EQ(scan(LK, out_full, outz_full, last_full), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(scan(L, out_pre, outz_pre, state), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  // K tokens of decode, T per call, reading the scan's inputs in place.
  for (int64_t t0 = L; t0 < LK; t0 += T) {
    selscan_state_update_args_t a = SELSCAN_STATE_UPDATE_ARGS_INIT;
    const bool tdim = T > 1, gdim = G > 1;
    std::vector<int64_t> io{Bt}, io_s{D * LK}, bc{Bt}, bc_s{G * N * LK};
    if (tdim) io.push_back(T), io_s.push_back(1), bc.push_back(T), bc_s.push_back(1);
    io.push_back(D), io_s.push_back(LK);
    if (gdim) bc.push_back(G), bc_s.push_back(N * LK);
    bc.push_back(N), bc_s.push_back(LK);
    a.x = view(u, at[&u], t0, io, io_s);
    a.dt = view(delta, at[&delta], t0, io, io_s);
    if (s.has_z) a.z = view(z, at[&z], t0, io, io_s);
    a.B = view(B, at[&B], t0, bc, bc_s);
    a.C = view(C, at[&C], t0, bc, bc_s);
    a.A = whole(A);
    if (s.has_D) a.D = whole(Dv);
    if (s.has_bias) a.dt_bias = whole(bias);
    a.dt_softplus = s.softplus ? 1 : 0;
    a.state = whole(state);
    std::vector<int64_t> os{K * D};
    if (tdim) os.push_back(D);
    os.push_back(1);
    a.out = view(dec_out, at[&dec_out], (t0 - L) * D, io, os);
    ASSERT_EQ(selscan_state_update(&a, &exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  }
  if (dev) {
    dev->sync();
    for (Tensor* t : all) dev->to_host(t->storage.data(), at[t], t->storage.size());
    for (Tensor* t : all) dev->release(at[t]);
  }

  // Token L + j of the long scan against decode token j; the final states.
  const Tensor& ref = s.has_z ? outz_full : out_full;
  std::vector<double> got, want;
  for (int64_t b = 0; b < Bt; ++b)
    for (int64_t j = 0; j < K; ++j)
      for (int64_t d = 0; d < D; ++d) {
        got.push_back(dec_out.get({b, j, d}));
        want.push_back(ref.get({b, d, L + j}));
      }
  EXPECT_TRUE(allclose("decode out vs scan (" + s.str() + ")", got, want, tol_out(it)));
  EXPECT_TRUE(allclose("decode state vs scan last_state (" + s.str() + ")", state.values(), last_full.values(),
                       tol_out(f32)));
}

}  // namespace selscan_test
