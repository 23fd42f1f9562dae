"""Every broken example is diagnosed with its code, culprits and line; every healthy one gets no error.

Each example runs through the real server over stdio (the product); those of the tools that run the user's step
also run through the check library in-process (the public Python API), one after another in one process.
"""

from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, assert_expected, example_expect, example_paths

PATHS = example_paths()


@pytest.mark.anyio
@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
async def test_example_through_mcp(client, path):
    expect = example_expect(path)
    args = {"target": {"project_dir": str(EXAMPLES), "model": path.name, "device": "cpu"}, **expect.get("options", {})}
    result = await client.call_tool(expect["tool"], args)
    assert not result.is_error, result.content
    report = result.structured_content
    assert report["tool"] == expect["tool"]
    assert_expected(report, expect, path.name)


# In process, with no sandbox between examples: the tools that run the user's step (their hooks, modes and patches
# must leave nothing behind for the next example). The other tools' examples run through the server only.
IN_PROCESS = ("diagnose", "audit_training", "trace_grad_path")
LIBRARY_PATHS = [p for p in PATHS if example_expect(p)["tool"] in IN_PROCESS]


@pytest.mark.parametrize("path", LIBRARY_PATHS, ids=[p.stem for p in LIBRARY_PATHS])
def test_example_through_library(path):
    from gradprobe.sandbox.run_check import run_job

    expect = example_expect(path)
    torch.set_grad_enabled(True)  # one example switches it off at import; the sandbox would isolate that
    report = run_job({"tool": expect["tool"], "target": {"project_dir": str(EXAMPLES), "model": path.name},
                      "options": expect.get("options", {})}, lambda phase: None)
    torch.set_grad_enabled(True)
    assert "tool_error" not in report, report
    assert_expected(report, expect, path.name)


@pytest.mark.anyio
@pytest.mark.parametrize("path", [p for p in PATHS if not example_expect(p).get("options")
                                  and example_expect(p)["tool"] != "diagnose"], ids=lambda p: p.stem)
async def test_example_through_diagnose(client, path):
    """diagnose finds the same root cause as the specific tool (warnings and infos may be folded). An example whose
    own tool is diagnose is checked whole, with its line, by test_example_through_mcp: not run a second time here."""
    expect = example_expect(path)
    if expect.get("severity") in ("warning", "info"):
        pytest.skip("diagnose folds consequences; warnings and infos are covered by the specific tool")
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": path.name}})
    report = result.structured_content
    related = {r["code"] for f in report["findings"] for r in f["evidence"].get("related", [])}
    codes = {f["code"] for f in report["findings"]}
    if expect["codes"] and not (codes & set(expect["codes"])) and related & set(expect["codes"]):
        return  # folded into a higher-ranked root cause
    assert_expected(report, {**expect, "line": None}, path.name)
    assert report["facts"].get("mermaid", "").startswith("flowchart") or report["findings"][0]["code"].startswith("GP1")


@pytest.mark.anyio
async def test_healthy_plain_pytorch_controls_are_really_exercised(client):
    """The plain-PyTorch controls are checked, not skipped: the Function is gradchecked, every parameter gets a gradient."""
    r = await client.call_tool("run_gradcheck", {"target": {"project_dir": str(EXAMPLES), "model": "healthy_custom_function.py"}})
    report = r.structured_content
    assert report["ok"] is True and [f["function"] for f in report["facts"]["functions"]] == ["ScaledTanh"]
    for name in ("healthy_cnn.py", "healthy_custom_layer_mlp.py", "healthy_custom_function.py"):
        r = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES), "model": name}})
        report = r.structured_content
        assert report["ok"] is True, (name, report["findings"])
        rows = report["facts"]["per_parameter"]
        assert rows and all(row["grad"] == "ok" for row in rows), (name, rows)
