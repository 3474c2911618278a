# cmake -DSELSCAN_SOURCE_DIR=<repo> -P arch_list_test.cmake
# The arch-list grammar (cmake/SelscanCudaArch.cmake) in script mode: valid lists -> the expected
# CMAKE_CUDA_ARCHITECTURES / SASS / PTX lists, bad entries -> the expected configure error.
cmake_minimum_required(VERSION 3.25)
include("${SELSCAN_SOURCE_DIR}/cmake/SelscanCudaArch.cmake")
# Every mismatch is a SEND_ERROR: the script runs to the end, reports all of them, and exits non-zero.

# expect_ok(<list> <cuda> <archs> <sass> <ptx>)   (lists given with ',' for readability)
function(expect_ok list cuda archs sass ptx)
  string(REPLACE "," ";" archs "${archs}")
  string(REPLACE "," ";" sass "${sass}")
  string(REPLACE "," ";" ptx "${ptx}")
  selscan_translate_arch_list("${list}" "${cuda}" "SELSCAN_CUDA_ARCH_LIST" "4.1.0" got_archs got_sass got_ptx err)
  if(err)
    message(SEND_ERROR "'${list}' with CUDA ${cuda}: unexpected error: ${err}")
  elseif(NOT got_archs STREQUAL archs OR NOT got_sass STREQUAL sass OR NOT got_ptx STREQUAL ptx)
    message(SEND_ERROR "'${list}' with CUDA ${cuda}: got archs '${got_archs}' sass '${got_sass}' ptx '${got_ptx}', "
                       "want '${archs}' '${sass}' '${ptx}'")
  endif()
endfunction()

# expect_error(<list> <cuda> <cmake version> <regex the message must match>)
function(expect_error list cuda cmake_version regex)
  selscan_translate_arch_list("${list}" "${cuda}" "SELSCAN_CUDA_ARCH_LIST" "${cmake_version}" a s p err)
  if(NOT err)
    message(SEND_ERROR "'${list}' with CUDA ${cuda}: accepted as '${a}', want an error matching '${regex}'")
  elseif(NOT err MATCHES "${regex}")
    message(SEND_ERROR "'${list}' with CUDA ${cuda}: error '${err}' does not match '${regex}'")
  endif()
endfunction()

# ---- numeric entries, separators, +PTX, suffixes
expect_ok("9.0" 13.0 "90-real" "90" "")
expect_ok("8.6" 12.4 "86-real" "86" "")
expect_ok("8.6+PTX" 12.4 "86" "86" "86")
expect_ok("9.0a" 12.4 "90a-real" "90a" "")
expect_ok("9.0a+PTX" 13.0 "90a" "90a" "90a")
expect_ok("8.0;9.0" 13.0 "80-real,90-real" "80,90" "")
expect_ok("8.0 9.0+PTX" 13.0 "80-real,90" "80,90" "90")
expect_ok("  8.0;  9.0 ; " 13.0 "80-real,90-real" "80,90" "")        # blanks and empty entries skipped
expect_ok("8.0,8.6" 12.8 "80-real,86-real" "80,86" "")
expect_ok("12.0+PTX;7.5;10.0;9.0" 13.0 "75-real,90-real,100-real,120" "75,90,100,120" "120")  # sorted
expect_ok("9.0;9.0+PTX;9.0" 13.0 "90" "90" "90")                    # duplicates merge, PTX wins
expect_ok("9.0;9.0a" 12.4 "90-real,90a-real" "90,90a" "")
expect_ok("8.6+ptx" 12.4 "86" "86" "86")
expect_ok("10.0f" 13.0 "100f-real" "100f" "")
expect_ok("7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX" 13.0
          "75-real,80-real,86-real,89-real,90-real,100-real,120" "75,80,86,89,90,100,120" "120")
expect_ok("3.5;9.0+PTX" 11.8 "35-real,90" "35,90" "90")
expect_ok("6.1" 12.4 "61-real" "61" "")

# ---- named architectures (torch's table)
expect_ok("Ampere" 12.4 "80-real,86" "80,86" "86")
expect_ok("Hopper" 13.0 "90" "90" "90")
expect_ok("Turing Ampere" 13.0 "75,80-real,86" "75,80,86" "75,86")
expect_ok("ada;hopper" 12.4 "89,90" "89,90" "89,90")               # names are case-insensitive
expect_ok("Ampere+Tegra" 12.4 "87-real" "87" "")
expect_ok("Blackwell" 12.8 "100-real,120" "100,120" "120")
expect_ok("Blackwell+Tegra" 12.8 "101-real" "101" "")                # Thor is sm_101 before CUDA 13
expect_ok("Blackwell+Tegra" 13.0 "110-real" "110" "")                # ... and sm_110 from 13.0 on
expect_ok("Ampere+Tegra+PTX" 12.4 "87" "87" "87")
expect_ok("Volta+PTX" 12.4 "70" "70" "70")

# ---- errors: unsupported by the toolkit (message names the entry and the range)
expect_error("6.1" 13.0 4.1.0
  "^SELSCAN_CUDA_ARCH_LIST entry '6\\.1' is not supported by CUDA 13\\.0 \\(supports 7\\.5 to 12\\.1\\)$")
expect_error("8.0;7.0;9.0" 13.0 4.1.0 "entry '7\\.0' is not supported by CUDA 13\\.0 \\(supports 7\\.5 to 12\\.1\\)")
expect_error("10.0" 11.8 4.1.0 "entry '10\\.0' is not supported by CUDA 11\\.8 \\(supports 3\\.5 to 9\\.0\\)")
expect_error("9.0a" 11.8 4.1.0 "entry '9\\.0a' is not supported by CUDA 11\\.8")
expect_error("12.0" 12.4 4.1.0 "entry '12\\.0' is not supported by CUDA 12\\.4 \\(supports 5\\.0 to 9\\.0\\)")
expect_error("10.1" 13.0 4.1.0 "entry '10\\.1' is not supported by CUDA 13\\.0")   # renamed to 11.0
expect_error("12.1" 12.8 4.1.0 "entry '12\\.1' is not supported by CUDA 12\\.8 \\(supports 5\\.0 to 12\\.0\\)")
expect_error("Pascal" 13.0 4.1.0 "entry 'Pascal' \\(6\\.0\\) is not supported by CUDA 13\\.0 \\(supports 7\\.5 to 12\\.1\\)")
expect_error("10.0f" 12.8 4.1.0 "entry '10\\.0f' is not supported by CUDA 12\\.8")
expect_error("9.1" 13.0 4.1.0 "entry '9\\.1' is not supported by CUDA 13\\.0")
expect_error("8.6" 11.0 4.1.0 "CUDA 11\\.0 \\(supports nothing: CUDA 11\\.8 or newer is required\\)")

# ---- errors: not an arch at all (typos); still names the entry and the range
expect_error("8.6x" 13.0 4.1.0 "entry '8\\.6x' is not a valid arch .*CUDA 13\\.0 supports 7\\.5 to 12\\.1")
expect_error("86" 13.0 4.1.0 "entry '86' is not a valid arch")
expect_error("Hoper" 13.0 4.1.0 "entry 'Hoper' is not a valid arch .*Hopper")
expect_error("sm_90" 13.0 4.1.0 "entry 'sm_90' is not a valid arch")
expect_error("9.0+PTX+PTX" 13.0 4.1.0 "entry '9\\.0\\+PTX\\+PTX' is not a valid arch")
expect_error("8.0;native" 13.0 4.1.0 "entry 'native' is not a valid arch")
expect_error("9.0b" 13.0 4.1.0 "entry '9\\.0b' is not a valid arch")
expect_error("" 13.0 4.1.0 "SELSCAN_CUDA_ARCH_LIST is empty")
expect_error(" ; ;" 13.0 4.1.0 "SELSCAN_CUDA_ARCH_LIST is empty")

# ---- errors: the 'f' suffix needs a CMake that knows it
expect_error("10.0f" 13.0 3.25.1 "entry '10\\.0f' needs CMake 3\\.31\\.8 or 4\\.0\\.2\\+")
expect_error("12.0f" 13.0 4.0.1 "needs CMake 3\\.31\\.8 or 4\\.0\\.2\\+")
expect_ok("12.0f" 13.0 "120f-real" "120f" "")

# ---- the message names the variable the list came from
selscan_translate_arch_list("6.1" 13.0 "TORCH_CUDA_ARCH_LIST" 4.1.0 a s p err)
if(NOT err MATCHES "^TORCH_CUDA_ARCH_LIST entry '6\\.1' is not supported by CUDA 13\\.0")
  message(SEND_ERROR "source name not in the message: '${err}'")
endif()

# ---- precedence: cache variable, then TORCH_CUDA_ARCH_LIST, then the default
function(expect_resolve cache env default want_list want_source)
  selscan_resolve_arch_list("${cache}" "${env}" "${default}" got source)
  if(NOT got STREQUAL want_list OR NOT source STREQUAL want_source)
    message(SEND_ERROR "resolve('${cache}', '${env}', '${default}') = '${got}' from '${source}', "
                       "want '${want_list}' from '${want_source}'")
  endif()
endfunction()
expect_resolve("8.0" "9.0" "7.5" "8.0" "SELSCAN_CUDA_ARCH_LIST")
expect_resolve("" "9.0" "7.5" "9.0" "TORCH_CUDA_ARCH_LIST")
expect_resolve("  " "9.0 10.0" "7.5" "9.0 10.0" "TORCH_CUDA_ARCH_LIST")
expect_resolve("" "" "7.5" "7.5" "the default arch list")

# ---- every per-toolkit default list is valid for its toolkit
foreach(cuda 11.8 12.4 12.8 12.9 13.0)
  selscan_default_arch_list(${cuda} list)
  selscan_translate_arch_list("${list}" ${cuda} "default" 4.1.0 a s p err)
  if(err OR NOT p)
    message(SEND_ERROR "default list for CUDA ${cuda} '${list}': error '${err}', ptx '${p}'")
  endif()
endforeach()

# ---- the per-toolkit defaults live only in the module: each cuda-X.Y preset names its toolkit and no arch list
file(READ "${SELSCAN_SOURCE_DIR}/CMakePresets.json" presets)
string(JSON n LENGTH "${presets}" configurePresets)
math(EXPR last "${n} - 1")
set(checked 0)
foreach(i RANGE ${last})
  string(JSON name GET "${presets}" configurePresets ${i} name)
  if(NOT name MATCHES "^cuda-([0-9]+\\.[0-9]+)$")
    continue()
  endif()
  set(cuda "${CMAKE_MATCH_1}")
  string(JSON preset_list ERROR_VARIABLE no_list GET "${presets}" configurePresets ${i} cacheVariables
         SELSCAN_CUDA_ARCH_DEFAULT)
  if(NOT no_list)
    message(SEND_ERROR "preset ${name} sets SELSCAN_CUDA_ARCH_DEFAULT '${preset_list}': the per-toolkit default "
                       "belongs in cmake/SelscanCudaArch.cmake only")
  endif()
  string(JSON wanted ERROR_VARIABLE json_err GET "${presets}" configurePresets ${i} cacheVariables
         SELSCAN_CUDA_TOOLKIT_VERSION)
  if(json_err)
    message(SEND_ERROR "preset ${name} does not set SELSCAN_CUDA_TOOLKIT_VERSION (${json_err})")
  elseif(NOT wanted STREQUAL cuda)
    message(SEND_ERROR "preset ${name}: SELSCAN_CUDA_TOOLKIT_VERSION is '${wanted}', want '${cuda}'")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(NOT checked EQUAL 4)
  message(SEND_ERROR "expected 4 cuda-X.Y presets in CMakePresets.json, checked ${checked}")
endif()

# ---- nvcc --version parsing
selscan_parse_nvcc_version("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n" v)
if(NOT v STREQUAL "13.0")
  message(SEND_ERROR "nvcc version parse: got '${v}'")
endif()
selscan_parse_nvcc_version("Cuda compilation tools, release 11.8, V11.8.89" v)
if(NOT v STREQUAL "11.8")
  message(SEND_ERROR "nvcc version parse: got '${v}'")
endif()
selscan_parse_nvcc_version("garbage" v)
if(NOT v STREQUAL "")
  message(SEND_ERROR "nvcc version parse of garbage: got '${v}'")
endif()

message(STATUS "arch_list_test done")
