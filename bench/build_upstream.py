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

import os

import upstream_ext  # bench/upstream_ext.py: what this and build_causal_conv1d.py share

PROG = "build_upstream"


def main():
    args = upstream_ext.arg_parser(PROG, __doc__.split("\n\n")[0],
                                   "a checkout of state-spaces/mamba (its csrc/selective_scan is built)",
                                   "build/upstream").parse_args()
    src, sources = upstream_ext.find_sources(PROG, args.checkout, os.path.join("csrc", "selective_scan"), None,
                                             "state-spaces/mamba")
    std = f"-std={upstream_ext.torch_cxx_std()}"  # upstream passes c++17; newer torch headers need c++20
    path = upstream_ext.build(PROG, "selective_scan_cuda", sources, args, include_dirs=[src],
                              cflags=["-O3", std], cuda_cflags=upstream_ext.NVCC_COMMON + [std])
    if path:
        print(f"{PROG}: PYTHONPATH={os.path.dirname(path)}")


if __name__ == "__main__":
    main()
