"""Issue 27, optimizer side: where a zero learning rate and a duplicate param group came from, through the real server.

A zero lr is located where it was decided (the layer-decay helper's group line, the scheduler lambda), not at the
optimizer's constructor; a warm-up from 0 is an info, never a warning; torch's "some parameters appear in more than
one parameter group" is said with the parameters, both groups and the lines that built them. Every situation of a
GP2xx rule has its own fix text.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gradprobe.findings import catalogue

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "broken"


async def _findings(client, tmp_path: Path, example: str, tool: str = "check_optimizer_coverage") -> list[dict]:
    shutil.copy(EXAMPLES / example, tmp_path / "case.py")
    result = await client.call_tool(tool, {"target": {"project_dir": str(tmp_path), "model": "case.py"}})
    return result.structured_content["findings"]


def _one(findings: list[dict], code: str) -> dict:
    hits = [f for f in findings if f["code"] == code]
    assert len(hits) == 1, findings
    return hits[0]


@pytest.mark.anyio
async def test_zero_lr_from_a_layer_decay_helper_names_the_helper(client, tmp_path):
    findings = await _findings(client, tmp_path, "gp205_layer_decay_zero.py")
    f = _one(findings, "GP205")
    assert f["severity"] == "warning" and f["parameters"] == ["embed.weight"]
    assert f["location"]["line"] == 36 and f["location"]["function"] == "layer_decay_groups"
    assert "built by layer_decay_groups() at line 36" in f["message"]
    assert "layer_decay_groups()" in f["fix"] and "zero_grad" not in f["fix"]
    stuck = _one(findings, "GP207")  # the update that did not happen points at the same cause, with its own fix
    assert stuck["location"]["line"] == 36 and "zero_grad() before backward" not in stuck["fix"]
    assert f["evidence"]["optimizer_created_at"]["line"] == 57


@pytest.mark.anyio
async def test_a_lambda_that_stays_at_zero_is_named_with_its_line(client, tmp_path):
    f = _one(await _findings(client, tmp_path, "gp205_lambda_stays_zero.py"), "GP205")
    assert f["severity"] == "warning" and f["location"]["line"] == 25 and f["location"]["function"] == "warmup"
    assert "LambdaLR lambda at line 25" in f["message"] and "base lr is 0.1" in f["message"]
    assert f["evidence"]["factor_at_step"] == [[1, 0.0], [10, 0.0], [100, 0.0], [1000, 0.0]]


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["check_optimizer_coverage", "diagnose"])
async def test_a_warmup_from_zero_is_info_only(client, tmp_path, tool):
    findings = await _findings(client, tmp_path, "healthy_warmup_from_zero.py", tool)
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings
    if tool == "check_optimizer_coverage":
        f = _one(findings, "GP205")
        assert f["severity"] == "info" and f["location"]["line"] == 27 and "warm-up from 0" in f["message"]


@pytest.mark.anyio
async def test_duplicate_groups_name_the_parameters_groups_and_lines(client, tmp_path):
    findings = await _findings(client, tmp_path, "gp204_decay_split_overlap.py")
    f = _one(findings, "GP204")
    assert f["parameters"] == ["1.weight"] and f["location"]["line"] == 29
    assert f["evidence"]["groups"] == [0, 1]
    built = f["evidence"]["group_built_at"]
    assert (built["0"]["line"], built["1"]["line"]) == (28, 29) and built["0"]["function"] == "decay_split"
    assert "param group 0 (built at line 28" in f["message"] and "param group 1 (built at line 29" in f["message"]
    assert "group 1" in f["fix"]


@pytest.mark.anyio
async def test_groups_built_inline_keep_the_optimizer_line(client, tmp_path):
    """A group literal in the optimizer's own statement: the finding stays on that statement (unchanged)."""
    f = _one(await _findings(client, tmp_path, "gp205_zero_lr_group.py"), "GP205")
    assert f["location"]["line"] == 17 and f["message"] == "param group 0 has lr=0: its 2 tensors never move."


def test_every_gp2xx_situation_has_its_own_fix_text():
    for code, doc in catalogue().items():
        if not (code.startswith("GP2") or code in ("GP304", "GP318", "GP319")):  # and issue 27's other located causes
            continue
        fixes = [doc["fix"]] + [s.get("fix") or doc["fix"] for s in doc["situations"].values()]
        # a situation that only adds where the line is known (at_line, frozen_at, ...) may keep the rule's own fix
        own = {name: s["fix"] for name, s in doc["situations"].items() if s.get("fix")}
        assert len(set(own.values())) == len(own), (code, own)
        assert doc["fix"] not in own.values(), (code, doc["fix"])
        assert fixes


@pytest.mark.anyio
async def test_two_optimizers_over_the_same_parameters_are_named_with_both_lines(client, tmp_path):
    f = _one(await _findings(client, tmp_path, "gp210_gan_optimizer_holds_both.py"), "GP210")
    assert f["severity"] == "error" and f["parameters"] == ["D.0.weight", "D.0.bias", "D.2.weight", "D.2.bias"]
    assert f["location"]["line"] == 37 and f["evidence"]["first_optimizer_at"]["line"] == 36
    assert "line 36" in f["message"] and "line 37" in f["message"]


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["check_optimizer_coverage", "diagnose"])
async def test_a_gan_with_one_optimizer_per_network_is_clean(client, tmp_path, tool):
    """The discriminator's parameters are not in the generator's optimizer: they are the other optimizer's, not GP201."""
    findings = await _findings(client, tmp_path, "healthy_gan_two_optimizers.py", tool)
    assert not [f for f in findings if f["severity"] in ("error", "warning")], findings
    assert not [f for f in findings if f["code"] in ("GP201", "GP210")], findings


@pytest.mark.anyio
async def test_a_step_on_the_wrong_optimizer_is_named_with_its_line(client, tmp_path):
    findings = await _findings(client, tmp_path, "gp211_gan_steps_wrong_optimizer.py")
    f = _one(findings, "GP211")
    assert f["location"]["line"] == 46 and f["parameters"] == ["D.0.weight", "D.0.bias", "D.2.weight", "D.2.bias"]
    assert f["evidence"]["owner_optimizer_at"]["line"] == 35 and f["evidence"]["stepped_optimizer_at"]["line"] == 36
    assert not [g for g in findings if g["code"] == "GP207"], findings  # the unmoved discriminator is GP211's
