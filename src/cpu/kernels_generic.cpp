// Portable build of the real-weight kernels (baseline ISA of the compiler; SSE2 on x86-64), and the run-time
// choice between it and the AVX2 build.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels.h"

#define SELSCAN_VEC_ALIGN 16
#define SELSCAN_CPU_ISA generic
#define SELSCAN_CPU_ISA_NAME "generic"
#define SELSCAN_VFMA(a, b, c) ((a) * (b) + (c))
#include "kernels_impl.h"
#undef SELSCAN_VFMA
#undef SELSCAN_VEC_ALIGN
#undef SELSCAN_CPU_ISA_NAME
#undef SELSCAN_CPU_ISA

namespace selscan::cpu {

namespace {
std::atomic<const KernelTable*> g_forced{nullptr};
}

const KernelTable& kernels() {
  if (const KernelTable* f = g_forced.load(std::memory_order_acquire)) return *f;
  static const KernelTable chosen = [] {
    const char* force = std::getenv("SELSCAN_CPU_KERNELS");
    const bool want_generic = force != nullptr && std::strcmp(force, "generic") == 0;
    return (!want_generic && avx2::available()) ? avx2::table() : generic::table();
  }();
  return chosen;
}

void set_kernels_for_testing(const KernelTable* t) { g_forced.store(t, std::memory_order_release); }

}  // namespace selscan::cpu
