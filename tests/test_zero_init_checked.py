"""Issue 27, item 6, through the real server: "by design, a zero-initialised partner" is a claim diagnose checks over
real optimizer steps. A partner that moves (the adapter's B) gets an info with what was measured; one that never
moves gets a finding that says what keeps it still, at that line, and never that it is by design.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import line_of as _line

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "broken"


async def _findings(client, tmp_path: Path, tool: str = "diagnose", example: str | None = None,
                    source: str | None = None) -> dict:
    if example is not None:
        shutil.copy(EXAMPLES / example, tmp_path / "case.py")
    else:
        (tmp_path / "case.py").write_text(textwrap.dedent(source or ""))
    result = await client.call_tool(tool, {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    assert not result.is_error, result.content
    return result.structured_content


def _gp306(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == "GP306"]


@pytest.mark.anyio
async def test_a_partner_whose_gradient_a_callback_zeroes_is_not_by_design_and_the_line_is_named(client, tmp_path):
    report = await _findings(client, tmp_path, example="gp306_lora_b_grad_clipped_to_zero.py")
    [f] = _gp306(report)
    assert f["severity"] == "error" and f["parameters"] == ["a.down.weight"], f
    assert f["location"]["line"] == _line(tmp_path / "case.py", "clip_grad_value_(ups")
    assert "By design" not in f["message"] and "never moved over 3 real optimizer step(s)" in f["message"]
    assert f["evidence"]["partner_verdict"] == "zeroed-between" and f["evidence"]["grad_norm_after_backward"] > 0
    assert f["evidence"]["zero_initialised_partners"] == {"a.down.weight": "a.up.weight"}
    assert report["facts"]["zero_init_checked"]["partners"][0]["verified"] is False
    # the partner's own unmoved step (GP207) says a write other than zero_grad() did it, not "call zero_grad first"
    [stuck] = [g for g in report["findings"] if g["code"] == "GP207"]
    assert "by code other than zero_grad()" in stuck["message"] and "zero_grad() before backward" not in stuck["fix"]


@pytest.mark.anyio
async def test_a_partner_that_moves_keeps_the_info_with_what_was_measured(client, tmp_path):
    report = await _findings(client, tmp_path, example="healthy_lora_b_clip_positive.py")
    [f] = _gp306(report)
    assert report["ok"] is True and f["severity"] == "info", report["findings"]
    ev = f["evidence"]
    assert ev["checked_over_steps"] == 3 and ev["partners_moved"]["a.up.weight"]["update_norm"] > 0
    assert ev["gradient_after"]["a.up.weight"]["grad_norm"] > 0
    assert "a.up.weight moved at step 1" in f["message"] and "By design" in f["message"]


@pytest.mark.anyio
async def test_a_partner_in_a_group_with_lr_zero_names_the_optimizer_line(client, tmp_path):
    source = (EXAMPLES / "healthy_lora_b_clip_positive.py").read_text().replace(
        '    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)',
        '    ups = [m.up.weight for m in model.modules() if isinstance(m, Adapted)]\n'
        '    rest = [p for p in model.parameters() if p.requires_grad and all(p is not u for u in ups)]\n'
        '    return torch.optim.SGD([{"params": rest}, {"params": ups, "lr": 0.0}], lr=0.1)  # B: lr 0')
    report = await _findings(client, tmp_path, source=source)
    [f] = _gp306(report)
    assert f["severity"] == "error" and "learning rate was 0 at each step" in f["message"], f
    assert f["location"]["line"] == _line(tmp_path / "case.py", "# B: lr 0")
    assert f["evidence"]["lr_as_applied"] == [0.0, 0.0, 0.0]


@pytest.mark.anyio
async def test_a_partner_an_optimizer_filter_left_out_names_the_filter(client, tmp_path):
    source = (EXAMPLES / "healthy_lora_b_clip_positive.py").read_text().replace(
        "if p.requires_grad]", "if p.requires_grad and p.detach().any()]")  # leaves out B = 0
    report = await _findings(client, tmp_path, source=source)
    [f] = _gp306(report)
    assert f["severity"] == "error" and "is in no parameter group of the optimizer" in f["message"], f
    assert f["location"]["line"] == _line(tmp_path / "case.py", "p.detach().any()]")
    assert f["evidence"]["partner_verdict"] == "not-in-optimizer"


@pytest.mark.anyio
async def test_one_step_alone_does_not_call_it_by_design(client, tmp_path):
    report = await _findings(client, tmp_path, "trace_grad_path", example="gp306_lora_b_grad_clipped_to_zero.py")
    [f] = _gp306(report)
    assert f["severity"] == "info" and "which one step cannot show" in f["message"], f


@pytest.mark.anyio
async def test_diagnose_with_steps_settles_the_claim_on_its_own_steps(client):
    result = await client.call_tool("diagnose", {"target": {"project_dir": str(EXAMPLES),
                                                            "model": "gp306_lora_b_grad_clipped_to_zero.py"}, "steps": 2})
    report = result.structured_content
    [f] = _gp306(report)
    assert f["severity"] == "error" and "never moved over 2 real optimizer step(s)" in f["message"], f
    assert {"GP605", "GP306"} <= {g["code"] for g in report["findings"]}
    assert report["facts"]["zero_init_checked"]["steps"] == 2
