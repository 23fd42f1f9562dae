"""Issue 27, item 2, through the real server: GP318 names a dead activation (every input of the batch in the region
where its derivative is 0) and an index op that selected nothing, with the measured counts and the line that caused
it; a sparse but healthy ReLU and a label mask that keeps some positions stay clean.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from gradprobe.findings import catalogue
from conftest import one_finding as _one, line_of as _line

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "broken"


async def _run(client, tmp_path: Path, example: str | None = None, source: str | None = None,
               tool: str = "trace_grad_path") -> list[dict]:
    if example is not None:
        shutil.copy(EXAMPLES / example, tmp_path / "case.py")
    else:
        (tmp_path / "case.py").write_text(textwrap.dedent(source or ""))
    result = await client.call_tool(tool, {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    assert not result.is_error, result.content
    return result.structured_content["findings"]


@pytest.mark.anyio
async def test_a_relu_dead_on_every_input_names_the_bias_that_killed_it(client, tmp_path):
    findings = await _run(client, tmp_path, "gp318_dead_relu_negative_bias.py")
    f = _one(findings, "GP318")
    case = tmp_path / "case.py"
    assert f["severity"] == "warning" and f["parameters"] == ["hidden.weight", "hidden.bias", "out.weight"]
    assert f["location"]["line"] == _line(case, "nn.init.constant_(self.hidden.bias, -20.0)")  # the cause
    assert f["evidence"]["op_location"]["line"] == _line(case, "F.relu(self.hidden(x))")
    ev = f["evidence"]
    assert ev["kind"] == "dead" and ev["dead"] == ev["of"] == 16 * 32 and ev["region"] == "<= 0"
    assert ev["bias"] == "hidden.bias" and ev["input_range"][1] < 0
    assert "512 of its 512 inputs in its dead region" in f["message"] and "out.weight read its output" in f["message"]
    assert f["fix"].startswith("Every unit of `relu`") and "initialise it at 0" in f["fix"]
    assert not [g for g in findings if g["code"] == "GP306"], findings  # the generic warning is replaced


@pytest.mark.anyio
@pytest.mark.parametrize("example", ["healthy_relu_mlp_sparse_units.py", "healthy_labels_prompt_masked.py"])
async def test_a_sparse_relu_and_a_mask_that_keeps_some_labels_are_clean(client, tmp_path, example):
    findings = await _run(client, tmp_path, example)
    assert not [f for f in findings if f["code"] in ("GP318", "GP306") or f["severity"] in ("error", "warning")], \
        findings


CLAMPED = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 16)
            self.out = nn.Linear(16, 3)

        def forward(self, x, y=None):
            return self.out(self.fc(x).clamp(min=5.0, max=8.0))


    def build_model():
        return Net()


    def make_inputs():
        return torch.randn(8, 6), torch.randint(0, 3, (8,))


    def loss_fn(out, batch):
        return F.cross_entropy(out, batch[1])
"""


@pytest.mark.anyio
async def test_a_clamp_whose_bounds_lie_above_the_data_is_named_at_its_line(client, tmp_path):
    f = _one(await _run(client, tmp_path, source=CLAMPED), "GP318")
    assert f["parameters"] == ["fc.weight", "fc.bias"] and f["evidence"]["region"] == "outside [5, 8]"
    assert f["location"]["code"].startswith("return self.out(self.fc(x).clamp(")  # no bias to blame: the op's line
    assert f["evidence"]["bias"] is None and "its bounds leave the whole range of its inputs" in f["fix"]


HINGE = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(6, 4)

        def forward(self, a, p, n):
            return self.net(a), self.net(p), self.net(n)


    def build_model():
        return Embed()


    def make_inputs():
        return torch.randn(8, 6), torch.randn(8, 6), torch.randn(8, 6) + 50.0  # negatives far away: easy triplets


    def loss_fn(out, batch):
        a, p, n = out
        return F.relu((a - p).norm(dim=1) - (a - n).norm(dim=1) + 1.0).mean()
"""


@pytest.mark.anyio
async def test_a_margin_loss_whose_every_margin_is_met_is_info(client, tmp_path):
    findings = await _run(client, tmp_path, source=HINGE)
    f = _one(findings, "GP318")
    assert f["severity"] == "info" and f["parameters"] == ["net.weight", "net.bias"]
    assert "every margin is met on this batch" in f["message"] and f["evidence"]["dead"] == f["evidence"]["of"] == 8
    assert not [g for g in findings if g["severity"] in ("error", "warning")], findings


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["trace_grad_path", "diagnose"])
async def test_labels_that_are_all_ignored_are_an_empty_selection(client, tmp_path, tool):
    findings = await _run(client, tmp_path, "gp318_labels_all_ignored.py", tool=tool)
    f = _one(findings, "GP318")
    case = tmp_path / "case.py"
    assert f["severity"] == "warning" and f["evidence"]["kind"] == "index"
    assert {"emb.weight", "body.weight", "head.weight"} <= set(f["parameters"])
    assert f["location"]["line"] == _line(case, "keep = labels != IGNORE")  # the line that made the mask
    assert f["evidence"]["op_location"]["line"] == _line(case, "F.cross_entropy(logits[keep]")
    assert f["evidence"]["selected"] == 0 and f["evidence"]["of"] == 32 and "selects 0 of 32" in f["message"]
    assert not [g for g in findings if g["code"] == "GP306"], findings


def test_the_new_situations_have_their_own_fix():
    doc = catalogue()["GP318"]["situations"]
    fixes = [doc[s]["fix"] for s in ("dead_relu", "dead_hinge", "empty_index", "mask", "where")]
    assert len(set(fixes)) == len(fixes)
