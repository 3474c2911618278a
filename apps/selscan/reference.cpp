#include "reference.h"

#include <algorithm>
#include <cmath>
#include <thread>

namespace selscan_cli {

namespace {

using Vec = std::vector<double>;
using Inputs = std::array<Vec, kTensorCount>;  // only the input slots are used

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Channels [d0, d1) for every batch. Writes per-row outputs directly (rows are disjoint between workers),
// per-channel reductions directly (channels are disjoint), and variable dB/dC into this worker's `dBv`/`dCv`
// (channels of one group share those rows).
void run_channels(const CaseSpec& s, const Inputs& in, Reference* ref, bool backward, int64_t d0, int64_t d1,
                  Vec* dBv, Vec* dCv) {
  const int64_t Bt = s.batch, D = s.dim, L = s.seqlen, N = s.dstate, G = s.groups, cpg = D / G;
  const int64_t nc = s.nchunks();
  const bool fold_B = !s.var_B;  // x keeps h / B[d,n] when B is constant (the ABI's chunk-state convention)
  Vec dl(static_cast<size_t>(L)), xr(dl), y(dl), gy(dl), ddl(dl), H;
  if (backward) H.resize(size_t(N * L));
  for (int64_t b = 0; b < Bt; ++b) {
    for (int64_t d = d0; d < d1; ++d) {
      const int64_t g = d / cpg, row = (b * D + d) * L;
      const double* u = &in[kU][size_t(row)];
      const double* de = &in[kDelta][size_t(row)];
      const double bias = s.has_bias ? in[kBias][size_t(d)] : 0.0;
      const double Dd = s.has_D ? in[kD][size_t(d)] : 0.0;
      for (int64_t t = 0; t < L; ++t) {
        xr[t] = de[t] + bias;
        dl[t] = (s.softplus && xr[t] <= 20.0) ? std::log1p(std::exp(xr[t])) : xr[t];
        y[t] = Dd * u[t];
      }
      for (int64_t n = 0; n < N; ++n) {
        const double a = in[kA][size_t(d * N + n)];
        const double* Bv = s.var_B ? &in[kB][size_t(((b * G + g) * N + n) * L)] : nullptr;
        const double* Cv = s.var_C ? &in[kC][size_t(((b * G + g) * N + n) * L)] : nullptr;
        const double Bc = s.var_B ? 0.0 : in[kB][size_t(d * N + n)];
        const double Cc = s.var_C ? 0.0 : in[kC][size_t(d * N + n)];
        double h = 0, P = 1;
        for (int64_t t = 0; t < L; ++t) {
          const double abar = std::exp(dl[t] * a);
          h = abar * h + (Bv ? Bv[t] : Bc) * dl[t] * u[t];
          P *= abar;
          y[t] += (Cv ? Cv[t] : Cc) * h;
          if (backward) H[size_t(n * L + t)] = h;
          if (!ref->v[kX].empty() && ((t + 1) % SELSCAN_CHUNK == 0 || t == L - 1)) {
            double* x = &ref->v[kX][size_t(((b * D + d) * nc + t / SELSCAN_CHUNK) * 2 * N + 2 * n)];
            x[0] = P;
            x[1] = fold_B ? h / Bc : h;
          }
        }
        if (!ref->v[kLast].empty()) ref->v[kLast][size_t((b * D + d) * N + n)] = h;
      }
      const double* z = s.has_z ? &in[kZ][size_t(row)] : nullptr;
      for (int64_t t = 0; t < L; ++t) {
        ref->v[kOut][size_t(row + t)] = y[t];
        if (z) ref->v[kOutZ][size_t(row + t)] = y[t] * z[t] * sigmoid(z[t]);
      }
      if (!backward) continue;

      // Backward of sum(dout * final_output).
      const double* dout = &in[kDout][size_t(row)];
      double dD = 0;
      for (int64_t t = 0; t < L; ++t) {
        if (z) {
          const double sg = sigmoid(z[t]);
          ref->v[kDz][size_t(row + t)] = dout[t] * y[t] * sg * (1.0 + z[t] * (1.0 - sg));
          gy[t] = dout[t] * z[t] * sg;
        } else {
          gy[t] = dout[t];
        }
        dD += gy[t] * u[t];
        ref->v[kDu][size_t(row + t)] = Dd * gy[t];
        ddl[t] = 0;
      }
      if (s.has_D) ref->v[kDD][size_t(d)] += dD;
      double* du = &ref->v[kDu][size_t(row)];
      for (int64_t n = 0; n < N; ++n) {
        const double a = in[kA][size_t(d * N + n)];
        const size_t vrow = size_t(((b * G + g) * N + n) * L);
        const double* Bv = s.var_B ? &in[kB][vrow] : nullptr;
        const double* Cv = s.var_C ? &in[kC][vrow] : nullptr;
        const double Bc = s.var_B ? 0.0 : in[kB][size_t(d * N + n)];
        const double Cc = s.var_C ? 0.0 : in[kC][size_t(d * N + n)];
        const double* h = &H[size_t(n * L)];
        double dh = 0, abar_next = 0, dA = 0, dBc = 0, dCc = 0;
        for (int64_t t = L - 1; t >= 0; --t) {
          const double Bt_ = Bv ? Bv[t] : Bc, Ct_ = Cv ? Cv[t] : Cc;
          dh = gy[t] * Ct_ + abar_next * dh;  // dL/dh_t
          const double abar = std::exp(dl[t] * a), hprev = t > 0 ? h[t - 1] : 0.0;
          du[t] += dh * Bt_ * dl[t];
          ddl[t] += dh * (a * abar * hprev + Bt_ * u[t]);
          dA += dh * dl[t] * abar * hprev;
          const double gB = dh * dl[t] * u[t], gC = gy[t] * h[t];
          if (Bv) (*dBv)[vrow + size_t(t)] += gB;
          else dBc += gB;
          if (Cv) (*dCv)[vrow + size_t(t)] += gC;
          else dCc += gC;
          abar_next = abar;
        }
        ref->v[kDA][size_t(d * N + n)] += dA;
        if (!Bv) ref->v[kDB][size_t(d * N + n)] += dBc;
        if (!Cv) ref->v[kDC][size_t(d * N + n)] += dCc;
      }
      double dbias = 0;
      for (int64_t t = 0; t < L; ++t) {
        const double gd = s.softplus && xr[t] <= 20.0 ? ddl[t] * sigmoid(xr[t]) : ddl[t];
        ref->v[kDdelta][size_t(row + t)] = gd;
        dbias += gd;
      }
      if (s.has_bias) ref->v[kDbias][size_t(d)] += dbias;
    }
  }
}

void run(const CaseSpec& s, const Inputs& in, Reference* ref, bool backward, int threads) {
  const int first_out = kOut, last_out = backward ? kDbias : kLast;
  for (int t = 0; t < kTensorCount; ++t) ref->v[t].clear();
  for (int t = first_out; t <= last_out; ++t) {
    if (t == kDout) continue;
    const TensorLayout l = layout(s, t);
    if (l.present) ref->v[t].assign(size_t(l.numel()), 0.0);
  }
  const size_t vsize = size_t(s.batch * s.groups * s.dstate * s.seqlen);
  int nt = std::max(1, std::min<int>(threads, int(s.dim)));
  std::vector<Vec> dB(static_cast<size_t>(nt)), dC(dB.size());
  for (int i = 0; i < nt; ++i) {
    if (backward && s.var_B) dB[size_t(i)].assign(vsize, 0.0);
    if (backward && s.var_C) dC[size_t(i)].assign(vsize, 0.0);
  }
  auto work = [&](int i) {
    const int64_t d0 = s.dim * i / nt, d1 = s.dim * (i + 1) / nt;
    run_channels(s, in, ref, backward, d0, d1, &dB[size_t(i)], &dC[size_t(i)]);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < nt; ++i) pool.emplace_back(work, i);
  work(0);
  for (auto& th : pool) th.join();
  if (!backward) return;
  // Fixed-order sum of the workers' partials: the reference is deterministic for a given thread count.
  for (int i = 0; i < nt; ++i) {
    if (s.var_B) for (size_t k = 0; k < vsize; ++k) ref->v[kDB][k] += dB[size_t(i)][k];
    if (s.var_C) for (size_t k = 0; k < vsize; ++k) ref->v[kDC][k] += dC[size_t(i)][k];
  }
}

Inputs widen(const CaseSpec& s, const HostData& h) {
  Inputs in;
  static const int kIn[] = {kU, kDelta, kA, kB, kC, kD, kZ, kBias, kDout};
  for (int t : kIn)
    if (layout(s, t).present) in[t].assign(h.v[t].begin(), h.v[t].end());
  return in;
}

double loss(const CaseSpec& s, const Inputs& in) {
  Reference r;
  run(s, in, &r, false, 1);
  const Vec& y = s.has_z ? r.v[kOutZ] : r.v[kOut];
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) sum += in[kDout][i] * y[i];
  return sum;
}

}  // namespace

void reference_forward(const CaseSpec& s, const HostData& in, Reference* ref, int threads) {
  run(s, widen(s, in), ref, false, threads);
}

void reference_forward_backward(const CaseSpec& s, const HostData& in, Reference* ref, int threads) {
  run(s, widen(s, in), ref, true, threads);
}

double reference_gradient_check(const CaseSpec& full, int directions, uint64_t seed) {
  CaseSpec s = full;
  s.batch = std::min<int64_t>(s.batch, 2);
  s.dim = s.groups * std::min<int64_t>(s.dim / s.groups, 2);
  s.seqlen = std::min<int64_t>(s.seqlen, 150);
  s.dstate = std::min<int64_t>(s.dstate, 4);
  s.itype = SELSCAN_DTYPE_FLOAT32;
  const Inputs base = widen(s, make_inputs(s, seed));
  Reference grad;
  run(s, base, &grad, true, 1);
  static const int kIn[] = {kU, kDelta, kA, kB, kC, kD, kZ, kBias};
  static const int kGrad[] = {kDu, kDdelta, kDA, kDB, kDC, kDD, kDz, kDbias};
  double worst = 0;
  for (int k = 0; k < directions; ++k) {
    // A fresh random draw, centred, as the direction: every input moves at once.
    const HostData dir = make_inputs(s, seed + 1 + uint64_t(k));
    const double eps = 1e-5;
    Inputs plus = base, minus = base;
    double analytic = 0;
    for (int i = 0; i < 8; ++i) {
      const int t = kIn[i];
      if (base[t].empty()) continue;
      for (size_t j = 0; j < base[t].size(); ++j) {
        const double v = double(dir.v[t][j]) - (t == kDelta || t == kBias ? 0.25 : t == kA ? -0.25 : 0.0);
        plus[t][j] += eps * v;
        minus[t][j] -= eps * v;
        analytic += grad.v[kGrad[i]][j] * v;
      }
    }
    const double fd = (loss(s, plus) - loss(s, minus)) / (2 * eps);
    const double rel = std::fabs(fd - analytic) / std::max({std::fabs(fd), std::fabs(analytic), 1e-300});
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace selscan_cli
