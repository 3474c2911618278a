/* Load libselscan.so by path with dlopen (as Python ctypes, Julia or a plugin host would), resolve the entry
 * points by name, and run one small CPU forward (Bt=1, D=2, L=8, N=4, fp32, variable B/C, with D, z, delta_bias
 * and softplus). The output is checked against the plain sequential recurrence below, in double.
 * Usage: selscan_abi_dlopen /path/to/libselscan.so [seed] */
#include <selscan/selscan.h> /* types and constants only: nothing is linked */

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "contiguous_f32.h"

enum { BT = 1, DIM = 2, L = 8, N = 4 };

typedef const char* (*str_fn)(void);
typedef int32_t (*int_fn)(void);
typedef selscan_status_t (*fwd_fn)(const selscan_fwd_args_t*, const selscan_exec_t*);
typedef selscan_status_t (*wss_fn)(const selscan_fwd_args_t*, const selscan_exec_t*, size_t*);

static unsigned long long rng_state;
static float uniform(float lo, float hi) { /* 64-bit LCG, top 24 bits */
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (float)((rng_state >> 40) & 0xFFFFFF) / 16777216.0f;
}

static void* need(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "dlsym(%s) failed: %s\n", name, dlerror());
    exit(1);
  }
  return p;
}

int main(int argc, char** argv) {
  static float u[BT * DIM * L], delta[BT * DIM * L], z[BT * DIM * L], A[DIM * N], B[BT * N * L], C[BT * N * L];
  static float Dv[DIM], bias[DIM], out[BT * DIM * L], out_z[BT * DIM * L];
  const int64_t s_bdl[3] = {BT, DIM, L}, s_dn[2] = {DIM, N}, s_bgnl[4] = {BT, 1, N, L}, s_d[1] = {DIM};
  selscan_fwd_args_t args;
  selscan_exec_t exec = SELSCAN_EXEC_INIT;
  size_t ws = 999;
  void* lib;
  int i, d, t, n, bad = 0;
  unsigned seed;
  selscan_status_t st;

  if (argc < 2) {
    fprintf(stderr, "usage: %s /path/to/libselscan.so [seed]\n", argv[0]);
    return 2;
  }
  seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : (unsigned)time(NULL);
  rng_state = seed;
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen(%s) failed: %s\n", argv[1], dlerror());
    return 1;
  }
  {
    str_fn version_string = (str_fn)need(lib, "selscan_version_string");
    int_fn version = (int_fn)need(lib, "selscan_version");
    str_fn last_error = (str_fn)need(lib, "selscan_last_error");
    fwd_fn fwd = (fwd_fn)need(lib, "selscan_fwd");
    wss_fn fwd_ws = (wss_fn)need(lib, "selscan_fwd_workspace_size");

    printf("loaded %s version %s (seed %u)\n", argv[1], version_string(), seed);
    if (version() != SELSCAN_VERSION) {
      fprintf(stderr, "selscan_version() = %d, header says %d\n", (int)version(), SELSCAN_VERSION);
      return 1;
    }

    for (i = 0; i < BT * DIM * L; ++i) {
      u[i] = uniform(-1.f, 1.f);
      delta[i] = uniform(-1.f, 0.5f);
      z[i] = uniform(-2.f, 2.f);
      out[i] = out_z[i] = NAN; /* poison: every element must be written */
    }
    for (i = 0; i < DIM * N; ++i) A[i] = uniform(-2.f, -0.1f);
    for (i = 0; i < BT * N * L; ++i) {
      B[i] = uniform(-1.f, 1.f);
      C[i] = uniform(-1.f, 1.f);
    }
    for (d = 0; d < DIM; ++d) {
      Dv[d] = uniform(-1.f, 1.f);
      bias[d] = uniform(-0.5f, 0.5f);
    }

    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.u = contiguous_f32(u, 3, s_bdl);
    args.delta = contiguous_f32(delta, 3, s_bdl);
    args.A = contiguous_f32(A, 2, s_dn);
    args.B = contiguous_f32(B, 4, s_bgnl);
    args.C = contiguous_f32(C, 4, s_bgnl);
    args.D = contiguous_f32(Dv, 1, s_d);
    args.z = contiguous_f32(z, 3, s_bdl);
    args.delta_bias = contiguous_f32(bias, 1, s_d);
    args.delta_softplus = 1;
    args.out = contiguous_f32(out, 3, s_bdl);
    args.out_z = contiguous_f32(out_z, 3, s_bdl);
    exec.num_threads = 1;

    st = fwd_ws(&args, &exec, &ws);
    if (st != SELSCAN_STATUS_SUCCESS || ws != 0) {
      fprintf(stderr, "selscan_fwd_workspace_size: status %d, %zu bytes (want 0 on CPU): %s\n", (int)st, ws,
              last_error());
      return 1;
    }
    st = fwd(&args, &exec);
    if (st != SELSCAN_STATUS_SUCCESS) {
      fprintf(stderr, "selscan_fwd failed with status %d: %s\n", (int)st, last_error());
      return 1;
    }
  }

  /* The recurrence, written out: h_t = exp(dt*A) h_{t-1} + dt*B_t*u_t, y_t = sum_n C_t h_t + D u_t. */
  for (d = 0; d < DIM; ++d) {
    double h[N] = {0};
    for (t = 0; t < L; ++t) {
      const int idx = d * L + t;
      double dt = (double)delta[idx] + bias[d];
      double y = (double)Dv[d] * u[idx], yz, ref_tol;
      dt = dt <= 20.0 ? log1p(exp(dt)) : dt;
      for (n = 0; n < N; ++n) {
        h[n] = exp(dt * A[d * N + n]) * h[n] + dt * B[n * L + t] * u[idx];
        y += C[n * L + t] * h[n];
      }
      yz = y * z[idx] / (1.0 + exp(-(double)z[idx]));
      ref_tol = 1e-5 + 1e-4 * fabs(y);
      if (!(fabs(out[idx] - y) <= ref_tol)) {
        fprintf(stderr, "out[0,%d,%d] = %.8g, recurrence %.8g\n", d, t, out[idx], y);
        ++bad;
      }
      if (!(fabs(out_z[idx] - yz) <= 1e-5 + 1e-4 * fabs(yz))) {
        fprintf(stderr, "out_z[0,%d,%d] = %.8g, recurrence %.8g\n", d, t, out_z[idx], yz);
        ++bad;
      }
    }
  }
  dlclose(lib);
  if (bad) {
    fprintf(stderr, "%d mismatches (seed %u)\n", bad, seed);
    return 1;
  }
  printf("forward matches the sequential recurrence (%d outputs)\n", 2 * BT * DIM * L);
  return 0;
}
