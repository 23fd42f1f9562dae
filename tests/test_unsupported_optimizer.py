"""GP209 unsupported-optimizer, through the real server: an optimizer that is not a torch.optim.Optimizer is said as
GP209 (a warning: its coverage and step cannot be observed), no longer as GP100."""

from __future__ import annotations

import pytest

CASE = '''
import torch
import torch.nn as nn


class PlainSGD:
    """Not a torch.optim.Optimizer: updates its own list of tensors."""

    def __init__(self, params, lr=0.1):
        self.params, self.lr = list(params), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p -= self.lr * p.grad


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def make_inputs():
    return torch.randn(3, 4)


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    return PlainSGD(model.parameters())
'''


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["check_optimizer_coverage", "diagnose"])
async def test_an_optimizer_that_is_not_a_torch_optimizer_is_gp209(client, tmp_path, tool):
    (tmp_path / "case.py").write_text(CASE)
    result = await client.call_tool(tool, {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    findings = result.structured_content["findings"]
    assert not [f for f in findings if f["code"] == "GP100"], findings
    hits = [f for f in findings if f["code"] == "GP209"]
    assert len(hits) == 1, findings
    f = hits[0]
    assert f["name"] == "unsupported-optimizer" and f["severity"] == "warning"
    assert f["message"] == "The optimizer is a PlainSGD, not a torch.optim.Optimizer: its coverage cannot be checked."
    assert f["evidence"]["type"].endswith(".PlainSGD") and "torch.optim.Optimizer" in f["fix"]
    assert not [g for g in findings if g["severity"] == "error"], findings
