// The conv1d kernels for f32 tensors (kernels/conv1d/launch.cuh).
#include "launch.cuh"

SELSCAN_CONV1D_LAUNCHERS(f32, float)
