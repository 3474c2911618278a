// Shared pieces of the benchmark suite: problem shapes, tensor descriptors over the public ABI, input values,
// and the byte / exp counts the counters report. Host-only; no CUDA headers (bench_gpu.cpp adds those).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "selscan/selscan.h"

namespace selscan_bench {

// One benchmarked configuration. The defaults are the issue #4 configuration: fp32 real weights, variable B/C
// with one group, D, z and delta_bias present, softplus on.
struct Shape {
  int64_t batch = 1, dim = 1, seqlen = 1, dstate = 16;
  selscan_dtype_t itype = SELSCAN_DTYPE_BFLOAT16;
  int64_t groups = 1;

  int64_t nchunks() const { return (seqlen + SELSCAN_CHUNK - 1) / SELSCAN_CHUNK; }
  int64_t btl() const { return batch * dim * seqlen; }        // elements of one (Bt, D, L) tensor
  int64_t bc_numel() const { return batch * groups * dstate * seqlen; }  // one variable B/C
  int64_t state_updates() const { return btl() * dstate; }  // Bt*D*L*N: one exp2 and one FMA each
};

// Which tensors a call touches; mirrors what the timed call passes.
enum class Mode {
  fwd,        // training forward: out, out_z, x (upstream's selective_scan_cuda.fwd)
  fwd_infer,  // prefill / inference forward: out, out_z, last_state; no chunk states x
  bwd,        // backward (non-deterministic reductions allowed)
  bwd_det     // backward with deterministic = 1
};

inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::fwd: return "fwd";
    case Mode::fwd_infer: return "fwd_infer";
    case Mode::bwd: return "bwd";
    case Mode::bwd_det: return "bwd_det";
  }
  return "?";
}
inline bool is_bwd(Mode m) { return m == Mode::bwd || m == Mode::bwd_det; }

inline const char* dtype_name(selscan_dtype_t t) {
  switch (t) {
    case SELSCAN_DTYPE_FLOAT32: return "fp32";
    case SELSCAN_DTYPE_FLOAT16: return "fp16";
    case SELSCAN_DTYPE_BFLOAT16: return "bf16";
    case SELSCAN_DTYPE_COMPLEX64: return "c64";
  }
  return "?";
}

inline int64_t dtype_bytes(selscan_dtype_t t) {
  switch (t) {
    case SELSCAN_DTYPE_FLOAT32: return 4;
    case SELSCAN_DTYPE_FLOAT16: return 2;
    case SELSCAN_DTYPE_BFLOAT16: return 2;
    case SELSCAN_DTYPE_COMPLEX64: return 8;
  }
  return 0;
}

// "BtxDxL:N", the notation of issue #4. Benchmark names are "<section>/<mode>/<itype>/<shape>[/...]" and
// bench/report.py parses them back, so keep the two in step.
inline std::string shape_name(const Shape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.dim) + "x" + std::to_string(s.seqlen) + ":" +
         std::to_string(s.dstate);
}

// ------------------------------------------------------------------------------------------ byte counts
// Minimum traffic: every input the call needs read once, every output written once (fp32 real weights).
inline int64_t min_bytes(const Shape& s, Mode m) {
  const int64_t it = dtype_bytes(s.itype);
  const int64_t btl = s.btl() * it;
  const int64_t bc = s.bc_numel() * it;
  const int64_t dn = s.dim * s.dstate * 4;  // A / dA
  const int64_t dvec = s.dim * 4;           // D, delta_bias and their grads
  const int64_t xb = s.batch * s.dim * s.nchunks() * 2 * s.dstate * 4;
  const int64_t state = s.batch * s.dim * s.dstate * 4;
  if (!is_bwd(m)) {
    int64_t in = 3 * btl /*u delta z*/ + 2 * bc /*B C*/ + dn /*A*/ + 2 * dvec /*D bias*/;
    int64_t out = 2 * btl /*out out_z*/ + (m == Mode::fwd ? xb : state);
    return in + out;
  }
  // backward reads u, delta, z, dout, out (pre-gate, for dz), B, C, A, D, bias and, for L > 2048 only, the
  // chunk states x; it writes du, ddelta, dz, dB, dC, dA, dD, ddelta_bias.
  int64_t in = 5 * btl + 2 * bc + dn + 2 * dvec + (s.nchunks() > 1 ? xb : 0);
  int64_t out = 3 * btl + 2 * bc + dn + 2 * dvec;
  return in + out;
}

// exp2 evaluations of the decay exp(delta*A): one per (b, d, t, n), the same lower bound for both directions
// (the backward needs each decay once more than zero times; softplus/silu add O(Bt*D*L), ignored).
inline double exps(const Shape& s) { return static_cast<double>(s.state_updates()); }

// ------------------------------------------------------------------------------------------ values
// Cheap deterministic generator (splitmix64): input values only need to be finite and realistic in range.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>((next() >> 40) * (1.0 / 16777216.0));
  }
};

inline uint16_t float_to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // NaN stays NaN
  b += 0x7FFFu + ((b >> 16) & 1u);                       // round to nearest even
  return static_cast<uint16_t>(b >> 16);
}

// Round to nearest even IEEE binary16 (normal range, subnormals and overflow to inf).
inline uint16_t float_to_f16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t absb = b & 0x7FFFFFFFu;
  if (absb > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (absb >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (absb < 0x38800000u) {  // below 2^-14: subnormal half, value = m * 2^-24
    float a;
    std::memcpy(&a, &absb, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t r = absb + 0xFFFu + ((absb >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

// Fills `n` elements of `dtype` at `dst` with uniform values in [lo, hi).
inline void fill_uniform(void* dst, selscan_dtype_t dtype, int64_t n, float lo, float hi, uint64_t seed) {
  Rng r(seed);
  if (dtype == SELSCAN_DTYPE_FLOAT32) {
    float* p = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) p[i] = r.uniform(lo, hi);
  } else {
    uint16_t* p = static_cast<uint16_t*>(dst);
    const bool bf = dtype == SELSCAN_DTYPE_BFLOAT16;
    for (int64_t i = 0; i < n; ++i) {
      const float v = r.uniform(lo, hi);
      p[i] = bf ? float_to_bf16(v) : float_to_f16(v);
    }
  }
}

// Value ranges: delta goes through delta_bias + softplus to ~[0.02, 0.3] (Mamba's dt range), A is S4D-real
// style -(n+1), the rest are O(1). Nothing overflows, so a non-finite output means a broken kernel.
struct Range {
  float lo, hi;
};
inline Range range_u() { return {-2.f, 2.f}; }
inline Range range_delta() { return {-3.f, -1.f}; }
inline Range range_bias() { return {-1.f, 0.f}; }
inline Range range_bc() { return {-1.f, 1.f}; }
inline Range range_z() { return {-2.f, 2.f}; }
inline Range range_dout() { return {-1.f, 1.f}; }
inline Range range_D() { return {0.5f, 1.5f}; }

inline void fill_A(float* a, const Shape& s) {
  for (int64_t d = 0; d < s.dim; ++d)
    for (int64_t n = 0; n < s.dstate; ++n) a[d * s.dstate + n] = -static_cast<float>(n + 1);
}

// ------------------------------------------------------------------------------------------ descriptors
inline selscan_tensor_t tensor(void* data, selscan_dtype_t dtype, std::initializer_list<int64_t> sizes) {
  selscan_tensor_t t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(sizes.size());
  int i = 0;
  for (int64_t v : sizes) t.sizes[i++] = v;
  int64_t stride = 1;  // contiguous, row-major
  for (int k = t.ndim - 1; k >= 0; --k) {
    t.strides[k] = stride;
    stride *= t.sizes[k];
  }
  return t;
}

inline selscan_tensor_t t_btl(void* p, const Shape& s) { return tensor(p, s.itype, {s.batch, s.dim, s.seqlen}); }
inline selscan_tensor_t t_bc(void* p, const Shape& s) {
  return tensor(p, s.itype, {s.batch, s.groups, s.dstate, s.seqlen});
}
inline selscan_tensor_t t_dn(void* p, const Shape& s) { return tensor(p, SELSCAN_DTYPE_FLOAT32, {s.dim, s.dstate}); }
inline selscan_tensor_t t_d(void* p, const Shape& s) { return tensor(p, SELSCAN_DTYPE_FLOAT32, {s.dim}); }
inline selscan_tensor_t t_x(void* p, const Shape& s) {
  return tensor(p, SELSCAN_DTYPE_FLOAT32, {s.batch, s.dim, s.nchunks(), 2 * s.dstate});
}
inline selscan_tensor_t t_state(void* p, const Shape& s) {
  return tensor(p, SELSCAN_DTYPE_FLOAT32, {s.batch, s.dim, s.dstate});
}

// Pointers of one complete set of buffers (host or device). Absent = nullptr.
struct Buffers {
  void *u = nullptr, *delta = nullptr, *A = nullptr, *B = nullptr, *C = nullptr, *D = nullptr, *z = nullptr,
       *bias = nullptr;
  void *out = nullptr, *out_z = nullptr, *x = nullptr, *last_state = nullptr;
  void *dout = nullptr, *du = nullptr, *ddelta = nullptr, *dA = nullptr, *dB = nullptr, *dC = nullptr,
       *dD = nullptr, *dz = nullptr, *dbias = nullptr;
};

// Buffer sizes in bytes, in one place so the CPU and GPU fixtures allocate the same things.
struct Sizes {
  int64_t btl, bc, dn, dvec, x, state;
  explicit Sizes(const Shape& s)
      : btl(s.btl() * dtype_bytes(s.itype)),
        bc(s.bc_numel() * dtype_bytes(s.itype)),
        dn(s.dim * s.dstate * 4),
        dvec(s.dim * 4),
        x(s.batch * s.dim * s.nchunks() * 2 * s.dstate * 4),
        state(s.batch * s.dim * s.dstate * 4) {}
};

inline selscan_fwd_args_t fwd_args(const Shape& s, const Buffers& b, bool with_x, bool with_last_state) {
  selscan_fwd_args_t a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.u = t_btl(b.u, s);
  a.delta = t_btl(b.delta, s);
  a.A = t_dn(b.A, s);
  a.B = t_bc(b.B, s);
  a.C = t_bc(b.C, s);
  a.D = t_d(b.D, s);
  a.z = t_btl(b.z, s);
  a.delta_bias = t_d(b.bias, s);
  a.delta_softplus = 1;
  a.out = t_btl(b.out, s);
  a.out_z = t_btl(b.out_z, s);
  if (with_x) a.x = t_x(b.x, s);
  if (with_last_state) a.last_state = t_state(b.last_state, s);
  return a;
}

inline selscan_bwd_args_t bwd_args(const Shape& s, const Buffers& b, bool deterministic) {
  selscan_bwd_args_t a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.u = t_btl(b.u, s);
  a.delta = t_btl(b.delta, s);
  a.A = t_dn(b.A, s);
  a.B = t_bc(b.B, s);
  a.C = t_bc(b.C, s);
  a.D = t_d(b.D, s);
  a.z = t_btl(b.z, s);
  a.delta_bias = t_d(b.bias, s);
  a.delta_softplus = 1;
  a.deterministic = deterministic ? 1 : 0;
  a.dout = t_btl(b.dout, s);
  a.x = t_x(b.x, s);  // upstream always passes x; it is only read when L > 2048
  a.out = t_btl(b.out, s);
  a.du = t_btl(b.du, s);
  a.ddelta = t_btl(b.ddelta, s);
  a.dA = t_dn(b.dA, s);
  a.dB = t_bc(b.dB, s);
  a.dC = t_bc(b.dC, s);
  a.dD = t_d(b.dD, s);
  a.dz = t_btl(b.dz, s);
  a.ddelta_bias = t_d(b.dbias, s);
  return a;
}

// The primary output of a mode, for the "was it written, is it finite" check after warm-up.
inline void* primary_output(const Buffers& b, Mode m) { return is_bwd(m) ? b.du : b.out_z; }

// True when every element of the (Bt, D, L) itype tensor copy `h` (n elements) is finite.
inline bool all_finite(const void* h, selscan_dtype_t t, int64_t n) {
  if (t == SELSCAN_DTYPE_FLOAT32) {
    const float* p = static_cast<const float*>(h);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) return false;
    return true;
  }
  const uint16_t* p = static_cast<const uint16_t*>(h);
  const uint16_t exp_mask = t == SELSCAN_DTYPE_BFLOAT16 ? 0x7F80u : 0x7C00u;
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & exp_mask) == exp_mask) return false;
  return true;
}

inline std::string status_message(selscan_status_t st) {
  std::string m = selscan_status_string(st);
  const char* detail = selscan_last_error();
  if (detail && *detail) m += std::string(": ") + detail;
  return m;
}

// Registration entry points (bench_cpu.cpp, bench_gpu.cpp).
void register_cpu_benchmarks();
// Registers the GPU benchmarks, or returns false with `why` set when they cannot run here.
bool register_gpu_benchmarks(std::string* why);
// Frees the GPU buffers cached between runs of one benchmark (call before exit).
void release_gpu_resources();

}  // namespace selscan_bench
