// CUB's collectives against the library's hand-written ones (docs/performance.md, "CUB collectives against the
// hand-written ones"). Every cross-lane operation the scan kernels run is timed twice in an otherwise identical kernel:
// once as the library has it (its own device functions, included from kernels/, or, where the kernel writes the
// collective inline, a transcription of those lines named below) and once as the CUB call that would replace it.
//
//   fwd_scan/{real,complex}   a hand-written 5-step Hillis-Steele scan of (a, b) pairs (hand_scan below) + the
//                             shfl_up that makes the exclusive state (kernels/fwd/warp.cuh, once per state and
//                             piece) vs cub::WarpScan<(a, b)>::InclusiveScan + the same shfl_up, as the kernels
//                             call it (kern::warp_scan_fwd)
//   bwd_scan2/complex         two hand-written forward scans interleaved (hand_scan2 below; backward pass 1, complex
//                             weights) vs two cub::WarpScan::InclusiveScan calls (the kernels' bwd::warp_scan_fwd2)
//   bwd_scan_fwd_rev/{real,complex}  bwd::warp_scan_fwd_rev, a forward and a reverse scan at once (backward pass 2,
//                             once per state and piece) vs a forward cub::WarpScan and a reverse one (CUB has no
//                             reverse scan: the lanes are mirrored with shfl_xor 31 before and after)
//   bwd_suffix_sum/real       the inline suffix sum of the real pass 1 (kernels/bwd/warp.cuh, pass 1: inclusive
//                             suffix over lanes, the total from lane 0, the exclusive from lane + 1) vs
//                             cub::WarpScan<float>::InclusiveSum with its warp aggregate on mirrored lanes
//   bwd_sum2/real             the inline two-value butterfly of the real pass 1 (its piece's carry terms) vs two
//                             cub::WarpReduce<float>::Sum (lane 0's result, the one the comparison reads)
//   warp_sum3/{real,complex}  kern::warp_sum three times (dA and constant dB/dC per state, backward pass 2) vs
//                             cub::WarpReduce::Reduce three times (the kernel reads lane 0's sums only)
//   rows/<itype>/K<n>         kern::load_run / store_run, a lane's K consecutive itype values of a row as floats
//                             (fwd K = 16 real / 8 complex, bwd K = 8) vs cub::WarpLoad / WarpStore with the
//                             VECTORIZE, TRANSPOSE and DIRECT algorithms, and with CUB's Load/StoreDirectBlocked-
//                             Vectorized (the kernels map one warp to one channel's row, so the warp-scope
//                             collectives are the ones that fit: no block shares a row, BlockLoad has no place)
//
// The scan and sum cases run `iters` collectives per thread in registers: each iteration's inputs are
// x0 + i * dx (one fmaf per value, so no iteration's collective can be hoisted), its outputs added into per-thread
// accumulators that are stored once. A `base` variant runs the same loop with every lane its own 1-lane warp (no
// shuffle) so the collective's own cost is variant - base. The rows cases stream rows of L steps (one warp per row,
// pieces of 32*K steps) from one buffer into another (y = 2 x - 1, exact in every itype).
//
// Every variant is checked before it is timed: the scan and sum cases at 3 iterations over the timed grid against a
// float64 host computation of the same float inputs (the lanes each variant's kernel consumer reads: lane 0 for
// the reductions, every lane otherwise), the rows cases element by element (exact). Outputs are poisoned (all bits
// set: NaN) before every checked run. A mismatch, a CUDA error or an unwritten output fails the program (exit 1).
//
// Usage: selscan_collectives [--iters N] [--repeats R] [--only SUBSTR] [--json FILE] [--rows R] [--len L]
//                            [--profile] [--ncu-csv FILE]
//   --profile     launches each selected kernel once (PROFILE_ITERS iterations, no timing, no check) for ncu
//   --ncu-csv F   ncu's CSV of that run (--csv --metrics smsp__inst_executed.sum; launch order = table order):
//                 the table then shows warp instructions per warp and call
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cub/warp/warp_load.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cub/warp/warp_scan.cuh>
#include <cub/warp/warp_store.cuh>

#include "kernels/bwd/warp.cuh"
#include "kernels/common/io.cuh"
#include "kernels/common/math.cuh"

namespace coll {

namespace kern = selscan::kern;
namespace bwd = selscan::kern::bwd;

#define CHECK_CUDA(expr)                                                                                 \
  do {                                                                                                   \
    const cudaError_t err_ = (expr);                                                                     \
    if (err_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)
// After every launch: the launch's own error, then (for checked runs) the kernel's.
#define CHECK_LAUNCH() CHECK_CUDA(cudaGetLastError())

constexpr int kThreads = 256;  // 8 warps a block, as the warp-scan kernels' largest blocks
constexpr int kWarps = kThreads / 32;
constexpr int kMinBlocks = 4;  // 64 registers a thread: the register budget of the warp-scan kernels' instances
constexpr int kCheckIters = 3;
constexpr int kProfileIters = 64;

enum Impl : int { kBase = 0, kHand = 1, kCub = 2 };
const char* impl_name(int i) { return i == kBase ? "base" : i == kHand ? "hand" : "cub"; }

// ---------------------------------------------------------------------------------------------- the scan element
// (a, b): h -> a h + b. compose(x, y) = y after x = (y.a x.a, y.a x.b + y.b), identity (1, 0): the operator of
// kern::warp_scan_fwd, in CUB's argument order (the earlier lanes' aggregate first).
template <typename W>
using Rec = kern::RecPair<W>;
template <typename W>
using Compose = kern::ComposeRec<W>;
// The hand-written scans the CUB calls are measured against: lane l ends with the composition of lanes 0..l,
// composed in the same order as cub::WarpScan's shuffle form (so both give the same bits).
template <typename W>
__device__ __forceinline__ void hand_scan(W& a, W& b, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const W pa = kern::shfl_up(a, off);
    const W pb = kern::shfl_up(b, off);
    if (lane >= off) {
      b = kern::wfma(a, pb, b);
      a = kern::wmul(a, pa);
    }
  }
}
// Two at once, their shuffles interleaved.
template <typename W>
__device__ __forceinline__ void hand_scan2(W& a0, W& b0, W& a1, W& b1, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const W pa0 = kern::shfl_up(a0, off), pb0 = kern::shfl_up(b0, off);
    const W pa1 = kern::shfl_up(a1, off), pb1 = kern::shfl_up(b1, off);
    if (lane >= off) {
      b0 = kern::wfma(a0, pb0, b0);
      a0 = kern::wmul(a0, pa0);
      b1 = kern::wfma(a1, pb1, b1);
      a1 = kern::wmul(a1, pa1);
    }
  }
}
template <typename W>
struct Plus {
  __device__ __forceinline__ W operator()(const W& x, const W& y) const { return kern::wadd(x, y); }
};

template <typename W>
__host__ __device__ constexpr int cw() {
  return sizeof(W) / sizeof(float);
}

// Input slot s of a thread: cw floats of x0, then cw floats of dx; iteration i's value is fmaf(i, dx, x0).
template <typename W>
__device__ __forceinline__ W in_at(const float* x, int s, float fi) {
  const float* q = x + 2 * cw<W>() * s;
  if constexpr (cw<W>() == 1) return fmaf(fi, q[1], q[0]);
  else return make_float2(fmaf(fi, q[2], q[0]), fmaf(fi, q[3], q[1]));
}
template <typename W>
__device__ __forceinline__ void acc_at(float* acc, int s, W v) {
  if constexpr (cw<W>() == 1) {
    acc[s] += v;
  } else {
    acc[2 * s] += v.x;
    acc[2 * s + 1] += v.y;
  }
}
__device__ __forceinline__ float mirror(float v) { return __shfl_xor_sync(kern::kFullMask, v, 31); }
__device__ __forceinline__ float2 mirror(float2 v) { return make_float2(mirror(v.x), mirror(v.y)); }
template <typename W>
__device__ __forceinline__ Rec<W> mirror(Rec<W> r) {
  return {mirror(r.a), mirror(r.b)};
}

// ---------------------------------------------------------------------------------------------- host reference
using cd = std::complex<double>;
struct HRec {
  cd a, b;
};
HRec compose(const HRec& x, const HRec& y) { return {y.a * x.a, y.a * x.b + y.b}; }
// The float value the device computes for slot s at iteration i (fmaf is exact-rounded on both sides).
cd h_in(const float* x, int c, int s, int i) {
  const float* q = x + 2 * c * s;
  const float fi = static_cast<float>(i);
  if (c == 1) return {static_cast<double>(std::fmaf(fi, q[1], q[0])), 0.0};
  return {static_cast<double>(std::fmaf(fi, q[2], q[0])), static_cast<double>(std::fmaf(fi, q[3], q[1]))};
}
void h_acc(double* acc, int c, int s, cd v) {
  acc[c * s] += v.real();
  if (c == 2) acc[c * s + 1] += v.imag();
}
// Forward inclusive scan over `n` lanes (n = 32, or 1: the base variant's lone lane).
std::vector<HRec> h_scan(const std::vector<HRec>& e) {
  std::vector<HRec> r(e.size());
  for (size_t l = 0; l < e.size(); ++l) r[l] = l == 0 ? e[0] : compose(r[l - 1], e[l]);
  return r;
}
std::vector<HRec> h_rscan(const std::vector<HRec>& e) {
  std::vector<HRec> r(e.size());
  for (size_t l = e.size(); l-- > 0;) r[l] = l + 1 == e.size() ? e[l] : compose(r[l + 1], e[l]);
  return r;
}

// ---------------------------------------------------------------------------------------------- the cases
// Each case: kIn input floats and kOut accumulators a thread, kLane0 (only lane 0's outputs are read by the
// kernel's consumer), step<I>() one iteration of variant I, ref() the float64 outputs of one warp's lanes.
// `group` is the lanes a collective spans on the host: 32, or 1 for the base variant.

template <typename W>
struct FwdScan {
  static constexpr int kIn = 4 * cw<W>(), kOut = 3 * cw<W>();
  static constexpr bool kLane0 = false;
  template <int I>
  __device__ __forceinline__ static void step(const float* x, float* acc, float fi, int lane, int warp) {
    W a = in_at<W>(x, 0, fi), b = in_at<W>(x, 1, fi);
    W h = kern::wzero<W>();
    if constexpr (I == kHand) {
      hand_scan(a, b, lane);
      h = kern::shfl_up(b, 1);
      if (lane == 0) h = kern::wzero<W>();
    } else if constexpr (I == kCub) {
      kern::warp_scan_fwd(a, b, lane);
      h = kern::shfl_up(b, 1);
      if (lane == 0) h = kern::wzero<W>();
    }
    acc_at(acc, 0, a);
    acc_at(acc, 1, b);
    acc_at(acc, 2, h);
  }
  static void ref(const float* xw, int iters, int group, double* out) {
    constexpr int c = cw<W>();
    for (int i = 0; i < iters; ++i)
      for (int g0 = 0; g0 < 32; g0 += group) {
        std::vector<HRec> e(group);
        for (int l = 0; l < group; ++l) e[l] = {h_in(xw + (g0 + l) * kIn, c, 0, i), h_in(xw + (g0 + l) * kIn, c, 1, i)};
        const auto r = h_scan(e);
        for (int l = 0; l < group; ++l) {
          double* o = out + (g0 + l) * kOut;
          h_acc(o, c, 0, r[l].a);
          h_acc(o, c, 1, r[l].b);
          h_acc(o, c, 2, l == 0 ? cd{} : r[l - 1].b);
        }
      }
  }
};

template <typename W>
struct BwdScan2 {
  static constexpr int kIn = 8 * cw<W>(), kOut = 4 * cw<W>();
  static constexpr bool kLane0 = false;
  template <int I>
  __device__ __forceinline__ static void step(const float* x, float* acc, float fi, int lane, int warp) {
    W a0 = in_at<W>(x, 0, fi), b0 = in_at<W>(x, 1, fi), a1 = in_at<W>(x, 2, fi), b1 = in_at<W>(x, 3, fi);
    if constexpr (I == kHand) {
      hand_scan2(a0, b0, a1, b1, lane);
    } else if constexpr (I == kCub) {
      bwd::warp_scan_fwd2(a0, b0, a1, b1, lane);
    }
    acc_at(acc, 0, a0);
    acc_at(acc, 1, b0);
    acc_at(acc, 2, a1);
    acc_at(acc, 3, b1);
  }
  static void ref(const float* xw, int iters, int group, double* out) {
    constexpr int c = cw<W>();
    for (int i = 0; i < iters; ++i)
      for (int g0 = 0; g0 < 32; g0 += group)
        for (int q = 0; q < 2; ++q) {
          std::vector<HRec> e(group);
          for (int l = 0; l < group; ++l)
            e[l] = {h_in(xw + (g0 + l) * kIn, c, 2 * q, i), h_in(xw + (g0 + l) * kIn, c, 2 * q + 1, i)};
          const auto r = h_scan(e);
          for (int l = 0; l < group; ++l) {
            h_acc(out + (g0 + l) * kOut, c, 2 * q, r[l].a);
            h_acc(out + (g0 + l) * kOut, c, 2 * q + 1, r[l].b);
          }
        }
  }
};

template <typename W>
struct BwdScanFwdRev {
  static constexpr int kIn = 8 * cw<W>(), kOut = 4 * cw<W>();
  static constexpr bool kLane0 = false;
  template <int I>
  __device__ __forceinline__ static void step(const float* x, float* acc, float fi, int lane, int warp) {
    W fa = in_at<W>(x, 0, fi), fb = in_at<W>(x, 1, fi), ra = in_at<W>(x, 2, fi), rb = in_at<W>(x, 3, fi);
    if constexpr (I == kHand) {
      bwd::warp_scan_fwd_rev(fa, fb, ra, rb, lane);
    } else if constexpr (I == kCub) {
      using WS = cub::WarpScan<Rec<W>>;
      __shared__ typename WS::TempStorage tmp[2][kWarps];
      Rec<W> f, r;
      WS(tmp[0][warp]).InclusiveScan(Rec<W>{fa, fb}, f, Compose<W>());
      WS(tmp[1][warp]).InclusiveScan(mirror(Rec<W>{ra, rb}), r, Compose<W>());
      r = mirror(r);
      fa = f.a, fb = f.b, ra = r.a, rb = r.b;
    }
    acc_at(acc, 0, fa);
    acc_at(acc, 1, fb);
    acc_at(acc, 2, ra);
    acc_at(acc, 3, rb);
  }
  static void ref(const float* xw, int iters, int group, double* out) {
    constexpr int c = cw<W>();
    for (int i = 0; i < iters; ++i)
      for (int g0 = 0; g0 < 32; g0 += group) {
        std::vector<HRec> f(group), r(group);
        for (int l = 0; l < group; ++l) {
          const float* x = xw + (g0 + l) * kIn;
          f[l] = {h_in(x, c, 0, i), h_in(x, c, 1, i)};
          r[l] = {h_in(x, c, 2, i), h_in(x, c, 3, i)};
        }
        const auto fs = h_scan(f), rs = h_rscan(r);
        for (int l = 0; l < group; ++l) {
          double* o = out + (g0 + l) * kOut;
          h_acc(o, c, 0, fs[l].a);
          h_acc(o, c, 1, fs[l].b);
          h_acc(o, c, 2, rs[l].a);
          h_acc(o, c, 3, rs[l].b);
        }
      }
  }
};

// The real pass 1's sums of delta (kernels/bwd/warp.cuh, "inclusive suffix sum over lanes"): the loop below is those
// lines of the kernel, which writes them inline.
struct BwdSuffixSum {
  static constexpr int kIn = 2, kOut = 3;
  static constexpr bool kLane0 = false;
  template <int I>
  __device__ __forceinline__ static void step(const float* x, float* acc, float fi, int lane, int warp) {
    const float v = in_at<float>(x, 0, fi);
    float suf = v, after = 0.f, total = v;
    if constexpr (I == kHand) {
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float t = __shfl_down_sync(kern::kFullMask, suf, off);
        if (lane + off < 32) suf += t;
      }
      after = __shfl_down_sync(kern::kFullMask, suf, 1);
      if (lane == 31) after = 0.f;
      total = __shfl_sync(kern::kFullMask, suf, 0);
    } else if constexpr (I == kCub) {
      using WS = cub::WarpScan<float>;
      __shared__ typename WS::TempStorage tmp[kWarps];
      float incl;
      WS(tmp[warp]).InclusiveSum(mirror(v), incl, total);
      suf = mirror(incl);
      after = __shfl_down_sync(kern::kFullMask, suf, 1);
      if (lane == 31) after = 0.f;
    }
    acc[0] += suf;
    acc[1] += after;
    acc[2] += total;
  }
  static void ref(const float* xw, int iters, int group, double* out) {
    for (int i = 0; i < iters; ++i)
      for (int g0 = 0; g0 < 32; g0 += group) {
        std::vector<double> v(group), suf(group + 1, 0.0);
        for (int l = 0; l < group; ++l) v[l] = h_in(xw + (g0 + l) * kIn, 1, 0, i).real();
        for (int l = group; l-- > 0;) suf[l] = suf[l + 1] + v[l];
        for (int l = 0; l < group; ++l) {
          double* o = out + (g0 + l) * kOut;
          o[0] += suf[l];
          o[1] += suf[l + 1];
          o[2] += suf[0];
        }
      }
  }
};

// The real pass 1's two carry sums at once (kernels/bwd/warp.cuh, the xor loop over pb[0], pb[1]), written inline
// by the kernel like the suffix sum.
struct BwdSum2 {
  static constexpr int kIn = 4, kOut = 2;
  static constexpr bool kLane0 = true;
  template <int I>
  __device__ __forceinline__ static void step(const float* x, float* acc, float fi, int lane, int warp) {
    float p0 = in_at<float>(x, 0, fi), p1 = in_at<float>(x, 1, fi);
    if constexpr (I == kHand) {
#pragma unroll
      for (int m = 16; m >= 1; m >>= 1) {
        const float v0 = __shfl_xor_sync(kern::kFullMask, p0, m);
        const float v1 = __shfl_xor_sync(kern::kFullMask, p1, m);
        p0 += v0;
        p1 += v1;
      }
    } else if constexpr (I == kCub) {
      using WR = cub::WarpReduce<float>;
      __shared__ typename WR::TempStorage tmp[2][kWarps];
      p0 = WR(tmp[0][warp]).Sum(p0);
      p1 = WR(tmp[1][warp]).Sum(p1);
    }
    acc[0] += p0;
    acc[1] += p1;
  }
  static void ref(const float* xw, int iters, int group, double* out) {
    for (int i = 0; i < iters; ++i)
      for (int g0 = 0; g0 < 32; g0 += group)
        for (int q = 0; q < 2; ++q) {
          double s = 0.0;
          for (int l = 0; l < group; ++l) s += h_in(xw + (g0 + l) * kIn, 1, q, i).real();
          out[g0 * kOut + q] += s;
        }
  }
};

template <typename W>
struct WarpSum3 {
  static constexpr int kIn = 6 * cw<W>(), kOut = 3 * cw<W>();
  static constexpr bool kLane0 = true;
  template <int I>
  __device__ __forceinline__ static void step(const float* x, float* acc, float fi, int lane, int warp) {
    W v[3] = {in_at<W>(x, 0, fi), in_at<W>(x, 1, fi), in_at<W>(x, 2, fi)};
    if constexpr (I == kHand) {
#pragma unroll
      for (int q = 0; q < 3; ++q) v[q] = kern::warp_sum(v[q]);
    } else if constexpr (I == kCub) {
      using WR = cub::WarpReduce<W>;
      __shared__ typename WR::TempStorage tmp[3][kWarps];
      // Real: Sum, CUB's predicated shfl + add for float; complex: Reduce with the weights' addition (float2 has no +).
#pragma unroll
      for (int q = 0; q < 3; ++q) {
        if constexpr (cw<W>() == 1) v[q] = WR(tmp[q][warp]).Sum(v[q]);
        else v[q] = WR(tmp[q][warp]).Reduce(v[q], Plus<W>());
      }
    }
#pragma unroll
    for (int q = 0; q < 3; ++q) acc_at(acc, q, v[q]);
  }
  static void ref(const float* xw, int iters, int group, double* out) {
    constexpr int c = cw<W>();
    for (int i = 0; i < iters; ++i)
      for (int g0 = 0; g0 < 32; g0 += group)
        for (int q = 0; q < 3; ++q) {
          cd s{};
          for (int l = 0; l < group; ++l) s += h_in(xw + (g0 + l) * kIn, c, q, i);
          h_acc(out + g0 * kOut, c, q, s);
        }
  }
};

template <class C, int I>
__global__ void __launch_bounds__(kThreads, kMinBlocks) coll_kernel(const float* __restrict__ in,
                                                                    float* __restrict__ out, int iters) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  float x[C::kIn], acc[C::kOut];
#pragma unroll
  for (int j = 0; j < C::kIn; ++j) x[j] = in[t * C::kIn + j];
#pragma unroll
  for (int j = 0; j < C::kOut; ++j) acc[j] = 0.f;
#pragma unroll 1
  for (int i = 0; i < iters; ++i) C::template step<I>(x, acc, static_cast<float>(i), lane, warp);
#pragma unroll
  for (int j = 0; j < C::kOut; ++j) out[t * C::kOut + j] = acc[j];
}

// ---------------------------------------------------------------------------------------------- rows (IO)
// kRowBlockedVec: CUB's free functions LoadDirectBlockedVectorized / StoreDirectBlockedVectorized, which vectorise
// with a raw pointer; WarpLoad's VECTORIZE does not in the CCCL of CUDA 13.0 (its pointer overloads have a template
// parameter no argument deduces, NVIDIA/cccl#431; BlockLoad's was fixed by #3517), so it loads element by element.
enum RowAlgo : int { kRowHand = 0, kRowVec, kRowTranspose, kRowDirect, kRowBlockedVec, kRowAlgos };
const char* row_algo_name(int a) {
  return a == kRowHand         ? "hand"
         : a == kRowVec        ? "cub_vectorize"
         : a == kRowTranspose  ? "cub_transpose"
         : a == kRowDirect     ? "cub_direct"
                               : "cub_blocked_vec";
}
template <int A>
constexpr cub::WarpLoadAlgorithm kLoadAlgo =
    A == kRowVec ? cub::WARP_LOAD_VECTORIZE : A == kRowTranspose ? cub::WARP_LOAD_TRANSPOSE : cub::WARP_LOAD_DIRECT;
template <int A>
constexpr cub::WarpStoreAlgorithm kStoreAlgo =
    A == kRowVec ? cub::WARP_STORE_VECTORIZE : A == kRowTranspose ? cub::WARP_STORE_TRANSPOSE : cub::WARP_STORE_DIRECT;

// One warp per row (a channel's u, delta, dout ...), pieces of 32 K steps as the warp-scan kernels walk them.
template <typename T, int K, int A>
__global__ void __launch_bounds__(kThreads) rows_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows,
                                                        int64_t L) {
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= rows) return;
  const T* src = in + row * L;
  T* dst = out + row * L;
  if constexpr (A == kRowHand) {
    const bool vin = kern::aligned16(src), vout = kern::aligned16(dst);
    for (int64_t p0 = 0; p0 < L; p0 += 32 * K) {
      const int64_t t0 = p0 + static_cast<int64_t>(lane) * K;
      float v[K];
      kern::load_run<T, K>(src, t0, L, vin, v);
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = fmaf(2.f, v[k], -1.f);
      kern::store_run<T, K>(dst, t0, L, vout, v);
    }
  } else if constexpr (A == kRowBlockedVec) {
    for (int64_t p0 = 0; p0 < L; p0 += 32 * K) {
      T items[K];
      const bool full = p0 + 32 * K <= L;
      if (full) cub::LoadDirectBlockedVectorized(lane, const_cast<T*>(src + p0), items);
      else cub::LoadDirectBlocked(lane, src + p0, items, static_cast<int>(L - p0), kern::from_f32<T>(0.f));
#pragma unroll
      for (int k = 0; k < K; ++k) items[k] = kern::from_f32<T>(fmaf(2.f, kern::to_f32(items[k]), -1.f));
      if (full) cub::StoreDirectBlockedVectorized(lane, dst + p0, items);
      else cub::StoreDirectBlocked(lane, dst + p0, items, static_cast<int>(L - p0));
    }
  } else {
    using WL = cub::WarpLoad<T, K, kLoadAlgo<A>>;
    using WS = cub::WarpStore<T, K, kStoreAlgo<A>>;
    __shared__ typename WL::TempStorage lt[kWarps];
    __shared__ typename WS::TempStorage st[kWarps];
    for (int64_t p0 = 0; p0 < L; p0 += 32 * K) {
      T items[K];
      const bool full = p0 + 32 * K <= L;
      if (full) WL(lt[warp]).Load(src + p0, items);
      else WL(lt[warp]).Load(src + p0, items, static_cast<int>(L - p0), kern::from_f32<T>(0.f));
#pragma unroll
      for (int k = 0; k < K; ++k) items[k] = kern::from_f32<T>(fmaf(2.f, kern::to_f32(items[k]), -1.f));
      if (full) WS(st[warp]).Store(dst + p0, items);
      else WS(st[warp]).Store(dst + p0, items, static_cast<int>(L - p0));
    }
  }
}

// ---------------------------------------------------------------------------------------------- host side
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// A value on a grid of 2^bits steps over [lo, hi): exact in float.
float grid_value(uint64_t& s, float lo, float hi, int bits) {
  const uint64_t k = splitmix(s) >> (64 - bits);
  return lo + (hi - lo) * static_cast<float>(static_cast<double>(k) / static_cast<double>(1ull << bits));
}

struct Row {
  std::string name, variant, where;
  double ns = 0, base_ns = 0;   // median ns of a launch; the base variant's (scan/sum cases)
  double per_call_ns = 0;       // SM-time per warp call: ns * SMs / (warps * iters) (scan/sum), or per piece (rows)
  double gbps = 0;              // rows cases: bytes read and written per second
  double max_err = 0;           // scan/sum: largest |dev - ref| / (1 + |ref|); rows: mismatching elements
  double inst = -1;             // ncu warp instructions per warp call (or per warp piece), -1 when not profiled
  double calls = 0;             // warp calls (or warp pieces) per launch, for inst
  bool ok = true;
};

struct Options {
  int iters = 4096, repeats = 11;
  int64_t rows = 16384, len = 2048;
  std::string only, json, ncu_csv;
  bool profile = false;
};

template <typename F>
double median_ms(int repeats, F&& launch) {
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  launch();  // warm-up
  CHECK_LAUNCH();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> ms(repeats);
  for (int r = 0; r < repeats; ++r) {
    CHECK_CUDA(cudaEventRecord(e0));
    launch();
    CHECK_LAUNCH();
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaEventElapsedTime(&ms[r], e0, e1));
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[repeats / 2];
}

struct Ctx {
  Options opt;
  int sms = 0;
  std::vector<Row> rows;
  int failures = 0;
};

bool selected(const Ctx& c, const std::string& name) { return c.opt.only.empty() || name.find(c.opt.only) != std::string::npos; }

template <class C>
void run_case(Ctx& c, const std::string& name, const std::string& where, const std::vector<float>& xin_spec) {
  if (!selected(c, name)) return;
  const int64_t blocks = static_cast<int64_t>(c.sms) * kMinBlocks;
  const int64_t threads = blocks * kThreads, warps = threads / 32;
  // Inputs: C::kIn floats a thread, each drawn from its (lo, hi, unused) triple of xin_spec.
  if (xin_spec.size() != 3 * static_cast<size_t>(C::kIn)) {
    std::fprintf(stderr, "%s: %zu input ranges, expected %d\n", name.c_str(), xin_spec.size() / 3, C::kIn);
    std::exit(1);
  }
  std::vector<float> h_in(threads * C::kIn);
  uint64_t seed = 0x5e15ca9ull ^ std::hash<std::string>{}(name);
  for (int64_t t = 0; t < threads; ++t)
    for (int j = 0; j < C::kIn; ++j) {
      const float lo = xin_spec[3 * j], hi = xin_spec[3 * j + 1];
      h_in[t * C::kIn + j] = grid_value(seed, lo, hi, 12);
    }
  float *d_in = nullptr, *d_out = nullptr;
  CHECK_CUDA(cudaMalloc(&d_in, h_in.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&d_out, threads * C::kOut * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(d_in, h_in.data(), h_in.size() * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<float> h_out(threads * C::kOut);
  std::vector<double> ref(32 * C::kOut);
  double base_ns = 0;
  void (*kernels[3])(const float*, float*, int) = {coll_kernel<C, kBase>, coll_kernel<C, kHand>, coll_kernel<C, kCub>};
  for (int v = 0; v < 3; ++v) {
    Row r;
    r.name = name;
    r.variant = impl_name(v);
    r.where = where;
    r.calls = static_cast<double>(warps) * (c.opt.profile ? kProfileIters : c.opt.iters);
    if (c.opt.profile) {
      kernels[v]<<<blocks, kThreads>>>(d_in, d_out, kProfileIters);
      CHECK_LAUNCH();
      CHECK_CUDA(cudaDeviceSynchronize());
      c.rows.push_back(r);
      continue;
    }
    // The check: poisoned outputs, kCheckIters iterations over the timed grid, every warp against float64.
    CHECK_CUDA(cudaMemset(d_out, 0xff, threads * C::kOut * sizeof(float)));
    kernels[v]<<<blocks, kThreads>>>(d_in, d_out, kCheckIters);
    CHECK_LAUNCH();
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(h_out.data(), d_out, h_out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    double worst = 0;
    for (int64_t w = 0; w < warps; ++w) {
      std::fill(ref.begin(), ref.end(), 0.0);
      C::ref(h_in.data() + w * 32 * C::kIn, kCheckIters, v == kBase ? 1 : 32, ref.data());
      for (int l = 0; l < 32; ++l) {
        if (C::kLane0 && v != kBase && l != 0) continue;
        for (int j = 0; j < C::kOut; ++j) {
          const double dev = h_out[(w * 32 + l) * C::kOut + j], want = ref[l * C::kOut + j];
          const double err = std::fabs(dev - want) / (1.0 + std::fabs(want));
          if (!(err <= 2e-5)) {  // NaN (unwritten) fails too
            if (bad < 5)
              std::fprintf(stderr, "MISMATCH %s/%s warp %lld lane %d out %d: device %.9g, float64 %.9g\n", name.c_str(),
                           r.variant.c_str(), static_cast<long long>(w), l, j, dev, want);
            ++bad;
          }
          if (std::isfinite(err)) worst = std::max(worst, err);
          else worst = INFINITY;
        }
      }
    }
    r.max_err = worst;
    r.ok = bad == 0;
    if (!r.ok) {
      ++c.failures;
      std::fprintf(stderr, "FAILED %s/%s: %lld outputs off\n", name.c_str(), r.variant.c_str(), static_cast<long long>(bad));
    }
    const int iters = c.opt.iters;
    const double ms = median_ms(c.opt.repeats, [&] { kernels[v]<<<blocks, kThreads>>>(d_in, d_out, iters); });
    r.ns = ms * 1e6;
    if (v == kBase) base_ns = r.ns;
    r.base_ns = base_ns;
    r.per_call_ns = r.ns * c.sms / (static_cast<double>(warps) * iters);
    c.rows.push_back(r);
  }
  CHECK_CUDA(cudaFree(d_in));
  CHECK_CUDA(cudaFree(d_out));
}

template <typename T>
float h_from_bits(T v);
template <>
float h_from_bits<float>(float v) { return v; }
template <>
float h_from_bits<__nv_bfloat16>(__nv_bfloat16 v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T>
T h_to_bits(float f);  // exact values only (the inputs are on a grid bf16 holds)
template <>
float h_to_bits<float>(float f) { return f; }
template <>
__nv_bfloat16 h_to_bits<__nv_bfloat16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t b = static_cast<uint16_t>(u >> 16);
  __nv_bfloat16 v;
  std::memcpy(&v, &b, 2);
  return v;
}

template <typename T, int K>
void run_rows(Ctx& c, const std::string& name, const std::string& where) {
  if (!selected(c, name)) return;
  const int64_t R = c.opt.rows, L = c.opt.len, n = R * L;
  std::vector<T> h_in(n), h_out(n);
  uint64_t seed = 0x40c5ull ^ std::hash<std::string>{}(name);
  // Steps of 1/32 over [-2, 2): 2x - 1 is a multiple of 1/16 below 5 in magnitude, 7 significant bits, exact in bf16.
  for (int64_t i = 0; i < n; ++i) h_in[i] = h_to_bits<T>(grid_value(seed, -2.f, 2.f, 7));
  T *d_in = nullptr, *d_out = nullptr;
  CHECK_CUDA(cudaMalloc(&d_in, n * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&d_out, n * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d_in, h_in.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  const int64_t blocks = (R + kWarps - 1) / kWarps;
  void (*kernels[kRowAlgos])(const T*, T*, int64_t, int64_t) = {
      rows_kernel<T, K, kRowHand>, rows_kernel<T, K, kRowVec>, rows_kernel<T, K, kRowTranspose>,
      rows_kernel<T, K, kRowDirect>, rows_kernel<T, K, kRowBlockedVec>};
  const double pieces = static_cast<double>(R) * ((L + 32 * K - 1) / (32 * K));
  for (int v = 0; v < kRowAlgos; ++v) {
    Row r;
    r.name = name;
    r.variant = row_algo_name(v);
    r.where = where;
    r.calls = pieces;
    if (c.opt.profile) {
      kernels[v]<<<blocks, kThreads>>>(d_in, d_out, R, L);
      CHECK_LAUNCH();
      CHECK_CUDA(cudaDeviceSynchronize());
      c.rows.push_back(r);
      continue;
    }
    CHECK_CUDA(cudaMemset(d_out, 0xff, n * sizeof(T)));
    kernels[v]<<<blocks, kThreads>>>(d_in, d_out, R, L);
    CHECK_LAUNCH();
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(h_out.data(), d_out, n * sizeof(T), cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = 2.0 * h_from_bits<T>(h_in[i]) - 1.0, got = h_from_bits<T>(h_out[i]);
      if (!(got == want)) {
        if (bad < 5)
          std::fprintf(stderr, "MISMATCH %s/%s element %lld: device %.9g, expected %.9g\n", name.c_str(),
                       r.variant.c_str(), static_cast<long long>(i), got, want);
        ++bad;
      }
    }
    r.max_err = static_cast<double>(bad);
    r.ok = bad == 0;
    if (!r.ok) {
      ++c.failures;
      std::fprintf(stderr, "FAILED %s/%s: %lld elements off\n", name.c_str(), r.variant.c_str(), static_cast<long long>(bad));
    }
    const double ms = median_ms(c.opt.repeats, [&] { kernels[v]<<<blocks, kThreads>>>(d_in, d_out, R, L); });
    r.ns = ms * 1e6;
    r.per_call_ns = r.ns * c.sms / pieces;
    r.gbps = 2.0 * n * sizeof(T) / r.ns;
    c.rows.push_back(r);
  }
  CHECK_CUDA(cudaFree(d_in));
  CHECK_CUDA(cudaFree(d_out));
}

// ncu's CSV (--csv --metrics smsp__inst_executed.sum): one metric row per launch, in launch order.
std::vector<double> read_ncu(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "--ncu-csv: cannot open '%s'\n", path.c_str());
    std::exit(1);
  }
  auto split = [](const std::string& line) {
    std::vector<std::string> out;
    std::string cur;
    bool q = false;
    for (char ch : line) {
      if (ch == '"') q = !q;
      else if (ch == ',' && !q) out.push_back(cur), cur.clear();
      else cur += ch;
    }
    out.push_back(cur);
    return out;
  };
  std::string line;
  int iname = -1, ivalue = -1;
  std::vector<double> vals;
  while (std::getline(f, line)) {
    const auto cols = split(line);
    if (iname < 0) {
      for (size_t i = 0; i < cols.size(); ++i) {
        if (cols[i] == "Metric Name") iname = static_cast<int>(i);
        if (cols[i] == "Metric Value") ivalue = static_cast<int>(i);
      }
      continue;
    }
    if (static_cast<int>(cols.size()) <= std::max(iname, ivalue) || cols[iname] != "smsp__inst_executed.sum") continue;
    std::string v = cols[ivalue];
    v.erase(std::remove(v.begin(), v.end(), ','), v.end());
    vals.push_back(std::atof(v.c_str()));
  }
  return vals;
}

void usage() {
  std::fprintf(stderr,
               "usage: selscan_collectives [--iters N] [--repeats R] [--only SUBSTR] [--json FILE] [--rows R] "
               "[--len L] [--profile] [--ncu-csv FILE]\n");
}

int run(int argc, char** argv) {
  Ctx c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* what) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value (%s)\n", a.c_str(), what);
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    auto positive = [&](const char* what) -> long long {
      const std::string v = next(what);
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || x <= 0) {
        std::fprintf(stderr, "%s: expected a positive integer (%s), got '%s'\n", a.c_str(), what, v.c_str());
        std::exit(2);
      }
      return x;
    };
    if (a == "--iters") c.opt.iters = static_cast<int>(positive("collectives per thread and launch"));
    else if (a == "--repeats") c.opt.repeats = static_cast<int>(positive("timed launches, median reported"));
    else if (a == "--rows") c.opt.rows = positive("rows of the rows cases");
    else if (a == "--len") c.opt.len = positive("steps per row of the rows cases");
    else if (a == "--only") c.opt.only = next("a substring of the case names");
    else if (a == "--json") c.opt.json = next("output file");
    else if (a == "--ncu-csv") c.opt.ncu_csv = next("ncu CSV of a --profile run");
    else if (a == "--profile") c.opt.profile = true;
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  c.sms = prop.multiProcessorCount;

  // Input ranges, one (lo, hi, unused) triple per input float of a thread, slot by slot. A real slot is (x0, dx), a
  // complex one (x0.re, x0.im, dx.re, dx.im). Decays a in (0.55, 0.95) (complex: imaginary parts in +-0.3) with steps
  // dx of up to 2^-16 (4096 iterations move a by < 0.07); values b in +-1 with steps of up to 2^-14.
  const std::vector<float> decay = {0.55f, 0.95f, 0, -1.f / 65536, 0.f, 0};
  const std::vector<float> decay_c = {0.55f, 0.95f, 0, -0.3f, 0.3f, 0, -1.f / 65536, 0.f, 0, -1.f / 65536, 1.f / 65536, 0};
  const std::vector<float> value = {-1.f, 1.f, 0, -1.f / 16384, 1.f / 16384, 0};
  const std::vector<float> value_c = {-1.f, 1.f, 0, -1.f, 1.f, 0, -1.f / 16384, 1.f / 16384, 0, -1.f / 16384, 1.f / 16384, 0};
  auto cat = [](std::initializer_list<std::vector<float>> parts) {
    std::vector<float> o;
    for (const auto& p : parts) o.insert(o.end(), p.begin(), p.end());
    return o;
  };
  const std::vector<float> pair = cat({decay, value}), pair_c = cat({decay_c, value_c});
  const std::vector<float> delta = {0.f, 0.5f, 0, -1.f / 65536, 1.f / 65536, 0};

  run_case<FwdScan<float>>(c, "fwd_scan/real", "kernels/fwd/warp.cuh: per state and piece", pair);
  run_case<FwdScan<float2>>(c, "fwd_scan/complex", "kernels/fwd/warp.cuh: per state and piece", pair_c);
  run_case<BwdScan2<float2>>(c, "bwd_scan2/complex", "kernels/bwd/warp.cuh pass 1: per two states and piece",
                             cat({pair_c, pair_c}));
  run_case<BwdScanFwdRev<float>>(c, "bwd_scan_fwd_rev/real", "kernels/bwd/warp.cuh pass 2: per state and piece",
                                 cat({pair, pair}));
  run_case<BwdScanFwdRev<float2>>(c, "bwd_scan_fwd_rev/complex", "kernels/bwd/warp.cuh pass 2: per state and piece",
                                  cat({pair_c, pair_c}));
  run_case<BwdSuffixSum>(c, "bwd_suffix_sum/real", "kernels/bwd/warp.cuh pass 1: per piece", delta);
  run_case<BwdSum2>(c, "bwd_sum2/real", "kernels/bwd/warp.cuh pass 1: per two states and piece", cat({value, value}));
  run_case<WarpSum3<float>>(c, "warp_sum3/real", "kernels/bwd/warp.cuh pass 2: per state and piece",
                            cat({value, value, value}));
  run_case<WarpSum3<float2>>(c, "warp_sum3/complex", "kernels/bwd/warp.cuh pass 2: per state and piece",
                             cat({value_c, value_c, value_c}));
  run_rows<__nv_bfloat16, 16>(c, "rows/bf16/K16", "load_run/store_run: fwd/warp.cuh u, delta, out (real)");
  run_rows<float, 16>(c, "rows/fp32/K16", "load_run/store_run: fwd/warp.cuh u, delta, out (real)");
  run_rows<__nv_bfloat16, 8>(c, "rows/bf16/K8", "load_run/store_run: bwd/warp.cuh rows, fwd complex");
  run_rows<float, 8>(c, "rows/fp32/K8", "load_run/store_run: bwd/warp.cuh rows, fwd complex");

  if (c.rows.empty()) {
    std::fprintf(stderr, "--only '%s' selects no case\n", c.opt.only.c_str());
    return 2;
  }
  if (c.opt.profile) {
    std::printf("profile run: %zu launches (%d iterations each for the scan/sum cases)\n", c.rows.size(), kProfileIters);
    return 0;
  }
  if (!c.opt.ncu_csv.empty()) {
    const auto v = read_ncu(c.opt.ncu_csv);
    if (v.size() != c.rows.size()) {
      std::fprintf(stderr, "--ncu-csv: %zu smsp__inst_executed.sum rows, expected %zu (one per launch of a --profile run "
                   "with the same --only)\n", v.size(), c.rows.size());
      return 1;
    }
    // The profile run's call counts: kProfileIters iterations instead of --iters.
    for (size_t i = 0; i < v.size(); ++i) {
      Row& r = c.rows[i];
      const bool rows_case = r.name.rfind("rows/", 0) == 0;
      const double calls = rows_case ? r.calls : r.calls / c.opt.iters * kProfileIters;
      r.inst = v[i] / calls;
    }
  }

  std::printf("device: %s, %d SMs; scan/sum cases: %d blocks x %d threads, %d iterations; rows: %lld x %lld\n",
              prop.name, c.sms, c.sms * kMinBlocks, kThreads, c.opt.iters, static_cast<long long>(c.opt.rows),
              static_cast<long long>(c.opt.len));
  std::printf("%-26s %-14s %12s %14s %12s %10s %10s %s\n", "case", "variant", "launch_us", "ns/warp-call", "vs hand",
              "GB/s", "inst/call", "check");
  double hand_ns = 0;
  for (const Row& r : c.rows) {
    if (r.variant == "hand") hand_ns = r.ns;
    const double rel = (r.variant == "base" || hand_ns <= 0) ? 0 : r.ns / hand_ns;
    char relb[32] = "", gb[32] = "", ins[32] = "";
    if (r.variant != "base" && r.variant != "hand") std::snprintf(relb, sizeof relb, "%.3f", rel);
    if (r.gbps > 0) std::snprintf(gb, sizeof gb, "%.0f", r.gbps);
    if (r.inst >= 0) std::snprintf(ins, sizeof ins, "%.1f", r.inst);
    std::printf("%-26s %-14s %12.1f %14.3f %12s %10s %10s %s\n", r.name.c_str(), r.variant.c_str(), r.ns / 1e3,
                r.per_call_ns, relb, gb, ins, r.ok ? "ok" : "FAILED");
  }
  std::printf("ns/warp-call: SM-time per warp and collective (launch time x SMs / warp calls; rows: per 32*K-step piece)."
              " A collective's own cost is its row minus the base row.\n");

  if (!c.opt.json.empty()) {
    std::ofstream j(c.opt.json);
    if (!j) {
      std::fprintf(stderr, "--json: cannot write '%s'\n", c.opt.json.c_str());
      return 1;
    }
    j << "{\n  \"device\": \"" << prop.name << "\",\n  \"sms\": " << c.sms << ",\n  \"iters\": " << c.opt.iters
      << ",\n  \"repeats\": " << c.opt.repeats << ",\n  \"rows\": " << c.opt.rows << ",\n  \"len\": " << c.opt.len
      << ",\n  \"failures\": " << c.failures << ",\n  \"results\": [\n";
    for (size_t i = 0; i < c.rows.size(); ++i) {
      const Row& r = c.rows[i];
      j << "    {\"case\": \"" << r.name << "\", \"variant\": \"" << r.variant << "\", \"where\": \"" << r.where
        << "\", \"launch_ns\": " << r.ns << ", \"ns_per_warp_call\": " << r.per_call_ns;
      if (r.gbps > 0) j << ", \"gb_per_s\": " << r.gbps;
      if (r.inst >= 0) j << ", \"inst_per_warp_call\": " << r.inst;
      j << ", \"max_err\": " << (std::isfinite(r.max_err) ? r.max_err : -1.0) << ", \"ok\": " << (r.ok ? "true" : "false")
        << "}" << (i + 1 < c.rows.size() ? "," : "") << "\n";
    }
    j << "  ]\n}\n";
  }
  if (c.failures > 0) {
    std::fprintf(stderr, "%d variant(s) FAILED their check\n", c.failures);
    return 1;
  }
  return 0;
}

}  // namespace coll

int main(int argc, char** argv) { return coll::run(argc, argv); }
