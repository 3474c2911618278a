# cmake -DSELSCAN_SOURCE_DIR=<repo> -DWORK_DIR=<scratch> -DGENERATOR=Ninja -P configure_without_fmt.cmake
# Configures the real project as a machine without fmt's headers would (find_package(fmt) disabled) and checks that
# configuration stops with the one line that names the package to install on each platform.
cmake_minimum_required(VERSION 3.25)
foreach(var SELSCAN_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "configure_without_fmt.cmake: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SELSCAN_SOURCE_DIR}" -B "${WORK_DIR}" -G "${GENERATOR}"
                        -DSELSCAN_WITH_CUDA=OFF -DSELSCAN_BUILD_TESTS=OFF -DSELSCAN_BUILD_APPS=OFF
                        -DSELSCAN_BUILD_BENCH=OFF -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE "${WORK_DIR}")
string(REGEX REPLACE "[ \n]+" " " flat "${err}")   # CMake wraps long messages
if(rc EQUAL 0)
  message(FATAL_ERROR "configure without fmt succeeded; expected it to stop naming the fmt package")
endif()
foreach(re "needs the fmt library's headers" "libfmt-dev \\(Debian/Ubuntu\\)" "fmt-devel \\(Fedora/RHEL\\)"
           "fmt \\(conda-forge\\)" "fmt \\(Homebrew\\)")
  if(NOT flat MATCHES "${re}")
    message(FATAL_ERROR "configure without fmt failed, but its message lacks '${re}':\n${err}")
  endif()
endforeach()
message(STATUS "configure without fmt stops with the install hint")
