#include "conv1d_golden.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>
#include <utility>

#include "compare.h"
#include "tensor.h"

namespace selscan_test {

namespace fs = std::filesystem;

std::string conv1d_golden_dir() {
  if (const char* env = std::getenv("SELSCAN_CONV1D_GOLDEN_DIR"); env != nullptr && *env != '\0') return env;
#ifdef SELSCAN_CONV1D_GOLDEN_DIR
  return SELSCAN_CONV1D_GOLDEN_DIR;
#else
  return "tests/data/conv1d_golden";
#endif
}

namespace {

bool dtype_of(const std::string& s, int32_t* d) {
  if (s == "fp32") *d = SELSCAN_DTYPE_FLOAT32;
  else if (s == "fp16") *d = SELSCAN_DTYPE_FLOAT16;
  else if (s == "bf16") *d = SELSCAN_DTYPE_BFLOAT16;
  else if (s == "int32") *d = SELSCAN_DTYPE_INT32;
  else return false;
  return true;
}

// How a tensor of `dtype` may be stored: fp16 and bf16 as their 16-bit patterns.
bool descr_fits(int32_t dtype, const std::string& descr) {
  switch (dtype) {
    case SELSCAN_DTYPE_FLOAT32: return descr == "<f4";
    case SELSCAN_DTYPE_FLOAT16: return descr == "<u2" || descr == "<f2";
    case SELSCAN_DTYPE_BFLOAT16: return descr == "<u2";
    case SELSCAN_DTYPE_INT32: return descr == "<i4";
    default: return false;
  }
}

std::string file_of(const std::string& tensor, const Json& t) {
  const Json* f = t.find("file");
  return (f != nullptr && f->is(Json::Kind::string)) ? f->str : tensor + ".npy";
}

// cases.json, parsed and shape-checked: an array of objects, each with a string "name" and an object "tensors".
std::string read_cases(Json* cases) {
  const fs::path p = fs::path(conv1d_golden_dir()) / "cases.json";
  std::ifstream f(p);
  if (!f) return "cannot read " + p.string();
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string err = parse_json(ss.str(), cases);
  if (!err.empty()) return p.string() + ": " + err;
  if (!cases->is(Json::Kind::array)) return p.string() + ": not a JSON array of cases";
  for (size_t i = 0; i < cases->items.size(); ++i) {
    const Json& c = cases->items[i];
    const Json* name = c.find("name");
    const Json* tensors = c.find("tensors");
    if (name == nullptr || !name->is(Json::Kind::string) || name->str.empty() || tensors == nullptr ||
        !tensors->is(Json::Kind::object))
      return p.string() + ": case " + std::to_string(i) + " has no \"name\" string or no \"tensors\" object";
  }
  return {};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

// Element offsets (relative to element 0) of t in C order of its logical indices.
std::vector<int64_t> c_order_offsets(const Tensor& t) {
  std::vector<int64_t> offs;
  offs.reserve(static_cast<size_t>(t.numel()));
  std::vector<int64_t> idx(t.sizes.size(), 0);
  for (int64_t k = 0; k < t.numel(); ++k) {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides[i];
    offs.push_back(off);
    for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
      if (++idx[static_cast<size_t>(i)] < t.sizes[static_cast<size_t>(i)]) break;
      idx[static_cast<size_t>(i)] = 0;
    }
  }
  return offs;
}

// channel-last (b, d, t) tensors: stride 1 over d, then t, then b (upstream's channel-last kernels' layout).
const Layout kChannelLast{{1, 2, 0}, {}};

// The golden input `name` as a tensor in `layout`, holding exactly the file's elements; guards around.
Tensor input_tensor(const Conv1dGolden& g, const std::string& name, const Layout& layout = {}) {
  const Conv1dGoldenTensor& gt = g.tensors.at(name);
  Tensor t = make_tensor(gt.dtype, gt.shape, layout, kGuard);
  const std::vector<int64_t> offs = c_order_offsets(t);
  const size_t es = static_cast<size_t>(t.esize());
  for (size_t k = 0; k < offs.size(); ++k)
    std::memcpy(t.storage.data() + static_cast<size_t>(t.offset + offs[k]) * es, gt.data.bytes.data() + k * es, es);
  return t;
}

// An output of the golden `name`'s shape, poisoned (kPoison: NaN in every float format).
Tensor output_tensor(const Conv1dGolden& g, const std::string& name, int32_t dtype, const Layout& layout = {}) {
  Tensor t = make_tensor(dtype, g.tensors.at(name).shape, layout, kPoison);
  t.fill_bytes(kPoison);
  return t;
}

// The limit make_goldens.py checked upstream with (its README): one unit of the output's dtype relative to |ref|
// (a rounded output may land one unit from the rounding of the exact value), plus the fp32 arithmetic's error
// relative to the tensor's largest magnitude: a few-term sum and fast-math exp for element-wise outputs, sums over
// batch and time in another order for dweight and dbias.
constexpr double kFp32Rel = 2e-6, kFp32RelSums = 1e-5;
Tol golden_tol(int32_t dtype, bool sums, const std::vector<double>& ref) {
  double big = 1.0;
  for (double v : ref) big = std::max(big, std::fabs(v));
  const double unit = dtype == SELSCAN_DTYPE_FLOAT16 ? 0x1p-10 : dtype == SELSCAN_DTYPE_BFLOAT16 ? 0x1p-7 : 0x1p-23;
  return {unit, (sums ? kFp32RelSums : kFp32Rel) * big};
}

void expect_matches(const Conv1dGolden& g, const std::string& name, const Tensor& got, bool exact = false) {
  const std::vector<double> ref = g.tensors.at(name).values();
  const bool sums = name == "dweight" || name == "dbias";
  const Tol tol = exact ? Tol{0.0, 0.0} : golden_tol(got.dtype, sums, ref);
  EXPECT_TRUE(allclose(name, got.values(), ref, tol));
}

// Workspace for one call, on the call's device: host memory aligned as the ABI asks, or device memory (freed when
// this goes out of scope, after run_with_tensors has synchronised).
class Workspace {
 public:
  explicit Workspace(const DeviceMemory* dev) : dev_(dev) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    if (dev_ != nullptr && dev_ptr_ != nullptr) dev_->release(dev_ptr_);
  }
  void* get(size_t bytes) {
    if (bytes == 0) return nullptr;
    if (dev_ != nullptr) return dev_ptr_ = dev_->alloc(bytes);
    host_.assign(bytes + SELSCAN_WORKSPACE_ALIGNMENT, 0);
    const auto a = reinterpret_cast<uintptr_t>(host_.data());
    return reinterpret_cast<void*>((a + SELSCAN_WORKSPACE_ALIGNMENT - 1) / SELSCAN_WORKSPACE_ALIGNMENT *
                                   SELSCAN_WORKSPACE_ALIGNMENT);
  }

 private:
  const DeviceMemory* dev_;
  void* dev_ptr_ = nullptr;
  std::vector<unsigned char> host_;
};

void expect_unchanged(const char* what, const Tensor& before, const Tensor& after) {
  if (!after.present()) return;
  EXPECT_EQ(after.check_guards(kGuard), "") << what;
  EXPECT_TRUE(after.same_bytes(before)) << what << " (an input) was modified";
}

void expect_written(const char* what, const Tensor& t) {
  if (t.present()) {
    EXPECT_EQ(t.check_written(kPoison, kPoison), "") << what;
  }
}

void check_conv(const Conv1dGolden& g, const selscan_exec_t& exec, const DeviceMemory* dev) {
  const bool cl = g.text("layout") == "cl";
  const Layout xl = cl ? kChannelLast : Layout{};
  // Upstream's states are (B, W-1, D)-major with channel-last x; any strides serve selscan.
  const Layout sl = cl ? kChannelLast : Layout{};
  const int32_t it = g.tensors.at("x").dtype;
  const int32_t act = g.text("activation") == "silu" ? SELSCAN_ACTIVATION_SILU : SELSCAN_ACTIVATION_NONE;
  auto opt_in = [&](const char* n, const Layout& l = {}) { return g.has(n) ? input_tensor(g, n, l) : Tensor{}; };
  const Tensor x = input_tensor(g, "x", xl), weight = input_tensor(g, "weight"), bias = opt_in("bias"),
               seq_idx = opt_in("seq_idx"), init = opt_in("initial_states", sl), dout = input_tensor(g, "dout", xl),
               dfin = opt_in("dfinal_states", sl);

  // Forward.
  {
    Tensor xi = x, wi = weight, bi = bias, si = seq_idx, ii = init;
    Tensor out = output_tensor(g, "out", it, xl);
    Tensor fin = g.has("final_states") ? output_tensor(g, "final_states", it, sl) : Tensor{};
    const selscan_status_t st =
        run_with_tensors({&xi, &wi, &bi, &si, &ii, &out, &fin}, dev, [&](const Case::PtrMap& ptr) {
          selscan_conv1d_fwd_args_t a = SELSCAN_CONV1D_FWD_ARGS_INIT;
          a.x = xi.desc(ptr(xi));
          a.weight = wi.desc(ptr(wi));
          a.bias = bi.desc(ptr(bi));
          a.seq_idx = si.desc(ptr(si));
          a.initial_states = ii.desc(ptr(ii));
          a.activation = act;
          a.out = out.desc(ptr(out));
          a.final_states = fin.desc(ptr(fin));
          return selscan_conv1d_fwd(&a, &exec);
        });
    ASSERT_EQ(st, SELSCAN_STATUS_SUCCESS) << "selscan_conv1d_fwd: " << selscan_last_error();
    expect_written("out", out);
    expect_matches(g, "out", out);
    if (fin.present()) {
      expect_written("final_states", fin);
      expect_matches(g, "final_states", fin, /*exact=*/true);  // copies of inputs
    }
    for (auto [n, b, a] : {std::tuple{"x", &x, &xi}, {"weight", &weight, &wi}, {"bias", &bias, &bi},
                           {"seq_idx", &seq_idx, &si}, {"initial_states", &init, &ii}})
      expect_unchanged(n, *b, *a);
  }

  // Backward, with both reduction modes: upstream's dweight / dbias are fp32 accumulators, asked for as FLOAT32.
  for (int deterministic : {0, 1}) {
    SCOPED_TRACE("backward, deterministic " + std::to_string(deterministic));
    Tensor xi = x, wi = weight, bi = bias, si = seq_idx, ii = init, di = dout, dfi = dfin;
    Tensor dx = output_tensor(g, "dx", it, xl);
    Tensor dw = output_tensor(g, "dweight", SELSCAN_DTYPE_FLOAT32);
    Tensor db = g.has("dbias") ? output_tensor(g, "dbias", SELSCAN_DTYPE_FLOAT32) : Tensor{};
    Tensor dinit = g.has("dinitial_states") ? output_tensor(g, "dinitial_states", it, sl) : Tensor{};
    Workspace ws(dev);
    const selscan_status_t st = run_with_tensors(
        {&xi, &wi, &bi, &si, &ii, &di, &dfi, &dx, &dw, &db, &dinit}, dev, [&](const Case::PtrMap& ptr) {
          selscan_conv1d_bwd_args_t a = SELSCAN_CONV1D_BWD_ARGS_INIT;
          a.x = xi.desc(ptr(xi));
          a.weight = wi.desc(ptr(wi));
          a.bias = bi.desc(ptr(bi));
          a.seq_idx = si.desc(ptr(si));
          a.initial_states = ii.desc(ptr(ii));
          a.activation = act;
          a.deterministic = deterministic;
          a.dout = di.desc(ptr(di));
          a.dfinal_states = dfi.desc(ptr(dfi));
          a.dx = dx.desc(ptr(dx));
          a.dweight = dw.desc(ptr(dw));
          a.dbias = db.desc(ptr(db));
          a.dinitial_states = dinit.desc(ptr(dinit));
          size_t bytes = 0;
          const selscan_status_t q = selscan_conv1d_bwd_workspace_size(&a, &exec, &bytes);
          if (q != SELSCAN_STATUS_SUCCESS) return q;
          selscan_exec_t e = exec;
          e.workspace = ws.get(bytes);
          e.workspace_bytes = bytes;
          return selscan_conv1d_bwd(&a, &e);
        });
    ASSERT_EQ(st, SELSCAN_STATUS_SUCCESS) << "selscan_conv1d_bwd: " << selscan_last_error();
    for (auto [n, t] : {std::pair{"dx", &dx}, {"dweight", &dw}, {"dbias", &db}, {"dinitial_states", &dinit}}) {
      if (!t->present()) continue;
      expect_written(n, *t);
      expect_matches(g, n, *t);
    }
    for (auto [n, b, a] : {std::tuple{"x", &x, &xi}, {"weight", &weight, &wi}, {"bias", &bias, &bi},
                           {"seq_idx", &seq_idx, &si}, {"initial_states", &init, &ii}, {"dout", &dout, &di},
                           {"dfinal_states", &dfin, &dfi}})
      expect_unchanged(n, *b, *a);
  }
}

void check_update(const Conv1dGolden& g, const selscan_exec_t& exec, const DeviceMemory* dev) {
  auto opt_in = [&](const char* n) { return g.has(n) ? input_tensor(g, n) : Tensor{}; };
  const Tensor x = input_tensor(g, "x"), weight = input_tensor(g, "weight"), bias = opt_in("bias"),
               seqlens = opt_in("cache_seqlens"), idx = opt_in("conv_state_indices");
  Tensor xi = x, wi = weight, bi = bias, si = seqlens, ii = idx;
  Tensor state = input_tensor(g, "conv_state");  // in place
  Tensor out = output_tensor(g, "out", x.dtype);
  const selscan_status_t st =
      run_with_tensors({&xi, &wi, &bi, &si, &ii, &state, &out}, dev, [&](const Case::PtrMap& ptr) {
        selscan_conv1d_update_args_t a = SELSCAN_CONV1D_UPDATE_ARGS_INIT;
        a.x = xi.desc(ptr(xi));
        a.weight = wi.desc(ptr(wi));
        a.bias = bi.desc(ptr(bi));
        a.cache_seqlens = si.desc(ptr(si));
        a.conv_state_indices = ii.desc(ptr(ii));
        a.pad_slot_id = g.params.find("pad_slot_id") ? g.num("pad_slot_id") : -1;
        a.activation = g.text("activation") == "silu" ? SELSCAN_ACTIVATION_SILU : SELSCAN_ACTIVATION_NONE;
        a.conv_state = state.desc(ptr(state));
        a.out = out.desc(ptr(out));
        return selscan_conv1d_update(&a, &exec);
      });
  ASSERT_EQ(st, SELSCAN_STATUS_SUCCESS) << "selscan_conv1d_update: " << selscan_last_error();
  expect_written("out", out);
  expect_matches(g, "out", out);
  // The whole pool, untouched slots included, holds copies of inputs.
  EXPECT_EQ(state.check_guards(kGuard), "") << "conv_state";
  expect_matches(g, "conv_state_out", state, /*exact=*/true);
  for (auto [n, b, a] : {std::tuple{"x", &x, &xi}, {"weight", &weight, &wi}, {"bias", &bias, &bi},
                         {"cache_seqlens", &seqlens, &si}, {"conv_state_indices", &idx, &ii}})
    expect_unchanged(n, *b, *a);
}

}  // namespace

std::vector<double> Conv1dGoldenTensor::values() const {
  std::vector<double> v(static_cast<size_t>(data.numel()));
  for (size_t k = 0; k < v.size(); ++k) v[k] = load_real(dtype, data.bytes.data() + k * static_cast<size_t>(data.esize));
  return v;
}

int64_t Conv1dGolden::num(const char* key) const {
  const Json* v = params.find(key);
  return (v != nullptr && v->is(Json::Kind::number)) ? static_cast<int64_t>(v->num) : 0;
}

bool Conv1dGolden::flag(const char* key) const {
  const Json* v = params.find(key);
  return v != nullptr && (v->is(Json::Kind::boolean) ? v->b : !v->is(Json::Kind::null));
}

std::string Conv1dGolden::text(const char* key) const {
  const Json* v = params.find(key);
  return (v != nullptr && v->is(Json::Kind::string)) ? v->str : std::string();
}

Conv1dGoldenIndex conv1d_golden_index() {
  Conv1dGoldenIndex ix;
  const fs::path dir = conv1d_golden_dir();
  std::error_code ec;
  if (!fs::exists(dir / "cases.json", ec)) {
    // Case folders without the index are a broken extraction, not a set that was never generated.
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (!e.is_directory()) continue;
      for (const auto& f : fs::directory_iterator(e.path(), ec))
        if (f.path().extension() == ".npy") {
          ix.error = "no cases.json in " + dir.string() + ", but " + e.path().string() + " holds .npy files";
          return ix;
        }
    }
    return ix;
  }
  ix.present = true;
  Json cases;
  const std::string err = read_cases(&cases);
  if (!err.empty()) {
    ix.error = err;
    return ix;
  }
  std::vector<std::string> missing;
  for (const Json& c : cases.items) {
    const std::string name = c.find("name")->str;
    ix.names.push_back(name);
    for (const auto& [tn, t] : c.find("tensors")->members) {
      const fs::path f = dir / name / file_of(tn, t);
      if (!fs::is_regular_file(f, ec)) missing.push_back(f.string());
    }
  }
  if (ix.names.empty()) ix.error = (dir / "cases.json").string() + " lists no case";
  if (!missing.empty()) {
    std::ostringstream os;
    os << (dir / "cases.json").string() << " names " << missing.size() << " files that are missing:";
    for (size_t i = 0; i < missing.size() && i < 10; ++i) os << " " << missing[i];
    if (missing.size() > 10) os << " ...";
    ix.error = os.str();
  }
  return ix;
}

std::string load_conv1d_golden(const std::string& name, Conv1dGolden* g) {
  Json cases;
  const std::string err = read_cases(&cases);
  if (!err.empty()) return err;
  const Json* c = nullptr;
  for (const Json& k : cases.items)
    if (k.find("name")->str == name) c = &k;
  if (c == nullptr) return "cases.json has no case " + name;
  g->name = c->find("name")->str;
  g->dir = (fs::path(conv1d_golden_dir()) / g->name).string();
  g->params = *c;
  const std::string op = g->text("op");
  if (op != "conv" && op != "update") return g->name + ": op '" + op + "' is neither \"conv\" nor \"update\"";
  g->update = op == "update";
  for (const auto& [tn, t] : c->find("tensors")->members) {
    Conv1dGoldenTensor gt;
    const Json* dt = t.find("dtype");
    if (dt == nullptr || !dt->is(Json::Kind::string) || !dtype_of(dt->str, &gt.dtype))
      return g->name + "/" + tn + ": dtype is not one of fp32, fp16, bf16, int32";
    const Json* role = t.find("role");
    gt.output = role != nullptr && role->is(Json::Kind::string) && role->str == "output";
    const Json* shape = t.find("shape");
    if (shape == nullptr || !shape->is(Json::Kind::array)) return g->name + "/" + tn + ": no shape";
    for (const Json& s : shape->items) gt.shape.push_back(static_cast<int64_t>(s.num));
    const std::string path = (fs::path(g->dir) / file_of(tn, t)).string();
    const std::string e = read_npy_raw(path, &gt.data);
    if (!e.empty()) return e;
    if (!descr_fits(gt.dtype, gt.data.descr))
      return path + ": stored as " + gt.data.descr + ", which cannot hold " + dt->str;
    if (gt.data.shape != gt.shape)
      return path + ": shape " + shape_str(gt.data.shape) + ", cases.json says " + shape_str(gt.shape);
    g->tensors[tn] = std::move(gt);
  }
  const std::vector<const char*> needed = g->update
      ? std::vector<const char*>{"x", "weight", "conv_state", "out", "conv_state_out"}
      : std::vector<const char*>{"x", "weight", "dout", "out", "dx", "dweight"};
  for (const char* n : needed)
    if (!g->has(n)) return g->name + ": no tensor " + n;
  return {};
}

void check_conv1d_golden(const Conv1dGolden& g, const selscan_exec_t& exec, const DeviceMemory* dev) {
  SCOPED_TRACE(g.name + " (" + conv1d_golden_dir() + ")");
  if (g.update) check_update(g, exec, dev);
  else check_conv(g, exec, dev);
}

void check_every_conv1d_golden(const selscan_exec_t& exec, const DeviceMemory* dev) {
  const Conv1dGoldenIndex ix = conv1d_golden_index();
  ASSERT_EQ(ix.error, "");
  if (!ix.present)
    GTEST_SKIP() << "no cases.json in " << conv1d_golden_dir()
                 << ": causal-conv1d's goldens are not generated yet (tests/data/conv1d_golden/README.md)";
  ASSERT_FALSE(ix.names.empty());
  for (const std::string& name : ix.names) {
    Conv1dGolden g;
    const std::string err = load_conv1d_golden(name, &g);
    EXPECT_EQ(err, "") << name;
    if (err.empty()) check_conv1d_golden(g, exec, dev);
  }
  std::printf("checked %zu cases of %s\n", ix.names.size(), conv1d_golden_dir().c_str());
}

}  // namespace selscan_test
