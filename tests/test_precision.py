"""Mixed precision through the real server: fp16 weights whose gradients underflow give GP702 (the underflow measured
against an fp32 reference step); the bf16-autocast twin with fp32 weights stays clean."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, assert_expected, example_expect


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["gp702_fp16_params_underflow.py", "healthy_bf16_autocast.py"])
async def test_precision_examples(client, name):
    expect = example_expect(EXAMPLES / name)
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": name}})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_expected(report, expect, name)
    if expect.get("healthy"):
        assert not [f for f in report["findings"] if f["severity"] in ("error", "warning")], report["findings"]
        assert "precision" not in report["facts"]  # fp32 weights under autocast: nothing held in low precision
        return
    rows = {r["name"]: r for r in report["facts"]["precision"]["low_precision"]}
    assert rows["encoder.weight"]["underflow"] >= 0.5 and rows["decoder.bias"]["underflow"] < 0.5, rows
    held = [f for f in report["findings"] if f["code"] == "GP702" and f["severity"] == "warning"]
    assert held and "decoder.bias" in held[0]["parameters"], report["findings"]


def test_bf16_weights_in_the_optimizer_are_named():
    """In-process: bf16 weights under an optimizer (no master copy) are named; the reference step needs no batch dtype."""
    import torch
    import torch.nn as nn

    from gradprobe.checks.diagnosis import diagnose

    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(torch.bfloat16)
    report = diagnose(net, batch=torch.randn(3, 4, dtype=torch.bfloat16), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    found = [f for f in report["findings"] if f["code"] == "GP702"]
    assert found and set(found[0]["parameters"]) <= {"0.weight", "0.bias", "2.weight", "2.bias"}, report["findings"]
    assert report["facts"]["precision"]["low_precision"][0]["dtype"] == "bfloat16"
