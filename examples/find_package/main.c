/* A C program using an installed libselscan: one CPU forward with constant B and C (Bt=1, D=1, L=4, N=2),
 * checked against the recurrence h_t = exp(dt*A) h_{t-1} + dt*B*u_t, y_t = C.h_t. */
#include <selscan/selscan.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static selscan_tensor_t view(float* data, int ndim, const int64_t* sizes, const int64_t* strides) {
  selscan_tensor_t t;
  int i;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = SELSCAN_DTYPE_FLOAT32;
  t.ndim = ndim;
  for (i = 0; i < ndim; ++i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = strides[i];
  }
  return t;
}

int main(void) {
  float u[4] = {1.0f, -0.5f, 0.25f, 2.0f}, delta[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  float A[2] = {-1.0f, -0.5f}, B[2] = {0.5f, 1.0f}, C[2] = {2.0f, -1.0f}, out[4];
  const int64_t bdl[3] = {1, 1, 4}, bdl_s[3] = {4, 4, 1}, dn[2] = {1, 2}, dn_s[2] = {2, 1};
  selscan_fwd_args_t args;
  selscan_exec_t exec = SELSCAN_EXEC_INIT;
  selscan_status_t st;
  double h[2] = {0, 0};
  int t, n, bad = 0;

  printf("%s\n", selscan_build_info());
  if (selscan_version() != SELSCAN_VERSION) {
    fprintf(stderr, "header %d vs library %d\n", SELSCAN_VERSION, (int)selscan_version());
    return 1;
  }
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.u = view(u, 3, bdl, bdl_s);
  args.delta = view(delta, 3, bdl, bdl_s);
  args.A = view(A, 2, dn, dn_s);
  args.B = view(B, 2, dn, dn_s);
  args.C = view(C, 2, dn, dn_s);
  args.out = view(out, 3, bdl, bdl_s);
  st = selscan_fwd(&args, &exec);
  if (st != SELSCAN_STATUS_SUCCESS) {
    fprintf(stderr, "selscan_fwd: %s: %s\n", selscan_status_string(st), selscan_last_error());
    return 1;
  }
  for (t = 0; t < 4; ++t) {
    double y = 0;
    for (n = 0; n < 2; ++n) {
      h[n] = exp((double)delta[t] * A[n]) * h[n] + (double)delta[t] * B[n] * u[t];
      y += C[n] * h[n];
    }
    printf("y[%d] = %.6f (recurrence %.6f)\n", t, out[t], y);
    bad += !(fabs(out[t] - y) <= 1e-5 + 1e-5 * fabs(y));
  }
  return bad ? 1 : 0;
}
