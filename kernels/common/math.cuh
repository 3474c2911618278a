// Arithmetic shared by every kernel: the fast-math primitives the numerics contract names (docs/numerics.md), a
// float2 complex type, the weight type of real (float) and complex (float2) weights with its operations, warp
// shuffles, sums and scans.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/warp/warp_scan.cuh>

namespace selscan::kern {

constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------------- fast math
// exp2 as upstream's --use_fast_math build runs it: ex2.approx.ftz (flushes denormal results to zero).
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// softplus = max(x, 0) + log1p(e) with e = exp(-|x|) in (0, 1], log1p(e) = e q(e) and q a degree-8 polynomial
// (near-minimax on [0, 1], relative error 2e-7 in fp32 Horner): 12 instructions and one MUFU (ex2), branch-free,
// against 32 with branches for upstream's log1pf(__expf(x)); the same accuracy (a few ulp). One MUFU matters: the
// forward has little MUFU issue to spare (a form with a second one, 2 atanh(e / (2 + e)) with an rcp, was slower).
// F.softplus's threshold holds without a test: for x > 20 the log term (< 2.1e-9) is below half an ulp of x, so the
// result is x. NaN propagates through the log term. With `dsp`, also d softplus / dx = sigmoid(x) from the same e.
__device__ __forceinline__ float softplus(float x, float* dsp = nullptr) {
  const float e = exp2_fast(-fabsf(x) * kLog2e);
  float q = 0.0053808596f;
  q = fmaf(q, e, -0.030095546f);
  q = fmaf(q, e, 0.07918085f);
  q = fmaf(q, e, -0.1374361f);
  q = fmaf(q, e, 0.19143426f);
  q = fmaf(q, e, -0.2485242f);
  q = fmaf(q, e, 0.3332026f);
  q = fmaf(q, e, -0.49999547f);
  q = fmaf(q, e, 1.f);
  if (dsp != nullptr) *dsp = __fdividef(x >= 0.f ? 1.f : e, 1.f + e);  // 1 for x > 20, as upstream's threshold
  return fmaf(e, q, fmaxf(x, 0.f));
}

// Upstream's form, log1pf(__expf(x)) below the threshold: 32 instructions with branches. The branches serialise it, so
// converting 8 values at once needs fewer live registers than with softplus(); the forward's register-starved
// variant (16-bit inputs at 128 registers) measured faster with it (validation/optimisation-log.md).
__device__ __forceinline__ float softplus_serial(float x) { return x <= 20.f ? log1pf(__expf(x)) : x; }

// z * sigmoid(z) with the fast-math division upstream's build uses.
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.f + __expf(-z)); }

// ---------------------------------------------------------------------------------------------- complex
// float2 as complex: x = real, y = imaginary.
__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
  return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ float2 cfma(float2 a, float2 b, float2 c) {  // a * b + c
  return make_float2(fmaf(a.x, b.x, fmaf(-a.y, b.y, c.x)), fmaf(a.x, b.y, fmaf(a.y, b.x, c.y)));
}
__device__ __forceinline__ float2 cadd(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float2 cscale(float2 a, float s) { return make_float2(a.x * s, a.y * s); }
__device__ __forceinline__ float2 cconj(float2 a) { return make_float2(a.x, -a.y); }
// exp(x) for x = re*ln2-scaled real part and a plain imaginary part: 2^re * (cos im + i sin im).
// The phase is reduced to [-pi, pi] first (two-constant Cody-Waite): __sincosf is accurate only there, and
// slowly decaying complex states accumulate phases far outside it.
__device__ __forceinline__ float2 cexp2_fast(float re_log2, float im) {
  const float k = rintf(im * 0.159154943f);
  const float r = fmaf(-k, -1.74845553e-07f, fmaf(-k, 6.28318548f, im));
  float s, c;
  __sincosf(r, &s, &c);
  const float m = exp2_fast(re_log2);
  return make_float2(m * c, m * s);
}

// ---------------------------------------------------------------------------------------------- shuffles
__device__ __forceinline__ float shfl_up(float v, int delta) { return __shfl_up_sync(kFullMask, v, delta); }
__device__ __forceinline__ float2 shfl_up(float2 v, int delta) {
  return make_float2(__shfl_up_sync(kFullMask, v.x, delta), __shfl_up_sync(kFullMask, v.y, delta));
}
__device__ __forceinline__ float shfl_down(float v, int delta) { return __shfl_down_sync(kFullMask, v, delta); }
__device__ __forceinline__ float2 shfl_down(float2 v, int delta) {
  return make_float2(__shfl_down_sync(kFullMask, v.x, delta), __shfl_down_sync(kFullMask, v.y, delta));
}
__device__ __forceinline__ float shfl(float v, int lane) { return __shfl_sync(kFullMask, v, lane); }
__device__ __forceinline__ float2 shfl(float2 v, int lane) {
  return make_float2(__shfl_sync(kFullMask, v.x, lane), __shfl_sync(kFullMask, v.y, lane));
}

// Linear recurrence element (a, b) meaning h -> a*h + b; real (float) or complex (float2) weights.
__device__ __forceinline__ float wmul(float a, float b) { return a * b; }
__device__ __forceinline__ float2 wmul(float2 a, float2 b) { return cmul(a, b); }
__device__ __forceinline__ float wfma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ float2 wfma(float2 a, float2 b, float2 c) { return cfma(a, b, c); }
template <typename W>
__device__ __forceinline__ W wone();
template <>
__device__ __forceinline__ float wone<float>() { return 1.f; }
template <>
__device__ __forceinline__ float2 wone<float2>() { return make_float2(1.f, 0.f); }
template <typename W>
__device__ __forceinline__ W wzero();
template <>
__device__ __forceinline__ float wzero<float>() { return 0.f; }
template <>
__device__ __forceinline__ float2 wzero<float2>() { return make_float2(0.f, 0.f); }

// The weight type: float for real weights, float2 (complex) otherwise, kCw floats each.
template <bool kComplex>
struct Weights;
template <>
struct Weights<false> {
  using W = float;
  static constexpr int kCw = 1;
};
template <>
struct Weights<true> {
  using W = float2;
  static constexpr int kCw = 2;
};

// Element `off` of a weights-typed tensor (fp32 or complex64): ldg_w through the read-only data cache, for tensors no
// kernel of the call writes; ld_w a plain load; st_w the store.
template <bool kC>
__device__ __forceinline__ typename Weights<kC>::W ldg_w(const void* base, int64_t off) {
  if constexpr (kC) return __ldg(static_cast<const float2*>(base) + off);
  else return __ldg(static_cast<const float*>(base) + off);
}
template <bool kC>
__device__ __forceinline__ typename Weights<kC>::W ld_w(const void* base, int64_t off) {
  if constexpr (kC) return static_cast<const float2*>(base)[off];
  else return static_cast<const float*>(base)[off];
}
template <bool kC>
__device__ __forceinline__ void st_w(void* base, int64_t off, typename Weights<kC>::W v) {
  if constexpr (kC) static_cast<float2*>(base)[off] = v;
  else static_cast<float*>(base)[off] = v;
}

__device__ __forceinline__ float wscale(float a, float s) { return a * s; }
__device__ __forceinline__ float2 wscale(float2 a, float s) { return cscale(a, s); }
__device__ __forceinline__ float wconj(float a) { return a; }
__device__ __forceinline__ float2 wconj(float2 a) { return cconj(a); }
__device__ __forceinline__ float wre(float a) { return a; }
__device__ __forceinline__ float wre(float2 a) { return a.x; }
__device__ __forceinline__ float wadd(float a, float b) { return a + b; }
__device__ __forceinline__ float2 wadd(float2 a, float2 b) { return cadd(a, b); }
// Re(a * conj(b)): the real gradient through a real-valued use of a complex product.
__device__ __forceinline__ float wdotre(float a, float b) { return a * b; }
__device__ __forceinline__ float wdotre(float2 a, float2 b) { return a.x * b.x + a.y * b.y; }

__device__ __forceinline__ float shfl_xor_w(float v, int m) { return __shfl_xor_sync(kFullMask, v, m); }
__device__ __forceinline__ float2 shfl_xor_w(float2 v, int m) {
  return make_float2(__shfl_xor_sync(kFullMask, v.x, m), __shfl_xor_sync(kFullMask, v.y, m));
}
// The sum over the warp's lanes, in every lane.
template <typename W>
__device__ __forceinline__ W warp_sum(W v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v = wadd(v, shfl_xor_w(v, m));
  return v;
}

// One element of the recurrence h' = a h + b, and its composition (earlier `x`, then `y`): the scan operator
// cub::WarpScan runs over lanes.
template <typename W>
struct RecPair {
  W a, b;
};
template <typename W>
struct ComposeRec {
  __device__ __forceinline__ RecPair<W> operator()(const RecPair<W>& x, const RecPair<W>& y) const {
    return {wmul(y.a, x.a), wfma(y.a, x.b, y.b)};
  }
};

// Inclusive warp scan of the recurrence pairs in lane order: afterwards lane l holds the composition of lanes
// 0..l, i.e. (a_l*...*a_0, h after lane l starting from h = 0 before lane 0). cub::WarpScan's shuffle form
// composes in the same order as a 5-step Hillis-Steele scan (so the results are those of the hand-written one it
// replaced, bit for bit) in fewer instructions: 0.75x of its SM time per call for real and 0.77x for complex
// weights on the H200 (bench/collectives, validation/optimisation-log.md, "CUB collectives"). Its temporary
// storage is empty for a full warp, so the kernels' shared memory is unchanged.
template <typename W>
__device__ __forceinline__ void warp_scan_fwd(W& a, W& b, int /*lane*/) {
  using Scan = cub::WarpScan<RecPair<W>>;
  static_assert(sizeof(typename Scan::TempStorage) <= 1, "the shuffle form of cub::WarpScan (no shared memory)");
  typename Scan::TempStorage none;
  RecPair<W> r;
  Scan(none).InclusiveScan(RecPair<W>{a, b}, r, ComposeRec<W>());
  a = r.a;
  b = r.b;
}

// dst[0..3] += v in global memory: one vector atomic where the GPU has it (sm_90+), else four.
__device__ __forceinline__ void add_f4(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
  atomicAdd(dst, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

}  // namespace selscan::kern
