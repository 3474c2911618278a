// Memory helpers shared by every kernel: itype <-> float conversion, 16-byte vector loads and stores of itype rows,
// and cp.async copies into shared memory. Valid on every target >= sm_75 (the bf16 conversions included).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "problem.h"

namespace selscan::kern {

// ---------------------------------------------------------------------------------------------- dtypes
// to_f32 / from_f32 for the three itypes. fp16/bf16 stores round to nearest even (c10 semantics).
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  // bf16 -> f32 is exact: the 16 bits are the top half of the float (no sm_80 instruction needed).
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(v)) << 16);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __float2bfloat16_rn(v);
#else
  // Software RNE for sm_75 (no cvt.rn.bf16.f32 there); NaN stays a quiet NaN.
  uint32_t x = __float_as_uint(v);
  if ((x & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(static_cast<unsigned short>((x >> 16) | 0x40u));
  x += 0x7fffu + ((x >> 16) & 1u);
  return __ushort_as_bfloat16(static_cast<unsigned short>(x >> 16));
#endif
}

// One value of a tensor whose dtype is known only at run time (f32, f16 or bf16), as float, through the read-only
// path; and its store, rounded to the dtype. For the small per-call tensors whose dtype a call may choose (the
// decode step's x, dt, z, B, C; conv1d's weights and bias), where an instance per dtype would not pay.
__device__ __forceinline__ float ld_dtype(Dtype t, const void* p, int64_t off) {
  if (t == Dtype::f32) return __ldg(static_cast<const float*>(p) + off);
  const unsigned short v = __ldg(static_cast<const unsigned short*>(p) + off);
  return t == Dtype::f16 ? __half2float(__ushort_as_half(v)) : __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ void st_dtype(Dtype t, void* p, int64_t off, float v) {
  if (t == Dtype::f32) static_cast<float*>(p)[off] = v;
  else if (t == Dtype::f16) static_cast<__half*>(p)[off] = from_f32<__half>(v);
  else static_cast<__nv_bfloat16*>(p)[off] = from_f32<__nv_bfloat16>(v);
}

// ---------------------------------------------------------------------------------------------- vector IO
// Loads/stores of 16 bytes worth of itype values, converted to/from float. The caller guarantees 16-byte
// alignment of `p` (checked on the row base at run time; misaligned rows take the scalar path).
template <typename T>
struct Vec16 {
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));
};

template <typename T>
__device__ __forceinline__ unsigned short bits16(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(v);
  else return __bfloat16_as_ushort(v);
}

// 16 raw bytes of itype values <-> floats.
template <typename T>
__device__ __forceinline__ void unpack16(uint4 raw, float* out) {
  if constexpr (sizeof(T) == 4) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      T lo, hi;
      const unsigned short l16 = static_cast<unsigned short>(w[i] & 0xffffu);
      const unsigned short h16 = static_cast<unsigned short>(w[i] >> 16);
      if constexpr (std::is_same_v<T, __half>) {
        lo = __ushort_as_half(l16);
        hi = __ushort_as_half(h16);
      } else {
        lo = __ushort_as_bfloat16(l16);
        hi = __ushort_as_bfloat16(h16);
      }
      out[2 * i] = to_f32(lo);
      out[2 * i + 1] = to_f32(hi);
    }
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack16(const float* in) {
  if constexpr (sizeof(T) == 4) {
    return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = static_cast<uint32_t>(bits16(from_f32<T>(in[2 * i]))) |
             (static_cast<uint32_t>(bits16(from_f32<T>(in[2 * i + 1]))) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <typename T>
__device__ __forceinline__ void load16(const T* p, float* out) {
  unpack16<T>(__ldg(reinterpret_cast<const uint4*>(p)), out);
}

template <typename T>
__device__ __forceinline__ void store16(T* p, const float* in) {
  *reinterpret_cast<uint4*>(p) = pack16<T>(in);
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// n consecutive itype values of a row starting at element e0 into floats; elements at or past `lim` read as 0.
// 16-byte loads when the row is aligned and the run is whole (n * sizeof(T) is a multiple of 16).
template <typename T, int n>
__device__ __forceinline__ void load_run(const T* row, int64_t e0, int64_t lim, bool vec, float* out) {
  constexpr int VE = Vec16<T>::kElems;
  static_assert(n % VE == 0, "run must be whole 16-byte vectors");
  if (vec && e0 + n <= lim) {
#pragma unroll
    for (int j = 0; j < n / VE; ++j) load16(row + e0 + j * VE, out + j * VE);
  } else {
#pragma unroll
    for (int j = 0; j < n; ++j) out[j] = (e0 + j < lim) ? to_f32(row[e0 + j]) : 0.f;
  }
}
template <typename T, int n>
__device__ __forceinline__ void store_run(T* row, int64_t e0, int64_t lim, bool vec, const float* in) {
  constexpr int VE = Vec16<T>::kElems;
  if (vec && e0 + n <= lim) {
#pragma unroll
    for (int j = 0; j < n / VE; ++j) store16(row + e0 + j * VE, in + j * VE);
  } else {
#pragma unroll
    for (int j = 0; j < n; ++j)
      if (e0 + j < lim) row[e0 + j] = from_f32<T>(in[j]);
  }
}

// 16 bytes' worth of a row's itype values from time t: one vector load when `vec` (the row is 16-byte aligned)
// and the vector ends before L; otherwise element by element, with 0 past L. kAnyAlign: `vec` is not used; the
// address decides: 16-, 8- or 4-byte loads, whichever it allows (a packed sequence at any offset: the thread-states
// forward's serving instance), element by element only for an odd 16-bit offset.
template <typename T, bool kAnyAlign = false>
__device__ __forceinline__ uint4 load_row16(const T* row, int64_t t, int64_t L, bool vec) {
  constexpr int VE = Vec16<T>::kElems;
  if constexpr (kAnyAlign) {
    if (t + VE <= L) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(row + t);
      if ((a & 15u) == 0) return __ldg(reinterpret_cast<const uint4*>(a));
      if ((a & 7u) == 0) {
        const uint2 lo = __ldg(reinterpret_cast<const uint2*>(a)), hi = __ldg(reinterpret_cast<const uint2*>(a) + 1);
        return make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
      if ((a & 3u) == 0) {
        const unsigned* w = reinterpret_cast<const unsigned*>(a);
        return make_uint4(__ldg(w), __ldg(w + 1), __ldg(w + 2), __ldg(w + 3));
      }
    }
  } else {
    if (vec && t + VE <= L) return __ldg(reinterpret_cast<const uint4*>(row + t));
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < VE; ++j) {
    if (t + j < L) {
      if constexpr (sizeof(T) == 4) w[j] = __float_as_uint(row[t + j]);
      else w[j / 2] |= static_cast<uint32_t>(bits16(row[t + j])) << (16 * (j % 2));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The store counterpart: steps at or past L are not written. kAnyAlign: as for the load, the address decides the
// width; the stores are spelled out (st.global): where the row's offset came from shared memory the compiler split a
// plain 16-byte store into four.
template <typename T, bool kAnyAlign = false>
__device__ __forceinline__ void store_row16(T* row, int64_t t, int64_t L, bool vec, const float* in) {
  constexpr int VE = Vec16<T>::kElems;
  if constexpr (kAnyAlign) {
    if (t + VE <= L) {
      const uint4 v = pack16<T>(in);
      const size_t a = __cvta_generic_to_global(row + t);
      if ((a & 15u) == 0) {
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
        return;
      }
      if ((a & 7u) == 0) {
        asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(a), "r"(v.x), "r"(v.y) : "memory");
        asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(a + 8), "r"(v.z), "r"(v.w) : "memory");
        return;
      }
      if ((a & 3u) == 0) {
        unsigned* w = reinterpret_cast<unsigned*>(row + t);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
        return;
      }
    }
  } else if (vec && t + VE <= L) {
    store16(row + t, in);
    return;
  }
#pragma unroll
  for (int j = 0; j < VE; ++j)
    if (t + j < L) row[t + j] = from_f32<T>(in[j]);
}

// ---------------------------------------------------------------------------------------------- async copies
// cp.async (sm_80+): global -> shared copies that need no registers, so the next round's rows load while the
// current one computes. Older targets copy synchronously (same layout, no overlap).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gsrc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gsrc) : "memory");
#else
  *static_cast<uint4*>(smem_dst) = *static_cast<const uint4*>(gsrc);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_prev() {  // all but the most recent group have landed
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {  // every committed group has landed
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------------- tile copies
// The copy engine of sm_90 (cp.async.bulk.tensor, PTX ISA 8.0 = CUDA 12.0): one thread asks for a box of a tensor
// (src/cuda/tile_map.h) and the engine writes it into shared memory, counting the bytes on an mbarrier. The
// operands live in uniform registers (the compiler loops over the lanes that ask), so these are for one lane of a
// warp, not for every lane. They compile to nothing where SELSCAN_TILE_COPIES is not defined and must not be called
// there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 12
#define SELSCAN_TILE_COPIES 1
#endif
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// One arrival per phase: the thread that also posts the phase's bytes.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#ifdef SELSCAN_TILE_COPIES
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
#endif
}
// The phase's arrival and the bytes its copies deliver (they may land before or after it).
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, unsigned bytes) {
#ifdef SELSCAN_TILE_COPIES
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}
// Waits for the phase of parity `phase` to complete (try_wait suspends the thread for a while between polls). No poll
// limit: a counter and a trap around the loop doubled the backward's spills (ptxas, sm_90).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned phase) {
#ifdef SELSCAN_TILE_COPIES
  const unsigned a = smem_addr(bar);
  unsigned done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a), "r"(phase)
        : "memory");
  } while (!done);
#endif
}
// The box of a 3- or 4-dimensional map at coordinates (innermost first) into shared memory at dst (128-byte aligned),
// completing on bar.
__device__ __forceinline__ void tile_load(void* dst, const void* map, int x, int y, int z, uint64_t* bar) {
#ifdef SELSCAN_TILE_COPIES
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(smem_addr(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void tile_load(void* dst, const void* map, int x, int y, int z, int w, uint64_t* bar) {
#ifdef SELSCAN_TILE_COPIES
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(w), "r"(smem_addr(bar))
      : "memory");
#endif
}

}  // namespace selscan::kern
