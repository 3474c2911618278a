#include "serving.h"

#include <vector>

#include "common.h"

namespace selscan::cpu {
namespace {

int64_t entry(const View& v, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(v.p)[i * v.s[0]] : static_cast<const int32_t*>(v.p)[i * v.s[0]];
}

int64_t itype_bytes(Dtype t) { return t == Dtype::f32 ? 4 : 2; }

// v moved by `elems` elements of `bytes` bytes (absent views stay absent).
View shifted(const View& v, int64_t elems, int64_t bytes) {
  View r = v;
  if (r.present()) r.p = static_cast<char*>(r.p) + elems * bytes;
  return r;
}

}  // namespace

SeqProblem sequence_problem(const Problem& p, int64_t b) {
  SeqProblem s;
  s.row = p.varlen ? 0 : b;
  int64_t len = p.seqlen;
  if (p.varlen) {
    s.start = entry(p.cu_seqlens, p.cu_i64, b);
    len = entry(p.cu_seqlens, p.cu_i64, b + 1) - s.start;
  }
  const int64_t slot = p.cache_indices.present() ? entry(p.cache_indices, p.idx_i64, b) : b;
  s.pad = p.cache_indices.present() && slot == p.pad_slot_id;
  const bool init = !p.has_init.present() ||
                    (p.init_i32 ? static_cast<const int32_t*>(p.has_init.p)[b * p.has_init.s[0]] != 0
                                : static_cast<const unsigned char*>(p.has_init.p)[b * p.has_init.s[0]] != 0);

  s.from_state = init && !s.pad && (p.h0.present() || p.ssm_states.present());
  Problem& q = s.q;
  q = p;
  q.batch = 1;
  q.seqlen = len;
  q.nchunks = (len + kChunk - 1) / kChunk;
  q.serving = q.varlen = false;
  q.cu_seqlens = q.ssm_states = q.cache_indices = q.has_init = View{};
  // Time-major views: row `row`, time from `start`.
  const int64_t ib = itype_bytes(p.itype), wb = p.is_complex ? 8 : 4, cw = p.is_complex ? 2 : 1;
  for (View* v : {&q.u, &q.delta, &q.z, &q.out, &q.out_z, &q.dout, &q.du, &q.ddelta, &q.dz})
    *v = shifted(*v, s.row * v->s[0] + s.start, ib);
  if (p.var_B) q.B = shifted(q.B, s.row * q.B.s[0] + s.start * cw, ib), q.dB = shifted(q.dB, s.row * q.dB.s[0] + s.start * cw, ib);
  if (p.var_C) q.C = shifted(q.C, s.row * q.C.s[0] + s.start * cw, ib), q.dC = shifted(q.dC, s.row * q.dC.s[0] + s.start * cw, ib);
  q.x = shifted(q.x, s.row * q.x.s[0] + (p.varlen ? seq_chunk0(s.start, b) : 0) * q.x.s[2], wb);
  // States: one row per sequence, or its pool slot.
  q.last_state = shifted(q.last_state, b * q.last_state.s[0], wb);
  q.dh0 = shifted(q.dh0, b * q.dh0.s[0], wb);
  if (p.ssm_states.present()) {
    const View slot_view = s.pad ? View{} : shifted(p.ssm_states, slot * p.ssm_states.s[0], wb);
    q.h0 = init ? slot_view : View{};
    q.last_state = slot_view;
  } else {
    q.h0 = init && !s.pad ? shifted(q.h0, b * q.h0.s[0], wb) : View{};
  }
  return s;
}

void zero_row(const Problem& q, const View& v, int64_t b, int64_t d, int64_t len) {
  if (!v.present() || len == 0) return;
  const std::vector<float> zeros(static_cast<size_t>(len), 0.f);
  store_row(q.itype, v.p, b * v.s[0] + d * v.s[1], len, zeros.data());
}

}  // namespace selscan::cpu
