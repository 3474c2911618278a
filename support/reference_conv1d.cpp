#include "support/reference_conv1d.h"

#include <algorithm>
#include <cmath>

#include "support/rng.h"

namespace selscan_support {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// The extended input of row (b, d): x, then the history, then zeros.
double xe(const RefConv1d& p, int64_t b, int64_t d, int64_t t) {
  if (t >= 0) return p.x[static_cast<size_t>(p.bdl(b, d, t))];
  if (t >= -p.H) return p.hist[static_cast<size_t>(p.bdh(b, d, p.H + t))];
  return 0.0;
}

int32_t seg(const RefConv1d& p, int64_t b, int64_t t) { return p.seq_idx[static_cast<size_t>(b * p.L + t)]; }

// Output t of row b is padding (seq_idx < 0): the constant 0.
bool padding(const RefConv1d& p, int64_t b, int64_t t) { return !p.seq_idx.empty() && seg(p, b, t) < 0; }

// Whether output t reads position tp: always without seq_idx, else only its own segment from time 0 on.
bool reads(const RefConv1d& p, int64_t b, int64_t t, int64_t tp) {
  return p.seq_idx.empty() || (tp >= 0 && seg(p, b, tp) == seg(p, b, t));
}

struct Pre {
  double y, cond;  // the pre-activation and its scale (the sum of |terms|)
};

Pre pre_activation(const RefConv1d& p, int64_t b, int64_t d, int64_t t) {
  const double bias = p.has_bias ? p.bias[static_cast<size_t>(d)] : 0.0;
  Pre r{bias, std::fabs(bias)};
  for (int64_t k = 0; k < p.W; ++k) {
    const int64_t tp = t - (p.W - 1) + k;
    if (!reads(p, b, t, tp)) continue;
    const double term = p.weight[static_cast<size_t>(d * p.W + k)] * xe(p, b, d, tp);
    r.y += term;
    r.cond += std::fabs(term);
  }
  return r;
}

// SILU's value and scale from the pre-activation's (the exp's error, the product's rounding).
void activate(bool silu, const Pre& y, double* out, double* cond) {
  if (!silu) {
    *out = y.y;
    *cond = y.cond;
    return;
  }
  const double s = sigmoid(y.y), v = y.y * s, dv = s * (1.0 + y.y * (1.0 - s));
  *out = v;
  *cond = std::fabs(dv) * y.cond + (5.0 + 2.0 * std::fabs(y.y)) * std::fabs(v);
}

// The gradient position tp of row (b, d) receives: x for tp >= 0, the history above -H, nothing before.
void add_input_grad(const RefConv1d& p, RefConv1dBwd& g, int64_t b, int64_t d, int64_t tp, double v, double cond) {
  if (tp >= 0) {
    g.dx[static_cast<size_t>(p.bdl(b, d, tp))] += v;
    g.cond_dx[static_cast<size_t>(p.bdl(b, d, tp))] += cond;
  } else if (tp >= -p.H) {
    g.dhist[static_cast<size_t>(p.bdh(b, d, p.H + tp))] += v;
    g.cond_dhist[static_cast<size_t>(p.bdh(b, d, p.H + tp))] += cond;
  }
}

}  // namespace

RefConv1dFwd ref_conv1d_forward(const RefConv1d& p) {
  RefConv1dFwd f;
  f.out.assign(static_cast<size_t>(p.Bt * p.D * p.L), 0.0);
  f.cond_out.assign(f.out.size(), 0.0);
  f.fin.assign(static_cast<size_t>(p.Bt * p.D * p.F), 0.0);
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d = 0; d < p.D; ++d) {
      for (int64_t t = 0; t < p.L; ++t) {
        if (padding(p, b, t)) continue;
        const size_t i = static_cast<size_t>(p.bdl(b, d, t));
        activate(p.silu, pre_activation(p, b, d, t), &f.out[i], &f.cond_out[i]);
      }
      for (int64_t j = 0; j < p.F; ++j) f.fin[static_cast<size_t>(p.bdf(b, d, j))] = xe(p, b, d, p.L - p.F + j);
    }
  return f;
}

RefConv1dBwd ref_conv1d_backward(const RefConv1d& p, const std::vector<double>& dout,
                                 const std::vector<double>& dfin) {
  RefConv1dBwd g;
  g.dx.assign(static_cast<size_t>(p.Bt * p.D * p.L), 0.0);
  g.cond_dx = g.dx;
  g.dweight.assign(static_cast<size_t>(p.D * p.W), 0.0);
  g.cond_dweight = g.dweight;
  g.dbias.assign(static_cast<size_t>(p.D), 0.0);
  g.cond_dbias = g.dbias;
  g.dhist.assign(static_cast<size_t>(p.Bt * p.D * p.H), 0.0);
  g.cond_dhist = g.dhist;
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d = 0; d < p.D; ++d) {
      for (int64_t t = 0; t < p.L; ++t) {
        if (padding(p, b, t)) continue;
        const double go = dout[static_cast<size_t>(p.bdl(b, d, t))];
        // dL/dy and its scale: through SILU, y' = s (1 + y (1 - s)); its error comes from y's (times y''), from
        // the sigmoid's exp (times d y'/d s = 1 + y (1 - 2 s)) and from a few roundings.
        double gy = go, cond_gy = 0.0;
        if (p.silu) {
          const Pre y = pre_activation(p, b, d, t);
          const double s = sigmoid(y.y), d1 = s * (1.0 + y.y * (1.0 - s));
          const double d2 = s * (1.0 - s) * (2.0 + y.y * (1.0 - 2.0 * s));
          gy = go * d1;
          cond_gy = std::fabs(go) * (std::fabs(d2) * y.cond +
                                     (4.0 + 2.0 * std::fabs(y.y)) * s * std::fabs(1.0 + y.y * (1.0 - 2.0 * s)) +
                                     4.0 * std::fabs(d1));
        }
        const double mag = std::fabs(gy) + cond_gy;
        g.dbias[static_cast<size_t>(d)] += gy;
        g.cond_dbias[static_cast<size_t>(d)] += mag;
        for (int64_t k = 0; k < p.W; ++k) {
          const int64_t tp = t - (p.W - 1) + k;
          if (!reads(p, b, t, tp)) continue;
          const double w = p.weight[static_cast<size_t>(d * p.W + k)], v = xe(p, b, d, tp);
          g.dweight[static_cast<size_t>(d * p.W + k)] += gy * v;
          g.cond_dweight[static_cast<size_t>(d * p.W + k)] += std::fabs(v) * mag;
          add_input_grad(p, g, b, d, tp, w * gy, std::fabs(w) * mag);
        }
      }
      if (!dfin.empty())
        for (int64_t j = 0; j < p.F; ++j) {
          const double v = dfin[static_cast<size_t>(p.bdf(b, d, j))];
          add_input_grad(p, g, b, d, p.L - p.F + j, v, std::fabs(v));
        }
    }
  return g;
}

double ref_conv1d_loss(const RefConv1d& p, const std::vector<double>& dout, const std::vector<double>& dfin) {
  const RefConv1dFwd f = ref_conv1d_forward(p);
  double l = 0.0;
  for (size_t i = 0; i < f.out.size(); ++i) l += dout[i] * f.out[i];
  if (!dfin.empty())
    for (size_t i = 0; i < f.fin.size(); ++i) l += dfin[i] * f.fin[i];
  return l;
}

double ref_conv1d_directional(const RefConv1d& p, const std::vector<double>& dout, const std::vector<double>& dfin,
                              const std::vector<double>& dir_x, const std::vector<double>& dir_w,
                              const std::vector<double>& dir_b, const std::vector<double>& dir_h) {
  // Step: the central difference's truncation error (~h^2) and its rounding error (~2^-52 / h, relative) both
  // stay near 1e-10 here.
  const double h = 1e-6;
  RefConv1d plus = p, minus = p;
  auto move = [&](std::vector<double> RefConv1d::*v, const std::vector<double>& dir) {
    for (size_t i = 0; i < dir.size(); ++i) {
      (plus.*v)[i] += h * dir[i];
      (minus.*v)[i] -= h * dir[i];
    }
  };
  move(&RefConv1d::x, dir_x);
  move(&RefConv1d::weight, dir_w);
  move(&RefConv1d::bias, dir_b);
  move(&RefConv1d::hist, dir_h);
  return (ref_conv1d_loss(plus, dout, dfin) - ref_conv1d_loss(minus, dout, dfin)) / (2.0 * h);
}

double ref_conv1d_gradient_check(const RefConv1d& p, const std::vector<double>& dout, const std::vector<double>& dfin,
                                 int directions, uint64_t seed) {
  const RefConv1dBwd g = ref_conv1d_backward(p, dout, dfin);
  Rng rng(seed);
  double worst = 0.0;
  for (int k = 0; k < directions; ++k) {
    double analytic = 0.0;
    auto draw = [&](const std::vector<double>& grad, size_t n) {
      std::vector<double> dir(n);
      for (size_t i = 0; i < n; ++i) {
        dir[i] = rng.normal();
        analytic += grad[i] * dir[i];
      }
      return dir;
    };
    const std::vector<double> dx = draw(g.dx, p.x.size()), dw = draw(g.dweight, p.weight.size());
    const std::vector<double> db = p.has_bias ? draw(g.dbias, p.bias.size()) : std::vector<double>{};
    const std::vector<double> dh = draw(g.dhist, p.hist.size());
    const double fd = ref_conv1d_directional(p, dout, dfin, dx, dw, db, dh);
    worst = std::max(worst, std::fabs(fd - analytic) / std::max({std::fabs(fd), std::fabs(analytic), 1e-300}));
  }
  return worst;
}

RefConv1dUpdateOut ref_conv1d_update(const RefConv1dUpdate& p) {
  RefConv1dUpdateOut r;
  r.out.assign(static_cast<size_t>(p.Bt * p.D * p.T), 0.0);
  r.cond_out = r.out;
  r.state = p.state;
  const bool circular = !p.cache_seqlens.empty();
  for (int64_t b = 0; b < p.Bt; ++b)
    for (int64_t d = 0; d < p.D; ++d) {
      const size_t row = static_cast<size_t>((b * p.D + d) * p.S);
      const int64_t c = circular ? p.cache_seqlens[static_cast<size_t>(b)] % p.S : 0;
      // The inputs before and through the tokens: v(s) = x[s] for s >= 0; before, the state's columns (the ones
      // before position c of the circular buffer, or its last ones).
      auto v = [&](int64_t s) {
        if (s >= 0) return p.x[static_cast<size_t>((b * p.D + d) * p.T + s)];
        const int64_t col = circular ? ((c + s) % p.S + p.S) % p.S : p.S + s;
        return p.state[row + static_cast<size_t>(col)];
      };
      const double bias = p.has_bias ? p.bias[static_cast<size_t>(d)] : 0.0;
      for (int64_t t = 0; t < p.T; ++t) {
        Pre y{bias, std::fabs(bias)};
        for (int64_t k = 0; k < p.W; ++k) {
          const double term = p.weight[static_cast<size_t>(d * p.W + k)] * v(t - (p.W - 1) + k);
          y.y += term;
          y.cond += std::fabs(term);
        }
        const size_t i = static_cast<size_t>((b * p.D + d) * p.T + t);
        activate(p.silu, y, &r.out[i], &r.cond_out[i]);
      }
      // The state after the call: tokens written at c, c+1, ... (mod S; a later token overwrites an earlier one),
      // or the last S values of (state, tokens).
      for (int64_t j = 0; j < p.S; ++j) {
        double nv;
        if (circular) {
          nv = p.state[row + static_cast<size_t>(j)];
          for (int64_t i = 0; i < p.T; ++i)
            if ((c + i) % p.S == j) nv = v(i);
        } else {
          nv = v(p.T - p.S + j);  // position T - S + j of the tokens' time (negative: the old state)
        }
        r.state[row + static_cast<size_t>(j)] = nv;
      }
    }
  return r;
}

}  // namespace selscan_support
