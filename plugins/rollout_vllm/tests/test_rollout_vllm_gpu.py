"""Real vLLM on a GPU (``pytest -m vllm``): colocated and server mode, compared with transformers.

Runs only where vLLM imports and CUDA is present; see the README for the exact command. The
check models (``scripts/make_check_models.py``) are built on the CPU first when
``.gpu/check_models`` does not hold them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.gpu, pytest.mark.slow]


def _gpu_and_vllm() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _gpu_and_vllm(), reason="needs vLLM and a CUDA GPU")
def test_vllm_colocated_and_server_end_to_end(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_check

    code = gpu_check.main(str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    failed = {k: v for k, v in results["checks"].items() if not v["ok"]}
    assert not failed, failed
    assert not (results["errors"].keys() - {"conformance"}), results["errors"]
    assert code == 0
