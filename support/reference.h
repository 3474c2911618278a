// The float64 reference that tests, `selscan run` and `selscan doctor` judge the library by: a plain sequential
// recurrence of the selective scan (forward, last state, chunk states) and its reverse mode, written from the
// math (docs/numerics.md) with straightforward loops. It shares no code with src/. Real and complex weights run
// through the same complex<double> code: for real weights every value has imaginary part 0 and the output
// factor kappa is 1 (complex: y += 2 Re(h C), kappa = 2).
//
// It always scans the true state h (B applied inside b̄); the upstream fold_B convention appears only in the
// chunk states xH (= h / B[d,n] when B is constant and there is no h0).
#pragma once

#include <complex>
#include <cstdint>
#include <vector>

namespace selscan_support {

using cd = std::complex<double>;

struct RefProblem {
  int64_t Bt = 1, D = 1, L = 1, N = 1, G = 1;
  bool cplx = false, var_B = true, var_C = true, softplus = false;
  bool has_D = false, has_z = false, has_bias = false, has_h0 = false;
  std::vector<double> u, delta, z;  // (Bt, D, L)
  std::vector<cd> A;                // (D, N)
  std::vector<cd> B, C;             // variable: (Bt, G, N, L); constant: (D, N)
  std::vector<double> Dv, bias;     // (D)
  std::vector<cd> h0;               // (Bt, D, N)

  int64_t nchunks() const { return (L + 2047) / 2048; }
  bool fold_B() const { return !var_B && !has_h0; }
  int64_t bdl(int64_t b, int64_t d, int64_t t) const { return (b * D + d) * L + t; }
  int64_t bdn(int64_t b, int64_t d, int64_t n) const { return (b * D + d) * N + n; }
  int64_t dn(int64_t d, int64_t n) const { return d * N + n; }
  int64_t bgnl(int64_t b, int64_t g, int64_t n, int64_t t) const { return ((b * G + g) * N + n) * L + t; }
  int64_t group(int64_t d) const { return d / (D / G); }
};

struct RefFwd {
  std::vector<double> y;       // (Bt, D, L) before the gate
  std::vector<double> out_z;   // (Bt, D, L) y * silu(z) (when z)
  // Condition scales (only with ref_forward(p, true)): cond_y[i] bounds |y_fp32 - y| / u (u = 2^-24 = fp32's
  // unit roundoff) to first order when every step of the recurrence is computed with relative errors of
  // about one unit in ā_t (plus |δ_t A| units for the rounding of δ_t inside exp), b̄_t and the output
  // products; cond_out_z = cond_y * |silu(z)|. See docs/numerics.md, "Conditioning-aware output tolerance".
  std::vector<double> cond_y, cond_out_z;  // (Bt, D, L)
  std::vector<cd> last_state;  // (Bt, D, N) true state after position L-1
  std::vector<cd> xP, xH;      // (Bt, D, nc, N) chunk states (xH in the fold_B convention)
  // The same for the states (only with ref_forward(p, true)), one value per (complex) element: cond_xH and
  // cond_last_state are the running bound M_n at the chunk's last position and at L-1 (cond_xH divided by |B|
  // under fold_B, whose scan runs on h / B; cond_last_state plus |h| there, the rounding of B s); cond_xP bounds
  // the running product of decays, |P| (steps + 1) (2 + Σ_t |δ_t A|): a product of ā's (each with error
  // (1 + |δ_t A|) u, and one rounding per product) or one exp of the summed exponents (the sum's rounding,
  // up to (steps) u Σ |δ_t A|). See docs/numerics.md, "Conditioning-aware tolerance of the explosive comparison".
  std::vector<double> cond_xP, cond_xH;  // (Bt, D, nc, N)
  std::vector<double> cond_last_state;   // (Bt, D, N)
};

struct RefBwd {
  std::vector<double> du, ddelta, dz;  // (Bt, D, L)
  std::vector<cd> dA;                  // (D, N)
  std::vector<cd> dB, dC;              // shaped like B, C
  std::vector<double> dD, dbias;       // (D)
  std::vector<cd> dh0;                 // (Bt, D, N)
  // Condition scales of the reduced gradients (only with ref_backward(p, dout, true)), in units of u = 2^-24:
  // each bounds |g_fp32 - g| / u to first order, one value per (complex) element. A reduced gradient is a sum of
  // terms T (over batch and time; variable dB/dC over a group's channels; ddelta_bias also over states); its
  // scale is sum |T| (the rounding of the products and of the sum) plus the first-order error the terms carry
  // in from the forward state h and the state gradient dh, worst case over the signs of the per-step errors
  // (adjoints of the two scans; for a single term, RefFwd's running bound M and its backward twin), and
  // |δ A| |T| where T holds ā directly. See docs/numerics.md, "Conditioning-aware tolerance of the reduced
  // gradients", and add_cond in reference.cpp.
  std::vector<double> cond_dA;              // (D, N)
  std::vector<double> cond_dB, cond_dC;     // shaped like B, C
  std::vector<double> cond_dD, cond_dbias;  // (D)
  // The per-step gradients get scales of the same kind: the sum of |terms| at that step plus the first-order
  // error they inherit from h and dh (the running bounds Mh(t) and Mg(t) that add_cond propagates), summed over
  // the states. du: |D dy| + Σ_n |δ B| (|dh| + Mg); ddelta: sp Σ_n (|u B dh| + (1 + |δ A|) |A ā dh h(t-1)| +
  // |u conj(B) + conj(A ā h(t-1))| Mg + |A ā dh| Mh(t-1)); dz: |dout σ| (|1 + z (1 - σ)| cond_y + 10 (1 + |z|) |y|)
  // (the error of the saved out, and the gate's roundings); dh0 = conj(ā_0) dh_0: |ā_0| Mg(0) +
  // (1 + |δ_0 A|) |ā_0 dh_0|. docs/numerics.md, "Conditioning-aware tolerance of the explosive comparison".
  std::vector<double> cond_du, cond_ddelta, cond_dz;  // (Bt, D, L)
  std::vector<double> cond_dh0;                       // (Bt, D, N)
};

// `with_cond` also fills the cond_* scales (a few more operations in the same recurrence). `threads` > 1 splits
// the channels among that many threads; the result does not depend on it.
RefFwd ref_forward(const RefProblem& p, bool with_cond = false, int threads = 1);
// dout: gradient of the final output (out_z when z is given, else y). Gradients follow PyTorch's convention
// for complex inputs of a real loss (dL/dRe + i dL/dIm).
// `with_cond` also fills the cond_* scales of every gradient. `threads` as for ref_forward, except that the sums
// over a group's channels (variable dB, dC) are added in a different order for each thread count.
RefBwd ref_backward(const RefProblem& p, const std::vector<double>& dout, bool with_cond = false, int threads = 1);
// The problem restricted to some channels and states (every batch and step): channels `ch` of p become channels
// 0.. and states `st` become states 0... With variable B or C every channel of `ch` must be in one group, which
// becomes the only group. dA, constant dB/dC and their scales at (i, j) are p's at (ch[i], st[j]); dD,
// ddelta_bias and variable dB/dC equal p's (and their scales) only when `st` holds every state, resp. when `ch`
// is the whole group. `restrict_bdl` restricts a (Bt, D, L) array such as dout the same way.
RefProblem restrict_problem(const RefProblem& p, const std::vector<int64_t>& ch, const std::vector<int64_t>& st);
std::vector<double> restrict_bdl(const RefProblem& p, const std::vector<double>& v, const std::vector<int64_t>& ch);
// sum(dout * final output), the scalar whose gradient ref_backward computes (for finite differences).
double ref_loss(const RefProblem& p, const std::vector<double>& dout);
// ref_backward against central finite differences of ref_loss along `directions` random directions in the
// space of all inputs (each a draw of the same kind as the inputs, centred). Returns the worst relative
// disagreement of the directional derivatives (about 1e-9 when the reverse mode is right).
double ref_gradient_check(const RefProblem& p, const std::vector<double>& dout, int directions, uint64_t seed);

// Flatten complex values for comparison with a tensor's values(): interleaved re/im when `cplx`, else the
// real parts.
std::vector<double> flatten(const std::vector<cd>& v, bool cplx);
// A per-element scale laid out like flatten(): each value twice (re, im) when `cplx`. A bound on the modulus
// of a complex error bounds both parts.
std::vector<double> flatten_cond(const std::vector<double>& v, bool cplx);
// The chunk states as the x tensor (Bt, D, nc, 2N) lays them out, flattened like flatten(): [..., 2n] = P,
// [..., 2n+1] = H. ref_x_cond: their condition scales (RefFwd::cond_xP, cond_xH) in the same layout.
std::vector<double> ref_x_values(const RefFwd& f, const RefProblem& p);
std::vector<double> ref_x_cond(const RefFwd& f, const RefProblem& p);

}  // namespace selscan_support
