"""transformers' MambaForCausalLM.generate() with selscan's prefill (the scan with its last state) and decode step
produces the model's own greedy tokens (fp32, CPU; CUDA too when usable). Skipped without transformers."""

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import checkout_path

pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed (the real-client test needs it)")


@pytest.mark.skipif(importlib.util.find_spec("transformers.models.mamba") is None,
                    reason="this transformers has no Mamba model")
def test_generate_matches_the_model_s_own_tokens():
    import selscan

    example = checkout_path("examples", "transformers_mamba.py")

    env = dict(os.environ, SELSCAN_LIBRARY=selscan.library_path,
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(selscan.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, example, "--generate", "--device", "cpu", "--dtype", "fp32", "--layers", "2",
                        "--hidden", "64", "--seqlen", "16", "--batch", "2", "--new-tokens", "24"],
                       capture_output=True, text=True, env=env, timeout=600)
    if "needs transformers >= 5.15" in r.stdout + r.stderr:
        pytest.skip("transformers < 5.15 has no module-level scan functions to replace")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
