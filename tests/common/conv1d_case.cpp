#include "conv1d_case.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "compare.h"
#include "support/reference_conv1d.h"

namespace selscan_test {
namespace {

constexpr int32_t kF32 = SELSCAN_DTYPE_FLOAT32, kF16 = SELSCAN_DTYPE_FLOAT16, kBF16 = SELSCAN_DTYPE_BFLOAT16;
constexpr int32_t kI32 = SELSCAN_DTYPE_INT32, kI64 = SELSCAN_DTYPE_INT64;

// A (a, b, c) tensor whose last two dims are (channel, time or state column), laid out as `l`.
Tensor tensor3(int32_t dtype, int64_t a, int64_t b, int64_t c, ConvLayout l) {
  switch (l) {
    case ConvLayout::channel_last: return make_tensor(dtype, {a, b, c}, Layout{{1, 2, 0}, {}});
    case ConvLayout::strided: {
      const int64_t sb = 2 * c + 3;
      return make_strided(dtype, {a, b, c}, {b * sb + 5, sb, 2});
    }
    default: return make_tensor(dtype, {a, b, c});
  }
}

// (D, W) weights: C order, channels innermost (channel_last), or with gaps.
Tensor tensor2(int32_t dtype, int64_t a, int64_t b, ConvLayout l) {
  switch (l) {
    case ConvLayout::channel_last: return make_tensor(dtype, {a, b}, Layout{{0, 1}, {}});
    case ConvLayout::strided: return make_strided(dtype, {a, b}, {2 * b + 1, 2});
    default: return make_tensor(dtype, {a, b});
  }
}

Tensor tensor1(int32_t dtype, int64_t n, bool gaps) {
  return gaps ? make_strided(dtype, {n}, {2}) : make_tensor(dtype, {n});
}

Tensor index_tensor(int32_t dtype, const std::vector<int64_t>& v, bool gaps) {
  Tensor t = tensor1(dtype, static_cast<int64_t>(v.size()), gaps);
  for (size_t i = 0; i < v.size(); ++i) t.set({static_cast<int64_t>(i)}, static_cast<double>(v[i]));
  return t;
}

selscan_tensor_t desc_at(Tensor& t, const Case::PtrMap& ptr) {
  return t.present() ? t.desc(ptr(t)) : selscan_tensor_t{};
}

// Unit roundoff of an output dtype, and the absolute error flushing or subnormal spacing allows.
double unit_of(int32_t dt) { return dt == kF16 ? 0x1p-11 : dt == kBF16 ? 0x1p-8 : 0x1p-24; }
double floor_of(int32_t dt) { return dt == kF16 ? 0x1p-24 : 0x1p-120; }

// The factor on the oracle's first-order fp32 scales (unit constants): room for the constants the scales leave out
// and for the order in which another implementation adds its terms.
constexpr double kScaleK = 32.0;

// |got - ref| <= rounding to `dtype` + kScaleK u cond (+ the dtype's floor).
::testing::AssertionResult close_to(const std::string& what, const std::vector<double>& got,
                                    const std::vector<double>& ref, const std::vector<double>& cond, int32_t dtype) {
  const double u = unit_of(dtype), fl = floor_of(dtype);
  std::vector<double> bound(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) bound[i] = u * std::fabs(ref[i]) + (1.0 + u) * kScaleK * kU32 * cond[i] + fl;
  return allclose(what, got, ref, Tol{u, fl}, &bound);
}

// Exact equality (copies of inputs: final_states, pool columns, the update's state).
::testing::AssertionResult equal_to(const std::string& what, const std::vector<double>& got,
                                    const std::vector<double>& ref) {
  return allclose(what, got, ref, Tol{0.0, 0.0});
}

// Bytes of element `idx` of `t`, equal in `a` and `b`.
bool same_element(const Tensor& a, const Tensor& b, const std::vector<int64_t>& idx) {
  const int64_t off = (a.offset + a.index(idx)) * a.esize();
  return std::memcmp(a.storage.data() + off, b.storage.data() + off, static_cast<size_t>(a.esize())) == 0;
}

// seq_idx of one row: segments of random lengths with increasing ids, about a quarter of them padding (ids < 0).
std::vector<int32_t> segments(int64_t L, Rng& rng) {
  std::vector<int32_t> v;
  int32_t id = 0;
  while (static_cast<int64_t>(v.size()) < L) {
    const int64_t n = 1 + static_cast<int64_t>(rng.uniform() * static_cast<double>(std::max<int64_t>(1, L / 3)));
    const bool pad = rng.uniform() < 0.25;
    const int32_t val = pad ? -1 - static_cast<int32_t>(rng.uniform() * 3.0) : id++;
    for (int64_t i = 0; i < n && static_cast<int64_t>(v.size()) < L; ++i) v.push_back(val);
  }
  return v;
}

// float32, and the itype when that is another dtype (a weight's or a state's choices).
std::vector<int32_t> f32_or(int32_t it) {
  return it == kF32 ? std::vector<int32_t>{kF32} : std::vector<int32_t>{kF32, it};
}

std::vector<double> row_values(const Tensor& t, int64_t row, int64_t d, int64_t t0, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = t.get({row, d, t0 + i});
  return v;
}

}  // namespace

const char* layout_name(ConvLayout l) {
  switch (l) {
    case ConvLayout::channel_last: return "channel_last";
    case ConvLayout::strided: return "strided";
    default: return "channel_first";
  }
}

// ------------------------------------------------------------------------------------------ forward / backward
int64_t Conv1dSpec::total() const {
  if (!packed()) return seqlen;
  int64_t t = 0;
  for (int64_t l : lens) t += l;
  return t;
}

std::string Conv1dSpec::str() const {
  std::ostringstream os;
  os << "W=" << width << " D=" << dim << " x=" << dtype_name(itype) << " w=" << dtype_name(wtype) << " "
     << layout_name(layout);
  if (packed()) {
    os << " lens=[";
    for (size_t i = 0; i < lens.size(); ++i) os << (i ? "," : "") << lens[i];
    os << "](" << dtype_name(cu_dtype) << ")";
  } else {
    os << " Bt=" << batch << " L=" << seqlen;
  }
  os << (bias ? " bias" : "") << (silu ? " silu" : "") << (seq_idx ? " seq_idx" : "")
     << (initial_states ? " init" : "") << (final_states ? " final" : "");
  if (slots > 0) os << " pool=" << slots << "x" << hist_len();
  if (!cache_indices.empty()) {
    os << " idx=[";
    for (size_t i = 0; i < cache_indices.size(); ++i) os << (i ? "," : "") << cache_indices[i];
    os << "](" << dtype_name(idx_dtype) << ", pad " << pad_slot_id << ")";
  }
  if (!has_init.empty()) {
    os << " has_init=[";
    for (size_t i = 0; i < has_init.size(); ++i) os << (i ? "," : "") << has_init[i];
    os << "](" << dtype_name(init_dtype) << ")";
  }
  os << (dfinal_states ? " dfinal" : "") << (dinitial_states ? " dinit" : "")
     << (deterministic ? " deterministic" : "") << " dw=" << dtype_name(dwtype) << " seed=" << seed;
  return os.str();
}

int64_t Conv1dCase::start(int64_t b) const {
  if (!spec.packed()) return 0;
  int64_t t = 0;
  for (int64_t i = 0; i < b; ++i) t += spec.lens[static_cast<size_t>(i)];
  return t;
}

bool Conv1dCase::pad(int64_t b) const {
  return !spec.cache_indices.empty() && spec.cache_indices[static_cast<size_t>(b)] == spec.pad_slot_id;
}

bool Conv1dCase::out_of_pool(int64_t b) const {
  if (spec.slots == 0 || spec.cache_indices.empty() || pad(b)) return false;
  const int64_t v = spec.cache_indices[static_cast<size_t>(b)];
  return v < 0 || v >= spec.slots;
}

int64_t Conv1dCase::slot(int64_t b) const {
  if (spec.slots == 0 || pad(b) || out_of_pool(b)) return -1;
  return spec.cache_indices.empty() ? b : spec.cache_indices[static_cast<size_t>(b)];
}

bool Conv1dCase::from_state(int64_t b) const {
  if (pad(b) || out_of_pool(b) || (!spec.initial_states && spec.slots == 0)) return false;
  return spec.has_init.empty() || spec.has_init[static_cast<size_t>(b)] != 0;
}

std::vector<Tensor*> Conv1dCase::all() {
  return {&x,       &weight, &bias, &seq_idx, &init, &cu_seqlens, &cache_indices, &has_init, &pool, &out, &fin,
          &bwd_init, &dout,  &dfin, &dx,      &dweight, &dbias,   &dinit};
}

selscan_conv1d_fwd_args_t Conv1dCase::fwd_args(const Case::PtrMap& ptr) {
  selscan_conv1d_fwd_args_t a = SELSCAN_CONV1D_FWD_ARGS_INIT;
  a.x = desc_at(x, ptr);
  a.weight = desc_at(weight, ptr);
  a.bias = desc_at(bias, ptr);
  a.seq_idx = desc_at(seq_idx, ptr);
  a.initial_states = desc_at(init, ptr);
  a.activation = spec.silu ? SELSCAN_ACTIVATION_SILU : SELSCAN_ACTIVATION_NONE;
  a.out = desc_at(out, ptr);
  a.final_states = desc_at(fin, ptr);
  a.cu_seqlens = desc_at(cu_seqlens, ptr);
  a.conv_states = desc_at(pool, ptr);
  a.cache_indices = desc_at(cache_indices, ptr);
  a.has_initial_state = desc_at(has_init, ptr);
  a.pad_slot_id = spec.pad_slot_id;
  return a;
}

selscan_conv1d_bwd_args_t Conv1dCase::bwd_args(const Case::PtrMap& ptr) {
  selscan_conv1d_bwd_args_t a = SELSCAN_CONV1D_BWD_ARGS_INIT;
  a.x = desc_at(x, ptr);
  a.weight = desc_at(weight, ptr);
  a.bias = desc_at(bias, ptr);
  a.seq_idx = desc_at(seq_idx, ptr);
  a.initial_states = desc_at(bwd_init, ptr);
  a.activation = spec.silu ? SELSCAN_ACTIVATION_SILU : SELSCAN_ACTIVATION_NONE;
  a.deterministic = spec.deterministic ? 1 : 0;
  a.cu_seqlens = desc_at(cu_seqlens, ptr);
  a.dout = desc_at(dout, ptr);
  a.dfinal_states = desc_at(dfin, ptr);
  a.dx = desc_at(dx, ptr);
  a.dweight = desc_at(dweight, ptr);
  a.dbias = desc_at(dbias, ptr);
  a.dinitial_states = desc_at(dinit, ptr);
  return a;
}

Conv1dCase make_conv1d_case(const Conv1dSpec& spec) {
  Conv1dCase c;
  const Conv1dSpec& s = c.spec = spec;
  const int64_t Bt = s.seqs(), D = s.dim, W = s.width, T = s.total(), R = c.rows(), H = s.hist_len();
  const int32_t it = s.itype;
  const ConvLayout l = s.layout;
  const bool gaps = l == ConvLayout::strided;
  if (T < 1) throw std::invalid_argument("make_conv1d_case: the time axis must have at least one step");
  if (s.dinitial_states && !s.initial_states && s.slots == 0)
    throw std::invalid_argument("make_conv1d_case: dinitial_states needs initial_states or a pool");
  Rng rng(s.seed);
  const auto normal = [&] { return rng.normal(); };

  c.x = tensor3(it, R, D, T, l);
  fill_values(c.x, normal);
  c.weight = tensor2(s.wtype, D, W, l);
  fill_values(c.weight, [&] { return 0.5 * rng.normal(); });
  if (s.bias) {
    c.bias = tensor1(s.wtype, D, gaps);
    fill_values(c.bias, normal);
  }
  if (s.seq_idx) {
    c.seq_idx = gaps ? make_strided(kI32, {Bt, T}, {2 * T + 1, 2}) : make_tensor(kI32, {Bt, T});
    for (int64_t b = 0; b < Bt; ++b) {
      const std::vector<int32_t> ids = segments(T, rng);
      for (int64_t t = 0; t < T; ++t) c.seq_idx.set({b, t}, ids[static_cast<size_t>(t)]);
    }
  }
  if (s.initial_states) {
    c.init = tensor3(it, Bt, D, W - 1, l);
    fill_values(c.init, normal);
  }
  if (s.packed()) {
    std::vector<int64_t> cu{0};
    for (int64_t len : s.lens) cu.push_back(cu.back() + len);
    c.cu_seqlens = index_tensor(s.cu_dtype, cu, gaps);
  }
  if (!s.cache_indices.empty()) c.cache_indices = index_tensor(s.idx_dtype, s.cache_indices, gaps);
  if (!s.has_init.empty()) {
    c.has_init = tensor1(s.init_dtype, Bt, gaps);
    for (int64_t b = 0; b < Bt; ++b) c.has_init.set({b}, s.has_init[static_cast<size_t>(b)]);
  }
  if (s.slots > 0) {
    c.pool = tensor3(it, s.slots, D, H, l);
    fill_values(c.pool, normal);
    c.pool_in = c.pool;
  }
  c.out = tensor3(it, R, D, T, l);
  if (s.final_states) c.fin = tensor3(it, Bt, D, W - 1, l);

  // The backward starts each sequence from what the forward did: its initial_states row or its slot's last W-1
  // columns (gathered), zeros where it started from zero.
  if (s.initial_states || s.slots > 0) {
    c.bwd_init = tensor3(it, Bt, D, W - 1, l);
    for (int64_t b = 0; b < Bt; ++b)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < W - 1; ++j) {
          double v = 0.0;
          if (c.from_state(b)) v = s.slots > 0 ? c.pool_in.get({c.slot(b), d, H - (W - 1) + j}) : c.init.get({b, d, j});
          c.bwd_init.set({b, d, j}, v);
        }
  }
  c.dout = tensor3(it, R, D, T, l);
  fill_values(c.dout, normal);
  for (int64_t b = 0; b < Bt; ++b)  // a padding sequence's out is constant: no gradient reaches it
    if (c.pad(b))
      for (int64_t d = 0; d < D; ++d)
        for (int64_t t = 0; t < s.len(b); ++t) c.dout.set({c.row(b), d, c.start(b) + t}, 0.0);
  if (s.dfinal_states) {
    c.dfin = tensor3(it, Bt, D, W - 1, l);
    fill_values(c.dfin, normal);
  }
  c.dx = tensor3(it, R, D, T, l);
  c.dweight = tensor2(s.dwtype, D, W, l);
  if (s.bias) c.dbias = tensor1(s.dwtype, D, gaps);
  if (s.dinitial_states) c.dinit = tensor3(it, Bt, D, W - 1, l);
  poison({&c.out, &c.fin, &c.dx, &c.dweight, &c.dbias, &c.dinit});
  return c;
}

selscan_status_t run_conv1d_fwd(Conv1dCase& c, const selscan_exec_t& exec, const DeviceMemory* dev) {
  poison({&c.out, &c.fin});
  if (c.pool.present()) c.pool = c.pool_in;
  return run_with_tensors(c.all(), dev, [&](const Case::PtrMap& ptr) {
    const selscan_conv1d_fwd_args_t a = c.fwd_args(ptr);
    return selscan_conv1d_fwd(&a, &exec);
  });
}

selscan_status_t run_conv1d_bwd(Conv1dCase& c, const selscan_exec_t& exec, const DeviceMemory* dev) {
  poison({&c.dx, &c.dweight, &c.dbias, &c.dinit});
  return run_with_tensors(c.all(), dev, [&](const Case::PtrMap& ptr) -> selscan_status_t {
    const selscan_conv1d_bwd_args_t a = c.bwd_args(ptr);
    size_t ws = 0;
    if (selscan_status_t s = selscan_conv1d_bwd_workspace_size(&a, &exec, &ws); s != SELSCAN_STATUS_SUCCESS)
      return s;
    if (ws == 0) return selscan_conv1d_bwd(&a, &exec);
    if (dev == nullptr) throw std::runtime_error("run_conv1d_bwd: a host call asked for workspace");
    selscan_exec_t e = exec;
    e.workspace = dev->alloc(ws);
    e.workspace_bytes = ws;
    const selscan_status_t s = selscan_conv1d_bwd(&a, &e);
    dev->sync();
    dev->release(e.workspace);
    return s;
  });
}

Conv1dRef conv1d_reference(const Conv1dCase& c) {
  const Conv1dSpec& s = c.spec;
  const int64_t Bt = s.seqs(), D = s.dim, W = s.width, T = s.total(), R = c.rows(), H = s.hist_len();
  Conv1dRef r;
  r.out.assign(static_cast<size_t>(R * D * T), 0.0);
  r.cond_out = r.dx = r.cond_dx = r.out;
  r.fin.assign(static_cast<size_t>(Bt * D * (W - 1)), 0.0);
  r.dinit = r.cond_dinit = r.fin;
  r.dweight.assign(static_cast<size_t>(D * W), 0.0);
  r.cond_dweight = r.dweight;
  r.dbias.assign(static_cast<size_t>(D), 0.0);
  r.cond_dbias = r.dbias;
  if (c.pool_in.present()) r.pool = c.pool_in.values();

  for (int64_t b = 0; b < Bt; ++b) {
    const int64_t len = s.len(b), row = c.row(b), t0 = c.start(b);
    RefConv1d p;
    p.Bt = 1, p.D = D, p.L = len, p.W = W, p.silu = s.silu, p.has_bias = s.bias;
    p.weight = c.weight.values();
    if (s.bias) p.bias = c.bias.values();
    for (int64_t d = 0; d < D; ++d) {
      const std::vector<double> xr = row_values(c.x, row, d, t0, len);
      p.x.insert(p.x.end(), xr.begin(), xr.end());
    }
    if (s.seq_idx)
      for (int64_t t = 0; t < len; ++t) p.seq_idx.push_back(static_cast<int32_t>(c.seq_idx.get({b, t})));
    auto at = [&](int64_t d, int64_t t) { return static_cast<size_t>((row * D + d) * T + t0 + t); };

    // The forward: a padding sequence keeps the zeros (out, final_states) and touches no slot; one whose entry
    // names no slot has NaN outputs.
    if (c.out_of_pool(b)) {
      for (int64_t d = 0; d < D; ++d)
        for (int64_t t = 0; t < len; ++t) r.out[at(d, t)] = NAN;
    } else if (!c.pad(b)) {
      RefConv1d f = p;
      const bool pool = s.slots > 0;
      f.H = pool || s.initial_states ? H : 0;
      f.F = pool ? H : (s.final_states ? W - 1 : 0);
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < f.H; ++j)
          f.hist.push_back(!c.from_state(b) ? 0.0 : pool ? c.pool_in.get({c.slot(b), d, j}) : c.init.get({b, d, j}));
      const RefConv1dFwd o = ref_conv1d_forward(f);
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t t = 0; t < len; ++t) {
          r.out[at(d, t)] = o.out[static_cast<size_t>(d * len + t)];
          r.cond_out[at(d, t)] = o.cond_out[static_cast<size_t>(d * len + t)];
        }
        for (int64_t j = 0; j < f.F; ++j) {
          const double v = o.fin[static_cast<size_t>(d * f.F + j)];
          if (pool && len > 0) r.pool[static_cast<size_t>((c.slot(b) * D + d) * H + j)] = v;
          if (!pool) r.fin[static_cast<size_t>((b * D + d) * (W - 1) + j)] = v;
        }
      }
    }

    // The backward, from the gathered initial states.
    RefConv1d g = p;
    g.H = c.bwd_init.present() ? W - 1 : 0;
    g.F = s.dfinal_states ? W - 1 : 0;
    std::vector<double> dout, dfin;
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t j = 0; j < g.H; ++j) g.hist.push_back(c.bwd_init.get({b, d, j}));
      const std::vector<double> dr = row_values(c.dout, row, d, t0, len);
      dout.insert(dout.end(), dr.begin(), dr.end());
      for (int64_t j = 0; j < g.F; ++j) dfin.push_back(c.dfin.get({b, d, j}));
    }
    const RefConv1dBwd o = ref_conv1d_backward(g, dout, dfin);
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t t = 0; t < len; ++t) {
        r.dx[at(d, t)] = o.dx[static_cast<size_t>(d * len + t)];
        r.cond_dx[at(d, t)] = o.cond_dx[static_cast<size_t>(d * len + t)];
      }
      for (int64_t j = 0; j < g.H; ++j) {
        r.dinit[static_cast<size_t>((b * D + d) * (W - 1) + j)] = o.dhist[static_cast<size_t>(d * g.H + j)];
        r.cond_dinit[static_cast<size_t>((b * D + d) * (W - 1) + j)] = o.cond_dhist[static_cast<size_t>(d * g.H + j)];
      }
      for (int64_t k = 0; k < W; ++k) {
        r.dweight[static_cast<size_t>(d * W + k)] += o.dweight[static_cast<size_t>(d * W + k)];
        r.cond_dweight[static_cast<size_t>(d * W + k)] += o.cond_dweight[static_cast<size_t>(d * W + k)];
      }
      r.dbias[static_cast<size_t>(d)] += o.dbias[static_cast<size_t>(d)];
      r.cond_dbias[static_cast<size_t>(d)] += o.cond_dbias[static_cast<size_t>(d)];
    }
  }
  return r;
}

namespace {

// Every tensor of `after` but `outputs` holds the bytes it held in `before`.
void expect_unchanged_but(Conv1dCase& after, Conv1dCase& before, const std::vector<const Tensor*>& outputs,
                          const std::string& what) {
  const std::vector<Tensor*> a = after.all(), b = before.all();
  const char* names[] = {"x",    "weight", "bias",     "seq_idx", "initial_states", "cu_seqlens",
                         "cache_indices", "has_initial_state", "conv_states", "out", "final_states",
                         "initial_states (backward)", "dout", "dfinal_states", "dx", "dweight", "dbias",
                         "dinitial_states"};
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::find(outputs.begin(), outputs.end(), a[i]) != outputs.end()) continue;
    EXPECT_TRUE(a[i]->storage == b[i]->storage) << what << ": " << names[i] << " changed";
  }
}

}  // namespace

void expect_conv1d_fwd_ok(const Conv1dCase& after_c, const Conv1dCase& before_c) {
  Conv1dCase& after = const_cast<Conv1dCase&>(after_c);
  Conv1dCase& before = const_cast<Conv1dCase&>(before_c);
  const Conv1dSpec& s = before.spec;
  const std::string what = s.str();
  const Conv1dRef r = conv1d_reference(before);

  EXPECT_EQ(after.out.check_written(kPoison, kPoison), "") << what << ": out";
  // NaN where the oracle has NaN (sequences naming no slot), the oracle's values within tolerance elsewhere.
  const std::vector<double> out = after.out.values();
  std::vector<double> got, want, cond;
  int64_t not_nan = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(r.out[i])) {
      not_nan += !std::isnan(out[i]);
      continue;
    }
    got.push_back(out[i]), want.push_back(r.out[i]), cond.push_back(r.cond_out[i]);
  }
  EXPECT_EQ(not_nan, 0) << what << ": out elements of sequences naming no slot must be NaN";
  EXPECT_TRUE(close_to("out (" + what + ")", got, want, cond, s.itype));
  if (after.fin.present()) {
    EXPECT_EQ(after.fin.check_written(kPoison, kPoison), "") << what << ": final_states";
    EXPECT_TRUE(equal_to("final_states (" + what + ")", after.fin.values(), r.fin));
  }
  if (after.pool.present()) {
    // Written slots hold the oracle's columns exactly; the others every byte they had.
    const int64_t S = s.slots, D = s.dim, H = s.hist_len();
    std::vector<char> written(static_cast<size_t>(S), 0);
    for (int64_t b = 0; b < s.seqs(); ++b)
      if (after.slot(b) >= 0 && s.len(b) > 0) written[static_cast<size_t>(after.slot(b))] = 1;
    std::vector<double> got, want;
    const std::vector<double> all = after.pool.values();
    int64_t changed = 0;
    for (int64_t k = 0; k < S; ++k)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < H; ++j) {
          const size_t i = static_cast<size_t>((k * D + d) * H + j);
          if (written[static_cast<size_t>(k)]) {
            got.push_back(all[i]);
            want.push_back(r.pool[i]);
          } else {
            changed += !same_element(after.pool, before.pool_in, {k, d, j});
          }
        }
    EXPECT_TRUE(equal_to("conv_states (" + what + ")", got, want));
    EXPECT_EQ(changed, 0) << what << ": elements of slots no sequence writes were modified";
    EXPECT_EQ(after.pool.check_guards(kGuard), "") << what << ": conv_states";
  }
  expect_unchanged_but(after, before, {&after.out, &after.fin, &after.pool}, what);
}

void expect_conv1d_bwd_ok(const Conv1dCase& after_c, const Conv1dCase& before_c) {
  Conv1dCase& after = const_cast<Conv1dCase&>(after_c);
  Conv1dCase& before = const_cast<Conv1dCase&>(before_c);
  const Conv1dSpec& s = before.spec;
  const std::string what = s.str();
  const Conv1dRef r = conv1d_reference(before);

  EXPECT_EQ(after.dx.check_written(kPoison, kPoison), "") << what << ": dx";
  EXPECT_TRUE(close_to("dx (" + what + ")", after.dx.values(), r.dx, r.cond_dx, s.itype));
  EXPECT_EQ(after.dweight.check_written(kPoison, kPoison), "") << what << ": dweight";
  EXPECT_TRUE(close_to("dweight (" + what + ")", after.dweight.values(), r.dweight, r.cond_dweight, s.dwtype));
  if (after.dbias.present()) {
    EXPECT_EQ(after.dbias.check_written(kPoison, kPoison), "") << what << ": dbias";
    EXPECT_TRUE(close_to("dbias (" + what + ")", after.dbias.values(), r.dbias, r.cond_dbias, s.dwtype));
  }
  if (after.dinit.present()) {
    EXPECT_EQ(after.dinit.check_written(kPoison, kPoison), "") << what << ": dinitial_states";
    EXPECT_TRUE(close_to("dinitial_states (" + what + ")", after.dinit.values(), r.dinit, r.cond_dinit, s.itype));
  }
  expect_unchanged_but(after, before, {&after.dx, &after.dweight, &after.dbias, &after.dinit}, what);
}

void check_conv1d(const Conv1dSpec& spec, const selscan_exec_t& exec, const DeviceMemory* dev) {
  const Conv1dCase built = make_conv1d_case(spec);
  Conv1dCase c = built;
  ASSERT_EQ(run_conv1d_fwd(c, exec, dev), SELSCAN_STATUS_SUCCESS) << spec.str() << ": " << selscan_last_error();
  expect_conv1d_fwd_ok(c, built);
  const Conv1dCase after_fwd = c;
  ASSERT_EQ(run_conv1d_bwd(c, exec, dev), SELSCAN_STATUS_SUCCESS) << spec.str() << ": " << selscan_last_error();
  expect_conv1d_bwd_ok(c, after_fwd);
  // Once more: dx and dinitial_states always, dweight and dbias when deterministic, byte for byte.
  Conv1dCase again = after_fwd;
  ASSERT_EQ(run_conv1d_bwd(again, exec, dev), SELSCAN_STATUS_SUCCESS) << spec.str() << ": " << selscan_last_error();
  EXPECT_TRUE(again.dx.same_bytes(c.dx)) << spec.str() << ": dx differs between two identical calls";
  if (c.dinit.present()) EXPECT_TRUE(again.dinit.same_bytes(c.dinit)) << spec.str() << ": dinitial_states differs";
  if (spec.deterministic) {
    EXPECT_TRUE(again.dweight.same_bytes(c.dweight)) << spec.str() << ": deterministic dweight differs";
    if (c.dbias.present())
      EXPECT_TRUE(again.dbias.same_bytes(c.dbias)) << spec.str() << ": deterministic dbias differs";
  }
}

std::vector<NamedConv1dSpec> conv1d_matrix() {
  std::vector<NamedConv1dSpec> m;
  uint64_t seed = 5000;
  auto add = [&](std::string name, Conv1dSpec s) {
    s.seed = ++seed;
    m.push_back({std::move(name), s});
  };
  const ConvLayout layouts[] = {ConvLayout::channel_first, ConvLayout::channel_last, ConvLayout::strided};
  // dtypes x weight dtype x width x layout (bias and SILU alternate)
  int alt = 0;
  for (int32_t it : {kF32, kF16, kBF16})
    for (int32_t wt : f32_or(it)) {
      for (int64_t W : {2, 3, 4})
        for (ConvLayout l : layouts) {
          Conv1dSpec s;
          s.itype = it, s.wtype = wt, s.dwtype = (alt % 3 == 2) ? wt : kF32, s.width = W, s.layout = l;
          s.bias = alt % 2 == 0, s.silu = alt % 4 < 2, s.dim = 12, s.seqlen = 45;
          ++alt;
          add(std::string(dtype_name(it)) + "_w" + dtype_name(wt) + "_W" + std::to_string(W) + "_" + layout_name(l), s);
        }
    }
  // every combination of bias, SILU, initial and final states (and their gradients)
  for (int mask = 0; mask < 16; ++mask)
    for (ConvLayout l : layouts) {
      Conv1dSpec s;
      s.bias = mask & 1, s.silu = mask & 2, s.initial_states = mask & 4, s.final_states = mask & 8;
      s.dinitial_states = s.initial_states, s.dfinal_states = s.final_states, s.layout = l;
      s.itype = mask % 3 == 0 ? kBF16 : kF32, s.wtype = kF32;
      add("flags" + std::to_string(mask) + "_" + layout_name(l), s);
    }
  // sequences shorter than, equal to and longer than the window, with states
  for (int64_t W : {2, 3, 4})
    for (int64_t L : {1, 2, 3, 4, 5, 130}) {
      Conv1dSpec s;
      s.width = W, s.seqlen = L, s.batch = 3, s.dim = 5, s.initial_states = true, s.final_states = true;
      s.dinitial_states = true, s.dfinal_states = true, s.itype = kF16, s.wtype = kF16, s.dwtype = kF16;
      add("short_W" + std::to_string(W) + "_L" + std::to_string(L), s);
    }
  // seq_idx segments and padding
  for (int64_t W : {2, 3, 4})
    for (ConvLayout l : layouts) {
      Conv1dSpec s;
      s.width = W, s.layout = l, s.seq_idx = true, s.batch = 3, s.seqlen = 70, s.silu = W != 3;
      s.itype = l == ConvLayout::strided ? kBF16 : kF32;
      add("seq_idx_W" + std::to_string(W) + "_" + layout_name(l), s);
    }
  // packed sequences (empty ones included) with and without states
  const std::vector<std::vector<int64_t>> packs = {{5, 0, 33, 12}, {1}, {0, 7, 0}, {40, 2, 3, 1}, {2, 2}};
  int pk = 0;
  for (const auto& lens : packs)
    for (int states = 0; states < 2; ++states) {
      Conv1dSpec s;
      s.lens = lens, s.initial_states = states, s.final_states = states, s.dinitial_states = states;
      s.dfinal_states = states, s.layout = layouts[pk % 3], s.cu_dtype = pk % 2 ? kI64 : kI32;
      s.itype = pk % 4 == 3 ? kF16 : kF32;
      if (states && pk % 2) s.has_init = std::vector<int>(lens.size(), 1), s.has_init[0] = 0;
      ++pk;
      add("packed" + std::to_string(pk) + (states ? "_states" : ""), s);
    }
  // the pool: state_len at and above W-1, slots by index (padding entries) or by position, has_initial_state
  for (int64_t W : {2, 4})
    for (int64_t extra : {0, 3}) {
      const int64_t SL = W - 1 + extra;
      Conv1dSpec s;
      s.width = W, s.state_len = SL, s.lens = {6, 0, 1, 17}, s.slots = 9;
      s.cache_indices = {4, 2, -1, 7}, s.has_init = {1, 0, 1, 0};  // the empty sequence would write zeros
      s.layout = layouts[(W + extra) % 3], s.dinitial_states = true, s.itype = extra ? kBF16 : kF32;
      add("pool_W" + std::to_string(W) + "_len" + std::to_string(SL) + "_packed", s);
      s.lens.clear(), s.batch = 3, s.seqlen = 2, s.cache_indices = {1, 0, 2}, s.has_init = {0, 1, 1};
      s.idx_dtype = kI64, s.init_dtype = kI32, s.slots = 4;
      add("pool_W" + std::to_string(W) + "_len" + std::to_string(SL) + "_dense_short", s);
      s.cache_indices.clear(), s.has_init.clear(), s.slots = 3, s.seqlen = 29;
      add("pool_W" + std::to_string(W) + "_len" + std::to_string(SL) + "_by_position", s);
    }
  {
    Conv1dSpec s;  // pad_slot_id 0 (a null slot), every other slot named
    s.lens = {3, 9, 4}, s.slots = 4, s.cache_indices = {3, 0, 1}, s.pad_slot_id = 0, s.state_len = 8;
    add("pool_pad_slot_0", s);
    s.cache_indices = {-1, -1, -1}, s.pad_slot_id = -1;  // a batch of padding only
    add("pool_all_padding", s);
  }
  {
    Conv1dSpec s;  // cache_indices without a pool: padding marks only (final_states rows of padding are 0)
    s.batch = 4, s.cache_indices = {0, -1, 5, -1}, s.final_states = true, s.initial_states = true;
    add("padding_without_pool", s);
  }
  // the backward's options: dweight/dbias dtypes, non-deterministic requests
  for (int32_t wt : {kF32, kBF16})
    for (int32_t dw : f32_or(wt))
      for (bool det : {false, true}) {
        Conv1dSpec s;
        s.itype = kBF16, s.wtype = wt, s.dwtype = dw, s.deterministic = det, s.batch = 4, s.seqlen = 300, s.dim = 20;
        add(std::string("bwd_w") + dtype_name(wt) + "_dw" + dtype_name(dw) + (det ? "_det" : "_nondet"), s);
      }
  // sizes: one channel, many channels, a long row
  {
    Conv1dSpec s;
    s.dim = 1, s.batch = 1, s.seqlen = 9;
    add("one_channel", s);
    s.dim = 130, s.seqlen = 20, s.layout = ConvLayout::channel_last, s.initial_states = s.final_states = true;
    add("many_channels", s);
    s.dim = 3, s.seqlen = 5000, s.batch = 1, s.layout = ConvLayout::channel_first;
    add("long_row", s);
  }
  return m;
}

std::vector<NamedConv1dSpec> conv1d_out_of_pool_specs() {
  std::vector<NamedConv1dSpec> m;
  Conv1dSpec s;
  s.lens = {5, 3, 0, 9}, s.slots = 6, s.state_len = 5, s.cache_indices = {2, 6, 7, -5}, s.idx_dtype = kI64;
  s.seed = 5900;
  m.push_back({"packed", s});
  s.lens.clear(), s.batch = 3, s.seqlen = 12, s.cache_indices = {1, -1, int64_t{1} << 40}, s.seed = 5901;
  m.push_back({"dense_with_padding", s});
  return m;
}

// ------------------------------------------------------------------------------------------ the decode update
std::string Conv1dUpdateSpec::str() const {
  std::ostringstream os;
  os << "Bt=" << batch << " D=" << dim << " T=" << tokens << (tokens_dim ? "(dim)" : "") << " W=" << width
     << " state_len=" << state_len << " x=" << dtype_name(itype) << " w=" << dtype_name(wtype)
     << " state=" << dtype_name(state_dtype) << (bias ? " bias" : "") << (silu ? " silu" : "");
  if (!cache_seqlens.empty()) {
    os << " circular=[";
    for (size_t i = 0; i < cache_seqlens.size(); ++i) os << (i ? "," : "") << cache_seqlens[i];
    os << "]";
  }
  if (slots > 0) {
    os << " slots=" << slots << " idx=[";
    for (size_t i = 0; i < indices.size(); ++i) os << (i ? "," : "") << indices[i];
    os << "](" << dtype_name(idx_dtype) << ", pad " << pad_slot_id << ")";
  }
  os << (strided ? " strided" : "") << " seed=" << seed;
  return os.str();
}

int64_t Conv1dUpdateCase::slot_of(int64_t b) const {
  if (spec.slots == 0) return b;
  const int64_t v = spec.indices[static_cast<size_t>(b)];
  if (v == spec.pad_slot_id) return -1;
  return v < 0 || v >= spec.slots ? -2 : v;
}

std::vector<Tensor*> Conv1dUpdateCase::all() { return {&x, &weight, &bias, &state, &out, &cache_seqlens, &indices}; }

selscan_conv1d_update_args_t Conv1dUpdateCase::args(const Case::PtrMap& ptr) {
  selscan_conv1d_update_args_t a = SELSCAN_CONV1D_UPDATE_ARGS_INIT;
  a.x = desc_at(x, ptr);
  a.weight = desc_at(weight, ptr);
  a.bias = desc_at(bias, ptr);
  a.cache_seqlens = desc_at(cache_seqlens, ptr);
  a.conv_state_indices = desc_at(indices, ptr);
  a.pad_slot_id = spec.pad_slot_id;
  a.activation = spec.silu ? SELSCAN_ACTIVATION_SILU : SELSCAN_ACTIVATION_NONE;
  a.conv_state = desc_at(state, ptr);
  a.out = desc_at(out, ptr);
  return a;
}

Conv1dUpdateCase make_conv1d_update_case(const Conv1dUpdateSpec& spec) {
  Conv1dUpdateCase c;
  Conv1dUpdateSpec& s = c.spec;
  s = spec;
  s.tokens_dim = s.tokens_dim || s.tokens > 1;
  const int64_t Bt = s.batch, D = s.dim, T = s.tokens, W = s.width, SL = s.state_len;
  const ConvLayout l = s.strided ? ConvLayout::strided : ConvLayout::channel_first;
  Rng rng(s.seed);
  const auto normal = [&] { return rng.normal(); };
  auto io = [&] {
    if (s.tokens_dim) return tensor3(s.itype, Bt, D, T, l);
    return s.strided ? make_strided(s.itype, {Bt, D}, {2 * D + 3, 2}) : make_tensor(s.itype, {Bt, D});
  };
  c.x = io();
  fill_values(c.x, normal);
  c.out = io();
  c.out.fill_bytes(kPoison);
  c.weight = tensor2(s.wtype, D, W, l);
  fill_values(c.weight, [&] { return 0.5 * rng.normal(); });
  if (s.bias) {
    c.bias = tensor1(s.wtype, D, s.strided);
    fill_values(c.bias, normal);
  }
  c.state = tensor3(s.state_dtype, c.slots(), D, SL, l);
  fill_values(c.state, normal);
  c.state_in = c.state;
  if (!s.cache_seqlens.empty()) c.cache_seqlens = index_tensor(s.seqlens_dtype, s.cache_seqlens, s.strided);
  if (s.slots > 0) {
    if (s.indices.empty()) {
      std::vector<int64_t> all(static_cast<size_t>(s.slots));
      for (int64_t i = 0; i < s.slots; ++i) all[static_cast<size_t>(i)] = i;
      for (int64_t i = s.slots - 1; i > 0; --i)  // Fisher-Yates on the portable generator
        std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(rng.uniform() * static_cast<double>(i + 1))]);
      s.indices.assign(all.begin(), all.begin() + std::min(Bt, s.slots));
    }
    c.indices = index_tensor(s.idx_dtype, s.indices, s.strided);
  }
  return c;
}

selscan_status_t run_conv1d_update(Conv1dUpdateCase& c, const selscan_exec_t& exec, const DeviceMemory* dev) {
  c.out.fill_bytes(kPoison);
  c.state = c.state_in;
  return run_with_tensors(c.all(), dev, [&](const Case::PtrMap& ptr) {
    const selscan_conv1d_update_args_t a = c.args(ptr);
    return selscan_conv1d_update(&a, &exec);
  });
}

Conv1dUpdateRef conv1d_update_reference(const Conv1dUpdateCase& c) {
  const Conv1dUpdateSpec& s = c.spec;
  const int64_t Bt = s.batch, D = s.dim, T = s.tokens, SL = s.state_len;
  Conv1dUpdateRef r;
  r.out.assign(static_cast<size_t>(Bt * D * T), 0.0);
  r.cond_out = r.out;
  r.state = c.state_in.values();
  for (int64_t b = 0; b < Bt; ++b) {
    const int64_t slot = c.slot_of(b);
    if (slot < 0) {
      for (int64_t i = 0; i < D * T; ++i) r.out[static_cast<size_t>(b * D * T + i)] = slot == -1 ? 0.0 : NAN;
      continue;
    }
    RefConv1dUpdate p;
    p.Bt = 1, p.D = D, p.T = T, p.W = s.width, p.S = SL, p.silu = s.silu, p.has_bias = s.bias;
    p.weight = c.weight.values();
    if (s.bias) p.bias = c.bias.values();
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t t = 0; t < T; ++t) p.x.push_back(s.tokens_dim ? c.x.get({b, d, t}) : c.x.get({b, d}));
      for (int64_t j = 0; j < SL; ++j) p.state.push_back(c.state_in.get({slot, d, j}));
    }
    if (!s.cache_seqlens.empty()) p.cache_seqlens = {s.cache_seqlens[static_cast<size_t>(b)]};
    const RefConv1dUpdateOut o = ref_conv1d_update(p);
    std::copy(o.out.begin(), o.out.end(), r.out.begin() + b * D * T);
    std::copy(o.cond_out.begin(), o.cond_out.end(), r.cond_out.begin() + b * D * T);
    std::copy(o.state.begin(), o.state.end(), r.state.begin() + slot * D * SL);
  }
  return r;
}

void expect_conv1d_update_ok(const Conv1dUpdateCase& after, const Conv1dUpdateCase& before) {
  const Conv1dUpdateSpec& s = before.spec;
  const std::string what = s.str();
  const Conv1dUpdateRef r = conv1d_update_reference(before);
  const int64_t Bt = s.batch, D = s.dim, T = s.tokens, SL = s.state_len;

  EXPECT_EQ(after.out.check_written(kPoison, kPoison), "") << what << ": out";
  const std::vector<double> got = after.out.values();
  std::vector<double> g, w, cnd;
  for (int64_t b = 0; b < Bt; ++b) {
    const int64_t slot = after.slot_of(b);
    int64_t wrong = 0;
    for (int64_t i = 0; i < D * T; ++i) {
      const size_t k = static_cast<size_t>(b * D * T + i);
      if (slot == -1) {
        wrong += got[k] != 0.0;
      } else if (slot == -2) {
        wrong += !std::isnan(got[k]);
      } else {
        g.push_back(got[k]), w.push_back(r.out[k]), cnd.push_back(r.cond_out[k]);
      }
    }
    EXPECT_EQ(wrong, 0) << what << ": sequence " << b
                        << (slot == -1 ? " is padding, its out must be 0" : " names no slot, its out must be NaN");
  }
  EXPECT_TRUE(close_to("out (" + what + ")", g, w, cnd, s.itype));

  std::vector<char> used(static_cast<size_t>(after.slots()), 0);
  for (int64_t b = 0; b < Bt; ++b)
    if (after.slot_of(b) >= 0) used[static_cast<size_t>(after.slot_of(b))] = 1;
  const std::vector<double> st = after.state.values();
  std::vector<double> gs, ws;
  int64_t changed = 0;
  for (int64_t k = 0; k < after.slots(); ++k)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < SL; ++j) {
        const size_t i = static_cast<size_t>((k * D + d) * SL + j);
        if (used[static_cast<size_t>(k)]) {
          gs.push_back(st[i]), ws.push_back(r.state[i]);
        } else {
          changed += !same_element(after.state, before.state_in, {k, d, j});
        }
      }
  EXPECT_TRUE(equal_to("conv_state (" + what + ")", gs, ws));
  EXPECT_EQ(changed, 0) << what << ": elements of slots no sequence uses were modified";
  EXPECT_EQ(after.state.check_guards(kGuard), "") << what << ": conv_state";
  const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> ins[] = {
      {"x", {&after.x, &before.x}},
      {"weight", {&after.weight, &before.weight}},
      {"bias", {&after.bias, &before.bias}},
      {"cache_seqlens", {&after.cache_seqlens, &before.cache_seqlens}},
      {"conv_state_indices", {&after.indices, &before.indices}}};
  for (const auto& [name, t] : ins)
    EXPECT_TRUE(t.first->storage == t.second->storage) << what << ": " << name << " changed";
}

std::vector<NamedConv1dUpdateSpec> conv1d_update_matrix() {
  std::vector<NamedConv1dUpdateSpec> m;
  uint64_t seed = 6000;
  auto add = [&](std::string name, Conv1dUpdateSpec s) {
    s.seed = ++seed;
    m.push_back({std::move(name), s});
  };
  // x dtype x state dtype x weight dtype x width
  for (int32_t it : {kF32, kF16, kBF16})
    for (int32_t sd : f32_or(it))
      for (int64_t W : {2, 3, 4}) {
        Conv1dUpdateSpec s;
        s.itype = it, s.state_dtype = sd, s.wtype = W == 3 ? it : kF32, s.width = W, s.state_len = W - 1;
        s.silu = W != 2, s.bias = W != 4;
        add(std::string(dtype_name(it)) + "_state" + dtype_name(sd) + "_W" + std::to_string(W), s);
      }
  // tokens x state_len x circular: the shift (T above and below state_len) and the circular buffer (wrapping,
  // positions past state_len, more tokens than columns)
  for (int64_t T : {1, 2, 5})
    for (int64_t SL : {3, 4, 8})
      for (bool circ : {false, true}) {
        Conv1dUpdateSpec s;
        s.tokens = T, s.state_len = SL, s.batch = 4, s.itype = kBF16, s.state_dtype = circ ? kF32 : kBF16;
        if (circ) s.cache_seqlens = {0, 2, SL + 1, 3 * SL + 2}, s.seqlens_dtype = T == 2 ? kI64 : kI32;
        add("T" + std::to_string(T) + "_len" + std::to_string(SL) + (circ ? "_circular" : "_shift"), s);
      }
  {
    Conv1dUpdateSpec s;  // a (Bt, D, 1) x: the tokens dim given for one token
    s.tokens_dim = true;
    add("tokens_dim_T1", s);
  }
  // slots: random distinct, padding entries, pad_slot_id 0, int64 indices, all padding
  for (bool circ : {false, true}) {
    const std::string f = circ ? "circular" : "shift";
    Conv1dUpdateSpec s;
    s.batch = 5, s.slots = 9, s.tokens = 2, s.state_len = 5;
    if (circ) s.cache_seqlens = {4, 0, 7, 1, 12};
    add(f + "_slots", s);
    s.indices = {3, -1, 8, -1, 0};
    add(f + "_padding", s);
    s.indices = {2, 0, 4, 0, 6}, s.pad_slot_id = 0, s.idx_dtype = kI64;
    add(f + "_pad_slot_0", s);
    s.indices = {-1, -1, -1, -1, -1}, s.pad_slot_id = -1, s.idx_dtype = kI32;
    add(f + "_all_padding", s);
  }
  // gaps in every tensor
  for (bool circ : {false, true}) {
    Conv1dUpdateSpec s;
    s.strided = true, s.tokens = 3, s.state_len = 6, s.slots = 7, s.itype = kF16, s.state_dtype = kF16;
    if (circ) s.cache_seqlens = {5, 9, 2};
    add(std::string("strided_") + (circ ? "circular" : "shift"), s);
  }
  return m;
}

std::vector<NamedConv1dUpdateSpec> conv1d_update_out_of_pool_specs() {
  std::vector<NamedConv1dUpdateSpec> m;
  Conv1dUpdateSpec s;
  s.batch = 5, s.slots = 8, s.tokens = 2, s.state_len = 4, s.indices = {3, 8, -1, -7, 0}, s.seed = 6900;
  m.push_back({"shift", s});
  s.cache_seqlens = {1, 2, 3, 4, 5}, s.indices = {2, int64_t{1} << 40, 5, -1, 9}, s.idx_dtype = kI64, s.seed = 6901;
  m.push_back({"circular", s});
  return m;
}

}  // namespace selscan_test
