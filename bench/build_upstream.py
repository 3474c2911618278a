#!/usr/bin/env python3
"""Builds upstream's `selective_scan_cuda` (state-spaces/mamba, csrc/selective_scan) as a torch extension: the
baseline that bench/upstream_scan.py times beside selscan through the same autograd path (bench/python_host.py,
examples/transformers_mamba.py --bench). Not part of the library; needs torch with CUDA and an nvcc.

    git clone --depth 1 https://github.com/state-spaces/mamba /tmp/mamba
    python3 bench/build_upstream.py /tmp/mamba --out build/upstream --arch 9.0 --jobs 16
    PYTHONPATH=build/upstream python3 bench/python_host.py

The flags are the ones upstream's setup.py passes for its kernels (fast math, the half/bfloat16 operators
enabled); only the targets differ: the given arch list instead of upstream's full one (sm_90 alone builds in
about 2 minutes on 16 cores).
"""

import argparse
import glob
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mamba", help="a checkout of state-spaces/mamba (its csrc/selective_scan is built)")
    ap.add_argument("--out", default="build/upstream", help="build directory; the module lands there")
    ap.add_argument("--arch", default="9.0", help="compute capabilities, ';'-separated (default 9.0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel compile jobs")
    args = ap.parse_args()

    src = os.path.join(os.path.abspath(args.mamba), "csrc", "selective_scan")
    sources = sorted(glob.glob(os.path.join(src, "*.cpp")) + glob.glob(os.path.join(src, "*.cu")))
    if not sources:
        sys.exit(f"build_upstream: no sources in {src}")
    os.environ["MAX_JOBS"] = str(args.jobs)
    from torch.utils.cpp_extension import load  # after MAX_JOBS: ninja reads it

    gencode = []
    for a in args.arch.replace(",", ";").split(";"):
        cc = a.strip().replace(".", "")
        if cc:
            gencode += ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    load(name="selective_scan_cuda", sources=sources, build_directory=out, extra_include_paths=[src],
         extra_cflags=["-O3", "-std=c++17"],
         extra_cuda_cflags=["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                            "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                            "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
                            "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-lineinfo"]
         + gencode)
    print(f"build_upstream: selective_scan_cuda from {len(sources)} sources in {time.time() - t0:.0f} s -> {out} "
          f"(PYTHONPATH={out})")


if __name__ == "__main__":
    main()
