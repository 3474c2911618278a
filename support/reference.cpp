#include "support/reference.h"

#include "support/rng.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

namespace selscan_support {

namespace {

double softplus(double v) { return v <= 20.0 ? std::log1p(std::exp(v)) : v; }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// δ_t for one row, and the pre-softplus value.
void row_delta(const RefProblem& p, int64_t b, int64_t d, std::vector<double>& dt, std::vector<double>& pre) {
  dt.resize(static_cast<size_t>(p.L));
  pre.resize(static_cast<size_t>(p.L));
  for (int64_t t = 0; t < p.L; ++t) {
    const double v = p.delta[p.bdl(b, d, t)] + (p.has_bias ? p.bias[d] : 0.0);
    pre[t] = v;
    dt[t] = p.softplus ? softplus(v) : v;
  }
}

cd b_at(const RefProblem& p, int64_t b, int64_t d, int64_t n, int64_t t) {
  return p.var_B ? p.B[p.bgnl(b, p.group(d), n, t)] : p.B[p.dn(d, n)];
}
cd c_at(const RefProblem& p, int64_t b, int64_t d, int64_t n, int64_t t) {
  return p.var_C ? p.C[p.bgnl(b, p.group(d), n, t)] : p.C[p.dn(d, n)];
}

// Runs fn(worker, d0, d1) over `threads` contiguous channel ranges (inline when threads <= 1). Everything the
// recurrences write belongs to one channel, except the sums over a group's channels (GroupSums).
void for_channel_ranges(int64_t D, int threads, const std::function<void(int, int64_t, int64_t)>& fn) {
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, D)));
  std::vector<std::thread> pool;
  for (int i = 1; i < nt; ++i) pool.emplace_back(fn, i, D * i / nt, D * (i + 1) / nt);
  fn(0, 0, D / nt);
  for (std::thread& t : pool) t.join();
}

// Where the backward's sums over a group's channels go (variable dB, dC and their scales; the constant ones
// belong to one channel and go to the result directly). Worker 0 adds into the result itself, every other worker
// into zeroed copies of its own, added in worker order afterwards: the result depends only on the thread count.
struct GroupSums {
  std::vector<cd>& dB;
  std::vector<cd>& dC;
  std::vector<double>& cond_dB;
  std::vector<double>& cond_dC;
};


// The condition scales of the reduced gradients: what state (b, d, n) adds to them (RefBwd::cond_*,
// docs/numerics.md, "Conditioning-aware tolerance of the reduced gradients"), in units of u.
//
// Error model (as RefFwd's M): every step computes ā_t with relative error <= (1 + |δ_t A|) u and every
// product and sum with relative error <= u. Then the forward state's error obeys e_h(t) = ā_t e_h(t-1) + ε_h(t)
// with |ε_h(t)| <= βh(t) u, βh(t) = (1 + |δ_t A|) |ā_t h(t-1)| + |b̄_t|, and the state gradient's (dh(t) =
// κ dy_t conj(C_t) + conj(ā_{t+1}) dh(t+1)) obeys e_g(t) = conj(ā_{t+1}) e_g(t+1) + ε_g(t) with
// βg(t) = (1 + |δ_{t+1} A|) |ā_{t+1} dh(t+1)| + |κ dy_t C_t|.
//
// A reduced gradient R = Σ_t T_t gets:
//  * Σ_t |T_t| (its products' and its sum's roundings), times (1 + |δ_t A|) where T_t holds ā_t;
//  * from the recurrences, R's first-order error Σ_t (α_t e_g(t) + γ_t conj(e_h(t))) = Σ_s (W_s ε_g(s) +
//    Z_s conj(ε_h(s))), at most Σ_s (βg(s) |W_s| + βh(s) |Z_s|) u whatever the signs of the step errors. The
//    adjoints W_s = α_s + conj(ā_s) W_{s-1} and Z_s = γ_s + conj(ā_{s+1}) Z_{s+1} keep the signs of the
//    terms, so terms of opposite sign that share one state error do not add up their bounds.
// A variable dB/dC element holds one term per channel: |T| + |∂T/∂dh| Mg(t) (or |∂T/∂h| Mh(t)), where the
// running bounds Mh(t) = |ā_t| Mh(t-1) + βh(t) and Mg(t) = |ā_{t+1}| Mg(t+1) + βg(t) are the adjoint bound of
// a single term. Batches, channels and states carry independent errors: their bounds add.
// The per-step gradients du_t and ddelta_t take this state's terms at step t the same way (|T| + |∂T/∂dh| Mg(t)
// + |∂T/∂h(t-1)| Mh(t-1), with the ddelta factor of dh shared with ddelta_bias's), and dh0 = conj(ā_0) dh_0
// the bound of the reverse scan one step further (RefBwd::cond_du, cond_ddelta, cond_dh0).
void add_cond(const RefProblem& p, int64_t b, int64_t d, int64_t n, const std::vector<double>& dt,
              const std::vector<double>& dy, const std::vector<double>& sp, const std::vector<cd>& hist,
              const std::vector<cd>& dh, RefBwd& g, GroupSums& v) {
  const int64_t L = p.L;
  const double kappa = p.cplx ? 2.0 : 1.0;
  const cd A = p.A[p.dn(d, n)];
  std::vector<cd> av(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) av[t] = std::exp(dt[t] * A);
  auto abar = [&](int64_t t) { return av[t]; };
  auto ea = [&](int64_t t) { return 1.0 + std::abs(dt[t] * A); };
  auto u = [&](int64_t t) { return p.u[p.bdl(b, d, t)]; };
  auto beta_h = [&](int64_t t) {
    return ea(t) * std::abs(abar(t) * hist[t]) + std::abs(b_at(p, b, d, n, t) * (dt[t] * u(t)));
  };
  auto beta_g = [&](int64_t t) {
    const double c = std::abs(kappa * dy[t] * c_at(p, b, d, n, t));
    return t + 1 < L ? c + ea(t + 1) * std::abs(abar(t + 1) * dh[t + 1]) : c;
  };
  const size_t dn = static_cast<size_t>(p.dn(d, n));
  double cA = 0.0, cB = 0.0, cC = 0.0, cbias = 0.0;  // the constant-B/C, dA and ddelta_bias scales

  // The factor of dh(t) in ddelta_t (before the softplus factor sp): u conj(B) + conj(A ā) conj(h(t-1)).
  auto alpha_delta = [&](int64_t t) {
    return u(t) * std::conj(b_at(p, b, d, n, t)) + std::conj(A * abar(t)) * std::conj(hist[t]);
  };
  // Forward in time: the local terms, the forward running bound Mh (variable dC; mh[t] = Mh(t-1) for the
  // per-step gradients), the adjoints W of the state gradient's errors (α: dA conj(δ ā) conj(h(t-1)); constant
  // dB δ u; ddelta_bias sp alpha_delta, the factor of dh(t) in each term).
  double Mh = 0.0;
  std::vector<double> mh(static_cast<size_t>(L));
  cd WA = 0.0, WB = 0.0, Wd = 0.0;
  for (int64_t t = 0; t < L; ++t) {
    const cd a = abar(t), Bt = b_at(p, b, d, n, t), hm = hist[t];
    mh[t] = Mh;
    Mh = std::abs(a) * Mh + beta_h(t);
    const double bg = beta_g(t);
    const cd ca = std::conj(a);
    WA = ca * WA + std::conj(dt[t] * a) * std::conj(hm);
    WB = ca * WB + dt[t] * u(t);
    Wd = ca * Wd + sp[t] * alpha_delta(t);
    cA += ea(t) * std::abs(dt[t] * a * dh[t] * hm) + bg * std::abs(WA);
    const double tB = std::abs(dh[t] * (dt[t] * u(t)));
    if (p.var_B) v.cond_dB[static_cast<size_t>(p.bgnl(b, p.group(d), n, t))] += tB;  // + |δ u| Mg below
    else cB += tB + bg * std::abs(WB);
    const double tC = kappa * std::abs(dy[t]) * std::abs(hist[t + 1]);
    if (p.var_C) v.cond_dC[static_cast<size_t>(p.bgnl(b, p.group(d), n, t))] += tC + kappa * std::abs(dy[t]) * Mh;
    else cC += tC;
    cbias += sp[t] * (std::abs(u(t) * dh[t] * Bt) + ea(t) * std::abs(A * a * dh[t] * hm)) + bg * std::abs(Wd);
  }
  // Backward in time: the backward running bound Mg (variable dB) and the adjoints Z of the forward state's
  // errors (γ, the factor of conj(h(s)) in each term: dA conj(δ ā_{s+1}) dh(s+1) and ddelta_bias
  // sp conj(A ā_{s+1}) dh(s+1) through h(s) = hist[s+1] at step s+1; constant dC κ dy_s at step s).
  double Mg = 0.0;
  cd ZA = 0.0, ZC = 0.0, Zd = 0.0;
  for (int64_t s = L - 1; s >= 0; --s) {
    Mg = (s + 1 < L ? std::abs(abar(s + 1)) * Mg : 0.0) + beta_g(s);
    if (p.var_B) v.cond_dB[static_cast<size_t>(p.bgnl(b, p.group(d), n, s))] += std::abs(dt[s] * u(s)) * Mg;
    {  // du_s += Re(dh conj(B)) δ; ddelta_s += sp (Re(dh conj(B)) u + Re(conj(A ā) dh conj(h(s-1)))).
      const size_t i = static_cast<size_t>(p.bdl(b, d, s));
      const cd Bs = b_at(p, b, d, n, s), Aa = A * abar(s);
      g.cond_du[i] += std::abs(dt[s] * Bs) * (std::abs(dh[s]) + Mg);
      g.cond_ddelta[i] += sp[s] * (std::abs(u(s) * Bs * dh[s]) + ea(s) * std::abs(Aa * dh[s] * hist[s]) +
                                   std::abs(alpha_delta(s)) * Mg + std::abs(Aa * dh[s]) * mh[s]);
    }
    if (s + 1 < L) {
      const cd a1 = abar(s + 1), ca1 = std::conj(a1);
      ZA = ca1 * ZA + std::conj(dt[s + 1] * a1) * dh[s + 1];
      Zd = ca1 * Zd + sp[s + 1] * std::conj(A * a1) * dh[s + 1];
      ZC = ca1 * ZC + kappa * dy[s];
    } else {
      ZC = kappa * dy[s];
    }
    const double bh = beta_h(s);
    cA += bh * std::abs(ZA);
    cC += bh * std::abs(ZC);
    cbias += bh * std::abs(Zd);
  }
  // dh0 = conj(ā_0) dh(0): the reverse scan's bound one step further (Mg(-1) with no output term).
  if (p.has_h0)
    g.cond_dh0[static_cast<size_t>(p.bdn(b, d, n))] = std::abs(abar(0)) * Mg + ea(0) * std::abs(abar(0) * dh[0]);
  g.cond_dA[dn] += cA;
  if (!p.var_B) g.cond_dB[dn] += cB;
  if (!p.var_C) g.cond_dC[dn] += cC;
  g.cond_dbias[static_cast<size_t>(d)] += cbias;
}

}  // namespace

RefFwd ref_forward(const RefProblem& p, bool with_cond, int threads) {
  RefFwd r;
  const int64_t nc = p.nchunks();
  const double kappa = p.cplx ? 2.0 : 1.0;
  r.y.assign(static_cast<size_t>(p.Bt * p.D * p.L), 0.0);
  if (p.has_z) r.out_z.assign(r.y.size(), 0.0);
  if (with_cond) r.cond_y.assign(r.y.size(), 0.0);
  if (with_cond && p.has_z) r.cond_out_z.assign(r.y.size(), 0.0);
  r.last_state.assign(static_cast<size_t>(p.Bt * p.D * p.N), 0.0);
  r.xP.assign(static_cast<size_t>(p.Bt * p.D * nc * p.N), 0.0);
  r.xH.assign(r.xP.size(), 0.0);
  if (with_cond) {
    r.cond_xP.assign(r.xP.size(), 0.0);
    r.cond_xH.assign(r.xP.size(), 0.0);
    r.cond_last_state.assign(r.last_state.size(), 0.0);
  }
  for_channel_ranges(p.D, threads, [&](int, int64_t d0, int64_t d1) {
    std::vector<double> dt, pre;
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t b = 0; b < p.Bt; ++b) {
        row_delta(p, b, d, dt, pre);
        const double Dd = p.has_D ? p.Dv[d] : 0.0;
        for (int64_t t = 0; t < p.L; ++t) r.y[p.bdl(b, d, t)] = Dd * p.u[p.bdl(b, d, t)];
        if (with_cond)
          for (int64_t t = 0; t < p.L; ++t) r.cond_y[p.bdl(b, d, t)] = std::abs(Dd * p.u[p.bdl(b, d, t)]);
        for (int64_t n = 0; n < p.N; ++n) {
          cd h = p.has_h0 ? p.h0[p.bdn(b, d, n)] : cd(0.0);
          cd P = 1.0;
          // Running first-order error bound of h in units of u (Wilkinson's running error analysis): if step t
          // computes ā_t with relative error <= (1 + |δ_t A|) u (exp2/sincos, and δ_t's own rounding scaled by
          // d ā / d δ = A ā) and b̄_t, the product and the sum each with relative error <= u, then
          // |h_fp32(t) - h(t)| <= M(t) u with M(t) = |ā_t| M(t-1) + (1 + |δ_t A|) |ā_t h(t-1)| + |b̄_t|, M(-1) = 0.
          // Slowly decaying states accumulate M over their whole memory (M ~ t |h| when |ā| ~ 1).
          // The chunk states and the last state take their bounds from M; P (a product of t + 1 factors ā)
          // from S = Σ |δ_t A| (RefFwd::cond_xP).
          double M = 0.0, S = 0.0;
          for (int64_t t = 0; t < p.L; ++t) {
            const cd a = std::exp(dt[t] * p.A[p.dn(d, n)]);
            const cd bb = b_at(p, b, d, n, t) * (dt[t] * p.u[p.bdl(b, d, t)]);
            if (with_cond) {
              const double aa = std::abs(a);
              M = aa * M + (1.0 + std::abs(dt[t] * p.A[p.dn(d, n)])) * aa * std::abs(h) + std::abs(bb);
              S += std::abs(dt[t] * p.A[p.dn(d, n)]);
              r.cond_y[p.bdl(b, d, t)] += kappa * std::abs(c_at(p, b, d, n, t)) * M;
            }
            h = a * h + bb;
            P *= a;
            r.y[p.bdl(b, d, t)] += kappa * (h * c_at(p, b, d, n, t)).real();
            if ((t + 1) % 2048 == 0 || t + 1 == p.L) {
              const int64_t c = t / 2048, i = ((b * p.D + d) * nc + c) * p.N + n;
              r.xP[i] = P;
              r.xH[i] = p.fold_B() ? h / p.B[p.dn(d, n)] : h;
              if (with_cond) {
                r.cond_xP[i] = std::abs(P) * static_cast<double>(t + 2) * (2.0 + S);
                r.cond_xH[i] = p.fold_B() ? M / std::abs(p.B[p.dn(d, n)]) : M;
              }
            }
          }
          r.last_state[p.bdn(b, d, n)] = h;
          if (with_cond) r.cond_last_state[p.bdn(b, d, n)] = M + (p.fold_B() ? std::abs(h) : 0.0);
        }
        if (p.has_z)
          for (int64_t t = 0; t < p.L; ++t) {
            const double zt = p.z[p.bdl(b, d, t)];
            r.out_z[p.bdl(b, d, t)] = r.y[p.bdl(b, d, t)] * zt * sigmoid(zt);
            if (with_cond) r.cond_out_z[p.bdl(b, d, t)] = r.cond_y[p.bdl(b, d, t)] * std::abs(zt * sigmoid(zt));
          }
      }
  });
  return r;
}

RefBwd ref_backward(const RefProblem& p, const std::vector<double>& dout, bool with_cond, int threads) {
  const RefFwd f = ref_forward(p, with_cond, threads);  // with_cond: cond_y for dz
  const double kappa = p.cplx ? 2.0 : 1.0;
  RefBwd g;
  const size_t bdl = static_cast<size_t>(p.Bt * p.D * p.L);
  g.du.assign(bdl, 0.0);
  g.ddelta.assign(bdl, 0.0);
  if (p.has_z) g.dz.assign(bdl, 0.0);
  g.dA.assign(static_cast<size_t>(p.D * p.N), 0.0);
  g.dB.assign(p.B.size(), 0.0);
  g.dC.assign(p.C.size(), 0.0);
  g.dD.assign(static_cast<size_t>(p.D), 0.0);
  g.dbias.assign(static_cast<size_t>(p.D), 0.0);
  g.dh0.assign(static_cast<size_t>(p.Bt * p.D * p.N), 0.0);
  if (with_cond) {
    g.cond_dA.assign(g.dA.size(), 0.0);
    g.cond_dB.assign(g.dB.size(), 0.0);
    g.cond_dC.assign(g.dC.size(), 0.0);
    g.cond_dD.assign(g.dD.size(), 0.0);
    g.cond_dbias.assign(g.dbias.size(), 0.0);
    g.cond_du.assign(bdl, 0.0);
    g.cond_ddelta.assign(bdl, 0.0);
    if (p.has_z) g.cond_dz.assign(bdl, 0.0);
    g.cond_dh0.assign(g.dh0.size(), 0.0);
  }

  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, p.D)));
  std::vector<RefBwd> part(static_cast<size_t>(nt));  // workers 1..: their sums over a group's channels
  for (int w = 1; w < nt; ++w) {
    RefBwd& q = part[static_cast<size_t>(w)];
    if (p.var_B) q.dB.assign(g.dB.size(), 0.0), q.cond_dB.assign(g.cond_dB.size(), 0.0);
    if (p.var_C) q.dC.assign(g.dC.size(), 0.0), q.cond_dC.assign(g.cond_dC.size(), 0.0);
  }
  for_channel_ranges(p.D, nt, [&](int worker, int64_t d0, int64_t d1) {
    RefBwd& q = worker == 0 ? g : part[static_cast<size_t>(worker)];
    GroupSums v{q.dB, q.dC, q.cond_dB, q.cond_dC};
    std::vector<double> dt, pre, dy(static_cast<size_t>(p.L)), sp(static_cast<size_t>(p.L));
    std::vector<cd> hist(static_cast<size_t>(p.L + 1));  // hist[t+1] = h_t, hist[0] = h_{-1}
    std::vector<cd> dhs(with_cond ? static_cast<size_t>(p.L) : 0);  // with_cond: dh_t
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t b = 0; b < p.Bt; ++b) {
        row_delta(p, b, d, dt, pre);
        for (int64_t t = 0; t < p.L; ++t) sp[t] = p.softplus ? (pre[t] <= 20.0 ? sigmoid(pre[t]) : 1.0) : 1.0;
        // Gate: out_z = y z sigmoid(z).
        for (int64_t t = 0; t < p.L; ++t) {
          const int64_t i = p.bdl(b, d, t);
          if (p.has_z) {
            const double zt = p.z[i], s = sigmoid(zt);
            dy[t] = dout[i] * zt * s;
            g.dz[i] = dout[i] * f.y[i] * s * (1.0 + zt * (1.0 - s));
            // dz = dout out σ (1 + z (1 - σ)) from the saved out: out's error times |∂dz/∂out|, and about ten
            // roundings (σ's three, the gate's, the products and out's own), each within |dout σ y| (1 + |z|).
            if (with_cond)
              g.cond_dz[i] = std::abs(dout[i] * s) * (std::abs(1.0 + zt * (1.0 - s)) * f.cond_y[i] +
                                                      10.0 * (1.0 + std::abs(zt)) * std::abs(f.y[i]));
          } else {
            dy[t] = dout[i];
          }
        }
        const double Dd = p.has_D ? p.Dv[d] : 0.0;
        for (int64_t t = 0; t < p.L; ++t) {
          const int64_t i = p.bdl(b, d, t);
          g.du[i] += Dd * dy[t];
          g.dD[d] += dy[t] * p.u[i];
          if (with_cond) g.cond_dD[d] += std::abs(dy[t] * p.u[i]), g.cond_du[i] += std::abs(Dd * dy[t]);
        }
        for (int64_t n = 0; n < p.N; ++n) {
          const cd A = p.A[p.dn(d, n)];
          hist[0] = p.has_h0 ? p.h0[p.bdn(b, d, n)] : cd(0.0);
          for (int64_t t = 0; t < p.L; ++t)
            hist[t + 1] = std::exp(dt[t] * A) * hist[t] + b_at(p, b, d, n, t) * (dt[t] * p.u[p.bdl(b, d, t)]);
          cd carry = 0.0;  // conj(ā_{t+1}) dh_{t+1}
          for (int64_t t = p.L - 1; t >= 0; --t) {
            const int64_t i = p.bdl(b, d, t);
            const cd a = std::exp(dt[t] * A);
            const cd Bt = b_at(p, b, d, n, t), Ct = c_at(p, b, d, n, t);
            const cd dh = kappa * dy[t] * std::conj(Ct) + carry;  // total gradient w.r.t. h_t
            if (with_cond) dhs[t] = dh;
            const double g_du = (dh * std::conj(Bt)).real();    // w.r.t. the real δ_t u_t
            g.du[i] += g_du * dt[t];
            g.ddelta[i] += g_du * p.u[i];
            const cd g_a = dh * std::conj(hist[t]);  // w.r.t. ā_t
            g.dA[p.dn(d, n)] += std::conj(dt[t] * a) * g_a;
            g.ddelta[i] += (std::conj(A * a) * g_a).real();
            const cd g_B = dh * (dt[t] * p.u[i]);
            const cd g_C = kappa * dy[t] * std::conj(hist[t + 1]);
            if (p.var_B) v.dB[p.bgnl(b, p.group(d), n, t)] += g_B;
            else g.dB[p.dn(d, n)] += g_B;
            if (p.var_C) v.dC[p.bgnl(b, p.group(d), n, t)] += g_C;
            else g.dC[p.dn(d, n)] += g_C;
            carry = std::conj(a) * dh;
          }
          g.dh0[p.bdn(b, d, n)] = carry;
          if (with_cond) add_cond(p, b, d, n, dt, dy, sp, hist, dhs, g, v);
        }
        for (int64_t t = 0; t < p.L; ++t) {
          const int64_t i = p.bdl(b, d, t);
          if (p.softplus) g.ddelta[i] *= sp[t];
          g.dbias[d] += g.ddelta[i];
        }
      }
  });
  for (int w = 1; w < nt; ++w) {
    const RefBwd& q = part[static_cast<size_t>(w)];
    auto add = [](auto& to, const auto& from) {
      for (size_t k = 0; k < from.size(); ++k) to[k] += from[k];
    };
    add(g.dB, q.dB), add(g.dC, q.dC), add(g.cond_dB, q.cond_dB), add(g.cond_dC, q.cond_dC);
  }
  return g;
}

RefProblem restrict_problem(const RefProblem& p, const std::vector<int64_t>& ch, const std::vector<int64_t>& st) {
  RefProblem r = p;
  const int64_t K = static_cast<int64_t>(ch.size()), S = static_cast<int64_t>(st.size());
  r.D = K, r.N = S, r.G = 1;
  const bool var = p.var_B || p.var_C;
  const int64_t grp = var && K > 0 ? p.group(ch[0]) : 0;
  r.u = restrict_bdl(p, p.u, ch);
  r.delta = restrict_bdl(p, p.delta, ch);
  if (p.has_z) r.z = restrict_bdl(p, p.z, ch);
  r.A.assign(static_cast<size_t>(K * S), 0.0);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < S; ++j) r.A[r.dn(i, j)] = p.A[p.dn(ch[i], st[j])];
  auto bc = [&](bool v, const std::vector<cd>& src, std::vector<cd>& dst) {
    if (!v) {
      dst.assign(static_cast<size_t>(K * S), 0.0);
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < S; ++j) dst[r.dn(i, j)] = src[p.dn(ch[i], st[j])];
      return;
    }
    dst.assign(static_cast<size_t>(p.Bt * S * p.L), 0.0);
    for (int64_t b = 0; b < p.Bt; ++b)
      for (int64_t j = 0; j < S; ++j)
        for (int64_t t = 0; t < p.L; ++t) dst[r.bgnl(b, 0, j, t)] = src[p.bgnl(b, grp, st[j], t)];
  };
  bc(p.var_B, p.B, r.B);
  bc(p.var_C, p.C, r.C);
  if (p.has_D) {
    r.Dv.clear();
    for (int64_t d : ch) r.Dv.push_back(p.Dv[d]);
  }
  if (p.has_bias) {
    r.bias.clear();
    for (int64_t d : ch) r.bias.push_back(p.bias[d]);
  }
  if (p.has_h0) {
    r.h0.assign(static_cast<size_t>(p.Bt * K * S), 0.0);
    for (int64_t b = 0; b < p.Bt; ++b)
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < S; ++j) r.h0[r.bdn(b, i, j)] = p.h0[p.bdn(b, ch[i], st[j])];
  }
  return r;
}

std::vector<double> restrict_bdl(const RefProblem& p, const std::vector<double>& v, const std::vector<int64_t>& ch) {
  std::vector<double> r;
  r.reserve(static_cast<size_t>(p.Bt) * ch.size() * static_cast<size_t>(p.L));
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d : ch)
      for (int64_t t = 0; t < p.L; ++t) r.push_back(v[p.bdl(b, d, t)]);
  return r;
}

double ref_loss(const RefProblem& p, const std::vector<double>& dout) {
  const RefFwd f = ref_forward(p);
  const std::vector<double>& o = p.has_z ? f.out_z : f.y;
  double s = 0.0;
  for (size_t i = 0; i < o.size(); ++i) s += dout[i] * o[i];
  return s;
}

double ref_gradient_check(const RefProblem& p, const std::vector<double>& dout, int directions, uint64_t seed) {
  const RefBwd g = ref_backward(p, dout);
  // Step: the central difference's truncation error (~eps^2) and its rounding error (~2^-52 / eps, relative)
  // both stay near 1e-10 here.
  const double eps = 1e-6;
  Rng rng(seed);
  double worst = 0.0;
  for (int k = 0; k < directions; ++k) {
    RefProblem plus = p, minus = p;
    double analytic = 0.0;  // the directional derivative from the reverse mode
    auto reals = [&](std::vector<double> RefProblem::*x, const std::vector<double>& grad) {
      for (size_t i = 0; i < (p.*x).size(); ++i) {
        const double v = rng.normal();
        (plus.*x)[i] += eps * v;
        (minus.*x)[i] -= eps * v;
        analytic += grad[i] * v;
      }
    };
    // Complex values move in both parts when the weights are complex (PyTorch's convention for the gradient:
    // dL/dRe + i dL/dIm); real weights keep imaginary part 0.
    auto complexes = [&](std::vector<cd> RefProblem::*x, const std::vector<cd>& grad) {
      for (size_t i = 0; i < (p.*x).size(); ++i) {
        const cd v(rng.normal(), p.cplx ? rng.normal() : 0.0);
        (plus.*x)[i] += eps * v;
        (minus.*x)[i] -= eps * v;
        analytic += grad[i].real() * v.real() + grad[i].imag() * v.imag();
      }
    };
    reals(&RefProblem::u, g.du);
    reals(&RefProblem::delta, g.ddelta);
    complexes(&RefProblem::A, g.dA);
    complexes(&RefProblem::B, g.dB);
    complexes(&RefProblem::C, g.dC);
    if (p.has_D) reals(&RefProblem::Dv, g.dD);
    if (p.has_z) reals(&RefProblem::z, g.dz);
    if (p.has_bias) reals(&RefProblem::bias, g.dbias);
    if (p.has_h0) complexes(&RefProblem::h0, g.dh0);
    const double fd = (ref_loss(plus, dout) - ref_loss(minus, dout)) / (2.0 * eps);
    worst = std::max(worst, std::fabs(fd - analytic) / std::max({std::fabs(fd), std::fabs(analytic), 1e-300}));
  }
  return worst;
}

namespace {
// Chunk states in the x tensor's layout, (Bt, D, nc, N) with P and H interleaved: ref_x_values and ref_x_cond
// lay out the states and their condition scales alike.
template <class T>
std::vector<T> x_layout(const RefProblem& p, const std::vector<T>& P, const std::vector<T>& H) {
  const int64_t nc = p.nchunks();
  std::vector<T> x;
  x.reserve(static_cast<size_t>(p.Bt * p.D * nc * 2 * p.N));
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d = 0; d < p.D; ++d)
      for (int64_t k = 0; k < nc; ++k)
        for (int64_t n = 0; n < p.N; ++n) {
          const size_t i = static_cast<size_t>(((b * p.D + d) * nc + k) * p.N + n);
          x.push_back(P[i]);
          x.push_back(H[i]);
        }
  return x;
}
}  // namespace

std::vector<double> ref_x_values(const RefFwd& f, const RefProblem& p) {
  return flatten(x_layout(p, f.xP, f.xH), p.cplx);
}

std::vector<double> ref_x_cond(const RefFwd& f, const RefProblem& p) {
  return flatten_cond(x_layout(p, f.cond_xP, f.cond_xH), p.cplx);
}

std::vector<double> flatten_cond(const std::vector<double>& v, bool cplx) {
  if (!cplx) return v;
  std::vector<double> r;
  r.reserve(2 * v.size());
  for (double x : v) r.insert(r.end(), 2, x);
  return r;
}

std::vector<double> flatten(const std::vector<cd>& v, bool cplx) {
  std::vector<double> r;
  r.reserve(v.size() * (cplx ? 2 : 1));
  for (const cd& x : v) {
    r.push_back(x.real());
    if (cplx) r.push_back(x.imag());
  }
  return r;
}

}  // namespace selscan_support
