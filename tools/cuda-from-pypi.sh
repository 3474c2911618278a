#!/usr/bin/env bash
# A CUDA 13.x toolkit from PyPI, enough to build libselscan: NVIDIA's `cuda-toolkit` metapackage with the extras
# nvcc (nvcc, ptxas, fatbinary, nvlink, cudafe++, cicc/nvvm, the crt headers, the runtime with
# libcudart_static.a), cccl (CUB, Thrust, libcu++) and cuobjdump (for the embedded-targets test), installed with
# `pip install --target` into a folder, no root and no system toolkit needed. Prints the CMake arguments that
# select it; the cuda-pypi preset uses the default folder.
#
# Usage: tools/cuda-from-pypi.sh [VERSION] [DIR]
#   VERSION  CUDA release, MAJOR.MINOR or MAJOR (default 13.5; 13 = the newest 13.x on PyPI)
#   DIR      where to install (default build/toolkits/cuda-pypi in the checkout, where the cuda-pypi preset looks)
# The toolkit lands in DIR/nvidia/cu13 (bin/nvcc, include/, include/cccl/, lib/, nvvm/): the layout of every
# CUDA 13 wheel. Running it again with a toolkit of that version already in DIR installs nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VERSION=${1:-13.5}
DIR=${2:-$PWD/build/toolkits/cuda-pypi}
PYTHON=${PYTHON:-python3}
case "$VERSION" in
  13|13.[0-9]*) ;;
  *) echo "cuda-from-pypi: VERSION '$VERSION': expected 13 or 13.MINOR (the nvidia/cu13 wheel layout; CUDA 12" \
          "wheels put each component in its own folder, which this script does not assemble)" >&2; exit 2 ;;
esac
case "$DIR" in /*) ;; *) DIR=$PWD/$DIR ;; esac
ROOT=$DIR/nvidia/cu13
NVCC=$ROOT/bin/nvcc

nvcc_release() { "$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p'; }
have=""
if [ -x "$NVCC" ]; then have=$(nvcc_release); fi
if [ -n "$have" ] && { [ "$have" = "$VERSION" ] || [ "${have%%.*}" = "$VERSION" ]; }; then
  echo "cuda-from-pypi: CUDA $have already in $ROOT"
else
  rm -rf "$DIR"
  t0=$SECONDS
  # --target installs outside any environment (so also past Debian's PEP 668 guard). The resolver's notes about
  # packages of the calling environment (a torch that pins another cuda-toolkit) do not concern this folder.
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile --root-user-action=ignore \
    --target "$DIR" "cuda-toolkit[nvcc,cccl,cuobjdump]==$VERSION.*" 2>&1 |
    grep -v -e "dependency resolver does not currently take into account" -e "which is incompatible" >&2 || true
  if [ ! -x "$NVCC" ]; then
    echo "cuda-from-pypi: pip did not install $NVCC (is 'cuda-toolkit==$VERSION.*' on the package index?)" >&2
    exit 1
  fi
  have=$(nvcc_release)
  echo "cuda-from-pypi: installed CUDA $have into $ROOT in $((SECONDS - t0)) s ($(du -sh "$DIR" | cut -f1))"
fi
# The wheels carry the runtime as run-time files only (libcudart.so.13, no unversioned name). CMake's
# FindCUDAToolkit requires a library named libcudart.so and would otherwise take one from another toolkit
# (/usr/local/lib, /usr/lib) or fail; libselscan links libcudart_static.a, this link only lets the search succeed.
if [ ! -e "$ROOT/lib/libcudart.so" ]; then
  ln -s "$(basename "$(ls "$ROOT"/lib/libcudart.so.[0-9]* | head -1)")" "$ROOT/lib/libcudart.so"
fi
echo "cuda-from-pypi: $("$NVCC" --version | tail -2 | head -1)"
echo "cuda-from-pypi: configure with: -DCUDAToolkit_ROOT=$ROOT -DCMAKE_CUDA_COMPILER=$NVCC"
echo "cuda-from-pypi: pip install with: CUDACXX=$NVCC"
