// The float64 reference of the causal depthwise conv1d (include/selscan/selscan.h, section 5c; src/conv1d.h pins the
// choices): the forward, its reverse mode and the decode update, written from the math with plain loops. It shares
// no code with src/. The backward scatters each output's gradient onto the inputs it read (the library gathers).
//
// One RefConv1d holds Bt sequences of one length L (a packed call is split into sequences by the caller). Each
// sequence's inputs extend into the past through a history of H columns: xe(t) = x[t] for 0 <= t < L,
// hist[H + t] for -H <= t < 0, and 0 before; initial_states is H = W-1, a pool slot H = state_len. Its final
// columns are the last F values of xe: fin[j] = xe(L - F + j) (final_states F = W-1, the pool's new slot F =
// state_len).
//
// Every result comes with a condition scale: a first-order bound on the error of a float32 evaluation of it, in
// units of u = 2^-24, with unit constants (a test multiplies it by its safety factor). A sum's scale is the sum of
// |terms| plus what the terms carry in; SILU's exp counts (4 + 2|y|) units, as fast-math exp on a GPU may err.
#pragma once

#include <cstdint>
#include <vector>

namespace selscan_support {

struct RefConv1d {
  int64_t Bt = 1, D = 1, L = 1, W = 4;
  int64_t H = 0;  // history columns (0: none, xe(t < 0) = 0)
  int64_t F = 0;  // final columns wanted (0: none)
  bool silu = false, has_bias = false;
  std::vector<double> x;          // (Bt, D, L)
  std::vector<double> weight;     // (D, W)
  std::vector<double> bias;       // (D)
  std::vector<double> hist;       // (Bt, D, H)
  std::vector<int32_t> seq_idx;   // (Bt, L), or empty: absent

  int64_t bdl(int64_t b, int64_t d, int64_t t) const { return (b * D + d) * L + t; }
  int64_t bdh(int64_t b, int64_t d, int64_t j) const { return (b * D + d) * H + j; }
  int64_t bdf(int64_t b, int64_t d, int64_t j) const { return (b * D + d) * F + j; }
};

struct RefConv1dFwd {
  std::vector<double> out, cond_out;  // (Bt, D, L)
  std::vector<double> fin;            // (Bt, D, F): exact copies of inputs (no scale)
};
RefConv1dFwd ref_conv1d_forward(const RefConv1d& p);

struct RefConv1dBwd {
  std::vector<double> dx, cond_dx;            // (Bt, D, L)
  std::vector<double> dweight, cond_dweight;  // (D, W)
  std::vector<double> dbias, cond_dbias;      // (D)
  std::vector<double> dhist, cond_dhist;      // (Bt, D, H)
};
// dout: (Bt, D, L), the gradient of out; dfin: (Bt, D, F), the gradient of fin, or empty (0).
RefConv1dBwd ref_conv1d_backward(const RefConv1d& p, const std::vector<double>& dout,
                                 const std::vector<double>& dfin);
// sum(dout * out) + sum(dfin * fin), the scalar whose gradient ref_conv1d_backward computes.
double ref_conv1d_loss(const RefConv1d& p, const std::vector<double>& dout, const std::vector<double>& dfin);
// ref_conv1d_backward against central finite differences of ref_conv1d_loss along `directions` random directions
// in the space of every input (x, weight, bias, hist). Returns the worst relative disagreement of the directional
// derivatives (about 1e-9 when the reverse mode is right).
double ref_conv1d_gradient_check(const RefConv1d& p, const std::vector<double>& dout, const std::vector<double>& dfin,
                                 int directions, uint64_t seed);
// The directional derivative of ref_conv1d_loss along (dir_x, dir_w, dir_b, dir_h) by central differences, for
// judging another implementation's gradients (empty direction vectors: that input does not move).
double ref_conv1d_directional(const RefConv1d& p, const std::vector<double>& dout, const std::vector<double>& dfin,
                              const std::vector<double>& dir_x, const std::vector<double>& dir_w,
                              const std::vector<double>& dir_b, const std::vector<double>& dir_h);

// The decode update of Bt sequences, each with its own state of S columns (the slot it names, gathered).
struct RefConv1dUpdate {
  int64_t Bt = 1, D = 1, T = 1, W = 4, S = 3;
  bool silu = false, has_bias = false;
  std::vector<double> x;               // (Bt, D, T)
  std::vector<double> weight;          // (D, W)
  std::vector<double> bias;            // (D)
  std::vector<double> state;           // (Bt, D, S)
  std::vector<int64_t> cache_seqlens;  // (Bt) >= 0: a circular buffer; empty: the state shifts
};
struct RefConv1dUpdateOut {
  std::vector<double> out, cond_out;  // (Bt, D, T)
  std::vector<double> state;          // (Bt, D, S) after the call
};
RefConv1dUpdateOut ref_conv1d_update(const RefConv1dUpdate& p);

}  // namespace selscan_support
