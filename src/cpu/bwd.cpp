// Backward on the CPU. One task per row (b, d), handed out in order. Each row recomputes its forward states
// chunk by chunk (seeded from the saved x, or recomputed when x is absent) and runs the reverse scan.
//
// Determinism, independent of the thread count: sums over batch (dA, constant dB/dC, dD, ddelta_bias) go
// through per-row partials summed in batch order afterwards; variable dB/dC (summed over the channels of a
// group) are added row by row in channel order (a row waits for its predecessor's add).
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "../problem.h"
#include "common.h"
#include "cpu.h"
#include "rows.h"

namespace selscan::cpu {
namespace {

template <class W>
struct BwdScratch {
  std::vector<float> delta, pre, u, du, dy, gsum, dsum, tmp, out1, out2;
  std::vector<W> Bt, Ct;          // variable B/C of group `cached` over the whole row: [L][Np]
  int64_t cached = -1;            // b * G + g of Bt/Ct
  std::vector<W> dBt, dCt;        // this row's variable dB/dC: [L][Np]
  std::vector<W> hs, as, seeds, carry, S1, S2, S3;
  ChannelConsts<W> consts;
};

template <class W>
void store_w(const View& v, int64_t off, W x) {
  wstore(v, off, x);
}

template <class W>
Status bwd_impl(const Problem& p, int num_threads) {
  const int64_t Bt = p.batch, D = p.dim, L = p.seqlen, N = p.dstate, G = p.groups, cpg = D / G;
  const int64_t Np = padded_states(N), nc = p.nchunks, Tc = std::min(kChunk, L);
  const bool vb = p.var_B, vc = p.var_C, fold = p.fold_B, has_z = p.z.present();
  const size_t rowsN = static_cast<size_t>(Bt * D * Np);

  // Per-row partials of the batch reductions, and the group accumulators of variable dB/dC ([L][Np]).
  std::vector<W> dA_part(rowsN), dB_part(vb ? 0 : rowsN), dC_part(vc ? 0 : rowsN);
  std::vector<float> dD_part(static_cast<size_t>(Bt * D)), ddb_part(static_cast<size_t>(Bt * D));
  const size_t acc_len = static_cast<size_t>(L * Np);
  std::vector<W> accB(vb ? static_cast<size_t>(Bt * G) * acc_len : 0);
  std::vector<W> accC(vc ? static_cast<size_t>(Bt * G) * acc_len : 0);
  std::unique_ptr<std::atomic<int64_t>[]> turn;  // per (b, g): the channel (within the group) whose add is next
  if (vb || vc) {
    turn.reset(new std::atomic<int64_t>[static_cast<size_t>(Bt * G)]);
    for (int64_t i = 0; i < Bt * G; ++i) turn[static_cast<size_t>(i)].store(0);
  }
  std::atomic<bool> abort{false};

  const int64_t ntasks = Bt * D;
  const int nthreads = resolve_threads(num_threads, ntasks);
  std::vector<std::unique_ptr<BwdScratch<W>>> scratch(static_cast<size_t>(nthreads));

  auto body = [&](int64_t task, int worker) {
    auto& sp = scratch[static_cast<size_t>(worker)];
    if (!sp) {
      sp = std::make_unique<BwdScratch<W>>();
      for (auto* v : {&sp->delta, &sp->pre, &sp->u, &sp->du, &sp->dy, &sp->gsum, &sp->dsum, &sp->out1, &sp->out2})
        v->resize(static_cast<size_t>(L));
      sp->tmp.resize(static_cast<size_t>(2 * L));
      if (vb) sp->Bt.resize(acc_len), sp->dBt.resize(acc_len);
      if (vc) sp->Ct.resize(acc_len), sp->dCt.resize(acc_len);
      sp->hs.resize(static_cast<size_t>((Tc + 1) * Np));
      sp->as.resize(static_cast<size_t>(Tc * Np));
      sp->seeds.resize(static_cast<size_t>(nc * Np));
      for (auto* v : {&sp->carry, &sp->S1, &sp->S2, &sp->S3}) v->resize(static_cast<size_t>(Np));
      sp->consts.resize(Np);
    }
    BwdScratch<W>& s = *sp;
    const int64_t b = task / D, d = task % D, g = d / cpg, row = b * D + d;
    s.consts.fill(p, d);
    const ChannelConsts<W>& cc = s.consts;

    // Row inputs over the whole sequence.
    load_delta(p, b, d, 0, L, s.delta.data(), s.pre.data());
    load_row(p.itype, p.u.p, bdl_offset(p.u, b, d), L, s.u.data());
    load_row(p.itype, p.dout.p, bdl_offset(p.dout, b, d), L, s.dy.data());
    for (int64_t t = 0; t < L; ++t) s.du[t] = s.delta[t] * s.u[t];
    if (has_z) {
      // Gate: dz from the saved (rounded) out; dy = dout * silu(z); out_z recomputed from the saved out.
      float* zr = s.out1.data();
      float* outr = s.out2.data();
      load_row(p.itype, p.z.p, bdl_offset(p.z, b, d), L, zr);
      load_row(p.itype, p.out.p, bdl_offset(p.out, b, d), L, outr);
      for (int64_t t = 0; t < L; ++t) {
        const float zt = zr[t], ot = outr[t], dout = s.dy[t];
        const float sg = sigmoid(zt), silu = zt * sg;
        zr[t] = dout * ot * sg * (1.f + zt * (1.f - sg));  // dz
        s.dy[t] = dout * silu;
        outr[t] = ot * silu;  // recomputed out_z
      }
      store_row(p.itype, p.dz.p, bdl_offset(p.dz, b, d), L, zr);
      if (p.out_z.present()) store_row(p.itype, p.out_z.p, bdl_offset(p.out_z, b, d), L, outr);
    }
    {
      float acc = 0.f;
      for (int64_t t = 0; t < L; ++t) acc += s.dy[t] * s.u[t];
      dD_part[static_cast<size_t>(row)] = acc;
    }

    // Variable B/C of this row's group (rows come in order, so consecutive rows usually share it).
    if ((vb || vc) && s.cached != b * G + g) {
      if (vb) load_bc_block(p, p.B, b, g, 0, L, Np, s.tmp.data(), s.Bt.data());
      if (vc) load_bc_block(p, p.C, b, g, 0, L, Np, s.tmp.data(), s.Ct.data());
      s.cached = b * G + g;
    }

    // Chunk seeds: the state before each chunk.
    W* seeds = s.seeds.data();
    for (int64_t n = 0; n < Np; ++n)
      seeds[n] = (n < N && p.h0.present()) ? wload<W>(p.h0, b * p.h0.s[0] + d * p.h0.s[1] + n * p.h0.s[2]) : W{};
    if (nc > 1) {
      if (p.x.present()) {
        const int64_t base = b * p.x.s[0] + d * p.x.s[1];
        for (int64_t c = 1; c < nc; ++c)
          for (int64_t n = 0; n < Np; ++n)
            seeds[c * Np + n] = n < N ? wload<W>(p.x, base + (c - 1) * p.x.s[2] + 2 * n + 1) : W{};
      } else {
        W* h = s.hs.data();  // free until the reverse pass
        std::copy(seeds, seeds + Np, h);
        for (int64_t c = 0; c + 1 < nc; ++c) {
          const int64_t t0 = c * kChunk;
          std::fill(s.gsum.begin(), s.gsum.end(), 0.f);
          FwdBlockT<W> k{kChunk,        Np,          s.delta.data() + t0, s.du.data() + t0,
                         cc.A2.data(),  cc.Bc.data(), vb ? s.Bt.data() + t0 * Np : nullptr,
                         cc.Cc.data(),  vc ? s.Ct.data() + t0 * Np : nullptr, cc.Cs.data(), h, nullptr,
                         s.gsum.data()};
          run_fwd_kernel(k, vb, vc, false);
          std::copy(h, h + Np, seeds + (c + 1) * Np);
        }
      }
    }

    W* dA = dA_part.data() + row * Np;
    std::fill(dA, dA + Np, W{});
    for (auto* v : {&s.carry, &s.S1, &s.S2, &s.S3}) std::fill(v->begin(), v->end(), W{});
    for (int64_t c = nc - 1; c >= 0; --c) {
      const int64_t t0 = c * kChunk, T = std::min(kChunk, L - t0);
      BwdChunkT<W> k{};
      k.T = T;
      k.Np = Np;
      k.delta = s.delta.data() + t0;
      k.du = s.du.data() + t0;
      k.dy = s.dy.data() + t0;
      k.A2 = cc.A2.data();
      k.A = cc.A.data();
      k.Bc = cc.Bc.data();
      k.Bt = vb ? s.Bt.data() + t0 * Np : nullptr;
      k.Cc = cc.Cc.data();
      k.Ct = vc ? s.Ct.data() + t0 * Np : nullptr;
      k.Cs = cc.Cs.data();
      k.seed = seeds + c * Np;
      k.hs = s.hs.data();
      k.as = s.as.data();
      k.carry = s.carry.data();
      k.gsum = s.gsum.data() + t0;
      k.dsum = s.dsum.data() + t0;
      k.dA = dA;
      k.dBt = vb ? s.dBt.data() + t0 * Np : nullptr;
      k.dCt = vc ? s.dCt.data() + t0 * Np : nullptr;
      k.S1 = s.S1.data();
      k.S2 = s.S2.data();
      k.S3 = s.S3.data();
      run_bwd_kernel(k, vb, vc, fold);
    }

    // du, ddelta (softplus chain), ddelta_bias partial.
    const float Dd = p.D.present() ? fload(p.D, d * p.D.s[0]) : 0.f;
    float* du_out = s.out1.data();
    float* dd_out = s.out2.data();
    float ddb = 0.f;
    for (int64_t t = 0; t < L; ++t) {
      du_out[t] = Dd * s.dy[t] + s.delta[t] * s.gsum[t];
      float dd = s.u[t] * s.gsum[t] + s.dsum[t];
      if (p.softplus && s.pre[t] <= 20.f) dd *= sigmoid(s.pre[t]);
      dd_out[t] = dd;
      ddb += dd;
    }
    ddb_part[static_cast<size_t>(row)] = ddb;
    store_row(p.itype, p.du.p, bdl_offset(p.du, b, d), L, du_out);
    store_row(p.itype, p.ddelta.p, bdl_offset(p.ddelta, b, d), L, dd_out);

    if (p.dh0.present())
      for (int64_t n = 0; n < N; ++n)
        store_w(p.dh0, b * p.dh0.s[0] + d * p.dh0.s[1] + n * p.dh0.s[2], s.carry[static_cast<size_t>(n)]);

    // Constant dB/dC of this row (see BwdChunkT for S1..S3).
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(row * Np + n);
      if (!vb) {
        if (!fold) dB_part[i] = s.S3[n];
        else if (vc) dB_part[i] = s.S2[n];
        else dB_part[i] = s.S1[n] * conj(wload<W>(p.C, d * p.C.s[0] + n * p.C.s[1]));
      }
      if (!vc) dC_part[i] = s.S1[n] * conj(cc.Cs[n]);
    }

    // Variable dB/dC: add this row into its group's accumulator, in channel order.
    if (vb || vc) {
      std::atomic<int64_t>& my_turn = turn[static_cast<size_t>(b * G + g)];
      const int64_t rank = d - g * cpg;
      while (my_turn.load(std::memory_order_acquire) != rank) {
        if (abort.load(std::memory_order_relaxed)) throw Aborted{};
        std::this_thread::yield();
      }
      const size_t base = static_cast<size_t>(b * G + g) * acc_len;
      if (vb)
        for (size_t i = 0; i < acc_len; ++i) accB[base + i] += s.dBt[i];
      if (vc)
        for (size_t i = 0; i < acc_len; ++i) accC[base + i] += s.dCt[i];
      my_turn.store(rank + 1, std::memory_order_release);
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
      W a{}, bb{}, cc{};
      for (int64_t b = 0; b < Bt; ++b) {
        const size_t i = static_cast<size_t>((b * D + d) * Np + n);
        a += dA_part[i];
        if (!vb) bb += dB_part[i];
        if (!vc) cc += dC_part[i];
      }
      store_w(p.dA, d * p.dA.s[0] + n * p.dA.s[1], a);
      if (!vb) store_w(p.dB, d * p.dB.s[0] + n * p.dB.s[1], bb);
      if (!vc) store_w(p.dC, d * p.dC.s[0] + n * p.dC.s[1], cc);
    }
  }

  // Variable dB/dC: [L][Np] accumulators -> (Bt, G, N, L or 2L) itype, rounded once.
  if (vb || vc) {
    const int64_t wl = p.is_complex ? 2 * L : L;
    const int nt = resolve_threads(num_threads, Bt * G);
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
          for (int64_t t = 0; t < L; ++t) {
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
    if (Status st = run_tasks(Bt * G, nt, convert); st != SELSCAN_STATUS_SUCCESS) return st;
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
