// The conv1d kernels for bf16 tensors (kernels/conv1d/launch.cuh).
#include "launch.cuh"

SELSCAN_CONV1D_LAUNCHERS(bf16, __nv_bfloat16)
