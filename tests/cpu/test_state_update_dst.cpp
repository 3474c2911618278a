// The decode step with dst_state_batch_indices on the CPU path: the state read from slot idx[b] and written to slot
// dst[b]. Against the in-place call (bit for bit: the same arithmetic, only the slot written differs) and the
// float64 oracle, and every rule of the host check.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "state_update_case.h"

namespace selscan_test {
namespace {

// The bytes of slot `slot` of the (dense, unpadded) state pool.
std::vector<unsigned char> slot_bytes(const StateUpdateCase& c, int64_t slot) {
  const StateUpdateSpec& s = c.spec;
  const size_t n = static_cast<size_t>(s.nheads * s.headdim * s.dstate * c.state.esize());
  const unsigned char* p = c.state.storage.data() + (c.state.offset * c.state.esize()) + slot * n;
  return std::vector<unsigned char>(p, p + n);
}

// The specs every equivalence test runs: both forms, groups, T > 1, 16-bit state, INT64 strided indices.
std::vector<StateUpdateSpec> dst_specs() {
  std::vector<StateUpdateSpec> v;
  StateUpdateSpec s;
  s.batch = 3, s.nheads = 8, s.dstate = 16, s.pool = 8, s.has_z = true;
  v.push_back(s);
  StateUpdateSpec t = s;  // speculative decoding: T = 3 tokens, one state read and one written
  t.tokens = 3, t.itype = SELSCAN_DTYPE_BFLOAT16, t.state_dtype = SELSCAN_DTYPE_BFLOAT16;
  v.push_back(t);
  StateUpdateSpec h;  // heads form, groups, broadcast inputs, INT64 indices with a stride
  h.heads = true, h.batch = 3, h.nheads = 4, h.headdim = 4, h.dstate = 16, h.groups = 2, h.broadcast = true;
  h.pool = 9, h.tokens = 2, h.idx_dtype = SELSCAN_DTYPE_INT64, h.idx_stride = 3, h.has_z = true;
  v.push_back(h);
  StateUpdateSpec f = h;  // float16 state, odd dstate (no vector path on the GPU)
  f.itype = f.state_dtype = SELSCAN_DTYPE_FLOAT16, f.dstate = 12, f.tokens = 1, f.idx_dtype = SELSCAN_DTYPE_INT32;
  v.push_back(f);
  uint64_t seed = 3100;
  for (auto& x : v) x.seed = ++seed;
  return v;
}

// A case as built and after its call, checked against the oracle (slots no sequence writes bit-identical).
struct Ran {
  StateUpdateCase before, after;
};
Ran run_checked(const StateUpdateSpec& spec) {
  Ran r{make_state_update_case(spec), {}};
  r.after = r.before;
  EXPECT_EQ(run_state_update(r.after, cpu_exec(1)), SELSCAN_STATUS_SUCCESS) << spec.str() << ": "
                                                                            << selscan_last_error();
  expect_state_update_ok(r.after, r.before);
  return r;
}

// The same case run in place (sources `idx`) and with destinations `dst`.
struct InPlaceAndDst {
  StateUpdateCase in_place, before, with_dst;
};
InPlaceAndDst run_both(StateUpdateSpec s, std::vector<int64_t> idx, std::vector<int64_t> dst) {
  s.indices = std::move(idx);
  InPlaceAndDst r{run_checked(s).after, {}, {}};
  s.dst = std::move(dst);
  Ran d = run_checked(s);
  r.before = std::move(d.before);
  r.with_dst = std::move(d.after);
  EXPECT_TRUE(r.with_dst.out.storage == r.in_place.out.storage) << s.str() << ": out differs from the in-place call";
  return r;
}

TEST(CpuStateUpdateDst, DstEqualToTheSourceIsTheInPlaceCall) {
  for (const StateUpdateSpec& s : dst_specs()) {
    const InPlaceAndDst r = run_both(s, {5, 0, 2}, {5, 0, 2});
    EXPECT_TRUE(r.with_dst.state.storage == r.in_place.state.storage) << s.str() << ": state";
  }
}

TEST(CpuStateUpdateDst, DistinctDstKeepsTheSourceAndWritesTheInPlaceState) {
  for (const StateUpdateSpec& s : dst_specs()) {
    // Sequences 0 and 1 move to fresh slots; sequence 2 updates in place.
    const InPlaceAndDst r = run_both(s, {5, 0, 2}, {7, 3, 2});
    const StateUpdateCase& c = r.with_dst;
    EXPECT_TRUE(slot_bytes(c, 5) == slot_bytes(r.before, 5)) << s.str() << ": the source slot 5 changed";
    EXPECT_TRUE(slot_bytes(c, 0) == slot_bytes(r.before, 0)) << s.str() << ": the source slot 0 changed";
    EXPECT_TRUE(slot_bytes(c, 7) == slot_bytes(r.in_place, 5)) << s.str() << ": slot 7";
    EXPECT_TRUE(slot_bytes(c, 3) == slot_bytes(r.in_place, 0)) << s.str() << ": slot 3";
    EXPECT_TRUE(slot_bytes(c, 2) == slot_bytes(r.in_place, 2)) << s.str() << ": slot 2";
  }
}

TEST(CpuStateUpdateDst, TwoSequencesMayReadOneSlot) {
  // A shared prefix forks: both read slot 1, each writes its own.
  StateUpdateSpec s = dst_specs()[2];
  s.indices = {1, 1, 4};
  s.dst = {6, 8, 0};
  const Ran r = run_checked(s);
  EXPECT_TRUE(slot_bytes(r.after, 1) == slot_bytes(r.before, 1));
}

TEST(CpuStateUpdateDst, PadDstComputesOutAndWritesNoState) {
  for (const StateUpdateSpec& s : dst_specs()) {
    // Sequence 1 is padding: its destination is not looked at.
    const InPlaceAndDst r = run_both(s, {5, -1, 2}, {-1, 123456, -1});
    EXPECT_TRUE(r.with_dst.state.storage == r.before.state.storage) << s.str() << ": a pad destination wrote the pool";
  }
}

TEST(CpuStateUpdateDst, ACustomPadSlotId) {
  StateUpdateSpec s = dst_specs()[0];
  s.pad_slot = 7;  // slot 7 cannot be used: 7 means padding in both index tensors
  s.indices = {5, 7, 2};
  s.dst = {7, 3, 6};
  const Ran r = run_checked(s);
  EXPECT_TRUE(slot_bytes(r.after, 5) == slot_bytes(r.before, 5));
  EXPECT_TRUE(slot_bytes(r.after, 3) == slot_bytes(r.before, 3)) << "sequence 1 is padding: its destination is ignored";
}

// A destination slot that only a padding or out-of-pool sequence names is nobody's read: allowed.
TEST(CpuStateUpdateDst, SlotsOfSequencesThatReadNothingDoNotConflict) {
  StateUpdateSpec s = dst_specs()[0];
  s.indices = {-1, 0, 2};
  s.dst = {0, 3, 5};  // sequence 0 is padding: its destination 0 is ignored, so sequence 1 may read slot 0
  run_checked(s);
}

}  // namespace
}  // namespace selscan_test
