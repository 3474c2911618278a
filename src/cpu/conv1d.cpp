// The causal conv1d on the CPU (the semantics pinned in src/conv1d.h). Tasks are (sequence, a block of channels);
// each channel's row is read once into fp32 scratch together with its history (initial states or pool slot), so
// every layout and stride runs the same loops. Arithmetic in fp32, outputs rounded to nearest even to their
// dtype. The backward's weight gradients are summed in a fixed order (per row over time, then over sequences in
// order), so the CPU backward is bitwise reproducible whatever the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "../conv1d.h"
#include "../serving_index.h"
#include "common.h"

namespace selscan::cpu {
namespace {

constexpr int64_t kChannelsPerTask = 16;

// Sequence b of a call: where its time axis lives and what it starts from.
struct Seq {
  int64_t row = 0, start = 0, len = 0;
  int64_t slot = -1;        // its conv_states slot (-1: no pool)
  bool pad = false;         // padding: out 0, nothing read or written
  bool from_state = false;  // its history comes from initial_states or its slot (else zeros)
};

Seq sequence_of(const Conv1d& p, int64_t b) {
  Seq s;
  s.row = p.varlen ? 0 : b;
  s.len = p.seqlen;
  if (p.varlen) {
    s.start = index_entry(p.cu_seqlens, p.cu_i64, b);
    s.len = index_entry(p.cu_seqlens, p.cu_i64, b + 1) - s.start;
  }
  const int64_t idx = p.cache_indices.present() ? index_entry(p.cache_indices, p.idx_i64, b) : b;
  s.pad = p.cache_indices.present() && idx == p.pad_slot_id;
  if (p.conv_states.present() && !s.pad) s.slot = idx;
  s.from_state = !s.pad && (p.init.present() || s.slot >= 0) && flag_entry(p.has_init, p.init_i32, b);
  return s;
}

float silu(float y) { return y / (1.f + std::exp(-y)); }

int32_t seq_id(const Conv1d& p, int64_t b, int64_t t) {
  return static_cast<const int32_t*>(p.seq_idx.p)[b * p.seq_idx.s[0] + t * p.seq_idx.s[1]];
}

// One channel row's fp32 scratch: the history and the inputs as one array xe[-hist, len), the weights, and the
// backward's gradient row g[0, len + W - 1) (zeros past len).
struct Row {
  std::vector<float> xbuf, gbuf, ybuf;
  int64_t hist = 0;
  float w[4] = {0.f, 0.f, 0.f, 0.f};
  float bias = 0.f;
  float* xe() { return xbuf.data() + hist; }
};

// Loads channel d of sequence s into r: weights, bias, history (hist >= W-1 columns) and inputs.
void load_row(const Conv1d& p, int64_t b, int64_t d, const Seq& s, Row& r) {
  const int64_t W = p.width;
  for (int64_t k = 0; k < W; ++k) r.w[k] = load_f(p.wtype, p.weight.p, d * p.weight.s[0] + k * p.weight.s[1]);
  r.bias = p.bias.present() ? load_f(p.wtype, p.bias.p, d * p.bias.s[0]) : 0.f;
  float* xe = r.xe();
  std::fill(xe - r.hist, xe, 0.f);
  if (s.from_state && p.init.present())
    for (int64_t j = 0; j < W - 1; ++j)
      xe[j - (W - 1)] = load_f(p.itype, p.init.p, b * p.init.s[0] + d * p.init.s[1] + j * p.init.s[2]);
  if (s.from_state && s.slot >= 0) {
    const View& cs = p.conv_states;
    for (int64_t j = 0; j < p.state_len; ++j)
      xe[j - p.state_len] = load_f(p.itype, cs.p, s.slot * cs.s[0] + d * cs.s[1] + j * cs.s[2]);
  }
  const int64_t base = s.row * p.x.s[0] + d * p.x.s[1];
  for (int64_t t = 0; t < s.len; ++t) xe[t] = load_f(p.itype, p.x.p, base + (s.start + t) * p.x.s[2]);
}

// The pre-activation y(t) = bias + sum_k w[k] xe(t-(W-1)+k) of the row, for t < len (seq_idx: 0 at padding and only
// the terms of t's own segment).
void conv_row(const Conv1d& p, int64_t b, const Seq& s, Row& r, float* y) {
  const int64_t W = p.width;
  const float* xe = r.xe();
  if (!p.seq_idx.present()) {
    for (int64_t t = 0; t < s.len; ++t) {
      float acc = r.bias;
      for (int64_t k = 0; k < W; ++k) acc += r.w[k] * xe[t - (W - 1) + k];
      y[t] = acc;
    }
    return;
  }
  for (int64_t t = 0; t < s.len; ++t) {
    const int32_t id = seq_id(p, b, t);
    float acc = 0.f;
    if (id >= 0) {
      acc = r.bias;
      for (int64_t k = 0; k < W; ++k) {
        const int64_t tp = t - (W - 1) + k;
        if (tp >= 0 && seq_id(p, b, tp) == id) acc += r.w[k] * xe[tp];
      }
    }
    y[t] = acc;
  }
}

// Writes `n` values v(i) into row (row, d) of a (rows, D, L) view from time `start`.
template <class F>
void store_time(Dtype t, const View& v, int64_t row, int64_t d, int64_t start, int64_t n, F&& val) {
  const int64_t base = row * v.s[0] + d * v.s[1];
  for (int64_t i = 0; i < n; ++i) store_f(t, v.p, base + (start + i) * v.s[2], val(i));
}

// Writes the W-1 values v(j) into row (b, d) of a (Bt, D, W-1) state view.
template <class F>
void store_state_row(Dtype t, const View& v, int64_t b, int64_t d, int64_t n, F&& val) {
  for (int64_t j = 0; j < n; ++j) store_f(t, v.p, b * v.s[0] + d * v.s[1] + j * v.s[2], val(j));
}

// Scratch sized for the longest sequence of the call.
std::unique_ptr<Row> make_row(const Conv1d& p, int64_t hist, bool bwd) {
  auto r = std::make_unique<Row>();
  r->hist = hist;
  r->xbuf.resize(static_cast<size_t>(hist + p.seqlen));
  r->ybuf.resize(static_cast<size_t>(p.seqlen));
  if (bwd) r->gbuf.resize(static_cast<size_t>(p.seqlen + p.width));
  return r;
}

// body(b, d0, d1, worker) over (sequence, channel block) tasks on up to `threads` workers, each with its own
// scratch (made on first use).
template <class Scratch, class Make, class Body>
Status run_channel_tasks(int64_t seqs, int64_t dim, int64_t work, int num_threads, Make&& make, Body&& body) {
  const int64_t blocks = (dim + kChannelsPerTask - 1) / kChannelsPerTask;
  const int nthreads = resolve_threads(num_threads, seqs * blocks, work);
  std::vector<std::unique_ptr<Scratch>> scratch(static_cast<size_t>(nthreads));
  return run_tasks(seqs * blocks, nthreads, [&](int64_t task, int worker) {
    auto& sp = scratch[static_cast<size_t>(worker)];
    if (!sp) sp = make();
    const int64_t b = task / blocks, d0 = (task % blocks) * kChannelsPerTask;
    body(b, d0, std::min(dim, d0 + kChannelsPerTask), *sp);
  });
}

Status fwd_impl(const Conv1d& p, int num_threads) {
  const int64_t W = p.width;
  const int64_t hist = p.conv_states.present() ? p.state_len : W - 1;
  return run_channel_tasks<Row>(p.batch, p.dim, p.rows() * p.dim * p.seqlen * W, num_threads,
                                [&] { return make_row(p, hist, false); },
                                [&](int64_t b, int64_t d0, int64_t d1, Row& r) {
    const Seq s = sequence_of(p, b);
    for (int64_t d = d0; d < d1; ++d) {
      if (s.pad) {
        store_time(p.itype, p.out, s.row, d, s.start, s.len, [](int64_t) { return 0.f; });
        if (p.fin.present()) store_state_row(p.itype, p.fin, b, d, W - 1, [](int64_t) { return 0.f; });
        continue;
      }
      if (s.len == 0 && s.slot >= 0) continue;  // an empty sequence touches no slot
      load_row(p, b, d, s, r);
      float* y = r.ybuf.data();
      conv_row(p, b, s, r, y);
      if (p.silu)
        for (int64_t t = 0; t < s.len; ++t) y[t] = silu(y[t]);
      store_time(p.itype, p.out, s.row, d, s.start, s.len, [&](int64_t t) { return y[t]; });
      const float* xe = r.xe();
      if (p.fin.present())
        store_state_row(p.itype, p.fin, b, d, W - 1, [&](int64_t j) { return xe[s.len - (W - 1) + j]; });
      if (s.slot >= 0) {
        const View& cs = p.conv_states;
        for (int64_t j = 0; j < p.state_len; ++j)
          store_f(p.itype, cs.p, s.slot * cs.s[0] + d * cs.s[1] + j * cs.s[2], xe[s.len - p.state_len + j]);
      }
    }
  });
}

Status bwd_impl(const Conv1d& p, int num_threads) {
  const int64_t W = p.width, D = p.dim;
  // Per (sequence, channel): the row's sums of dweight (W) and dbias, added over sequences in order afterwards.
  std::vector<float> part(static_cast<size_t>(p.batch * D * (W + 1)), 0.f);
  const Status st = run_channel_tasks<Row>(p.batch, D, p.rows() * D * p.seqlen * W, num_threads,
                                           [&] { return make_row(p, W - 1, true); },
                                           [&](int64_t b, int64_t d0, int64_t d1, Row& r) {
    const Seq s = sequence_of(p, b);
    for (int64_t d = d0; d < d1; ++d) {
      load_row(p, b, d, s, r);
      const float* xe = r.xe();
      float* g = r.gbuf.data();
      const int64_t dbase = s.row * p.dout.s[0] + d * p.dout.s[1];
      for (int64_t t = 0; t < s.len; ++t) g[t] = load_f(p.itype, p.dout.p, dbase + (s.start + t) * p.dout.s[2]);
      std::fill(g + s.len, g + s.len + W, 0.f);
      if (p.silu) {
        float* y = r.ybuf.data();
        conv_row(p, b, s, r, y);
        for (int64_t t = 0; t < s.len; ++t) {
          const float sg = 1.f / (1.f + std::exp(-y[t]));
          g[t] *= sg * (1.f + y[t] * (1.f - sg));
        }
      }
      if (p.seq_idx.present())
        for (int64_t t = 0; t < s.len; ++t)
          if (seq_id(p, b, t) < 0) g[t] = 0.f;  // padding: out is the constant 0

      // dx(t) = sum_k w[k] g(t + W-1 - k) within t's segment, plus dfinal_states where final_states copied x(t).
      const int64_t fin0 = s.len - (W - 1);  // the position final_states[0] copies
      auto dfin = [&](int64_t j) {
        return load_f(p.itype, p.dfin.p, b * p.dfin.s[0] + d * p.dfin.s[1] + j * p.dfin.s[2]);
      };
      store_time(p.itype, p.dx, s.row, d, s.start, s.len, [&](int64_t t) {
        const int32_t id = p.seq_idx.present() ? seq_id(p, b, t) : 0;
        float acc = 0.f;
        for (int64_t k = W - 1; k >= 0; --k) {
          const int64_t u = t + (W - 1) - k;  // the output that reads x(t) through w[k]
          if (p.seq_idx.present() && (u >= s.len || seq_id(p, b, u) != id)) continue;
          acc += r.w[k] * g[u];
        }
        if (p.dfin.present() && t >= fin0) acc += dfin(t - fin0);
        return acc;
      });
      // dinitial_states[j] (position j - (W-1) < 0): the outputs that read it, and dfinal_states where it reached
      // final_states (sequences shorter than W-1).
      if (p.dinit.present())
        store_state_row(p.itype, p.dinit, b, d, W - 1, [&](int64_t j) {
          float acc = 0.f;
          for (int64_t k = W - 1; k >= 0; --k)
            if (j - k >= 0 && j - k < s.len) acc += r.w[k] * g[j - k];
          if (p.dfin.present() && j >= s.len) acc += dfin(j - s.len);
          return acc;
        });
      // This row's share of dweight and dbias, summed over time in order.
      float* pr = part.data() + (b * D + d) * (W + 1);
      for (int64_t k = 0; k < W; ++k) {
        float acc = 0.f;
        if (!p.seq_idx.present()) {
          for (int64_t t = 0; t < s.len; ++t) acc += g[t] * xe[t - (W - 1) + k];
        } else {
          for (int64_t t = 0; t < s.len; ++t) {
            const int64_t tp = t - (W - 1) + k;
            if (tp >= 0 && seq_id(p, b, tp) == seq_id(p, b, t)) acc += g[t] * xe[tp];
          }
        }
        pr[k] = acc;
      }
      float gb = 0.f;
      for (int64_t t = 0; t < s.len; ++t) gb += g[t];
      pr[W] = gb;
    }
  });
  if (st != SELSCAN_STATUS_SUCCESS) return st;
  for (int64_t d = 0; d < D; ++d) {
    float acc[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t k = 0; k <= W; ++k) acc[k] += part[static_cast<size_t>((b * D + d) * (W + 1) + k)];
    for (int64_t k = 0; k < W; ++k) store_f(p.dwtype, p.dweight.p, d * p.dweight.s[0] + k * p.dweight.s[1], acc[k]);
    if (p.dbias.present()) store_f(p.dwtype, p.dbias.p, d * p.dbias.s[0], acc[W]);
  }
  return SELSCAN_STATUS_SUCCESS;
}

Status update_impl(const Conv1dUpdate& p, int num_threads) {
  const int64_t W = p.width, T = p.tokens, S = p.state_len;
  struct Scratch {
    std::vector<float> v, old;  // v: the W-1 window then the tokens; old: the slot's columns
  };
  auto make = [&] {
    auto sp = std::make_unique<Scratch>();
    sp->v.resize(static_cast<size_t>(W - 1 + T));
    sp->old.resize(static_cast<size_t>(S));
    return sp;
  };
  return run_channel_tasks<Scratch>(p.batch, p.dim, p.batch * p.dim * T * W, num_threads, make,
                                    [&](int64_t b, int64_t d0, int64_t d1, Scratch& sc) {
    const int64_t slot = p.indices.present() ? index_entry(p.indices, p.idx_i64, b) : b;
    const bool pad = p.indices.present() && slot == p.pad_slot_id;
    // The circular buffer's position; checked >= 0 on the host.
    const int64_t c = p.cache_seqlens.present() ? index_entry(p.cache_seqlens, p.seqlens_i64, b) % S : 0;
    float* v = sc.v.data() + (W - 1);  // v[-(W-1), T)
    float* old = sc.old.data();
    const View& cs = p.conv_state;
    for (int64_t d = d0; d < d1; ++d) {
      const int64_t obase = b * p.out.s[0] + d * p.out.s[1];
      if (pad) {
        for (int64_t t = 0; t < T; ++t) store_f(p.itype, p.out.p, obase + t * p.out.s[2], 0.f);
        continue;
      }
      const int64_t sbase = slot * cs.s[0] + d * cs.s[1];
      for (int64_t j = 0; j < S; ++j) old[j] = load_f(p.state_t, cs.p, sbase + j * cs.s[2]);
      // The W-1 inputs before the tokens: the columns before the circular position, or the slot's last ones.
      for (int64_t i = -(W - 1); i < 0; ++i) v[i] = p.cache_seqlens.present() ? old[((c + i) % S + S) % S] : old[S + i];
      for (int64_t t = 0; t < T; ++t) v[t] = load_f(p.itype, p.x.p, b * p.x.s[0] + d * p.x.s[1] + t * p.x.s[2]);
      float w[4];
      for (int64_t k = 0; k < W; ++k) w[k] = load_f(p.wtype, p.weight.p, d * p.weight.s[0] + k * p.weight.s[1]);
      const float bias = p.bias.present() ? load_f(p.wtype, p.bias.p, d * p.bias.s[0]) : 0.f;
      for (int64_t t = 0; t < T; ++t) {
        float acc = bias;
        for (int64_t k = 0; k < W; ++k) acc += w[k] * v[t - (W - 1) + k];
        store_f(p.itype, p.out.p, obase + t * p.out.s[2], p.silu ? silu(acc) : acc);
      }
      if (p.cache_seqlens.present()) {
        // Token i goes to column (c + i) mod S; of tokens sharing a column (T > S) the last one stays.
        for (int64_t i = std::max<int64_t>(0, T - S); i < T; ++i)
          store_f(p.state_t, cs.p, sbase + ((c + i) % S) * cs.s[2], v[i]);
      } else {
        // (old columns, tokens)'s last S values: shifted left by T.
        for (int64_t j = 0; j < S; ++j)
          store_f(p.state_t, cs.p, sbase + j * cs.s[2], T + j < S ? old[T + j] : v[T + j - S]);
      }
    }
  });
}

}  // namespace

Status conv1d_fwd(const Conv1d& p, int num_threads) {
  try {
    return fwd_impl(p, num_threads);
  } catch (const std::bad_alloc&) {
    return fail(SELSCAN_STATUS_OUT_OF_MEMORY, "CPU conv1d forward: out of host memory for scratch buffers");
  }
}

Status conv1d_bwd(const Conv1d& p, int num_threads) {
  try {
    return bwd_impl(p, num_threads);
  } catch (const std::bad_alloc&) {
    return fail(SELSCAN_STATUS_OUT_OF_MEMORY, "CPU conv1d backward: out of host memory for scratch buffers");
  }
}

Status conv1d_update(const Conv1dUpdate& p, int num_threads) {
  try {
    return update_impl(p, num_threads);
  } catch (const std::bad_alloc&) {
    return fail(SELSCAN_STATUS_OUT_OF_MEMORY, "CPU conv1d update: out of host memory for scratch buffers");
  }
}

}  // namespace selscan::cpu
