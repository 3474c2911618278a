// The worker pool of one CPU call: std::thread workers pulling task indices from an atomic counter.
#include <algorithm>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "common.h"

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#  include <xmmintrin.h>
#  define SELSCAN_HAVE_MXCSR 1
#else
#  define SELSCAN_HAVE_MXCSR 0
#endif

namespace selscan::cpu {
namespace {

// Flush-to-zero and denormals-are-zero for the current thread while alive, restored after. Like the CUDA
// kernels (built with fast math), the CPU path treats subnormals as 0; without this, decaying states and
// products passing through the subnormal range cost a microcode assist per operation (10x slower scans).
class DenormalsAreZero {
 public:
#if SELSCAN_HAVE_MXCSR
  DenormalsAreZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~DenormalsAreZero() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#endif
};

}  // namespace

int resolve_threads(int requested, int64_t tasks, int64_t updates) {
  int n = requested;
  if (n <= 0) {
    // Asked once: the query reads the system's CPU list, which costs more than a decode step.
    static const unsigned hw = std::thread::hardware_concurrency();
    n = hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, 1024));
    // Starting and joining a worker costs tens of microseconds, as much as ~10^4-10^5 state updates: a
    // small call (a decode step, a short sequence) runs fastest on the caller's thread alone.
    n = static_cast<int>(std::clamp<int64_t>(updates / kMinUpdatesPerThread, 1, n));
  }
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n, tasks)));
}

Status run_tasks(int64_t ntasks, int nthreads, const std::function<void(int64_t, int)>& body,
                 std::atomic<bool>* abort) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> local_abort{false};
  std::atomic<bool>& stop = abort != nullptr ? *abort : local_abort;
  std::mutex mu;
  Status status = SELSCAN_STATUS_SUCCESS;
  std::string message;

  auto record = [&](Status s, std::string msg) {
    std::lock_guard<std::mutex> lock(mu);
    if (status == SELSCAN_STATUS_SUCCESS) {
      status = s;
      message = std::move(msg);
    }
    stop.store(true);
  };
  auto worker = [&](int w) {
    DenormalsAreZero ftz;
    try {
      for (;;) {
        if (stop.load(std::memory_order_relaxed)) return;
        const int64_t t = next.fetch_add(1);
        if (t >= ntasks) return;
        body(t, w);
      }
    } catch (const Aborted&) {
      stop.store(true);
    } catch (const std::bad_alloc&) {
      record(SELSCAN_STATUS_OUT_OF_MEMORY, "CPU path: out of host memory for scratch buffers");
    } catch (const std::exception& e) {
      record(SELSCAN_STATUS_INTERNAL, std::string("CPU path: internal error: ") + e.what());
    } catch (...) {
      record(SELSCAN_STATUS_INTERNAL, "CPU path: internal error (unknown exception)");
    }
  };

  std::vector<std::thread> pool;
  try {
    pool.reserve(static_cast<size_t>(nthreads > 1 ? nthreads - 1 : 0));
    for (int w = 1; w < nthreads; ++w) pool.emplace_back(worker, w);
  } catch (...) {
    // Could not start every worker (resources): run with the ones we have; the caller's thread always works.
  }
  worker(0);
  for (auto& th : pool) th.join();
  if (status != SELSCAN_STATUS_SUCCESS) return fail(status, message);
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace selscan::cpu
