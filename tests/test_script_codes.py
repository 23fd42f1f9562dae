"""The several-steps codes (GP6xx) in script mode, under each framework: every script of examples/scripts/codes_*
(a buggy one per code and setting, healthy twins beside them) is audited through the real server over stdio, as it
runs (nothing replayed), and judged by its EXPECT header: the code at its line in the script, or no error and none
of the codes it lists as absent on a healthy one; never GP000. docs/coverage.md is the matrix these fill
(benchmarks/coverage.py)."""

from __future__ import annotations

import ast
import importlib.util
import os

import pytest

from conftest import ROOT, assert_expected

SCRIPTS = sorted((ROOT / "examples" / "scripts").glob("codes_*/*.py"))
NEEDS = {"lightning": "lightning", "transformers": "transformers", "accelerate": "accelerate"}


def _expect(path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECT":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no EXPECT")


def _needs(path) -> str | None:
    text = path.read_text()
    return next((pkg for word, pkg in NEEDS.items() if f"import {word}" in text or f"from {word} " in text), None)


@pytest.mark.anyio
@pytest.mark.parametrize("path", SCRIPTS, ids=[f"{p.parent.name}/{p.stem}" for p in SCRIPTS])
async def test_script_code_through_mcp(client, path):
    needs = _needs(path)
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs} (pip install 'gradprobe[frameworks]')")
    expect = _expect(path)
    target = {"project_dir": str(path.parent), "script": path.name, "args": expect.get("args", []), "timeout_s": 240}
    result = await client.call_tool(expect["tool"], {"target": target, **expect.get("options", {})})
    assert not result.is_error, result.content
    report = result.structured_content
    assert not [f for f in report["findings"] if f["code"] == "GP000"], report["findings"]
    assert_expected(report, expect, f"{path.parent.name}/{path.name}")
    if expect["codes"]:
        hits = [f for f in report["findings"] if f["code"] in expect["codes"] and f.get("location")]
        assert any(os.path.basename(f["location"]["file"]) == path.name for f in hits), hits
    else:
        assert report["ok"], report["findings"]


@pytest.mark.anyio
async def test_diagnose_with_steps_reports_a_scaler_that_skipped_every_step(client):
    """No optimizer step ran (the GradScaler skipped each one): the audit has nothing else to judge, and diagnose
    with steps still reports GP617 at the loss's line (it used to be a false GP112 "no training step")."""
    path = ROOT / "examples" / "scripts" / "codes_loop_broken" / "gp617_scaler_skips_every_step.py"
    target = {"project_dir": str(path.parent), "script": path.name, "args": ["--steps=8"], "timeout_s": 240}
    result = await client.call_tool("diagnose", {"target": target, "steps": 3})
    assert not result.is_error, result.content
    report = result.structured_content
    codes = [f["code"] for f in report["findings"]]
    assert "GP000" not in codes and "GP112" not in codes, report["findings"]
    f = next(f for f in report["findings"] if f["code"] == "GP617")
    assert f["location"]["line"] == 32 and f["severity"] == "error", f
