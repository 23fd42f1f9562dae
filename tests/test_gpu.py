"""CUDA paths: covered on a GPU machine, skipped (with the reason) elsewhere."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import EXAMPLES, ROOT

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine (GPU paths run on a GPU box)")


@cuda
@pytest.mark.anyio
async def test_a_child_forked_from_the_warm_worker_can_use_cuda(client):
    target = {"project_dir": str(EXAMPLES), "model": "gp302_detach_in_attention.py", "device": "cuda"}
    result = await client.call_tool("trace_grad_path", {"target": target})
    sc = result.structured_content
    assert sc["findings"][0]["code"] == "GP302"
    assert sc["facts"]["cuda"]["device_name"] and sc["facts"]["sandbox"]["child"].startswith("forked")


def test_gpu_check_script_skips_cleanly_without_cuda():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    if not torch.cuda.is_available():
        assert out.stdout.strip() == "gpu_check: skipped, no CUDA device is visible on this machine"
