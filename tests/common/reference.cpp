#include "reference.h"

#include <cmath>

namespace selscan_test {

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

}  // namespace

RefFwd ref_forward(const RefProblem& p, bool with_cond) {
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
  std::vector<double> dt, pre;
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d = 0; d < p.D; ++d) {
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
        double M = 0.0;
        for (int64_t t = 0; t < p.L; ++t) {
          const cd a = std::exp(dt[t] * p.A[p.dn(d, n)]);
          const cd bb = b_at(p, b, d, n, t) * (dt[t] * p.u[p.bdl(b, d, t)]);
          if (with_cond) {
            const double aa = std::abs(a);
            M = aa * M + (1.0 + std::abs(dt[t] * p.A[p.dn(d, n)])) * aa * std::abs(h) + std::abs(bb);
            r.cond_y[p.bdl(b, d, t)] += kappa * std::abs(c_at(p, b, d, n, t)) * M;
          }
          h = a * h + bb;
          P *= a;
          r.y[p.bdl(b, d, t)] += kappa * (h * c_at(p, b, d, n, t)).real();
          if ((t + 1) % 2048 == 0 || t + 1 == p.L) {
            const int64_t c = t / 2048, i = ((b * p.D + d) * nc + c) * p.N + n;
            r.xP[i] = P;
            r.xH[i] = p.fold_B() ? h / p.B[p.dn(d, n)] : h;
          }
        }
        r.last_state[p.bdn(b, d, n)] = h;
      }
      if (p.has_z)
        for (int64_t t = 0; t < p.L; ++t) {
          const double zt = p.z[p.bdl(b, d, t)];
          r.out_z[p.bdl(b, d, t)] = r.y[p.bdl(b, d, t)] * zt * sigmoid(zt);
          if (with_cond) r.cond_out_z[p.bdl(b, d, t)] = r.cond_y[p.bdl(b, d, t)] * std::abs(zt * sigmoid(zt));
        }
    }
  return r;
}

RefBwd ref_backward(const RefProblem& p, const std::vector<double>& dout) {
  const RefFwd f = ref_forward(p);
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

  std::vector<double> dt, pre, dy(static_cast<size_t>(p.L));
  std::vector<cd> hist(static_cast<size_t>(p.L + 1));  // hist[t+1] = h_t, hist[0] = h_{-1}
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d = 0; d < p.D; ++d) {
      row_delta(p, b, d, dt, pre);
      // Gate: out_z = y z sigmoid(z).
      for (int64_t t = 0; t < p.L; ++t) {
        const int64_t i = p.bdl(b, d, t);
        if (p.has_z) {
          const double zt = p.z[i], s = sigmoid(zt);
          dy[t] = dout[i] * zt * s;
          g.dz[i] = dout[i] * f.y[i] * s * (1.0 + zt * (1.0 - s));
        } else {
          dy[t] = dout[i];
        }
      }
      const double Dd = p.has_D ? p.Dv[d] : 0.0;
      for (int64_t t = 0; t < p.L; ++t) {
        const int64_t i = p.bdl(b, d, t);
        g.du[i] += Dd * dy[t];
        g.dD[d] += dy[t] * p.u[i];
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
          const double g_du = (dh * std::conj(Bt)).real();    // w.r.t. the real δ_t u_t
          g.du[i] += g_du * dt[t];
          g.ddelta[i] += g_du * p.u[i];
          const cd g_a = dh * std::conj(hist[t]);  // w.r.t. ā_t
          g.dA[p.dn(d, n)] += std::conj(dt[t] * a) * g_a;
          g.ddelta[i] += (std::conj(A * a) * g_a).real();
          const cd g_B = dh * (dt[t] * p.u[i]);
          const cd g_C = kappa * dy[t] * std::conj(hist[t + 1]);
          if (p.var_B) g.dB[p.bgnl(b, p.group(d), n, t)] += g_B;
          else g.dB[p.dn(d, n)] += g_B;
          if (p.var_C) g.dC[p.bgnl(b, p.group(d), n, t)] += g_C;
          else g.dC[p.dn(d, n)] += g_C;
          carry = std::conj(a) * dh;
        }
        g.dh0[p.bdn(b, d, n)] = carry;
      }
      for (int64_t t = 0; t < p.L; ++t) {
        const int64_t i = p.bdl(b, d, t);
        if (p.softplus) g.ddelta[i] *= pre[t] <= 20.0 ? sigmoid(pre[t]) : 1.0;
        g.dbias[d] += g.ddelta[i];
      }
    }
  return g;
}

double ref_loss(const RefProblem& p, const std::vector<double>& dout) {
  const RefFwd f = ref_forward(p);
  const std::vector<double>& o = p.has_z ? f.out_z : f.y;
  double s = 0.0;
  for (size_t i = 0; i < o.size(); ++i) s += dout[i] * o[i];
  return s;
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

}  // namespace selscan_test
