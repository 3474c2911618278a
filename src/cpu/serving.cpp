#include "serving.h"

#include <vector>

#include "common.h"
#include "serving_index.h"

namespace selscan::cpu {
namespace {

// v moved by `elems` elements of `bytes` bytes (absent views stay absent).
View shifted(const View& v, int64_t elems, int64_t bytes) {
  View r = v;
  if (r.present()) r.p = static_cast<char*>(r.p) + elems * bytes;
  return r;
}

}  // namespace

View block_slot(const Problem& p, int64_t b, int64_t j) {
  const int64_t slot = table_entry(p, b, j);
  if (slot == p.pad_slot_id) return View{};
  return shifted(p.ssm_states, slot * p.ssm_states.s[0], p.is_complex ? 8 : 4);
}

SeqProblem sequence_problem(const Problem& p, int64_t b) {
  SeqProblem s;
  s.row = p.varlen ? 0 : b;
  int64_t len = p.seqlen;
  if (p.varlen) {
    s.start = index_entry(p.cu_seqlens, p.cu_i64, b);
    len = index_entry(p.cu_seqlens, p.cu_i64, b + 1) - s.start;
  }
  const int64_t slot = p.cache_indices.present() ? index_entry(p.cache_indices, p.idx_i64, b) : b;
  s.pad = p.cache_indices.present() && slot == p.pad_slot_id;
  bool init = has_initial_state(p, b);
  // Block mode: the final state's block decides padding; a sequence resumes from the block before its first token.
  View first_slot{}, last_slot{};
  if (p.block_size > 0) {
    s.block = p.block_size;
    s.ctx = context_len(p, b);
    init = init && s.ctx > 0 && len > 0;
    if (len > 0) {
      last_slot = block_slot(p, b, seq_block_last(s.ctx, len, s.block));
      s.pad = !last_slot.present();  // the final state's entry is pad_slot_id
      if (!s.pad && init) first_slot = block_slot(p, b, (s.ctx - 1) / s.block);
    }
  }

  s.from_state = init && !s.pad && (p.h0.present() || p.ssm_states.present());
  Problem& q = s.q;
  q = p;
  q.batch = 1;
  q.seqlen = len;
  q.nchunks = (len + kChunk - 1) / kChunk;
  q.serving = q.varlen = false;
  q.cu_seqlens = q.ssm_states = q.cache_indices = q.has_init = q.block_table = q.context_lens = View{};
  q.block_size = 0;
  // Time-major views: row `row`, time from `start`.
  const int64_t ib = real_bytes(p.itype), wb = p.is_complex ? 8 : 4, cw = p.is_complex ? 2 : 1;
  for (View* v : {&q.u, &q.delta, &q.z, &q.out, &q.out_z, &q.dout, &q.du, &q.ddelta, &q.dz})
    *v = shifted(*v, s.row * v->s[0] + s.start, ib);
  if (p.var_B) q.B = shifted(q.B, s.row * q.B.s[0] + s.start * cw, ib), q.dB = shifted(q.dB, s.row * q.dB.s[0] + s.start * cw, ib);
  if (p.var_C) q.C = shifted(q.C, s.row * q.C.s[0] + s.start * cw, ib), q.dC = shifted(q.dC, s.row * q.dC.s[0] + s.start * cw, ib);
  q.x = shifted(q.x, s.row * q.x.s[0] + (p.varlen ? seq_chunk0(s.start, b) : 0) * q.x.s[2], wb);
  // States: one row per sequence, or its pool slot.
  q.last_state = shifted(q.last_state, b * q.last_state.s[0], wb);
  q.dh0 = shifted(q.dh0, b * q.dh0.s[0], wb);
  if (p.block_size > 0) {  // an empty sequence reads and writes nothing
    q.h0 = first_slot;
    q.last_state = last_slot;
  } else if (p.ssm_states.present()) {
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
