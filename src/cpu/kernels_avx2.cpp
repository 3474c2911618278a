// AVX2+FMA build of the real-weight kernels, for x86-64 GCC/Clang. The target is set per function by a pragma
// (no -march flags for the library), and only used after a run-time CPU check. Headers come before the
// pragma so that no library code is compiled for AVX2.
#include <cmath>
#include <cstdint>

#include "kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  define SELSCAN_HAVE_AVX2_BUILD 1
#else
#  define SELSCAN_HAVE_AVX2_BUILD 0
#endif

#if SELSCAN_HAVE_AVX2_BUILD
#  include <immintrin.h>
#  if defined(__clang__)
#    pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#  else
#    pragma GCC push_options
#    pragma GCC target("avx2,fma")
#  endif
#  define SELSCAN_CPU_ISA avx2
#  define SELSCAN_CPU_ISA_NAME "avx2"
#  define SELSCAN_VFMA(a, b, c) V{_mm256_fmadd_ps((a).v, (b).v, (c).v)}
#  include "kernels_impl.h"
#  undef SELSCAN_VFMA
#  undef SELSCAN_VEC_ALIGN
#  undef SELSCAN_CPU_ISA_NAME
#  undef SELSCAN_CPU_ISA
#  if defined(__clang__)
#    pragma clang attribute pop
#  else
#    pragma GCC pop_options
#  endif

namespace selscan::cpu::avx2 {
bool available() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
}  // namespace selscan::cpu::avx2

#else

namespace selscan::cpu::avx2 {
bool available() { return false; }
KernelTable table() { return KernelTable{}; }
}  // namespace selscan::cpu::avx2

#endif
