# cmake -DLIB=libselscan.so -DREADELF=readelf -DGLIBC=2.34 -DGLIBCXX=3.4.29 -DCXXABI=1.3.9 -P check_symbol_versions.cmake
# Fails when the library needs a glibc, libstdc++ (GLIBCXX) or C++ ABI (CXXABI) symbol version above the stated
# floor (CMakeLists.txt: SELSCAN_GLIBC_FLOOR and its two siblings), so that a new dependency cannot raise the
# systems a wheel installs on without someone changing the floor on purpose. An empty floor forbids the family.
cmake_minimum_required(VERSION 3.25)
foreach(var LIB READELF)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_symbol_versions.cmake: -D${var}=... is required")
  endif()
endforeach()
execute_process(COMMAND "${READELF}" -V -W "${LIB}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -V ${LIB} failed (${rc}): ${err}")
endif()
# The version-needs entries: "Name: GLIBC_2.34  Flags: none  Version: 5".
string(REGEX MATCHALL "Name: (GLIBC|GLIBCXX|CXXABI)_[0-9.]+" needs "${out}")
set(worst_GLIBC "")
set(worst_GLIBCXX "")
set(worst_CXXABI "")
set(over)
foreach(n IN LISTS needs)
  string(REGEX MATCH "(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)" _ "${n}")
  set(family "${CMAKE_MATCH_1}")
  set(ver "${CMAKE_MATCH_2}")
  if(worst_${family} STREQUAL "" OR ver VERSION_GREATER worst_${family})
    set(worst_${family} "${ver}")
  endif()
  if(NOT DEFINED ${family} OR "${${family}}" STREQUAL "" OR ver VERSION_GREATER "${${family}}")
    list(APPEND over "${family}_${ver} (floor: ${family} ${${family}})")
  endif()
endforeach()
list(REMOVE_DUPLICATES over)
if(over)
  list(JOIN over ", " what)
  message(FATAL_ERROR "${LIB} needs symbol versions above the stated floor: ${what}. Lower the dependency, or "
                      "raise SELSCAN_GLIBC_FLOOR / SELSCAN_GLIBCXX_FLOOR / SELSCAN_CXXABI_FLOOR on purpose "
                      "(docs/building.md, \"Platform floor\").")
endif()
message(STATUS "symbol versions needed: GLIBC ${worst_GLIBC}, GLIBCXX ${worst_GLIBCXX}, CXXABI ${worst_CXXABI}; "
               "floor GLIBC ${GLIBC}, GLIBCXX ${GLIBCXX}, CXXABI ${CXXABI}")
