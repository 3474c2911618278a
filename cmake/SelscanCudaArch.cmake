# Arch-list grammar: TORCH_CUDA_ARCH_LIST-style entries -> CMAKE_CUDA_ARCHITECTURES, checked against what the
# CUDA toolkit can build. Pure functions (no enable_language, no cache writes) so tests/cmake can drive them in
# script mode with any toolkit version.
#
# Grammar (a superset of torch.utils.cpp_extension's):
#   list    := entry { sep entry }      sep := ';' | ' ' | ',' (empty entries are skipped)
#   entry   := X.Y[a|f][+PTX] | Name[+PTX]
#   Name    := Turing | Ampere | Ada | Hopper | Blackwell | ... (torch's table, combined names first)
# Lowering: X.Y -> XY-real (SASS only), X.Y+PTX -> XY (SASS + PTX), 9.0a -> 90a-real, 10.0f -> 100f-real.

# Torch's named architectures. Order matters only for display; names are matched whole (not by substring).
set(_SELSCAN_ARCH_NAMES
  "Kepler+Tesla=3.7" "Kepler=3.5+PTX" "Maxwell+Tegra=5.3" "Maxwell=5.0,5.2+PTX" "Pascal=6.0,6.1+PTX"
  "Volta+Tegra=7.2" "Volta=7.0+PTX" "Turing=7.5+PTX" "Ampere+Tegra=8.7" "Ampere=8.0,8.6+PTX" "Ada=8.9+PTX"
  "Hopper=9.0+PTX" "Blackwell+Tegra=@THOR@" "Blackwell=10.0,12.0+PTX")

# Every arch (as sm number, suffix included) the toolkit `version` (MAJOR.MINOR) can compile, and the human
# range "X.Y to X.Y". Sources: CMake's CMakeCUDAArchitecturesAll table, the CUDA release notes (13.0 dropped
# sm_50..72 and renamed sm_101 to sm_110), rapids-cmake/NCCL defaults.
function(selscan_cuda_supported_archs version out_list out_range)
  set(all)
  if(version VERSION_LESS 11.8)
    set(${out_list} "" PARENT_SCOPE)
    set(${out_range} "nothing: CUDA 11.8 or newer is required" PARENT_SCOPE)
    return()
  elseif(version VERSION_LESS 12.0)
    list(APPEND all 35 37 50 52 53 60 61 62 70 72 75 80 86 87 89 90)
    set(range "3.5 to 9.0")
  elseif(version VERSION_LESS 12.8)
    list(APPEND all 50 52 53 60 61 62 70 72 75 80 86 87 89 90 90a)
    set(range "5.0 to 9.0")
  elseif(version VERSION_LESS 12.9)
    list(APPEND all 50 52 53 60 61 62 70 72 75 80 86 87 89 90 90a 100 100a 101 101a 120 120a)
    set(range "5.0 to 12.0")
  elseif(version VERSION_LESS 13.0)
    list(APPEND all 50 52 53 60 61 62 70 72 75 80 86 87 89 90 90a 100 100a 100f 101 101a 101f 103 103a 103f
                    120 120a 120f 121 121a 121f)
    set(range "5.0 to 12.1")
  else()
    list(APPEND all 75 80 86 87 88 89 90 90a 100 100a 100f 103 103a 103f 110 110a 110f 120 120a 120f
                    121 121a 121f)
    set(range "7.5 to 12.1")
  endif()
  set(${out_list} "${all}" PARENT_SCOPE)
  set(${out_range} "${range}" PARENT_SCOPE)
endfunction()

# "Cuda compilation tools, release 13.0, V13.0.88" -> "13.0" ("" when the text has no release line).
function(selscan_parse_nvcc_version text out)
  if(text MATCHES "release ([0-9]+)\\.([0-9]+)")
    set(${out} "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# Which list applies: the SELSCAN_CUDA_ARCH_LIST cache value, else the TORCH_CUDA_ARCH_LIST environment
# variable, else the default (preset's SELSCAN_CUDA_ARCH_DEFAULT or the per-toolkit default). Blank = unset.
function(selscan_resolve_arch_list cache_value env_value default_value out_list out_source)
  string(STRIP "${cache_value}" cache_value)
  string(STRIP "${env_value}" env_value)
  if(NOT cache_value STREQUAL "")
    set(${out_list} "${cache_value}" PARENT_SCOPE)
    set(${out_source} "SELSCAN_CUDA_ARCH_LIST" PARENT_SCOPE)
  elseif(NOT env_value STREQUAL "")
    set(${out_list} "${env_value}" PARENT_SCOPE)
    set(${out_source} "TORCH_CUDA_ARCH_LIST" PARENT_SCOPE)
  else()
    set(${out_list} "${default_value}" PARENT_SCOPE)
    set(${out_source} "the default arch list" PARENT_SCOPE)
  endif()
endfunction()

# The per-toolkit default list, used when neither the user nor a preset (dev, ci) gave one: what the cuda-X.Y
# presets, the release wheel (tools/build-wheel.sh) and a plain `pip install` build. The one place these lists live.
function(selscan_default_arch_list version out)
  if(version VERSION_LESS 12.8)
    set(${out} "7.5;8.0;8.6;8.9;9.0+PTX" PARENT_SCOPE)
  else()
    set(${out} "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX" PARENT_SCOPE)
  endif()
endfunction()

# Translate `arch_list` for toolkit `version`.
#   out_archs : CMAKE_CUDA_ARCHITECTURES value, e.g. "80-real;90" (sorted, deduplicated)
#   out_sass  : real targets as sm numbers, e.g. "80;90"
#   out_ptx   : virtual (PTX) targets, e.g. "90"
#   out_error : "" on success, else the message to fail configuration with (names the entry and the range)
# `source` names where the list came from, for the message ("SELSCAN_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST").
# `cmake_version` is the CMake version to check the 'f' suffix against (CMAKE_VERSION in real use).
function(selscan_translate_arch_list arch_list version source cmake_version out_archs out_sass out_ptx out_error)
  set(${out_archs} "" PARENT_SCOPE)
  set(${out_sass} "" PARENT_SCOPE)
  set(${out_ptx} "" PARENT_SCOPE)
  selscan_cuda_supported_archs("${version}" supported range)
  set(names)
  foreach(pair IN LISTS _SELSCAN_ARCH_NAMES)
    string(REGEX REPLACE "=.*" "" name "${pair}")
    list(APPEND names "${name}")
  endforeach()
  list(JOIN names ", " names_text)
  set(expect "expected X.Y[a|f][+PTX] such as 8.6, 9.0a or 12.0+PTX, or a name: ${names_text}")

  string(REGEX REPLACE "[ \t\n,;]+" ";" entries "${arch_list}")
  list(REMOVE_ITEM entries "")
  if(NOT entries)
    set(${out_error} "${source} is empty (${expect}); CUDA ${version} supports ${range}" PARENT_SCOPE)
    return()
  endif()

  # Expand names first so each numeric entry is checked once, remembering what the user wrote for messages.
  set(expanded)   # pairs "numeric|original"
  foreach(entry IN LISTS entries)
    set(ptx "")
    set(base "${entry}")
    if(base MATCHES "^(.*)\\+[Pp][Tt][Xx]$")
      set(base "${CMAKE_MATCH_1}")
      set(ptx "+PTX")
    endif()
    set(found "")
    foreach(pair IN LISTS _SELSCAN_ARCH_NAMES)
      string(REGEX MATCH "^([^=]+)=(.*)$" _ "${pair}")
      set(name "${CMAKE_MATCH_1}")
      set(value "${CMAKE_MATCH_2}")
      # Case-insensitive name match: "hopper" is as clear as "Hopper".
      string(TOLOWER "${name}" lname)
      string(TOLOWER "${base}" lbase)
      if(lname STREQUAL lbase)
        # sm_101 (Thor) became sm_110 in CUDA 13.0.
        if(value STREQUAL "@THOR@")
          if(version VERSION_LESS 13.0)
            set(value "10.1")
          else()
            set(value "11.0")
          endif()
        endif()
        string(REPLACE "," ";" value "${value}")
        foreach(v IN LISTS value)
          # A trailing '+PTX' on the name makes every member carry PTX.
          if(ptx AND NOT v MATCHES "\\+PTX$")
            set(v "${v}+PTX")
          endif()
          list(APPEND expanded "${v}|${entry}")
        endforeach()
        set(found TRUE)
        break()
      endif()
    endforeach()
    if(NOT found)
      list(APPEND expanded "${entry}|${entry}")
    endif()
  endforeach()

  set(real_targets)
  set(ptx_targets)
  foreach(item IN LISTS expanded)
    string(REGEX MATCH "^([^|]*)\\|(.*)$" _ "${item}")
    set(entry "${CMAKE_MATCH_1}")
    set(original "${CMAKE_MATCH_2}")
    if(original STREQUAL entry)
      set(what "entry '${entry}'")
    else()
      set(what "entry '${original}' (${entry})")
    endif()
    if(NOT entry MATCHES "^([0-9]+)\\.([0-9])([af]?)(\\+[Pp][Tt][Xx])?$")
      set(${out_error} "${source} ${what} is not a valid arch (${expect}); CUDA ${version} supports ${range}"
          PARENT_SCOPE)
      return()
    endif()
    set(sm "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
    set(suffix "${CMAKE_MATCH_3}")
    set(has_ptx "${CMAKE_MATCH_4}")
    if(NOT sm IN_LIST supported)
      set(${out_error} "${source} ${what} is not supported by CUDA ${version} (supports ${range})" PARENT_SCOPE)
      return()
    endif()
    # CMake learned the 'f' (family) suffix in 3.31.8 and 4.0.2 (4.0.0/4.0.1 lack it).
    if(suffix STREQUAL "f" AND (cmake_version VERSION_LESS 3.31.8
        OR (cmake_version VERSION_GREATER_EQUAL 4.0 AND cmake_version VERSION_LESS 4.0.2)))
      set(${out_error} "${source} ${what} needs CMake 3.31.8 or 4.0.2+ for the 'f' suffix (this is CMake ${cmake_version})"
          PARENT_SCOPE)
      return()
    endif()
    list(APPEND real_targets "${sm}")
    if(has_ptx)
      list(APPEND ptx_targets "${sm}")
    endif()
  endforeach()

  list(REMOVE_DUPLICATES real_targets)
  list(REMOVE_DUPLICATES ptx_targets)
  list(SORT real_targets COMPARE NATURAL)
  list(SORT ptx_targets COMPARE NATURAL)
  set(archs)
  foreach(sm IN LISTS real_targets)
    if(sm IN_LIST ptx_targets)
      list(APPEND archs "${sm}")        # SASS + PTX
    else()
      list(APPEND archs "${sm}-real")   # SASS only
    endif()
  endforeach()
  set(${out_archs} "${archs}" PARENT_SCOPE)
  set(${out_sass} "${real_targets}" PARENT_SCOPE)
  set(${out_ptx} "${ptx_targets}" PARENT_SCOPE)
  set(${out_error} "" PARENT_SCOPE)
endfunction()

# Find nvcc before enable_language(CUDA) (the arch list must be checked against the toolkit first) and report
# it with its MAJOR.MINOR version. Looks at CMAKE_CUDA_COMPILER, CUDAToolkit_ROOT (cache or environment),
# CUDACXX, PATH, then /usr/local/cuda. Sets out_nvcc to "" when none is found.
function(selscan_find_nvcc out_nvcc out_version)
  set(nvcc "")
  if(CMAKE_CUDA_COMPILER)
    set(nvcc "${CMAKE_CUDA_COMPILER}")
  elseif(CUDAToolkit_ROOT)
    set(nvcc "${CUDAToolkit_ROOT}/bin/nvcc")
  elseif(DEFINED ENV{CUDAToolkit_ROOT})
    set(nvcc "$ENV{CUDAToolkit_ROOT}/bin/nvcc")
  elseif(DEFINED ENV{CUDACXX})
    set(nvcc "$ENV{CUDACXX}")
  else()
    find_program(_selscan_nvcc nvcc PATHS /usr/local/cuda/bin NO_CACHE)
    if(_selscan_nvcc)
      set(nvcc "${_selscan_nvcc}")
    endif()
  endif()
  set(version "")
  if(nvcc AND EXISTS "${nvcc}")
    execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE text ERROR_VARIABLE text RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      selscan_parse_nvcc_version("${text}" version)
    endif()
  endif()
  set(${out_nvcc} "${nvcc}" PARENT_SCOPE)
  set(${out_version} "${version}" PARENT_SCOPE)
endfunction()
