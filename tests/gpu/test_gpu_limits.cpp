// GPU limits and non-finite values (issue #6), through the public ABI only.
//
// Sizes past 32-bit index arithmetic: more than 2^31 elements in one (Bt, D, L) tensor (reached through the
// channel offset and through the batch offset), chunk-state offsets (b*D + d)*nc*N past 2^31, dim 131072
// (twice a 16-bit grid dimension), seqlen 1, dstate 256 and one sequence of 2^20 tokens. Inputs are filled on
// the device from a host pattern (a prime-length block, doubled by device-to-device copies, so rows of any
// length start at different phases), every output is poisoned with NaN bytes first, the first and last
// element of every innermost output row must be written and finite, and sampled channels are checked against
// the library's CPU path run on a small host problem that holds only those channels (all batches; the B/C rows
// of their groups; variable dB/dC only when whole groups are sampled, since those sum over a group's channels).
// The reduced gradients (dA, dB, dC, dD, ddelta_bias) may also differ by 2 k u cond where that is larger
// (docs/numerics.md, "Conditioning-aware tolerance of the reduced gradients"; tests/common/reduced_cond.h).
//
// The biggest cases need tens of GiB of device memory: they are DISABLED_ (run them with
// --gtest_also_run_disabled_tests, or `tools/gpu-check.sh limits`) and skip when cudaMemGetInfo reports too
// little free memory.
//
// Non-finite values: NaN/Inf in u, delta, B, C, z, dout, h0 and an explosive A (positive, with large delta) give
// non-finite outputs at exactly the positions where the CPU path has them, finite outputs agree (the explosive
// cases: every output within upstream's tolerance or 2 k u cond, docs/numerics.md, "Conditioning-aware tolerance
// of the explosive comparison"), every output element is written, and no kernel hangs (a deadline on the stream
// ends the process instead).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "case.h"
#include "check.h"
#include "compare.h"
#include "cuda_memory.h"
#include "edge_cases.h"
#include "gpu_gate.h"
#include "support/dtype.h"
#include "limit_inputs.h"
#include "positions.h"
#include "reduced_cond.h"
#include "support/reference.h"
#include "selscan/selscan.h"
#include "tensor.h"

namespace selscan_test {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kPeriod = 1000003;                // prime: the repeat length of large input patterns
constexpr int64_t kFullyRandom = int64_t{1} << 22;  // inputs up to this many elements do not repeat at all
constexpr double kHangSeconds = 120.0;              // no single call here takes more than a few seconds
constexpr size_t kSlack = size_t{1} << 30;          // device memory left free for the runtime and kernels

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Waits for `stream` with a deadline. A kernel that never finishes (say, a compare-and-swap loop that spins on
// a NaN) fails loudly and ends the process, rather than hanging the suite until ctest's timeout.
void wait_or_die(cudaStream_t stream, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      ADD_FAILURE() << what << ": " << cudaGetErrorString(e);
      return;
    }
    if (ms_since(t0) > kHangSeconds * 1e3) {
      std::fprintf(stderr, "FATAL: %s: the GPU work has not finished after %.0f s (a hang); exiting\n", what,
                   kHangSeconds);
      std::fflush(stderr);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Input patterns: limit_pattern and Dist (tests/common/limit_inputs.h, shared with the CPU test that rebuilds
// these problems); element values through load_real (support/dtype.h).

// ---------------------------------------------------------------------------------------------- device tensors
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { reset(); }
  cudaError_t alloc(size_t n) {
    reset();
    if (n == 0) return cudaSuccess;
    const cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
      p = nullptr;
      return e;
    }
    bytes = n;
    return cudaSuccess;
  }
  void reset() {
    if (p) cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
};

// A strided device tensor. `sizes` empty = not part of the problem (absent: NULL descriptor).
struct DevTensor {
  int32_t dtype = SELSCAN_DTYPE_FLOAT32;
  std::vector<int64_t> sizes, strides;
  DevBuf buf;

  void shape(int32_t dt, const std::vector<int64_t>& sz, const std::vector<int64_t>& st = {}) {
    dtype = dt;
    sizes = sz;
    strides = st.empty() ? contiguous_strides(sz) : st;
  }
  bool used() const { return !sizes.empty(); }
  int64_t esize() const { return dtype_size(dtype); }
  int64_t span() const {  // elements from element 0 to the last one, inclusive
    int64_t s = 1;
    for (size_t i = 0; i < sizes.size(); ++i) s += (sizes[i] - 1) * strides[i];
    return s;
  }
  size_t bytes() const { return used() ? static_cast<size_t>(span() * esize()) : 0; }
  unsigned char* at(int64_t elem) const { return static_cast<unsigned char*>(buf.p) + elem * esize(); }
  selscan_tensor_t desc() const {
    selscan_tensor_t t{};
    t.data = buf.p;
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      t.sizes[i] = sizes[i];
      t.strides[i] = strides[i];
    }
    return t;
  }
};

void alloc_tensor(DevTensor& t, const char* name) {
  const cudaError_t e = t.buf.alloc(t.bytes());
  ASSERT_EQ(e, cudaSuccess) << name << ": cudaMalloc of " << t.bytes() / kGiB << " GiB: " << cudaGetErrorString(e);
}

// Input: allocated and filled with `dist` values, repeating with period kPeriod when large.
void fill_input(DevTensor& t, const char* name, Dist dist, uint64_t seed) {
  if (!t.used()) return;
  alloc_tensor(t, name);
  if (::testing::Test::HasFatalFailure()) return;
  const int64_t n = t.span(), es = t.esize();
  const int64_t period = n <= kFullyRandom ? n : kPeriod;
  const std::vector<unsigned char> h = limit_pattern(t.dtype, dist, period, seed);
  CUDA_OK(cudaMemcpy(t.buf.p, h.data(), h.size(), cudaMemcpyHostToDevice));
  for (int64_t done = period; done < n;) {  // value at element e = pattern[e % period]
    const int64_t c = std::min(done, n - done);
    CUDA_OK(cudaMemcpy(t.at(done), t.buf.p, static_cast<size_t>(c * es), cudaMemcpyDeviceToDevice));
    done += c;
  }
}

// Output: allocated, every byte 0xFF (NaN in every float format).
void alloc_output(DevTensor& t, const char* name) {
  if (!t.used()) return;
  alloc_tensor(t, name);
  if (::testing::Test::HasFatalFailure()) return;
  CUDA_OK(cudaMemset(t.buf.p, 0xFF, t.bytes()));
}

bool all_ff(const unsigned char* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (p[i] != 0xFF) return false;
  return true;
}

// The first and last element of every innermost row of an output are written (no NaN poison left) and finite.
// The outer dimensions are merged where their strides allow; the innermost merged one is read with one strided
// copy (cudaMemcpy2D) per index of the rest.
void expect_rows_written(const char* name, const DevTensor& t) {
  if (!t.used() || t.buf.p == nullptr) return;
  const int n = static_cast<int>(t.sizes.size());
  const int64_t es = t.esize();
  int64_t unwritten = 0, nonfinite = 0, checked = 0, first_bad = -1;
  auto check = [&](const std::vector<unsigned char>& h, int64_t base_index) {
    for (size_t i = 0; i < h.size() / es; ++i, ++checked) {
      const unsigned char* p = h.data() + i * es;
      if (all_ff(p, es)) {
        if (unwritten++ == 0 && first_bad < 0) first_bad = base_index + static_cast<int64_t>(i);
      } else if (!finite_element(t.dtype, p)) {
        if (nonfinite++ == 0 && first_bad < 0) first_bad = base_index + static_cast<int64_t>(i);
      }
    }
  };
  if (n == 1) {  // a (D,) vector: all of it
    std::vector<unsigned char> h(static_cast<size_t>(t.sizes[0] * es));
    if (t.strides[0] == 1 || t.sizes[0] == 1)
      CUDA_OK(cudaMemcpy(h.data(), t.buf.p, h.size(), cudaMemcpyDeviceToHost));
    else
      CUDA_OK(cudaMemcpy2D(h.data(), es, t.buf.p, t.strides[0] * es, es, t.sizes[0], cudaMemcpyDeviceToHost));
    check(h, 0);
  } else {
    // Outer dims (all but the last), innermost first, size-1 dims dropped, merged where contiguous.
    std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride)
    for (int i = n - 2; i >= 0; --i) {
      if (t.sizes[i] == 1) continue;
      if (!dims.empty() && t.strides[i] == dims.back().first * dims.back().second)
        dims.back().first *= t.sizes[i];
      else
        dims.emplace_back(t.sizes[i], t.strides[i]);
    }
    if (dims.empty()) dims.emplace_back(1, 1);
    const int64_t rows = dims[0].first, pitch = dims[0].second;
    int64_t loops = 1;
    for (size_t k = 1; k < dims.size(); ++k) loops *= dims[k].first;
    ASSERT_LE(loops, 1 << 20) << name << ": layout too scattered for this check";
    ASSERT_LE(pitch * es, int64_t{0x7fffffff}) << name << ": row pitch beyond cudaMemcpy2D's limit";
    const int64_t inner = t.sizes[n - 1], inner_stride = t.strides[n - 1];
    std::vector<unsigned char> h(static_cast<size_t>(rows * es));
    for (int64_t l = 0; l < loops; ++l) {
      int64_t base = 0, rest = l;
      for (size_t k = 1; k < dims.size(); ++k) {
        base += (rest % dims[k].first) * dims[k].second;
        rest /= dims[k].first;
      }
      for (int64_t edge : {int64_t{0}, inner - 1}) {
        CUDA_OK(cudaMemcpy2D(h.data(), es, t.at(base + edge * inner_stride), pitch * es, es, rows,
                             cudaMemcpyDeviceToHost));
        check(h, l * rows);
        if (inner == 1) break;
      }
    }
  }
  EXPECT_EQ(unwritten, 0) << name << ": " << unwritten << " of " << checked
                          << " row ends still hold the NaN poison (first at gathered index " << first_bad << ")";
  EXPECT_EQ(nonfinite, 0) << name << ": " << nonfinite << " of " << checked << " row ends are not finite";
}

// ---------------------------------------------------------------------------------------------- the problem
enum class Layout {
  contiguous,
  inner,       // delta, out, dout, ddelta with strides (L, Bt*L, 1), as mamba_inner_fn passes them
  broadcast,   // u, delta, dout with channel stride 0 (the same row for every channel of a batch)
  transposed,  // L == 1: every (Bt, D, 1) tensor with strides (1, Bt, 3)
};

struct LimitSpec {
  int64_t Bt = 1, D = 1, L = 1, N = 16, G = 1;
  int32_t itype = SELSCAN_DTYPE_FLOAT32;
  bool cplx = false, varB = true, varC = true;
  bool hasD = true, hasZ = false, hasBias = true, softplus = true, hasH0 = false;
  bool last_state = true, recompute_out_z = false, det = true;
  Layout layout = Layout::contiguous;
  std::vector<int64_t> groups;   // sampled groups (empty: all)
  std::vector<int64_t> offsets;  // sampled channels within each sampled group (empty: the whole group)
  uint64_t seed = 1;

  int64_t nc() const { return (L + 2047) / 2048; }
  int64_t cpg() const { return D / G; }
  std::string str() const {
    std::ostringstream os;
    os << "Bt=" << Bt << " D=" << D << " L=" << L << " N=" << N << " G=" << G << " " << dtype_name(itype)
       << (cplx ? " complex" : " real") << " B=" << (varB ? "var" : "const") << " C=" << (varC ? "var" : "const")
       << (hasD ? " +D" : "") << (hasZ ? " +z" : "") << (hasBias ? " +bias" : "") << (softplus ? " +softplus" : "")
       << (hasH0 ? " +h0" : "") << (det ? " deterministic" : " atomics")
       << (layout == Layout::inner ? " strides=inner" : layout == Layout::broadcast ? " inputs broadcast over D"
           : layout == Layout::transposed ? " strides=(1,Bt,3)" : "");
    return os.str();
  }
};

std::vector<int64_t> bdl_strides(const LimitSpec& s, const std::string& name) {
  const int64_t Bt = s.Bt, D = s.D, L = s.L;
  switch (s.layout) {
    case Layout::inner:
      if (name == "delta" || name == "out" || name == "dout" || name == "ddelta") return {L, Bt * L, 1};
      break;
    case Layout::broadcast:
      if (name == "u" || name == "delta" || name == "dout") return {L, 0, 1};
      break;
    case Layout::transposed: return {1, Bt, 3};
    default: break;
  }
  return {D * L, L, 1};
}

using Named = std::vector<std::pair<DevTensor*, const char*>>;

struct DevProblem {
  DevTensor u, delta, A, B, C, Dv, z, bias, h0;       // inputs
  DevTensor out, out_z, x, last_state;                // forward outputs
  DevTensor dout;                                     // backward input
  DevTensor du, ddelta, dA, dB, dC, dD, dz, dbias, dh0, out_z_bwd;  // backward outputs
  DevBuf ws;

  std::vector<const DevTensor*> inputs() const { return {&u, &delta, &A, &B, &C, &Dv, &z, &bias, &h0}; }
};

void shape_all(const LimitSpec& s, DevProblem& g) {
  const int32_t it = s.itype, wt = s.cplx ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const int64_t Bt = s.Bt, D = s.D, L = s.L, N = s.N, G = s.G, Lbc = s.cplx ? 2 * L : L;
  auto bdl = [&](DevTensor& t, const char* name) { t.shape(it, {Bt, D, L}, bdl_strides(s, name)); };
  auto bc = [&](DevTensor& t, bool var) {
    if (var) t.shape(it, {Bt, G, N, Lbc});
    else t.shape(wt, {D, N});
  };
  bdl(g.u, "u");
  bdl(g.delta, "delta");
  g.A.shape(wt, {D, N});
  bc(g.B, s.varB);
  bc(g.C, s.varC);
  if (s.hasD) g.Dv.shape(SELSCAN_DTYPE_FLOAT32, {D});
  if (s.hasZ) bdl(g.z, "z");
  if (s.hasBias) g.bias.shape(SELSCAN_DTYPE_FLOAT32, {D});
  if (s.hasH0) g.h0.shape(wt, {Bt, D, N});
  bdl(g.out, "out");
  if (s.hasZ) bdl(g.out_z, "out_z");
  g.x.shape(wt, {Bt, D, s.nc(), 2 * N});
  if (s.last_state) g.last_state.shape(wt, {Bt, D, N});
  bdl(g.dout, "dout");
  bdl(g.du, "du");
  bdl(g.ddelta, "ddelta");
  g.dA.shape(wt, {D, N});
  bc(g.dB, s.varB);
  bc(g.dC, s.varC);
  if (s.hasD) g.dD.shape(SELSCAN_DTYPE_FLOAT32, {D});
  if (s.hasZ) bdl(g.dz, "dz");
  if (s.hasBias) g.dbias.shape(SELSCAN_DTYPE_FLOAT32, {D});
  if (s.hasH0) g.dh0.shape(wt, {Bt, D, N});
  if (s.hasZ && s.recompute_out_z) bdl(g.out_z_bwd, "out_z");
}

selscan_exec_t cuda_exec(int32_t device, void* ws = nullptr, size_t ws_bytes = 0) {
  selscan_exec_t e = SELSCAN_EXEC_INIT;
  e.device_kind = SELSCAN_DEVICE_CUDA;
  e.device_index = device;
  e.stream = nullptr;
  e.workspace = ws;
  e.workspace_bytes = ws_bytes;
  return e;
}

selscan_fwd_args_t fwd_args(const LimitSpec& s, const DevProblem& g) {
  selscan_fwd_args_t a{};
  a.struct_size = sizeof(a);
  a.u = g.u.desc();
  a.delta = g.delta.desc();
  a.A = g.A.desc();
  a.B = g.B.desc();
  a.C = g.C.desc();
  a.D = g.Dv.desc();
  a.z = g.z.desc();
  a.delta_bias = g.bias.desc();
  a.h0 = g.h0.desc();
  a.delta_softplus = s.softplus ? 1 : 0;
  a.out = g.out.desc();
  a.out_z = g.out_z.desc();
  a.x = g.x.desc();
  a.last_state = g.last_state.desc();
  return a;
}

selscan_bwd_args_t bwd_args(const LimitSpec& s, const DevProblem& g) {
  selscan_bwd_args_t a = bwd_args_with_inputs_of(fwd_args(s, g), s.det);
  a.dout = g.dout.desc();
  a.x = g.x.desc();
  if (s.hasZ) a.out = g.out.desc();
  a.du = g.du.desc();
  a.ddelta = g.ddelta.desc();
  a.dA = g.dA.desc();
  a.dB = g.dB.desc();
  a.dC = g.dC.desc();
  a.dD = g.dD.desc();
  a.dz = g.dz.desc();
  a.ddelta_bias = g.dbias.desc();
  a.dh0 = g.dh0.desc();
  a.out_z = g.out_z_bwd.desc();
  return a;
}

// ---------------------------------------------------------------------------------------------- sampling
// The sampled channels: every `offsets` channel of every sampled group, so that the host problem keeps
// contiguous groups of equal size (its group j is the full problem's group grp[j]).
struct Sample {
  std::vector<int64_t> ch, grp;
  bool whole = false;  // whole groups sampled: the variable dB/dC sums over a group's channels are comparable
};

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

Sample sample_of(const LimitSpec& s) {
  Sample m;
  m.grp = s.groups.empty() ? iota(s.G) : s.groups;
  const std::vector<int64_t> offs = s.offsets.empty() ? iota(s.cpg()) : s.offsets;
  m.whole = static_cast<int64_t>(offs.size()) == s.cpg();
  for (int64_t g : m.grp)
    for (int64_t o : offs) m.ch.push_back(g * s.cpg() + o);
  return m;
}

using Maps = std::vector<std::vector<int64_t>>;  // per dim: the source index of each destination index

// Copies src[maps[0][i0], maps[1][i1], ...] into a new contiguous host tensor of shape (|maps[0]|, ...): one
// device-to-host copy per innermost row when the last map is the identity, else one per element.
void gather(const DevTensor& src, const Maps& maps, Tensor* dst, unsigned char fill = kGuard) {
  std::vector<int64_t> shape;
  for (const auto& m : maps) shape.push_back(static_cast<int64_t>(m.size()));
  *dst = make_tensor(src.dtype, shape, {}, fill);
  const int n = static_cast<int>(maps.size());
  const int64_t es = src.esize();
  const std::vector<int64_t>& last = maps[n - 1];
  bool run = true;
  for (size_t i = 0; i < last.size(); ++i) run = run && last[i] == static_cast<int64_t>(i);
  int64_t outer = 1;
  for (int k = 0; k < n - 1; ++k) outer *= static_cast<int64_t>(maps[k].size());
  for (int64_t o = 0; o < outer; ++o) {
    int64_t so = 0, dof = 0, rest = o;
    for (int k = n - 2; k >= 0; --k) {
      const int64_t sz = static_cast<int64_t>(maps[k].size()), j = rest % sz;
      rest /= sz;
      so += maps[k][static_cast<size_t>(j)] * src.strides[k];
      dof += j * dst->strides[k];
    }
    unsigned char* d = dst->storage.data() + (dst->offset + dof) * es;
    const int64_t cnt = static_cast<int64_t>(last.size()), st = src.strides[n - 1];
    if (run && (cnt == 1 || st == 1)) {
      CUDA_OK(cudaMemcpy(d, src.at(so), static_cast<size_t>(cnt * es), cudaMemcpyDeviceToHost));
    } else if (run) {
      CUDA_OK(cudaMemcpy2D(d, es, src.at(so), st * es, es, cnt, cudaMemcpyDeviceToHost));
    } else {
      for (int64_t q = 0; q < cnt; ++q)
        CUDA_OK(cudaMemcpy(d + q * es, src.at(so + last[static_cast<size_t>(q)] * st), es, cudaMemcpyDeviceToHost));
    }
  }
}

// Values of a contiguous host tensor (complex: re, im).
std::vector<double> vals(const Tensor& t) {
  const int64_t n = t.numel(), es = t.esize();
  const unsigned char* p = t.storage.data() + t.offset * es;
  if (t.dtype == SELSCAN_DTYPE_COMPLEX64) {
    std::vector<double> v(static_cast<size_t>(2 * n));
    for (int64_t i = 0; i < 2 * n; ++i) v[static_cast<size_t>(i)] = load_real(SELSCAN_DTYPE_FLOAT32, p + 4 * i);
    return v;
  }
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = load_real(t.dtype, p + es * i);
  return v;
}

struct Worst {
  double ratio = 0.0;
  std::string what;
  void see(const std::string& w, double r) {
    if (r > ratio) ratio = r, what = w;
  }
};

void expect_close(const std::string& what, const Tensor& gpu, const Tensor& cpu, Tol tol, Worst& worst) {
  const std::vector<double> g = vals(gpu), c = vals(cpu);
  EXPECT_TRUE(allclose(what + " (GPU vs CPU path, sampled channels)", g, c, tol));
  worst.see(what, worst_ratio(g, c, tol));
}

// A reduced gradient, GPU vs CPU path: upstream's tolerance `tol`, or 2 k u cond where larger (both paths carry
// fp32 error; docs/numerics.md, "Conditioning-aware tolerance of the reduced gradients"). The scale is computed
// only for elements outside `tol`.
void expect_close_reduced(const std::string& what, const Tensor& gpu, const Tensor& cpu, Tol tol, Worst& worst,
                          ReducedCond& rc) {
  const std::vector<double> g = vals(gpu), c = vals(cpu);
  std::vector<double> bound(g.size(), 0.0);
  for (size_t i = 0; i < g.size() && i < c.size(); ++i)
    if (!(std::fabs(g[i] - c[i]) <= tol.atol + tol.rtol * std::fabs(c[i])))
      bound[i] = 2.0 * kCondK * kU32 * rc.at(what, i);
  EXPECT_TRUE(allclose(what + " (GPU vs CPU path, sampled channels)", g, c, tol, &bound));
  worst.see(what, worst_ratio(g, c, tol, &bound));
}

// ---------------------------------------------------------------------------------------------- one run
// Forward and backward of `s` on device 0; sampled channels against the CPU path.
void run_limit(const LimitSpec& s) {
  SCOPED_TRACE(s.str());
  ASSERT_TRUE(s.varB || s.varC || s.G == 1) << "constant B and C need G = 1";
  ASSERT_EQ(s.D % s.G, 0);
  DevProblem g;
  shape_all(s, g);

  // Device memory: the larger of the forward's and the backward's sets (the forward's out_z and last_state,
  // and out when there is no z, are released before the backward). The workspace is checked when known.
  size_t in = 0;
  for (const DevTensor* t : g.inputs()) in += t->bytes();
  const size_t fwd_need = in + g.out.bytes() + g.out_z.bytes() + g.x.bytes() + g.last_state.bytes();
  size_t bwd_need = in + g.x.bytes() + (s.hasZ ? g.out.bytes() : 0) + g.dout.bytes();
  for (const DevTensor* t : {&g.du, &g.ddelta, &g.dA, &g.dB, &g.dC, &g.dD, &g.dz, &g.dbias, &g.dh0, &g.out_z_bwd})
    bwd_need += t->bytes();
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = std::max(fwd_need, bwd_need);
  if (need + kSlack > free_b)
    GTEST_SKIP() << "needs about " << need / kGiB << " GiB of free device memory plus the backward's workspace; "
                 << "device 0 has " << free_b / kGiB << " GiB free of " << total_b / kGiB;

  // Inputs (each with its own seed) and poisoned forward outputs.
  uint64_t seed = s.seed * 1000;
  fill_input(g.u, "u", Dist::normal, ++seed);
  fill_input(g.delta, "delta", Dist::delta, ++seed);
  fill_input(g.A, "A", Dist::decay, ++seed);
  fill_input(g.B, "B", Dist::normal, ++seed);
  fill_input(g.C, "C", Dist::normal, ++seed);
  fill_input(g.Dv, "D", Dist::normal, ++seed);
  fill_input(g.z, "z", Dist::normal, ++seed);
  fill_input(g.bias, "delta_bias", Dist::bias, ++seed);
  fill_input(g.h0, "h0", Dist::normal, ++seed);
  for (auto& [t, name] : Named{{&g.out, "out"}, {&g.out_z, "out_z"}, {&g.x, "x"}, {&g.last_state, "last_state"}})
    alloc_output(*t, name);
  if (::testing::Test::HasFatalFailure()) return;

  const selscan_fwd_args_t fa = fwd_args(s, g);
  selscan_exec_t fe = cuda_exec(0);
  size_t fws = 0;
  ASSERT_EQ(selscan_fwd_workspace_size(&fa, &fe, &fws), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  DevBuf fwd_ws;
  CUDA_OK(fwd_ws.alloc(fws));
  fe.workspace = fwd_ws.p;
  fe.workspace_bytes = fws;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(selscan_fwd(&fa, &fe), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  wait_or_die(nullptr, "selscan_fwd");
  CUDA_OK(cudaGetLastError());
  const double fwd_ms = ms_since(t0);
  for (auto& [t, name] : Named{{&g.out, "out"}, {&g.out_z, "out_z"}, {&g.x, "x"}, {&g.last_state, "last_state"}})
    expect_rows_written(name, *t);

  // The host problem of the sampled channels, inputs copied from the device.
  const Sample m = sample_of(s);
  const int64_t Bt = s.Bt, K = static_cast<int64_t>(m.ch.size()), L = s.L, N = s.N;
  const int64_t Gs = (s.varB || s.varC) ? static_cast<int64_t>(m.grp.size()) : 1;
  const int64_t Lbc = s.cplx ? 2 * L : L;
  const int32_t it = s.itype, wt = s.cplx ? SELSCAN_DTYPE_COMPLEX64 : SELSCAN_DTYPE_FLOAT32;
  const Maps bdl{iota(Bt), m.ch, iota(L)}, dn{m.ch, iota(N)}, d1{m.ch}, bdn{iota(Bt), m.ch, iota(N)},
      bgnl{iota(Bt), m.grp, iota(N), iota(Lbc)}, xm{iota(Bt), m.ch, iota(s.nc()), iota(2 * N)};
  Case sub;
  CaseSpec& ss = sub.spec;
  ss.batch = Bt, ss.dim = K, ss.seqlen = L, ss.dstate = N, ss.groups = Gs;
  ss.itype = it, ss.complex = s.cplx, ss.var_B = s.varB, ss.var_C = s.varC;
  ss.has_D = s.hasD, ss.has_z = s.hasZ, ss.has_delta_bias = s.hasBias, ss.softplus = s.softplus;
  ss.has_h0 = s.hasH0, ss.with_x = true, ss.with_last_state = s.last_state, ss.with_dh0 = s.hasH0;
  ss.recompute_out_z = s.hasZ && s.recompute_out_z;
  gather(g.u, bdl, &sub.u);
  gather(g.delta, bdl, &sub.delta);
  gather(g.A, dn, &sub.A);
  gather(g.B, s.varB ? bgnl : dn, &sub.B);
  gather(g.C, s.varC ? bgnl : dn, &sub.C);
  if (s.hasD) gather(g.Dv, d1, &sub.D);
  if (s.hasZ) gather(g.z, bdl, &sub.z);
  if (s.hasBias) gather(g.bias, d1, &sub.delta_bias);
  if (s.hasH0) gather(g.h0, bdn, &sub.h0);
  if (::testing::Test::HasFatalFailure()) return;
  sub.out = make_tensor(it, {Bt, K, L}, {}, kPoison);
  if (s.hasZ) sub.out_z = make_tensor(it, {Bt, K, L}, {}, kPoison);
  sub.x = make_tensor(wt, {Bt, K, s.nc(), 2 * N}, {}, kPoison);
  if (s.last_state) sub.last_state = make_tensor(wt, {Bt, K, N}, {}, kPoison);
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run_fwd(sub, cpu_exec(0)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const double cpu_fwd_ms = ms_since(t0);

  const Tolerances tol = upstream_tolerances(it, s.hasZ, s.varB, s.varC);
  Worst worst;
  Tensor gout, gx, tmp;
  gather(g.out, bdl, &gout);
  gather(g.x, xm, &gx);
  if (::testing::Test::HasFatalFailure()) return;
  expect_close("out", gout, sub.out, tol.out, worst);
  expect_close("x", gx, sub.x, tol.x, worst);
  if (s.hasZ) {
    gather(g.out_z, bdl, &tmp);
    expect_close("out_z", tmp, sub.out_z, tol.out, worst);
  }
  if (s.last_state) {
    gather(g.last_state, bdn, &tmp);
    expect_close("last_state", tmp, sub.last_state, tol.last_state, worst);
  }
  // The CPU backward gets the GPU's saved tensors, so the backward is compared on identical inputs.
  sub.out = gout;
  sub.x = gx;

  // Backward: release what it does not read, then dout and the poisoned gradients.
  g.out_z.buf.reset();
  g.last_state.buf.reset();
  if (!s.hasZ) g.out.buf.reset();
  fill_input(g.dout, "dout", Dist::normal, ++seed);
  for (auto& [t, name] : Named{{&g.du, "du"}, {&g.ddelta, "ddelta"}, {&g.dA, "dA"}, {&g.dB, "dB"}, {&g.dC, "dC"},
                         {&g.dD, "dD"}, {&g.dz, "dz"}, {&g.dbias, "ddelta_bias"}, {&g.dh0, "dh0"},
                         {&g.out_z_bwd, "out_z(bwd)"}})
    alloc_output(*t, name);
  if (::testing::Test::HasFatalFailure()) return;
  const selscan_bwd_args_t ba = bwd_args(s, g);
  size_t ws = 0;
  selscan_exec_t be = cuda_exec(0);
  ASSERT_EQ(selscan_bwd_workspace_size(&ba, &be, &ws), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  if (ws + kSlack / 2 > free_b)
    GTEST_SKIP() << "the backward's workspace needs " << ws / kGiB << " GiB; " << free_b / kGiB << " GiB left free";
  CUDA_OK(g.ws.alloc(ws));
  be.workspace = g.ws.p;
  be.workspace_bytes = ws;
  size_t used_free = 0;
  CUDA_OK(cudaMemGetInfo(&used_free, &total_b));
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(selscan_bwd(&ba, &be), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  wait_or_die(nullptr, "selscan_bwd");
  CUDA_OK(cudaGetLastError());
  const double bwd_ms = ms_since(t0);
  for (auto& [t, name] : Named{{&g.du, "du"}, {&g.ddelta, "ddelta"}, {&g.dA, "dA"}, {&g.dB, "dB"}, {&g.dC, "dC"},
                         {&g.dD, "dD"}, {&g.dz, "dz"}, {&g.dbias, "ddelta_bias"}, {&g.dh0, "dh0"},
                         {&g.out_z_bwd, "out_z(bwd)"}})
    expect_rows_written(name, *t);

  gather(g.dout, bdl, &sub.dout);
  sub.du = make_tensor(it, {Bt, K, L}, {}, kPoison);
  sub.ddelta = make_tensor(it, {Bt, K, L}, {}, kPoison);
  sub.dA = make_tensor(wt, {K, N}, {}, kPoison);
  sub.dB = s.varB ? make_tensor(it, {Bt, Gs, N, Lbc}, {}, kPoison) : make_tensor(wt, {K, N}, {}, kPoison);
  sub.dC = s.varC ? make_tensor(it, {Bt, Gs, N, Lbc}, {}, kPoison) : make_tensor(wt, {K, N}, {}, kPoison);
  if (s.hasD) sub.dD = make_tensor(SELSCAN_DTYPE_FLOAT32, {K}, {}, kPoison);
  if (s.hasZ) sub.dz = make_tensor(it, {Bt, K, L}, {}, kPoison);
  if (s.hasBias) sub.ddelta_bias = make_tensor(SELSCAN_DTYPE_FLOAT32, {K}, {}, kPoison);
  if (s.hasH0) sub.dh0 = make_tensor(wt, {Bt, K, N}, {}, kPoison);
  if (ss.recompute_out_z) sub.out_z_bwd = make_tensor(it, {Bt, K, L}, {}, kPoison);
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run_bwd(sub, cpu_exec(0), s.det), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const double cpu_bwd_ms = ms_since(t0);

  // Per-row gradients, and the per-channel sums over batch and time. Those sums add Bt*L float32 terms in a
  // different order on each path; the rounding difference grows like the square root of the term count, so
  // their absolute tolerance grows from upstream's (set for a few thousand terms) by sqrt(Bt*L / 4096).
  // Every reduced gradient (those sums, and variable dB/dC: sums over a group's channels) may also differ by
  // 2 k u cond where that is larger: its terms cancel, or carry errors from slowly decaying recurrences.
  const double red = std::max(1.0, std::sqrt(static_cast<double>(Bt * L) / 4096.0));
  auto sum_tol = [&](Tol t) { return Tol{t.rtol, t.atol * red}; };
  ReducedCond rc(sub);
  gather(g.du, bdl, &tmp);
  expect_close("du", tmp, sub.du, tol.du, worst);
  gather(g.ddelta, bdl, &tmp);
  expect_close("ddelta", tmp, sub.ddelta, tol.ddelta, worst);
  gather(g.dA, dn, &tmp);
  expect_close_reduced("dA", tmp, sub.dA, sum_tol(tol.dA), worst, rc);
  if (!s.varB) {
    gather(g.dB, dn, &tmp);
    expect_close_reduced("dB", tmp, sub.dB, sum_tol(tol.dB), worst, rc);
  } else if (m.whole) {
    gather(g.dB, bgnl, &tmp);
    expect_close_reduced("dB", tmp, sub.dB, tol.dB, worst, rc);
  }
  if (!s.varC) {
    gather(g.dC, dn, &tmp);
    expect_close_reduced("dC", tmp, sub.dC, sum_tol(tol.dC), worst, rc);
  } else if (m.whole) {
    gather(g.dC, bgnl, &tmp);
    expect_close_reduced("dC", tmp, sub.dC, tol.dC, worst, rc);
  }
  if (s.hasD) {
    gather(g.dD, d1, &tmp);
    expect_close_reduced("dD", tmp, sub.dD, sum_tol(tol.dD), worst, rc);
  }
  if (s.hasBias) {
    gather(g.dbias, d1, &tmp);
    expect_close_reduced("ddelta_bias", tmp, sub.ddelta_bias, sum_tol(tol.ddelta_bias), worst, rc);
  }
  if (s.hasZ) {
    gather(g.dz, bdl, &tmp);
    expect_close("dz", tmp, sub.dz, tol.dz, worst);
  }
  if (s.hasH0) {
    gather(g.dh0, bdn, &tmp);
    expect_close("dh0", tmp, sub.dh0, tol.dh0, worst);
  }
  if (ss.recompute_out_z) {
    gather(g.out_z_bwd, bdl, &tmp);
    expect_close("out_z(bwd)", tmp, sub.out_z_bwd, tol.out, worst);
  }
  std::printf("[ limits ] %s\n    GPU fwd %.1f ms, bwd %.1f ms (workspace %.2f GiB, %.1f GiB of device memory in "
              "use); CPU on %lld sampled channels: fwd %.0f ms, bwd %.0f ms; worst error/tolerance %.3f (%s)%s\n",
              s.str().c_str(), fwd_ms, bwd_ms, ws / kGiB, (total_b - used_free) / kGiB, static_cast<long long>(K),
              cpu_fwd_ms, cpu_bwd_ms, worst.ratio, worst.what.c_str(),
              (s.varB || s.varC) && !m.whole ? "; variable dB/dC not compared (partial groups)" : "");
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------- sizes
// (Bt, D, L) tensors of 4096 x 524800 = 2 149 580 800 elements: channels 4092..4095 start or end past 2^31
// elements (2^32 bytes of bf16). Variable B/C in 64 groups: groups 0 and 63 are sampled whole, so the
// variable dB/dC sums are compared too. The atomic (non-deterministic) backward: its deterministic mode would
// keep 8 fp32 images of dB and dC here (32 GiB more). About 44 GiB of device memory.
TEST(GpuLimits, DISABLED_ElementsBeyond2e31ByChannel) {
  REQUIRE_GPU();
  LimitSpec s;
  s.Bt = 1, s.D = 4096, s.L = 524800, s.N = 16, s.G = 64;
  s.itype = SELSCAN_DTYPE_BFLOAT16;
  s.hasZ = true, s.recompute_out_z = true, s.det = false;
  s.groups = {0, 63};
  s.seed = 61;
  run_limit(s);
}

// 16 x 8192 x 16400 = 2 149 580 800 elements reached through the batch offset (u: b*D*L + d*L), and with
// mamba_inner_fn's strides through the channel offset (delta: b*L + d*Bt*L). Constant B and C with h0, so every
// gradient is per channel and compared.
TEST(GpuLimits, DISABLED_ElementsBeyond2e31ByBatch) {
  REQUIRE_GPU();
  LimitSpec s;
  s.Bt = 16, s.D = 8192, s.L = 16400, s.N = 16, s.G = 1;
  s.itype = SELSCAN_DTYPE_FLOAT16;
  s.varB = false, s.varC = false, s.hasH0 = true;
  s.layout = Layout::inner;
  s.offsets = {0, 1, 2047, 4095, 4096, 8000, 8190, 8191};
  s.seed = 62;
  run_limit(s);
}

// Chunk states x: Bt*D*nc*N = 2 * 2101248 * 2 * 256 = 2 151 677 952 > 2^31 (upstream computes this offset in
// 32-bit int: issue #884), and the float offset (b*D + d)*nc*2N passes 2^32. u, delta and dout are broadcast
// over channels (stride 0) so the inputs fit; channels still differ through A, D and delta_bias. Sampled
// channels straddle each boundary: (b*D + d)*nc*2N crosses 2^31 floats at b = 0, d = 2097152 and 2^32 floats
// (2^31 float2 states) at b = 1, d = 2093056. About 58 GiB of device memory (52 + 6 of workspace).
TEST(GpuLimits, DISABLED_ChunkStateOffsetsBeyond2e31) {
  REQUIRE_GPU();
  LimitSpec s;
  s.Bt = 2, s.D = 2101248, s.L = 2049, s.N = 256, s.G = 1;
  s.itype = SELSCAN_DTYPE_BFLOAT16;
  s.last_state = false;
  s.layout = Layout::broadcast;
  s.offsets = {0, 1, 777777, 1500000, 2093055, 2093056, 2097151, 2097152, 2101247};
  s.seed = 63;
  run_limit(s);
}

// One sequence of 2^20 tokens (512 chunks of saved states), fp32, slow decays that carry far; whole groups 0
// and 3 of 4 sampled.
TEST(GpuLimits, DISABLED_MillionTokenSequence) {
  REQUIRE_GPU();
  LimitSpec s;
  s.Bt = 1, s.D = 64, s.L = int64_t{1} << 20, s.N = 16, s.G = 4;
  s.itype = SELSCAN_DTYPE_FLOAT32;
  s.hasZ = true, s.hasH0 = true;
  s.groups = {0, 3};
  s.seed = 64;
  run_limit(s);
}

// dim 131072: twice what a 16-bit grid dimension holds (upstream's grid is (Bt, D): D <= 65535). Groups of 4
// channels; the sampled groups hold channels 0..3, 65532..65535, 65536..65539 and 131068..131071.
TEST(GpuLimits, Dim131072ForwardAndBackward) {
  REQUIRE_GPU();
  LimitSpec s;
  s.Bt = 2, s.D = 131072, s.L = 37, s.N = 8, s.G = 32768;
  s.itype = SELSCAN_DTYPE_FLOAT16;
  s.hasZ = true, s.hasH0 = true, s.recompute_out_z = true;
  s.groups = {0, 16383, 16384, 32767};
  s.seed = 65;
  run_limit(s);
}

// ---------------------------------------------------------------------------------------------- small edges
// A device exec with workspace for both backward modes of a case.
struct GpuExec {
  DevBuf ws;
  selscan_exec_t exec = cuda_exec(0);
  explicit GpuExec(Case& c) {
    size_t need = 0;
    for (bool det : {true, false}) {
      const selscan_bwd_args_t a = c.bwd_args(host_ptr, det);
      size_t b = 0;
      EXPECT_EQ(selscan_bwd_workspace_size(&a, &exec, &b), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
      need = std::max(need, b);
    }
    EXPECT_EQ(ws.alloc(need), cudaSuccess);
    exec.workspace = ws.p;
    exec.workspace_bytes = need;
  }
};

// The shared float64-oracle check (tests/common/check.h) on device copies: guards, poison, every output.
void check_on_gpu(const CaseSpec& spec) {
  Case probe = make_case(spec);
  GpuExec ex(probe);
  const DeviceMemory dm = cuda_memory([] { wait_or_die(nullptr, "selscan call"); });
  check_case(spec, ex.exec, &dm);
}

// The CPU suite's edge cases (tests/common/edge_cases.h), here on the GPU: softplus between 1 and its threshold,
// and a backward at exactly one chunk without x. Also rerun with the thread-states kernels forced.
TEST(GpuEdges, SoftplusMidRange) {
  REQUIRE_GPU();
  for (const NamedSpec& n : softplus_mid_range_cases()) {
    SCOPED_TRACE(n.name);
    check_on_gpu(n.spec);
  }
}

TEST(GpuEdges, OneChunkBackwardWithoutX) {
  REQUIRE_GPU();
  for (const NamedSpec& n : one_chunk_without_x_cases()) {
    SCOPED_TRACE(n.name);
    check_on_gpu(n.spec);
  }
}

// seqlen 1: a single step (no scan at all), every layout, including (Bt, D, 1) tensors whose last stride is
// not 1 (allowed when L == 1). Every channel compared with the CPU path, and with the float64 oracle.
TEST(GpuLimits, SeqLen1) {
  REQUIRE_GPU();
  {
    LimitSpec s;
    s.Bt = 4, s.D = 96, s.L = 1, s.N = 16, s.G = 4;
    s.hasZ = true, s.hasH0 = true, s.recompute_out_z = true;
    s.seed = 71;
    run_limit(s);
  }
  {
    LimitSpec s;
    s.Bt = 3, s.D = 64, s.L = 1, s.N = 16, s.G = 2;
    s.itype = SELSCAN_DTYPE_BFLOAT16, s.cplx = true, s.varB = false;
    s.hasZ = true, s.hasH0 = true;
    s.layout = Layout::transposed;
    s.seed = 72;
    run_limit(s);
  }
  {
    LimitSpec s;
    s.Bt = 5, s.D = 40, s.L = 1, s.N = 8, s.G = 1;
    s.itype = SELSCAN_DTYPE_FLOAT16, s.varB = false, s.varC = false;
    s.hasD = false, s.hasBias = false, s.softplus = false, s.last_state = false;
    s.layout = Layout::transposed;
    s.seed = 73;
    run_limit(s);
  }
  uint64_t seed = 7400;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_BFLOAT16})
    for (bool cx : {false, true}) {
      CaseSpec c;
      c.batch = 3, c.dim = 12, c.seqlen = 1, c.dstate = 16, c.groups = 3;
      c.itype = it, c.complex = cx, c.has_h0 = cx, c.var_B = !cx;
      c.strides = cx ? Strides::padded : Strides::contiguous;
      c.seed = ++seed;
      check_on_gpu(c);
    }
}

// dstate 256 (the maximum) across a chunk boundary (nc = 2): real and complex, variable and constant B/C.
TEST(GpuLimits, Dstate256) {
  REQUIRE_GPU();
  {
    LimitSpec s;
    s.Bt = 2, s.D = 16, s.L = 2500, s.N = 256, s.G = 2;
    s.hasZ = true, s.hasH0 = true;
    s.seed = 81;
    run_limit(s);
  }
  {
    LimitSpec s;
    s.Bt = 2, s.D = 8, s.L = 2500, s.N = 256, s.G = 2;
    s.itype = SELSCAN_DTYPE_BFLOAT16, s.cplx = true, s.varB = false;
    s.hasZ = true, s.det = false;
    s.seed = 82;
    run_limit(s);
  }
  {
    LimitSpec s;
    s.Bt = 1, s.D = 8, s.L = 2100, s.N = 256, s.G = 1;
    s.itype = SELSCAN_DTYPE_FLOAT16, s.cplx = true, s.varB = false, s.varC = false, s.hasH0 = true;
    s.seed = 83;
    run_limit(s);
  }
  uint64_t seed = 8400;
  for (bool cx : {false, true}) {
    CaseSpec c;
    c.batch = 2, c.dim = 4, c.seqlen = 2100, c.dstate = 256, c.groups = 2;
    c.complex = cx, c.has_h0 = !cx, c.var_C = !cx;
    c.slow_decay = !cx;  // complex: undamped rotations over thousands of steps are ill-conditioned in fp32
    c.seed = ++seed;
    check_on_gpu(c);
  }
}

// ---------------------------------------------------------------------------------------------- non-finite
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// kBig, Outcome, same_positions, tol_of, oracle_of and cond_bound_of: tests/common/positions.h (shared with the
// CPU test that rebuilds the explosive cases, tests/cpu/test_conditioning_explosive.cpp).

// Forward and backward of one edited case on the GPU (device copies) and on the CPU path; every output
// written on the GPU, and compared position by position.
Outcome run_both(const CaseSpec& spec, const std::function<void(Case&)>& edit, bool det, bool explosive) {
  Outcome o;
  Case base = make_case(spec);
  edit(base);
  Case gpu = base, cpu = base;
  GpuExec ex(base);
  const DeviceMemory dm = cuda_memory([] { wait_or_die(nullptr, "selscan call"); });
  EXPECT_EQ(run_fwd(gpu, ex.exec, &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  EXPECT_EQ(run_fwd(cpu, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  EXPECT_EQ(run_bwd(gpu, ex.exec, det, &dm), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  EXPECT_EQ(run_bwd(cpu, cpu_exec(2), det), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  if (::testing::Test::HasFailure()) return o;
  RefFwd f;
  RefBwd g;
  if (explosive) {
    const RefProblem rp = ref_problem(base);
    f = ref_forward(rp, /*with_cond=*/true);
    g = ref_backward(rp, ref_dout(base), /*with_cond=*/true);
  }
  const Tolerances tol = upstream_tolerances(spec.itype, spec.has_z, spec.var_B, spec.var_C);
  using NamedOut = std::vector<std::pair<const char*, Tensor*>>;
  auto compare_all = [&](const NamedOut& gs, const NamedOut& cs) {
    ASSERT_EQ(gs.size(), cs.size());
    for (size_t i = 0; i < gs.size(); ++i) {
      const std::string name = gs[i].first;
      const std::string err = gs[i].second->check_written(kPoison, kPoison);
      EXPECT_TRUE(err.empty()) << name << " (GPU): " << err;
      const bool pairs = gs[i].second->dtype == SELSCAN_DTYPE_COMPLEX64 ||
                         (spec.complex && ((name == "dB" && spec.var_B) || (name == "dC" && spec.var_C)));
      std::vector<double> band, bound;
      // An oracle-backed (explosive) case: every output within upstream's tolerance, or 2 k u cond where larger
      // (the states grow over hundreds of steps; both paths' fp32 errors grow with them, and outputs and
      // gradients cancel; docs/numerics.md, "Conditioning-aware tolerance of the explosive comparison").
      if (explosive) band = oracle_of(name, base, f, g), bound = cond_bound_of(name, base, f, g, 2.0);
      EXPECT_TRUE(same_positions(name, gs[i].second->values(), cs[i].second->values(), tol_of(tol, name), pairs,
                                 explosive ? &band : nullptr, o, bound.empty() ? nullptr : &bound));
    }
  };
  compare_all(gpu.named_fwd_outputs(), cpu.named_fwd_outputs());
  compare_all(gpu.named_bwd_outputs(), cpu.named_bwd_outputs());
  return o;
}

const char* value_name(double v) { return std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

// One NaN / +Inf / -Inf in u, delta, variable or constant B and C, z, dout or h0 (batch 1, channel 2; step 13,
// or step 2040 of 2100 so that it crosses the chunk boundary into the saved states), real and complex weights,
// fp32 and bf16, with and without softplus, both backward modes (a NaN must stall neither the fixed-order
// reductions nor the atomics).
TEST(GpuLimitsNonFinite, InjectedValuesAtCpuPositions) {
  REQUIRE_GPU();
  uint64_t seed = 66000;
  int k = 0;
  for (const std::string w : {"u", "delta", "B", "B const", "C", "C const", "z", "dout", "h0"})
    for (double v : {kNaN, kInf, -kInf})
      for (bool cx : {false, true}) {
        ++k;
        CaseSpec s;
        s.batch = 2, s.dim = 4, s.dstate = 8, s.groups = 2;
        s.seqlen = k % 3 == 0 ? 2100 : 300;
        s.itype = k % 2 ? SELSCAN_DTYPE_BFLOAT16 : SELSCAN_DTYPE_FLOAT32;
        s.complex = cx;
        s.softplus = k % 4 != 1;
        s.has_z = true;
        s.has_h0 = w == "h0" || k % 5 == 0;
        s.var_B = w != "B const";
        s.var_C = w != "C const";
        s.seed = ++seed;
        const int64_t t = s.seqlen > 2048 ? 2040 : 13;
        const bool det = k % 2 == 0;
        SCOPED_TRACE(w + " = " + value_name(v) + (det ? ", deterministic" : ", atomics") + "; " + s.str());
        const Outcome o = run_both(
            s,
            [&](Case& c) {
              if (w == "u") c.u.set({1, 2, t}, v);
              else if (w == "delta") c.delta.set({1, 2, t}, v);
              else if (w == "z") c.z.set({1, 2, t}, v);
              else if (w == "dout") c.dout.set({1, 2, t}, v);
              else if (w == "B") c.B.set({1, 1, 3, cx ? 2 * t + 1 : t}, v);
              else if (w == "C") c.C.set({1, 1, 3, cx ? 2 * t : t}, v);
              else if (w == "B const") c.B.setc({2, 3}, cd(v, 0.5));
              else if (w == "C const") c.C.setc({2, 3}, cd(v, -0.5));
              else c.h0.setc({1, 2, 3}, cd(v, 0.0));
            },
            det, false);
        // softplus(-inf) = 0: a step with delta 0, everything finite.
        if (w == "delta" && v < 0 && s.softplus) EXPECT_EQ(o.nonfinite, 0);
        else EXPECT_GT(o.nonfinite, 0) << "no non-finite value reached any output";
        if (::testing::Test::HasFailure()) return;
      }
}

// An explosive A (positive rates, delta in [4, 8)): float32 states overflow within a few dozen steps (L = 64,
// A = 0.25 + n/16), or only after ~1200 steps so that infinite states cross the chunk boundary into x and the
// backward's recompute (L = 2100, A = 0.0125). Where the float64 oracle is finite but beyond 1e30 the two
// float32 paths may differ; everywhere else they agree position by position, within upstream's tolerance or
// 2 k u cond where larger (the fp32 error of both paths grows with the states; tests/common/positions.h,
// cond_bound_of; tests/cpu/test_conditioning_explosive.cpp rebuilds these cases on the CPU).
TEST(GpuLimitsNonFinite, ExplosiveAAtCpuPositions) {
  REQUIRE_GPU();
  for (const ExplosiveCase& e : explosive_cases()) {  // the cases and A: tests/common/positions.h
    const CaseSpec& s = e.spec;
    SCOPED_TRACE(std::string(e.det ? "deterministic; " : "atomics; ") + s.str());
    const Outcome o = run_both(s, set_explosive_A, e.det, true);
    EXPECT_GT(o.nonfinite + o.indeterminate, 0) << "the states never left float32's range";
    EXPECT_GT(o.finite, 0) << "no position was comparable";
    std::printf("[ explosive ] L=%lld %s %s %s: %lld finite, %lld non-finite (%lld NaN-vs-Inf), %lld beyond 1e30 "
                "skipped\n",
                static_cast<long long>(s.seqlen), dtype_name(s.itype), s.complex ? "complex" : "real",
                s.var_B ? "varBC" : "constBC", static_cast<long long>(o.finite), static_cast<long long>(o.nonfinite),
                static_cast<long long>(o.kind_differs), static_cast<long long>(o.indeterminate));
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace selscan_test
