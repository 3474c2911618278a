/* A contiguous (row-major) float32 tensor descriptor for the C test programs of the ABI. Include it after a
 * selscan.h (any version: the descriptor has not changed since 0.1). */
#ifndef SELSCAN_TESTS_ABI_CONTIGUOUS_F32_H
#define SELSCAN_TESTS_ABI_CONTIGUOUS_F32_H

#include <string.h>

static selscan_tensor_t contiguous_f32(void* data, int ndim, const int64_t* sizes) {
  selscan_tensor_t t;
  int i;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = SELSCAN_DTYPE_FLOAT32;
  t.ndim = ndim;
  for (i = ndim - 1; i >= 0; --i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = i == ndim - 1 ? 1 : t.strides[i + 1] * sizes[i + 1];
  }
  return t;
}

#endif
