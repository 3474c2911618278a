"""What the baseline builders share (bench/build_upstream.py: mamba's selective_scan_cuda; bench/build_causal_conv1d.py:
causal-conv1d's causal_conv1d_cuda): an upstream CUDA extension built by torch.utils.cpp_extension from a checkout,
with upstream's own nvcc flags, for the given compute capabilities only. No pip, no network, no setup.py run (both
setup.py files try to download prebuilt wheels first). Not part of the library.

Every failure before the compile (a bad argument, a checkout without the expected sources, a CPU-only torch, no
nvcc, no ninja) exits with a message that names what was given and what was expected; `--dry-run` stops after
those checks and prints what would be compiled, so the arguments can be checked on a machine without a GPU.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

# The nvcc flags both upstream setup.py files pass for their kernels: fast math, the half and bfloat16 operators
# enabled. Each builder adds the rest of its own list.
NVCC_COMMON = [
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-lineinfo",
]


def fail(prog, msg):
    sys.exit(f"{prog}: {msg}")


def arg_parser(prog, description, checkout_help, default_out):
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("checkout", help=checkout_help)
    ap.add_argument("--out", default=default_out, help=f"build directory; the module lands there (default {default_out})")
    ap.add_argument("--arch", default="9.0",
                    help="compute capabilities, ';' ',' or ' '-separated: 9.0, 90, 9.0a, 8.0+PTX (default 9.0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel compile jobs (default: every core)")
    ap.add_argument("--verbose", action="store_true",
                    help="show the compiler's output (ptxas register and spill lines where the flags ask for them)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the checkout and the toolchain, print the sources and flags, compile nothing")
    return ap


def gencode_flags(prog, arch):
    """`-gencode` pairs for an arch list like TORCH_CUDA_ARCH_LIST's ("9.0;8.0+PTX", "90", "9.0a")."""
    flags = []
    entries = [e for e in re.split(r"[;,\s]+", arch.strip()) if e]
    if not entries:
        fail(prog, f"--arch is empty (got '{arch}'); expected compute capabilities such as 9.0")
    for e in entries:
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)(\+PTX)?", e) or re.fullmatch(r"(\d)(\d)([af]?)(\+PTX)?", e) \
            or re.fullmatch(r"(\d\d)(\d)([af]?)(\+PTX)?", e)
        if not m:
            fail(prog, f"--arch entry '{e}' is not a compute capability (got --arch '{arch}'); expected entries "
                       "like 9.0, 90, 9.0a or 8.0+PTX")
        cc = m.group(1) + m.group(2) + m.group(3)
        if int(m.group(1) + m.group(2)) < 50:
            fail(prog, f"--arch entry '{e}' is below sm_50 (got --arch '{arch}')")
        flags += ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]
        if m.group(4):
            flags += ["-gencode", f"arch=compute_{cc},code=compute_{cc}"]
    return flags


def find_sources(prog, root, subdir, names, what):
    """(root/subdir, the absolute paths of its sources): `names`, or every *.cpp and *.cu there when names is None.
    Exits naming what is missing."""
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        fail(prog, f"checkout '{root}' is not a directory (expected a checkout of {what})")
    src = os.path.join(root, subdir)
    if names is None:
        names = sorted(n for n in (os.listdir(src) if os.path.isdir(src) else []) if n.endswith((".cpp", ".cu")))
        if not names:
            fail(prog, f"'{root}' does not look like a checkout of {what}: no *.cpp or *.cu in {subdir}")
    missing = [n for n in names if not os.path.isfile(os.path.join(src, n))]
    if missing:
        fail(prog, f"'{root}' does not look like a checkout of {what}: missing {', '.join(os.path.join(subdir, n) for n in missing)}")
    return src, [os.path.join(src, n) for n in names]


def check_toolchain(prog):
    """torch with CUDA, nvcc and ninja, or an exit naming what is missing. Returns a one-line description."""
    try:
        import torch
    except ImportError as e:
        fail(prog, f"torch is not importable ({e}); a CUDA build of torch is needed for its headers and libraries")
    if not torch.version.cuda:
        fail(prog, f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); a CUDA build is needed")
    from torch.utils import cpp_extension
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc") if cpp_extension.CUDA_HOME else shutil.which("nvcc")
    if not nvcc or not os.path.isfile(nvcc):
        fail(prog, "nvcc not found (CUDA_HOME unset and no nvcc on PATH); set CUDA_HOME to the toolkit of "
                   f"torch's CUDA {torch.version.cuda}")
    try:
        release = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
        release = re.search(r"release ([\d.]+)", release).group(1)
    except (OSError, subprocess.CalledProcessError, AttributeError) as e:
        fail(prog, f"'{nvcc} --version' failed: {e}")
    if not cpp_extension.is_ninja_available():
        fail(prog, "ninja not found on PATH (torch.utils.cpp_extension builds with it)")
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}), nvcc {release} at {nvcc}"


def torch_cxx_std():
    """The C++ standard to compile against the installed torch: c++20 where its ATen header demands it (newer torch
    refuses anything older), else c++17, the one upstream's setup.py files pass."""
    try:
        from torch.utils import cpp_extension
        paths = cpp_extension.include_paths()
    except ImportError:
        return "c++17"
    for d in paths:
        header = os.path.join(d, "ATen", "ATen.h")
        if os.path.isfile(header):
            with open(header) as f:
                return "c++20" if "C++20 or later" in f.read() else "c++17"
    return "c++17"


def build(prog, name, sources, args, include_dirs, cflags, cuda_cflags):
    """Compiles `name` from `sources` into args.out (a cached build: unchanged sources and flags rebuild nothing).
    Returns the extension's path, or None after a dry run."""
    if args.jobs < 1:
        fail(prog, f"--jobs must be >= 1 (got {args.jobs})")
    cuda_cflags = cuda_cflags + gencode_flags(prog, args.arch)
    toolchain = check_toolchain(prog)
    out = os.path.abspath(args.out)
    print(f"{prog}: {name} from {len(sources)} sources, {toolchain}")
    print(f"{prog}: sources: {' '.join(sources)}")
    print(f"{prog}: cxx flags: {' '.join(cflags)}")
    print(f"{prog}: nvcc flags: {' '.join(cuda_cflags)}")
    print(f"{prog}: out: {out}, {args.jobs} jobs")
    if args.dry_run:
        print(f"{prog}: dry run, nothing compiled")
        return None
    os.makedirs(out, exist_ok=True)
    os.environ["MAX_JOBS"] = str(args.jobs)  # read by the ninja build torch writes
    from torch.utils.cpp_extension import load
    t0 = time.time()
    module = load(name=name, sources=sources, build_directory=out, extra_include_paths=include_dirs,
                  extra_cflags=cflags, extra_cuda_cflags=cuda_cflags, verbose=args.verbose)
    print(f"{prog}: {name} built in {time.time() - t0:.0f} s -> {module.__file__}")
    return module.__file__
