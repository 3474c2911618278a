// The worker pool of one CPU call: std::thread workers pulling task indices from an atomic counter.
#include <algorithm>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "common.h"

namespace selscan::cpu {

int resolve_threads(int requested, int64_t tasks) {
  int n = requested;
  if (n <= 0) {
    const unsigned hw = std::thread::hardware_concurrency();
    n = hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, 1024));
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
