#!/usr/bin/env python3
"""Builds causal-conv1d's `causal_conv1d_cuda` extension (Dao-AILab/causal-conv1d, csrc/) as a torch extension and
puts its `causal_conv1d` package beside it, so that one PYTHONPATH entry makes `import causal_conv1d` work: the
baseline of bench/upstream_conv1d.py and the source of tests/data/conv1d_golden. Not part of the library; needs
torch with CUDA, an nvcc and ninja; no pip, no network.

    git -C /path/to/causal-conv1d archive HEAD | (mkdir -p .upstream-conv && tar -x -C .upstream-conv)
    python3 bench/build_causal_conv1d.py .upstream-conv --out build/conv-upstream --arch 9.0 --jobs 16
    PYTHONPATH=build/conv-upstream python3 bench/upstream_conv1d.py --json conv-upstream.json

The flags are the ones upstream's setup.py passes nvcc (fast math, the half/bfloat16 operators enabled, ptxas
verbose: --verbose shows its register and spill lines); only the targets differ: the given arch list instead of
upstream's sm_75..sm_121 list. Upstream's `--threads 4` is left out: with one arch there is nothing to split.
"""

import os
import shutil
import subprocess
import sys

import upstream_ext  # bench/upstream_ext.py: what this and build_upstream.py share

PROG = "build_causal_conv1d"
# csrc/ files of setup.py's CUDAExtension, and the package that wraps the extension.
SOURCES = ["causal_conv1d.cpp", "causal_conv1d_fwd.cu", "causal_conv1d_bwd.cu", "causal_conv1d_update.cu"]
PACKAGE_FILES = ["__init__.py", "causal_conv1d_interface.py", "cpp_functions.py"]


def main():
    args = upstream_ext.arg_parser(PROG, __doc__.split("\n\n")[0],
                                   "a checkout (or `git archive` export) of Dao-AILab/causal-conv1d",
                                   "build/conv-upstream").parse_args()
    what = "Dao-AILab/causal-conv1d"
    src, sources = upstream_ext.find_sources(PROG, args.checkout, "csrc", SOURCES, what)
    pkg, _ = upstream_ext.find_sources(PROG, args.checkout, "causal_conv1d", PACKAGE_FILES, what)
    path = upstream_ext.build(PROG, "causal_conv1d_cuda", sources, args, include_dirs=[src], cflags=["-O3"],
                              cuda_cflags=upstream_ext.NVCC_COMMON + ["--ptxas-options=-v"])
    if path is None:
        return
    out = os.path.dirname(path)
    # The package beside the extension: it imports causal_conv1d_cuda by that name.
    dst = os.path.join(out, "causal_conv1d")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(pkg, dst, ignore=shutil.ignore_patterns("__pycache__"))
    # A fresh interpreter imports the package the way its users will (the custom ops register at import).
    env = dict(os.environ, PYTHONPATH=out + os.pathsep + os.environ.get("PYTHONPATH", ""))
    check = subprocess.run([sys.executable, "-c", "import causal_conv1d as c; print(c.__version__)"], env=env,
                           capture_output=True, text=True)
    if check.returncode != 0:
        sys.exit(f"{PROG}: built, but `import causal_conv1d` with PYTHONPATH={out} failed:\n{check.stderr}")
    print(f"{PROG}: causal_conv1d {check.stdout.strip()} importable: PYTHONPATH={out}")


if __name__ == "__main__":
    main()
