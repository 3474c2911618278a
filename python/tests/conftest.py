import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # reference.py
REPO = os.path.dirname(os.path.dirname(HERE))


def golden_dir():
    return os.environ.get("SELSCAN_GOLDEN_DIR") or os.path.join(REPO, "..", "shared", "golden")


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every output the binding allocates starts as NaN, so an element the library does not write fails."""
    from selscan import _backends
    old = _backends.POISON
    _backends.POISON = True
    yield
    _backends.POISON = old
