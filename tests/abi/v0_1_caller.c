/* A caller built against the 0.1.0 header (tests/abi/v0_1/selscan/selscan.h, a verbatim copy) runs a CPU
 * forward and backward through the current library: its smaller structs must keep working, the fields added
 * since reading as absent. Each struct sits in memory followed by 0xFF bytes, so a library that read past the
 * caller's struct_size would see non-zero "new fields" and reject the call.
 *
 * Problem: Bt=2, D=2, L=8, N=4, fp32, variable B/C, with D, z, delta_bias and softplus. The outputs are checked
 * against a float64 recurrence and the gradients against central differences of it (the loss is
 * sum(dout * out_z)), so a wrong result fails. */
#include <selscan/selscan.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "contiguous_f32.h"

#if SELSCAN_VERSION != 100
#  error "this program must be compiled against the 0.1.0 header (tests/abi/v0_1)"
#endif

enum { BT = 2, DIM = 2, L = 8, N = 4, BDL = BT * DIM * L, DN = DIM * N, BNL = BT * N * L };

/* Every input in one float array (what the library gets) and its float64 copy (what the reference perturbs). */
enum {
  O_U = 0,
  O_DELTA = O_U + BDL,
  O_Z = O_DELTA + BDL,
  O_A = O_Z + BDL,
  O_B = O_A + DN,
  O_C = O_B + BNL,
  O_D = O_C + BNL,
  O_BIAS = O_D + DIM,
  NPARAM = O_BIAS + DIM
};

static float param[NPARAM];
static double theta[NPARAM];
static float dout[BDL], out[BDL], out_z[BDL], out_z2[BDL];
static float grad[NPARAM]; /* the library's gradients, laid out like param */

static unsigned long long rng_state = 12345;
static float uniform(float lo, float hi) { /* 64-bit LCG, top 24 bits */
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (float)((rng_state >> 40) & 0xFFFFFF) / 16777216.0f;
}

/* The selective scan in float64, sequentially: h_t = exp(dt A) h_{t-1} + dt B_t u_t, y_t = sum_n C_t h_t + D u,
 * dt = softplus(delta + bias), out_z = y * silu(z). */
static void reference(const double* p, double* y, double* yz) {
  int b, d, t, n;
  for (b = 0; b < BT; ++b)
    for (d = 0; d < DIM; ++d) {
      double h[N] = {0};
      for (t = 0; t < L; ++t) {
        const int i = (b * DIM + d) * L + t;
        const double u = p[O_U + i], z = p[O_Z + i];
        double dt = p[O_DELTA + i] + p[O_BIAS + d], acc = p[O_D + d] * u;
        dt = dt <= 20.0 ? log1p(exp(dt)) : dt;
        for (n = 0; n < N; ++n) {
          const int bc = (b * N + n) * L + t;
          h[n] = exp(dt * p[O_A + d * N + n]) * h[n] + dt * p[O_B + bc] * u;
          acc += p[O_C + bc] * h[n];
        }
        y[i] = acc;
        yz[i] = acc * z / (1.0 + exp(-z));
      }
    }
}

static double loss(const double* p) {
  double y[BDL], yz[BDL], s = 0;
  int i;
  reference(p, y, yz);
  for (i = 0; i < BDL; ++i) s += (double)dout[i] * yz[i];
  return s;
}

static const int64_t s_bdl[3] = {BT, DIM, L}, s_dn[2] = {DIM, N}, s_bnl[3] = {BT, N, L}, s_d[1] = {DIM};

/* Each input: where it lives in param (and its gradient in grad), its shape, and its fields in the structs. */
static const struct {
  const char* grad_name;
  int offset, count, ndim;
  const int64_t* sizes;
  size_t fwd_field, bwd_field, grad_field;
} inputs[] = {
#define IN(x, dx, o, n, nd, sz) \
  {#dx, o, n, nd, sz, offsetof(selscan_fwd_args_t, x), offsetof(selscan_bwd_args_t, x), offsetof(selscan_bwd_args_t, dx)}
    IN(u, du, O_U, BDL, 3, s_bdl),         IN(delta, ddelta, O_DELTA, BDL, 3, s_bdl), IN(z, dz, O_Z, BDL, 3, s_bdl),
    IN(A, dA, O_A, DN, 2, s_dn),           IN(B, dB, O_B, BNL, 3, s_bnl),             IN(C, dC, O_C, BNL, 3, s_bnl),
    IN(D, dD, O_D, DIM, 1, s_d),           IN(delta_bias, ddelta_bias, O_BIAS, DIM, 1, s_d),
#undef IN
};
enum { NINPUTS = sizeof inputs / sizeof inputs[0] };

static selscan_tensor_t* field(void* args, size_t offset) { return (selscan_tensor_t*)((char*)args + offset); }

static int succeeded(selscan_status_t st, const char* call, size_t struct_size) {
  if (st == SELSCAN_STATUS_SUCCESS) return 1;
  fprintf(stderr, "%s (0.1 struct of %zu bytes): status %d: %s\n", call, struct_size, (int)st, selscan_last_error());
  return 0;
}

static int bad = 0;
static void expect_close(const char* what, int i, double got, double want, double rtol, double atol) {
  if (!(fabs(got - want) <= atol + rtol * fabs(want))) {
    fprintf(stderr, "%s[%d] = %.9g, float64 reference %.9g\n", what, i, got, want);
    ++bad;
  }
}

/* The argument structs, each followed by bytes a 0.1 caller never set (here 0xFF). */
static struct {
  selscan_fwd_args_t a;
  unsigned char after[64];
} fwd_box;
static struct {
  selscan_bwd_args_t a;
  unsigned char after[64];
} bwd_box;
static struct {
  selscan_exec_t e;
  unsigned char after[64];
} exec_box;

int main(void) {
  double y[BDL], yz[BDL];
  selscan_fwd_args_t* fa = &fwd_box.a;
  selscan_bwd_args_t* ba = &bwd_box.a;
  selscan_exec_t* ex = &exec_box.e;
  selscan_status_t st;
  int i, k;

  /* The library is newer than this header, of the same major version. */
  if (selscan_version() / 10000 != SELSCAN_VERSION_MAJOR || selscan_version() < SELSCAN_VERSION) {
    fprintf(stderr, "library %s (%d) cannot serve a %d caller\n", selscan_version_string(), (int)selscan_version(),
            SELSCAN_VERSION);
    return 1;
  }

  for (i = 0; i < BDL; ++i) {
    param[O_U + i] = uniform(-1.f, 1.f);
    param[O_DELTA + i] = uniform(-1.5f, 1.f);
    param[O_Z + i] = uniform(-2.f, 2.f);
    dout[i] = uniform(-1.f, 1.f);
  }
  for (i = 0; i < DN; ++i) param[O_A + i] = uniform(-1.5f, -0.2f);
  for (i = 0; i < BNL; ++i) {
    param[O_B + i] = uniform(-1.f, 1.f);
    param[O_C + i] = uniform(-1.f, 1.f);
  }
  for (i = 0; i < DIM; ++i) {
    param[O_D + i] = uniform(-1.f, 1.f);
    param[O_BIAS + i] = uniform(-0.5f, 0.5f);
  }
  for (i = 0; i < NPARAM; ++i) theta[i] = param[i];
  for (i = 0; i < BDL; ++i) out[i] = out_z[i] = out_z2[i] = NAN;
  for (i = 0; i < NPARAM; ++i) grad[i] = NAN;

  memset(&exec_box, 0xFF, sizeof exec_box);
  ex->struct_size = sizeof *ex;
  ex->device_kind = SELSCAN_DEVICE_CPU;
  ex->device_index = 0;
  ex->stream = NULL;
  ex->workspace = NULL;
  ex->workspace_bytes = 0;
  ex->num_threads = 2;
  ex->reserved = 0;

  memset(&fwd_box, 0xFF, sizeof fwd_box);
  memset(fa, 0, sizeof *fa);
  fa->struct_size = sizeof *fa;
  for (k = 0; k < NINPUTS; ++k)
    *field(fa, inputs[k].fwd_field) = contiguous_f32(param + inputs[k].offset, inputs[k].ndim, inputs[k].sizes);
  fa->delta_softplus = 1;
  fa->out = contiguous_f32(out, 3, s_bdl);
  fa->out_z = contiguous_f32(out_z, 3, s_bdl);
  st = selscan_fwd(fa, ex);
  if (!succeeded(st, "selscan_fwd", sizeof *fa)) return 1;
  reference(theta, y, yz);
  for (i = 0; i < BDL; ++i) {
    expect_close("out", i, out[i], y[i], 1e-4, 1e-5);
    expect_close("out_z", i, out_z[i], yz[i], 1e-4, 1e-5);
  }

  memset(&bwd_box, 0xFF, sizeof bwd_box);
  memset(ba, 0, sizeof *ba);
  ba->struct_size = sizeof *ba; /* the 0.1 size: 0.2's flags and reserved lie past it, in the 0xFF bytes */
  for (k = 0; k < NINPUTS; ++k) {
    *field(ba, inputs[k].bwd_field) = *field(fa, inputs[k].fwd_field);
    *field(ba, inputs[k].grad_field) = contiguous_f32(grad + inputs[k].offset, inputs[k].ndim, inputs[k].sizes);
  }
  ba->delta_softplus = 1;
  ba->deterministic = 1;
  ba->dout = contiguous_f32(dout, 3, s_bdl);
  ba->out = fa->out;
  ba->out_z = contiguous_f32(out_z2, 3, s_bdl);
  st = selscan_bwd(ba, ex);
  if (!succeeded(st, "selscan_bwd", sizeof *ba)) return 1;
  for (i = 0; i < BDL; ++i) expect_close("out_z (backward's recompute)", i, out_z2[i], yz[i], 1e-4, 1e-5);

  /* d loss / d theta_i by central differences of the float64 reference (error ~1e-9 at this step). */
  for (k = 0; k < NINPUTS; ++k)
    for (i = 0; i < inputs[k].count; ++i) {
      const int j = inputs[k].offset + i;
      const double keep = theta[j], step = 1e-5 * (1.0 + fabs(keep));
      double up, down;
      theta[j] = keep + step;
      up = loss(theta);
      theta[j] = keep - step;
      down = loss(theta);
      theta[j] = keep;
      expect_close(inputs[k].grad_name, i, grad[j], (up - down) / (2 * step), 2e-4, 2e-5);
    }

  if (bad) {
    fprintf(stderr, "%d mismatches\n", bad);
    return 1;
  }
  printf("0.1.0 caller (fwd %zu, bwd %zu, exec %zu bytes) on libselscan %s: forward and %d gradients match\n",
         sizeof *fa, sizeof *ba, sizeof *ex, selscan_version_string(), NPARAM);
  return 0;
}
