// The reduced gradients of a serving case as sums of float64 terms, and how a float32 result of them compares
// with their conditioning (docs/numerics.md, "Reduced gradients of packed calls"). A reduced gradient R = Σ T sums
// one term per step (dA, constant dB/dC, dD; ddelta_bias two per step and state) over every sequence, or one per
// channel of a group (variable dB/dC). Float32 cannot hold R closer than its terms' rounding allows: about
// u Σ|T| times a growth factor of the summation (sqrt(n) for random rounding errors, n at worst, n terms), plus
// what the terms inherit from the float32 states h and dh (RefBwd::cond_*, which covers both). Used by the CPU
// tests and, on GPU results, by the GPU tests' diagnostic (tests/gpu/test_gpu_varlen.cpp).
//
// `ChunkFault` rebuilds, in float64, what a backward with a wrong reduction at one chunk boundary would return,
// so that a test can show the comparison still catches such a bug.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "varlen_case.h"

namespace selscan_test {

// A bug at chunk `chunk` (> 0 for the seeds and the carry) of sequence `seq`; the chunks are the 2048-step chunks
// inside each sequence that the backward kernels seed from x and walk in reverse.
struct ChunkFault {
  enum Kind {
    none,
    zero_seed,  // the chunk's recomputed states start from 0 instead of x's state before the chunk
    next_seed,  // ... from the chunk slot one too far (the state at the chunk's own end)
    no_carry,   // the state gradient dh is not carried from the chunk into the one before it
    scale,      // the chunk's terms enter the sums over time times `factor` (0: lost, 2: added twice)
  };
  Kind kind = none;
  int64_t seq = 0, chunk = 1;
  double factor = 1.0;
};

// One reduced gradient, element by element in values() order (complex: re, im).
struct TermSums {
  std::vector<double> sum;           // Σ T in float64: the oracle's value (without a fault)
  std::vector<double> abs_sum;       // Σ |T|
  std::vector<int64_t> count;        // n, the number of terms
  std::vector<double> f32_one;       // float32: the float32-rounded terms into one accumulator, in term order
  std::vector<double> f32_blocked;   // float32: per block (a chunk of a sequence and state; 8 channels for variable
                                     // dB/dC) in reverse term order, the block sums added in order
};

struct GradTerms {
  TermSums dA, dB, dC, dD, ddelta_bias;  // dD, ddelta_bias empty when the case has no D, delta_bias
  const TermSums& of(const std::string& name) const;
};

// The terms of every reduced gradient of the case's backward (real or complex weights; any sequence lengths),
// from the case's stored inputs and dout, with `fault` applied.
GradTerms grad_terms(const VarlenCase& c, ChunkFault fault = {});

// A gradient's float32 values against float64: the worst element by each measure.
struct GradCondition {
  std::string name;
  int64_t elements = 0;
  double max_err = 0;            // max |got - ref|
  double over_upstream = 0;      // max |err| / (atol + rtol |ref|)          (> 1: upstream's tolerance fails)
  double over_check = 0;         // max |err| / check_varlen's limit         (> 1: check_varlen fails): upstream's,
                                 // for the reduced gradients max(upstream, k u cond)
  double over_cond = 0;          // max |err| / (u cond)                     (cond: VarlenRef::cond_*)
  double over_abs_sum = 0;       // max |err| / (u Σ|T|)                     (reduced gradients only)
  double over_sqrt_n = 0;        // max |err| / (u Σ|T| sqrt(n))
  // The element of largest |err| / (atol + rtol |ref|) (the one a failure of upstream's tolerance names).
  int64_t at = -1;
  double got = 0, ref = 0, abs_sum = 0, cond = 0;
  int64_t terms = 0;
};

// Every gradient of `got` (a case after run_varlen_bwd; its du, ddelta, dz, dh0 and reduced gradients) against
// the oracle `r`, with the reduced gradients' term sums `t` (nullptr: those columns stay 0). `extra`: the
// float32 re-summations of `t` as two more rows per reduced gradient ("dA f32 one", "dA f32 blocked").
std::vector<GradCondition> gradient_conditions(const VarlenCase& got, const VarlenRef& r, const GradTerms* t,
                                               bool extra = false);
// As a table, one row per gradient.
std::string format_conditions(const std::vector<GradCondition>& rows);

}  // namespace selscan_test
