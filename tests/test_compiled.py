"""torch.compile'd models through the real server: a healthy compiled script or build_model() target gets no
error or warning and names parameters without the `_orig_mod.` prefix; GP701 (compiled against eager) names the
parameter a hook registered after the first compiled call leaves without a gradient, and stays quiet on the twin."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, ROOT, assert_expected, example_expect

SCRIPTS = ROOT / "examples" / "scripts"


def _no_error_or_warning(report: dict) -> None:
    loud = [(f["code"], f["message"][:200]) for f in report["findings"] if f["severity"] in ("error", "warning")]
    assert not loud, loud


def _names_unprefixed(report: dict) -> None:
    names = [r["name"] for r in report["facts"]["per_parameter"]]
    assert names and not any(n.startswith(("_orig_mod.", "module.")) for n in names), names


@pytest.mark.anyio
@pytest.mark.parametrize("project,count", [("compiled", 6), ("ddp_compiled", 4)])
async def test_compiled_script_is_healthy(client, project, count):
    """A compiled script (and a compiled DDP one, world size 1): no GP000, no error or warning, names unprefixed."""
    target = {"project_dir": str(SCRIPTS / project), "script": "train.py", "args": ["--steps=2"], "timeout_s": 240}
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    _no_error_or_warning(report)
    _names_unprefixed(report)
    assert report["facts"]["script_step"]["wrapper"] == "OptimizedModule"
    compiled = report["facts"]["compiled"]
    assert compiled["compared"] == count and not compiled["differing"] and compiled["skipped"] is None, compiled


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["healthy_compiled_mlp.py", "healthy_compiled_hook_before.py",
                                  "gp701_hook_after_compile.py"])
async def test_compiled_build_model(client, name):
    expect = example_expect(EXAMPLES / name)
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": name}})
    assert not result.is_error, result.content
    report = result.structured_content
    assert_expected(report, expect, name)
    _names_unprefixed(report)
    assert report["facts"]["target"]["wrapper"] == "OptimizedModule"
    if expect.get("healthy"):
        _no_error_or_warning(report)
        assert report["facts"]["compiled"]["compared"] > 0
    else:
        missing = [f for f in report["findings"] if f["code"] == "GP701" and f["parameters"] == ["encoder.gate"]]
        assert missing and "no gradient" in missing[0]["message"], report["findings"]


def test_library_entry_unwraps_a_compiled_model():
    """gradprobe.diagnose(compiled_model, ...) in-process: names without the prefix, the comparison ran."""
    import torch
    import torch.nn as nn

    from gradprobe.checks.diagnosis import diagnose

    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    report = diagnose(torch.compile(net, backend="aot_eager"), batch=torch.randn(3, 4))
    _no_error_or_warning(report)
    _names_unprefixed(report)
    assert report["facts"]["compiled"]["compared"] == 4
