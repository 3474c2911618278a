// ABI 0.2 (docs/abi.md): struct versions (older and newer callers), the initialiser macros and status count,
// reserved fields, workspace alignment, outputs that alias another tensor or overlap themselves, byte extents,
// and messages that print the value given. Every rejection must leave the outputs untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "selscan/selscan.h"
#include "state_update_case.h"

namespace {

using selscan_test::contiguous_desc;
constexpr auto f32 = SELSCAN_DTYPE_FLOAT32;

// A small fp32 problem with varied values (Bt=2, D=4, L=8, N=3, variable B/C, D, z, softplus), its forward
// outputs and its gradients, built from the initialiser macros.
struct Case {
  static constexpr int64_t Bt = 2, D = 4, L = 8, N = 3, BDL = Bt * D * L, BNL = Bt * N * L;
  std::vector<float> u, delta, A, B, C, Dv, z, out, out_z, dout, du, ddelta, dA, dB, dC, dD, dz;
  selscan_fwd_args_t fwd = SELSCAN_FWD_ARGS_INIT;
  selscan_bwd_args_t bwd = SELSCAN_BWD_ARGS_INIT;
  selscan_exec_t exec = SELSCAN_EXEC_INIT;

  Case() {
    uint64_t s = 0x2545F4914F6CDD1Dull;
    auto fill = [&](std::vector<float>& v, size_t n, float lo, float hi) {
      v.resize(n);
      for (float& x : v) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = lo + (hi - lo) * static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.0f;
      }
    };
    fill(u, BDL, -1, 1);
    fill(delta, BDL, -1.5f, 1);
    fill(A, D * N, -1.5f, -0.2f);
    fill(B, BNL, -1, 1);
    fill(C, BNL, -1, 1);
    fill(Dv, D, -1, 1);
    fill(z, BDL, -2, 2);
    fill(dout, BDL, -1, 1);
    for (auto* v : {&out, &out_z, &du, &ddelta, &dz}) v->assign(BDL, NAN);
    dA.assign(D * N, NAN);
    dB.assign(BNL, NAN);
    dC.assign(BNL, NAN);
    dD.assign(D, NAN);

    fwd.u = contiguous_desc(u.data(), f32, {Bt, D, L});
    fwd.delta = contiguous_desc(delta.data(), f32, {Bt, D, L});
    fwd.A = contiguous_desc(A.data(), f32, {D, N});
    fwd.B = contiguous_desc(B.data(), f32, {Bt, 1, N, L});
    fwd.C = contiguous_desc(C.data(), f32, {Bt, 1, N, L});
    fwd.D = contiguous_desc(Dv.data(), f32, {D});
    fwd.z = contiguous_desc(z.data(), f32, {Bt, D, L});
    fwd.delta_softplus = 1;
    fwd.out = contiguous_desc(out.data(), f32, {Bt, D, L});
    fwd.out_z = contiguous_desc(out_z.data(), f32, {Bt, D, L});

    bwd.u = fwd.u, bwd.delta = fwd.delta, bwd.A = fwd.A, bwd.B = fwd.B, bwd.C = fwd.C, bwd.D = fwd.D;
    bwd.z = fwd.z;
    bwd.delta_softplus = 1;
    bwd.deterministic = 1;
    bwd.dout = contiguous_desc(dout.data(), f32, {Bt, D, L});
    bwd.out = fwd.out;
    bwd.du = contiguous_desc(du.data(), f32, {Bt, D, L});
    bwd.ddelta = contiguous_desc(ddelta.data(), f32, {Bt, D, L});
    bwd.dA = contiguous_desc(dA.data(), f32, {D, N});
    bwd.dB = contiguous_desc(dB.data(), f32, {Bt, 1, N, L});
    bwd.dC = contiguous_desc(dC.data(), f32, {Bt, 1, N, L});
    bwd.dD = contiguous_desc(dD.data(), f32, {D});
    bwd.dz = contiguous_desc(dz.data(), f32, {Bt, D, L});
    exec.num_threads = 1;
  }

  // The forward, so that `out` holds what the backward needs.
  void forward() { ASSERT_EQ(selscan_fwd(&fwd, &exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error(); }

  std::vector<std::vector<float>> grads() const { return {du, ddelta, dA, dB, dC, dD, dz}; }
};

bool all_nan(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isnan(x)) return false;
  return true;
}

// Expects `status` and a message holding every fragment.
void expect_status(selscan_status_t got, selscan_status_t want, const std::vector<std::string>& fragments) {
  EXPECT_EQ(got, want) << selscan_status_string(got) << ": " << selscan_last_error();
  const std::string msg = selscan_last_error();
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << msg << "' lacks '" << f << "'";
}

// A copy of `v` in a heap block of exactly `bytes` bytes (the rest zero), with struct_size = `struct_size`, so
// that AddressSanitizer reports any read past the caller's memory.
template <typename T>
std::unique_ptr<unsigned char[]> boxed(const T& v, size_t bytes, size_t struct_size) {
  std::unique_ptr<unsigned char[]> mem(new unsigned char[bytes]());
  std::memcpy(mem.get(), &v, std::min(bytes, sizeof(T)));
  std::memcpy(mem.get(), &struct_size, sizeof struct_size);
  return mem;
}
template <typename T>
const T* as(const std::unique_ptr<unsigned char[]>& m) {
  return reinterpret_cast<const T*>(m.get());
}

// ------------------------------------------------------------------------------------------ versions
TEST(AbiV02, InitMacrosGiveZeroStructsOfTheRightSize) {
  const selscan_fwd_args_t f = SELSCAN_FWD_ARGS_INIT;
  const selscan_bwd_args_t b = SELSCAN_BWD_ARGS_INIT;
  const selscan_exec_t e = SELSCAN_EXEC_INIT;
  selscan_fwd_args_t fz;
  selscan_bwd_args_t bz;
  std::memset(&fz, 0, sizeof fz);
  std::memset(&bz, 0, sizeof bz);
  fz.struct_size = sizeof fz;
  bz.struct_size = sizeof bz;
  EXPECT_EQ(std::memcmp(&f, &fz, sizeof f), 0);
  EXPECT_EQ(std::memcmp(&b, &bz, sizeof b), 0);
  EXPECT_EQ(e.struct_size, sizeof e);
  EXPECT_EQ(e.reserved, 0);
  // A struct from the macro with only the required tensors set is a valid call (the Case is built that way).
  Case c;
  c.forward();
  EXPECT_FALSE(all_nan(c.out));
}

TEST(AbiV02, StatusCountAndVersionString) {
  EXPECT_EQ(SELSCAN_STATUS_COUNT, SELSCAN_STATUS_INTERNAL + 1);
  for (int s = 0; s < SELSCAN_STATUS_COUNT; ++s)
    for (int t = 0; t < s; ++t)
      EXPECT_STRNE(selscan_status_string(static_cast<selscan_status_t>(s)),
                   selscan_status_string(static_cast<selscan_status_t>(t)));
  EXPECT_STREQ(selscan_version_string(), SELSCAN_VERSION_STRING);
  EXPECT_EQ(selscan_version(), SELSCAN_VERSION);
  EXPECT_GE(SELSCAN_VERSION, 200);  // 0.2: the first version with these fields and macros
}

// A 0.1 caller's backward struct ends before `flags`: the library reads only its bytes and treats the 0.2
// fields as absent, whatever lies after them in memory.
TEST(AbiV02, OlderCallerSmallerStructKeepsWorking) {
  Case full;
  full.forward();
  ASSERT_EQ(selscan_bwd(&full.bwd, &full.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  const size_t v01 = offsetof(selscan_bwd_args_t, flags);
  // The caller's memory ends at struct_size (a read past it is an AddressSanitizer report), or goes on with
  // non-zero bytes where 0.2 has flags and reserved (a read past it would reject the call).
  for (const size_t block : {v01, sizeof(selscan_bwd_args_t)}) {
    Case old;
    old.forward();
    selscan_bwd_args_t with_junk = old.bwd;
    with_junk.flags = 0x7fffffff;
    with_junk.reserved = -1;
    auto mem = boxed(with_junk, block, v01);
    ASSERT_EQ(selscan_bwd(as<selscan_bwd_args_t>(mem), &old.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
    const auto a = full.grads(), b = old.grads();
    for (size_t k = 0; k < a.size(); ++k)
      for (size_t i = 0; i < a[k].size(); ++i) EXPECT_EQ(a[k][i], b[k][i]) << "gradient " << k << " element " << i;
    size_t bytes = 1;
    EXPECT_EQ(selscan_bwd_workspace_size(as<selscan_bwd_args_t>(mem), &old.exec, &bytes), SELSCAN_STATUS_SUCCESS);
  }

  // A struct_size covering `flags` but not `reserved` reads flags (here non-zero: rejected).
  Case c;
  c.forward();
  selscan_bwd_args_t flagged = c.bwd;
  flagged.flags = 0x7fffffff;
  auto mem4 = boxed(flagged, v01 + 4, v01 + 4);
  expect_status(selscan_bwd(as<selscan_bwd_args_t>(mem4), &c.exec), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"flags: reserved, must be 0, got 2147483647"});
  EXPECT_TRUE(all_nan(c.du));
}

// A 0.3 caller's decode-step struct ends before dst_state_batch_indices (0.4): the library reads only its bytes
// and treats the destinations as absent (the in-place update), whatever lies after them in memory.
TEST(AbiV02, OlderCallerSmallerStateUpdateStructKeepsWorking) {
  using selscan_test::StateUpdateCase;
  selscan_test::StateUpdateSpec spec;
  spec.pool = 6, spec.indices = {4, 0, 2}, spec.has_z = true;
  const auto host = [](selscan_test::Tensor& t) { return static_cast<void*>(t.storage.data()); };
  const selscan_exec_t e = selscan_test::cpu_exec(1);
  StateUpdateCase full = selscan_test::make_state_update_case(spec);
  const selscan_state_update_args_t fa = full.args(host, full.idx_storage.data());
  ASSERT_EQ(selscan_state_update(&fa, &e), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  const size_t v03 = offsetof(selscan_state_update_args_t, dst_state_batch_indices);
  // Junk where 0.4 has dst_state_batch_indices: destinations that would move every state and a dtype that would
  // be rejected.
  std::vector<int32_t> junk_dst = {5, 1, 3};
  for (const size_t block : {v03, sizeof(selscan_state_update_args_t)}) {
    StateUpdateCase old = selscan_test::make_state_update_case(spec);
    selscan_state_update_args_t with_junk = old.args(host, old.idx_storage.data());
    with_junk.dst_state_batch_indices = with_junk.state_batch_indices;
    with_junk.dst_state_batch_indices.data = junk_dst.data();
    with_junk.dst_state_batch_indices.dtype = SELSCAN_DTYPE_FLOAT32;
    auto mem = boxed(with_junk, block, v03);
    ASSERT_EQ(selscan_state_update(as<selscan_state_update_args_t>(mem), &e), SELSCAN_STATUS_SUCCESS)
        << selscan_last_error();
    EXPECT_TRUE(old.out.storage == full.out.storage);
    EXPECT_TRUE(old.state.storage == full.state.storage);
  }
  // The macro: struct_size of this version, pad_slot_id -1, every other byte zero.
  const selscan_state_update_args_t m = SELSCAN_STATE_UPDATE_ARGS_INIT;
  selscan_state_update_args_t z;
  std::memset(&z, 0, sizeof z);
  z.struct_size = sizeof z;
  z.pad_slot_id = -1;
  EXPECT_EQ(std::memcmp(&m, &z, sizeof m), 0);
}

TEST(AbiV02, BelowTheFirstVersionIsRejected) {
  Case c;
  const size_t v01 = offsetof(selscan_bwd_args_t, flags);
  auto mem = boxed(c.bwd, v01 - 1, v01 - 1);
  expect_status(selscan_bwd(as<selscan_bwd_args_t>(mem), &c.exec), SELSCAN_STATUS_BAD_STRUCT_SIZE,
                {"selscan_bwd_args: struct_size is " + std::to_string(v01 - 1),
                 "at least " + std::to_string(v01) + " (its first version)"});
  selscan_exec_t e = c.exec;
  e.struct_size = sizeof e - 1;
  expect_status(selscan_fwd(&c.fwd, &e), SELSCAN_STATUS_BAD_STRUCT_SIZE, {"selscan_exec", "at least 48"});
  EXPECT_TRUE(all_nan(c.out));
}

// A newer caller's struct is larger; its extra bytes are fields this library does not know. Zero means "not
// used" and the call runs; anything else is a request this library cannot honour.
TEST(AbiV02, NewerCallerLargerStruct) {
  Case ref;
  ref.forward();

  Case c;
  const size_t big = sizeof(selscan_fwd_args_t) + 32;
  auto mem = boxed(c.fwd, big, big);
  ASSERT_EQ(selscan_fwd(as<selscan_fwd_args_t>(mem), &c.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (size_t i = 0; i < c.out.size(); ++i) EXPECT_EQ(c.out[i], ref.out[i]) << i;

  Case d;
  auto mem2 = boxed(d.fwd, big, big);
  mem2[sizeof(selscan_fwd_args_t) + 5] = 1;
  expect_status(selscan_fwd(as<selscan_fwd_args_t>(mem2), &d.exec), SELSCAN_STATUS_UNSUPPORTED,
                {"selscan_fwd_args: struct_size is " + std::to_string(big),
                 "byte " + std::to_string(sizeof(selscan_fwd_args_t) + 5) + " past its struct is 0x01",
                 "newer version"});
  EXPECT_TRUE(all_nan(d.out));

  const size_t ebig = sizeof(selscan_exec_t) + 8;
  auto emem = boxed(d.exec, ebig, ebig);
  ASSERT_EQ(selscan_fwd(&d.fwd, as<selscan_exec_t>(emem)), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  Case e;
  emem[ebig - 1] = 0x80;
  expect_status(selscan_fwd(&e.fwd, as<selscan_exec_t>(emem)), SELSCAN_STATUS_UNSUPPORTED,
                {"selscan_exec: struct_size is " + std::to_string(ebig), "0x80"});
  EXPECT_TRUE(all_nan(e.out));

  // A struct_size no version could have is garbage: rejected before reading past the struct (the block here
  // holds just the struct).
  for (size_t huge : {size_t{65537}, SIZE_MAX}) {
    auto m = boxed(e.fwd, sizeof(selscan_fwd_args_t), huge);
    expect_status(selscan_fwd(as<selscan_fwd_args_t>(m), &e.exec), SELSCAN_STATUS_BAD_STRUCT_SIZE,
                  {"struct_size is " + std::to_string(huge), "at most 65536"});
  }
  auto m = boxed(e.fwd, 65536, 65536);
  EXPECT_EQ(selscan_fwd(as<selscan_fwd_args_t>(m), &e.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
}

// ------------------------------------------------------------------------------------------ reserved fields
TEST(AbiV02, ReservedFieldsMustBeZero) {
  Case a;
  a.forward();
  a.bwd.flags = 3;
  expect_status(selscan_bwd(&a.bwd, &a.exec), SELSCAN_STATUS_INVALID_ARGUMENT, {"flags: reserved, must be 0, got 3"});
  a.bwd.flags = 0;
  a.bwd.reserved = -2;
  expect_status(selscan_bwd(&a.bwd, &a.exec), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"reserved: reserved, must be 0, got -2"});
  EXPECT_TRUE(all_nan(a.du));
  Case b;
  b.exec.reserved = 5;
  expect_status(selscan_fwd(&b.fwd, &b.exec), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"exec.reserved: reserved, must be 0, got 5"});
  size_t bytes = 0;
  expect_status(selscan_fwd_workspace_size(&b.fwd, &b.exec, &bytes), SELSCAN_STATUS_INVALID_ARGUMENT,
                {"exec.reserved"});
  EXPECT_TRUE(all_nan(b.out));
}

// ------------------------------------------------------------------------------------------ workspace
TEST(AbiV02, WorkspaceAlignmentIsChecked) {
  static_assert(SELSCAN_WORKSPACE_ALIGNMENT == 256, "docs/abi.md documents 256");
  alignas(SELSCAN_WORKSPACE_ALIGNMENT) static unsigned char ws[2 * SELSCAN_WORKSPACE_ALIGNMENT];
  Case a;
  a.exec.workspace = ws + 16;
  a.exec.workspace_bytes = 64;
  expect_status(selscan_fwd(&a.fwd, &a.exec), SELSCAN_STATUS_BAD_LAYOUT,
                {"exec.workspace", "not aligned to SELSCAN_WORKSPACE_ALIGNMENT (256 bytes)"});
  size_t bytes = 0;
  expect_status(selscan_fwd_workspace_size(&a.fwd, &a.exec, &bytes), SELSCAN_STATUS_BAD_LAYOUT, {"exec.workspace"});
  EXPECT_TRUE(all_nan(a.out));
  a.exec.workspace = ws + SELSCAN_WORKSPACE_ALIGNMENT;  // aligned
  EXPECT_EQ(selscan_fwd(&a.fwd, &a.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  Case b;
  b.exec.workspace = ws + 16;  // not checked while no bytes are given
  b.exec.workspace_bytes = 0;
  EXPECT_EQ(selscan_fwd(&b.fwd, &b.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
}

// ------------------------------------------------------------------------------------------ aliasing
TEST(AbiV02, ForwardOutputsMustNotAliasAnything) {
  {
    Case c;  // out over z: out_z would read a z the forward already overwrote
    c.fwd.out.data = c.z.data();
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT,
                  {"out: output bytes [0x", "overlap z's bytes [0x", "no in-place use"});
    EXPECT_TRUE(all_nan(c.out_z));
  }
  {
    Case c;  // out_z over out: the pre-gate output the backward needs would be lost
    c.fwd.out_z.data = c.out.data();
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT, {"out_z: output bytes", "overlap out's"});
    EXPECT_TRUE(all_nan(c.out));
  }
  {
    Case c;  // exactly in place: not supported either
    c.fwd.out.data = c.u.data();
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT, {"out:", "overlap u's"});
  }
  {
    Case c;  // a partial overlap: out starts on delta's last element
    std::vector<float> shared(2 * Case::BDL, NAN);
    std::copy(c.delta.begin(), c.delta.end(), shared.begin());
    c.fwd.delta.data = shared.data();
    c.fwd.out.data = shared.data() + Case::BDL - 1;
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT, {"out:", "overlap delta's"});
    EXPECT_TRUE(std::equal(c.delta.begin(), c.delta.end(), shared.begin()));
    EXPECT_TRUE(std::all_of(shared.begin() + Case::BDL, shared.end(), [](float v) { return std::isnan(v); }));
    EXPECT_TRUE(all_nan(c.out_z));
  }
  {
    Case c;  // last_state over h0
    std::vector<float> h0(Case::Bt * Case::D * Case::N, 0.25f);
    c.fwd.h0 = contiguous_desc(h0.data(), f32, {Case::Bt, Case::D, Case::N});
    c.fwd.last_state = c.fwd.h0;
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT, {"last_state:", "overlap h0's"});
  }
}

TEST(AbiV02, BackwardOutputsMustNotAliasAnything) {
  struct Bad {
    const char* what;
    void (*apply)(Case&);
    std::vector<std::string> fragments;
  };
  const Bad bad[] = {
      {"du over dout", [](Case& c) { c.bwd.du.data = c.dout.data(); }, {"du: output bytes", "overlap dout's"}},
      {"dz over z", [](Case& c) { c.bwd.dz.data = c.z.data(); }, {"dz:", "overlap z's"}},
      {"dC over dB", [](Case& c) { c.bwd.dC.data = c.dB.data(); }, {"dC:", "overlap dB's"}},
      {"dA over A", [](Case& c) { c.bwd.dA.data = c.A.data(); }, {"dA:", "overlap A's"}},
      {"ddelta over du", [](Case& c) { c.bwd.ddelta.data = c.du.data(); }, {"ddelta:", "overlap du's"}},
      {"recomputed out_z over the saved out", [](Case& c) { c.bwd.out_z = c.bwd.out; }, {"out_z:", "overlap out's"}},
  };
  for (const Bad& b : bad) {
    Case c;
    c.forward();
    b.apply(c);
    expect_status(selscan_bwd(&c.bwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT, b.fragments);
    for (const auto& g : c.grads()) EXPECT_TRUE(all_nan(g)) << b.what;
  }
}

// What stays allowed: inputs sharing memory with each other, and outputs side by side in one buffer.
TEST(AbiV02, SharedInputsAndAdjacentOutputsRun) {
  Case ref;
  ref.fwd.delta.data = ref.u.data();  // the same memory as two inputs
  ref.bwd.delta = ref.fwd.delta;
  ref.forward();
  ASSERT_EQ(selscan_bwd(&ref.bwd, &ref.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  Case c;
  c.fwd.delta.data = c.u.data();
  c.bwd.delta = c.fwd.delta;
  std::vector<float> both(2 * Case::BDL, NAN);  // out_z, then out, back to back
  c.fwd.out_z.data = both.data();
  c.fwd.out.data = both.data() + Case::BDL;
  c.bwd.out = c.fwd.out;
  c.forward();
  std::vector<float> grads(3 * Case::BDL, NAN);  // du, ddelta, dz back to back
  c.bwd.du.data = grads.data();
  c.bwd.ddelta.data = grads.data() + Case::BDL;
  c.bwd.dz.data = grads.data() + 2 * Case::BDL;
  ASSERT_EQ(selscan_bwd(&c.bwd, &c.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (int64_t i = 0; i < Case::BDL; ++i) {
    EXPECT_EQ(both[i], ref.out_z[i]);
    EXPECT_EQ(both[Case::BDL + i], ref.out[i]);
    EXPECT_EQ(grads[i], ref.du[i]);
    EXPECT_EQ(grads[Case::BDL + i], ref.ddelta[i]);
    EXPECT_EQ(grads[2 * Case::BDL + i], ref.dz[i]);
  }
}

// ------------------------------------------------------------------------------------------ self-overlap
TEST(AbiV02, OutputsWhoseElementsOverlapAreRejected) {
  {
    Case c;  // channel stride smaller than the row: channel d+1 starts inside channel d
    c.fwd.out.strides[1] = Case::L / 2;
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT,
                  {"out: output elements would overlap: dim 1 (size 4) has stride 4", "reach offset 7"});
    EXPECT_TRUE(all_nan(c.out));
  }
  {
    Case c;  // one element short of a row: out[b, d, L-1] would be out[b, d+1, 0]
    c.fwd.out.strides[1] = Case::L - 1;
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT,
                  {"out: output elements would overlap: dim 1 (size 4) has stride 7", "reach offset 7"});
  }
  {
    Case c;  // batch stride inside the last channel: out[1, 0, :] would be out[0, D-1, :]
    c.fwd.out_z.strides[0] = (Case::D - 1) * Case::L;
    expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT, {"out_z: output elements would overlap"});
  }
  {
    Case c;  // dA (D, N) with equal strides: dA[0, 1] and dA[1, 0] are one element
    c.forward();
    c.bwd.dA.strides[0] = 1;
    c.bwd.dA.strides[1] = 1;
    expect_status(selscan_bwd(&c.bwd, &c.exec), SELSCAN_STATUS_BAD_LAYOUT, {"dA: output elements would overlap"});
    EXPECT_TRUE(all_nan(c.du));
  }
  {
    Case c;  // inputs may overlap themselves (a broadcast u)
    c.fwd.u.strides[0] = 0;
    EXPECT_EQ(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  }
}

// Non-overlapping layouts in any dim order, with padding, still run and give the contiguous results.
TEST(AbiV02, PermutedAndPaddedOutputsRun) {
  constexpr int64_t Bt = Case::Bt, D = Case::D, L = Case::L, N = Case::N, P = 3;
  Case ref;
  ref.forward();
  ASSERT_EQ(selscan_bwd(&ref.bwd, &ref.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();

  Case c;
  std::vector<float> out_t(Bt * D * L, NAN), out_z_pad(Bt * D * (L + P), NAN), dA_t(D * N, NAN);
  c.fwd.out.data = out_t.data();  // batch inside channel: (b, d, t) at d * Bt * L + b * L + t
  c.fwd.out.strides[0] = L;
  c.fwd.out.strides[1] = Bt * L;
  c.fwd.out_z.data = out_z_pad.data();  // rows padded by P elements
  c.fwd.out_z.strides[0] = D * (L + P);
  c.fwd.out_z.strides[1] = L + P;
  c.bwd.out = c.fwd.out;
  c.forward();
  c.bwd.dA.data = dA_t.data();  // transposed: (d, n) at n * D + d
  c.bwd.dA.strides[0] = 1;
  c.bwd.dA.strides[1] = D;
  ASSERT_EQ(selscan_bwd(&c.bwd, &c.exec), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (int64_t b = 0; b < Bt; ++b)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t t = 0; t < L; ++t) {
        const int64_t i = (b * D + d) * L + t;
        EXPECT_EQ(out_t[d * Bt * L + b * L + t], ref.out[i]);
        EXPECT_EQ(out_z_pad[(b * D + d) * (L + P) + t], ref.out_z[i]);
        EXPECT_EQ(c.du[i], ref.du[i]);
      }
  for (int64_t i = 0; i < static_cast<int64_t>(out_z_pad.size()); ++i)
    if (i % (L + P) >= L) EXPECT_TRUE(std::isnan(out_z_pad[i])) << "padding written at " << i;
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n) EXPECT_EQ(dA_t[n * D + d], ref.dA[d * N + n]);
}

// ------------------------------------------------------------------------------------------ byte extents
// The element span of a view may fit int64 while its byte span does not; the kernels address bytes, so the
// byte span decides. The descriptors point at addresses no call dereferences: the workspace query validates
// exactly like the call and touches no tensor.
TEST(AbiV02, ByteExtentsMustFitAndNotWrap) {
  Case c;
  size_t bytes = 0;
  const int64_t inner = (Case::D - 1) * Case::L + (Case::L - 1);  // delta's offsets below the batch stride
  const int64_t fits = INT64_MAX / 4 - 1 - inner;                 // the last element ends at byte INT64_MAX - 3
  c.fwd.delta.data = reinterpret_cast<void*>(uintptr_t{1} << 62);  // above every real allocation: no alias
  c.fwd.delta.strides[0] = fits;
  EXPECT_EQ(selscan_fwd_workspace_size(&c.fwd, &c.exec, &bytes), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  c.fwd.delta.strides[0] = fits + 1;  // element span still fits int64, byte span does not
  expect_status(selscan_fwd_workspace_size(&c.fwd, &c.exec, &bytes), SELSCAN_STATUS_UNSUPPORTED,
                {"delta: sizes (2, 4, 8) with strides (" + std::to_string(fits + 1) + ", 8, 1)",
                 "beyond 64-bit byte offsets"});
  expect_status(selscan_fwd(&c.fwd, &c.exec), SELSCAN_STATUS_UNSUPPORTED, {"beyond 64-bit byte offsets"});
  c.fwd.delta.strides[0] = INT64_MAX - inner;  // the element span is exactly INT64_MAX: the message must not overflow
  expect_status(selscan_fwd_workspace_size(&c.fwd, &c.exec, &bytes), SELSCAN_STATUS_UNSUPPORTED,
                {"reach element offset " + std::to_string(INT64_MAX), "beyond 64-bit byte offsets"});
  c.fwd.delta.strides[0] = fits;
  c.fwd.delta.data = reinterpret_cast<void*>(uintptr_t{3} << 62);  // fits int64, but runs past 2^64
  expect_status(selscan_fwd_workspace_size(&c.fwd, &c.exec, &bytes), SELSCAN_STATUS_UNSUPPORTED,
                {"delta: data pointer", "wraps the address space"});
  EXPECT_TRUE(all_nan(c.out));
}

// ------------------------------------------------------------------------------------------ messages
TEST(AbiV02, MessagesPrintTheValueGiven) {
  Case a;
  a.fwd.A.dtype = 9;
  expect_status(selscan_fwd(&a.fwd, &a.exec), SELSCAN_STATUS_DTYPE_MISMATCH,
                {"A: expected dtype float32 or complex64, got dtype code 9"});
  Case b;
  b.fwd.u.ndim = 2;
  expect_status(selscan_fwd(&b.fwd, &b.exec), SELSCAN_STATUS_SHAPE_MISMATCH,
                {"u: expected 3 dims (batch, dim, seqlen), got ndim=2, shape (2, 4)"});
  Case c;
  c.forward();
  c.bwd.dA.ndim = 3;
  c.bwd.dA.sizes[2] = 5;
  expect_status(selscan_bwd(&c.bwd, &c.exec), SELSCAN_STATUS_SHAPE_MISMATCH,
                {"dA: expected shape (4, 3) like its input, got (4, 3, 5)"});
  Case d;
  d.forward();
  d.bwd.dz.dtype = -4;
  expect_status(selscan_bwd(&d.bwd, &d.exec), SELSCAN_STATUS_DTYPE_MISMATCH, {"dz:", "got dtype code -4"});
  Case e;
  e.fwd.B.ndim = 6;
  expect_status(selscan_fwd(&e.fwd, &e.exec), SELSCAN_STATUS_SHAPE_MISMATCH, {"B:", "ndim=6"});
}

}  // namespace
