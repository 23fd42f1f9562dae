"""Several optimizers over audit_training's steps (GP212, GP213), through the real server: which optimizer's gradients
add up, which zero_grad() line cleared the other one, which optimizer never steps; a GAN's own loop stays clean."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES
from report_consistency import assert_consistent


async def _audit(client, name: str) -> list[dict]:
    result = await client.call_tool("audit_training", {"target": {"project_dir": str(EXAMPLES), "model": name}, "steps": 4})
    assert not result.is_error, result.content
    assert_consistent(result.structured_content, name)
    return result.structured_content["findings"]


@pytest.mark.anyio
async def test_zero_grad_on_the_other_optimizer_names_the_line_and_both_optimizers(client):
    findings = await _audit(client, "gp212_gan_zero_grad_wrong_optimizer.py")
    [f] = [f for f in findings if f["code"] == "GP212"]
    assert f["location"]["line"] == 49 and sorted(f["parameters"]) == ["G.0.bias", "G.0.weight", "G.2.bias", "G.2.weight"]
    ev = f["evidence"]
    assert (ev["optimizer_built_at"]["line"], ev["other_built_at"]["line"], ev["stale_at_backward"]["line"]) == (35, 34, 51)
    assert "line 35 of" in f["fix"] and "line 49 of" in f["fix"]
    assert not [g for g in findings if g["code"] == "GP602"]  # the same accumulation, explained once


@pytest.mark.anyio
async def test_an_optimizer_never_stepped_is_named_after_the_backward_that_feeds_it(client):
    findings = await _audit(client, "gp213_discriminator_never_stepped.py")
    [f] = [f for f in findings if f["code"] == "GP213"]
    assert f["location"]["line"] == 45 and sorted(f["parameters"]) == ["D.0.bias", "D.0.weight", "D.2.bias", "D.2.weight"]
    assert f["evidence"]["optimizer_built_at"]["line"] == 33 and "in each of 4 steps" in f["message"]
    assert not [g for g in findings if g["code"] in ("GP602", "GP606")]


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["healthy_gan_each_optimizer_cleared_and_stepped.py", "healthy_gan_two_optimizers.py"])
async def test_a_gan_loop_that_clears_and_steps_each_optimizer_is_clean(client, name):
    findings = await _audit(client, name)
    assert not [f for f in findings if f["severity"] == "error"], [(f["code"], f["message"]) for f in findings]
