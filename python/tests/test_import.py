"""Packaging: import without torch, library discovery, version check, struct layout vs the C header."""

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import selscan
from selscan import _lib
from conftest import REPO, checkout_path


def _env():
    env = dict(os.environ)
    # The package under test (the source tree's or an installed one), not necessarily <repo>/python.
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(selscan.__file__)) + os.pathsep + env.get("PYTHONPATH", "")
    env["SELSCAN_LIBRARY"] = selscan.library_path
    return env


def test_import_without_torch():
    # sys.modules['torch'] = None makes any `import torch` fail, as on a machine without torch.
    code = ("import sys; sys.modules['torch'] = None; sys.modules['cupy'] = None\n"
            "import numpy as np, selscan\n"
            "u = np.ones((1, 2, 4), np.float32)\n"
            "y = selscan.selective_scan_fn(u, u, -np.ones((2, 3), np.float32), np.ones((1, 3, 4), np.float32),\n"
            "                              np.ones((1, 3, 4), np.float32))\n"
            "assert y.shape == (1, 2, 4) and np.isfinite(y).all()\n"
            "print('ok', selscan.version())")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok 0.")


def test_import_does_not_pull_in_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, selscan; print('torch' in sys.modules)"], env=_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_missing_library_is_a_clear_import_error():
    env = _env()
    env["SELSCAN_LIBRARY"] = "/nonexistent/libselscan.so"
    r = subprocess.run([sys.executable, "-c", "import selscan"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "SELSCAN_LIBRARY" in r.stderr and "/nonexistent/libselscan.so" in r.stderr


def _copy_package(dest):
    """The package under test at `dest`, without its library or command."""
    shutil.copytree(os.path.dirname(selscan.__file__), dest,
                    ignore=shutil.ignore_patterns("__pycache__", "libselscan*", "bin"))


def _library_path_seen_from(pythonpath):
    """selscan.library_path in a fresh interpreter that sees only `pythonpath` and numpy: -S keeps site-packages'
    .pth hooks (an editable install's finder) from importing another selscan."""
    import numpy
    env = dict(os.environ, PYTHONPATH=pythonpath + os.pathsep + os.path.dirname(os.path.dirname(numpy.__file__)))
    env.pop("SELSCAN_LIBRARY", None)
    return subprocess.run([sys.executable, "-S", "-c", "import selscan; print(selscan.library_path)"], env=env,
                          capture_output=True, text=True, cwd=pythonpath)


def test_library_found_beside_the_package():
    with tempfile.TemporaryDirectory() as tmp:
        _copy_package(os.path.join(tmp, "selscan"))
        shutil.copy(selscan.library_path, os.path.join(tmp, "selscan", "libselscan.so"))
        r = _library_path_seen_from(tmp)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == os.path.join(tmp, "selscan", "libselscan.so")


@pytest.mark.parametrize("packaged", [True, False])
def test_source_checkout_prefers_the_packaged_library(packaged):
    """In a source checkout a copy beside the package wins over every build tree, even a newer one; without it
    the build tree's library is used."""
    with tempfile.TemporaryDirectory() as tmp:
        pkg = os.path.join(tmp, "python", "selscan")
        _copy_package(pkg)
        os.makedirs(os.path.join(tmp, "include", "selscan"))
        open(os.path.join(tmp, "include", "selscan", "selscan.h"), "w").close()
        build = os.path.join(tmp, "build", "some-preset")
        os.makedirs(build)
        shutil.copy(selscan.library_path, os.path.join(build, "libselscan.so"))
        if packaged:
            shutil.copy(selscan.library_path, os.path.join(pkg, "libselscan.so"))
            later = os.path.getmtime(os.path.join(pkg, "libselscan.so")) + 100
            os.utime(os.path.join(build, "libselscan.so"), (later, later))
        r = _library_path_seen_from(os.path.join(tmp, "python"))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == os.path.join(pkg if packaged else build, "libselscan.so")


def test_installed_package_without_library_says_what_was_tried_and_how_to_fix():
    """Outside a source checkout (site-packages) no build tree is looked at: a missing library is an ImportError
    naming what was tried, the fixes, and the driver each CUDA build needs."""
    with tempfile.TemporaryDirectory() as tmp:
        site = os.path.join(tmp, "site-packages")
        _copy_package(os.path.join(site, "selscan"))
        os.makedirs(os.path.join(tmp, "build", "some-preset"))
        shutil.copy(selscan.library_path, os.path.join(tmp, "build", "some-preset", "libselscan.so"))
        r = _library_path_seen_from(site)
        assert r.returncode != 0, r.stdout
        err = r.stderr.splitlines()[-1]
        assert err.startswith("ImportError: selscan: cannot load libselscan"), err
        assert os.path.join(site, "selscan") in err and "not a source checkout" in err
        for fix in ("pip install", "cmake --workflow --preset", "SELSCAN_LIBRARY", "R580", "R525"):
            assert fix in err, fix


def test_version_matches_header():
    with open(checkout_path("include", "selscan", "selscan.h")) as f:
        text = f.read()
    vals = {}
    for part in ("MAJOR", "MINOR", "PATCH"):
        line = next(l for l in text.splitlines() if l.startswith(f"#define SELSCAN_VERSION_{part} "))
        vals[part] = int(line.split()[2])
    assert (_lib.HEADER_VERSION_MAJOR, _lib.HEADER_VERSION_MINOR, _lib.HEADER_VERSION_PATCH) == (
        vals["MAJOR"], vals["MINOR"], vals["PATCH"]), "binding written for another header version"
    assert _lib.library_version == _lib.HEADER_VERSION
    assert selscan.version() == "%d.%d.%d" % (vals["MAJOR"], vals["MINOR"], vals["PATCH"])
    assert selscan.version() in selscan.build_info()


def test_status_strings():
    assert _lib.status_string(3)  # non-empty static description
    assert selscan.cuda_device_count() >= 0


C_LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include "selscan/selscan.h"
#define F(T, m) printf(#T " " #m " %zu\n", offsetof(T, m));
#define K(name) printf("const " #name " %ld\n", (long)(name));
int main(void) {
  printf("selscan_tensor_t sizeof %zu\n", sizeof(selscan_tensor_t));
  printf("selscan_exec_t sizeof %zu\n", sizeof(selscan_exec_t));
  printf("selscan_fwd_args_t sizeof %zu\n", sizeof(selscan_fwd_args_t));
  printf("selscan_bwd_args_t sizeof %zu\n", sizeof(selscan_bwd_args_t));
  F(selscan_tensor_t, data) F(selscan_tensor_t, dtype) F(selscan_tensor_t, ndim) F(selscan_tensor_t, sizes)
  F(selscan_tensor_t, strides)
  F(selscan_exec_t, device_kind) F(selscan_exec_t, device_index) F(selscan_exec_t, stream)
  F(selscan_exec_t, workspace) F(selscan_exec_t, workspace_bytes) F(selscan_exec_t, num_threads)
  F(selscan_exec_t, reserved)
  %FIELDS%
  K(SELSCAN_STATUS_COUNT) K(SELSCAN_WORKSPACE_ALIGNMENT) K(SELSCAN_MAX_NDIM) K(SELSCAN_MAX_DSTATE) K(SELSCAN_CHUNK)
  %CONSTS%
  return 0;
}
"""


def test_struct_layout_and_constants_match_header():
    checkout_path("include", "selscan", "selscan.h")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler on PATH to read the header's layout")
    fields = []
    for name, _ in _lib.FwdArgs._fields_:
        fields.append(f"F(selscan_fwd_args_t, {name})")
    for name, _ in _lib.BwdArgs._fields_:
        fields.append(f"F(selscan_bwd_args_t, {name})")
    # Every status the mirror names, by the header's enumerator of that name.
    consts = [f"K(SELSCAN_STATUS_{name})" for name in _lib.STATUS_NAMES.values()]
    src = C_LAYOUT.replace("%FIELDS%", " ".join(fields)).replace("%CONSTS%", " ".join(consts))
    with tempfile.TemporaryDirectory() as tmp:
        c = os.path.join(tmp, "layout.c")
        with open(c, "w") as f:
            f.write(src)
        exe = os.path.join(tmp, "layout")
        subprocess.run([cc, "-std=c99", "-I", os.path.join(REPO, "include"), c, "-o", exe], check=True)
        lines = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines()
    py = {"selscan_tensor_t": _lib.Tensor, "selscan_exec_t": _lib.Exec, "selscan_fwd_args_t": _lib.FwdArgs,
          "selscan_bwd_args_t": _lib.BwdArgs}
    mirror = {"SELSCAN_STATUS_COUNT": _lib.STATUS_COUNT, "SELSCAN_WORKSPACE_ALIGNMENT": _lib.WORKSPACE_ALIGNMENT,
              "SELSCAN_MAX_NDIM": _lib.MAX_NDIM, "SELSCAN_MAX_DSTATE": _lib.MAX_DSTATE, "SELSCAN_CHUNK": _lib.CHUNK}
    mirror.update({f"SELSCAN_STATUS_{name}": value for value, name in _lib.STATUS_NAMES.items()})
    for line in lines:
        struct, member, value = line.split()
        want = int(value)
        if struct == "const":
            assert mirror[member] == want, f"{member}: the mirror says {mirror[member]}, the C header {want}"
            continue
        got = ctypes.sizeof(py[struct]) if member == "sizeof" else getattr(py[struct], member).offset
        assert got == want, f"{struct}.{member}: ctypes says {got}, the C header {want}"
    assert len(lines) == 4 + 5 + 7 + len(_lib.FwdArgs._fields_) + len(_lib.BwdArgs._fields_) + len(mirror)
    # The status table covers exactly the header's statuses, 0 .. SELSCAN_STATUS_COUNT - 1.
    assert sorted(_lib.STATUS_NAMES) == list(range(_lib.STATUS_COUNT))
