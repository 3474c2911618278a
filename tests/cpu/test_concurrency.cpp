// Many host threads calling the library at once (the CPU path, 1 and 2 workers per call): every result must be
// bitwise identical to a serial run of the same case, and error messages must stay with the thread that caused
// them. Meant to run under ThreadSanitizer too (the `tsan` preset), which also checks the library's own
// worker pool and its thread-local error state for data races.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace selscan_test {
namespace {

// A small but varied set: dtypes, complex, constant/variable B/C with groups, h0, mamba_inner strides, and one
// case with two chunks (x carries the state into the backward).
std::vector<CaseSpec> specs() {
  std::vector<CaseSpec> v;
  auto add = [&](auto&& f) {
    CaseSpec s;
    s.batch = 2, s.dim = 8, s.seqlen = 96, s.dstate = 8, s.seed = 7000 + v.size();
    f(s);
    v.push_back(s);
  };
  add([](CaseSpec&) {});
  add([](CaseSpec& s) { s.itype = SELSCAN_DTYPE_BFLOAT16, s.complex = true, s.groups = 2; });
  add([](CaseSpec& s) { s.itype = SELSCAN_DTYPE_FLOAT16, s.var_B = false, s.has_h0 = true, s.recompute_out_z = true; });
  add([](CaseSpec& s) { s.var_C = false, s.groups = 4, s.strides = Strides::mamba_inner, s.has_z = true; });
  add([](CaseSpec& s) { s.batch = 1, s.dim = 3, s.seqlen = 2100, s.dstate = 4, s.slow_decay = true; });
  return v;
}

// All output storages of a case after fwd + bwd (guards included: byte-for-byte equality then also says
// nothing outside the elements differs).
struct Result {
  selscan_status_t fwd = SELSCAN_STATUS_INTERNAL, bwd = SELSCAN_STATUS_INTERNAL;
  std::vector<std::vector<unsigned char>> bytes;
};

Result run_case(const CaseSpec& spec, int threads) {
  Case c = make_case(spec);
  Result r;
  const selscan_exec_t exec = cpu_exec(threads);
  r.fwd = run_fwd(c, exec);
  if (r.fwd == SELSCAN_STATUS_SUCCESS) r.bwd = run_bwd(c, exec, /*deterministic=*/true);
  for (Tensor* t : c.fwd_outputs()) r.bytes.push_back(t->storage);
  for (Tensor* t : c.bwd_outputs()) r.bytes.push_back(t->storage);
  return r;
}

// Failures found on worker threads, reported by the main thread after join (one message each).
class Failures {
 public:
  void add(std::string s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (list_.size() < 20) list_.push_back(std::move(s));
    ++count_;
  }
  void expect_none() const {
    for (const std::string& s : list_) ADD_FAILURE() << s;
    EXPECT_EQ(count_, 0);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> list_;
  int count_ = 0;
};

TEST(Concurrency, ManyThreadsMatchSerialBitwise) {
  const std::vector<CaseSpec> cases = specs();
  std::vector<Result> serial;
  for (const CaseSpec& s : cases) {
    serial.push_back(run_case(s, 1));
    ASSERT_EQ(serial.back().fwd, SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
    ASSERT_EQ(serial.back().bwd, SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  }
  // The serial result does not depend on the worker count either.
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_TRUE(run_case(cases[i], 2).bytes == serial[i].bytes) << cases[i].str();

  constexpr int kThreads = 8, kRounds = 3;
  Failures failures;
  std::atomic<int> runs{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < kThreads; ++w)
    pool.emplace_back([&, w] {
      for (int r = 0; r < kRounds; ++r)
        for (size_t k = 0; k < cases.size(); ++k) {
          const size_t i = (k + static_cast<size_t>(w)) % cases.size();  // threads start on different cases
          const int workers = 1 + (w + r) % 2;
          const Result got = run_case(cases[i], workers);
          runs.fetch_add(1);
          if (got.fwd != SELSCAN_STATUS_SUCCESS || got.bwd != SELSCAN_STATUS_SUCCESS)
            failures.add("thread " + std::to_string(w) + ": " + cases[i].str() + " failed: " + selscan_last_error());
          else if (got.bytes != serial[i].bytes)
            failures.add("thread " + std::to_string(w) + " (" + std::to_string(workers) + " workers): " +
                         cases[i].str() + " differs from the serial run");
        }
    });
  for (auto& t : pool) t.join();
  failures.expect_none();
  EXPECT_EQ(runs.load(), kThreads * kRounds * static_cast<int>(cases.size()));
}

// Half the threads make calls that fail validation, each with a value only it uses, while the others succeed.
// A failing thread must read back its own message (naming its value) after every failure; a succeeding thread
// must never see a message (it has not failed) and its results stay correct.
TEST(Concurrency, ErrorsStayWithTheirThread) {
  CaseSpec spec;
  spec.batch = 2, spec.dim = 4, spec.seqlen = 64, spec.dstate = 8, spec.seed = 7100;
  const Result serial = run_case(spec, 1);
  ASSERT_EQ(serial.bwd, SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  constexpr int kThreads = 8, kRounds = 12;
  Failures failures;
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int w = 0; w < kThreads; ++w)
    pool.emplace_back([&, w] {
      while (!go.load()) std::this_thread::yield();
      const bool failing = w % 2 == 1;
      Case c = make_case(spec);
      for (int r = 0; r < kRounds; ++r) {
        if (!failing) {
          const Result got = run_case(spec, 1 + r % 2);
          if (got.bwd != SELSCAN_STATUS_SUCCESS || got.bytes != serial.bytes)
            failures.add("thread " + std::to_string(w) + ": a valid call failed or differs");
          if (selscan_last_error()[0] != '\0')
            failures.add("thread " + std::to_string(w) + " never failed but reads: " + selscan_last_error());
          continue;
        }
        // Alternate two different failures so a stale message would be caught too.
        selscan_exec_t exec = cpu_exec(1);
        std::string want;
        selscan_status_t want_status;
        selscan_status_t got;
        if (r % 2 == 0) {
          exec.num_threads = -(1000 * w + r);  // unique to this thread and round
          want = "got " + std::to_string(exec.num_threads);
          want_status = SELSCAN_STATUS_INVALID_ARGUMENT;
          got = run_fwd(c, exec);
        } else {
          selscan_bwd_args_t a = c.bwd_args(host_ptr);
          a.deterministic = 10 + 1000 * w + r;
          want = "got " + std::to_string(a.deterministic);
          want_status = SELSCAN_STATUS_INVALID_ARGUMENT;
          got = selscan_bwd(&a, &exec);
        }
        const std::string msg = selscan_last_error();
        if (got != want_status || msg.find(want) == std::string::npos)
          failures.add("thread " + std::to_string(w) + " round " + std::to_string(r) + ": status " +
                       std::to_string(got) + ", message '" + msg + "', expected it to contain '" + want + "'");
      }
    });
  const std::string main_before = selscan_last_error();
  go.store(true);
  for (auto& t : pool) t.join();
  failures.expect_none();
  // Nothing leaked into this (main) thread's message either.
  EXPECT_EQ(main_before, selscan_last_error());
}

}  // namespace
}  // namespace selscan_test
