import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # reference.py
REPO = os.path.dirname(os.path.dirname(HERE))


def torch_cuda_skip_reason():
    """Why the torch CUDA tests cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    import selscan

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if selscan.cuda_device_count() == 0:
        return "libselscan was built without CUDA or sees no device (" + selscan.build_info() + ")"
    try:
        selscan.check_device(torch.cuda.current_device())
    except selscan.SelscanError as e:
        return f"this libselscan build cannot run on the device: {e}"
    return None


def pytest_report_header(config):
    """Which package and library the run tests (the source tree's or an installed one)."""
    import selscan
    return [f"selscan {selscan.version()}: package {os.path.dirname(selscan.__file__)}",
            f"library {selscan.library_path} ({selscan.build_info()})"]


def checkout_path(*parts):
    """A file of the source checkout the tests came from, or a skip naming it (tests copied out of the tree, e.g.
    to test an installed wheel with nothing else on the path, have no header or examples beside them)."""
    path = os.path.join(REPO, *parts)
    if not os.path.exists(path):
        pytest.skip(f"needs the source checkout's {'/'.join(parts)} (not at {path}): run python/tests from a checkout")
    return path


def golden_dir():
    return os.environ.get("SELSCAN_GOLDEN_DIR") or os.path.join(REPO, "tests", "data", "golden")


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every output the binding allocates starts as NaN, so an element the library does not write fails."""
    from selscan import _backends
    old = _backends.POISON
    _backends.POISON = True
    yield
    _backends.POISON = old
