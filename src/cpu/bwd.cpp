// Backward on the CPU. A task is (batch b, group g, a block of K consecutive channels of the group); it walks
// the chunks in reverse, converting variable B/C of a chunk once for the whole block, and for each channel
// recomputes the chunk's forward states (seeded from the saved x, or recomputed when x is absent) and runs
// the reverse scan, carrying dh from chunk to chunk. Scratch is O(chunk x dstate) per worker.
//
// Determinism, independent of the thread count: sums over batch (dA, constant dB/dC, dD, ddelta_bias) go
// through per-row partials summed in batch order afterwards; variable dB/dC (summed over the channels of a
// group) are summed over a block's channels in order, and blocks add their chunk sums in block order (a block
// waits for its predecessor's add of the same chunk). K is fixed, not derived from the thread count.
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "../problem.h"
#include "common.h"
#include "cpu.h"
#include "rows.h"
#include "serving.h"

namespace selscan::cpu {
namespace {

constexpr int64_t kBlockChannels = 16;

template <class W>
struct BwdScratch {
  // One chunk of one row: [Tc]
  std::vector<float> delta, pre, u, du, dy, gsum, dsum, out1, out2, tmp;
  std::vector<W> Bt, Ct;          // variable B/C of the chunk: [Tc][Np]
  std::vector<W> dBt, dCt;        // one row's variable dB/dC of the chunk: [Tc][Np]
  std::vector<W> dBsum, dCsum;    // the block's sums over its channels: [Tc][Np]
  std::vector<W> hs, as;          // kernel scratch
  std::vector<W> seeds;           // [K][nc][Np] when x is absent
  std::vector<W> carry, S1, S2, S3;  // [K][Np] per-row state across chunks
  std::vector<ChannelConsts<W>> consts;  // [K]
};

template <class W>
Status bwd_impl(const Problem& p, int num_threads) {
  // Ltot, ncmax: the time axis of every row and x's chunk slots (a serving call's sequences are at most this long).
  const int64_t Bt = p.batch, D = p.dim, Ltot = p.seqlen, N = p.dstate, G = p.groups, cpg = D / G;
  const int64_t Np = padded_states(N), ncmax = p.nchunks, Tc = std::min(kChunk, Ltot), R = p.rows();
  const bool vb = p.var_B, vc = p.var_C, fold = p.fold_B, has_z = p.z.present();
  const int64_t K = std::min(cpg, kBlockChannels), blocks = (cpg + K - 1) / K;
  const size_t rowsN = static_cast<size_t>(Bt * D * Np);

  // Per-row partials of the batch reductions (a row per sequence), and the group accumulators of variable dB/dC
  // ([L][Np] per row of B/C).
  std::vector<W> dA_part(rowsN), dB_part(vb ? 0 : rowsN), dC_part(vc ? 0 : rowsN);
  std::vector<float> dD_part(static_cast<size_t>(Bt * D)), ddb_part(static_cast<size_t>(Bt * D));
  const size_t acc_len = static_cast<size_t>(Ltot * Np);
  std::vector<W> accB(vb ? static_cast<size_t>(R * G) * acc_len : 0);
  std::vector<W> accC(vc ? static_cast<size_t>(R * G) * acc_len : 0);
  // Per (b, g, chunk): the block whose add of that chunk is next.
  std::unique_ptr<std::atomic<int64_t>[]> turn;
  if (vb || vc) {
    turn.reset(new std::atomic<int64_t>[static_cast<size_t>(Bt * G * ncmax)]);
    for (int64_t i = 0; i < Bt * G * ncmax; ++i) turn[static_cast<size_t>(i)].store(0);
  }
  std::atomic<bool> abort{false};

  const int64_t ntasks = Bt * G * blocks;
  const int nthreads = resolve_threads(num_threads, ntasks, R * D * Ltot * N);
  std::vector<std::unique_ptr<BwdScratch<W>>> scratch(static_cast<size_t>(nthreads));

  auto body = [&](int64_t task, int worker) {
    auto& sp = scratch[static_cast<size_t>(worker)];
    if (!sp) {
      sp = std::make_unique<BwdScratch<W>>();
      for (auto* v : {&sp->delta, &sp->pre, &sp->u, &sp->du, &sp->dy, &sp->gsum, &sp->dsum, &sp->out1, &sp->out2})
        v->resize(static_cast<size_t>(Tc));
      sp->tmp.resize(static_cast<size_t>(2 * Tc));
      const size_t tn = static_cast<size_t>(Tc * Np);
      if (vb) sp->Bt.resize(tn), sp->dBt.resize(tn), sp->dBsum.resize(tn);
      if (vc) sp->Ct.resize(tn), sp->dCt.resize(tn), sp->dCsum.resize(tn);
      sp->hs.resize(static_cast<size_t>((Tc + 1) * Np));
      sp->as.resize(tn);
      if (ncmax > 1 && !p.x.present()) sp->seeds.resize(static_cast<size_t>(K * ncmax * Np));
      for (auto* v : {&sp->carry, &sp->S1, &sp->S2, &sp->S3}) v->resize(static_cast<size_t>(K * Np));
      sp->consts.resize(static_cast<size_t>(K));
      for (auto& c : sp->consts) c.resize(Np);
    }
    BwdScratch<W>& s = *sp;
    const int64_t task_b = task / (G * blocks), g = (task / blocks) % G, kb = task % blocks;
    const int64_t d0 = g * cpg + kb * K, nr = std::min(K, cpg - kb * K);
    // A serving call runs sequence task_b as a batch of one (serving.h); a dense call reads row task_b of p. The
    // partials are per sequence (task_b); the group accumulators per row of B/C, from the sequence's offset.
    SeqProblem seq;
    if (p.serving) seq = sequence_problem(p, task_b);
    const Problem& q = p.serving ? seq.q : p;
    const int64_t b = p.serving ? 0 : task_b, L = q.seqlen, nc = q.nchunks;
    const int64_t acc_row = p.serving ? seq.row : task_b, acc_t0 = seq.start;

    for (int64_t r = 0; r < nr; ++r) {
      const int64_t d = d0 + r;
      s.consts[static_cast<size_t>(r)].fill(q, d);
      dD_part[static_cast<size_t>(task_b * D + d)] = 0.f;
      ddb_part[static_cast<size_t>(task_b * D + d)] = 0.f;
      W* dA = dA_part.data() + (task_b * D + d) * Np;
      std::fill(dA, dA + Np, W{});
    }
    for (auto* v : {&s.carry, &s.S1, &s.S2, &s.S3}) std::fill(v->begin(), v->end(), W{});
    if (seq.pad) {  // padding: every gradient 0, nothing added to the reductions (its partials stay 0)
      for (int64_t d = d0; d < d0 + nr; ++d) {
        for (const View* v : {&q.du, &q.ddelta, &q.dz, &q.out_z}) zero_row(q, *v, b, d, L);
        if (q.dh0.present())
          for (int64_t n = 0; n < N; ++n) wstore(q.dh0, b * q.dh0.s[0] + d * q.dh0.s[1] + n * q.dh0.s[2], W{});
      }
      return;
    }

    // The state before chunk c of row r.
    auto h0_into = [&](int64_t d, W* dst) {
      for (int64_t n = 0; n < Np; ++n)
        dst[n] = (n < N && q.h0.present()) ? wload<W>(q.h0, b * q.h0.s[0] + d * q.h0.s[1] + n * q.h0.s[2]) : W{};
    };
    std::vector<W> seed_buf(static_cast<size_t>(Np));
    auto seed_of = [&](int64_t r, int64_t c) -> const W* {
      const int64_t d = d0 + r;
      if (c == 0) {
        h0_into(d, seed_buf.data());
        return seed_buf.data();
      }
      if (!q.x.present()) return s.seeds.data() + (r * nc + c) * Np;
      const int64_t base = b * q.x.s[0] + d * q.x.s[1] + (c - 1) * q.x.s[2];
      for (int64_t n = 0; n < Np; ++n) seed_buf[static_cast<size_t>(n)] = n < N ? wload<W>(q.x, base + 2 * n + 1) : W{};
      return seed_buf.data();
    };
    // δ, δu of chunk rows (t0, T) of channel d into s.delta / s.du (s.pre: before softplus; s.u: u).
    auto load_dt = [&](int64_t d, int64_t t0, int64_t T) {
      load_delta(q, b, d, t0, T, s.delta.data(), s.pre.data());
      load_row(q.itype, q.u.p, bdl_offset(q.u, b, d) + t0, T, s.u.data());
      for (int64_t t = 0; t < T; ++t) s.du[t] = s.delta[t] * s.u[t];
    };

    // Without x, recompute the chunk seeds with the forward kernel (exactly the forward's states).
    if (nc > 1 && !q.x.present()) {
      for (int64_t r = 0; r < nr; ++r) h0_into(d0 + r, s.seeds.data() + r * nc * Np);
      for (int64_t c = 0; c + 1 < nc; ++c) {
        const int64_t t0 = c * kChunk;
        if (vb) load_bc_block(q, q.B, b, g, t0, kChunk, Np, s.tmp.data(), s.Bt.data());
        if (vc) load_bc_block(q, q.C, b, g, t0, kChunk, Np, s.tmp.data(), s.Ct.data());
        for (int64_t r = 0; r < nr; ++r) {
          const ChannelConsts<W>& cc = s.consts[static_cast<size_t>(r)];
          load_dt(d0 + r, t0, kChunk);
          W* h = s.hs.data();
          std::copy(s.seeds.data() + (r * nc + c) * Np, s.seeds.data() + (r * nc + c + 1) * Np, h);
          FwdBlockT<W> k{kChunk,       Np,          s.delta.data(), s.du.data(), cc.A2.data(), cc.Bc.data(),
                         s.Bt.data(), cc.Cc.data(), s.Ct.data(),    cc.Cs.data(), h,            nullptr,
                         s.gsum.data()};
          k.N = N;
          run_fwd_kernel(k, vb, vc, false);
          std::copy(h, h + Np, s.seeds.data() + (r * nc + c + 1) * Np);
        }
      }
    }

    for (int64_t c = nc - 1; c >= 0; --c) {
      const int64_t t0 = c * kChunk, T = std::min(kChunk, L - t0);
      if (vb) load_bc_block(q, q.B, b, g, t0, T, Np, s.tmp.data(), s.Bt.data());
      if (vc) load_bc_block(q, q.C, b, g, t0, T, Np, s.tmp.data(), s.Ct.data());
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t d = d0 + r, row = task_b * D + d;
        const ChannelConsts<W>& cc = s.consts[static_cast<size_t>(r)];
        load_dt(d, t0, T);
        load_row(q.itype, q.dout.p, bdl_offset(q.dout, b, d) + t0, T, s.dy.data());
        if (has_z) {
          // Gate: dz from the saved (rounded) out; dy = dout * silu(z); out_z recomputed from the saved out.
          float* zr = s.out1.data();
          float* outr = s.out2.data();
          load_row(q.itype, q.z.p, bdl_offset(q.z, b, d) + t0, T, zr);
          load_row(q.itype, q.out.p, bdl_offset(q.out, b, d) + t0, T, outr);
          for (int64_t t = 0; t < T; ++t) {
            const float zt = zr[t], ot = outr[t], dout = s.dy[t];
            const float sg = sigmoid(zt), silu = zt * sg;
            zr[t] = dout * ot * sg * (1.f + zt * (1.f - sg));  // dz
            s.dy[t] = dout * silu;
            outr[t] = ot * silu;  // recomputed out_z
          }
          store_row(q.itype, q.dz.p, bdl_offset(q.dz, b, d) + t0, T, zr);
          if (q.out_z.present()) store_row(q.itype, q.out_z.p, bdl_offset(q.out_z, b, d) + t0, T, outr);
        }
        float dD = 0.f;
        for (int64_t t = 0; t < T; ++t) dD += s.dy[t] * s.u[t];
        dD_part[static_cast<size_t>(row)] += dD;

        BwdChunkT<W> k{};
        k.T = T;
        k.Np = Np;
        k.N = N;
        k.delta = s.delta.data();
        k.du = s.du.data();
        k.dy = s.dy.data();
        k.A2 = cc.A2.data();
        k.A = cc.A.data();
        k.Bc = cc.Bc.data();
        k.Bt = s.Bt.data();
        k.Cc = cc.Cc.data();
        k.Ct = s.Ct.data();
        k.Cs = cc.Cs.data();
        k.seed = seed_of(r, c);
        k.hs = s.hs.data();
        k.as = s.as.data();
        k.carry = s.carry.data() + r * Np;
        k.gsum = s.gsum.data();
        k.dsum = s.dsum.data();
        k.dA = dA_part.data() + row * Np;
        // The first channel of the block writes the block sums directly; the others go through dBt/dCt.
        k.dBt = (r == 0 ? s.dBsum : s.dBt).data();
        k.dCt = (r == 0 ? s.dCsum : s.dCt).data();
        k.S1 = s.S1.data() + r * Np;
        k.S2 = s.S2.data() + r * Np;
        k.S3 = s.S3.data() + r * Np;
        run_bwd_kernel(k, vb, vc, fold);
        if (r > 0) {
          const size_t n = static_cast<size_t>(T * Np);
          if (vb)
            for (size_t i = 0; i < n; ++i) s.dBsum[i] += s.dBt[i];
          if (vc)
            for (size_t i = 0; i < n; ++i) s.dCsum[i] += s.dCt[i];
        }

        // du, ddelta (softplus chain), ddelta_bias partial.
        const float Dd = q.D.present() ? fload(q.D, d * q.D.s[0]) : 0.f;
        float* du_out = s.out1.data();
        float* dd_out = s.out2.data();
        float ddb = 0.f;
        for (int64_t t = 0; t < T; ++t) {
          du_out[t] = Dd * s.dy[t] + s.delta[t] * s.gsum[t];
          float dd = s.u[t] * s.gsum[t] + s.dsum[t];
          if (q.softplus && s.pre[t] <= 20.f) dd *= sigmoid(s.pre[t]);
          dd_out[t] = dd;
          ddb += dd;
        }
        ddb_part[static_cast<size_t>(row)] += ddb;
        store_row(q.itype, q.du.p, bdl_offset(q.du, b, d) + t0, T, du_out);
        store_row(q.itype, q.ddelta.p, bdl_offset(q.ddelta, b, d) + t0, T, dd_out);
      }

      // Variable dB/dC: add the block's chunk sums into the group accumulator, in block order.
      if (vb || vc) {
        std::atomic<int64_t>& my_turn = turn[static_cast<size_t>((task_b * G + g) * ncmax + c)];
        while (my_turn.load(std::memory_order_acquire) != kb) {
          if (abort.load(std::memory_order_relaxed)) throw Aborted{};
          std::this_thread::yield();
        }
        const size_t base = static_cast<size_t>(acc_row * G + g) * acc_len + static_cast<size_t>((acc_t0 + t0) * Np);
        const size_t n = static_cast<size_t>(T * Np);
        if (vb)
          for (size_t i = 0; i < n; ++i) accB[base + i] += s.dBsum[i];
        if (vc)
          for (size_t i = 0; i < n; ++i) accC[base + i] += s.dCsum[i];
        my_turn.store(kb + 1, std::memory_order_release);
      }
    }

    for (int64_t r = 0; r < nr; ++r) {
      const int64_t d = d0 + r, row = task_b * D + d;
      const W* carry = s.carry.data() + r * Np;  // ā_0 dh_0: the gradient of h0
      if (q.dh0.present())  // 0 for a sequence that started from zero rather than its h0 row
        for (int64_t n = 0; n < N; ++n)
          wstore(q.dh0, b * q.dh0.s[0] + d * q.dh0.s[1] + n * q.dh0.s[2], seq.from_state ? carry[n] : W{});
      // Constant dB/dC of this row (see BwdChunkT for S1..S3).
      const W* S1 = s.S1.data() + r * Np;
      const W* S2 = s.S2.data() + r * Np;
      const W* S3 = s.S3.data() + r * Np;
      const ChannelConsts<W>& cc = s.consts[static_cast<size_t>(r)];
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = static_cast<size_t>(row * Np + n);
        if (!vb) {
          if (!fold) dB_part[i] = S3[n];
          else if (vc) dB_part[i] = S2[n];
          else dB_part[i] = S1[n] * conj(wload<W>(q.C, d * q.C.s[0] + n * q.C.s[1]));
        }
        if (!vc) dC_part[i] = S1[n] * conj(cc.Cs[n]);
      }
    }
  };
  if (Status st = run_tasks(ntasks, nthreads, body, &abort); st != SELSCAN_STATUS_SUCCESS) return st;

  // Batch reductions in batch order.
  for (int64_t d = 0; d < D; ++d) {
    float sD = 0.f, sb = 0.f;
    for (int64_t b = 0; b < Bt; ++b) {
      sD += dD_part[static_cast<size_t>(b * D + d)];
      sb += ddb_part[static_cast<size_t>(b * D + d)];
    }
    if (p.dD.present()) static_cast<float*>(p.dD.p)[d * p.dD.s[0]] = sD;
    if (p.ddelta_bias.present()) static_cast<float*>(p.ddelta_bias.p)[d * p.ddelta_bias.s[0]] = sb;
    for (int64_t n = 0; n < N; ++n) {
      W a{}, sb_{}, sc{};
      for (int64_t b = 0; b < Bt; ++b) {
        const size_t i = static_cast<size_t>((b * D + d) * Np + n);
        a += dA_part[i];
        if (!vb) sb_ += dB_part[i];
        if (!vc) sc += dC_part[i];
      }
      wstore(p.dA, d * p.dA.s[0] + n * p.dA.s[1], a);
      if (!vb) wstore(p.dB, d * p.dB.s[0] + n * p.dB.s[1], sb_);
      if (!vc) wstore(p.dC, d * p.dC.s[0] + n * p.dC.s[1], sc);
    }
  }

  // Variable dB/dC: [L][Np] accumulators -> (Bt, G, N, L or 2L) itype, rounded once.
  if (vb || vc) {
    const int64_t wl = p.is_complex ? 2 * Ltot : Ltot;
    const int nt = resolve_threads(num_threads, R * G, R * G * N * Ltot);
    std::vector<std::vector<float>> rows(static_cast<size_t>(nt));
    auto convert = [&](int64_t task, int worker) {
      std::vector<float>& r = rows[static_cast<size_t>(worker)];
      r.resize(static_cast<size_t>(wl));
      const int64_t b = task / G, g = task % G;
      for (int which = 0; which < 2; ++which) {
        if (which == 0 ? !vb : !vc) continue;
        const View& v = which == 0 ? p.dB : p.dC;
        const W* acc = (which == 0 ? accB : accC).data() + static_cast<size_t>(task) * acc_len;
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t t = 0; t < Ltot; ++t) {
            if constexpr (sizeof(W) == sizeof(float)) {
              r[static_cast<size_t>(t)] = reinterpret_cast<const float*>(acc)[t * Np + n];
            } else {
              const float* c = reinterpret_cast<const float*>(acc + t * Np + n);
              r[static_cast<size_t>(2 * t)] = c[0];
              r[static_cast<size_t>(2 * t + 1)] = c[1];
            }
          }
          store_row(p.itype, v.p, b * v.s[0] + g * v.s[1] + n * v.s[2], wl, r.data());
        }
      }
    };
    if (Status st = run_tasks(R * G, nt, convert); st != SELSCAN_STATUS_SUCCESS) return st;
  }
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace

Status bwd(const Problem& p, int num_threads) {
  try {
    return p.is_complex ? bwd_impl<cfloat>(p, num_threads) : bwd_impl<float>(p, num_threads);
  } catch (const std::bad_alloc&) {
    return fail(SELSCAN_STATUS_OUT_OF_MEMORY, "CPU backward: out of host memory for scratch buffers");
  } catch (...) {
    return fail(SELSCAN_STATUS_INTERNAL, "CPU backward: internal error");
  }
}

}  // namespace selscan::cpu
