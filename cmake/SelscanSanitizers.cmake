# Sanitizer and fuzzing builds of the host code (presets `asan`, `tsan`, `fuzz`; docs/reliability.md).
# Included by the top-level CMakeLists.txt before any target exists, so the flags reach the library objects,
# the tests and the apps alike. Does nothing unless SELSCAN_SANITIZE or SELSCAN_BUILD_FUZZ is set.
set(SELSCAN_SANITIZE "" CACHE STRING
    "Sanitizers for the host (C/C++) code, as for -fsanitize=: e.g. address,undefined or thread; empty: none")
option(SELSCAN_BUILD_FUZZ "Build the libFuzzer target in tests/fuzz (clang only; adds address,undefined)" OFF)

set(_selscan_sanitize "${SELSCAN_SANITIZE}")
if(SELSCAN_BUILD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SELSCAN_BUILD_FUZZ needs clang (libFuzzer), got ${CMAKE_CXX_COMPILER_ID}; configure with "
                        "the `fuzz` preset or -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(_selscan_sanitize STREQUAL "")
    set(_selscan_sanitize "address,undefined")
  endif()
endif()

if(NOT _selscan_sanitize STREQUAL "")
  if(MSVC)
    message(FATAL_ERROR "SELSCAN_SANITIZE is for GCC/clang builds")
  endif()
  # Stop at the first report (a UBSan finding must fail the test, not scroll by); frames for readable stacks.
  set(_selscan_san_flags "-fsanitize=${_selscan_sanitize}" -fno-omit-frame-pointer)
  if(NOT _selscan_sanitize MATCHES "thread")
    list(APPEND _selscan_san_flags -fno-sanitize-recover=all)
  endif()
  if(SELSCAN_BUILD_FUZZ)
    list(APPEND _selscan_san_flags -fsanitize=fuzzer-no-link)  # coverage feedback from the library's code too
  endif()
  # Host code only: nvcc does not take these flags (the sanitizer presets are CPU-only anyway).
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_selscan_san_flags}>")
  add_link_options("-fsanitize=${_selscan_sanitize}")
  message(STATUS "selscan: host code built with -fsanitize=${_selscan_sanitize} (fuzz target: ${SELSCAN_BUILD_FUZZ})")
endif()
# Read by the library target: the shipped .so links with --no-undefined only without sanitizers (clang leaves
# the sanitizer runtime to the executable, so its symbols are undefined in the library).
set(SELSCAN_SANITIZERS_ACTIVE "${_selscan_sanitize}")
