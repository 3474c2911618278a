// The conv1d kernels for f16 tensors (kernels/conv1d/launch.cuh).
#include "launch.cuh"

SELSCAN_CONV1D_LAUNCHERS(f16, __half)
