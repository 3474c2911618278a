// Serving calls on the CPU (docs/serving.md): packed sequences (cu_seqlens), initial states from h0 rows or a state
// pool (cache_indices, has_initial_state, pad_slot_id), forward and backward, against the float64 oracle run
// sequence by sequence and against the library's own dense calls of each sequence.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compare.h"
#include "cuda/select.h"
#include "validate.h"
#include "varlen_case.h"

namespace selscan_test {
namespace {

// Per-token outputs of the packed call at sequence b's positions, laid out like the dense call's (1, D, L).
std::vector<double> seq_rows(const VarlenCase& c, const Tensor& t, int64_t b) {
  const int64_t L = c.spec.lens[static_cast<size_t>(b)], t0 = c.start(b), row = c.spec.packed ? 0 : b;
  std::vector<double> v;
  for (int64_t d = 0; d < c.spec.dim; ++d)
    for (int64_t l = 0; l < L; ++l) v.push_back(t.get({row, d, t0 + l}));
  return v;
}

// Rows b of a (Bt, D, N) tensor, flattened like the dense call's (1, D, N).
std::vector<double> state_row(const Tensor& t, int64_t b) {
  std::vector<double> v;
  for (int64_t d = 0; d < t.sizes[1]; ++d)
    for (int64_t n = 0; n < t.sizes[2]; ++n) {
      const cd x = t.getc({b, d, n});
      v.push_back(x.real());
      if (t.dtype == SELSCAN_DTYPE_COMPLEX64) v.push_back(x.imag());
    }
  return v;
}

void expect_same(const std::string& what, const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " differs: " << a[i] << " vs " << b[i];
      return;
    }
}

// The packed call against the oracle, and sequence by sequence against dense calls of the library: per-token
// outputs, states and dh0 bit for bit (the same kernels see the same numbers), the weight gradients summed over
// the sequences within upstream's tolerance.
void check_against_separate_calls(VarlenCase& c, int threads) {
  const VarlenSpec& s = c.spec;
  const selscan_exec_t ex = cpu_exec(threads);
  ASSERT_EQ(run_varlen_fwd(c, ex), SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  ASSERT_EQ(run_varlen_bwd(c, ex), SELSCAN_STATUS_SUCCESS) << s.str() << ": " << selscan_last_error();
  check_varlen(c, varlen_reference(c), true);

  const int64_t D = s.dim, N = s.dstate, cw = s.complex ? 2 : 1;
  std::vector<double> dA(static_cast<size_t>(D * N * cw), 0.0), dD(static_cast<size_t>(D), 0.0);
  std::vector<double> dB(s.var_B ? 0 : dA.size(), 0.0), dC(s.var_C ? 0 : dA.size(), 0.0), db(dD);
  for (int64_t b = 0; b < s.batch(); ++b) {
    if (s.lens[static_cast<size_t>(b)] == 0 || s.pad(b)) continue;
    const std::string what = s.str() + " sequence " + std::to_string(b);
    Case k = sequence_case(c, b);
    ASSERT_EQ(run_fwd(k, ex), SELSCAN_STATUS_SUCCESS) << what << ": " << selscan_last_error();
    ASSERT_EQ(run_bwd(k, ex), SELSCAN_STATUS_SUCCESS) << what << ": " << selscan_last_error();
    // A dense call with constant B and no initial state scans h / B (upstream's fold), a serving call h itself:
    // the same values up to rounding. Otherwise the arithmetic is the same, bit for bit.
    const bool exact = s.var_B || s.starts_from_state(b);
    const Tolerances t = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
    auto same = [&](const char* name, const std::vector<double>& got, const Tensor& want, Tol tol) {
      if (exact) expect_same(what + " " + name, got, want.values());
      else EXPECT_TRUE(allclose(what + " " + name, got, want.values(), tol));
    };
    same("out", seq_rows(c, c.out, b), k.out, t.out);
    if (s.has_z) same("out_z", seq_rows(c, c.out_z, b), k.out_z, t.out);
    if (c.last_state.present()) same("last_state", state_row(c.last_state, b), k.last_state, t.last_state);
    same("du", seq_rows(c, c.du, b), k.du, t.du);
    same("ddelta", seq_rows(c, c.ddelta, b), k.ddelta, t.ddelta);
    if (s.has_z) same("dz", seq_rows(c, c.dz, b), k.dz, t.dz);
    if (c.dh0.present() && s.starts_from_state(b)) same("dh0", state_row(c.dh0, b), k.dh0, t.dh0);
    auto acc = [](std::vector<double>& sum, const Tensor& t) {
      const std::vector<double> v = t.values();
      for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
    };
    acc(dA, k.dA);
    if (!s.var_B) acc(dB, k.dB);
    if (!s.var_C) acc(dC, k.dC);
    if (s.has_D) acc(dD, k.dD);
    if (s.has_delta_bias) acc(db, k.ddelta_bias);
  }
  const Tolerances t = upstream_tolerances(s.itype, s.has_z, s.var_B, s.var_C);
  EXPECT_TRUE(allclose(s.str() + " dA vs separate calls", c.dA.values(), dA, t.dA));
  if (!s.var_B) EXPECT_TRUE(allclose(s.str() + " dB vs separate calls", c.dB.values(), dB, t.dB));
  if (!s.var_C) EXPECT_TRUE(allclose(s.str() + " dC vs separate calls", c.dC.values(), dC, t.dC));
  if (s.has_D) EXPECT_TRUE(allclose(s.str() + " dD vs separate calls", c.dD.values(), dD, t.dD));
  if (s.has_delta_bias)
    EXPECT_TRUE(allclose(s.str() + " ddelta_bias vs separate calls", c.ddelta_bias.values(), db, t.ddelta_bias));
}

TEST(Varlen, PackEqualsOracleAndSeparateCalls) {
  uint64_t seed = 500;
  for (int32_t it : {SELSCAN_DTYPE_FLOAT32, SELSCAN_DTYPE_FLOAT16, SELSCAN_DTYPE_BFLOAT16})
    for (int bc = 0; bc < 3; ++bc)
      for (InitFrom init : {InitFrom::none, InitFrom::h0}) {
        VarlenSpec s;
        s.lens = {5, 0, 40, 17, 1};
        s.itype = it, s.init = init, s.seed = seed++;
        s.var_B = bc != 1, s.var_C = bc != 2;
        s.cu_dtype = seed % 2 ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
        VarlenCase c = make_varlen_case(s);
        check_against_separate_calls(c, 2);
      }
}

// A sequence longer than a chunk of x, starting mid-chunk, among short ones: chunk slots and seeds.
TEST(Varlen, LongSequencesCrossChunks) {
  VarlenSpec s;
  s.lens = {700, 2500, 0, 2049};
  s.dim = 2, s.dstate = 4, s.groups = 1, s.init = InitFrom::h0, s.slow_decay = true, s.seed = 7;
  VarlenCase c = make_varlen_case(s);
  check_against_separate_calls(c, 3);
}

TEST(Varlen, ZeroLengthSequences) {
  VarlenSpec s;
  s.lens = {0, 7, 0, 0, 3, 0};
  s.init = InitFrom::h0, s.seed = 31;
  VarlenCase c = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(run_varlen_bwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  check_varlen(c, varlen_reference(c), true);
  // An empty sequence ends in the state it started from, and its initial state has no influence on the outputs.
  for (int64_t b : {0, 2, 3, 5}) {
    expect_same("last_state of empty sequence " + std::to_string(b), state_row(c.last_state, b), state_row(c.h0, b));
    for (double v : state_row(c.dh0, b)) EXPECT_EQ(v, 0.0) << "dh0 of empty sequence " << b;
  }
}

// Prefill in pieces through a state pool (the first piece from zero, the others from the slot) equals one scan of
// each whole sequence, in one batch where the sequences are at different pieces.
TEST(Varlen, ChunkedPrefillFromPoolEqualsOneScan) {
  const std::vector<std::vector<int64_t>> pieces = {{30, 50, 7}, {64, 1, 40}, {5, 90, 0}};
  const std::vector<int64_t> slot = {3, 0, 2};
  VarlenSpec whole;
  whole.lens = {87, 105, 95};
  whole.seed = 77;
  VarlenCase w = make_varlen_case(whole);
  ASSERT_EQ(run_varlen_fwd(w, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  // Round k runs piece k of every sequence with the same inputs, reading the slots round k-1 wrote.
  Tensor pool;
  std::vector<int64_t> done(3, 0);
  for (size_t k = 0; k < 3; ++k) {
    VarlenSpec s = whole;
    s.lens = {pieces[0][k], pieces[1][k], pieces[2][k]};
    s.init = InitFrom::pool, s.slots = 4, s.cache_indices = slot, s.pad_slot_id = -1;
    s.has_init = {k > 0, k > 0, k > 0};
    s.idx_dtype = SELSCAN_DTYPE_INT64, s.init_dtype = SELSCAN_DTYPE_INT32;
    VarlenCase c = make_varlen_case(s);
    for (int64_t b = 0; b < 3; ++b)  // this piece's inputs: the whole sequence's, from where it stopped
      copy_sequence_inputs(w, b, done[static_cast<size_t>(b)], c, b);
    if (k > 0) c.pool_in = pool;
    ASSERT_EQ(run_varlen_fwd(c, cpu_exec(2)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    check_varlen(c, varlen_reference(c), false);
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t L = s.lens[static_cast<size_t>(b)];
      for (int64_t d = 0; d < s.dim; ++d)
        for (int64_t l = 0; l < L; ++l) {
          const int64_t src = w.start(b) + done[static_cast<size_t>(b)] + l;
          const double got = c.out_z.get({0, d, c.start(b) + l}), want = w.out_z.get({0, d, src});
          EXPECT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << "sequence " << b << " piece " << k << " d " << d;
        }
      done[static_cast<size_t>(b)] += L;
    }
    pool = c.pool;
  }
  for (int64_t b = 0; b < 3; ++b)  // the slots hold the whole sequences' final states
    for (int64_t d = 0; d < whole.dim; ++d)
      for (int64_t n = 0; n < whole.dstate; ++n)
        EXPECT_NEAR(pool.get({slot[static_cast<size_t>(b)], d, n}), w.last_state.get({b, d, n}), 1e-5)
            << "slot of sequence " << b;
}

// A pool bigger than the batch: slots nobody names keep their bytes, padding entries read and write no slot and
// get zero outputs and gradients, has_initial_state picks zero or the slot.
TEST(Varlen, PoolSlotsAndPadding) {
  for (bool packed : {true, false}) {
    VarlenSpec s;
    s.lens = packed ? std::vector<int64_t>{9, 14, 0, 30, 6} : std::vector<int64_t>{12, 12, 12, 12, 12};
    s.packed = packed;
    s.init = InitFrom::pool, s.slots = 8;
    s.cache_indices = {5, -1, 2, 0, 7};
    s.pad_slot_id = -1;
    s.has_init = {1, 1, 0, 1, 0};
    s.idx_dtype = packed ? SELSCAN_DTYPE_INT64 : SELSCAN_DTYPE_INT32;
    s.seed = packed ? 90 : 91;
    VarlenCase c = make_varlen_case(s);
    check_against_separate_calls(c, 2);
    // The padding sequence: exactly zero outputs and gradients.
    for (const Tensor* t : {&c.out, &c.out_z, &c.du, &c.ddelta, &c.dz})
      for (double v : seq_rows(c, *t, 1)) ASSERT_EQ(v, 0.0) << s.str() << ": padding row not zero";
    for (double v : state_row(c.dh0, 1)) ASSERT_EQ(v, 0.0) << s.str() << ": padding dh0 not zero";
    for (int64_t b : {2, 4})  // no initial state: dh0 rows zero
      for (double v : state_row(c.dh0, b)) ASSERT_EQ(v, 0.0) << s.str() << ": dh0 of sequence " << b;
  }
}

// A pool without cache_indices: sequence b uses slot b (int32 flags, every sequence from its slot).
TEST(Varlen, PoolWithoutIndices) {
  VarlenSpec s;
  s.lens = {3, 20, 11};
  s.init = InitFrom::pool, s.slots = 3, s.seed = 44;
  VarlenCase c = make_varlen_case(s);
  check_against_separate_calls(c, 1);
}

// Padding entries without a pool: cache_indices only mark them; last_state rows of padding are zero.
TEST(Varlen, PaddingWithoutPool) {
  VarlenSpec s;
  s.lens = {4, 8, 8};
  s.init = InitFrom::h0, s.cache_indices = {0, 99, 1}, s.pad_slot_id = 99, s.seed = 45;
  VarlenCase c = make_varlen_case(s);
  check_against_separate_calls(c, 2);
  for (double v : state_row(c.last_state, 1)) ASSERT_EQ(v, 0.0);
}

// The backward is bitwise reproducible whatever the thread count.
TEST(Varlen, BackwardDeterministicAcrossThreads) {
  VarlenSpec s;
  s.lens = {100, 3, 250, 0, 64};
  s.init = InitFrom::h0, s.dim = 40, s.groups = 2, s.seed = 61;
  VarlenCase a = make_varlen_case(s), b = make_varlen_case(s);
  ASSERT_EQ(run_varlen_fwd(a, cpu_exec(1)), SELSCAN_STATUS_SUCCESS);
  ASSERT_EQ(run_varlen_bwd(a, cpu_exec(1)), SELSCAN_STATUS_SUCCESS);
  ASSERT_EQ(run_varlen_fwd(b, cpu_exec(3)), SELSCAN_STATUS_SUCCESS);
  ASSERT_EQ(run_varlen_bwd(b, cpu_exec(3)), SELSCAN_STATUS_SUCCESS);
  for (auto pr : std::vector<std::pair<Tensor*, Tensor*>>{{&a.out, &b.out}, {&a.du, &b.du}, {&a.ddelta, &b.ddelta},
                                                          {&a.dA, &b.dA},   {&a.dB, &b.dB}, {&a.dC, &b.dC},
                                                          {&a.dD, &b.dD},   {&a.dh0, &b.dh0}})
    EXPECT_TRUE(pr.first->same_bytes(*pr.second));
}

// ----------------------------------------------------------------------------------------------- validation
void expect_fail(selscan_status_t got, selscan_status_t want, const std::vector<std::string>& parts) {
  EXPECT_EQ(got, want) << selscan_last_error();
  const std::string msg = selscan_last_error();
  for (const std::string& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << msg << "' lacks '" << part << "'";
}

struct Call {
  VarlenCase c;
  selscan_fwd_args_t f;
  selscan_bwd_args_t b;
  selscan_exec_t e = cpu_exec(1);
  explicit Call(const VarlenSpec& s) : c(make_varlen_case(s)) {
    f = c.fwd_args(host_ptr);
    b = c.bwd_args(host_ptr);
  }
  selscan_status_t fwd() { return selscan_fwd(&f, &e); }
  selscan_status_t bwd() { return selscan_bwd(&b, &e); }
};

VarlenSpec pool_spec() {
  VarlenSpec s;
  s.lens = {3, 5, 4};
  s.init = InitFrom::pool, s.slots = 4, s.cache_indices = {1, -1, 3}, s.pad_slot_id = -1;
  return s;
}

TEST(VarlenValidation, IndexTensors) {
  {
    Call k{VarlenSpec{}};
    k.f.cu_seqlens.dtype = SELSCAN_DTYPE_FLOAT32;
    expect_fail(k.fwd(), SELSCAN_STATUS_DTYPE_MISMATCH,
                {"cu_seqlens: expected dtype int32 or int64 (sequence offsets), got float32"});
  }
  {
    Call k{VarlenSpec{}};
    k.f.cu_seqlens.sizes[0] = 1;
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"cu_seqlens:", "at least one sequence", "got (1,)"});
  }
  {
    Call k{VarlenSpec{}};  // u batched although packed
    k.f.u.sizes[0] = 2;
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"u:", "packed along time", "(1, dim, total_len)"});
  }
  {
    Call k{pool_spec()};
    k.f.cache_indices.sizes[0] = 2;
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"cache_indices: expected shape (3,)", "got (2,)"});
  }
  {
    VarlenSpec s = pool_spec();
    s.has_init = {1, 0, 1};
    Call k{s};
    k.f.has_initial_state.dtype = SELSCAN_DTYPE_INT64;
    expect_fail(k.fwd(), SELSCAN_STATUS_DTYPE_MISMATCH,
                {"has_initial_state: expected dtype bool or int32 (one entry per sequence), got int64"});
  }
}

TEST(VarlenValidation, FieldCombinations) {
  {
    Call k{VarlenSpec{}};
    k.f.pad_slot_id = 7;
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"pad_slot_id: only read with cache_indices or block_table, got 7"});
  }
  {
    VarlenSpec s;
    s.has_init = {1, 0, 1, 1};
    Call k{s};
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"has_initial_state:", "h0 or ssm_states"});
    expect_fail(k.bwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"has_initial_state:", "h0 is absent"});
  }
  {
    Call k{pool_spec()};
    k.f.h0 = k.c.bwd_h0.desc();
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"h0: must be absent with ssm_states"});
  }
  {
    Call k{pool_spec()};
    Tensor ls = make_tensor(SELSCAN_DTYPE_FLOAT32, {3, 4, 8}, {}, kPoison);
    k.f.last_state = ls.desc();
    expect_fail(k.fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"last_state: must be absent with ssm_states"});
  }
  {
    Call k{pool_spec()};
    k.f.ssm_states.sizes[2] = 9;
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"ssm_states: expected shape (slots, 4, 8)", "got (4, 4, 9)"});
  }
  {
    VarlenSpec s = pool_spec();
    s.cache_indices.clear();
    Call k{s};
    expect_fail(k.fwd(), SELSCAN_STATUS_SHAPE_MISMATCH, {"ssm_states: without cache_indices", "3 slots", "(4, 4, 8)"});
  }
  {
    Call k{pool_spec()};
    k.f.ssm_states.data = k.f.out.data;  // the pool is written: it may not share bytes with another tensor
    expect_fail(k.fwd(), SELSCAN_STATUS_BAD_LAYOUT, {"overlap"});
  }
  {
    VarlenSpec s;
    s.complex = true;
    s.init = InitFrom::h0;
    Call k{s};
    expect_fail(k.fwd(), SELSCAN_STATUS_UNSUPPORTED, {"A: complex weights with serving fields"});
    expect_fail(k.bwd(), SELSCAN_STATUS_UNSUPPORTED, {"A: complex weights with serving fields"});
  }
}

// Host calls read the index contents: every bad value is named (a CUDA call cannot, docs/serving.md).
TEST(VarlenValidation, HostContents) {
  auto with = [](const VarlenSpec& s, const std::function<void(VarlenCase&)>& edit) {
    auto k = std::make_unique<Call>(s);
    edit(k->c);
    return k;
  };
  {
    auto k = with(VarlenSpec{}, [](VarlenCase& c) { c.cu_seqlens.set({0}, 1); });
    expect_fail(k->fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"cu_seqlens: must start at 0, got cu_seqlens[0] = 1"});
  }
  {
    auto k = with(VarlenSpec{}, [](VarlenCase& c) { c.cu_seqlens.set({2}, 2); });  // 5, 2: decreasing
    expect_fail(k->fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"cu_seqlens: must be non-decreasing, got cu_seqlens[1] = 5 > cu_seqlens[2] = 2"});
    expect_fail(k->bwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"cu_seqlens: must be non-decreasing"});
  }
  {
    auto k = with(VarlenSpec{}, [](VarlenCase& c) { c.cu_seqlens.set({4}, 49); });
    expect_fail(k->fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"cu_seqlens: must end at the packed length 50", "got cu_seqlens[4] = 49"});
  }
  {
    auto k = with(pool_spec(), [](VarlenCase& c) { c.cache_indices.set({2}, 4); });
    expect_fail(k->fwd(), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"cache_indices[2]: expected a slot of ssm_states in [0, 4) or pad_slot_id (-1), got 4"});
  }
  {
    auto k = with(pool_spec(), [](VarlenCase& c) { c.cache_indices.set({1}, 3); });
    expect_fail(k->fwd(), SELSCAN_STATUS_INVALID_ARGUMENT, {"cache_indices: sequences 1 and 2 both name slot 3"});
  }
  {  // the workspace query validates the same way
    auto k = with(VarlenSpec{}, [](VarlenCase& c) { c.cu_seqlens.set({0}, -3); });
    size_t ws = 0;
    expect_fail(selscan_fwd_workspace_size(&k->f, &k->e, &ws), SELSCAN_STATUS_INVALID_ARGUMENT, {"cu_seqlens[0] = -3"});
  }
}

// A caller of the 0.2 structs passes their smaller struct_size: the serving fields, whatever bytes follow, are not
// read, and the call is the dense one, bit for bit.
TEST(VarlenValidation, OlderStructSizeUnaffected) {
  CaseSpec cs;
  cs.has_h0 = true;
  Case a = make_case(cs), b = make_case(cs);
  ASSERT_EQ(run_fwd(a, cpu_exec(2)), SELSCAN_STATUS_SUCCESS);
  ASSERT_EQ(run_bwd(a, cpu_exec(2)), SELSCAN_STATUS_SUCCESS);
  poison(b.fwd_outputs());
  poison(b.bwd_outputs());
  selscan_fwd_args_t f = b.fwd_args(host_ptr);
  selscan_bwd_args_t g = b.bwd_args(host_ptr);
  f.struct_size = offsetof(selscan_fwd_args_t, cu_seqlens);
  g.struct_size = offsetof(selscan_bwd_args_t, cu_seqlens);
  std::memset(&f.cu_seqlens, 0x5a, sizeof(f) - offsetof(selscan_fwd_args_t, cu_seqlens));  // junk past the size
  std::memset(&g.cu_seqlens, 0x5a, sizeof(g) - offsetof(selscan_bwd_args_t, cu_seqlens));
  const selscan_exec_t e = cpu_exec(2);
  ASSERT_EQ(selscan_fwd(&f, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(selscan_bwd(&g, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  const auto fa = a.named_fwd_outputs(), fb = b.named_fwd_outputs();
  for (size_t i = 0; i < fa.size(); ++i) EXPECT_TRUE(fa[i].second->same_bytes(*fb[i].second)) << fa[i].first;
  const auto ga = a.named_bwd_outputs(), gb = b.named_bwd_outputs();
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(ga[i].second->same_bytes(*gb[i].second)) << ga[i].first;
}

// Serving calls are planned on CUDA like dense ones: the validated call (packed, a state pool, padding) gets the
// warp-scan kernels' plans for an H200 in both directions, and through the ABI it goes on to the device check
// (a device that does not exist here, so nothing runs on host pointers) instead of being refused.
TEST(VarlenValidation, CudaServingCallsArePlanned) {
  Call k{pool_spec()};
  selscan::Problem f{}, b{};
  ASSERT_EQ(selscan::make_fwd_problem(&k.f, &f), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_EQ(selscan::make_bwd_problem(&k.b, &b), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  ASSERT_TRUE(f.serving && b.serving);
  const selscan::cuda::DeviceProps h200{0, 90, 132, 232448};
  selscan::cuda::FwdPlan fp;
  selscan::cuda::BwdPlan bp;
  EXPECT_EQ(selscan::cuda::plan_fwd(f, h200, selscan::cuda::Force::none, &fp), SELSCAN_STATUS_SUCCESS)
      << selscan_last_error();
  EXPECT_EQ(fp.kernel, selscan::cuda::Kernel::warp);
  EXPECT_EQ(selscan::cuda::plan_bwd(b, h200, selscan::cuda::Force::none, &bp), SELSCAN_STATUS_SUCCESS)
      << selscan_last_error();
  EXPECT_EQ(bp.kernel, selscan::cuda::Kernel::warp);
  EXPECT_GT(bp.total, 0u);

  k.e.device_kind = SELSCAN_DEVICE_CUDA;
  k.e.device_index = 1000;
  size_t bytes = 1;
#if SELSCAN_WITH_CUDA
  expect_fail(k.fwd(), SELSCAN_STATUS_NO_DEVICE, {});
  expect_fail(k.bwd(), SELSCAN_STATUS_NO_DEVICE, {});
  expect_fail(selscan_bwd_workspace_size(&k.b, &k.e, &bytes), SELSCAN_STATUS_NO_DEVICE, {});
#else
  expect_fail(k.fwd(), SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"});
  expect_fail(selscan_bwd_workspace_size(&k.b, &k.e, &bytes), SELSCAN_STATUS_CUDA_NOT_BUILT, {"without CUDA"});
#endif
  EXPECT_EQ(bytes, 0u);
}

}  // namespace
}  // namespace selscan_test
