"""torch.compile'd models through the real server: a healthy compiled script or build_model() target gets no
error or warning and names parameters without the `_orig_mod.` prefix; GP701 (compiled against eager) names the
parameter a hook registered after the first compiled call leaves without a gradient, and stays quiet on the twin;
its explanation names the hook the stale graph lacks (build_model form) or the line where eager uses a parameter that
no captured graph reads (script form)."""

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
    else:  # explained: a fresh trace agrees with eager, and runs the hook (at its line) the stale graph lacks
        stale = [f for f in report["findings"] if f["code"] == "GP701" and f["parameters"][0] == "encoder.gate"]
        assert stale and "encoder.gate (no gradient)" in stale[0]["message"], report["findings"]
        assert "forward hook `_gate` on encoder" in stale[0]["message"], stale[0]["message"]
        assert stale[0]["location"]["function"] == "_gate", stale[0]["location"]
        assert report["facts"]["compiled"]["why"]["fresh_trace_agrees"] is True


@pytest.mark.anyio
async def test_compiled_script_branch_explained(client):
    """Script mode: a temperature applied on the eager path only (a branch on is_compiling()) is named, at the line
    where eager uses it, as read by no graph dynamo captures; the other parameters differ (GP701 as before)."""
    target = {"project_dir": str(SCRIPTS / "compiled_broken"), "script": "train.py", "args": ["--steps=2"],
              "timeout_s": 240}
    result = await client.call_tool("diagnose", {"target": target})
    assert not result.is_error, result.content
    report = result.structured_content
    gp701 = [f for f in report["findings"] if f["code"] == "GP701"]
    unread = [f for f in gp701 if f["parameters"] == ["temperature"]]
    assert unread and unread[0]["location"]["line"] == 29, gp701
    assert "score / self.temperature" in unread[0]["location"]["code"]
    assert any("head.weight" in f["parameters"] for f in gp701), gp701
    why = report["facts"]["compiled"]["why"]
    assert why["fresh_trace_agrees"] is False and list(why["unread_by_graph"]) == ["temperature"], why


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


def test_library_explanation_lists_graph_breaks():
    """In-process: a parameter behind an is_compiling() branch after a graph break (a print) is named at eager's line,
    and the fresh trace's graph break is listed with dynamo's reason and the user's line."""
    import torch
    import torch.nn as nn

    from gradprobe.checks.diagnosis import diagnose

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.t = nn.Linear(4, 8), nn.Linear(8, 2), nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            h = torch.tanh(self.a(x))
            print("hidden", h.shape)  # a graph break
            if not torch.compiler.is_compiling():
                h = h * self.t
            return self.b(h)

    report = diagnose(torch.compile(Net(), backend="aot_eager"), batch=torch.randn(3, 4))
    why = report["facts"]["compiled"]["why"]
    assert why["unread_by_graph"]["t"]["code"] == "h = h * self.t", why
    (brk,) = why["graph_breaks"]
    assert brk["location"]["code"].startswith("print(") and "print" in brk["reason"], brk
    unread = [f for f in report["findings"] if f["code"] == "GP701" and f["parameters"] == ["t"]]
    assert unread and "1 graph break(s)" in unread[0]["message"], report["findings"]
