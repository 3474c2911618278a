// Forward on the CPU. Work is split into tasks of (batch b, group g, a block of the group's channels); a task
// walks time in blocks of TB steps, converting and transposing that block of variable B/C once and then
// advancing every channel of the block through it (B/C stay in cache while all channels use them).
#include <algorithm>
#include <memory>
#include <vector>

#include "../problem.h"
#include "common.h"
#include "cpu.h"
#include "rows.h"
#include "serving.h"

namespace selscan::cpu {
namespace {

// Time block: a power of two dividing the chunk length (so chunk ends fall on block ends) with the B/C block
// around 32 KB.
int64_t time_block(int64_t Np) {
  int64_t tb = kChunk;
  while (tb > 16 && tb * Np > 8192) tb /= 2;
  return tb;
}

template <class W>
struct FwdScratch {
  std::vector<W> Bt, Ct, h, P;  // h, P: [rows][Np]
  std::vector<float> tmp, delta, du, u, y, z;
  std::vector<ChannelConsts<W>> consts;
};

template <class W>
Status fwd_impl(const Problem& p, int num_threads) {
  // Ltot: the time axis of every row (a serving call's sequences are at most this long).
  const int64_t Bt = p.batch, D = p.dim, Ltot = p.seqlen, N = p.dstate, G = p.groups, cpg = D / G;
  const int64_t Np = padded_states(N);
  const int64_t TB = std::min(time_block(Np), Ltot);
  const int64_t updates = p.rows() * D * Ltot * N;
  const bool vb = p.var_B, vc = p.var_C, with_P = p.x.present();

  // Channel blocks: about 4 tasks per thread, at most 64 channels each (the row state lives in scratch).
  const int guess = resolve_threads(num_threads, Bt * D, updates);
  const int64_t K = std::min<int64_t>(cpg, std::clamp<int64_t>((Bt * D + 4 * guess - 1) / (4 * guess), 1, 64));
  const int64_t blocks = (cpg + K - 1) / K;
  const int64_t ntasks = Bt * G * blocks;
  const int nthreads = resolve_threads(num_threads, ntasks, updates);
  std::vector<std::unique_ptr<FwdScratch<W>>> scratch(static_cast<size_t>(nthreads));

  auto body = [&](int64_t task, int worker) {
    auto& sp = scratch[static_cast<size_t>(worker)];
    if (!sp) {
      sp = std::make_unique<FwdScratch<W>>();
      sp->Bt.resize(vb ? static_cast<size_t>(TB * Np) : 0);
      sp->Ct.resize(vc ? static_cast<size_t>(TB * Np) : 0);
      sp->h.resize(static_cast<size_t>(K * Np));
      sp->P.resize(static_cast<size_t>(K * Np));
      for (auto* v : {&sp->delta, &sp->du, &sp->u, &sp->y, &sp->z}) v->resize(static_cast<size_t>(TB));
      sp->tmp.resize(static_cast<size_t>(2 * TB));
      sp->consts.resize(static_cast<size_t>(K));
      for (auto& c : sp->consts) c.resize(Np);
    }
    FwdScratch<W>& s = *sp;
    const int64_t task_b = task / (G * blocks), g = (task / blocks) % G, kb = task % blocks;
    const int64_t d0 = g * cpg + kb * K, nr = std::min(K, cpg - kb * K);
    // A serving call runs sequence task_b as a batch of one (serving.h); a dense call reads row task_b of p.
    SeqProblem seq;
    if (p.serving) seq = sequence_problem(p, task_b);
    const Problem& q = p.serving ? seq.q : p;
    const int64_t b = p.serving ? 0 : task_b, L = q.seqlen;
    if (seq.pad) {  // padding: outputs 0, no state read or written
      for (int64_t d = d0; d < d0 + nr; ++d) {
        zero_row(q, q.out, b, d, L);
        zero_row(q, q.out_z, b, d, L);
        if (q.last_state.present())
          for (int64_t n = 0; n < N; ++n)
            wstore(q.last_state, b * q.last_state.s[0] + d * q.last_state.s[1] + n * q.last_state.s[2], W{});
      }
      return;
    }

    for (int64_t r = 0; r < nr; ++r) {
      const int64_t d = d0 + r;
      s.consts[static_cast<size_t>(r)].fill(q, d);
      W* h = s.h.data() + r * Np;
      W* P = s.P.data() + r * Np;
      for (int64_t n = 0; n < Np; ++n) {
        h[n] = (n < N && q.h0.present()) ? wload<W>(q.h0, b * q.h0.s[0] + d * q.h0.s[1] + n * q.h0.s[2]) : W{};
        P[n] = wone<W>();
      }
    }

    for (int64_t t0 = 0; t0 < L; t0 += TB) {
      const int64_t T = std::min(TB, L - t0);
      if (vb) load_bc_block(q, q.B, b, g, t0, T, Np, s.tmp.data(), s.Bt.data());
      if (vc) load_bc_block(q, q.C, b, g, t0, T, Np, s.tmp.data(), s.Ct.data());
      const bool chunk_end = (t0 + T) % kChunk == 0 || t0 + T == L;
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t d = d0 + r;
        const ChannelConsts<W>& cc = s.consts[static_cast<size_t>(r)];
        load_delta(q, b, d, t0, T, s.delta.data());
        const float* u = input_row(q.itype, q.u.p, bdl_offset(q.u, b, d) + t0, T, s.u.data());
        // Upstream multiplies by D even when it is absent (D = 0), so NaN/inf in u reach y either way.
        const float Dd = q.D.present() ? fload(q.D, d * q.D.s[0]) : 0.f;
        float* du = s.du.data();
        float* y = s.y.data();
        const float* dl = s.delta.data();
        for (int64_t t = 0; t < T; ++t) {
          du[t] = dl[t] * u[t];
          y[t] = Dd * u[t];
        }
        W* h = s.h.data() + r * Np;
        W* P = s.P.data() + r * Np;
        // Steps [a, e) of the time block.
        auto advance = [&](int64_t a, int64_t e) {
          FwdBlockT<W> k{e - a,     Np,        s.delta.data() + a, s.du.data() + a, cc.A2.data(), cc.Bc.data(),
                         s.Bt.data() + (vb ? a * Np : 0),       cc.Cc.data(),    s.Ct.data() + (vc ? a * Np : 0),
                         cc.Cs.data(), h,     P,                  s.y.data() + a};
          k.N = N;
          run_fwd_kernel(k, vb, vc, with_P);
        };
        // Block-wise state caching: the kernel stops after each block end strictly inside the sequence and the
        // state is copied into that block's slot. The kernels carry nothing across steps but h and P (kept in
        // memory between calls), so the split changes no bit of out, x or the final state; a hook inside the
        // vector kernels would cost every call a branch per step.
        int64_t a = 0;
        if (seq.block > 0)
          for (int64_t e = next_block_end(seq.ctx, t0, seq.block) - t0; e < T && t0 + e < L - 1;
               e += seq.block) {
            advance(a, e + 1);
            a = e + 1;
            const View slot = block_slot(p, task_b, (seq.ctx + t0 + e) / seq.block);
            if (slot.present())
              for (int64_t n = 0; n < N; ++n) wstore(slot, d * slot.s[1] + n * slot.s[2], h[n]);
          }
        if (a < T) advance(a, T);

        store_row(q.itype, q.out.p, bdl_offset(q.out, b, d) + t0, T, s.y.data());
        if (q.z.present()) {
          const float* z = input_row(q.itype, q.z.p, bdl_offset(q.z, b, d) + t0, T, s.z.data());
          float* oz = s.u.data();  // u is no longer needed
          for (int64_t t = 0; t < T; ++t) oz[t] = y[t] * z[t] / (1.f + std::exp(-z[t]));
          store_row(q.itype, q.out_z.p, bdl_offset(q.out_z, b, d) + t0, T, oz);
        }
        if (with_P && chunk_end) {
          const int64_t c = (t0 + T - 1) / kChunk;
          const int64_t base = b * q.x.s[0] + d * q.x.s[1] + c * q.x.s[2];
          for (int64_t n = 0; n < N; ++n) {
            wstore(q.x, base + 2 * n, P[n]);
            wstore(q.x, base + 2 * n + 1, h[n]);
          }
        }
      }
    }

    if (q.last_state.present()) {
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t d = d0 + r;
        const W* h = s.h.data() + r * Np;
        const ChannelConsts<W>& cc = s.consts[static_cast<size_t>(r)];
        for (int64_t n = 0; n < N; ++n) {
          // With fold_B the scanned state is h / B; Cs holds B then (1 otherwise).
          const W v = q.fold_B ? cc.Cs[n] * h[n] : h[n];
          wstore(q.last_state, b * q.last_state.s[0] + d * q.last_state.s[1] + n * q.last_state.s[2], v);
        }
      }
    }
  };
  return run_tasks(ntasks, nthreads, body);
}

}  // namespace

Status fwd(const Problem& p, int num_threads) {
  try {
    return p.is_complex ? fwd_impl<cfloat>(p, num_threads) : fwd_impl<float>(p, num_threads);
  } catch (const std::bad_alloc&) {
    return fail(SELSCAN_STATUS_OUT_OF_MEMORY, "CPU forward: out of host memory for scratch buffers");
  } catch (...) {
    return fail(SELSCAN_STATUS_INTERNAL, "CPU forward: internal error");
  }
}

}  // namespace selscan::cpu
