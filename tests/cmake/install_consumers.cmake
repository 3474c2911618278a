# Installed-tree checks, one STEP per ctest (install is the fixture the consumers need):
#   STEP=install      cmake --install into WORK_DIR/prefix and check the layout
#   STEP=find_package configure, build and run examples/find_package against that prefix
#   STEP=serving      the same for examples/serving (the serving API's example; it prints PASS or FAIL)
#   STEP=pkgconfig    compile examples/pkgconfig/main.c with `pkg-config --cflags --libs selscan` and run it
# Variables: BUILD_DIR SOURCE_DIR WORK_DIR CONFIG GENERATOR C_COMPILER LIBDIR [PKG_CONFIG]
cmake_minimum_required(VERSION 3.25)
foreach(var STEP BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR C_COMPILER LIBDIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_consumers.cmake: -D${var}=... is required")
  endif()
endforeach()
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "'${cmd}' failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE "${prefix}")
  set(config_args)
  if(CONFIG)
    set(config_args --config "${CONFIG}")
  endif()
  run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})
  foreach(f include/selscan/selscan.h "${LIBDIR}/libselscan.so" "${LIBDIR}/libselscan.so.0"
            "${LIBDIR}/cmake/selscan/selscanConfig.cmake" "${LIBDIR}/cmake/selscan/selscanConfigVersion.cmake"
            "${LIBDIR}/cmake/selscan/selscanTargets.cmake" "${LIBDIR}/pkgconfig/selscan.pc")
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "not installed: ${prefix}/${f}")
    endif()
  endforeach()
  # Internal headers and build-only files stay out of the installed tree.
  file(GLOB_RECURSE leaked "${prefix}/include/*problem.h" "${prefix}/include/*selscan_build_config.h")
  if(leaked)
    message(FATAL_ERROR "internal headers installed: ${leaked}")
  endif()
elseif(STEP STREQUAL "find_package" OR STEP STREQUAL "serving")
  # examples/<STEP> is a CMake project with find_package(selscan) and one executable.
  set(exe_find_package selscan_consumer)
  set(exe_serving selscan_serving_example)
  set(bin "${WORK_DIR}/${STEP}")
  file(REMOVE_RECURSE "${bin}")
  run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/examples/${STEP}" -B "${bin}" -G "${GENERATOR}"
      "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_C_COMPILER=${C_COMPILER}" -DCMAKE_BUILD_TYPE=Release
      "-Dselscan_DIR=${prefix}/${LIBDIR}/cmake/selscan")
  run("${CMAKE_COMMAND}" --build "${bin}")
  # The consumer must have picked the installed package, not the build tree.
  file(STRINGS "${bin}/CMakeCache.txt" found REGEX "^selscan_DIR:")
  if(NOT found MATCHES "${prefix}")
    message(FATAL_ERROR "find_package(selscan) did not use the installed prefix: ${found}")
  endif()
  run("${bin}/${exe_${STEP}}")
elseif(STEP STREQUAL "pkgconfig")
  if(NOT PKG_CONFIG)
    message(FATAL_ERROR "pkg-config not found")
  endif()
  set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
  execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs selscan RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                  ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --cflags --libs selscan failed: ${err}")
  endif()
  execute_process(COMMAND "${PKG_CONFIG}" --modversion selscan OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE)
  message(STATUS "pkg-config selscan ${version}: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(exe "${WORK_DIR}/selscan_pc_consumer")
  file(REMOVE "${exe}")
  run("${C_COMPILER}" -std=c99 "${SOURCE_DIR}/examples/pkgconfig/main.c" ${flags} -o "${exe}")
  run("${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${prefix}/${LIBDIR}" "${exe}")
else()
  message(FATAL_ERROR "unknown STEP '${STEP}'")
endif()
