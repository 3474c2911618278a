# cmake -DSELSCAN_SOURCE_DIR=<repo> -DWORK_DIR=<scratch> -DNVCC=<nvcc> -DCUDA_VERSION=13.0 -DGENERATOR=Ninja
#       -P configure_bad_arch.cmake
# Configures the real project with arch lists this toolkit cannot build and checks that configuration fails
# before anything is compiled, with a message naming the entry and the toolkit's range; also that
# TORCH_CUDA_ARCH_LIST from the environment is used (and named) when SELSCAN_CUDA_ARCH_LIST is unset.
cmake_minimum_required(VERSION 3.25)
foreach(var SELSCAN_SOURCE_DIR WORK_DIR NVCC CUDA_VERSION GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "configure_bad_arch.cmake: -D${var}=... is required")
  endif()
endforeach()
include("${SELSCAN_SOURCE_DIR}/cmake/SelscanCudaArch.cmake")
selscan_cuda_supported_archs("${CUDA_VERSION}" supported range)
string(REPLACE "." "\\." range_re "${range}")
string(REPLACE "." "\\." cuda_re "${CUDA_VERSION}")

# An entry below every supported toolkit's minimum (3.0, Kepler), a typo, and the same through the environment.
# (Separators here are spaces and commas: ';' inside one command-line argument is a CMake list separator.)
set(cases
  "SELSCAN_CUDA_ARCH_LIST|8.0 3.0|SELSCAN_CUDA_ARCH_LIST entry '3\\.0' is not supported by CUDA ${cuda_re} \\(supports ${range_re}\\)"
  "SELSCAN_CUDA_ARCH_LIST|8.6x|SELSCAN_CUDA_ARCH_LIST entry '8\\.6x' is not a valid arch"
  "TORCH_CUDA_ARCH_LIST|9.0,3.0|TORCH_CUDA_ARCH_LIST entry '3\\.0' is not supported by CUDA ${cuda_re}")
set(i 0)
foreach(case IN LISTS cases)
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 how)
  list(GET parts 1 value)
  list(GET parts 2 regex)
  set(dir "${WORK_DIR}/${i}")
  file(REMOVE_RECURSE "${dir}")
  set(args -S "${SELSCAN_SOURCE_DIR}" -B "${dir}" -G "${GENERATOR}" -DSELSCAN_WITH_CUDA=ON
           "-DCMAKE_CUDA_COMPILER=${NVCC}" -DSELSCAN_BUILD_TESTS=OFF -DSELSCAN_BUILD_APPS=OFF)
  if(how STREQUAL "TORCH_CUDA_ARCH_LIST")
    set(cmd "${CMAKE_COMMAND}" -E env "TORCH_CUDA_ARCH_LIST=${value}" "${CMAKE_COMMAND}" ${args})
  else()
    set(cmd "${CMAKE_COMMAND}" -E env --unset=TORCH_CUDA_ARCH_LIST "${CMAKE_COMMAND}" ${args}
            "-DSELSCAN_CUDA_ARCH_LIST=${value}")
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX REPLACE "[ \n]+" " " flat "${err}")   # CMake wraps long messages
  if(rc EQUAL 0)
    message(SEND_ERROR "${how}='${value}': configuration succeeded, expected it to fail")
  elseif(NOT flat MATCHES "${regex}")
    message(SEND_ERROR "${how}='${value}': failed, but the message does not match '${regex}':\n${err}")
  elseif(EXISTS "${dir}/build.ninja" OR EXISTS "${dir}/Makefile")
    message(SEND_ERROR "${how}='${value}': a build system was generated despite the error")
  else()
    message(STATUS "${how}='${value}': rejected as expected")
  endif()
  file(REMOVE_RECURSE "${dir}")
  math(EXPR i "${i} + 1")
endforeach()
