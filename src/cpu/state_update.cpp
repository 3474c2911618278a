// The decode step on the CPU. Tasks are (sequence b, a block of channels); within a task the sequence's B and C
// rows of the current group are converted to float once and shared by the group's channels, and each channel's
// state lives in a local array through the T tokens (read once, written once, as on the GPU).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "../state_update.h"
#include "common.h"
#include "kernels.h"

namespace selscan::cpu {
namespace {

// Channels per task.
constexpr int64_t kChannelsPerTask = 256;

struct Scratch {
  std::vector<float> s, A, B, C;  // state [N], A [N], B and C of one group [T][N]
  int64_t group = -1;             // the group B and C hold
};

// The state slot of sequence b; `pad` or `bad` (not pad, outside [0, slots)) when it names none.
int64_t slot_of(const StateUpdate& p, int64_t b, bool* pad, bool* bad) {
  *pad = *bad = false;
  if (p.idx == nullptr) return b;
  const int64_t v = slot_entry(p.idx, p.idx64, p.sidx, b);
  *pad = v == p.pad_slot;
  *bad = !*pad && (v < 0 || v >= p.slots);
  return v;
}

void run_channels(const StateUpdate& p, int64_t b, int64_t c0, int64_t c1, Scratch& w) {
  const int64_t T = p.tokens, N = p.dstate, P = p.headdim;
  bool pad = false, bad = false;
  const int64_t slot = slot_of(p, b, &pad, &bad);
  if (pad || bad) {  // no slot: out is 0 (padding) or NaN (an index the call could not reject)
    const float v = pad ? 0.f : std::numeric_limits<float>::quiet_NaN();
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t t = 0; t < T; ++t)
        store_f(p.x_t, p.out, b * p.sout[0] + t * p.sout[1] + (c / P) * p.sout[2] + (c % P) * p.sout[3], v);
    return;
  }
  // The slot written: dst_state_batch_indices' entry (checked on the host: a slot or pad_slot_id), else the one read.
  const int64_t dst = p.dst != nullptr ? slot_entry(p.dst, p.dst64, p.sdst, b) : slot;
  float* s = w.s.data();
  float* A = w.A.data();
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t h = c / P, pp = c % P, g = h / p.heads_per_group;
    if (g != w.group) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          w.B[t * N + n] = load_f(p.B_t, p.B, b * p.sB[0] + t * p.sB[1] + g * p.sB[2] + n * p.sB[3]);
          w.C[t * N + n] = load_f(p.C_t, p.C, b * p.sC[0] + t * p.sC[1] + g * p.sC[2] + n * p.sC[3]);
        }
      w.group = g;
    }
    const int64_t coff = h * p.sstate[1] + pp * p.sstate[2];
    const int64_t soff = slot * p.sstate[0] + coff;
    for (int64_t n = 0; n < N; ++n) {
      s[n] = load_f(p.state_t, p.state, soff + n * p.sstate[3]);
      A[n] = static_cast<const float*>(p.A)[h * p.sA[0] + pp * p.sA[1] + n * p.sA[2]];
    }
    const float Dv = p.D != nullptr ? static_cast<const float*>(p.D)[h * p.sD[0] + pp * p.sD[1]] : 0.f;
    const float bias = p.dt_bias != nullptr ? static_cast<const float*>(p.dt_bias)[h * p.sbias[0] + pp * p.sbias[1]]
                                            : 0.f;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t cb = b * p.sx[0] + t * p.sx[1] + h * p.sx[2] + pp * p.sx[3];
      const float x = load_f(p.x_t, p.x, cb);
      float dt = load_f(p.dt_t, p.dt, b * p.sdt[0] + t * p.sdt[1] + h * p.sdt[2] + pp * p.sdt[3]) + bias;
      if (p.softplus) kernels().softplus(&dt, 1);
      const float dtx = dt * x;
      const float* Bt = w.B.data() + t * N;
      const float* Ct = w.C.data() + t * N;
      float y = 0.f;
      for (int64_t n = 0; n < N; ++n) {
        s[n] = s[n] * std::exp(A[n] * dt) + Bt[n] * dtx;
        y += s[n] * Ct[n];
      }
      y += Dv * x;
      if (p.z != nullptr) {
        const float z = load_f(p.z_t, p.z, b * p.sz[0] + t * p.sz[1] + h * p.sz[2] + pp * p.sz[3]);
        y = y * z / (1.f + std::exp(-z));
      }
      store_f(p.x_t, p.out, b * p.sout[0] + t * p.sout[1] + h * p.sout[2] + pp * p.sout[3], y);
    }
    if (dst == p.pad_slot) continue;  // out only: the caller keeps no state for this step
    const int64_t doff = dst * p.sstate[0] + coff;
    for (int64_t n = 0; n < N; ++n) store_f(p.state_t, p.state, doff + n * p.sstate[3], s[n]);
  }
}

}  // namespace

Status state_update(const StateUpdate& p, int num_threads) {
  try {
    const int64_t C = p.channels();
    const int64_t blocks = (C + kChannelsPerTask - 1) / kChannelsPerTask;
    const int64_t ntasks = p.batch * blocks;
    const int64_t updates = p.batch * p.tokens * C * p.dstate;
    const int nthreads = resolve_threads(num_threads, ntasks, updates);
    std::vector<std::unique_ptr<Scratch>> scratch(static_cast<size_t>(nthreads));
    return run_tasks(ntasks, nthreads, [&](int64_t task, int worker) {
      auto& sp = scratch[static_cast<size_t>(worker)];
      if (!sp) {
        sp = std::make_unique<Scratch>();
        sp->s.resize(static_cast<size_t>(p.dstate));
        sp->A.resize(static_cast<size_t>(p.dstate));
        sp->B.resize(static_cast<size_t>(p.tokens * p.dstate));
        sp->C.resize(static_cast<size_t>(p.tokens * p.dstate));
      }
      sp->group = -1;  // B and C belong to the task's sequence
      const int64_t b = task / blocks, c0 = (task % blocks) * kChannelsPerTask;
      run_channels(p, b, c0, std::min(C, c0 + kChannelsPerTask), *sp);
    });
  } catch (const std::bad_alloc&) {
    return fail(SELSCAN_STATUS_OUT_OF_MEMORY, "CPU state update: out of host memory for scratch buffers");
  }
}

}  // namespace selscan::cpu
