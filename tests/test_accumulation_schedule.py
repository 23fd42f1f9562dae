"""Issue 28's accumulation and schedule checks through the real server over stdio: the accumulated gradient against
the full-batch one (GP611 divided twice, told from a token-mean loss by that ratio) in the build_model()/train_step
form, and a scheduler stepped per batch on an epoch schedule (GP612) in a script's own loop. The examples themselves
are also run by test_examples.py and test_audit_scripts.py."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, ROOT


async def audit(client, target: dict, steps: int) -> dict:
    result = await client.call_tool("audit_training", {"target": target, "steps": steps})
    assert not result.is_error, result.content
    return result.structured_content


@pytest.mark.anyio
async def test_divided_twice_is_told_from_a_token_mean_loss_by_the_full_batch_ratio(client):
    report = await audit(client, {"project_dir": str(EXAMPLES), "model": "gp611_accumulation_divided_twice.py"}, 2)
    f = next(f for f in report["findings"] if f["code"] == "GP611")
    assert f["location"]["line"] == 45 and "ratio 0.250, 1/4" in f["message"] and "0.0625 (1/16)" in f["message"]
    assert report["facts"]["full_batch"]["per_group"][0]["ratio"] == pytest.approx(0.25, abs=1e-4)
    healthy = await audit(client, {"project_dir": str(EXAMPLES), "model": "healthy_steps_accumulation_token_mean.py"}, 2)
    assert healthy["ok"] and not healthy["findings"], healthy["findings"]
    fb = healthy["facts"]["full_batch"]
    assert fb["ratio"] == pytest.approx(1.0, abs=1e-4) and fb["loss_factors"][0] == pytest.approx(1 / 48)
    assert 0 < fb["compared_parameters"] < fb["of_parameters"], fb  # the parameters nearest the loss: the same ratio
    assert any("as one batch (loss_fn on the whole batch" in v and ": 1.000x" in v for v in healthy["facts"]["verified"])


@pytest.mark.anyio
async def test_an_epoch_schedule_stepped_per_batch_is_gp612_with_its_numbers(client):
    scripts = ROOT / "examples" / "scripts"
    report = await audit(client, {"project_dir": str(scripts / "steps_scheduler_broken"), "script": "train.py"}, 4)
    f = next(f for f in report["findings"] if f["code"] == "GP612")
    assert f["severity"] == "warning" and f["location"]["line"] == 33, f
    assert "CosineAnnealingLR(T_max=10)" in f["message"] and "25 batches" in f["message"], f["message"]
    assert "3 scheduler.step() calls at train.py:33" in f["message"] and "T_max=epochs * 25" in f["fix"]
    healthy = await audit(client, {"project_dir": str(scripts / "steps_scheduler"), "script": "train.py"}, 4)
    assert healthy["ok"] and not healthy["findings"], healthy["findings"]
    assert any(v.startswith("CosineAnnealingLR(T_max=10): not stepped during the watched steps")
               for v in healthy["facts"]["verified"]), healthy["facts"]["verified"]


@pytest.mark.anyio
async def test_divided_twice_in_a_script_is_measured_from_the_losses_graphs(client):
    scripts = ROOT / "examples" / "scripts"
    report = await audit(client, {"project_dir": str(scripts / "steps_accum_twice_broken"), "script": "train.py"}, 2)
    f = next(f for f in report["findings"] if f["code"] == "GP611")
    assert f["location"]["line"] == 33 and "0.25 (1/4) at train.py:33, 0.25 (1/4) at train.py:28" in f["message"], f
    assert "weigh 0.25 of one mean over the whole batch" in f["message"] and f["evidence"]["mass"] == 0.25
    healthy = await audit(client, {"project_dir": str(scripts / "steps_accum_tokens"), "script": "train.py"}, 2)
    assert healthy["ok"] and not healthy["findings"], healthy["findings"]
    assert any("the 4 losses weigh 1.000 of one mean" in v for v in healthy["facts"]["verified"]), healthy["facts"]
