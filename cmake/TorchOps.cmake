# selscan_torch_ops (SELSCAN_TORCH_OPS, OFF by default): the decode step and the scan's forward as torch ops built
# against PyTorch's stable ABI (src/torch_ops/stable_ops.cpp), loaded by selscan.torch with torch.ops.load_library.
#
# It does not link libpython, and it names libtorch.so only by its soname (DT_NEEDED, no RUNPATH to torch): the
# loader then takes the libtorch already loaded in the process. The NEEDED entry is needed because Python imports
# torch with RTLD_LOCAL, so torch's C shim (aoti_torch_*, in libtorch_cpu.so) is not in the global symbol scope: a
# library without it fails to load with "undefined symbol: aoti_torch_library_init_fragment". Through libtorch.so's
# own NEEDED entries the lookup scope also holds libtorch_cuda.so when torch has CUDA (the current CUDA stream).
# TORCH_TARGET_VERSION makes the headers use only what SELSCAN_TORCH_TARGET_VERSION's torch had, so one build
# loads in that torch and every newer one.
option(SELSCAN_TORCH_OPS "Build selscan_torch_ops, the torch op library on PyTorch's stable ABI (needs torch >= 2.9's headers)" OFF)
set(SELSCAN_TORCH_INCLUDE "" CACHE PATH
    "torch's include directory (the one holding torch/csrc/stable; libtorch.so is looked for in ../lib). Empty: asked of python3's torch")
set(SELSCAN_TORCH_TARGET_VERSION "2.9" CACHE STRING
    "Oldest torch (MAJOR.MINOR, >= 2.9) the op library must load in (TORCH_TARGET_VERSION)")

if(NOT SELSCAN_TORCH_OPS)
  return()
endif()
if(NOT SELSCAN_BUILD_SHARED OR WIN32 OR APPLE)
  message(FATAL_ERROR "SELSCAN_TORCH_OPS needs the shared libselscan on Linux (SELSCAN_BUILD_SHARED=ON)")
endif()

find_package(Python3 COMPONENTS Interpreter QUIET)
set(_selscan_torch_include "${SELSCAN_TORCH_INCLUDE}")
if(_selscan_torch_include STREQUAL "")
  if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "SELSCAN_TORCH_OPS: no python3 to ask for torch's headers; set SELSCAN_TORCH_INCLUDE to torch's "
                        "include directory")
  endif()
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))"
    OUTPUT_VARIABLE _selscan_torch_include ERROR_VARIABLE _selscan_torch_err RESULT_VARIABLE _selscan_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _selscan_torch_rc EQUAL 0)
    message(FATAL_ERROR "SELSCAN_TORCH_OPS: ${Python3_EXECUTABLE} could not import torch (${_selscan_torch_err}); "
                        "install torch >= 2.9 or set SELSCAN_TORCH_INCLUDE")
  endif()
endif()
set(_selscan_torch_version_h "${_selscan_torch_include}/torch/headeronly/version.h")
if(NOT EXISTS "${_selscan_torch_include}/torch/csrc/stable/library.h" OR NOT EXISTS "${_selscan_torch_version_h}")
  message(FATAL_ERROR "SELSCAN_TORCH_OPS: ${_selscan_torch_include} has no torch/csrc/stable/library.h or "
                      "torch/headeronly/version.h: torch >= 2.9's headers are needed")
endif()
file(STRINGS "${_selscan_torch_version_h}" _selscan_torch_version_lines
     REGEX "^#define TORCH_VERSION_(MAJOR|MINOR) ")
string(REGEX MATCH "MAJOR ([0-9]+)" _ "${_selscan_torch_version_lines}")
set(_selscan_torch_major "${CMAKE_MATCH_1}")
string(REGEX MATCH "MINOR ([0-9]+)" _ "${_selscan_torch_version_lines}")
set(_selscan_torch_headers "${_selscan_torch_major}.${CMAKE_MATCH_1}")
if(NOT SELSCAN_TORCH_TARGET_VERSION MATCHES "^([0-9]+)\\.([0-9]+)$")
  message(FATAL_ERROR "SELSCAN_TORCH_TARGET_VERSION is '${SELSCAN_TORCH_TARGET_VERSION}', expected MAJOR.MINOR")
endif()
set(_selscan_target_major "${CMAKE_MATCH_1}")
set(_selscan_target_minor "${CMAKE_MATCH_2}")
if(SELSCAN_TORCH_TARGET_VERSION VERSION_LESS 2.9 OR _selscan_torch_headers VERSION_LESS SELSCAN_TORCH_TARGET_VERSION)
  message(FATAL_ERROR "SELSCAN_TORCH_OPS: the headers in ${_selscan_torch_include} are torch ${_selscan_torch_headers}; "
                      "targeting torch ${SELSCAN_TORCH_TARGET_VERSION} needs headers of that torch or newer, and "
                      "the stable ABI starts at 2.9")
endif()

cmake_path(GET _selscan_torch_include PARENT_PATH _selscan_torch_root)
set(_selscan_libtorch "${_selscan_torch_root}/lib/libtorch.so")
if(NOT EXISTS "${_selscan_libtorch}")
  message(FATAL_ERROR "SELSCAN_TORCH_OPS: no ${_selscan_libtorch} beside torch's headers")
endif()

add_library(selscan_torch_ops SHARED src/torch_ops/stable_ops.cpp)
target_include_directories(selscan_torch_ops SYSTEM PRIVATE "${_selscan_torch_include}")
# libtorch.so defines none of the symbols used (its dependencies do), so --as-needed would drop it.
target_link_libraries(selscan_torch_ops PRIVATE selscan "-Wl,--no-as-needed" "${_selscan_libtorch}"
                      "-Wl,--as-needed")
if(_selscan_torch_headers VERSION_GREATER 2.9)
  # torch/csrc/stable/version.h: 0xMMmm000000000000. 2.9's headers have no targeting (and need none).
  math(EXPR _selscan_torch_target "(${_selscan_target_major} << 56) | (${_selscan_target_minor} << 48)"
       OUTPUT_FORMAT HEXADECIMAL)
  target_compile_definitions(selscan_torch_ops PRIVATE "TORCH_TARGET_VERSION=${_selscan_torch_target}ULL")
endif()
set(_selscan_torch_ops_map "${PROJECT_SOURCE_DIR}/cmake/selscan_torch_ops.map")
# Torch needs no symbol of it (the registrations run from static initialisers): export none, not even the
# C++ runtime's template instantiations.
target_link_options(selscan_torch_ops PRIVATE "LINKER:--version-script=${_selscan_torch_ops_map}")
# $ORIGIN: libselscan beside it (build tree and package alike), and no path to torch's directory.
set_target_properties(selscan_torch_ops PROPERTIES
  SKIP_BUILD_RPATH OFF
  BUILD_WITH_INSTALL_RPATH ON
  INSTALL_RPATH "$ORIGIN"
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  LINK_DEPENDS "${_selscan_torch_ops_map}")
message(STATUS "selscan: selscan_torch_ops against torch ${_selscan_torch_headers}'s headers "
               "(${_selscan_torch_include}), targeting torch >= ${SELSCAN_TORCH_TARGET_VERSION}")

if(SELSCAN_BUILD_TESTS AND Python3_Interpreter_FOUND)
  add_test(NAME python.torch_stable_ops
    COMMAND "${Python3_EXECUTABLE}" -m pytest "${PROJECT_SOURCE_DIR}/python/tests/test_torch_stable_ops.py" -q -rs
            -p no:cacheprovider)
  set_tests_properties(python.torch_stable_ops PROPERTIES LABELS cpu TIMEOUT 600
    ENVIRONMENT "SELSCAN_LIBRARY=$<TARGET_FILE:selscan>;SELSCAN_TORCH_OPS_LIBRARY=$<TARGET_FILE:selscan_torch_ops>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
endif()
