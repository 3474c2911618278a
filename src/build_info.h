// What this build carries, from the generated configuration header (CMake writes it; see cmake/), with
// fallbacks so a file compiled outside the build still has definitions. The version comes from the public header.
#pragma once

#include "selscan/selscan.h"  // SELSCAN_VERSION_STRING

#if defined(__has_include)
#  if __has_include("selscan_build_config.h")
#    include "selscan_build_config.h"
#  endif
#endif

#ifndef SELSCAN_CUDA_VERSION
#  define SELSCAN_CUDA_VERSION "none"
#endif
#ifndef SELSCAN_CUDA_SASS
#  define SELSCAN_CUDA_SASS ""
#endif
#ifndef SELSCAN_CUDA_PTX
#  define SELSCAN_CUDA_PTX ""
#endif
